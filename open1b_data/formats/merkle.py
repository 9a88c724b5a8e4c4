"""The Merkle tree of a token shard: one leaf per document, so one document is proved to
belong to a built mix with log2(n) hashes instead of the whole shard, and a shard's root is
the digest of its content - what the mix fingerprint covers, whatever wrote the file.

Definition (docs/FORMATS.md, "Merkle trees", holds it with a test vector):

* leaf i = SHA-256(0x00 || u64 LE i || u64 LE token count || token ids as uint32 LE ||
  u64 LE byte length || doc_id UTF-8 || u64 LE byte length || input UTF-8 || i64 LE row)
  for the i-th document of the shard in row order, WITHOUT the stream's separator: a
  document is its tokens and its provenance (source-native id, input file relative to the
  source root, row in that input), so a changed id or origin changes the root as a changed
  token does;
* node = SHA-256(0x01 || left || right); the prefixes keep a leaf from passing as a node;
* n leaves form the RFC 6962 (Certificate Transparency) tree: split at the largest power
  of two below n. Built bottom-up that is "pair neighbours; an odd last node moves up a
  level unchanged", so no leaf is duplicated and a proof holds at most ceil(log2 n)
  hashes. The root of an empty shard is SHA-256 of the empty string.

The root is in the shard's manifest entry, so the mix fingerprint covers it. The tree
itself is stored beside the shard so that an auditor can read the few hashes a proof
needs with range requests (``<shard>.merkle``):

* a 32-byte header: magic ``b"open1bMT"``, then u64 LE version (2), u64 LE leaf count n,
  u64 LE level count;
* then every level bottom-up, leaves first, 32 bytes a node: level l holds
  ``c_l = ceil(c_{l-1} / 2)`` nodes (``c_0 = n``), the last level is the root alone. Node
  (l, j) starts at byte ``32 * (1 + c_0 + ... + c_{l-1} + j)``; the file is
  ``32 * (1 + sum c_l)`` bytes, about 64 bytes per document.

Nothing read from the file is trusted: a proof is only accepted when it rebuilds the
manifest's root (``root_from_proof``). Version 1 trees (leaves over the tokens alone) are
not read: their mixes are refused by the manifest reader, which asks for a rebuild.
"""
from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from open1b_data.errors import ShardFormatError

MAGIC = b"open1bMT"
VERSION = 2
HEADER = struct.Struct("<8sQQQ")
NODE = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()
_LEAF_HEAD = struct.Struct("<cQQ")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


def provenance_bytes(doc_id: str, input: str, row: int) -> bytes:
    """The leaf's tail: the document's provenance, each string prefixed by its length."""
    d, i = doc_id.encode("utf-8"), input.encode("utf-8")
    return b"".join((_U64.pack(len(d)), d, _U64.pack(len(i)), i, _I64.pack(int(row))))


def leaf_hash(index: int, tokens: np.ndarray, doc_id: str, input: str, row: int) -> bytes:
    """Leaf of document ``index``: its token ids (no separator) and its provenance."""
    data = np.ascontiguousarray(tokens, dtype="<u4")
    h = hashlib.sha256(_LEAF_HEAD.pack(LEAF_PREFIX, int(index), int(data.shape[0])))
    h.update(data.data)   # the array's bytes, not a copy
    h.update(provenance_bytes(doc_id, input, row))
    return h.digest()


