"""Proof-Pile-2 reader (``EleutherAI/proof-pile-2``).

Upstream layout: ``{arxiv,open-web-math,algebraic-stack}/{train,validation,test}/*.jsonl.zst``
- zstd-compressed JSON lines, one ``{"text": str, "meta": {...}}`` per line; ``meta``
differs per subset (arXiv: ``arxiv_id``, ``yymm``, ``url``, ...; OpenWebMath: ``url``,
``date``, ...; AlgebraicStack: repository/path fields, ...). Some dumps store ``meta`` as a
JSON-encoded string; it is decoded when it is.

Required per line: ``text`` (string). ``doc_id`` rule (stable, documented in FORMATS.md):
the first of ``meta.arxiv_id``, ``meta.url``, ``meta.id`` that is a non-empty string or an
integer, prefixed by the subset (the first path component of the input, e.g.
``arxiv:2105.01234``); otherwise ``"<input>:<row>"``. ``meta`` is provenance only, so a
missing or odd ``meta`` is not a drop reason - it just falls back to the positional id.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from open1b_data.ingest.document import Document, Dropped
from open1b_data.formats.definition import SourceSpec
from open1b_data.ingest.sources.records import (
    apply_metadata_filters, finish, get_field, iter_json_lines,
)

ID_KEYS = ("arxiv_id", "url", "id")


def doc_id_of(meta: Any, path: str, row: int) -> str:
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            meta = None
    if isinstance(meta, dict):
        for key in ID_KEYS:
            v = meta.get(key)
            if isinstance(v, str) and v or isinstance(v, int) and not isinstance(v, bool):
                return f"{path.split('/', 1)[0]}:{v}"
    return f"{path}:{row}"


def read(spec: SourceSpec, path: str, url: str) -> Iterator[Document | Dropped]:
    for row, parsed in iter_json_lines(url, path):
        if isinstance(parsed, Dropped):
            yield parsed
            continue
        obj, surrogates = parsed
        text = get_field(obj, ("text",), (str,), path, row)
        if isinstance(text, Dropped):
            yield text
            continue
        yield (apply_metadata_filters(spec.filters, obj, path, row)
               or finish(spec.filters, text, doc_id_of(obj.get("meta"), path, row), path,
                         row, surrogates))
