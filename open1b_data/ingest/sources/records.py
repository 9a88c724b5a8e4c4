"""Record-level helpers shared by the readers: JSON-lines parsing, Parquet row batches,
field validation and the filter calls.

Every helper turns a bad record into a ``Dropped`` carrying the input path, the row and a
detail that names the field or byte position, instead of raising; readers stay short
and the reasons stay uniform across formats.
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from open1b_data import storage
from open1b_data.storage_errors import failures
from open1b_data.ingest.document import Document, Dropped
from open1b_data.ingest.filters import content_filters, metadata_fields, metadata_filters
from open1b_data.formats.definition import FilterSpec

# A JSON escape of a UTF-16 surrogate. json.loads joins valid pairs into one character but
# keeps a lone surrogate as an unencodable str, which Parquet and the tokenizer reject.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

Field = tuple[tuple[str, ...], tuple[type, ...]]  # (path into nested dicts, accepted types)


def _type_names(kinds: tuple[type, ...]) -> str:
    return "/".join(k.__name__ for k in kinds)


def get_field(record: Mapping[str, Any], path: tuple[str, ...], kinds: tuple[type, ...],
              input: str, row: int) -> Any:
    """The value at ``path`` if present, not null and of an accepted type (``bool`` is
    never a number); else the ``Dropped`` that says which field is wrong."""
    value: Any = record
    for i, key in enumerate(path):
        if type(value) is not dict and not isinstance(value, Mapping):  # fast path: dict
            where = ".".join(path[:i])
            return Dropped("wrong_type", input, row,
                           f"field {where!r}: expected an object, got {type(value).__name__}")
        if key not in value or value[key] is None:
            return Dropped("missing_field", input, row,
                           f"field {'.'.join(path)!r} is missing or null")
        value = value[key]
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        return Dropped("wrong_type", input, row,
                       f"field {'.'.join(path)!r}: expected {_type_names(kinds)}, got "
                       f"{type(value).__name__} {str(value)[:40]!r}")
    return value


def get_fields(record: Mapping[str, Any], fields: Sequence[Field], input: str,
               row: int) -> list[Any] | Dropped:
    """``get_field`` for each of ``fields`` in order; the first problem wins."""
    values = []
    for path, kinds in fields:
        v = get_field(record, path, kinds, input, row)
        if isinstance(v, Dropped):
            return v
        values.append(v)
    return values


@functools.lru_cache(maxsize=64)
def filter_fields(spec: FilterSpec) -> tuple[Field, ...]:
    """The fields the metadata filters read, as top-level ``Field`` entries (computed once
    per filter spec: readers ask for every record)."""
    return tuple(((name,), kinds) for name, kinds in metadata_fields(spec).items())


def apply_metadata_filters(spec: FilterSpec, record: Mapping[str, Any], input: str,
                           row: int) -> Dropped | None:
    """Validate the filter fields of ``record`` then run the metadata filters."""
    fields = filter_fields(spec)
    if fields:
        values = get_fields(record, fields, input, row)
        if isinstance(values, Dropped):
            return values
        reason = metadata_filters(spec, {p[0]: v for (p, _), v in zip(fields, values)})
        if reason:
            return Dropped(reason, input, row, _filter_detail(spec, record, reason))
    return None


def _filter_detail(spec: FilterSpec, record: Mapping[str, Any], reason: str) -> str:
    if reason == "edu_score_below_min":
        return f"{spec.score_field}={record[spec.score_field]!r} < {spec.min_score!r}"
    if reason == "license_not_allowed":
        return (f"{spec.license_field}={record[spec.license_field]!r} not in "
               f"{list(spec.license_allowed)}")
    if reason == "too_large":
        return f"{spec.size_field}={record[spec.size_field]!r} > {spec.max_bytes!r}"
    return ""


def finish(spec: FilterSpec, text: str, doc_id: str, input: str, row: int,
           check_surrogates: bool = False) -> Document | Dropped:
    """The content filter, then the ``Document``; optionally rejects lone surrogates."""
    if check_surrogates:
        for name, s in (("text", text), ("id", doc_id)):
            try:
                s.encode("utf-8")
            except UnicodeEncodeError as e:
                return Dropped("invalid_utf8", input, row,
                               f"{name}: lone surrogate U+{ord(s[e.start]):04X} at "
                               f"character {e.start}")
    reason = content_filters(spec, text)
    if reason:
        return Dropped(reason, input, row, "empty string" if not text else
                       f"only whitespace ({len(text)} characters)")
    return Document(text=text, doc_id=doc_id, input=input, row=row)


def text_document(spec: FilterSpec, record: Mapping[str, Any], fields: Sequence[Field],
                  input: str, row: int, check_surrogates: bool = False) -> Document | Dropped:
    """The record whose ``fields`` are (text, doc_id), through the metadata filters, the
    content filter and ``finish``: what a reader with no per-source twist yields."""
    values = get_fields(record, fields, input, row)
    if isinstance(values, Dropped):
        return values
    text, doc_id = values
    return (apply_metadata_filters(spec, record, input, row)
            or finish(spec, text, doc_id, input, row, check_surrogates))


def parse_json_line(line: bytes, input: str, row: int) -> tuple[dict, bool] | Dropped:
    """One JSON-lines line as ``(object, may_hold_surrogates)`` or the ``Dropped`` for it."""
    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return Dropped("invalid_utf8", input, row,
                       f"byte {e.start} of the line: {e.reason} ({line[e.start:e.start + 4]!r})")
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as e:
        what = "blank line" if not s.strip() else f"{e.msg} at column {e.colno}"
        return Dropped("malformed_json", input, row, what)
    except RecursionError:
        return Dropped("malformed_json", input, row, "nesting too deep")
    if not isinstance(obj, dict):
        return Dropped("malformed_json", input, row,
                       f"expected a JSON object, got {type(obj).__name__}")
    return obj, bool(_SURROGATE_ESCAPE.search(s))


def iter_json_lines(url: str, input: str) -> Iterator[tuple[int, tuple[dict, bool] | Dropped]]:
    """``(row, parsed-or-Dropped)`` for every line of a (possibly compressed) JSON-lines
    file. Storage errors (truncation, I/O) propagate to ``read_input``, which turns them
    into one final ``Dropped`` at the next row."""
    for row, line in enumerate(storage.iter_lines(url, follow=True)):
        yield row, parse_json_line(line, input, row)


class InvalidUtf8:
    """Stands in for a Parquet string value whose bytes are not UTF-8."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail


