"""The decoding ops: RoPE at explicit positions and one-query attention against a KV
cache give exactly the bits of the full-sequence ops at that position, on the CPU
reference and under the Triton interpreter."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.attention.forward import forward_cpu
from open1b_kernels.attention.decode import attention_decode, decode_cpu
from open1b_kernels.ops.rope import rope_fwd
from open1b_kernels.ops.rope_at import rope_at
from tests.kernels.support import bits, needs_interpreter


def _r(g, *shape):
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("path", ["cpu", pytest.param("triton", marks=needs_interpreter)])
def test_rope_at_equals_rope_of_the_sequence_at_that_position(path):
    g = torch.Generator().manual_seed(3)
    x = _r(g, 1, 150, 2, 32)
    full = rope_fwd(x)[0]                                      # (T, H, D)
    pos = torch.tensor([0, 1, 17, 64, 149, 5])
    with backend.force(path):
        got = rope_at(x[0, pos], pos)
    assert torch.equal(bits(got), bits(full[pos]))


# (query heads, kv heads, head dim, window, cache rows, positions)
CASES = [(4, 2, 16, None, 140, [0, 63, 64, 139]),
         (4, 1, 32, 40, 150, [5, 39, 40, 100, 129]),
         (2, 2, 16, 64, 200, [63, 64, 127, 128, 199])]


@pytest.mark.parametrize("case", CASES)
def test_decode_row_equals_the_full_forward_row(case):
    hq, hkv, d, window, t, positions = case
    g = torch.Generator().manual_seed(11)
    q, k, v = _r(g, 1, hq, t, d), _r(g, 1, hkv, t, d), _r(g, 1, hkv, t, d)
    for p in positions:
        want, _ = forward_cpu(q[:, :, :p + 1], k[:, :, :p + 1], v[:, :, :p + 1], window)
        got = decode_cpu(q[:, :, p], k, v, torch.tensor([p]), window)
        assert torch.equal(bits(got[0]), bits(want[0, :, p])), p


@needs_interpreter
@pytest.mark.parametrize("case", CASES[1:])
def test_decode_triton_equals_cpu_for_a_batch_of_positions(case):
    hq, hkv, d, window, t, positions = case
    g = torch.Generator().manual_seed(5)
    b = len(positions)
    q, k, v = _r(g, b, hq, d), _r(g, b, hkv, t, d), _r(g, b, hkv, t, d)
    pos = torch.tensor(positions)
    want = decode_cpu(q, k, v, pos, window)
    with backend.force("triton"):
        got = attention_decode(q, k, v, pos, window)
    assert torch.equal(bits(got), bits(want))
    # a sequence alone gives its row of the batch
    alone = decode_cpu(q[2:3], k[2:3], v[2:3], pos[2:3], window)
    assert torch.equal(bits(alone[0]), bits(want[2]))
