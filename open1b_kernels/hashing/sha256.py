"""Chunked SHA-256 of a tensor's canonical bytes, computed where the tensor lives.

Definition (part of the project's hash format; ``CHUNK_BYTES`` is fixed at 16,384):

- A tensor's *canonical data bytes* are those of ``open1b_kernels.hashing.tensorbytes``: its elements in
  row-major (contiguous) order, each little-endian, bool as one byte 0/1. A floating
  tensor containing NaN is refused with a ``HashingError`` naming the tensor.
- The data bytes are split into consecutive chunks of ``CHUNK_BYTES``; the last chunk may
  be shorter; an empty tensor has zero chunks.
- ``chunk_digests(t)`` is a ``(n_chunks, 32)`` uint8 tensor on ``t``'s device: row ``i``
  is the standard SHA-256 (FIPS 180-4) of chunk ``i``.
- ``tensor_root(name, t)`` is the hex SHA-256 of

      header(name, t)       open1b_kernels.hashing.tensorbytes's header: b"O1T1", dtype tag, rank, dims
      u64 n_chunks          little-endian
      u64 n_bytes           total data bytes, little-endian
      digest[0] ... digest[n_chunks - 1]      32 bytes each, in chunk order

- ``digest_roots(named)`` hashes a name -> tensor mapping like ``open1b_kernels.hashing.tensorbytes.digest``:
  names sorted by their UTF-8 bytes, each contributing ``u64 len(name) || name || root``
  (the 32 raw bytes of ``tensor_root``) to one SHA-256.

Only the header and the chunk digests (32 bytes per chunk) cross to the host; the data is
hashed on its own device. On a CUDA tensor the Triton kernel runs; elsewhere the CPU
reference (``hashlib.sha256`` of each chunk). A non-contiguous tensor is made contiguous
on its device first (a device copy, never a host copy).

Why 16 KiB chunks. A chunk is hashed serially by one GPU lane (SHA-256 has no parallelism
inside a message), so the chunk size sets two costs that pull opposite ways:
- latency per launch: every lane hashes CHUNK_BYTES / 64 + 1 blocks of 64 rounds in a row,
  so a tensor with fewer chunks than the GPU runs lanes at once (of the order of 10^5 on
  an H200: nearly every Open-1B weight, hashed one tensor per launch) takes about one
  chunk's time however few chunks it has: 257 blocks in a row at 16 KiB, 1,025 at 64 KiB;
- host work: 32 bytes per chunk cross to the host and are hashed there (0.2% of the data
  at 16 KiB, 0.05% at 64 KiB), and every chunk pays one padding block (0.4% more rounds).
At 16 KiB the full 3.2 GB of bf16 parameters is 195,313 chunks (enough lanes to fill an
H200) and 6.25 MB of digests for the host; a small tensor is one chunk either way.
``chunk_bytes`` is a parameter of every function for tests (the interpreter is slow);
any value but ``CHUNK_BYTES`` gives digests outside the format.

Arithmetic: integer and bit operations only (uint32 words, additions mod 2^32, rotations
as ``(x >> n) | (x << (32 - n))``), identical in the compiled kernel, the interpreter and
hashlib; no float operation, so no rounding, fusion or subnormal question arises.

Triton kernel: one lane per chunk, BLOCK lanes per program. A program loops over the
64-byte message blocks of its first (longest) chunk; lanes whose chunk has fewer blocks
keep their state (masked update). Each block's 16 big-endian words are assembled from the
data (int32 loads byte-swapped when the data is 4-byte aligned and its length a multiple
of 4, else four byte loads per word), with the padding built in place: 0x80 after the
last data byte, zeros, and the chunk's length in bits as the final block's last word (the
high length word is zero because CHUNK_BYTES * 8 < 2^32, and it falls past the 0x80
byte). The message schedule is a rolling window of 16 words. Rounds run 16 to a step,
unrolled (16 rounds rename the eight state words and the window back onto themselves, so
the loop carries them without moves); the steps are a loop, not unrolled: unrolling all
64 rounds made one compile for sm_90 take 43 s of CPU instead of 12.5 s (this machine),
for the same instructions per round.
The canonical byte order is little-endian and so is every platform torch and Triton run
on here (x86, NVIDIA), so a byte view of the contiguous tensor is the canonical data.
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import struct
from collections.abc import Mapping

import numpy as np
import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
# hashing's private helpers: the one definition of the header, the canonical data bytes
# (with the NaN refusal) and the name rule, shared so the two formats cannot drift apart.
from open1b_kernels.hashing.tensorbytes import HashingError, _data, _header, _name_bytes
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

CHUNK_BYTES = 16_384  # part of the hash format (see the module docstring)
DIGEST_BYTES = 32
BLOCK = 128  # chunks (lanes) per program
NAN_SLICE = 1 << 26  # elements per NaN-count pass: bounds the temporary bool tensor

# FIPS 180-4 section 4.2.2 (round constants) and 5.3.3 (initial hash value).
K = (
    0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
    0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
    0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
    0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
    0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
    0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
    0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
    0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2,
)


def _check_chunk_bytes(chunk_bytes: int) -> None:
    # Multiple of 64: full chunks end on a block boundary (and of 4, for word loads);
    # below 2^29: the length in bits fits the final block's low word.
    if not (isinstance(chunk_bytes, int) and 64 <= chunk_bytes < 2**29 and chunk_bytes % 64 == 0):
        raise ValueError(f"chunk_bytes must be a multiple of 64 in [64, 2^29), got {chunk_bytes!r}; "
                         f"the hash format uses CHUNK_BYTES = {CHUNK_BYTES}")


def n_chunks(n_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """How many chunks ``n_bytes`` of data split into (0 for no data)."""
    return -(-n_bytes // chunk_bytes)


def _refuse_nan(name: str, t: torch.Tensor) -> None:
    """open1b_kernels.hashing.tensorbytes's NaN rule, counted on t's device: only the count crosses."""
    if not t.is_floating_point() or t.numel() == 0:
        return
    count = int(sum(torch.isnan(part).sum() for part in t.reshape(-1).split(NAN_SLICE)))
    if count:
        raise HashingError(
            f"tensor {name!r} contains {count} NaN value(s); NaN payloads are not portable, "
            "so it cannot be hashed - find where the NaN came from"
        )


# ------------------------------------------------------------------- CPU reference
# Chunks per task of the CPU reference's threads: hashlib releases the GIL while it hashes
# a buffer (of more than 2 KiB), so the chunks of one tensor hash on torch's threads at once
# (a state's 19 GB at Open-1B scale on 2 cores: the digests' time halved)
HASH_TASK_CHUNKS = 256


_POOLS: dict[tuple[int, int], concurrent.futures.ThreadPoolExecutor] = {}


def _pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """This process's pool of ``workers`` threads. Keyed by the pid too: a forked child
    (the ingest pool forks on Linux) inherits the parent's pool without its threads, and
    work sent there would never run."""
    key = (os.getpid(), workers)
    if key not in _POOLS:
        _POOLS.clear()
        _POOLS[key] = concurrent.futures.ThreadPoolExecutor(workers,
                                                            thread_name_prefix="open1b-sha256")
    return _POOLS[key]


def _digests_of(data: memoryview, lo: int, hi: int, chunk_bytes: int) -> bytes:
    return b"".join(hashlib.sha256(data[i:min(i + chunk_bytes, hi)]).digest()
                    for i in range(lo, hi, chunk_bytes))


def chunk_digests_cpu(t: torch.Tensor, chunk_bytes: int = CHUNK_BYTES,
                      name: str = "tensor") -> torch.Tensor:
    """hashlib.sha256 of each chunk of the canonical data bytes, (n_chunks, 32) uint8; runs
    of HASH_TASK_CHUNKS chunks on torch's thread count at once (each digest is its own
    chunk's, so the split changes no byte)."""
    _check_chunk_bytes(chunk_bytes)
    _header(name, t)  # refuses dtypes without a canonical encoding, naming the tensor
    data = memoryview(_data(name, t).reshape(-1).view(np.uint8))
    n, task = len(data), HASH_TASK_CHUNKS * chunk_bytes
    workers = torch.get_num_threads()
    if workers <= 1 or n <= task:
        digests = _digests_of(data, 0, n, chunk_bytes)
    else:
        digests = b"".join(_pool(workers).map(
            lambda lo: _digests_of(data, lo, min(lo + task, n), chunk_bytes), range(0, n, task)))
    out = np.frombuffer(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
    return torch.from_numpy(out.copy())


# ------------------------------------------------------------------- Triton kernel
if HAVE_TRITON:

    @triton.jit
    def _bswap(x):
        return (x << 24) | ((x & 0xFF00) << 8) | ((x >> 8) & 0xFF00) | (x >> 24)

    @triton.jit
    def _word(src, start, length, q, WORDS: tl.constexpr):
        """Big-endian message word at chunk offset ``q`` (a scalar) of each lane's chunk,
        with SHA-256 padding: 0x80 right after the data, zeros past it."""
        if WORDS:
            # length is a multiple of 4 here, so a word is all data or all padding.
            raw = tl.load(src + (start + q) // 4, mask=q < length, other=0)
            word = _bswap(raw.to(tl.uint32, bitcast=True))
            pad = tl.where(q == length, 0x80000000, 0).to(tl.uint32)
            word = tl.where(q < length, word, pad)
        else:
            word = tl.zeros(length.shape, tl.uint32)
            for k in tl.static_range(4):
                pos = q + k
                byte = tl.load(src + start + pos, mask=pos < length, other=0).to(tl.uint32)
                byte = tl.where(pos == length, 0x80, byte).to(tl.uint32)
                word = word | (byte << (24 - 8 * k))
        return word

    @triton.jit
    def _rounds16(a, b, c, d, e, f, g, h, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11,
                  w12, w13, w14, w15, k_ptr, SCHEDULE: tl.constexpr):
        """16 rounds; the window w0..w15 = W[i .. i+15] rolls through W[i+16 .. i+31] when
        SCHEDULE (16 rounds rename a..h and the window back onto themselves, so a loop
        over calls carries them without moves)."""
        for j in tl.static_range(16):
            kt = tl.load(k_ptr + j).to(tl.uint32, bitcast=True)
            # Rotations written out (x >> n) | (x << (32 - n)): the interpreter pays a
            # large fixed cost per nested jit call.
            s1 = ((e >> 6) | (e << 26)) ^ ((e >> 11) | (e << 21)) ^ ((e >> 25) | (e << 7))
            t1 = h + s1 + (g ^ (e & (f ^ g))) + kt + w0  # Ch(e, f, g)
            s0 = ((a >> 2) | (a << 30)) ^ ((a >> 13) | (a << 19)) ^ ((a >> 22) | (a << 10))
            t2 = s0 + ((a & b) | (c & (a | b)))  # Maj(a, b, c)
            h, g, f, e, d, c, b, a = g, f, e, d + t1, c, b, a, t1 + t2
            nxt = w0
            if SCHEDULE:
                sig0 = ((w1 >> 7) | (w1 << 25)) ^ ((w1 >> 18) | (w1 << 14)) ^ (w1 >> 3)
                sig1 = ((w14 >> 17) | (w14 << 15)) ^ ((w14 >> 19) | (w14 << 13)) ^ (w14 >> 10)
                nxt = sig1 + w9 + sig0 + w0
            (w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14,
             w15) = (w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, nxt)
        return (a, b, c, d, e, f, g, h, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12,
                w13, w14, w15)

    @triton.jit
    def _sha256_chunks_kernel(src, out, k_ptr, n_bytes, n_chunks,
                              CHUNK: tl.constexpr, WORDS: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0).to(tl.int64)
        chunk = pid * BLOCK + tl.arange(0, BLOCK)
        live = chunk < n_chunks
        start = chunk * CHUNK
        length = tl.where(live, tl.minimum(n_bytes - start, CHUNK), 0)
        blocks = tl.where(live, (length + 72) // 64, 0)  # data + 0x80 + 8 length bytes
        first_len = tl.minimum(n_bytes - pid * BLOCK * CHUNK, CHUNK)
        bits = (length * 8).to(tl.uint32)

        h0 = tl.full([BLOCK], 0x6A09E667, tl.uint32)
        h1 = tl.full([BLOCK], 0xBB67AE85, tl.uint32)
        h2 = tl.full([BLOCK], 0x3C6EF372, tl.uint32)
        h3 = tl.full([BLOCK], 0xA54FF53A, tl.uint32)
        h4 = tl.full([BLOCK], 0x510E527F, tl.uint32)
        h5 = tl.full([BLOCK], 0x9B05688C, tl.uint32)
        h6 = tl.full([BLOCK], 0x1F83D9AB, tl.uint32)
        h7 = tl.full([BLOCK], 0x5BE0CD19, tl.uint32)
        # The first lane's chunk is the longest in the program (only the last chunk of
        # the tensor is short), so its block count bounds every lane's.
        for blk in range(0, (first_len + 72) // 64):
            q = blk * 64
            w0 = _word(src, start, length, q, WORDS)
            w1 = _word(src, start, length, q + 4, WORDS)
            w2 = _word(src, start, length, q + 8, WORDS)
            w3 = _word(src, start, length, q + 12, WORDS)
            w4 = _word(src, start, length, q + 16, WORDS)
            w5 = _word(src, start, length, q + 20, WORDS)
            w6 = _word(src, start, length, q + 24, WORDS)
            w7 = _word(src, start, length, q + 28, WORDS)
            w8 = _word(src, start, length, q + 32, WORDS)
            w9 = _word(src, start, length, q + 36, WORDS)
            w10 = _word(src, start, length, q + 40, WORDS)
            w11 = _word(src, start, length, q + 44, WORDS)
            w12 = _word(src, start, length, q + 48, WORDS)
            w13 = _word(src, start, length, q + 52, WORDS)
            w14 = _word(src, start, length, q + 56, WORDS)
            w15 = _word(src, start, length, q + 60, WORDS)
            w15 = tl.where(blk == blocks - 1, bits, w15)  # the final block's length word

            a, b, c, d, e, f, g, h = h0, h1, h2, h3, h4, h5, h6, h7
            for r in range(0, 48, 16):  # a loop, not unrolled: compile time
                (a, b, c, d, e, f, g, h, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12,
                 w13, w14, w15) = _rounds16(a, b, c, d, e, f, g, h, w0, w1, w2, w3, w4, w5, w6,
                                            w7, w8, w9, w10, w11, w12, w13, w14, w15, k_ptr + r,
                                            True)
            (a, b, c, d, e, f, g, h, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12,
             w13, w14, w15) = _rounds16(a, b, c, d, e, f, g, h, w0, w1, w2, w3, w4, w5, w6,
                                        w7, w8, w9, w10, w11, w12, w13, w14, w15, k_ptr + 48,
                                        False)

            active = blk < blocks
            h0 = tl.where(active, h0 + a, h0)
            h1 = tl.where(active, h1 + b, h1)
            h2 = tl.where(active, h2 + c, h2)
            h3 = tl.where(active, h3 + d, h3)
            h4 = tl.where(active, h4 + e, h4)
            h5 = tl.where(active, h5 + f, h5)
            h6 = tl.where(active, h6 + g, h6)
            h7 = tl.where(active, h7 + h, h7)

        # out is int32 (n_chunks, 8) in little-endian memory: byte-swapped words put the
        # digest's big-endian bytes in order.
        row = out + chunk * 8
        tl.store(row + 0, _bswap(h0).to(tl.int32, bitcast=True), mask=live)
        tl.store(row + 1, _bswap(h1).to(tl.int32, bitcast=True), mask=live)
        tl.store(row + 2, _bswap(h2).to(tl.int32, bitcast=True), mask=live)
        tl.store(row + 3, _bswap(h3).to(tl.int32, bitcast=True), mask=live)
        tl.store(row + 4, _bswap(h4).to(tl.int32, bitcast=True), mask=live)
        tl.store(row + 5, _bswap(h5).to(tl.int32, bitcast=True), mask=live)
        tl.store(row + 6, _bswap(h6).to(tl.int32, bitcast=True), mask=live)
        tl.store(row + 7, _bswap(h7).to(tl.int32, bitcast=True), mask=live)


@functools.lru_cache(maxsize=None)
def _round_constants(device: torch.device) -> torch.Tensor:
    # K as int32 bit patterns (torch has no general uint32), one copy per device.
    return torch.tensor([k - (1 << 32) if k >= 1 << 31 else k for k in K], dtype=torch.int32,
                        device=device)


def _chunk_digests_triton(data: torch.Tensor, chunk_bytes: int) -> torch.Tensor:
    """Launch over the uint8 view ``data`` (1-D, contiguous); (n_chunks, 32) uint8."""
    n_bytes = data.numel()
    count = n_chunks(n_bytes, chunk_bytes)
    out = torch.empty((count, 8), dtype=torch.int32, device=data.device)
    if count == 0:
        return out.view(torch.uint8)
    words = n_bytes % 4 == 0 and data.data_ptr() % 4 == 0
    src = data.view(torch.int32) if words else data
    grid = (triton.cdiv(count, BLOCK),)
    _sha256_chunks_kernel[grid](src, out, _round_constants(data.device), n_bytes, count,
                                CHUNK=chunk_bytes, WORDS=words, BLOCK=BLOCK, **LAUNCH_OPTIONS)
    return out.view(torch.uint8)


# ------------------------------------------------------------------- public API
def chunk_digests(t: torch.Tensor, chunk_bytes: int = CHUNK_BYTES,
                  name: str = "tensor") -> torch.Tensor:
    """SHA-256 of each chunk of ``t``'s canonical data bytes: (n_chunks, 32) uint8 on
    ``t``'s device. ``name`` only labels errors (NaN, unsupported dtype)."""
    _check_chunk_bytes(chunk_bytes)
    if not use_triton(t):
        return chunk_digests_cpu(t, chunk_bytes, name).to(t.device)
    _header(name, t)
    flat = t.detach().contiguous().reshape(-1)
    _refuse_nan(name, flat)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return _chunk_digests_triton(flat.view(torch.uint8), chunk_bytes)


def _root(name: str, t: torch.Tensor, digests: torch.Tensor) -> bytes:
    """The 32-byte root of ``t`` from its chunk digests (the only data that crosses)."""
    n_bytes = t.numel() * t.element_size()
    h = hashlib.sha256(_header(name, t))
    h.update(struct.pack("<QQ", digests.shape[0], n_bytes))
    h.update(digests.cpu().numpy().tobytes())
    return h.digest()


def tensor_root(name: str, t: torch.Tensor, chunk_bytes: int = CHUNK_BYTES) -> str:
    """Hex SHA-256 of header || u64 n_chunks || u64 n_bytes || chunk digests."""
    return _root(name, t, chunk_digests(t, chunk_bytes, name)).hex()


def zero_root(name: str, shape: tuple[int, ...], dtype: torch.dtype,
              chunk_bytes: int = CHUNK_BYTES) -> str:
    """``tensor_root`` of a tensor of zeros of ``shape`` / ``dtype``, from the format alone:
    the canonical bytes of zeros are zero bytes, so every whole chunk has one digest and
    a short last chunk one more - two SHA-256 of at most ``chunk_bytes``, whatever the size
    (tested against ``tensor_root`` of real zeros). For state known to be zero (fresh Adam
    moments), which would otherwise be read back and hashed byte by byte."""
    _check_chunk_bytes(chunk_bytes)
    like = torch.empty(shape, dtype=dtype, device="meta")
    _header(name, like)
    full, rest = divmod(like.numel() * like.element_size(), chunk_bytes)
    digests = (hashlib.sha256(bytes(chunk_bytes)).digest() * full
               + (hashlib.sha256(bytes(rest)).digest() if rest else b""))
    d = np.frombuffer(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
    return _root(name, like, torch.from_numpy(d.copy())).hex()


def streamed_root(name: str, shape: tuple[int, ...], dtype: torch.dtype, parts,
                  chunk_bytes: int = CHUNK_BYTES) -> str:
    """``tensor_root`` of a CPU tensor of ``shape`` / ``dtype`` given as its consecutive flat
    ``parts`` (an iterable of 1-D tensors; every part but the last a whole number of chunks),
    so a tensor kept on disk is hashed without ever being whole in memory. The same bytes
    in the same chunks: the same root (tested against ``tensor_root``)."""
    _check_chunk_bytes(chunk_bytes)
    like = torch.empty(shape, dtype=dtype, device="meta")
    _header(name, like)
    digests, n_bytes, ragged = [], 0, False
    for part in parts:
        if ragged:
            raise ValueError(f"{name}: a part of {n_bytes} bytes that is not a whole number "
                             f"of {chunk_bytes}-byte chunks came before the last")
        part = part.detach().reshape(-1)
        size = part.numel() * part.element_size()
        ragged = size % chunk_bytes != 0
        digests.append(chunk_digests_cpu(part, chunk_bytes, name))
        n_bytes += size
    if n_bytes != like.numel() * like.element_size():
        raise ValueError(f"{name}: parts of {n_bytes} bytes for a tensor of "
                         f"{like.numel() * like.element_size()}")
    d = torch.cat(digests) if digests else torch.zeros((0, DIGEST_BYTES), dtype=torch.uint8)
    return _root(name, like, d).hex()


def digest_roots(named: Mapping[str, torch.Tensor], chunk_bytes: int = CHUNK_BYTES) -> str:
    """Hex SHA-256 of a name -> tensor mapping built from roots, independent of order."""
    h = hashlib.sha256()
    for key in sorted(named, key=_name_bytes):
        name = _name_bytes(key)
        root = _root(key, named[key], chunk_digests(named[key], chunk_bytes, key))
        h.update(struct.pack("<Q", len(name)) + name + root)
    return h.hexdigest()


# ---------------------------------------------------------------- GPU check registry
PARAMS = 1_600_000_000  # Open-1B parameters: 3.2 GB of bf16


def _make(scale: float, device, odd: bool = False):
    # Random finite bf16 bit patterns (0 .. 0x7F7F: positive, subnormals included, no
    # inf/NaN); ``odd`` makes the byte length 2 mod 4 (the byte-load path).
    n = scaled(PARAMS, scale, 1024) + (1 if odd else 0)
    g = seeded_generator(20_256)
    t = torch.randint(0, 0x7F80, (n,), generator=g, dtype=torch.int16).view(torch.bfloat16)
    return (t.to(device),)


def _run(a):
    digests = chunk_digests(a[0], name="params")
    root = _root("params", a[0], digests)
    return digests, torch.frombuffer(bytearray(root), dtype=torch.uint8)


def _host_hash(a):
    # What a user does without this op: copy the whole tensor to the host and hash it.
    buf = a[0].cpu().view(torch.int16).numpy()
    return (torch.frombuffer(bytearray(hashlib.sha256(buf).digest()), dtype=torch.uint8),)


def _describe(scale: float, odd: bool = False) -> str:
    n = scaled(PARAMS, scale, 1024) + (1 if odd else 0)
    return f"[{n}] bf16 ({2 * n / 1e9:.2f} GB)"


GPU_CHECKS = [
    GpuCheck(
        name="sha256.chunks",
        make_inputs=_make,
        run=_run,
        torch_baseline=_host_hash,
        cost=lambda a: Cost(bytes=a[0].numel() * a[0].element_size()),
        describe=_describe,
        parity_scale=1 / 16,
        bench_scale=1 / 4,
        bound="compute",
        notes="integer-only; GB/s = hashed bytes per second; baseline = .cpu() + hashlib",
    ),
    GpuCheck(
        name="sha256.chunks_unaligned",
        make_inputs=lambda s, d: _make(s, d, odd=True),
        run=_run,
        torch_baseline=_host_hash,
        cost=lambda a: Cost(bytes=a[0].numel() * a[0].element_size()),
        describe=lambda s: _describe(s, odd=True),
        parity_scale=1 / 64,
        bench_scale=1 / 64,
        bound="compute",
        notes="byte length 2 mod 4: four byte loads per word",
    ),
]
