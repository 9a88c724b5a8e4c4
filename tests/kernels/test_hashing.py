"""Canonical tensor bytes: exact format, layout independence, NaN refusal, golden digest."""
import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch

from open1b_kernels.hashing import tensorbytes as hashing

GOLDEN = json.loads((Path(__file__).parents[1] / "assets" / "kernels_k1_golden.json").read_text())


def test_exact_encoding_of_a_small_tensor():
    t = torch.tensor([[1.0, -0.0]], dtype=torch.float32)
    want = (b"O1T1" + bytes([3]) + b"f32" + struct.pack("<QQQ", 2, 1, 2)
            + struct.pack("<ff", 1.0, -0.0))
    assert hashing.tensor_bytes("t", t) == want


def test_layout_device_and_order_independence():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    xt = x.t().contiguous().t()  # same values, column-major strides
    assert hashing.tensor_bytes("x", x) == hashing.tensor_bytes("x", xt)
    assert hashing.tensor_bytes("x", x[1:]) == hashing.tensor_bytes("x", x[1:].clone())
    named = {"b": torch.ones(2, dtype=torch.bfloat16), "a": torch.arange(3), "c": torch.tensor([True])}
    assert hashing.digest(named) == hashing.digest(dict(reversed(list(named.items()))))


def test_dtype_shape_and_bits_change_the_hash():
    x = torch.zeros(4, dtype=torch.float32)
    assert hashing.tensor_digest("x", x) != hashing.tensor_digest("x", x.to(torch.int32))
    assert hashing.tensor_digest("x", x) != hashing.tensor_digest("x", x.reshape(2, 2))
    assert hashing.tensor_digest("x", x) != hashing.tensor_digest("x", -x)  # -0.0 differs
    assert hashing.digest({"a": x}) != hashing.digest({"b": x})


def test_nan_is_refused_with_the_tensor_name():
    bad = torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)
    with pytest.raises(hashing.HashingError, match="'layer3.w'.*1 NaN"):
        hashing.digest({"layer3.w": bad})
    assert hashing.tensor_digest("inf", torch.tensor([float("inf")]))  # inf is fine


def test_digest_is_the_documented_stream():
    named = {"w": torch.tensor([1.5, 2.0], dtype=torch.bfloat16), "step": torch.tensor(7)}
    h = hashlib.sha256()
    for k in sorted(named):
        payload = hashing.tensor_bytes(k, named[k])
        h.update(struct.pack("<Q", len(k)) + k.encode() + struct.pack("<Q", len(payload)) + payload)
    assert hashing.digest(named) == h.hexdigest()


def test_golden_digest():
    # Pinned: any change to the encoding changes every published state hash.
    named = {
        "f32": torch.tensor([[0.5, -0.0, float("inf")]]),
        "bf16": torch.tensor([1.0, -2.5e-39], dtype=torch.bfloat16),
        "i64": torch.tensor([-1, 2**40]),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([[True], [False]]),
    }
    assert hashing.digest(named) == GOLDEN["hashing_format"]


def test_unsupported_dtype_is_named():
    with pytest.raises(hashing.HashingError, match="complex"):
        hashing.tensor_bytes("z", torch.zeros(2, dtype=torch.complex64))

