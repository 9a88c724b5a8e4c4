"""Fixtures shared by the kernel tests."""
from __future__ import annotations

import pytest

from open1b_kernels.int8 import route as gemm_route


@pytest.fixture
def route(monkeypatch):
    """``route(value, mm=None)``: this test's integer GEMM route (OPEN1B_INT_GEMM = value),
    with ``mm`` as the library's int8 GEMM or (None) the real one - a stand-in set by an
    earlier call does not carry over to the next route; the decision is reset after."""
    real = gemm_route._raw_int_mm

    def set_route(value: str, mm=None):
        monkeypatch.setenv(gemm_route.INT_GEMM_ENV, value)
        # the library's signature: an optional out (int32 (M, N))
        monkeypatch.setattr(gemm_route, "_raw_int_mm", real if mm is None else (
            lambda a, b_t, out=None: mm(a, b_t) if out is None else out.copy_(mm(a, b_t))))
        gemm_route.reset_int_gemm_route()
    yield set_route
    gemm_route.reset_int_gemm_route()
