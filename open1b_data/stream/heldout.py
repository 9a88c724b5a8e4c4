"""The held-out windows of a built mix: validation data the stream never trains on.

Contract (STREAM.md section 10): a source with a held-out fraction lists, per shard, the
rows the rule of ``formats/heldout.py`` holds out; the plan never draws them. Here they are
packed into the source's own fixed windows: its held-out documents in (shard, row) order
- shards in manifest order, rows ascending - each followed by the separator, cut into
consecutive windows of ``window`` (4,097) tokens; a last partial window is dropped. So held-out
window k of source s is a pure function of the mix: no seed, no schedule, no topology.

Every token comes through ``ShardReader``: only the needed row groups are decoded, each
document is proved against its shard's Merkle root (tokens and provenance) and its
``doc_id`` checked against the rule - a manifest listing a row the rule does not hold out
is refused (``HeldOutError``), so the validation data is what the definition says, not
what a manifest claims - and each document's token count is checked against its lengths
file.
"""
from __future__ import annotations

import numpy as np

from open1b_data.errors import StreamError
from open1b_data.formats.heldout import fractions_of
from open1b_data.stream.mixview import MixView
from open1b_data.stream.shardreader import ShardReader


class HeldoutWindows:
    """The held-out windows of one built mix (see module docstring)."""

    def __init__(self, view: MixView, cache_shards: int = 1) -> None:
        self.view = view
        self.window = view.window
        self.eot_id = view.eot_id
        self.fractions = fractions_of(view.definition)
        self.reader = ShardReader(view, cache_shards)

    @classmethod
    def open(cls, mix_url: str) -> "HeldoutWindows":
        return cls(MixView.open(mix_url))

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources with a held-out set, in manifest order."""
        return tuple(s.name for s in self.view.sources if s.heldout)

    def documents(self, source: str) -> list[tuple[int, int]]:
        """Every held-out document of ``source`` as (shard, row), in window order."""
        sv = self.view.sources[self.view.source_index(source)]
        if not sv.heldout:
            return []
        return [(h, int(r)) for h, rows in enumerate(sv.shard_heldout) for r in rows]

    def _take(self, s: int, need: int) -> list[tuple[int, np.ndarray]]:
        """The first held-out documents of source ``s`` whose tokens (+ separators) reach
        ``need`` tokens, or all of them: [(shard, rows)] in window order."""
        sv = self.view.sources[s]
        out, have = [], 0
        for h, rows in enumerate(sv.shard_heldout):
            if have >= need:
                break
            if rows.size == 0:
                continue
            sizes = self.view.lengths(s, h)[rows].astype(np.int64) + 1
            ends = have + np.cumsum(sizes)
            k = int(np.searchsorted(ends, need, side="left")) + 1   # docs reaching ``need``
            out.append((h, rows[:k]))
            have = int(ends[min(k, rows.size) - 1])
        return out

    def windows(self, source: str, count: int) -> np.ndarray:
        """The first ``count`` held-out windows of ``source`` (fewer when it has fewer), as
        a ``[n, window]`` uint32 array."""
        s = self.view.source_index(source)
        sv = self.view.sources[s]
        fraction = self.fractions.get(source)
        if not sv.heldout or fraction is None:
            raise StreamError(f"source {source!r} of mix {self.view.name!r} has no held-out "
                              f"set; declare [heldout] fraction (or the source's heldout) "
                              f"in the mix definition and rebuild it")
        if count < 0:
            raise StreamError(f"window count must be >= 0, got {count!r}")
        parts = []
        for h, rows in self._take(s, count * self.window):
            # proved, and each one's id checked against the rule, by the reader
            lengths = self.view.lengths(s, h)
            for r, toks in zip(rows.tolist(), self.reader.rows(s, h, rows.tolist())):
                if toks.shape[0] != int(lengths[r]):
                    raise StreamError(f"{self.reader.url(s, h)}: document {r} has "
                                      f"{toks.shape[0]} tokens, its lengths file says "
                                      f"{int(lengths[r])}")
                parts.append(toks.astype(np.uint32, copy=False))
                parts.append(np.array([self.eot_id], dtype=np.uint32))
        flat = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
        n = min(count, flat.size // self.window)
        return flat[:n * self.window].reshape(n, self.window)

    def close(self) -> None:
        self.reader.close()
