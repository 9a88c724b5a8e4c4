"""Fixtures shared by the kernel tests."""
from __future__ import annotations

import pytest

from open1b_kernels.int8 import route as gemm_route


@pytest.fixture
def route(monkeypatch):
    """``route(value, mm=None)``: this test's integer GEMM route (OPEN1B_INT_GEMM = value),
    optionally with ``mm`` as the library's int8 GEMM; the decision is reset after."""
    def set_route(value: str, mm=None):
        monkeypatch.setenv(gemm_route.INT_GEMM_ENV, value)
        if mm is not None:   # the library's signature: an optional out (int32 (M, N))
            monkeypatch.setattr(gemm_route, "_raw_int_mm", lambda a, b_t, out=None: (
                mm(a, b_t) if out is None else out.copy_(mm(a, b_t))))
        gemm_route.reset_int_gemm_route()
    yield set_route
    gemm_route.reset_int_gemm_route()
