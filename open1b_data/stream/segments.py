"""The stream plan's vocabulary: segments (a drawn document's tokens inside one window),
cursors (a resumable position in the token stream) and blocks of draws.

Plain frozen dataclasses shared by the plan (``plan.py``), the seek index
(``seekindex.py``) and the window reader (``windows.py``); no logic beyond accessors.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Segment:
    """One drawn document's tokens inside one window (see module docstring)."""

    source: str
    shard: int
    doc: int
    doc_id: str | None
    epoch: int
    doc_start: int
    length: int
    window_offset: int
    draw: int = -1           # the mix draw that selected this document
    doc_length: int = -1     # the document's tokens without the separator
    window: int = -1

    @property
    def has_separator(self) -> bool:
        """True when the segment ends with the separator token after the document."""
        return self.doc_start + self.length > self.doc_length


@dataclass(frozen=True)
class Segments:
    """Many segments as parallel int64 arrays, ordered by (window, draw)."""

    window: np.ndarray
    draw: np.ndarray
    source: np.ndarray        # index into StreamPlan.sources
    shard: np.ndarray
    doc: np.ndarray
    epoch: np.ndarray
    doc_start: np.ndarray
    length: np.ndarray
    window_offset: np.ndarray
    doc_length: np.ndarray

    def __len__(self) -> int:
        return int(self.window.shape[0])

    def to_list(self, names: tuple[str, ...]) -> list[Segment]:
        cols = [c.tolist() for c in (self.source, self.shard, self.doc, self.epoch,
                                     self.doc_start, self.length, self.window_offset,
                                     self.draw, self.doc_length, self.window)]
        return [Segment(names[s], h, d, None, e, a, n, o, i, L, w)
                for s, h, d, e, a, n, o, i, L, w in zip(*cols)]

    def select(self, mask: np.ndarray) -> "Segments":
        return Segments(*(getattr(self, f)[mask] for f in SEG_FIELDS))


SEG_FIELDS = ("window", "draw", "source", "shard", "doc", "epoch", "doc_start", "length",
               "window_offset", "doc_length")


@dataclass(frozen=True)
class Cursor:
    """A position in the stream: token ``pos`` lies ``offset`` tokens into draw ``draw``;
    ``consumed[s]`` counts source s's draws before ``draw``."""

    pos: int
    draw: int
    offset: int
    consumed: tuple[int, ...]


@dataclass(frozen=True)
class Draws:
    """Consecutive draws ``first .. first+n-1`` with where each starts in the token stream."""

    first: int
    source: np.ndarray   # int64
    ordinal: np.ndarray  # k: the source's draw count before this one (over all epochs)
    epoch: np.ndarray
    shard: np.ndarray
    doc: np.ndarray
    length: np.ndarray   # tokens without the separator
    start: np.ndarray    # token position of each draw's first token; len n + 1 (end last)

    def __len__(self) -> int:
        return int(self.source.shape[0])


@dataclass(frozen=True)
class DrawInfo:
    draw: int
    source: str
    ordinal: int
    epoch: int
    shard: int
    doc: int
    length: int
    start: int           # token position of the document's first token
    first_window: int
    last_window: int     # window holding the separator after it
