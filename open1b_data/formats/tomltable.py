"""One table of a mix definition as it is read: typed, range-checked getters and the check
that it holds no key the definition does not know.

Contract: ``TomlTable(data, where, keys)`` refuses any key of ``data`` outside ``keys``
(``MixSpecError`` naming ``where.key`` and the nearest valid key), because a TOML typo -
``[sources.filter]`` for ``[sources.filters]``, ``weigth =`` - would otherwise be ignored
and silently change the data. Every getter names the dotted field (``sources[1].share``)
and the offending value on error, and numeric getters name the valid range. Floats must
be finite; booleans are never numbers; an integer is accepted where a float is expected.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from open1b_data.errors import MixSpecError

REQUIRED: Any = object()  # default of a field that must be present


def _show(v: int | float) -> str:
    """Bounds as people write them: 2^64 rather than 18446744073709551616."""
    if isinstance(v, int) and v >= 1 << 16 and v & (v - 1) == 0:
        return f"2^{v.bit_length() - 1}"
    return f"{v:,}" if isinstance(v, int) and abs(v) >= 10_000 else repr(v)


@dataclass(frozen=True)
class Interval:
    """A valid range: ``[lo, hi)`` by default; ``hi=None`` means unbounded above."""

    lo: int | float
    hi: int | float | None = None
    lo_open: bool = False
    hi_open: bool = True

    def __contains__(self, v: int | float) -> bool:
        above = v > self.lo if self.lo_open else v >= self.lo
        below = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
        return above and below

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_show(self.lo)}"
        return (f"{'(' if self.lo_open else '['}{_show(self.lo)}, {_show(self.hi)}"
                f"{')' if self.hi_open else ']'}")


def unknown_keys(data: dict, where: str, keys: Iterable[str]) -> str | None:
    """The message naming every key of ``data`` outside ``keys`` (None when there is none)."""
    valid = sorted(keys)
    problems = []
    for key in sorted(k for k in data if k not in valid):
        value = data[key]
        table = isinstance(value, dict) or (isinstance(value, list) and value
                                            and all(isinstance(v, dict) for v in value))
        near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(valid)}"
        problems.append(f"{where + '.' if where else ''}{key}: unknown "
                        f"{'table' if table else 'key'}; {hint}")
    if not problems:
        return None
    return "; ".join(problems) + " (an unknown key would be ignored and change the mix)"


class TomlTable:
    """``data`` (one TOML table) read through named, checked getters."""

    def __init__(self, data: Any, where: str, keys: Iterable[str]) -> None:
        if not isinstance(data, dict):
            raise MixSpecError(f"{where}: expected a table, got {data!r}")
        message = unknown_keys(data, where, keys)
        if message:
            raise MixSpecError(message)
        self.data, self.where = data, where

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return key in self.data

    def _raw(self, key: str, default: Any) -> Any:
        if key not in self.data:
            if default is REQUIRED:
                raise MixSpecError(f"{self.name(key)}: missing required field; add it to the "
                                   f"mix file")
            return default
        return self.data[key]

    def _wrong(self, key: str, want: str, value: Any) -> MixSpecError:
        return MixSpecError(f"{self.name(key)}: expected {want}, got {value!r} "
                            f"({type(value).__name__})")

    def string(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._raw(key, default)
        if key not in self.data:
            return value
        if not isinstance(value, str) or not value:
            raise self._wrong(key, "a non-empty string", value)
        return value

    def boolean(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._raw(key, default)
        if key in self.data and not isinstance(value, bool):
            raise self._wrong(key, "true or false", value)
        return value

    def integer(self, key: str, valid: Interval, default: Any = REQUIRED) -> Any:
        value = self._raw(key, default)
        if key not in self.data:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(key, f"an integer {valid}", value)
        if value not in valid:
            raise MixSpecError(f"{self.name(key)}: must be {_range_words(valid)}, got "
                               f"{value!r}")
        return value

    def number(self, key: str, valid: Interval, default: Any = REQUIRED) -> Any:
        value = self._raw(key, default)
        if key not in self.data:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._wrong(key, f"a number {valid}", value)
        if not math.isfinite(value) or value not in valid:
            raise MixSpecError(f"{self.name(key)}: must be {_range_words(valid)}, got "
                               f"{value!r}")
        return float(value)

    def strings(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._raw(key, default)
        if key not in self.data:
            return value
        if (not isinstance(value, list) or not value
                or not all(isinstance(v, str) and v for v in value)):
            raise MixSpecError(f"{self.name(key)}: expected a non-empty list of non-empty "
                               f"strings, got {value!r}")
        return tuple(value)

    def table(self, key: str, keys: Iterable[str], required: bool = True) -> TomlTable:
        """The sub-table ``key`` (an empty one when absent and not ``required``)."""
        value = self._raw(key, REQUIRED if required else {})
        return TomlTable(value, self.name(key), keys)

    def tables(self, key: str, keys: Iterable[str]) -> list[TomlTable]:
        """The array of tables ``key`` (``[[key]]``), each named ``where.key[i]``."""
        value = self._raw(key, REQUIRED)
        if not isinstance(value, list) or not value:
            raise MixSpecError(f"{self.name(key)}: expected one or more [[{self.name(key)}]] "
                               f"tables, got {value!r}")
        return [TomlTable(v, f"{self.name(key)}[{i}]", keys) for i, v in enumerate(value)]


def _range_words(valid: Interval) -> str:
    return str(valid) if valid.hi is None else f"in {valid}"
