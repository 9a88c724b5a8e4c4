"""No CPU result depends on the thread count: one production layer forward + backward and
the exact LM head (S = 3) give the same bits with 1 and with 2 torch threads."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from open1b_kernels.core.backend import force
from open1b_kernels.ops.lmhead import lmhead_backward, lmhead_forward
from open1b_train.config import open1b
from open1b_train.model import layer_backward, layer_forward
from open1b_train.params import init_params


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.int16 if t.element_size() == 2 else torch.int32)


def _run(threads: int, fn):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with force("cpu"):
            return fn()
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("window", [64, None])
def test_layer_bits_do_not_depend_on_threads(window):
    mc = dataclasses.replace(open1b().model, vocab=64, d_model=256, n_layers=2, n_heads=4,
                             n_kv_heads=1, head_dim=64, ffn=704, window=window or 64,
                             full_every=1 if window is None else 1000)
    p = init_params(mc, seed=3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 300, mc.d_model, generator=g).to(torch.bfloat16)
    dy = (torch.randn(2, 300, mc.d_model, generator=g) * 1e-2).to(torch.bfloat16)

    def fn():
        y, saved = layer_forward(mc, p, 0, x)
        grads = {}
        dx = layer_backward(mc, p, 0, dy, saved, grads)
        return [y, dx] + [grads[k] for k in sorted(grads)]

    one, two = _run(1, fn), _run(2, fn)
    for a, b in zip(one, two):
        assert torch.equal(_bits(a), _bits(b))


def test_lmhead_bits_do_not_depend_on_threads():
    g = torch.Generator().manual_seed(5)
    h = torch.randn(70, 1500, generator=g).to(torch.bfloat16)
    w = (torch.randn(300, 1500, generator=g) * 0.02).to(torch.bfloat16)
    dl = torch.randn(70, 300, generator=g) * 1e-4

    def fn():
        return (lmhead_forward(h, w, 3), *lmhead_backward(dl, h, w, 3))

    for a, b in zip(_run(1, fn), _run(2, fn)):
        assert torch.equal(_bits(a), _bits(b))
