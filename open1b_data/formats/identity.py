"""The identity of a built mix is its content: the mix fingerprint.

Contract (docs/FORMATS.md, "The mix fingerprint"): ``fingerprint(d)`` is the SHA-256 (hex)
of the canonical JSON (``open1b.canonical``) of ``content_view(d)``, the manifest object
``d`` without what only records how and where this copy was stored. Removed:

* ``fingerprint`` itself and ``builder_version`` (a library version);
* in the embedded definition, where a builder keeps the sources (``sources[].root``,
  ``sources[].content_store``: a source is named by ``upstream`` and its ``inputs``
  patterns, relative to the root), how shard files are written (``shards.zstd_level``,
  ``shards.docs_per_row_group``: compression and row groups) and ``tokenizer.expect`` (a
  check of the content the fingerprint holds anyway);
* in ``tokenizer``, the file records (``path``, ``sha256``, ``directory.path``, each
  directory file's ``sha256``) and the training ``sample`` record; what stays is each
  file's content digest (``formats/tokenizerfile.py``: vocabulary, merges, special tokens,
  pre-tokenizer - not the JSON's spelling), ``vocab_size`` and ``eot_id``;
* in each shard entry, the file records: ``path``, ``sha256``, ``bytes``, ``lengths.path``,
  ``merkle.path``, ``merkle.sha256``. What stays is its content: document and token
  counts, the Merkle root over its documents' tokens and provenance (``merkle.py``), the
  digest of its document lengths (``lengths.content``) and its held-out rows;
* in each input entry, the file's ``size`` and checksum (``sha256`` or an object store's
  ``etag``: a copy of a file elsewhere has another), the shard files it wrote and the
  library's wording of its first bad record (``first_error.detail``); its path relative
  to the source root, its counts by reason and where its first bad record is stay.

Everything else - anything a later version adds included - is content. So neither a
library version, a writer string, a compression setting, a file name nor a local path
enters the fingerprint, and every value the stream reads does. Whatever reads a mix checks
its files against what the fingerprint covers (the roots, the lengths digests, the
tokenizer digests), never against the file records.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from open1b.canonical import canonical_json

# (where, keys): the storage records ``content_view`` removes (module docstring)
DEFINITION_SOURCE_KEYS = ("root", "content_store")
DEFINITION_SHARDS_KEYS = ("docs_per_row_group", "zstd_level")
DEFINITION_TOKENIZER_KEYS = ("expect",)
TOKENIZER_KEYS = ("path", "sha256", "sample")
TOKENIZER_FILE_KEYS = ("sha256",)
SHARD_KEYS = ("path", "sha256", "bytes")
SHARD_FILE_KEYS = ("path", "sha256")          # in ``lengths`` and ``merkle``
INPUT_KEYS = ("size", "sha256", "etag", "shards")


def _without(d: Any, keys: tuple[str, ...]) -> Any:
    """``d`` less ``keys`` (a new dict; values shared), or ``d`` itself if not a dict."""
    return {k: v for k, v in d.items() if k not in keys} if isinstance(d, dict) else d


def _each(d: dict, key: str, edit) -> None:
    """Replace list ``d[key]`` (when it is one) by a new list of ``edit(item)``."""
    if isinstance(d.get(key), list):
        d[key] = [edit(x) for x in d[key]]


def _sub(d: Any, key: str, keys: tuple[str, ...]) -> Any:
    """``d`` with its dict ``d[key]`` less ``keys``."""
    if isinstance(d, dict) and isinstance(d.get(key), dict):
        d = dict(d)
        d[key] = _without(d[key], keys)
    return d


def definition_content(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The embedded definition without where sources are kept and how files are written."""
    d = dict(definition)
    _each(d, "sources", lambda src: _without(src, DEFINITION_SOURCE_KEYS))
    d = _sub(d, "shards", DEFINITION_SHARDS_KEYS)
    return _sub(d, "tokenizer", DEFINITION_TOKENIZER_KEYS)


def _tokenizer(tok: Any) -> Any:
    tok = _without(tok, TOKENIZER_KEYS)
    if isinstance(tok, dict) and isinstance(tok.get("directory"), dict):
        directory = _without(tok["directory"], ("path",))
        _each(directory, "files", lambda f: _without(f, TOKENIZER_FILE_KEYS))
        tok["directory"] = directory
    return tok


def _shard(sh: Any) -> Any:
    sh = _without(sh, SHARD_KEYS)
    return _sub(_sub(sh, "lengths", SHARD_FILE_KEYS), "merkle", SHARD_FILE_KEYS)


def _source(src: Any) -> Any:
    if not isinstance(src, dict):
        return src
    src = dict(src)
    _each(src, "shards", _shard)
    _each(src, "inputs", lambda i: _sub(_without(i, INPUT_KEYS), "first_error", ("detail",)))
    return src


def content_view(manifest_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's content: ``manifest_dict`` less its storage records (docstring).
    Nothing is copied that is not changed: held-out row lists are shared, not copied."""
    d = {k: v for k, v in manifest_dict.items() if k not in ("fingerprint", "builder_version")}
    if isinstance(d.get("definition"), Mapping):
        d["definition"] = definition_content(d["definition"])
    if "tokenizer" in d:
        d["tokenizer"] = _tokenizer(d["tokenizer"])
    _each(d, "sources", _source)
    return d


def fingerprint(manifest_dict: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical JSON of the manifest's content (``content_view``)."""
    return hashlib.sha256(canonical_json(content_view(manifest_dict))).hexdigest()
