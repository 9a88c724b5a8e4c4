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


def test_a_product_needing_full_float32_is_exact_inside_the_scope():
    # 1 + 2^-20 squared needs 21 significand bits: bfloat16 (8) and TF32 (11) lose them
    a = torch.full((4, 64), 1 + 2.0 ** -20, dtype=torch.float32)
    want = (a.double() @ a.double().T).float()
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        with kb.force("cpu"):
            assert torch.equal(a @ a.T, want)
    finally:
        torch.set_float32_matmul_precision(before)
