"""Data statistics of a batch (``stream-at --stats``): what a step's windows hold, computed
from the window tokens and the plan's segments alone - no model, no training run.

Definitions (docs/CLI.md restates them for readers of the output):

* **unique-token ratio** of a window: distinct token ids / the window's tokens (all
  ``window`` ids, separators included); of several windows: distinct ids over all of them /
  all their tokens.
* **tokens per source**: the source's document tokens in the windows, separators excluded
  (as in ``plot-mix``); its **share** is over all document tokens of the windows.
  **separators** are counted apart (one per document end inside the windows).
* **documents per source**: the source's distinct draws with tokens in the windows (a draw
  spanning several windows counts once; the same document drawn twice counts twice).
* **redrawn documents**: a document (source, shard, row) that appears under two or more
  different draws in the windows - e.g. a small source rolling over into its next epoch
  within the step. **spanning draws**: draws whose tokens lie in two or more of the windows
  (a long document cut by window boundaries); reported apart from redrawn documents.
* **longest run**: the longest run of one token id repeated consecutively inside a window.
  Runs never cross windows: each window is a separate training sequence.
* **longest repeat**: the longest token sequence that occurs at least twice in one window,
  at two different start positions (occurrences may overlap, so a run of k equal ids is a
  repeated (k-1)-gram); reported with its window and the first two start offsets.

Ties go to the earliest window, then the earliest offset. Every function is pure over its
arrays; ``tokens`` is ``[windows, window]`` (any unsigned integer dtype), ``windows`` the
stream window ids of its rows, ``segs`` the plan's segments of exactly those windows.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from open1b_data.stream.segments import Segments

# The repeat search hashes every n-gram with a polynomial over Z/2^64 (odd base, so the
# normalizing power is a unit). A hash only proposes candidates: every pair is compared token
# by token before it counts, so collisions cost time, never correctness.
HASH_BASE = np.uint64(0x9E3779B97F4A7C15)
# The search's first length: text windows nearly always repeat 16 tokens somewhere (a
# boilerplate line), so one pass over every window then prunes to the few that repeat
# more, instead of three full passes at 1, 3 and 7 (measured in benchmarks/HISTORY.md).
FIRST_PROBE = 16


@dataclass(frozen=True)
class SourceCount:
    source: str
    tokens: int          # document tokens, separators excluded
    share: float         # of all document tokens in the windows
    documents: int       # distinct draws with tokens in the windows


@dataclass(frozen=True)
class Redrawn:
    """One document that two or more different draws put into the windows."""

    source: str
    shard: int
    doc: int
    draws: tuple[int, ...]
    epochs: tuple[int, ...]
    shard_path: str | None = None    # the shard file, relative to the mix root


@dataclass(frozen=True)
class Run:
    """The longest run of one id; ``token``/``window``/``offset`` None for no windows."""

    length: int
    token: int | None
    window: int | None
    offset: int | None


@dataclass(frozen=True)
class Repeat:
    """The longest repeated n-gram; length 0 (and None) when no id repeats in any window."""

    length: int
    window: int | None
    offsets: tuple[int, int] | None


@dataclass(frozen=True)
class BatchStats:
    """The statistics of a set of windows (see module docstring)."""

    windows: tuple[int, ...]
    window_tokens: int
    window_distinct: tuple[int, ...]     # distinct ids per window, in ``windows`` order
    distinct: int                        # distinct ids over all the windows
    separators: int
    sources: tuple[SourceCount, ...]
    redrawn: tuple[Redrawn, ...]
    spanning_draws: int
    longest_span: int                    # windows touched by the most-spread draw
    longest_run: Run
    longest_repeat: Repeat

    @property
    def tokens(self) -> int:
        return len(self.windows) * self.window_tokens

    @property
    def unique_ratio(self) -> float:
        return self.distinct / self.tokens if self.tokens else 0.0

    def window_ratios(self) -> np.ndarray:
        return np.asarray(self.window_distinct, dtype=np.float64) / self.window_tokens

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens, "distinct": self.distinct,
            "unique_ratio": self.unique_ratio, "separators": self.separators,
            "windows": [{"window": m, "distinct": d, "unique_ratio": d / self.window_tokens}
                        for m, d in zip(self.windows, self.window_distinct)],
            "sources": [vars(s) for s in self.sources],
            "redrawn": [{"source": r.source, "shard": r.shard, "shard_path": r.shard_path,
                         "doc": r.doc, "draws": list(r.draws), "epochs": list(r.epochs)}
                        for r in self.redrawn],
            "spanning_draws": self.spanning_draws, "longest_span": self.longest_span,
            "longest_run": vars(self.longest_run),
            "longest_repeat": {"length": self.longest_repeat.length,
                               "window": self.longest_repeat.window,
                               "offsets": None if self.longest_repeat.offsets is None
                               else list(self.longest_repeat.offsets)},
        }


# ------------------------------------------------------------------------- token content

def distinct_per_window(tokens: np.ndarray) -> np.ndarray:
    """Distinct ids in each row of ``tokens`` (int64 ``[windows]``)."""
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        return np.zeros(tokens.shape[0], dtype=np.int64)
    s = np.sort(tokens, axis=1)
    return 1 + np.count_nonzero(s[:, 1:] != s[:, :-1], axis=1)


def longest_run(tokens: np.ndarray, windows: np.ndarray) -> Run:
    """The longest run of one id inside a row; ties to the earliest (window, offset)."""
    if tokens.size == 0:
        return Run(0, None, None, None)
    n = tokens.shape[1]
    flat = tokens.reshape(-1)
    starts = np.ones(flat.shape[0], dtype=bool)
    starts[1:] = flat[1:] != flat[:-1]
    starts[::n] = True                      # a run never continues into the next window
    first = np.flatnonzero(starts)
    lengths = np.diff(np.r_[first, flat.shape[0]])
    k = int(np.argmax(lengths))             # argmax keeps the earliest of equal lengths
    i = int(first[k])
    return Run(int(lengths[k]), int(flat[i]), int(windows[i // n]), i % n)


@functools.lru_cache(maxsize=8)
def _powers(n: int) -> np.ndarray:
    """HASH_BASE**j mod 2^64 for j = 0 .. n-1."""
    out = np.empty(n, dtype=np.uint64)
    x = np.uint64(1)
    with np.errstate(over="ignore"):
        for j in range(n):
            out[j] = x
            x = x * HASH_BASE
    return out


def _gram_keys(tokens: np.ndarray, length: int) -> np.ndarray:
    """``[rows, n - length + 1]`` uint64: equal n-grams of a row get equal keys."""
    n = tokens.shape[1]
    pw = _powers(n)
    with np.errstate(over="ignore"):
        x = tokens.astype(np.uint64) + np.uint64(1)      # + 1: id 0 still weighs in
        prefix = np.zeros((tokens.shape[0], n + 1), dtype=np.uint64)
        np.cumsum(x * pw, axis=1, out=prefix[:, 1:])
        # gram i is B^i * poly(gram); times B^(n-1-i) every gram sits at B^(n-1)
        m = n - length + 1
        return (prefix[:, length:] - prefix[:, :m]) * pw[::-1][:m]


def _true_pair(row: np.ndarray, positions: np.ndarray, length: int) -> tuple[int, int] | None:
    """The earliest (i, j), i < j in ``positions`` (one hash group), with equal n-grams."""
    a, b = int(positions[0]), int(positions[1])
    if np.array_equal(row[a:a + length], row[b:b + length]):
        return a, b
    grams = np.stack([row[p:p + length] for p in positions.tolist()])
    _, inv, counts = np.unique(grams, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    dup = np.flatnonzero(counts[inv] > 1)
    if dup.size == 0:
        return None                          # only hash collisions in this group
    i = int(dup[0])
    j = int(np.flatnonzero(inv == inv[i])[1])
    return int(positions[i]), int(positions[j])


def _row_pair(row: np.ndarray, keys: np.ndarray, length: int, earliest: bool
              ) -> tuple[int, int] | None:
    """A verified repeated pair of ``length``-grams in one row (the earliest first
    occurrence if ``earliest``, else any), or None."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    same = np.flatnonzero(sk[1:] == sk[:-1])
    if same.size == 0:
        return None
    heads = np.unique(np.searchsorted(sk, sk[same], side="left"))
    ends = np.searchsorted(sk, sk[heads], side="right")
    groups = sorted((order[a:b] for a, b in zip(heads, ends)), key=lambda g: int(g[0]))
    best = None
    for g in groups:                         # stable argsort: positions ascend in a group
        if best is not None and int(g[0]) >= best[0]:
            break
        pair = _true_pair(row, g, length)
        if pair is not None and (best is None or pair < best):
            best = pair
            if not earliest:
                break
    return best


