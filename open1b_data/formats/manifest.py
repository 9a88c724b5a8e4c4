"""The built mix's ``manifest.json``: dataclasses, canonical fingerprint, read/write, verify.

Contract (docs/FORMATS.md, "manifest.json"):
- ``BuiltManifest.to_dict()`` is the JSON object on disk; ``load_manifest`` parses it back
  into the same frozen dataclasses, checking ``format``/``version``, every field's type,
  the per-source sums against their shards, and the fingerprint (recomputed, never trusted).
- ``fingerprint(d)`` (``identity.py``) = sha256 hex of the canonical JSON of the manifest's
  *content*: ``d`` less the records of how and where its files were stored (paths, file
  sha256s and sizes, local source roots, compression and row-group settings, the builder's
  version). Every shard enters through its Merkle root over its documents' tokens and
  provenance (``merkle.py``) and the digest of its document lengths, the tokenizer through
  the digests of its content (``tokenizerfile.py``), so changing one token, id, length,
  held-out row, merge or definition value changes the fingerprint, and rewriting a file
  with another library version does not. A manifest of version 1 (a fingerprint over file
  bytes) is refused with a request to rebuild.
- Paths inside a manifest are relative to the mix root and confined (``mixpath``:
  ``check_path`` refuses absolute paths, URLs, drive letters, backslashes, control
  characters, empty, ``.`` and ``..`` components; ``resolve(mix_url, rel)`` is the only way
  to turn one into a URL). A confined path is accepted by one compiled regular expression
  (``mixpath.CONFINED``, ~2 us a path), and a shard entry is parsed in straight-line code
  (``_fast_shard``) with the field-by-field parse as the fallback that names what is
  wrong: opening a mix checks 3,322 shard entries at Open-1B scale (benchmarks/HISTORY.md:
  ~0.15 s, half of it parsing the JSON and the fingerprint).
- ``load_manifest`` refuses, with the path and what to pass instead, anything that is not
  a built mix: a mix definition ``.toml`` or another file, a directory without
  ``manifest.json``, an unreadable one; storage failures (no credentials, no network) name
  the URL and what to set (``open1b_data.storage_errors``).
- ``write_manifest`` writes atomically through fsspec (temporary name + rename locally, one
  PUT on object stores), so a reader never sees half a manifest; identical manifests give
  identical bytes.
- ``verify(mix_url)`` re-hashes every file the manifest names and returns one line per
  mismatch (missing file, sha256 differs, size differs, count differs); empty means intact.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from open1b.canonical import canonical_json
from open1b_data.errors import FileAccessError, ManifestError
from open1b_data.formats.identity import fingerprint
from open1b_data.formats.mixpath import CONFINED, MANIFEST, check_path, mix_root
from open1b_data.storage import atomic_write_bytes, join, read_bytes

FORMAT = "open1b-mix"
VERSION = 2           # 1: the fingerprint covered file bytes (docs/FORMATS.md)
_SHA256 = re.compile(r"[0-9a-f]{64}")


# ---------------------------------------------------------------------------------------
# Canonical JSON

# ``canonical_json`` (open1b.canonical): the bytes ``identity.fingerprint`` hashes


# ---------------------------------------------------------------------------------------
# Dataclasses

def _req(d: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
    # type() first: the Mapping ABC check costs ~1 us, and a loaded manifest is all dicts.
    if not (type(d) is dict or isinstance(d, Mapping)) or key not in d:
        raise ManifestError(f"{where}.{key}: missing; the manifest is malformed, rebuild it")
    value = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ManifestError(f"{where}.{key}: expected {'/'.join(k.__name__ for k in kinds)}, "
                            f"got {value!r}")
    return value


def _sha(d: Mapping[str, Any], key: str, where: str) -> str:
    value = _req(d, key, str, where)
    if not _SHA256.fullmatch(value):
        raise ManifestError(f"{where}.{key}: expected 64 lowercase hex digits, got {value!r}")
    return value


def _count(d: Mapping[str, Any], key: str, where: str) -> int:
    value = _req(d, key, int, where)
    if value < 0:
        raise ManifestError(f"{where}.{key}: must be >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class TreeEntry:
    """A shard's Merkle tree (``build/merkle.py``): its root, and the stored tree file that
    serves proofs (path relative to the mix root, and its sha256)."""

    root: str
    path: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "path": self.path, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "merkle") -> TreeEntry:
        return cls(root=_sha(d, "root", where),
                   path=check_path(_req(d, "path", str, where), f"{where}.path"),
                   sha256=_sha(d, "sha256", where))


@dataclass(frozen=True)
class ShardEntry:
    """One token shard, its document-lengths file and its Merkle tree, relative to the mix
    root. Content (fingerprinted): ``documents``, ``tokens``, ``lengths_content`` (sha256
    of the lengths as uint32 LE, not of the ``.npy`` file), ``merkle.root`` and
    ``heldout``. Records of this copy's files (not fingerprinted, never trusted): the
    paths, ``sha256`` and ``bytes`` of the Parquet file, the tree file's sha256.
    ``merkle`` is None only in synthetic plan-only mixes (no token shard): their shards
    cannot be read."""

    path: str
    sha256: str
    bytes: int
    documents: int
    tokens: int
    lengths_path: str
    lengths_content: str
    merkle: TreeEntry | None = None
    heldout: tuple[int, ...] | None = None   # rows held out (its source has a fraction)

    def to_dict(self) -> dict[str, Any]:
        d = {"path": self.path, "sha256": self.sha256, "bytes": self.bytes,
             "documents": self.documents, "tokens": self.tokens,
             "lengths": {"path": self.lengths_path, "content": self.lengths_content}}
        if self.merkle is not None:
            d["merkle"] = self.merkle.to_dict()
        if self.heldout is not None:
            d["heldout"] = list(self.heldout)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "shard") -> ShardEntry:
        lengths = _req(d, "lengths", dict, where)
        has_tree = isinstance(d, Mapping) and "merkle" in d
        return cls(path=check_path(_req(d, "path", str, where), f"{where}.path"),
                   sha256=_sha(d, "sha256", where), bytes=_count(d, "bytes", where),
                   documents=_count(d, "documents", where), tokens=_count(d, "tokens", where),
                   lengths_path=check_path(_req(lengths, "path", str, f"{where}.lengths"),
                                           f"{where}.lengths.path"),
                   lengths_content=_sha(lengths, "content", f"{where}.lengths"),
                   merkle=TreeEntry.from_dict(_req(d, "merkle", dict, where),
                                              f"{where}.merkle") if has_tree else None,
                   heldout=_heldout(d, where))


def _heldout(d: Mapping[str, Any], where: str) -> tuple[int, ...] | None:
    """A shard entry's ``heldout``: absent, or its held-out rows, strictly ascending, each
    in [0, documents)."""
    if not isinstance(d, Mapping) or "heldout" not in d:
        return None
    rows, n = d["heldout"], d.get("documents")
    if (type(rows) is not list or any(type(r) is not int for r in rows)
            or any(b <= a for a, b in zip(rows, rows[1:]))
            or (rows and (rows[0] < 0 or type(n) is not int or rows[-1] >= n))):
        raise ManifestError(f"{where}.heldout: expected the held-out rows, strictly ascending "
                            f"integers in [0, documents = {n!r}), got {str(rows)[:80]}; the "
                            f"manifest is malformed, rebuild it")
    return tuple(rows)


def _fast_shard(d: Any) -> ShardEntry | None:
    """``ShardEntry.from_dict(d)`` for an entry that passes every check, in straight-line
    code (~4x faster: a mix opens 3,322 of them at Open-1B scale); None on any doubt, and
    ``from_dict`` then finds and names the problem. The checks are the same: JSON gives
    exact ``dict``/``str``/``int`` types, so ``type(x) is int`` is ``_req``'s int-not-bool."""
    if type(d) is not dict or type(lengths := d.get("lengths")) is not dict:
        return None
    path, sha, size, docs = d.get("path"), d.get("sha256"), d.get("bytes"), d.get("documents")
    toks, lpath, lsha = d.get("tokens"), lengths.get("path"), lengths.get("content")
    if not (type(size) is int and type(docs) is int and type(toks) is int
            and size >= 0 and docs >= 0 and toks >= 0
            and type(sha) is str and type(lsha) is str
            and _SHA256.fullmatch(sha) and _SHA256.fullmatch(lsha)
            and type(path) is str and type(lpath) is str
            and CONFINED.fullmatch(path) and CONFINED.fullmatch(lpath)):
        return None
    if "heldout" in d:
        try:
            return dataclasses.replace(_fast_shard({k: v for k, v in d.items()
                                                    if k != "heldout"}),
                                       heldout=_heldout(d, "shard"))
        except (TypeError, ManifestError):     # None above, or a bad list: from_dict names it
            return None
    tree = d.get("merkle")
    if tree is None:
        return None if "merkle" in d else ShardEntry(path, sha, size, docs, toks, lpath, lsha)
    if type(tree) is not dict:
        return None
    root, tpath, tsha = tree.get("root"), tree.get("path"), tree.get("sha256")
    if not (type(root) is str and type(tsha) is str and type(tpath) is str
            and _SHA256.fullmatch(root) and _SHA256.fullmatch(tsha)
            and CONFINED.fullmatch(tpath)):
        return None
    return ShardEntry(path, sha, size, docs, toks, lpath, lsha, TreeEntry(root, tpath, tsha))


