"""Canonical tensor bytes and SHA-256 digests: equal bits hash equal on every machine.

``tensor_bytes(name, t)`` is the canonical encoding of one tensor:

    b"O1T1"                          magic + format version 1
    u8 len(tag) || tag               dtype tag, ASCII: f64 f32 bf16 f16 i64 i32 i16 i8 u8 bool
    u64 ndim || u64 dim[0] ...       shape, little-endian
    data                             the elements in row-major (contiguous) order, each
                                     little-endian; bool as one byte 0/1

It depends on dtype, shape and element bits only: not on strides, storage offset, device
or the host's byte order. Floating tensors containing NaN are refused with a
``HashingError`` naming the tensor (NaN payloads differ between x86 and GPUs, so a NaN
could hash differently for the same computation; a NaN in training state is a bug to
surface, not to hash). Infinities and signed zeros are hashed as their bits.

``digest(named)`` hashes a mapping name -> tensor: names sorted by their UTF-8 bytes, each
contributing ``u64 len(name) || name || u64 len(payload) || payload`` to one SHA-256, so the
result does not depend on the mapping's insertion order. ``tensor_digest`` hashes one.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

import numpy as np
import torch

MAGIC = b"O1T1"

# dtype -> (tag, dtype of the same width whose bits numpy can expose little-endian)
_DTYPES: dict[torch.dtype, tuple[str, torch.dtype, str]] = {
    torch.float64: ("f64", torch.int64, "<i8"),
    torch.float32: ("f32", torch.int32, "<i4"),
    torch.bfloat16: ("bf16", torch.int16, "<i2"),
    torch.float16: ("f16", torch.int16, "<i2"),
    torch.int64: ("i64", torch.int64, "<i8"),
    torch.int32: ("i32", torch.int32, "<i4"),
    torch.int16: ("i16", torch.int16, "<i2"),
    torch.int8: ("i8", torch.int8, "<i1"),
    torch.uint8: ("u8", torch.uint8, "<u1"),
    torch.bool: ("bool", torch.uint8, "<u1"),
}


class HashingError(ValueError):
    """A tensor cannot be hashed canonically (NaN, unsupported dtype, bad name)."""


def _header(name: str, t: torch.Tensor) -> bytes:
    if t.dtype not in _DTYPES:
        raise HashingError(
            f"tensor {name!r} has dtype {t.dtype}, which has no canonical encoding; "
            f"convert it to one of {sorted(v[0] for v in _DTYPES.values())}"
        )
    tag = _DTYPES[t.dtype][0].encode("ascii")
    return MAGIC + struct.pack("<B", len(tag)) + tag + struct.pack(f"<Q{t.dim()}Q", t.dim(), *t.shape)


def _data(name: str, t: torch.Tensor) -> np.ndarray:
    if t.is_floating_point() and bool(torch.isnan(t).any()):
        count = int(torch.isnan(t).sum())
        raise HashingError(
            f"tensor {name!r} contains {count} NaN value(s); NaN payloads are not portable, "
            "so it cannot be hashed - find where the NaN came from"
        )
    _, bits_dtype, np_dtype = _DTYPES[t.dtype]
    cpu = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bool:
        cpu = cpu.to(torch.uint8)
    arr = cpu.view(bits_dtype).numpy()
    return np.ascontiguousarray(arr.astype(np_dtype, copy=False))


def tensor_bytes(name: str, t: torch.Tensor) -> bytes:
    """The canonical bytes of ``t`` (header + little-endian row-major data)."""
    return _header(name, t) + _data(name, t).tobytes(order="C")


def tensor_digest(name: str, t: torch.Tensor) -> str:
    """SHA-256 hex digest of ``tensor_bytes(name, t)``."""
    return hashlib.sha256(tensor_bytes(name, t)).hexdigest()


def digest(named: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 hex digest of a name -> tensor mapping, independent of insertion order."""
    h = hashlib.sha256()
    for key in sorted(named, key=_name_bytes):
        name = _name_bytes(key)
        header, data = _header(key, named[key]), _data(key, named[key])
        size = len(header) + data.nbytes
        h.update(struct.pack("<Q", len(name)) + name + struct.pack("<Q", size))
        h.update(header)
        h.update(memoryview(data).cast("B"))  # streamed: no second copy of large tensors
    return h.hexdigest()


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str):
        raise HashingError(f"tensor names must be str, got {type(name).__name__} {name!r}")
    return name.encode("utf-8")


def canonical_dtype_tag(dtype: torch.dtype) -> str:
    """The tag a dtype hashes under (raises for dtypes without a canonical encoding)."""
    if dtype not in _DTYPES:
        raise HashingError(f"dtype {dtype} has no canonical encoding")
    return _DTYPES[dtype][0]

