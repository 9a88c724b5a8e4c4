"""The three ingest filters of Mix 0626, each a pure predicate that
returns ``None`` to keep a record or the reason it is dropped.

1. FineWeb-Edu educational score: drop when ``record[score_field] < min_score``
   (Mix 0626: ``int_score >= 3`` is kept) -> ``"edu_score_below_min"``.
2. The Stack v2 license and size, both decided from the metadata row *before* the content
   is fetched: drop when ``record[license_field]`` is not in ``license_allowed``
   (Mix 0626: only ``"permissive"``; upstream's other value is ``"no_license"``) ->
   ``"license_not_allowed"``; drop when ``record[size_field] > max_bytes`` (Mix 0626:
   ``length_bytes <= 1,000,000`` is kept) -> ``"too_large"``.
3. Empty documents, every source: a text is **empty** when ``text.strip() == ""``, i.e. it
   is the empty string or every character in it is whitespace by Python's ``str.isspace``
   (Unicode White_Space plus the ASCII separators U+001C-U+001F: space, tab, newlines,
   U+00A0 NO-BREAK SPACE, U+2000-U+200A, U+2028/2029, U+3000, ...). Characters that are
   not whitespace by that definition (e.g. U+200B ZERO WIDTH SPACE, U+FEFF BOM) make a
   text non-empty -> ``"empty"``.

Order (fixed, so per-reason counts are deterministic): metadata filters first in the order
score, license, size; then the empty filter on the text. A record is counted under the
first reason that drops it. Readers validate presence and type of every field a filter
reads (``metadata_fields``) and count a bad field as ``missing_field`` / ``wrong_type``
before any filter sees it, so the predicates here receive well-typed values.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from open1b_data.formats.definition import FilterSpec

NUMBER = (int, float)


def empty(text: str) -> str | None:
    """``"empty"`` when the text has no non-whitespace character (module docstring)."""
    return "empty" if not text or text.isspace() else None


def edu_score(score: float, min_score: float) -> str | None:
    """``"edu_score_below_min"`` unless ``score >= min_score`` (``min_score`` itself is kept;
    a NaN score is not ``>=`` anything, so it is dropped rather than slipping through)."""
    return None if score >= min_score else "edu_score_below_min"


def license_allowed(license_value: str, allowed: tuple[str, ...]) -> str | None:
    """``"license_not_allowed"`` unless the value is exactly one of ``allowed``."""
    return None if license_value in allowed else "license_not_allowed"


def size(length_bytes: int, max_bytes: int) -> str | None:
    """``"too_large"`` when ``length_bytes > max_bytes`` (``max_bytes`` itself is kept)."""
    return "too_large" if length_bytes > max_bytes else None


def metadata_fields(spec: FilterSpec) -> dict[str, tuple[type, ...]]:
    """The record fields the metadata filters of ``spec`` read, with their accepted types
    (booleans are never accepted as numbers)."""
    fields: dict[str, tuple[type, ...]] = {}
    if spec.score_field is not None:
        fields[spec.score_field] = NUMBER
    if spec.license_field is not None:
        fields[spec.license_field] = (str,)
    if spec.size_field is not None:
        fields[spec.size_field] = (int,)
    return fields


def metadata_filters(spec: FilterSpec, record: Mapping[str, Any]) -> str | None:
    """First reason among the score, license and size filters that drops ``record``."""
    if spec.score_field is not None and spec.min_score is not None:
        if reason := edu_score(record[spec.score_field], spec.min_score):
            return reason
    if spec.license_field is not None:
        if reason := license_allowed(record[spec.license_field], spec.license_allowed):
            return reason
    if spec.size_field is not None and spec.max_bytes is not None:
        if reason := size(record[spec.size_field], spec.max_bytes):
            return reason
    return None


def content_filters(spec: FilterSpec, text: str) -> str | None:
    """Filters that need the document text (today only ``drop_empty``)."""
    if spec.drop_empty:
        return empty(text)
    return None