@dataclass(frozen=True)
class SourceEntry:
    """One source of the built mix: its shards in stream order, counts and inputs read."""

    name: str
    format: str
    documents: int
    tokens: int
    mean_tokens_per_doc: float
    target_share: float | None
    token_share: float
    shards: tuple[ShardEntry, ...]
    counts: dict
    inputs: tuple[dict, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.format, "documents": self.documents,
                "tokens": self.tokens, "mean_tokens_per_doc": self.mean_tokens_per_doc,
                "target_share": self.target_share, "token_share": self.token_share,
                "shards": [s.to_dict() for s in self.shards], "counts": dict(self.counts),
                "inputs": [dict(i) for i in self.inputs]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "source") -> SourceEntry:
        shards = tuple(_fast_shard(s) or ShardEntry.from_dict(s, _shard_where(where, i, s))
                       for i, s in enumerate(_req(d, "shards", list, where)))
        target = d.get("target_share") if isinstance(d, Mapping) else None
        if target is not None and (isinstance(target, bool)
                                   or not isinstance(target, (int, float))):
            raise ManifestError(f"{where}.target_share: expected a number or null, got "
                                f"{target!r}")
        entry = cls(name=_req(d, "name", str, where), format=_req(d, "format", str, where),
                    documents=_count(d, "documents", where), tokens=_count(d, "tokens", where),
                    mean_tokens_per_doc=float(_req(d, "mean_tokens_per_doc", (int, float),
                                                   where)),
                    target_share=target,
                    token_share=float(_req(d, "token_share", (int, float), where)),
                    shards=shards, counts=dict(_req(d, "counts", dict, where)),
                    inputs=tuple(_req(d, "inputs", list, where)))
        for i, inp in enumerate(entry.inputs):
            _check_input(inp, f"{where}.inputs[{i}]")
        docs, toks = sum(s.documents for s in shards), sum(s.tokens for s in shards)
        if (docs, toks) != (entry.documents, entry.tokens):
            raise ManifestError(f"{where} {entry.name!r}: documents/tokens {entry.documents}/"
                                f"{entry.tokens} differ from its shards' sums {docs}/{toks}")
        counted = [i["counts"] for i in entry.inputs if "counts" in i]
        if counted and len(counted) == len(entry.inputs):
            for key in ("read", "kept", "tokens"):
                total = sum(c[key] for c in counted)
                if total != entry.counts.get(key):
                    raise ManifestError(f"{where} {entry.name!r}: counts.{key} "
                                        f"{entry.counts.get(key)} differs from its inputs' sum "
                                        f"{total}; the manifest is inconsistent, rebuild it")
        return entry


