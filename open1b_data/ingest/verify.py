"""Checking a built mix against its manifest: every file it names, by the content the mix
fingerprint covers.

``verify(mix_url)`` returns one line per mismatch, each naming the file by its path
relative to the mix root (``check(mix_url)`` the same lines and the counts of what was
read and compared, so that an "OK" can say what it covers):

* tokenizer files (``tokenizer.json`` and the transformers directory): missing, or content
  that is not the manifest's (``formats/tokenizerfile.py``: vocabulary, merges, special
  tokens, pre-tokenizer, settings - not the JSON's formatting);
* each shard: missing or unreadable, footer counts that are not the manifest's, documents
  whose Merkle tree - recomputed from their tokens and provenance - does not have the
  manifest's root (naming the first changed row when the stored tree can tell), held-out
  rows that are not what the definition's rule gives on its ``doc_id`` column, and a stored
  tree file that is not the tree of its documents (proofs read it);
* each lengths file: missing, malformed, or counts whose digest is not the manifest's.

Files are compared by content, never by their bytes: a shard rewritten by another Parquet
writer, or a tokenizer file re-indented, is intact. An empty list means the mix holds
exactly the content its fingerprint names. It reads every byte of the mix. Something that
is not a built mix at all (no ``manifest.json``, a ``.toml``, storage that cannot be
reached) is an error, not a mismatch: ``load_manifest``'s message, raised.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from open1b_data.errors import ManifestError, ShardFormatError
from open1b_data.formats import merkle
from open1b_data.formats.heldout import fractions_of, heldout_rows
from open1b_data.formats.manifest import (BuiltManifest, ShardEntry, parse_manifest,
                                          read_manifest_bytes, tokenizer_files)
from open1b_data.formats.mixpath import mix_root, resolve
from open1b_data.formats.shards import (iter_documents, lengths_digest, parse_lengths,
                                        read_shard_info)
from open1b_data.formats.tokenizerfile import content_digest
from open1b_data.storage import read_bytes
from open1b_data.storage_errors import failures


def _read(url: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        with failures(url, "read"):
            return read_bytes(url)
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class Verification:
    """What ``check`` found and what it read: the counts are of work done (a shard that
    could not be read is not counted as checked), never copied from the manifest."""
    problems: tuple[str, ...]
    fingerprint: str | None          # the manifest's content fingerprint (recomputed on parse)
    tokenizer_files: int             # compared by content
    shards: int                      # read whole, Merkle root recomputed from the documents
    documents: int
    tokens: int
    heldout_rows: int                # re-derived by the definition's rule and compared
    lengths_files: int               # read and compared with the manifest and the shard

    def summary(self) -> str:
        """One line saying what an OK covers."""
        return (f"content fingerprint {self.fingerprint}: {self.shards} shard(s) read whole "
                f"({self.documents:,} documents, {self.tokens:,} tokens; Merkle roots "
                f"recomputed from tokens and provenance), {self.heldout_rows:,} held-out "
                f"row(s) re-derived by the definition's rule, {self.lengths_files} lengths "
                f"file(s) and {self.tokenizer_files} tokenizer file(s) compared by content")


def verify(mix_url: str) -> list[str]:
    """Every mismatch between the manifest's content and the files it names, one line
    each (module docstring)."""
    return list(check(mix_url).problems)


def check(mix_url: str) -> Verification:
    """``verify``'s mismatches with the counts of what was read and compared."""
    root = mix_root(mix_url)
    url, raw = read_manifest_bytes(root)
    try:
        m = parse_manifest(raw, url)
    except ManifestError as e:
        return Verification((str(e),), None, 0, 0, 0, 0, 0, 0)
    problems = _tokenizer(root, m)
    fractions = fractions_of(m.definition)
    shards = documents = tokens = heldout = lengths_files = 0
    for source, sh in m.shards():
        fraction = fractions.get(source)
        if (sh.heldout is None) != (fraction is None):
            problems.append(f"{sh.path}: held-out rows {'missing' if fraction else 'listed'} "
                            f"but the definition gives source {source!r} "
                            f"{'a' if fraction else 'no'} held-out fraction; rebuild the mix")
        sizes: list[int] | None = None
        try:
            found, sizes = _shard(root, source, sh, fraction)
            problems.extend(found)
        except ShardFormatError as e:
            problems.append(f"{sh.path}: {e}")
        if sizes is not None:
            shards, documents, tokens = shards + 1, documents + len(sizes), tokens + sum(sizes)
            if fraction is not None and sh.heldout is not None:
                heldout += len(sh.heldout)
        found = _lengths(root, sh, sizes)
        problems.extend(found)
        lengths_files += not found
    return Verification(tuple(problems), m.fingerprint, len(tokenizer_files(m.tokenizer)),
                        shards, documents, tokens, heldout, lengths_files)


