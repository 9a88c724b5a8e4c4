"""Chunked SHA-256: the Triton kernel (interpreter) equals hashlib chunk by chunk; roots
and mapping digests equal an independent recomputation; the format is pinned by a golden.

The interpreter pays ~0.5 s per 64-byte message block of a program, so parity tests use
chunks of 64 or 128 bytes (at most two blocks per chunk) and small tensors.
"""
import hashlib
import json
import os
import struct
import time
from pathlib import Path

import pytest
import torch

from open1b_kernels.hashing import tensorbytes as hashing, sha256
from open1b_kernels.core.backend import force
from tests.kernels.support import needs_interpreter

GOLDEN = json.loads((Path(__file__).parents[1] / "assets" / "kernels_sha256_golden.json").read_text())
TAGS = {torch.float32: "f32", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32",
        torch.uint8: "u8", torch.bool: "bool"}


def data_bytes(t: torch.Tensor) -> bytes:
    """Canonical data bytes, independently: open1b_kernels.hashing.tensorbytes's encoding minus its header."""
    header = 4 + 1 + len(TAGS[t.dtype]) + 8 * (1 + t.dim())
    return hashing.tensor_bytes("t", t)[header:]


def hashlib_chunks(data: bytes, chunk: int) -> list[bytes]:
    return [hashlib.sha256(data[i:i + chunk]).digest() for i in range(0, len(data), chunk)]


def root_by_hand(name: str, t: torch.Tensor, chunk: int) -> str:
    data = data_bytes(t)
    digests = hashlib_chunks(data, chunk)
    tag = TAGS[t.dtype].encode()
    header = b"O1T1" + bytes([len(tag)]) + tag + struct.pack(f"<{1 + t.dim()}Q", t.dim(), *t.shape)
    return hashlib.sha256(header + struct.pack("<QQ", len(digests), len(data))
                          + b"".join(digests)).hexdigest()


def assert_matches_hashlib(t: torch.Tensor, chunk: int) -> None:
    with force("triton"):
        got = sha256.chunk_digests(t, chunk)
    want = hashlib_chunks(data_bytes(t.contiguous()), chunk)
    assert got.dtype == torch.uint8 and tuple(got.shape) == (len(want), 32)
    assert [bytes(row.tolist()) for row in got] == want


