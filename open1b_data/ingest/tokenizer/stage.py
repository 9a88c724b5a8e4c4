"""The build's tokenizer stage: the tokenizer a build encodes with, trained or taken, and
pinned by its content.

Contract (docs/FORMATS.md, "The tokenizer's identity"):

* ``ensure_tokenizer(mix, out, inputs, options)`` leaves ``<out>/tokenizer.json`` and its
  record ``<out>/_work/tokenizer-sample.json`` (written first) in place and returns the
  file's sha256 (the build's resume key). Without ``tokenizer_from`` it trains on the
  sample (``sample.py``, ``training.py``) unless the files are there already; with it, it
  takes the published tokenizer instead of training: a ``tokenizer.json`` (path or URL),
  or a built mix, whose tokenizer files are checked against its manifest first
  (``formats.tokenizerfile.verified_tokenizer_files``) and whose sample record is kept.
  A taken tokenizer must be one this definition could have trained: byte-level BPE of
  ``vocab_size`` entries whose only special token is the separator, with the definition's
  pre-tokenizer (Split on ``split_pattern``, then ByteLevel) - else ``BuildError``
  naming what differs.
* The expected content: the definition's ``[tokenizer] expect`` and the build's
  ``--expect-tokenizer`` (both when both are given: they must agree) name the content
  digest the tokenizer must have. Another one is a ``BuildError`` naming the ``tokenizers``
  version that trained it and both digests: BPE training belongs to that library, and a
  version that trains other merges gives another mix - caught here, before any shard is
  written, not by a fingerprint that fails to match after the build.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from open1b_data.errors import BuildError, Open1bDataError
from open1b_data.formats.definition import MixSpec
from open1b_data.formats.tokenizerfile import TOKENIZER_JSON, content_digest
from open1b_data.storage import exists, join, read_bytes, read_json, write_json

log = logging.getLogger("open1b_data.ingest.pipeline")

SAMPLE_RECORD = "_work/tokenizer-sample.json"
CONTENT_RECORD = "_work/tokenizer-content.json"   # {"sha256": file, "content": digest}


def tokenizers_version() -> str:
    import tokenizers

    return str(getattr(tokenizers, "__version__", "?"))


def expected_digest(mix: MixSpec, expect: str | None) -> str | None:
    """The content digest the build's tokenizer must have, if any (module docstring)."""
    defined = mix.tokenizer.expect
    if defined and expect and defined != expect:
        raise BuildError(f"--expect-tokenizer {expect} differs from the definition's "
                         f"[tokenizer] expect = {defined!r}; give one of them")
    return expect or defined


def ensure_tokenizer(mix: MixSpec, out: str, inputs: dict[str, list[Any]],
                     tokenizer_from: str | None = None, expect: str | None = None) -> str:
    """Train, or take, and check ``<out>/tokenizer.json``; returns its sha256."""
    want = expected_digest(mix, expect)
    path = join(out, TOKENIZER_JSON)
    trained_here = False
    if not (exists(path) and exists(join(out, SAMPLE_RECORD))):
        if tokenizer_from:
            raw, record = _taken(mix, tokenizer_from)
        else:
            raw, record = _trained(mix, inputs)
            trained_here = True
        _check_expected(raw, want, trained_here, tokenizer_from)
        # Sample record first: tokenizer.json present implies its record is too.
        write_json(join(out, SAMPLE_RECORD), record)
        from open1b_data.storage import atomic_write_bytes

        atomic_write_bytes(path, raw)
    raw = read_bytes(path)
    if tokenizer_from and not trained_here:
        _check_matches_source(mix, raw, tokenizer_from, path)
    sha = hashlib.sha256(raw).hexdigest()
    content = recorded_content(out, raw, sha)
    if want is not None and content != want:
        _check_expected(raw, want, False, None, where=path)
    return sha


def recorded_content(out: str, raw: bytes, sha: str) -> str:
    """The content digest of ``<out>/tokenizer.json`` (bytes ``raw``, sha256 ``sha``),
    computed once per tokenizer and recorded in ``_work`` (~30 ms at vocabulary 8,192,
    ~0.5 s at 128,256: a build's merge, and every rerun, reuse it); a record of another
    file is recomputed."""
    rec_url = join(out, CONTENT_RECORD)
    if exists(rec_url):
        try:
            rec = read_json(rec_url)
        except (ValueError, OSError):
            rec = {}
        if isinstance(rec, dict) and rec.get("sha256") == sha and isinstance(
                rec.get("content"), str):
            return rec["content"]
    content = content_digest(TOKENIZER_JSON, raw)
    write_json(rec_url, {"sha256": sha, "content": content})
    return content


