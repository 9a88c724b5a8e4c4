"""The held-out rule: which documents of a source the stream never trains on.

Contract (STREAM.md section 10 restates it for re-implementers): a source's held-out
``fraction`` is a decimal string in the mix definition, read as the exact rational
``num/den`` it spells (``"0.001"`` is 1/1000, never a binary float). Document ``d`` with
provenance id ``doc_id`` (the shard's ``doc_id`` column, UTF-8) is held out iff

    int(SHA-256(doc_id), big-endian) * den < num * 2^256

so a document's fate depends on its id alone - not on its shard, its row, the seed or the
other documents - and a larger fraction holds out a superset. The build records, per shard,
the rows this rule holds out (``manifest.json`` shard entry ``heldout``); the stream reads
that list, and ``open1b-data verify`` re-derives it from the ``doc_id`` column.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from fractions import Fraction

from open1b_data.errors import MixSpecError

_DECIMAL = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]+)?")
_SPAN = 1 << 256


def parse_fraction(text: object, where: str) -> Fraction:
    """A held-out fraction as written: a plain decimal string in [0, 1) (``"0.001"``)."""
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        raise MixSpecError(f"{where}: must be a decimal string such as \"0.001\" (read "
                           f"exactly, never as a float), got {text!r}")
    value = Fraction(text)
    if not 0 <= value < 1:
        raise MixSpecError(f"{where}: must be in [0, 1) (a fraction of the source's "
                           f"documents; 1 would leave nothing to train on), got {text!r}")
    return value


def is_heldout(doc_id: str, fraction: Fraction) -> bool:
    """The rule of the module docstring for one document."""
    h = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest(), "big")
    return h * fraction.denominator < fraction.numerator * _SPAN


def heldout_rows(doc_ids: Iterable[str], fraction: Fraction) -> list[int]:
    """The rows (0-based, ascending) of ``doc_ids`` that the rule holds out."""
    num, den = fraction.numerator * _SPAN, fraction.denominator
    sha = hashlib.sha256
    return [i for i, d in enumerate(doc_ids)
            if int.from_bytes(sha(d.encode("utf-8")).digest(), "big") * den < num]


def fractions_of(definition: dict) -> dict[str, Fraction | None]:
    """Each source's held-out fraction from a built manifest's embedded ``definition``
    (``MixSpec.heldout_fraction`` on the dict form): the source's own ``heldout``, else the
    mix's ``heldout.fraction``, else None."""
    top = definition.get("heldout")
    default = None if not isinstance(top, dict) else top.get("fraction")
    out: dict[str, Fraction | None] = {}
    for i, src in enumerate(definition.get("sources") or []):
        text = src.get("heldout", default)
        out[src.get("name")] = None if text is None else parse_fraction(
            text, f"definition.sources[{i}].heldout")
    return out
