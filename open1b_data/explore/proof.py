"""Proved documents: the documents stream windows use, each with its Merkle inclusion proof
against the root its shard's manifest entry records (``formats/merkle.py``), and the windows
rebuilt from proved documents alone.

Contract:

* ``prove_documents(root, manifest, wanted, rows, ranges)`` reads each wanted document
  (``rows``: the shard's row groups that hold it, tokens and provenance) and its proof
  (``ranges``: the header and log2(n) nodes of the shard's stored tree), and accepts it
  only if its leaf - computed here from the tokens, doc_id, input and row read - leads to
  the manifest's root. A document that does not is a ``ProofError`` naming its source,
  shard path, row and doc_id, and saying which side is wrong: the document (the stored
  tree still proves the leaf the mix was built with) or the tree file (it leads nowhere).
  Nothing read from a shard or tree file is trusted before that check; the manifest is
  (its fingerprint is what a training run records), except its held-out lists: each
  proved document's held-out status by the definition's rule must be its status in the
  shard's list (``ProofError`` otherwise - a list emptied in a re-fingerprinted manifest
  would hide validation documents in training windows).
* ``rebuild_windows`` is the stream's window definition applied to proved documents:
  each segment copies ``[doc_start, doc_start + length)`` of its document, where position
  ``doc_length`` is the separator ``eot_id``, to its window at ``window_offset``; the
  segments must tile every window exactly.
* ``prove_stream_at(mix, rep)`` adds ``documents`` (each document once, in order of first
  use, with its whole token list: a leaf commits to the whole document) and ``merkle`` to a
  ``stream-at`` report, after checking that the windows rebuilt from the proved documents
  have the report's sha256s (docs/CLI.md, ``stream-at --proof``).

A shard entry without a root (a synthetic plan-only mix) cannot be proved: ``ProofError``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from open1b_data.formats import merkle
from open1b_data.formats.manifest import BuiltManifest, ShardEntry
from open1b_data.formats.mixpath import resolve
from open1b_data.formats.shards import ShardRow
from open1b_data.errors import ProofError, StreamError

DocKey = tuple[str, int, int]           # (source name, shard index, row in the shard)
# (source, shard, shard URL, its entry, rows) -> those documents (tokens and provenance)
RowReader = Callable[[str, int, str, ShardEntry, list[int]], list[ShardRow]]


@dataclass(frozen=True)
class ProvedDocument:
    """One document and the proof that its shard's root commits to it."""

    source: str
    shard: int
    shard_path: str
    row: int                  # row in the shard (the leaf index)
    doc_id: str
    tokens: np.ndarray
    proof: merkle.Proof
    root: str
    tree_path: str
    input: str = ""           # provenance: input file (relative to the source root) ...
    input_row: int = -1       # ... and row in it

    @property
    def key(self) -> DocKey:
        return (self.source, self.shard, self.row)

    def leaf(self) -> bytes:
        return merkle.leaf_hash(self.row, self.tokens, self.doc_id, self.input, self.input_row)

    def to_dict(self) -> dict:
        return {"source": self.source, "shard": self.shard, "shard_path": self.shard_path,
                "doc": self.row, "doc_id": self.doc_id, "input": self.input,
                "input_row": self.input_row, "doc_length": int(self.tokens.size),
                "tokens": self.tokens.tolist(), "leaf": self.leaf().hex(),
                "proof": self.proof.to_dict(), "root": self.root, "tree_path": self.tree_path}


def describe(source: str, shard_path: str, row: int, doc_id: str | None) -> str:
    return f"document {source} {shard_path} row {row} (doc_id {doc_id!r})"


def shard_entry(manifest: BuiltManifest, source: str, shard: int) -> ShardEntry:
    """The manifest entry of a shard that has a Merkle root, or ``ProofError``."""
    entry = manifest.source(source).shards[shard]
    if entry.merkle is None:
        raise ProofError(f"{entry.path} has no Merkle root in the manifest of mix "
                         f"{manifest.name!r} (a plan-only mix): no document of it can be "
                         f"proved")
    return entry


def check_document(label: str, row: int, doc: ShardRow, stored_leaf: bytes,
                   proof: merkle.Proof, root: bytes, tree_path: str) -> None:
    """``ProofError`` (see module docstring) unless ``doc`` is leaf ``row`` of ``root``."""
    if merkle.verify(merkle.leaf_hash(row, doc.tokens, doc.doc_id, doc.input, doc.row),
                     proof, root):
        return
    if merkle.verify(stored_leaf, proof, root):
        raise ProofError(f"{label} does not match its shard's Merkle root: its "
                         f"{doc.tokens.size} tokens, doc_id, input or row are not the ones "
                         f"the mix was built with (the shard's tree still proves the "
                         f"original); the shard was changed after the build - refusing it")
    raise ProofError(f"{label} cannot be proved: the tree file {tree_path} does not lead to "
                     f"the root in the manifest (damaged or replaced); run `open1b-data "
                     f"verify` on the mix - refusing the document")


