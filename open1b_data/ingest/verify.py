"""Checking a built mix against its manifest: every file it names, re-hashed and re-counted.

``verify(mix_url)`` returns one line per mismatch (missing file, sha256, size, or document
and token counts that differ from the shard's own metadata or lengths file), each naming the
file by its path relative to the mix root; the tokenizer files (``tokenizer.json`` and the
transformers directory) are re-hashed too. Each shard's Merkle tree is recomputed from the
shard's documents and compared with the root in the manifest and with the stored tree file
(a shard whose sha256 was rewritten to match edited documents still fails here); a shard
entry without a tree (a mix built before trees) has nothing to compare and passes as
before. An empty list means the mix is exactly what its manifest says. It reads every byte
of the mix. Something that is not a built mix at all (no
``manifest.json``, a ``.toml``, storage that cannot be reached) is an error, not a
mismatch: ``load_manifest``'s message, raised.
"""
from __future__ import annotations

import hashlib
from fractions import Fraction

from open1b_data.formats import merkle
from open1b_data.formats.heldout import fractions_of, heldout_rows
from open1b_data.formats.manifest import (ShardEntry, parse_manifest, read_manifest_bytes,
                                       tokenizer_files)
from open1b_data.formats.mixpath import mix_root, resolve
from open1b_data.formats.shards import iter_documents, read_lengths, read_shard_info
from open1b_data.errors import ManifestError, ShardFormatError
from open1b_data.storage import sha256_of
from open1b_data.storage_errors import failures


def _hash_and_size(url: str) -> tuple[str, int] | None:
    from open1b_data.storage import url_to_fs

    with failures(url, "read"):
        fs, path = url_to_fs(url)
        if not fs.exists(path):
            return None
        size = int(fs.size(path))
    return sha256_of(url), size


def verify(mix_url: str) -> list[str]:
    """Every mismatch between the manifest and the files it names, one line each."""
    root = mix_root(mix_url)
    url, raw = read_manifest_bytes(root)
    try:
        m = parse_manifest(raw, url)
    except ManifestError as e:
        return [str(e)]
    problems: list[str] = []
    for f in tokenizer_files(m.tokenizer):
        got = _hash_and_size(resolve(root, f["path"]))
        if got is None:
            problems.append(f"{f['path']}: missing file")
        elif got[0] != f["sha256"]:
            problems.append(f"{f['path']}: sha256 differs (manifest {f['sha256']}, file "
                            f"{got[0]})")
    fractions = fractions_of(m.definition)
    for source, sh in m.shards():
        url = resolve(root, sh.path)
        got = _hash_and_size(url)
        intact = False   # the shard's bytes and counts are the manifest's
        if got is None:
            problems.append(f"{sh.path}: missing file")
        else:
            if got[0] != sh.sha256:
                problems.append(f"{sh.path}: sha256 differs (manifest {sh.sha256}, file "
                                f"{got[0]})")
            if got[1] != sh.bytes:
                problems.append(f"{sh.path}: size differs (manifest {sh.bytes}, file {got[1]})")
            if got[0] == sh.sha256:
                try:
                    info = read_shard_info(url)
                    if (info.documents, info.tokens, info.source) != (sh.documents, sh.tokens,
                                                                      source):
                        problems.append(
                            f"{sh.path}: count differs (manifest {source} {sh.documents} docs "
                            f"{sh.tokens} tokens, shard {info.source} {info.documents} docs "
                            f"{info.tokens} tokens)")
                    else:
                        intact = True
                except ShardFormatError as e:
                    problems.append(f"{sh.path}: {e}")
        fraction = fractions.get(source)
        if (sh.heldout is None) != (fraction is None):
            problems.append(f"{sh.path}: held-out rows {'missing' if fraction else 'listed'} "
                            f"but the definition gives source {source!r} "
                            f"{'a' if fraction else 'no'} held-out fraction; rebuild the mix")
        try:
            problems.extend(_check_tree(root, url, sh, intact, fraction))
        except ShardFormatError as e:
            problems.append(f"{sh.path}: {e}")
        lurl = resolve(root, sh.lengths_path)
        got = _hash_and_size(lurl)
        if got is None:
            problems.append(f"{sh.lengths_path}: missing file")
            continue
        if got[0] != sh.lengths_sha256:
            problems.append(f"{sh.lengths_path}: sha256 differs (manifest {sh.lengths_sha256}, "
                            f"file {got[0]})")
            continue
        try:
            lengths = read_lengths(lurl)
        except ShardFormatError as e:
            problems.append(f"{sh.lengths_path}: {e}")
            continue
        if len(lengths) != sh.documents or int(lengths.sum(dtype="u8")) != sh.tokens:
            problems.append(f"{sh.lengths_path}: count differs (manifest {sh.documents} docs "
                            f"{sh.tokens} tokens, file {len(lengths)} docs "
                            f"{int(lengths.sum(dtype='u8'))} tokens)")
    return problems


def _check_tree(root: str, url: str, sh: ShardEntry, intact: bool,
                fraction: Fraction | None = None) -> list[str]:
    """The stored tree file against the manifest; and, when the shard itself is ``intact``,
    the tree recomputed from its documents against the manifest's root and that file, and
    the held-out rows re-derived from its ``doc_id`` column by the rule."""
    if intact and fraction is not None and sh.heldout is not None:
        want = heldout_rows((d.doc_id for d in iter_documents(url)), fraction)
        if tuple(want) != sh.heldout:
            return [f"{sh.path}: held-out rows differ (manifest {len(sh.heldout)} rows, the "
                    f"rule on its doc_id column gives {len(want)}, first difference at "
                    f"{_first_difference(sh.heldout, want)}); rebuild the mix"]
    if sh.merkle is None:
        return []
    problems = []
    stored = _hash_and_size(resolve(root, sh.merkle.path))
    if stored is None:
        problems.append(f"{sh.merkle.path}: missing file")
    elif stored[0] != sh.merkle.sha256:
        problems.append(f"{sh.merkle.path}: sha256 differs (manifest {sh.merkle.sha256}, "
                        f"file {stored[0]})")
    if not intact:
        return problems
    tree = merkle.levels([merkle.leaf_hash(i, d.tokens)
                          for i, d in enumerate(iter_documents(url))])
    got = merkle.root_of(tree).hex()
    if got != sh.merkle.root:
        problems.append(f"{sh.path}: Merkle root differs (manifest {sh.merkle.root}, the "
                        f"shard's documents give {got}); rebuild the mix")
    elif hashlib.sha256(merkle.encode(tree)).hexdigest() != sh.merkle.sha256:
        problems.append(f"{sh.merkle.path}: the manifest's tree file is not the tree of the "
                        f"shard's documents; rebuild the mix")
    return problems


def _first_difference(a, b) -> int:
    """The first index where two row lists differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
