"""Fixtures shared by the kernel tests."""
from __future__ import annotations

import pytest

from kernels.int8 import gemm


@pytest.fixture
def route(monkeypatch):
    """``route(value, mm=None)``: this test's integer GEMM route (OPEN1B_INT_GEMM = value),
    optionally with ``mm`` as the library's int8 GEMM; the decision is reset after."""
    def set_route(value: str, mm=None):
        monkeypatch.setenv(gemm.INT_GEMM_ENV, value)
        if mm is not None:
            monkeypatch.setattr(gemm, "_raw_int_mm", mm)
        gemm.reset_int_gemm_route()
    yield set_route
    gemm.reset_int_gemm_route()