def prove_documents(mix_root: str, manifest: BuiltManifest, wanted: Iterable[DocKey],
                    rows: RowReader, ranges: merkle.RangeReader) -> list[ProvedDocument]:
    """The ``wanted`` documents, read and proved (module docstring), in ``wanted`` order."""
    from open1b_data.formats.heldout import fractions_of, is_heldout

    fractions = fractions_of(manifest.definition)
    order = list(dict.fromkeys(wanted))
    by_shard: dict[tuple[str, int], list[int]] = {}
    for source, shard, row in order:
        by_shard.setdefault((source, shard), []).append(row)
    got: dict[DocKey, ProvedDocument] = {}
    for (source, shard), docs in by_shard.items():
        entry = shard_entry(manifest, source, shard)
        docs = sorted(set(docs))
        tree_url = resolve(mix_root, entry.merkle.path)
        try:
            proofs = merkle.read_proofs(ranges, tree_url, entry.documents, docs)
        except FileNotFoundError:
            raise ProofError(f"{entry.merkle.path}: the shard's Merkle tree file does not "
                             f"exist, so no document of {entry.path} can be proved; run "
                             f"`open1b-data verify` on the mix") from None
        read = rows(source, shard, resolve(mix_root, entry.path), entry, docs)
        root = bytes.fromhex(entry.merkle.root)
        for row, doc in zip(docs, read):
            stored_leaf, proof = proofs[row]
            label = describe(source, entry.path, row, doc.doc_id)
            check_document(label, row, doc, stored_leaf, proof, root, entry.merkle.path)
            fraction = fractions.get(source)
            listed = row in (entry.heldout or ())
            if fraction is not None and is_heldout(doc.doc_id, fraction) != listed:
                how = "not held out by" if listed else "held out by"
                raise ProofError(f"{label}: {how} the definition's rule (fraction "
                                 f"{fraction}), but {'' if listed else 'not '}listed as held "
                                 f"out in the manifest; its held-out lists were edited - "
                                 f"refusing the mix")
            got[(source, shard, row)] = ProvedDocument(
                source, shard, entry.path, row, doc.doc_id, doc.tokens, proof,
                entry.merkle.root, entry.merkle.path, doc.input, doc.row)
    return [got[k] for k in order]


# ---------------------------------------------------------------------------------------
# Windows from proved documents

@dataclass(frozen=True)
class Placement:
    """One segment: document ``key``'s positions ``[doc_start, doc_start + length)`` at
    ``offset`` of output row ``row`` (position ``len(document)`` is the separator)."""

    row: int
    offset: int
    key: DocKey
    doc_start: int
    length: int


def rebuild_windows(placements: Sequence[Placement], docs: Mapping[DocKey, np.ndarray],
                    count: int, window: int, eot_id: int) -> np.ndarray:
    """``count`` windows of ``window`` token ids (uint32) from proved documents."""
    out = np.empty((count, window), dtype=np.uint32)
    filled = np.zeros(count, dtype=np.int64)
    for p in sorted(placements, key=lambda p: (p.row, p.offset)):
        doc = docs[p.key]
        n = int(doc.size)
        if (p.offset != filled[p.row] or p.offset + p.length > window or p.length < 1
                or not 0 <= p.doc_start or p.doc_start + p.length > n + 1):
            raise StreamError(f"window row {p.row}: a segment of {p.length} tokens at offset "
                              f"{p.offset} (document positions from {p.doc_start} of {n} + "
                              f"separator) does not tile the window; the plan is inconsistent")
        body = min(p.length, n - p.doc_start)
        out[p.row, p.offset:p.offset + body] = doc[p.doc_start:p.doc_start + body]
        if body < p.length:
            out[p.row, p.offset + body] = eot_id
        filled[p.row] += p.length
    short = np.flatnonzero(filled != window)
    if short.size:
        raise StreamError(f"window row {int(short[0])}: its segments cover "
                          f"{int(filled[short[0]])} of {window} tokens; the plan is "
                          f"inconsistent")
    return out


# ---------------------------------------------------------------------------------------
# stream-at --proof

def local_ranges(url: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    """Byte ranges of one file (local or object store) in one batched call."""
    from open1b_data.storage import read_ranges

    return read_ranges(url, ranges)


def prove_stream_at(mix: str, rep: dict) -> dict:
    """``rep`` (a ``stream-at`` report with tokens) plus ``documents`` and ``merkle``."""
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.formats.mixpath import mix_root
    from open1b_data.formats.shards import read_documents
    from open1b_data.stream.windows import window_sha256

    root = mix_root(mix)
    manifest = load_manifest(root)
    if manifest.fingerprint != rep["fingerprint"]:
        raise ProofError(f"{root}: the manifest changed while stream-at read it (fingerprint "
                         f"{manifest.fingerprint[:16]}..., was {rep['fingerprint'][:16]}...); "
                         f"run it again")
    segs = [(row, s) for row, w in enumerate(rep["windows"]) for s in w["segments"]]
    keys = [(s["source"], s["shard"], s["doc"]) for _, s in segs]

    def rows(source: str, shard: int, url: str, entry: ShardEntry, docs: list[int]):
        # the documents are read again (row groups only) and proved on their own
        return read_documents(url, docs)

    proved = prove_documents(root, manifest, keys, rows, local_ranges)
    docs = {d.key: d.tokens for d in proved}
    placements = [Placement(row, s["window_offset"], (s["source"], s["shard"], s["doc"]),
                            s["doc_start"], s["length"]) for row, s in segs]
    rebuilt = rebuild_windows(placements, docs, len(rep["windows"]), rep["window_tokens"],
                              int(manifest.tokenizer["eot_id"]))
    for w, toks in zip(rep["windows"], rebuilt):
        if window_sha256(toks) != w["sha256"]:
            raise ProofError(f"window {w['window']}: rebuilt from its proved documents it has "
                             f"sha256 {window_sha256(toks)}, the stream read "
                             f"{w['sha256']}; the shards changed while stream-at ran - run it "
                             f"again")
    return {**rep, "merkle": {
        "leaf": ("SHA-256(0x00 || u64 LE row || u64 LE token count || token ids uint32 LE "
                 "|| u64 LE len || doc_id || u64 LE len || input || i64 LE input row)"),
        "node": "SHA-256(0x01 || left || right)",
        "shape": "RFC 6962: split at the largest power of two below n; siblings bottom-up",
        "verified": True}, "documents": [d.to_dict() for d in proved]}
