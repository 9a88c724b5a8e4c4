"""The two records a source reader yields: a ``Document`` to tokenize, or a ``Dropped``.

Contract: readers never raise for bad data. Every record of an input becomes exactly one
``Document`` or one ``Dropped`` (an unreadable or truncated input ends with one ``Dropped``
that stands for the rest of the file), so ``read = kept + sum(dropped by reason)`` holds
per input and nothing is lost silently.

``row`` is the 0-based record index inside the input file: the line number of a JSON-lines
file (blank and malformed lines count), the row number of a Parquet file. Together with
``input`` (the path relative to the source root) it locates the record exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

# Drop reasons, grouped by who decides. Readers may only use these names, so the manifest's
# per-reason counts have a fixed vocabulary that tests and users can rely on.
FILTER_REASONS = ("empty", "edu_score_below_min", "license_not_allowed", "too_large")
BAD_INPUT_REASONS = (
    "malformed_json",       # a JSON-lines line that is not a JSON object (incl. blank lines)
    "invalid_utf8",         # bytes that are not UTF-8, or a lone surrogate escape in JSON
    "missing_field",        # a required field absent or null
    "wrong_type",           # a required field of the wrong type
    "truncated_zstd",       # a zstd stream that ends inside a frame
    "unreadable_file",      # cannot open/read/decode the container (I/O, corrupt parquet/zstd)
    "missing_blob",         # stack-v2: no content object for the blob_id
    "corrupt_blob",         # stack-v2: content object is not valid gzip
    "undecodable_content",  # stack-v2: content bytes do not decode with src_encoding
)
REASONS = FILTER_REASONS + BAD_INPUT_REASONS


@dataclass(frozen=True)
class Document:
    """A kept document: its text and where it came from.

    ``doc_id`` is the source-native id (DCLM ``WARC-Record-ID``, FineWeb-Edu ``id``,
    Stack v2 ``blob_id``, Proof-Pile-2 as documented in ``sources/proof_pile_2.py``).
    """

    text: str
    doc_id: str
    input: str
    row: int


@dataclass(frozen=True)
class Dropped:
    """A record (or the unreadable rest of an input) that was not kept, and why.

    ``row`` is None only when the problem has no record position (e.g. the file cannot be
    opened at all). ``detail`` is a human-readable explanation for the build log.
    """

    reason: str
    input: str
    row: int | None
    detail: str = ""

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"Dropped.reason {self.reason!r} is not a known reason; "
                             f"use one of {REASONS}")

    def location(self) -> str:
        return self.input if self.row is None else f"{self.input}:{self.row}"