def _shard_where(where: str, i: int, d: Any) -> str:
    """Name a shard by its path (what a user can find) where the entry has one."""
    path = d.get("path") if isinstance(d, Mapping) else None
    return f"{where}.shards[{i}] {path!r}" if isinstance(path, str) else f"{where}.shards[{i}]"


def _check_input(inp: Any, where: str) -> None:
    """An ``inputs[]`` entry: an object with a path; when it carries per-input accounting
    (builds since that was added), ``read = kept + sum(dropped)`` and confined shard paths."""
    if not isinstance(inp, dict):
        raise ManifestError(f"{where}: expected an object, got {inp!r}")
    _req(inp, "path", str, where)
    if "counts" not in inp:
        return
    c = _req(inp, "counts", dict, where)
    dropped = _req(c, "dropped", dict, f"{where}.counts")
    read, kept = _count(c, "read", f"{where}.counts"), _count(c, "kept", f"{where}.counts")
    _count(c, "tokens", f"{where}.counts")
    if read != kept + sum(dropped.values()):
        raise ManifestError(f"{where} {inp['path']!r}: read {read} != kept {kept} + dropped "
                            f"{sum(dropped.values())}; the manifest is inconsistent, rebuild it")
    error = inp.get("first_error")
    if error is not None:
        _req(error, "reason", str, f"{where}.first_error")
    for j, path in enumerate(_req(inp, "shards", list, where)):
        check_path(path, f"{where}.shards[{j}]")


