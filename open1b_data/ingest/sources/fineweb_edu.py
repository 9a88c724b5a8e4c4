"""FineWeb-Edu reader (``HuggingFaceFW/fineweb-edu``).

Upstream layout: ``data/CC-MAIN-*/*.parquet`` with columns ``text, id, dump, url,
file_path, language, language_score, token_count, score, int_score`` (``score`` is the
classifier's float, ``int_score = round(clamp(score, 0, 5))``).

Required per row: ``text`` (string), ``id`` (string, ``<urn:uuid:...>``; becomes
``doc_id``) and every field a filter of the mix reads (Mix 0626: ``int_score`` >= 3).
Only those columns are read, one row batch at a time (bounded memory).
"""
from __future__ import annotations

from collections.abc import Iterator

from open1b_data.ingest.document import Document, Dropped
from open1b_data.ingest.filters import metadata_fields
from open1b_data.formats.definition import SourceSpec
from open1b_data.ingest.sources.records import Field, iter_parquet_rows, text_document

FIELDS: list[Field] = [(("text",), (str,)), (("id",), (str,))]


def read(spec: SourceSpec, path: str, url: str) -> Iterator[Document | Dropped]:
    columns = ["text", "id", *metadata_fields(spec.filters)]
    for item in iter_parquet_rows(url, path, columns):
        if isinstance(item, Dropped):
            yield item
        else:
            row, rec = item
            yield text_document(spec.filters, rec, FIELDS, path, row)