def leaf_hashes(flat: np.ndarray, offsets: np.ndarray, doc_ids: Sequence[str],
                inputs: Sequence[str], rows: Sequence[int], first: int = 0,
                threads: int = 1) -> list[bytes]:
    """Leaves of consecutive documents ``first, first + 1, ...``: document k is
    ``flat[offsets[k]:offsets[k + 1]]`` with provenance ``(doc_ids[k], inputs[k],
    rows[k])``. The same hashes as ``leaf_hash``, with the per-document work in one loop
    over a zero-copy byte view (a shard's whole check is this loop plus the nodes). With
    ``threads`` = 2 the second half of the token bytes is hashed on another thread:
    SHA-256 releases the GIL for the document's bytes, which are nearly all of the work."""
    data = memoryview(np.ascontiguousarray(flat, dtype="<u4")).cast("B")
    ends = np.asarray(offsets, dtype=np.int64).tolist()
    n = len(ends) - 1
    out: list[bytes] = [b""] * n
    if threads < 2 or n < 2:
        _leaves_into(out, data, ends, doc_ids, inputs, rows, first, 0, n)
        return out
    mid = min(max(int(np.searchsorted(ends, ends[-1] // 2)), 1), n - 1)
    errors: list[BaseException] = []

    def second_half() -> None:
        try:
            _leaves_into(out, data, ends, doc_ids, inputs, rows, first, mid, n)
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(e)
    other = threading.Thread(target=second_half, name="open1b-leaves")
    other.start()
    try:
        _leaves_into(out, data, ends, doc_ids, inputs, rows, first, 0, mid)
    finally:
        other.join()
    if errors:
        raise errors[0]
    return out


def _leaves_into(out: list[bytes], data: memoryview, ends: list[int],
                 doc_ids: Sequence[str], inputs: Sequence[str], rows: Sequence[int],
                 first: int, lo: int, hi: int) -> None:
    """``out[k]`` = leaf of document k for k in ``[lo, hi)`` (``leaf_hashes``)."""
    sha, head, u64, i64, join = (hashlib.sha256, _LEAF_HEAD.pack, _U64.pack, _I64.pack,
                                 b"".join)
    encoded: dict[str, bytes] = {}        # inputs repeat: one input file holds many rows
    for k in range(lo, hi):
        a, b = ends[k], ends[k + 1]
        d = doc_ids[k].encode("utf-8")
        src = inputs[k]
        i = encoded.get(src)
        if i is None:
            i = encoded[src] = u64(len(src.encode("utf-8"))) + src.encode("utf-8")
        # one hash call over the joined bytes: ~10% faster than three updates, and within
        # ~25% of one SHA-256 over the shard's token bytes alone (benchmarks/HISTORY.md)
        out[k] = sha(join((head(LEAF_PREFIX, first + k, b - a), data[4 * a:4 * b],
                           u64(len(d)), d, i, i64(rows[k])))).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def level_sizes(n: int) -> list[int]:
    """Node count of every level, leaves first (empty for n = 0)."""
    sizes = []
    while n:
        sizes.append(n)
        if n == 1:
            break
        n = (n + 1) // 2
    return sizes


def levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree, leaves first; the last holds the root alone."""
    out = [list(leaves)] if leaves else []
    while out and len(out[-1]) > 1:
        below = out[-1]
        up = [node_hash(below[k], below[k + 1]) for k in range(0, len(below) - 1, 2)]
        if len(below) % 2:
            up.append(below[-1])   # carried: the RFC 6962 split never hashes it alone
        out.append(up)
    return out


def root_of(tree: list[list[bytes]]) -> bytes:
    return tree[-1][0] if tree else EMPTY_ROOT


@dataclass(frozen=True)
class Proof:
    """Inclusion proof of leaf ``index`` in a tree of ``size`` leaves: the sibling hashes
    from the leaf's level up (RFC 6962's audit path)."""

    index: int
    size: int
    siblings: tuple[bytes, ...]

    def to_dict(self) -> dict:
        return {"leaf_index": self.index, "tree_size": self.size,
                "siblings": [s.hex() for s in self.siblings]}


def path_nodes(index: int, size: int) -> list[tuple[int, int]]:
    """(level, position) of every sibling on leaf ``index``'s path, bottom-up."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is outside a tree of {size} leaves")
    out = []
    j = index
    for level, c in enumerate(level_sizes(size)[:-1]):
        if j ^ 1 < c:       # else node j is the odd last one: carried up, no sibling
            out.append((level, j ^ 1))
        j //= 2
    return out


def prove(tree: list[list[bytes]], index: int) -> Proof:
    """The proof of leaf ``index`` from the whole tree (``levels``)."""
    size = len(tree[0]) if tree else 0
    return Proof(index, size, tuple(tree[lv][j] for lv, j in path_nodes(index, size)))


def root_from_proof(leaf: bytes, proof: Proof) -> bytes | None:
    """The root that ``leaf`` and ``proof`` imply, or None when the proof has the wrong
    number of hashes for its index and size."""
    if not 0 <= proof.index < proof.size:
        return None
    h, j = leaf, proof.index
    siblings = iter(proof.siblings)
    used = 0
    for c in level_sizes(proof.size)[:-1]:
        if j ^ 1 < c:
            sib = next(siblings, None)
            if sib is None or len(sib) != NODE:
                return None
            h = node_hash(sib, h) if j & 1 else node_hash(h, sib)
            used += 1
        j //= 2
    return h if used == len(proof.siblings) else None


def verify(leaf: bytes, proof: Proof, root: bytes) -> bool:
    return root_from_proof(leaf, proof) == root


# ---------------------------------------------------------------------------------------
# The stored tree (``<shard>.merkle``)

def encode(tree: list[list[bytes]]) -> bytes:
    size = len(tree[0]) if tree else 0
    return HEADER.pack(MAGIC, VERSION, size, len(tree)) + b"".join(
        b"".join(level) for level in tree)


def node_offset(size: int, level: int, j: int) -> int:
    """Byte offset of node (level, j) in the stored tree of ``size`` leaves."""
    return NODE * (1 + sum(level_sizes(size)[:level]) + j)


def file_size(size: int) -> int:
    return NODE * (1 + sum(level_sizes(size)))


def check_header(data: bytes, url: str, size: int) -> None:
    """The first 32 bytes of a stored tree are those of a tree of ``size`` leaves."""
    if len(data) < HEADER.size:
        raise ShardFormatError(f"{url}: {len(data)} bytes, too short for a Merkle tree "
                               f"header; rebuild the mix")
    magic, version, n, nlevels = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise ShardFormatError(f"{url}: magic/version {magic!r}/{version}, expected "
                               f"{MAGIC!r}/{VERSION}; not a Merkle tree file of this format")
    if n != size or nlevels != len(level_sizes(size)):
        raise ShardFormatError(f"{url}: a tree of {n} leaves in {nlevels} levels, the "
                               f"manifest says {size} documents; rebuild the mix")


def decode(data: bytes, url: str, size: int) -> list[list[bytes]]:
    """A whole stored tree, checked for its header and length (not for its hashes)."""
    check_header(data, url, size)
    if len(data) != file_size(size):
        raise ShardFormatError(f"{url}: {len(data)} bytes, a tree of {size} leaves has "
                               f"{file_size(size)}; the file is damaged, rebuild the mix")
    out, at = [], HEADER.size
    for c in level_sizes(size):
        out.append([data[at + NODE * k:at + NODE * (k + 1)] for k in range(c)])
        at += NODE * c
    return out


RangeReader = Callable[[str, list[tuple[int, int]]], list[bytes]]


def read_proofs(read_ranges: RangeReader, url: str, size: int, indices: Iterable[int]
                ) -> dict[int, tuple[bytes, Proof]]:
    """For each leaf index: (the leaf hash the stored tree holds, its proof), read with one
    ``read_ranges(url, [(start, end), ...])`` call over the header and just those nodes
    (shared siblings and adjacent nodes are read once)."""
    indices = sorted({int(i) for i in indices})
    for i in indices:
        if not 0 <= i < size:
            raise ShardFormatError(f"{url}: leaf {i} outside a tree of {size} leaves")
    wanted = {(0, i) for i in indices}
    paths = {i: path_nodes(i, size) for i in indices}
    for p in paths.values():
        wanted.update(p)
    offsets = sorted(node_offset(size, lv, j) for lv, j in wanted)
    ranges: list[tuple[int, int]] = [(0, HEADER.size)]
    for off in offsets:   # merge touching ranges: a leaf and its sibling are one read
        if ranges[-1][1] == off:
            ranges[-1] = (ranges[-1][0], off + NODE)
        else:
            ranges.append((off, off + NODE))
    blobs = read_ranges(url, ranges)
    check_header(blobs[0], url, size)
    node: dict[int, bytes] = {}
    for (start, end), blob in zip(ranges, blobs):
        if len(blob) != end - start:
            raise ShardFormatError(f"{url}: bytes {start}..{end} are past the end of the "
                                   f"file ({file_size(size)} bytes expected); rebuild the mix")
        for off in range(start, end, NODE):
            node[off] = blob[off - start:off - start + NODE]
    return {i: (node[node_offset(size, 0, i)],
                Proof(i, size, tuple(node[node_offset(size, lv, j)] for lv, j in paths[i])))
            for i in indices}
