"""Token content of stream windows, read from the mix's token shards on demand.

Contract: ``WindowReader(plan)`` turns the plan's segments (``plan.py``) into tokens. Window
m is the ``window`` (4,097) token ids of its segments in order; a segment covering document
position ``doc_length`` contributes the separator ``tokenizer.eot_id`` of the manifest there.
Only the shards that hold the window's documents are opened:

* ``whole_shards=True`` (the loader; sequential reading): a shard's ``tokens`` column is
  decoded once, as one flat array plus offsets, and kept in a per-source LRU of
  ``cache_shards`` shards. Within an epoch a source's draws walk its shards one at a time
  and never return to an earlier one, so even ``cache_shards=1`` decodes each shard exactly
  once per epoch, however rarely the source is drawn. On load the decoded lengths are checked against the
  shard's ``.lengths.npy`` (which the plan used); a mismatch is a ``ShardFormatError``.
* ``whole_shards=False`` (``stream-at``, provenance; random access): only the row groups
  holding the needed documents are read.

A window's sha256 is that of its canonical bytes: the token ids as uint32 little-endian,
``window * 4`` bytes, nothing else (``window_sha256``).
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from open1b_data.errors import ShardFormatError, StreamError
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.segments import Segment, Segments
from open1b_data.storage import join, read_bytes


def window_sha256(tokens: np.ndarray) -> str:
    """sha256 (hex) of a window's canonical bytes: uint32 little-endian token ids."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<u4").tobytes()).hexdigest()


def load_mix_tokenizer(mix_url: str):
    """The mix's ``tokenizers.Tokenizer`` (path from manifest.json's ``tokenizer.path``)."""
    from open1b_data.build.tokenizer import load_tokenizer

    manifest = json.loads(read_bytes(join(mix_url, "manifest.json")))
    return load_tokenizer(join(mix_url, manifest["tokenizer"]["path"]))


@dataclass(frozen=True)
class ShardTokens:
    """One shard's documents as a flat uint32 array: document d is
    ``flat[offsets[d]:offsets[d+1]]``."""

    flat: np.ndarray
    offsets: np.ndarray

    def doc(self, d: int) -> np.ndarray:
        return self.flat[self.offsets[d]:self.offsets[d + 1]]