def random_bytes(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


# ------------------------------------------------------------------- Triton vs hashlib
# RuntimeWarning is an error: numpy's uint32 arithmetic under the interpreter must wrap
# silently, never warn about (or upcast on) an overflow.
@needs_interpreter
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("n,offset", [(1, 0), (52, 0), (55, 0), (56, 0), (60, 0), (63, 0),
                                      (64, 0), (65, 0), (64, 1)])
def test_padding_edges_in_one_chunk(n, offset):
    # 52/55 bytes leave room for 0x80 and the length in one block; 56..63 push the length
    # into a second block; 64 is a full data block. Lengths that are a multiple of 4 take
    # the word-load path, the others (and the view one byte into its buffer, misaligned)
    # the byte-load path.
    t = random_bytes(n + 4, seed=n)[offset:offset + n]
    assert_matches_hashlib(t, 128)


@needs_interpreter
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("n", [64, 65, 3 * 64 + 17], ids=["one_chunk", "chunk_plus_1", "short_tail"])
def test_chunk_boundaries(n):
    assert_matches_hashlib(random_bytes(n, seed=n), 64)


@needs_interpreter
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_empty_tensor_has_no_chunks():
    empty = torch.empty(0, 3)
    with force("triton"):
        got = sha256.chunk_digests(empty, 64)
        root = sha256.tensor_root("e", empty, 64)
    assert tuple(got.shape) == (0, 32) and got.dtype == torch.uint8
    assert root == root_by_hand("e", empty, 64)


@needs_interpreter
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("t", [
    torch.tensor([1.0, -0.0, 2.5e-39, float("inf"), -3.0], dtype=torch.bfloat16),  # 10 bytes
    torch.linspace(-4, 4, 24, dtype=torch.float32),
    torch.tensor([-1, 2**40, 0, 7, -(2**63)], dtype=torch.int64),
    torch.tensor([True, False, True, True, False, True, False]),
], ids=["bf16", "f32", "i64", "bool"])
def test_dtypes_hash_their_canonical_bytes(t):
    assert_matches_hashlib(t, 64)


@needs_interpreter
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_non_contiguous_tensor_hashes_as_its_contiguous_copy():
    base = torch.arange(40, dtype=torch.int32).reshape(5, 8)
    view = base.t()[1:]  # (7, 5), column-major strides
    assert not view.is_contiguous()
    assert_matches_hashlib(view, 64)  # against the bytes of view.contiguous()


@needs_interpreter
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_random_data_over_two_programs():
    # 130 chunks of 64 bytes: lanes 0..127 in program 0, the rest (with a 24-byte tail) in 1.
    g = torch.Generator().manual_seed(7)
    t = torch.randint(-2**31, 2**31, (129 * 16 + 6,), generator=g, dtype=torch.int32)
    assert sha256.n_chunks(t.numel() * 4, 64) == 130 > sha256.BLOCK
    assert_matches_hashlib(t, 64)


@needs_interpreter
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_real_chunk_size_on_one_short_chunk():
    t = random_bytes(100, seed=1).view(torch.int32)  # 25 words: one short chunk
    with force("triton"):
        assert sha256.tensor_root("w", t) == root_by_hand("w", t, sha256.CHUNK_BYTES)


@needs_interpreter
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_mapping_digest_from_the_triton_path():
    named = {"b": torch.linspace(0, 1, 40, dtype=torch.bfloat16), "a": torch.tensor([3, 1])}
    with force("triton"):
        mapping = sha256.digest_roots(named, 64)
    want = hashlib.sha256()
    for k in sorted(named):
        want.update(struct.pack("<Q", len(k)) + k.encode() + bytes.fromhex(root_by_hand(k, named[k], 64)))
    assert mapping == want.hexdigest()


@needs_interpreter
def test_nan_is_refused_on_the_triton_path():
    bad = torch.tensor([1.0, float("nan"), float("nan")])
    with force("triton"), pytest.raises(hashing.HashingError, match="'opt.m'.*2 NaN"):
        sha256.tensor_root("opt.m", bad)


# ------------------------------------------------------------------- CPU reference
def test_cpu_path_is_hashlib_per_chunk_at_the_real_size():
    t = torch.arange(100_003, dtype=torch.float32)  # 400,012 bytes: 25 chunks, short tail
    with force("cpu"):
        got = sha256.chunk_digests(t)
        root = sha256.tensor_root("w", t)
    assert [bytes(r.tolist()) for r in got] == hashlib_chunks(data_bytes(t), sha256.CHUNK_BYTES)
    assert root == root_by_hand("w", t, sha256.CHUNK_BYTES)


def test_cpu_threads_hash_the_same_chunks(monkeypatch):
    # the CPU reference hashes runs of HASH_TASK_CHUNKS chunks on torch's threads: runs of 3
    # over 25 chunks and a short tail (the last run short too) give the serial digests
    t = torch.arange(100_003, dtype=torch.float32)
    monkeypatch.setattr(sha256, "HASH_TASK_CHUNKS", 3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        got = sha256.chunk_digests_cpu(t)
    finally:
        torch.set_num_threads(threads)
    assert [bytes(r.tolist()) for r in got] == hashlib_chunks(data_bytes(t), sha256.CHUNK_BYTES)


@pytest.mark.parametrize("shape,dtype", [((0,), torch.float32), ((3,), torch.float32),
                                         ((4096,), torch.float32), ((4097, 3), torch.float32),
                                         ((3, 5000), torch.bfloat16), ((7, 9), torch.bool)])
def test_zero_root_is_the_root_of_zeros(shape, dtype):
    # no chunk, one short chunk, whole chunks only, whole chunks and a short one
    assert sha256.zero_root("opt.m", shape, dtype) == sha256.tensor_root(
        "opt.m", torch.zeros(shape, dtype=dtype))
    one = torch.zeros(shape, dtype=dtype).reshape(-1)
    if one.numel():       # a single nonzero byte anywhere has another root
        one[-1] = 1
        assert sha256.zero_root("opt.m", shape, dtype) != sha256.tensor_root("opt.m", one.reshape(shape))


def test_mapping_digest_is_order_independent_and_depends_on_names_and_bits():
    x = torch.zeros(4, dtype=torch.float32)
    with force("cpu"):
        named = {"b": x, "a": torch.arange(3), "c": torch.tensor([True])}
        assert sha256.digest_roots(named) == sha256.digest_roots(dict(reversed(list(named.items()))))
        assert sha256.digest_roots({"a": x}) != sha256.digest_roots({"b": x})
        assert sha256.tensor_root("x", x) != sha256.tensor_root("x", -x)  # -0.0 differs
        assert sha256.tensor_root("x", x) != sha256.tensor_root("x", x.reshape(2, 2))
        assert sha256.tensor_root("x", x) != sha256.tensor_root("x", x.to(torch.int32))


def test_bad_input_is_refused_with_the_value():
    with force("cpu"):
        with pytest.raises(hashing.HashingError, match="'layer.w'.*1 NaN"):
            sha256.tensor_root("layer.w", torch.tensor([float("nan")], dtype=torch.bfloat16))
        with pytest.raises(hashing.HashingError, match="'z'.*complex64"):
            sha256.chunk_digests(torch.zeros(2, dtype=torch.complex64), name="z")
        with pytest.raises(hashing.HashingError, match="names must be str"):
            sha256.digest_roots({1: torch.zeros(1)})
    for bad in (0, 100, 2**29, 64.0):
        with pytest.raises(ValueError, match=f"chunk_bytes must be .*{bad!r}"):
            sha256.chunk_digests(torch.zeros(1), bad)


def test_golden_roots():
    # Pinned: a change here changes every published state hash built from roots.
    named = {
        "f32": torch.arange(10_000, dtype=torch.float32).reshape(100, 100),  # 3 chunks
        "bf16": torch.tensor([1.0, -2.5e-39, float("inf")], dtype=torch.bfloat16),
        "empty": torch.empty(0, 5, dtype=torch.int64),
    }
    with force("cpu"):
        assert {k: sha256.tensor_root(k, v) for k, v in named.items()} == GOLDEN["roots"]
        assert sha256.digest_roots(named) == GOLDEN["digest_roots"]


def test_gpu_checks_run_and_their_baseline_hash_what_they_claim():
    # The registry entries scripts/gpu_check.py runs, on the CPU at a tiny scale.
    for check in sha256.GPU_CHECKS:
        (t,) = check.make_inputs(1e-6, "cpu")
        assert not torch.isnan(t).any()
        with force("cpu"):
            digests, root = check.run((t,))
        (whole,) = check.torch_baseline((t,))
        assert [bytes(r.tolist()) for r in digests] == hashlib_chunks(data_bytes(t), sha256.CHUNK_BYTES)
        assert bytes(root.tolist()).hex() == root_by_hand("params", t, sha256.CHUNK_BYTES)
        assert bytes(whole.tolist()) == hashlib.sha256(data_bytes(t)).digest()
    assert [c.name for c in sha256.GPU_CHECKS] == ["sha256.chunks", "sha256.chunks_unaligned"]


def test_cpu_threads_pool_runs_in_a_forked_child():
    # a child forked after the parent hashed on its threads gets a pool of its own (the
    # inherited one has no threads: work sent there would never run). The child runs only
    # the pool and hashlib (torch's OpenMP is not fork-safe, pool or not)
    t = torch.arange(2 * sha256.HASH_TASK_CHUNKS * sha256.CHUNK_BYTES // 4, dtype=torch.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sha256.chunk_digests_cpu(t)            # two runs of chunks: the parent's pool exists
        assert len(sha256._POOLS) == 1
    finally:
        torch.set_num_threads(threads)
    data = memoryview(bytes(range(256)) * 1024)
    want = hashlib_chunks(bytes(data), 4096)
    pid = os.fork()
    if pid == 0:                               # exit 0 only with the digests, soon
        got = list(sha256._pool(2).map(lambda lo: sha256._digests_of(data, lo, lo + 8192, 4096),
                                       range(0, len(data), 8192)))
        os._exit(0 if b"".join(got) == b"".join(want) else 1)
    for _ in range(200):                       # up to 20 s
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child's pool never ran its work")
    assert os.waitstatus_to_exitcode(status) == 0