@dataclass(frozen=True)
class BuiltManifest:
    """A whole built mix. ``definition`` is ``MixSpec.to_dict()`` (portable roots)."""

    name: str
    builder_version: str
    definition: dict
    tokenizer: dict
    sources: tuple[SourceEntry, ...]
    totals: dict
    fingerprint: str

    @property
    def seed(self) -> int:
        return int(self.definition["seed"])

    @property
    def window(self) -> int:
        return int(self.definition["window"])

    def source(self, name: str) -> SourceEntry:
        for s in self.sources:
            if s.name == name:
                return s
        raise ManifestError(f"built mix {self.name!r} has no source {name!r}; sources: "
                            f"{[s.name for s in self.sources]}")

    def shards(self) -> list[tuple[str, ShardEntry]]:
        """Every (source name, shard) in manifest order."""
        return [(s.name, sh) for s in self.sources for sh in s.shards]

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "name": self.name,
                "builder_version": self.builder_version, "definition": self.definition,
                "tokenizer": self.tokenizer, "sources": [s.to_dict() for s in self.sources],
                "totals": self.totals, "fingerprint": self.fingerprint}

    def to_json(self) -> str:
        """The manifest.json text: stable key order, indented, trailing newline."""
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=True, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "manifest") -> BuiltManifest:
        fmt, version = d.get("format"), d.get("version")
        if fmt == FORMAT and version == 1:
            raise ManifestError(f"{where}: a manifest of version 1, whose fingerprint covered "
                                f"the bytes its libraries wrote; rebuild the mix with this "
                                f"open1b (`open1b-data build-mix`): the same corpus gives the "
                                f"same documents and a content fingerprint (docs/FORMATS.md)")
        if fmt != FORMAT or version != VERSION:
            raise ManifestError(f"{where}: format/version {fmt!r}/{version!r}, expected "
                                f"{FORMAT!r}/{VERSION}; not a manifest this builder reads")
        tok = _req(d, "tokenizer", dict, where)
        check_path(_req(tok, "path", str, f"{where}.tokenizer"), f"{where}.tokenizer.path")
        _sha(tok, "sha256", f"{where}.tokenizer")
        _sha(tok, "content", f"{where}.tokenizer")
        _count(tok, "eot_id", f"{where}.tokenizer")    # the stream's separator
        for i, f in enumerate(tokenizer_files(tok)[1:]):
            check_path(_req(f, "path", str, f"{where}.tokenizer.directory.files[{i}]"),
                       f"{where}.tokenizer.directory.files[{i}].path")
            _sha(f, "sha256", f"{where}.tokenizer.directory.files[{i}]")
            _sha(f, "content", f"{where}.tokenizer.directory.files[{i}]")
        sources = tuple(SourceEntry.from_dict(s, f"{where}.sources[{i}]")
                        for i, s in enumerate(_req(d, "sources", list, where)))
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ManifestError(f"{where}.sources: duplicate source names {names}")
        m = cls(name=_req(d, "name", str, where),
                builder_version=_req(d, "builder_version", str, where),
                definition=_req(d, "definition", dict, where), tokenizer=tok, sources=sources,
                totals=_req(d, "totals", dict, where),
                fingerprint=_req(d, "fingerprint", str, where))
        if _count(m.definition, "seed", f"{where}.definition") >= 2**64:
            raise ManifestError(f"{where}.definition.seed: must be < 2^64, got "
                                f"{m.definition['seed']!r}; rebuild the mix")
        if _req(m.definition, "window", int, f"{where}.definition") < 1:
            raise ManifestError(f"{where}.definition.window: must be >= 1, got "
                                f"{m.definition['window']!r}; rebuild the mix")
        want = fingerprint(d)
        if m.fingerprint != want:
            raise ManifestError(f"{where}: fingerprint {m.fingerprint!r} does not match its "
                                f"content ({want}); the manifest was edited or corrupted")
        return m