class WindowReader:
    """Token content of windows of one plan (see module docstring)."""

    def __init__(self, plan: StreamPlan, whole_shards: bool = True, cache_shards: int = 2,
                 eot_id: int | None = None) -> None:
        self.plan = plan
        self.view = plan.view
        self.window = plan.window
        self.whole_shards = whole_shards
        self.cache_shards = max(1, cache_shards)
        if eot_id is None:
            manifest = json.loads(read_bytes(join(self.view.mix_url, "manifest.json")))
            eot_id = int(manifest["tokenizer"]["eot_id"])
        self.eot_id = int(eot_id)
        self._cache: list[OrderedDict[int, ShardTokens]] = [OrderedDict() for _ in
                                                             plan.sources]
        self._lock = threading.Lock()
        self.shard_loads = 0        # how many times a whole shard was decoded (tests, stats)

    # ------------------------------------------------------------------ shards

    def shard_url(self, source: int, shard: int) -> str:
        return self.view.url(self.view.sources[source].shard_paths[shard])

    def _parquet(self, source: int, shard: int):
        """Context manager: (ParquetFile, ShardInfo), magic/version/schema/counts checked."""
        from open1b_data.build.shards import _open

        return _open(self.shard_url(source, shard))

    def _read_tokens_column(self, source: int, shard: int):
        """The whole ``tokens`` column; the footer is checked first (magic, version,
        schema, counts). Local files are read by Arrow's native reader (multi-threaded,
        ~1.5x faster than through a Python file object); other URLs through fsspec."""
        import pyarrow.parquet as pq

        from open1b_data.storage import is_local, url_to_fs

        url = self.shard_url(source, shard)
        fs, path = url_to_fs(url)
        with self._parquet(source, shard) as (pf, _):
            if not is_local(fs):
                return pf.read(columns=["tokens"]).column("tokens")
        return pq.read_table(path, columns=["tokens"]).column("tokens")

    def column(self, source: int, shard: int, name: str) -> list:
        """One whole column of a shard as a Python list (e.g. ``doc_id``)."""
        with self._parquet(source, shard) as (pf, _):
            return pf.read(columns=[name]).column(name).to_pylist()

    def shard_tokens(self, source: int, shard: int) -> ShardTokens:
        """The whole shard, decoded once and cached (checked against its lengths file)."""
        cache = self._cache[source]
        with self._lock:
            hit = cache.get(shard)
            if hit is not None:
                cache.move_to_end(shard)
                return hit
        from open1b_data.build.shards import list_parts

        col = self._read_tokens_column(source, shard)
        flat, offsets = list_parts(col, self.shard_url(source, shard))
        lengths = self.view.lengths(source, shard)
        if offsets.shape[0] != lengths.shape[0] + 1 or not np.array_equal(
                np.diff(offsets), lengths.astype(np.int64)):
            raise ShardFormatError(
                f"{self.shard_url(source, shard)}: document lengths differ from its "
                f".lengths.npy, which the stream plans from; rebuild or verify the mix")
        st = ShardTokens(np.ascontiguousarray(flat, dtype=np.uint32), offsets)
        with self._lock:
            self.shard_loads += 1
            cache[shard] = st
            while len(cache) > self.cache_shards:
                cache.popitem(last=False)
        return st

    def documents(self, source: int, shard: int, docs: Sequence[int]) -> list[np.ndarray]:
        """Token ids (without the separator) of documents ``docs`` of one shard."""
        if self.whole_shards:
            st = self.shard_tokens(source, shard)
            return [st.doc(int(d)) for d in docs]
        from open1b_data.build.shards import read_rows

        return read_rows(self.shard_url(source, shard), [int(d) for d in docs])

    def doc_ids(self, source: int, shard: int, docs: Sequence[int]) -> list[str]:
        """Source-native ids of documents ``docs`` (reads the doc_id column's row groups)."""
        out: dict[int, str] = {}
        with self._parquet(source, shard) as (pf, info):
            starts = np.concatenate([[0], np.cumsum(info.row_group_rows)]).astype(np.int64)
            groups: dict[int, list[int]] = {}
            for d in docs:
                groups.setdefault(int(np.searchsorted(starts, int(d), side="right") - 1),
                                  []).append(int(d))
            for g, ds in groups.items():
                ids = pf.read_row_group(g, columns=["doc_id"]).column("doc_id").to_pylist()
                for d in ds:
                    out[d] = ids[d - int(starts[g])]
        return [out[int(d)] for d in docs]

    # ------------------------------------------------------------------ windows

    def fill(self, segs: Segments, first_window: int, count: int) -> np.ndarray:
        """Tokens of windows ``first_window .. first_window+count-1`` from their segments."""
        return self._fill(segs, segs.window - first_window, count,
                          f"windows [{first_window}, {first_window + count})")

    def fill_windows(self, segs: Segments, ms: Sequence[int], dtype=np.uint32) -> np.ndarray:
        """Tokens of the ascending windows ``ms``; ``segs`` may hold other windows too.
        ``dtype=np.int64`` converts while copying (the loader's tensors), saving a pass."""
        ms_arr = np.asarray(ms, dtype=np.int64)
        # segs is ordered by window: take each wanted window's run of segments
        lo = np.searchsorted(segs.window, ms_arr, side="left")
        hi = np.searchsorted(segs.window, ms_arr, side="right")
        if ms_arr.size and (ms_arr[-1] - ms_arr[0] + 1 == ms_arr.size):
            segs = segs.select(slice(int(lo[0]), int(hi[-1])))       # contiguous windows
        else:
            segs = segs.select(np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)]
                                             or [np.zeros(0, np.int64)]))
        return self._fill(segs, np.searchsorted(ms_arr, segs.window), ms_arr.size,
                          f"windows {ms_arr.tolist()[:8]}", dtype)

    def _fill(self, segs: Segments, rows: np.ndarray, count: int, what: str,
              dtype=np.uint32) -> np.ndarray:
        out = np.empty((count, self.window), dtype=dtype)
        n = len(segs)
        dst = rows * self.window + segs.window_offset
        # The plan's segments, in order, tile the requested windows exactly; check that
        # (cheap), then the output is one concatenation of document slices and separators.
        if n == 0 or dst[0] != 0 or int(segs.length.sum()) != count * self.window or \
                not np.array_equal(dst[1:], np.cumsum(segs.length)[:-1]):
            raise StreamError(f"{what}: their segments do not tile the windows (got "
                              f"{int(segs.length.sum())} of {count * self.window} tokens); "
                              f"the plan is inconsistent")
        # read by shard so each shard is touched once per call, groups in stream order: a
        # source moving on to its next shard never reloads the previous one
        key = segs.source * (1 << 32) + segs.shard
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        group_rank = np.empty_like(first)
        group_rank[np.argsort(first, kind="stable")] = np.arange(first.size)
        g_of = group_rank[inv.reshape(-1)]
        order = np.argsort(g_of, kind="stable")
        cuts = np.flatnonzero(np.diff(g_of[order])) + 1
        tok_of: list = [None] * n
        for grp in np.split(order, cuts):
            s, h = int(segs.source[grp[0]]), int(segs.shard[grp[0]])
            for i, t in zip(grp.tolist(), self.documents(s, h, segs.doc[grp].tolist())):
                tok_of[i] = t
        starts, lens = segs.doc_start.tolist(), segs.length.tolist()
        doc_lens = segs.doc_length.tolist()
        eot = np.array([self.eot_id], dtype=np.uint32)
        parts = []
        for i in range(n):
            t, a, m = tok_of[i], starts[i], lens[i]
            if t.shape[0] != doc_lens[i]:
                s, h = int(segs.source[i]), int(segs.shard[i])
                raise ShardFormatError(
                    f"{self.shard_url(s, h)}: document {int(segs.doc[i])} has "
                    f"{t.shape[0]} tokens, the plan expects {doc_lens[i]}")
            if a + m > doc_lens[i]:             # the segment ends with the separator
                parts.append(t[a:])
                parts.append(eot)
            else:
                parts.append(t[a:a + m])
        np.concatenate(parts, out=out.reshape(-1))
        return out

    def windows(self, a: int, b: int) -> np.ndarray:
        """Tokens of windows a .. b-1 as a ``[b - a, window]`` uint32 array."""
        return self.fill(self.plan.segments_range(a, b), a, b - a)

    def window_tokens(self, m: int) -> np.ndarray:
        return self.windows(m, m + 1)[0]

    def select(self, ms: Sequence[int]) -> np.ndarray:
        """Tokens of arbitrary windows ``ms`` (e.g. one rank's micro-batch), in that order."""
        ms = [int(m) for m in ms]
        if not ms:
            return np.empty((0, self.window), dtype=np.uint32)
        uniq = sorted(set(ms))
        # one contiguous plan request over the span, then only the wanted windows
        got = self.fill_windows(self.plan.segments_range(uniq[0], uniq[-1] + 1), uniq)
        return got[np.searchsorted(np.asarray(uniq), np.asarray(ms))]

    def segments_with_ids(self, m: int) -> list[Segment]:
        """Window m's segments with their source-native ``doc_id`` filled in."""
        import dataclasses

        segs = self.plan.segments(m)
        out = []
        for seg in segs:
            s = self.plan.sources.index(seg.source)
            out.append(dataclasses.replace(seg, doc_id=self.doc_ids(s, seg.shard, [seg.doc])[0]))
        return out
