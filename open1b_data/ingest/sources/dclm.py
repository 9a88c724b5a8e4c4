"""DCLM-Baseline reader (``mlfoundations/dclm-baseline-1.0``).

Upstream layout: ``global-shard_XX_of_10/local-shard_Y_of_10/shard_*_processed.jsonl.zstd``
- zstd-compressed JSON lines (the ``.zstd`` suffix is handled by ``storage``, fsspec only
infers ``.zst``). One object per line with ``text``, ``url``, ``warcinfo``, ``metadata``
(the WARC headers of the record, including ``WARC-Record-ID``) and quality scores such as
``fasttext_openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train_prob``; there is no ``id``.

Required per line: ``text`` (string) and ``metadata.WARC-Record-ID`` (string, e.g.
``<urn:uuid:...>``), which becomes ``doc_id``. Other fields are not read. DCLM has no
metadata filter in Mix 0626; only the empty filter applies (and any filter a mix states).
"""
from __future__ import annotations

from collections.abc import Iterator

from open1b_data.ingest.document import Document, Dropped
from open1b_data.formats.definition import SourceSpec
from open1b_data.ingest.sources.records import Field, iter_json_lines, text_document

FIELDS: list[Field] = [(("text",), (str,)), (("metadata", "WARC-Record-ID"), (str,))]


def read(spec: SourceSpec, path: str, url: str) -> Iterator[Document | Dropped]:
    for row, parsed in iter_json_lines(url, path):
        if isinstance(parsed, Dropped):
            yield parsed
        else:
            obj, surrogates = parsed
            yield text_document(spec.filters, obj, FIELDS, path, row, surrogates)