def _trained(mix: MixSpec, inputs: dict[str, list[Any]]) -> tuple[bytes, dict]:
    from open1b_data.ingest import tokenizer as tk

    t0 = time.perf_counter()
    sample = tk.select_sample(mix, inputs)
    texts = sample.texts() if hasattr(sample, "texts") else sample.iter_texts()
    tok = tk.train_tokenizer(mix.tokenizer, texts)
    log.info("trained tokenizer (vocab %d, tokenizers %s) in %.1f s", tok.get_vocab_size(),
             tokenizers_version(), time.perf_counter() - t0)
    record = sample.to_dict() if hasattr(sample, "to_dict") else dict(sample.record)
    return tok.to_str(pretty=False).encode("utf-8"), record


def _taken(mix: MixSpec, source: str) -> tuple[bytes, dict]:
    """The tokenizer.json bytes of ``source`` (a file, or a built mix) and the record."""
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.formats.tokenizerfile import verified_tokenizer_files

    if source.endswith(".json"):
        try:
            raw = read_bytes(source)
        except FileNotFoundError:
            raise BuildError(f"--tokenizer {source}: no such file; pass a tokenizer.json or "
                             f"a built mix") from None
        record: dict[str, Any] = {"taken": "a tokenizer.json given to build-mix --tokenizer "
                                           "(not trained)"}
    else:
        try:
            m = load_manifest(source)
            raw = verified_tokenizer_files(source, m)[m.tokenizer["path"]]
        except Open1bDataError as e:
            raise BuildError(f"--tokenizer {source}: {e}") from None
        record = dict(m.tokenizer.get("sample") or {})
    _check_fits(mix, raw, source)
    return raw, record


def _check_fits(mix: MixSpec, raw: bytes, source: str) -> None:
    """A taken tokenizer is one this definition could have trained (module docstring)."""
    from open1b_data.formats.tokenizerfile import tokenizer_content
    from open1b_data.ingest.tokenizer.training import _pre_tokenizer

    try:
        obj = tokenizer_content(json.loads(raw), source)
    except (ValueError, Open1bDataError) as e:
        raise BuildError(f"--tokenizer {source}: not a tokenizers file ({e})") from None
    spec = mix.tokenizer
    model = obj.get("model") or {}
    specials = [t.get("content") for t in obj.get("added_tokens") or []]
    vocab = len(model.get("vocab") or {})
    from tokenizers import Tokenizer, models

    ours = Tokenizer(models.BPE())
    ours.pre_tokenizer = _pre_tokenizer(spec.split_pattern)
    pre = json.loads(ours.to_str())
    problems = []
    if model.get("type") != "BPE":
        problems.append(f"model {model.get('type')!r}, not BPE")
    if vocab != spec.vocab_size:
        problems.append(f"{vocab:,} vocabulary entries, the definition's vocab_size is "
                        f"{spec.vocab_size:,}")
    if specials != [spec.eot]:
        problems.append(f"special tokens {specials}, the definition's is [{spec.eot!r}]")
    if obj.get("pre_tokenizer") != pre["pre_tokenizer"]:
        problems.append("its pre-tokenizer is not the definition's (Split on split_pattern, "
                        "then ByteLevel)")
    if problems:
        raise BuildError(f"--tokenizer {source}: not a tokenizer of mix {mix.name!r}: "
                         f"{'; '.join(problems)}")


def _check_matches_source(mix: MixSpec, raw: bytes, source: str, path: str) -> None:
    """A rerun with ``--tokenizer`` finds a tokenizer in ``out``: it must be that one."""
    taken, _ = _taken(mix, source)
    if content_digest(TOKENIZER_JSON, taken) != content_digest(TOKENIZER_JSON, raw):
        raise BuildError(f"{path} is not the tokenizer of --tokenizer {source}; this output "
                         f"holds a build with another tokenizer - pass another --out")


def _check_expected(raw: bytes, want: str | None, trained: bool, source: str | None,
                    where: str | None = None) -> None:
    if want is None:
        return
    got = content_digest(TOKENIZER_JSON, raw)
    if got == want:
        return
    if trained:
        raise BuildError(
            f"the tokenizer trained here by tokenizers {tokenizers_version()} has content "
            f"digest {got}, the definition expects {want}: this tokenizers version trains "
            f"other merges than the published tokenizer, so the build would make another "
            f"mix. Install a version measured to train the same merges (docs/FORMATS.md, "
            f"\"The tokenizer's identity\"), or pass --tokenizer with the published "
            f"tokenizer.json (or mix) to take it instead of training")
    what = f"--tokenizer {source}" if source else where
    raise BuildError(f"{what}: the tokenizer has content digest {got}, the definition "
                     f"expects {want}; it is not the published tokenizer of this mix")


def read_sample_record(out: str) -> dict:
    return read_json(join(out, SAMPLE_RECORD))