def _column_values(col: Any) -> list[Any]:
    import pyarrow as pa

    try:
        return col.to_pylist()
    except UnicodeDecodeError:
        # Parquet does not guarantee valid UTF-8 in string columns; decode value by value
        # so that one bad value drops one row, not the whole batch.
        binary = pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary()
        out: list[Any] = []
        for b in col.cast(binary).to_pylist():
            if b is None:
                out.append(None)
                continue
            try:
                out.append(b.decode("utf-8"))
            except UnicodeDecodeError as e:
                out.append(InvalidUtf8(f"byte {e.start}: {e.reason} "
                                       f"({b[e.start:e.start + 4]!r})"))
        return out


def iter_parquet_rows(url: str, input: str, columns: list[str],
                      batch_size: int = 1024) -> Iterator[tuple[int, dict[str, Any]] | Dropped]:
    """``(row, {column: value})`` for every row of a Parquet file, reading only ``columns``
    (those present; an absent column is simply absent from each row dict, so the reader
    counts ``missing_field``), one row group and row batch at a time (bounded memory).

    A row holding a non-UTF-8 string value becomes ``Dropped("invalid_utf8")``. A row group
    that cannot be read (corrupt page) drops each of its unread rows as
    ``unreadable_file`` and reading goes on with the next row group, whose offsets the
    footer gives. A file whose footer cannot be read raises to ``read_input``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with failures(url, "read"):
        handle = storage.open_file(url, follow=True)     # a corpus download may be links
    with handle as f:
        # Verify page CRCs where the writer stored them: without them a flipped byte in a
        # page can decode into plausible wrong text.
        pf = pq.ParquetFile(f, page_checksum_verification=True)
        present = [c for c in dict.fromkeys(columns) if c in pf.schema_arrow.names]
        row = 0
        for group in range(pf.num_row_groups):
            group_end = row + pf.metadata.row_group(group).num_rows
            if not present:  # nothing we need: still one record per row, each lacking fields
                for row in range(row, group_end):
                    yield row, {}
                row = group_end
                continue
            try:
                for batch in pf.iter_batches(batch_size=batch_size, row_groups=[group],
                                             columns=present):
                    cols = {name: _column_values(batch.column(name)) for name in present}
                    for i in range(batch.num_rows):
                        rec = {name: vals[i] for name, vals in cols.items()}
                        bad = next(((k, v) for k, v in rec.items()
                                    if isinstance(v, InvalidUtf8)), None)
                        if bad:
                            yield Dropped("invalid_utf8", input, row,
                                          f"column {bad[0]!r}: {bad[1].detail}")
                        else:
                            yield row, rec
                        row += 1
            except (OSError, pa.ArrowException) as e:
                detail = f"row group {group} unreadable: {type(e).__name__}: {e}"
                for row in range(row, group_end):
                    yield Dropped("unreadable_file", input, row, detail)
                row = group_end