def _repeating_rows(tokens: np.ndarray, rows: np.ndarray, length: int
                    ) -> tuple[np.ndarray, int | None, tuple[int, int] | None]:
    """(rows whose hashes repeat at ``length`` - a superset of those with a true repeat -,
    the first row with a verified repeat and its pair, or None, None)."""
    keys = _gram_keys(tokens[rows], length)
    # candidates by the top 32 bits (sorting half the bytes); more collisions only mean a
    # few more rows kept and checked, never a missed repeat
    s = np.sort((keys >> np.uint64(32)).astype(np.uint32), axis=1)
    cand = np.flatnonzero(np.any(s[:, 1:] == s[:, :-1], axis=1))
    for c in cand.tolist():
        pair = _row_pair(tokens[rows[c]], keys[c], length, earliest=False)
        if pair is not None:
            return rows[cand], int(rows[c]), pair
    return rows[cand], None, None


def longest_repeat(tokens: np.ndarray, windows: np.ndarray) -> Repeat:
    """The longest n-gram occurring twice in one row (see module docstring).

    Exponential search on n from ``FIRST_PROBE``, then bisection once a length fails: a row
    with no repeat of length n has none longer, so each success keeps only the rows that
    still had candidates."""
    if tokens.size == 0 or tokens.shape[1] < 2:
        return Repeat(0, None, None)
    rows = np.arange(tokens.shape[0])
    lo, hi = 0, tokens.shape[1] - 1          # a repeat of length lo exists; none above hi
    step = FIRST_PROBE
    while lo < hi:
        mid = min(hi, lo + step) if step else (lo + hi + 1) // 2
        kept, row, _ = _repeating_rows(tokens, rows, mid)
        if row is not None:
            lo, rows = mid, kept
            step = step * 2 if step else 0
        else:
            hi, step = mid - 1, 0            # overshot: bisect [lo, mid)
    if lo == 0:
        return Repeat(0, None, None)
    keys = _gram_keys(tokens[rows], lo)
    for c, r in enumerate(rows.tolist()):
        pair = _row_pair(tokens[r], keys[c], lo, earliest=True)
        if pair is not None:
            return Repeat(lo, int(windows[r]), pair)
    raise AssertionError("a verified repeat vanished")    # lo was verified above


