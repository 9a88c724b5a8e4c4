"""The mix's tokenizer files: written, identified by their content, and read only checked.

Contract (docs/FORMATS.md, "tokenizer.json" and "The tokenizer's identity"):

* ``save_tokenizer`` writes ``tokenizer.json`` compact and deterministic (identical inputs
  give byte-identical files), atomically; ``load_tokenizer`` reads one (path or URL) with
  ``encode_special_tokens = True``: document text is encoded as text, so a literal
  ``<|endoftext|>`` inside a document is not the separator. It checks nothing: it is for
  the build, which has just written or been handed the file.
* ``content_digest(name, raw)`` is a file's identity, what the mix fingerprint covers: for
  a ``tokenizer.json`` the SHA-256 (hex) of the canonical JSON of ``tokenizer_content``
  (the file's JSON without its ``version`` key, merges as ``[left, right]`` pairs - older
  ``tokenizers`` wrote ``"left right"`` - and special tokens in id order: the vocabulary,
  merges, special tokens, normalizer, pre-tokenizer, decoder and model options, not the
  JSON's spelling); for any other file (``tokenizer_config.json``,
  ``special_tokens_map.json``) the SHA-256 of the canonical JSON of what it parses to.
* ``verified_tokenizer_files(mix, manifest)`` reads every tokenizer file the manifest
  lists and returns their bytes only if each one's ``content_digest`` is the manifest's;
  ``load_mix_tokenizer(mix, manifest)`` is the ``tokenizers.Tokenizer`` of the verified
  ``tokenizer.json``. A file whose content differs is a ``TokenizerError`` naming it, what
  differs (against the other copy of ``tokenizer.json`` in the mix when that one is
  intact: the first differing vocabulary entry, merge, special token or component) and
  what to do.
  A file rewritten with other formatting (indentation, key order, escapes) is accepted:
  identity is content. Every reader that turns ids into text or text into ids goes through
  these two functions.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from open1b.canonical import canonical_json
from open1b_data.errors import BuildError, TokenizerError
from open1b_data.storage import atomic_write_bytes, read_bytes

TOKENIZER_JSON = "tokenizer.json"


def save_tokenizer(tok: Any, path_or_url: str) -> None:
    """Write ``tokenizer.json`` (compact JSON, deterministic) atomically."""
    atomic_write_bytes(str(path_or_url), tok.to_str(pretty=False).encode("utf-8"))


def tokenizer_from_bytes(raw: bytes, where: str) -> Any:
    """A ``tokenizers.Tokenizer`` from the bytes of a ``tokenizer.json`` (``where`` names it
    in errors); text is encoded as text (``encode_special_tokens``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises plain Exception on a malformed file
        raise BuildError(f"tokenizer file {where!r} cannot be loaded: {e}") from None
    tok.encode_special_tokens = True
    return tok


def load_tokenizer(path_or_url: str) -> Any:
    """Read a ``tokenizer.json`` (local path or URL) into a ``tokenizers.Tokenizer``."""
    try:
        raw = read_bytes(str(path_or_url))
    except FileNotFoundError:
        raise BuildError(f"tokenizer file {path_or_url!r} does not exist; build the mix "
                         f"(it trains the tokenizer) or pass the right path") from None
    return tokenizer_from_bytes(raw, str(path_or_url))


# ---------------------------------------------------------------------------------------
# Identity by content

def _parse(raw: bytes, where: str) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TokenizerError(f"{where}: not valid JSON ({e}); restore it from the published "
                             f"mix") from None


def tokenizer_content(obj: Mapping[str, Any], where: str = TOKENIZER_JSON) -> dict[str, Any]:
    """A parsed ``tokenizer.json`` in canonical form (module docstring)."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("model"), Mapping):
        raise TokenizerError(f"{where}: not a tokenizers file (no model object); restore it "
                             f"from the published mix")
    out = {k: v for k, v in obj.items() if k != "version"}
    model = dict(out["model"])
    merges = model.get("merges")
    if isinstance(merges, list):
        pairs = []
        for m in merges:
            if isinstance(m, str):
                parts = m.split(" ")
                if len(parts) != 2:
                    raise TokenizerError(f"{where}: merge {m!r} is not two tokens")
                m = parts
            pairs.append(list(m))
        model["merges"] = pairs
    out["model"] = model
    added = out.get("added_tokens")
    if isinstance(added, list):
        out["added_tokens"] = sorted(added, key=lambda t: (t.get("id", -1)
                                                           if isinstance(t, dict) else -1))
    return out


def _is_tokenizer(name: str) -> bool:
    return name.rsplit("/", 1)[-1] == TOKENIZER_JSON


def _canonical(name: str, obj: Any) -> Any:
    return tokenizer_content(obj, name) if _is_tokenizer(name) else obj


def content_digest(name: str, raw: bytes) -> str:
    """The content digest of tokenizer file ``name`` (its path in the mix) holding ``raw``."""
    return hashlib.sha256(canonical_json(_canonical(name, _parse(raw, name)))).hexdigest()


# ---------------------------------------------------------------------------------------
# Reading a mix's tokenizer, checked

def _first(a: Any, b: Any, label: str) -> str | None:
    """Where canonical objects ``a`` (the file read) and ``b`` (the intact copy) first
    differ, in words; None when equal."""
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if label == "vocabulary":
            for tok in sorted(set(a) | set(b)):
                if a.get(tok) != b.get(tok):
                    return f"vocabulary entry {tok!r}: id {a.get(tok)} (intact: {b.get(tok)})"
        for key in sorted(set(a) | set(b)):
            sub = {"vocab": "vocabulary", "merges": "merges"}.get(key, f"{label}.{key}")
            found = _first(a.get(key), b.get(key), sub)
            if found:
                return found
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                what = "merge" if label == "merges" else f"{label}[{i}]"
                return (f"{what} #{i}: {json.dumps(x)[:80]} (intact: {json.dumps(y)[:80]})"
                        if label == "merges" else _first(x, y, what))
        return f"{label}: {len(a)} entries (intact: {len(b)})"
    return f"{label}: {json.dumps(a)[:80]} (intact: {json.dumps(b)[:80]})"


def _difference(name: str, obj: Any, files: Mapping[str, tuple[bytes, str, str]]) -> str:
    """What differs in ``name``, against an intact copy of it when there is one."""
    for other, (raw, want, _) in files.items():
        if other == name or other.rsplit("/", 1)[-1] != name.rsplit("/", 1)[-1]:
            continue                            # only another copy of the same file
        if content_digest(other, raw) == want:
            found = _first(_canonical(name, obj), _canonical(other, _parse(raw, other)),
                           "tokenizer" if _is_tokenizer(name) else "settings")
            if found:
                return f"{found}; {other} is intact"
    if _is_tokenizer(name):
        return "its vocabulary, merges, special tokens or pre-tokenizer differ"
    return "its settings differ"


def verified_tokenizer_files(mix_url: str, manifest: Any = None) -> dict[str, bytes]:
    """Every tokenizer file the manifest lists, ``{path in the mix: bytes}``, each checked
    against the manifest's content digest (``TokenizerError`` otherwise, module docstring).
    ``manifest``: the mix's ``BuiltManifest`` when the caller has loaded it (it is then
    not read again), else ``load_manifest(mix_url)``."""
    from open1b_data.formats.manifest import load_manifest, tokenizer_files
    from open1b_data.formats.mixpath import mix_root, resolve

    root = mix_root(mix_url)
    m = load_manifest(root) if manifest is None else manifest
    files: dict[str, tuple[bytes, str, str]] = {}
    for f in tokenizer_files(m.tokenizer):
        url = resolve(root, f["path"])
        try:
            files[f["path"]] = (read_bytes(url), f["content"], url)
        except FileNotFoundError:
            raise TokenizerError(f"{url}: missing, but the manifest of mix {m.name!r} lists "
                                 f"it; restore it from the published mix") from None
    for name, (raw, want, url) in files.items():
        got = content_digest(name, raw)
        if got != want:
            why = _difference(name, _parse(raw, name), files)
            raise TokenizerError(
                f"{url}: not the tokenizer of mix {m.name!r} (fingerprint "
                f"{m.fingerprint[:16]}...): {why}; its content digest is {got[:16]}..., the "
                f"manifest's {want[:16]}.... The file was edited or replaced: restore it "
                f"from the published mix (`open1b-data verify` lists every changed file)")
    return {name: raw for name, (raw, _, _) in files.items()}


def load_mix_tokenizer(mix_url: str, manifest: Any = None) -> Any:
    """The mix's ``tokenizers.Tokenizer``, from its verified ``tokenizer.json``
    (``verified_tokenizer_files``; ``encode_special_tokens = True``)."""
    from open1b_data.formats.manifest import load_manifest

    m = load_manifest(mix_url) if manifest is None else manifest
    files = verified_tokenizer_files(mix_url, m)
    return tokenizer_from_bytes(files[m.tokenizer["path"]], m.tokenizer["path"])
