"""The digests' definitions: roots gathered from shards give the mapping digest, the data
digest does not depend on mesh order, the step hash chains and names its components."""
from __future__ import annotations

import hashlib

import pytest
import torch

from open1b_kernels.hashing.sha256 import digest_roots
from open1b_train import statehash


def test_roots_digest_equals_kernels_digest_roots():
    g = torch.Generator().manual_seed(0)
    named = {"b": torch.randn(70000, generator=g), "a.weight": torch.randn(3, 5).bfloat16(),
             "é": torch.arange(7)}
    assert statehash.tensors_digest(named) == digest_roots(named)
    half = dict(list(named.items())[:1]), dict(list(named.items())[1:])
    merged = {**statehash.roots(half[0]), **statehash.roots(half[1])}
    assert statehash.roots_digest(merged) == digest_roots(named)


def test_data_digest_is_the_stream_order_of_window_hashes():
    toks = torch.randint(0, 1000, (3, 9))
    d = statehash.window_digests(toks)
    assert d[1] == hashlib.sha256(toks[1].numpy().astype("<u4").tobytes()).digest()
    assert statehash.data_digest([5, 6, 7], d) == statehash.data_digest([7, 5, 6], [d[2], d[0], d[1]])
    assert statehash.data_digest([5, 6, 7], d) != statehash.data_digest([5, 6, 7], [d[1], d[0], d[2]])


def test_step_hash_needs_every_component_and_chains():
    comps = {c: "0" * 64 for c in statehash.COMPONENTS}
    h1 = statehash.step_hash(1, "a" * 64, comps)
    assert h1 != statehash.step_hash(1, "b" * 64, comps)
    assert h1 != statehash.step_hash(1, "a" * 64, {**comps, "grad": "1" * 64})
    with pytest.raises(ValueError, match="components"):
        statehash.step_hash(1, "a" * 64, {"data": "0" * 64})