def tokenizer_files(tokenizer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every tokenizer file a manifest names, ``{"path", "sha256", "content"}`` each:
    ``tokenizer.json`` first, then the transformers directory's files. ``content`` is the
    fingerprinted digest of what the file says (``tokenizerfile.py``), ``sha256`` the
    record of its bytes in this copy."""
    directory = tokenizer.get("directory") or {}
    files = directory.get("files", []) if isinstance(directory, Mapping) else []
    if not isinstance(files, list):
        raise ManifestError(f"tokenizer.directory.files: expected a list, got {files!r}")
    return [{"path": tokenizer.get("path"), "sha256": tokenizer.get("sha256"),
             "content": tokenizer.get("content")}, *files]


# ---------------------------------------------------------------------------------------
# Assembling (the build's merge step)

def _ratio(num: float, den: float) -> float:
    # Rounded so the manifest text does not carry float noise; exact sums live beside it.
    return round(num / den, 6) if den else 0.0


def make_source_entry(name: str, format: str, target_share: float | None,
                      shards: Iterable[ShardEntry | Mapping[str, Any]], counts: Mapping,
                      inputs: Iterable[Mapping[str, Any]], total_tokens: int) -> SourceEntry:
    """A ``SourceEntry`` whose documents/tokens/mean/share are derived from its shards."""
    entries = tuple(s if isinstance(s, ShardEntry) else ShardEntry.from_dict(s, name)
                    for s in shards)
    docs, toks = sum(s.documents for s in entries), sum(s.tokens for s in entries)
    return SourceEntry(name=name, format=format, documents=docs, tokens=toks,
                       mean_tokens_per_doc=_ratio(toks, docs), target_share=target_share,
                       token_share=_ratio(toks, total_tokens), shards=entries,
                       counts=dict(counts), inputs=tuple(dict(i) for i in inputs))


def assemble_manifest(name: str, builder_version: str, definition: dict, tokenizer: dict,
                      sources: Iterable[SourceEntry | Mapping[str, Any]]) -> BuiltManifest:
    """Build a fingerprinted ``BuiltManifest``. Each source is a ``SourceEntry`` or a dict
    ``{"spec": SourceSpec, "counts": ..., "shards": [shard dicts], "inputs": [...]}`` with an
    optional ``"target_share"`` (default: the spec's declared share)."""
    raw = list(sources)
    total = 0
    for s in raw:
        if isinstance(s, SourceEntry):
            total += s.tokens
        else:
            total += sum(int(sh.tokens if isinstance(sh, ShardEntry) else sh["tokens"])
                         for sh in s["shards"])
    entries = []
    for s in raw:
        if isinstance(s, SourceEntry):
            entries.append(make_source_entry(s.name, s.format, s.target_share, s.shards,
                                             s.counts, s.inputs, total))
        else:
            spec = s["spec"]
            entries.append(make_source_entry(spec.name, spec.format,
                                             s.get("target_share", spec.share), s["shards"],
                                             s["counts"], s["inputs"], total))
    docs = sum(e.documents for e in entries)
    totals = {"documents": docs, "tokens": total, "mean_tokens_per_doc": _ratio(total, docs)}
    m = BuiltManifest(name=name, builder_version=builder_version, definition=definition,
                      tokenizer=dict(tokenizer), sources=tuple(entries), totals=totals,
                      fingerprint="")
    d = m.to_dict()
    # Round-trip through JSON so the fingerprint is over exactly what load_manifest sees.
    d = json.loads(canonical_json(d))
    d["fingerprint"] = fingerprint(d)
    return BuiltManifest.from_dict(d)


# ---------------------------------------------------------------------------------------
# Reading, writing, verifying

def write_manifest(mix_url: str, manifest: BuiltManifest) -> str:
    """Write ``<mix>/manifest.json`` atomically; returns its URL."""
    d = manifest.to_dict()
    if fingerprint(d) != manifest.fingerprint:
        raise ManifestError(f"refusing to write manifest {manifest.name!r}: its fingerprint "
                            f"{manifest.fingerprint!r} does not match its content; build it "
                            f"with assemble_manifest")
    url = join(mix_root(mix_url), MANIFEST)
    atomic_write_bytes(url, manifest.to_json().encode("ascii"))
    return url


def _not_a_mix(root: str) -> str | None:
    """Why ``root`` is no built mix when it names something else (a file), else None."""
    if root.endswith(".toml"):
        return (f"{root} is a mix definition, not a built mix; build it with `open1b-data "
                f"build-mix --manifest {root} --out DIR` and pass DIR")
    if "://" not in root and os.path.isfile(root):
        return (f"{root} is a file, not a built mix; pass the directory build-mix wrote "
                f"(the one holding {MANIFEST})")
    return None


def read_manifest_bytes(mix_url: str) -> tuple[str, bytes]:
    """``(url, bytes)`` of ``<mix>/manifest.json``; ``ManifestError`` naming the path and
    what to pass when it is not a built mix, the storage's own error when it cannot be
    reached."""
    root = mix_root(mix_url)
    url = join(root, MANIFEST)
    try:
        return url, read_bytes(url)
    except (FileNotFoundError, NotADirectoryError):
        why = _not_a_mix(root) or (f"{url} does not exist; build the mix first (open1b-data "
                                   f"build-mix) or pass the directory that holds {MANIFEST}")
        raise ManifestError(why) from None
    except FileAccessError as e:
        raise ManifestError(_not_a_mix(root) or str(e)) from e


def parse_manifest(raw: bytes, url: str) -> BuiltManifest:
    """The checked manifest in ``raw`` (read from ``url``, which messages name)."""
    try:
        d = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{url} is not valid JSON ({e}); rebuild the mix") from None
    except RecursionError:
        raise ManifestError(
            f"{url} nests too deeply to be a manifest; rebuild the mix") from None
    if not isinstance(d, dict):
        raise ManifestError(f"{url}: expected a JSON object, got {type(d).__name__}; "
                            f"rebuild the mix")
    return BuiltManifest.from_dict(d, where=url)


def load_manifest(mix_url: str) -> BuiltManifest:
    """Read and check ``<mix>/manifest.json`` (``mix_url`` may also name the file)."""
    url, raw = read_manifest_bytes(mix_url)
    return parse_manifest(raw, url)