def _tokenizer(root: str, m: BuiltManifest) -> list[str]:
    problems = []
    for f in tokenizer_files(m.tokenizer):
        raw = _read(resolve(root, f["path"]))
        if raw is None:
            problems.append(f"{f['path']}: missing file")
            continue
        try:
            got = content_digest(f["path"], raw)
        except ManifestError as e:
            problems.append(f"{f['path']}: {e}")
            continue
        if got != f["content"]:
            problems.append(f"{f['path']}: content differs (manifest {f['content']}, file "
                            f"{got}): not the tokenizer the mix was built with")
    return problems


def _shard(root: str, source: str, sh: ShardEntry, fraction: Fraction | None
           ) -> tuple[list[str], list[int] | None]:
    """The shard's problems, and its documents' token counts when it could be read."""
    url = resolve(root, sh.path)
    if not _exists(url):
        return [f"{sh.path}: missing file"], None
    with failures(url, "read"):                 # a directory where the shard should be
        info = read_shard_info(url)
    if (info.documents, info.tokens, info.source) != (sh.documents, sh.tokens, source):
        return [f"{sh.path}: count differs (manifest {source} {sh.documents} docs "
                f"{sh.tokens} tokens, shard {info.source} {info.documents} docs "
                f"{info.tokens} tokens)"], None
    leaves, ids, sizes = [], [], []
    for i, d in enumerate(iter_documents(url)):
        leaves.append(merkle.leaf_hash(i, d.tokens, d.doc_id, d.input, d.row))
        ids.append(d.doc_id)
        sizes.append(int(d.tokens.size))
    problems = []
    if fraction is not None and sh.heldout is not None:
        want = heldout_rows(ids, fraction)
        if tuple(want) != sh.heldout:
            problems.append(f"{sh.path}: held-out rows differ (manifest {len(sh.heldout)} "
                            f"rows, the rule on its doc_id column gives {len(want)}, first "
                            f"difference at {_first_difference(sh.heldout, want)}); rebuild "
                            f"the mix")
    if sh.merkle is None:
        return problems, sizes
    tree = merkle.levels(leaves)
    got = merkle.root_of(tree).hex()
    stored = _read(resolve(root, sh.merkle.path))
    if got != sh.merkle.root:
        where = _first_changed(stored, leaves, sh)
        problems.append(f"{sh.path}: Merkle root differs (manifest {sh.merkle.root}, the "
                        f"shard's documents give {got}){where}: its content changed since "
                        f"the build; restore or rebuild the mix")
    if stored is None:
        problems.append(f"{sh.merkle.path}: missing file")
    elif got == sh.merkle.root and stored != merkle.encode(tree):
        problems.append(f"{sh.merkle.path}: not the tree of the shard's documents (proofs "
                        f"read it); restore it or rebuild the mix")
    return problems, sizes


def _exists(url: str) -> bool:
    from open1b_data.storage import url_to_fs

    with failures(url, "read"):
        fs, path = url_to_fs(url)
        return bool(fs.exists(path))


def _first_changed(stored: bytes | None, leaves: list[bytes], sh: ShardEntry) -> str:
    """``, first at row i`` when the stored tree still leads to the manifest's root and so
    remembers the documents the mix was built with; else nothing."""
    if stored is None:
        return ""
    try:
        tree = merkle.decode(stored, sh.merkle.path, sh.documents)
    except ShardFormatError:
        return ""
    built = tree[0] if tree else []
    if merkle.root_of(merkle.levels(built)).hex() != sh.merkle.root:
        return ""
    i = next((k for k, (a, b) in enumerate(zip(leaves, built)) if a != b),
             min(len(leaves), len(built)))
    return f", first at row {i}"


def _lengths(root: str, sh: ShardEntry, sizes: list[int] | None) -> list[str]:
    """The lengths file against the manifest's digest and counts, and against the shard's
    own documents (``sizes``, when it could be read): the stream plans from this file."""
    lurl = resolve(root, sh.lengths_path)
    raw = _read(lurl)
    if raw is None:
        return [f"{sh.lengths_path}: missing file"]
    try:
        lengths = parse_lengths(raw, lurl)
    except ShardFormatError as e:
        return [f"{sh.lengths_path}: {e}"]
    digest = lengths_digest(lengths)
    if digest != sh.lengths_content:
        return [f"{sh.lengths_path}: content differs (manifest {sh.lengths_content}, file "
                f"{digest})"]
    if len(lengths) != sh.documents or int(lengths.sum(dtype=np.uint64)) != sh.tokens:
        return [f"{sh.lengths_path}: count differs (manifest {sh.documents} docs "
                f"{sh.tokens} tokens, file {len(lengths)} docs "
                f"{int(lengths.sum(dtype=np.uint64))} tokens)"]
    if sizes is not None and lengths.tolist() != sizes:
        return [f"{sh.lengths_path}: the lengths of the shard's documents differ (first at "
                f"row {_first_difference(lengths.tolist(), sizes)})"]
    return []


def _first_difference(a, b) -> int:
    """The first index where two row lists differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