# ------------------------------------------------------------------------- segments

def doc_tokens(segs: Segments) -> np.ndarray:
    """Document tokens of each segment (its length minus the separator, if it has one)."""
    return segs.length - separators_of(segs)


def separators_of(segs: Segments) -> np.ndarray:
    """1 for each segment that ends with the separator after its document, else 0."""
    return (segs.doc_start + segs.length > segs.doc_length).astype(np.int64)


def source_counts(segs: Segments, names: tuple[str, ...]) -> tuple[SourceCount, ...]:
    """Document tokens, share and distinct draws per source, in ``names`` order."""
    S = len(names)
    toks = np.bincount(segs.source, weights=doc_tokens(segs), minlength=S).astype(np.int64)
    _, first = np.unique(segs.draw, return_index=True)
    docs = np.bincount(segs.source[first], minlength=S)
    total = int(toks.sum())
    return tuple(SourceCount(names[s], int(toks[s]), int(toks[s]) / total if total else 0.0,
                             int(docs[s])) for s in range(S))


def redrawn(segs: Segments, names: tuple[str, ...],
            paths: tuple[tuple[str, ...], ...] | None = None) -> tuple[Redrawn, ...]:
    """Documents that appear under two or more different draws, by (source, shard, doc);
    ``paths[s][h]`` names shard h of source s where given."""
    draws, first = np.unique(segs.draw, return_index=True)
    key = np.stack([segs.source[first], segs.shard[first], segs.doc[first]], axis=1)
    uniq, inv, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    out = []
    for g in np.flatnonzero(counts > 1).tolist():
        members = np.flatnonzero(inv == g)
        s, h, d = (int(x) for x in uniq[g])
        out.append(Redrawn(names[s], h, d, tuple(int(x) for x in draws[members]),
                           tuple(int(x) for x in segs.epoch[first[members]]),
                           None if paths is None else paths[s][h]))
    return tuple(out)


def spanning(segs: Segments) -> tuple[int, int]:
    """(draws with tokens in 2+ windows, the most windows one draw touches)."""
    if len(segs) == 0:
        return 0, 0
    _, counts = np.unique(segs.draw, return_counts=True)   # one segment per (draw, window)
    return int(np.count_nonzero(counts > 1)), int(counts.max())


# ------------------------------------------------------------------------- together

def batch_stats(windows, tokens: np.ndarray, segs: Segments, names: tuple[str, ...],
                paths: tuple[tuple[str, ...], ...] | None = None) -> BatchStats:
    """Every statistic of the module docstring for windows ``windows`` (rows of
    ``tokens``) whose segments are ``segs``; ``paths[s][h]``, the shard files, name the
    redrawn documents' shards."""
    windows = np.asarray(windows, dtype=np.int64)
    if tokens.ndim != 2 or tokens.shape[0] != windows.shape[0]:
        raise ValueError(f"tokens {tokens.shape} must have one row per window "
                         f"({windows.shape[0]})")
    span_count, span_max = spanning(segs)
    return BatchStats(
        windows=tuple(windows.tolist()), window_tokens=int(tokens.shape[1]),
        window_distinct=tuple(distinct_per_window(tokens).tolist()),
        distinct=int(np.unique(tokens).size), separators=int(separators_of(segs).sum()),
        sources=source_counts(segs, names), redrawn=redrawn(segs, names, paths),
        spanning_draws=span_count, longest_span=span_max,
        longest_run=longest_run(tokens, windows),
        longest_repeat=longest_repeat(tokens, windows))
