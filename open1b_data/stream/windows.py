"""Token content of stream windows, read from the mix's token shards on demand.

Contract: ``WindowReader(plan)`` turns the plan's segments (``plan.py``) into tokens. Window
m is the ``window`` (4,097) token ids of its segments in order; a segment covering document
position ``doc_length`` contributes the separator ``tokenizer.eot_id`` of the manifest there.
Only the shards that hold the window's documents are read, and every document is checked
against its shard's Merkle root in the manifest - its tokens and provenance - before any of
it is used, and its held-out status against the definition's rule (``shardreader.py``):

* ``whole_shards=True`` (the loader; sequential reading): a shard is decoded and checked
  once, its tokens kept as one flat array plus offsets, in a per-source LRU of
  ``cache_shards`` shards. Within an epoch a source's draws walk its shards one at a time
  and never return to an earlier one, so even ``cache_shards=1`` decodes each shard exactly
  once per epoch, however rarely the source is drawn. The decoded lengths are checked
  against the shard's ``.lengths.npy`` (which the plan used). With ``readahead`` the next
  shard of each source in epoch order (``plan.shard_order``) is decoded in the background
  as soon as a source starts on a shard: at most ``cache_shards + 1`` decoded shards per
  source are held.
* ``whole_shards=False`` (``stream-at``, provenance; random access): the file is read
  whole once per process, only the row groups holding the needed documents are decoded,
  and each document is proved against the root with its Merkle inclusion proof.

Filling: the requested windows' segments are checked to tile them exactly, then each
segment's document slice is copied straight into the output array (one slice copy per
segment, converting to the output dtype on the way: no intermediate list or concatenation),
and separators are written in one vectorized store.

A window's sha256 is that of its canonical bytes: the token ids as uint32 little-endian,
``window * 4`` bytes, nothing else (``window_sha256``).
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Sequence

import numpy as np

from open1b_data.errors import ShardFormatError, StreamError
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.segments import Segment, Segments
from open1b_data.stream.shardreader import ShardReader, ShardTokens

__all__ = ["WindowReader", "ShardTokens", "window_sha256", "load_mix_tokenizer"]


def window_sha256(tokens: np.ndarray) -> str:
    """sha256 (hex) of a window's canonical bytes: uint32 little-endian token ids."""
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<u4").tobytes()).hexdigest()


def load_mix_tokenizer(mix_url: str, manifest=None):
    """The mix's ``tokenizers.Tokenizer``, its files checked against the manifest's content
    digests (``formats.tokenizerfile.load_mix_tokenizer``: a ``TokenizerError`` names an
    edited file)."""
    from open1b_data.formats.tokenizerfile import load_mix_tokenizer as load

    return load(mix_url, manifest)


