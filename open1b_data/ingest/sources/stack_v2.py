"""The Stack v2 reader (``bigcode/the-stack-v2``): Parquet metadata + a content store.

Upstream layout: Parquet files of metadata rows (``blob_id, directory_id, path,
content_id, detected_licenses, license_type, repo_name, snapshot_id, revision_id,
branch_name, visit_date, revision_date, committer_date, github_id, star_events_count,
fork_events_count, gha_license_id, gha_event_created_at, gha_created_at, gha_language,
src_encoding, language, is_vendor, is_generated, length_bytes, extension``). File contents
are not in the dataset: each is a gzip object in the Software Heritage bucket at
``s3://softwareheritage/content/{blob_id}``, decoded with the row's ``src_encoding``.
``SourceSpec.content_store`` is that URL template (any fsspec URL or local path).

Required per row: ``blob_id`` (40 lowercase hex digits; becomes ``doc_id`` and the only
thing substituted into the store URL, so a row cannot address anything outside the store),
``src_encoding`` (string) and every field a filter reads (Mix 0626: ``license_type``,
``length_bytes``). The license and size filters run on the metadata row **before** the
content is fetched, so dropped files cost no download. Contents of the kept rows of each
row batch are fetched together (``fs.cat`` on a list, concurrent on async stores such as
s3fs), then emitted in row order. Per-blob problems: absent object -> ``missing_blob``;
not gzip or cut short -> ``corrupt_blob``; unknown encoding name or bytes that do not
decode strictly -> ``undecodable_content``.
"""
from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Any

from open1b_data import storage
from open1b_data.ingest.document import Document, Dropped
from open1b_data.ingest.filters import metadata_fields
from open1b_data.formats.definition import SourceSpec
from open1b_data.errors import FileAccessError
from open1b_data.storage_errors import translate
from open1b_data.ingest.sources.records import (
    Field, apply_metadata_filters, finish, get_fields, iter_parquet_rows,
)

FIELDS: list[Field] = [(("blob_id",), (str,)), (("src_encoding",), (str,))]
BLOB_ID = re.compile(r"[0-9a-f]{40}")
BATCH = 64  # rows whose kept blobs are fetched together: bounds memory (<= 64 x 1 MB gz)


def blob_url(template: str, blob_id: str) -> str:
    return template.replace("{blob_id}", blob_id)


def decode_blob(data: bytes, encoding: str) -> str | tuple[str, str]:
    """The text of one gzip content object, or ``(reason, detail)``."""
    try:
        raw = storage.gunzip(data)
    except (storage.CorruptInputError, storage.TruncatedInputError) as e:
        return "corrupt_blob", str(e)
    try:
        codecs.lookup(encoding)
    except LookupError:
        return "undecodable_content", f"unknown src_encoding {encoding!r}"
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        return "undecodable_content", f"not valid {encoding} at byte {e.start}: {e.reason}"


def _fetch(template: str, blob_ids: list[str]) -> dict[str, Any]:
    """blob_id -> gzip bytes or the exception fetching it raised."""
    if not blob_ids:
        return {}
    fs, _ = storage.url_to_fs(blob_url(template, blob_ids[0]))
    paths = {storage.url_to_fs(blob_url(template, b))[1]: b for b in blob_ids}
    got = fs.cat(list(paths), on_error="return")
    if not isinstance(got, dict):  # a single path returns bytes, not a dict
        got = {next(iter(paths)): got}
    return {paths[p]: v for p, v in got.items() if p in paths} | {
        b: FileNotFoundError(p) for p, b in paths.items() if p not in got}


def _emit(spec: SourceSpec, path: str, pending: list[Any]) -> Iterator[Document | Dropped]:
    wanted = [item[2] for item in pending if isinstance(item, tuple)]
    blobs = _fetch(spec.content_store or "", list(dict.fromkeys(wanted)))
    for item in pending:
        if not isinstance(item, tuple):
            yield item
            continue
        row, url, blob_id, encoding = item
        data = blobs.get(blob_id)
        # Details name the blob, not its URL: they go into the manifest, which must not
        # depend on where the content store is mounted.
        if isinstance(data, FileNotFoundError) or data is None:
            yield Dropped("missing_blob", path, row, f"blob {blob_id}: no content object")
            continue
        if isinstance(data, BaseException):
            outage = translate(data, url, "read")
            if outage is not None and not isinstance(outage, FileAccessError):
                raise outage from data  # no credentials / no network: not a missing blob
            message = str(data).replace(url, f"<blob {blob_id}>")
            yield Dropped("missing_blob", path, row, f"blob {blob_id}: cannot fetch: "
                          f"{type(data).__name__}: {message}")
            continue
        text = decode_blob(data, encoding)
        if isinstance(text, tuple):
            yield Dropped(text[0], path, row, f"blob {blob_id}: {text[1]}")
            continue
        yield finish(spec.filters, text, blob_id, path, row)


def read(spec: SourceSpec, path: str, url: str) -> Iterator[Document | Dropped]:
    columns = ["blob_id", "src_encoding", *metadata_fields(spec.filters)]
    template = spec.content_store or ""
    pending: list[Any] = []  # Dropped, or (row, url, blob_id, encoding) to fetch
    for item in iter_parquet_rows(url, path, columns, batch_size=1024):
        if isinstance(item, Dropped):
            pending.append(item)
        else:
            row, rec = item
            values = get_fields(rec, FIELDS, path, row)
            if isinstance(values, Dropped):
                pending.append(values)
            elif not BLOB_ID.fullmatch(values[0]):
                pending.append(Dropped("wrong_type", path, row, f"field 'blob_id': expected "
                                       f"40 lowercase hex digits, got {values[0][:60]!r}"))
            else:
                dropped = apply_metadata_filters(spec.filters, rec, path, row)
                pending.append(dropped or (row, blob_url(template, values[0]), *values))
        if len(pending) >= BATCH:
            yield from _emit(spec, path, pending)
            pending = []
    yield from _emit(spec, path, pending)
