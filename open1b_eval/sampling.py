"""The next-token rule of ``generate``: greedy or seeded sampling, exactly specified.

Input: the fp32 logits z (V,) of the token at ``position`` (its index in the sequence,
the prefix token included), a temperature T >= 0 and a seed in [0, 2^64).

* T = 0 (greedy): the index of the largest logit, the lowest index on ties.
* T > 0 (sampling), every step exact or one IEEE float32 operation:
  1. ``s = z * r`` with ``r = fp32(1 / T)`` (the division in binary64 on the host, rounded
     once to float32; a multiply, never a division on the device);
  2. ``e = mathfn.exp(s - max(s))`` - the runtime's own exp (``open1b_kernels.core.mathfn``; same bits
     on the CPU and in Triton), so e lies in (0, 1] and the largest is 1;
  3. integer weights ``w = trunc(e * 2^40)`` (int64; the power-of-two multiply is exact),
     prefix sums ``c`` (exact integers, so their order is immaterial) and ``W = c[V-1]``;
     a token whose probability is below 2^-40 of the most likely one gets weight 0 and is
     never drawn;
  4. the 32-bit Philox word ``u`` at (seed, stream ``SAMPLE_STREAM``, ``position``)
     (``open1b_kernels.ops.philox.random_words``), target ``t = floor(W * u / 2^32)`` (exact integer
     arithmetic), and the token is the smallest i with ``c[i] > t`` (inverse CDF).
So the token depends only on (logits bits, T, seed, position): not on the batch, the
machine or the backend.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from open1b_kernels.core import mathfn
from open1b_kernels.ops.philox import random_words

SAMPLE_STREAM = int.from_bytes(hashlib.sha256(b"open1b-generate").digest()[:4], "little")
WEIGHT_BITS = 40


def next_token(logits: torch.Tensor, temperature: float, seed: int, position: int) -> int:
    """The token drawn from fp32 ``logits`` (V,) at ``position`` (see the module docstring)."""
    if logits.dtype != torch.float32 or logits.dim() != 1:
        raise ValueError(f"expected fp32 logits (V,), got {logits.dtype} {tuple(logits.shape)}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0.0:
        return int(torch.argmax(logits))
    r = float(np.float32(1.0 / temperature))
    s = logits * r
    e = mathfn.apply("exp", (s - s.max()).contiguous())[0].cpu()
    w = torch.trunc(e.to(torch.float64) * float(2 ** WEIGHT_BITS)).to(torch.int64)
    c = torch.cumsum(w, 0)
    u = int(random_words(seed, SAMPLE_STREAM, position, 1, device=logits.device)[0])
    t = (int(c[-1]) * u) >> 32
    return int(torch.searchsorted(c, torch.tensor([t]), right=True)[0])