class WindowReader:
    """Token content of windows of one plan (see module docstring)."""

    def __init__(self, plan: StreamPlan, whole_shards: bool = True, cache_shards: int = 2,
                 eot_id: int | None = None, readahead: bool = False,
                 plan_lock: threading.Lock | None = None) -> None:
        self.plan = plan
        self.view = plan.view
        self.window = plan.window
        self.whole_shards = whole_shards
        self.readahead = readahead and whole_shards
        self.eot_id = self.view.eot_id if eot_id is None else int(eot_id)
        self.shards = ShardReader(self.view, cache_shards)
        self._ahead: dict[int, tuple[int, int]] = {}     # source -> (epoch, shard) handled
        # readahead asks the plan for shard orders; a caller sharing the plan says how
        self._plan_lock = plan_lock if plan_lock is not None else contextlib.nullcontext()

    @property
    def cache_shards(self) -> int:
        return self.shards.cache_shards

    @property
    def shard_loads(self) -> int:
        """How many times a whole shard was decoded (tests, stats)."""
        return self.shards.loads

    def close(self) -> None:
        self.shards.close()

    # ------------------------------------------------------------------ shards

    def shard_url(self, source: int, shard: int) -> str:
        return self.shards.url(source, shard)

    def shard_tokens(self, source: int, shard: int) -> ShardTokens:
        """The whole shard, decoded once and cached (checked; see module docstring)."""
        return self.shards.tokens(source, shard)

    def column(self, source: int, shard: int, name: str) -> list:
        """One whole column of a shard as a Python list (e.g. ``doc_id``)."""
        return self.shards.column(source, shard, name)

    def documents(self, source: int, shard: int, docs: Sequence[int]) -> list[np.ndarray]:
        """Token ids (without the separator) of documents ``docs`` of one shard."""
        if self.whole_shards:
            st = self.shard_tokens(source, shard)
            return [st.doc(int(d)) for d in docs]
        return self.shards.rows(source, shard, [int(d) for d in docs])

    def doc_ids(self, source: int, shard: int, docs: Sequence[int]) -> list[str]:
        """Source-native ids of documents ``docs`` (reads the doc_id column's row groups)."""
        return self.shards.column(source, shard, "doc_id", [int(d) for d in docs])

    def _read_ahead(self, source: int, epoch: int, shard: int) -> None:
        """Source ``source`` is on ``shard`` of ``epoch``: start decoding its next shard."""
        if self._ahead.get(source) == (epoch, shard):
            return
        self._ahead[source] = (epoch, shard)
        with self._plan_lock:
            order, _ = self.plan.shard_order(source, epoch)
            j = int(np.flatnonzero(order == shard)[0]) + 1
            nxt = int(order[j]) if j < order.shape[0] else int(
                self.plan.shard_order(source, epoch + 1)[0][0])
        if nxt != shard:
            self.shards.prefetch(source, nxt)

    # ------------------------------------------------------------------ windows

    def fill(self, segs: Segments, first_window: int, count: int) -> np.ndarray:
        """Tokens of windows ``first_window .. first_window+count-1`` from their segments."""
        return self._fill(segs, segs.window - first_window, count,
                          f"windows [{first_window}, {first_window + count})")

    def fill_windows(self, segs: Segments, ms: Sequence[int], dtype=np.uint32) -> np.ndarray:
        """Tokens of the distinct windows ``ms``, row i = window ``ms[i]`` (any order);
        ``segs`` may hold other windows too. ``dtype=np.int64`` converts while copying (the
        loader's tensors), saving a pass."""
        ms_arr = np.asarray(ms, dtype=np.int64)
        order = np.argsort(ms_arr, kind="stable")
        ms_sorted = ms_arr[order]
        # segs is ordered by window: take each wanted window's run of segments
        lo = np.searchsorted(segs.window, ms_sorted, side="left")
        hi = np.searchsorted(segs.window, ms_sorted, side="right")
        if ms_sorted.size and (ms_sorted[-1] - ms_sorted[0] + 1 == ms_sorted.size):
            segs = segs.select(slice(int(lo[0]), int(hi[-1])))       # contiguous windows
        else:
            lens = hi - lo
            idx = np.repeat(lo - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
            segs = segs.select(idx)
        rows = order[np.searchsorted(ms_sorted, segs.window)]
        return self._fill(segs, rows, ms_arr.size, f"windows {ms_arr.tolist()[:8]}", dtype)

    def _fill(self, segs: Segments, rows: np.ndarray, count: int, what: str,
              dtype=np.uint32) -> np.ndarray:
        out = np.empty((count, self.window), dtype=dtype)
        flat_out = out.reshape(-1)
        n = len(segs)
        dst = rows * self.window + segs.window_offset
        # The plan's segments, in order, tile the requested windows exactly; check that
        # (cheap): then every output token is written below, exactly once.
        by_dst = np.argsort(dst, kind="stable")
        ends = np.cumsum(segs.length[by_dst])
        if n == 0 or int(ends[-1]) != count * self.window or not np.array_equal(
                dst[by_dst], np.concatenate([[0], ends[:-1]])) or np.any(
                segs.window_offset + segs.length > self.window):
            raise StreamError(f"{what}: their segments do not tile the windows (got "
                              f"{int(segs.length.sum())} of {count * self.window} tokens); "
                              f"the plan is inconsistent")
        body = np.minimum(segs.length, segs.doc_length - segs.doc_start)  # document tokens
        sep = body < segs.length                 # the segment ends with the separator
        flat_out[dst[sep] + body[sep]] = self.eot_id
        # read by shard so each shard is touched once per call, groups in stream order: a
        # source moving on to its next shard never reloads the previous one
        key = segs.source * (1 << 32) + segs.shard
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        group_rank = np.empty_like(first)
        group_rank[np.argsort(first, kind="stable")] = np.arange(first.size)
        g_of = group_rank[inv.reshape(-1)]
        order = np.argsort(g_of, kind="stable")
        cuts = np.flatnonzero(np.diff(g_of[order])) + 1
        for grp in np.split(order, cuts):
            s, h = int(segs.source[grp[0]]), int(segs.shard[grp[0]])
            flat, src = self._sources(s, h, segs, grp)
            for a, d, m in zip(src.tolist(), dst[grp].tolist(), body[grp].tolist()):
                flat_out[d:d + m] = flat[a:a + m]
            if self.readahead:
                self._read_ahead(s, int(segs.epoch[grp[-1]]), h)
        return out

    def _sources(self, s: int, h: int, segs: Segments, grp: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(flat token array, start of each segment ``grp``'s tokens in it) for one shard;
        checks each document's length against the plan's."""
        docs = segs.doc[grp]
        if self.whole_shards:
            st = self.shard_tokens(s, h)
            flat, offsets = st.flat, st.offsets
            if docs.size and (int(docs.max()) + 1 >= offsets.shape[0] or int(docs.min()) < 0):
                raise ShardFormatError(f"{self.shard_url(s, h)}: the plan asks for document "
                                       f"{int(docs.max())} of {offsets.shape[0] - 1}")
            got = offsets[docs + 1] - offsets[docs]
            at = offsets[docs]
        else:
            uniq, back = np.unique(docs, return_inverse=True)
            toks = self.documents(s, h, uniq.tolist())
            sizes = np.array([t.shape[0] for t in toks], dtype=np.int64)
            flat = np.concatenate(toks) if toks else np.zeros(0, np.uint32)
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            got, at = sizes[back.reshape(-1)], starts[back.reshape(-1)]
        bad = np.flatnonzero(got != segs.doc_length[grp])
        if bad.size:
            i = int(grp[bad[0]])
            raise ShardFormatError(
                f"{self.shard_url(s, h)}: document {int(segs.doc[i])} has "
                f"{int(got[bad[0]])} tokens, the plan expects {int(segs.doc_length[i])}")
        return flat, at + segs.doc_start[grp]

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
