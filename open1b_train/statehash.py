"""Canonical per-step digests and the chained run hash.

Every step of a run is anchored by five component digests (SHA-256, hex), kept separate
in the log so that a mismatch names what differs:

* ``data``    - the windows the step consumed, in stream order (ascending window index):
  SHA-256 of ``b"open1b-step-data/1"`` || u64 count || for each window: u64 window index ||
  the 32-byte SHA-256 of the window's canonical bytes (its token ids as uint32
  little-endian, the stream's own window hash). Stream order, not mesh order, so every
  logical mesh of a run has the same data digest per step: which virtual rank trains a
  window is fixed by the schedule (window m goes to rank m mod V), not by the data.
* ``grad``    - the reduced gradient as Algorithm 1 leaves it (before a spike injection
  and before clipping): ``open1b_kernels.hashing.sha256.digest_roots`` of the flat float32 gradient's
  per-parameter views (names of ``params.py``).
* ``params``  - the parameters after the step: ``digest_roots`` of the named tensors.
* ``optim``   - SHA-256 of the canonical JSON of ``{"adam_step", "skip_left", "m", "v"}``,
  with ``m``/``v`` the ``digest_roots`` of the moments' per-parameter views.
* ``scalars`` - SHA-256 of the canonical JSON of the step's scalars: loss, pre-clip
  gradient norm and each window's loss as float32 bits (8 hex digits), the learning rate
  as a binary64 hex float (``float.hex``), skipped / spike flags, tokens consumed.

The step hash is SHA-256 of the canonical JSON of ``{"format": "open1b-step/1", "step",
"prev", "data", "grad", "params", "optim", "scalars"}`` where ``prev`` is the previous
step's hash; step 0 is the run's initial state (``genesis``: config identity, mix
fingerprint, seed, initial params and optimizer digests). The last step's hash is the
run hash. Canonical JSON = ``open1b.canonical.canonical_json`` (sorted keys, no spaces,
ASCII, no NaN).

Tensors are hashed where they live (``open1b_kernels.hashing.sha256``: on a GPU only the 32-byte chunk
digests cross to the host).
"""
from __future__ import annotations

import contextlib
import hashlib
import struct
from collections.abc import Mapping, Sequence

import numpy as np
import torch

import open1b_kernels.core.backend as kb
from open1b.canonical import canonical_json as canonical  # noqa: F401 (statehash.canonical)
from open1b.canonical import sha256_json as sha
from open1b_kernels.hashing.sha256 import tensor_root

DATA_MAGIC = b"open1b-step-data/1"
STEP_FORMAT = "open1b-step/1"
COMPONENTS = ("data", "grad", "params", "optim", "scalars")


def window_digests(tokens: torch.Tensor) -> list[bytes]:
    """The stream's window hash of each row of ``tokens`` (n, window) (int64 or uint32)."""
    arr = np.ascontiguousarray(tokens.detach().to("cpu").numpy().astype("<u4", copy=False))
    return [hashlib.sha256(row.tobytes()).digest() for row in arr]


def data_digest(windows: Sequence[int], digests: Sequence[bytes]) -> str:
    if len(windows) != len(digests):
        raise ValueError("one digest per window")
    h = hashlib.sha256(DATA_MAGIC + struct.pack("<Q", len(windows)))
    for m, d in sorted(zip(windows, digests)):
        h.update(struct.pack("<Q", int(m)) + d)
    return h.hexdigest()


def roots(named: Mapping[str, torch.Tensor]) -> dict[str, bytes]:
    """The 32-byte ``open1b_kernels.hashing.sha256`` root of every tensor: the Triton kernel for CUDA
    tensors, hashlib for CPU tensors even when the Triton path is forced (the digests are
    identical by definition - integer arithmetic only - and the interpreter would spend
    minutes). A sharded run computes the roots of the tensors it owns and gathers them."""
    on_cpu = all(t.device.type == "cpu" for t in named.values())
    with kb.force("cpu") if on_cpu else contextlib.nullcontext():
        return {k: bytes.fromhex(tensor_root(k, t)) for k, t in named.items()}


def roots_digest(rts: Mapping[str, bytes]) -> str:
    """``open1b_kernels.hashing.sha256.digest_roots`` from precomputed roots: names sorted by UTF-8 bytes,
    each ``u64 len(name) || name || root``."""
    h = hashlib.sha256()
    for key in sorted(rts, key=lambda k: k.encode("utf-8")):
        name = key.encode("utf-8")
        h.update(struct.pack("<Q", len(name)) + name + rts[key])
    return h.hexdigest()


def tensors_digest(named: Mapping[str, torch.Tensor]) -> str:
    """``open1b_kernels.hashing.sha256.digest_roots`` of a name -> tensor mapping (see ``roots``)."""
    return roots_digest(roots(named))


def optim_digest(m: Mapping[str, torch.Tensor], v: Mapping[str, torch.Tensor],
                 adam_step: int, skip_left: int) -> str:
    return optim_digest_of(tensors_digest(m), tensors_digest(v), adam_step, skip_left)


def optim_digest_of(m_digest: str, v_digest: str, adam_step: int, skip_left: int) -> str:
    return sha({"adam_step": adam_step, "skip_left": skip_left, "m": m_digest, "v": v_digest})


def step_hash(step: int, prev: str, components: Mapping[str, str]) -> str:
    missing = [c for c in COMPONENTS if c not in components]
    if missing:
        raise ValueError(f"step hash needs components {missing}")
    return sha({"format": STEP_FORMAT, "step": step, "prev": prev,
                **{c: components[c] for c in COMPONENTS}})


def genesis_hash(record: Mapping) -> str:
    """Hash of the run's step-0 record (config identity, fingerprint, seed, init digests)."""
    return sha({"format": STEP_FORMAT, "step": 0, **record})
