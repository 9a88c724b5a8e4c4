"""Reduced-precision float32 matrix products (bfloat16 through oneDNN, TF32 on CUDA) are a
process-wide torch setting an auditor's environment may carry; the runtime's scope pins
full precision and gives the process its own setting back (open1b_kernels/core/ieee.py)."""
from __future__ import annotations

import torch

from open1b_kernels.core import backend as kb
from open1b_kernels.core import ieee


def test_the_runtime_scope_pins_ieee_products_and_restores_a_legacy_setting():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")     # bf16 on oneDNN, TF32 on CUDA
        assert ieee.matmul_precision() == {"mkldnn": "bf16", "cuda": "tf32"}
        for backend in ("cpu", None):
            with kb.force(backend):
                assert ieee.matmul_precision() == {"mkldnn": "ieee", "cuda": "ieee"}
            assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_a_per_backend_setting_is_restored_per_backend():
    before = torch.get_float32_matmul_precision()
    try:
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"   # the new API, one backend
        with kb.force("cpu"):
            assert ieee.matmul_precision()["mkldnn"] == "ieee"
        assert ieee.matmul_precision()["mkldnn"] == "bf16"
    finally:
        torch.set_float32_matmul_precision(before)


def _needs_full_float32() -> tuple[torch.Tensor, torch.Tensor]:
    """Operands whose product is exact under every float32 summation order, yet wrong once
    the inputs are rounded to bfloat16 or TF32. Each a is 1 + j 2^-12 (j = 1..8: 13
    significand bits; bfloat16 keeps 8, TF32 11) and b is all ones, so every product is
    exact and every partial sum of 64 of them lies below 2^7 on a 2^-12 grid: 19 bits, within
    float32's 24 whatever the order, blocking or FMA use. (An earlier case, a @ a.T with
    a = 1 + 2^-20, needed one rounding per product and so depended on the order: MKL's
    AVX-512 sgemm on an Intel Xeon with AMX summed it to another float32.)"""
    k = torch.arange(64, dtype=torch.float64)
    a = (1 + (k % 8 + 1) * 2.0 ** -12).float().repeat(4, 1)
    return a, torch.ones(64, 4)


def test_the_case_is_one_bfloat16_and_tf32_inputs_break():
    a, b = _needs_full_float32()
    want = (a.double() @ b.double()).float()
    assert not torch.equal(a.bfloat16().float() @ b, want)
    tf32 = (a.view(torch.int32) & ~0x1FFF).view(torch.float32)   # 10 stored bits, truncated
    assert not torch.equal(tf32 @ b, want)


def test_a_product_needing_full_float32_is_exact_inside_the_scope():
    a, b = _needs_full_float32()
    want = (a.double() @ b.double()).float()
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")     # bf16 on oneDNN, TF32 on CUDA
        with kb.force("cpu"):
            assert torch.equal(a @ b, want)
            assert torch.equal(b.T @ a.T, want.T)        # the other layout
    finally:
        torch.set_float32_matmul_precision(before)
