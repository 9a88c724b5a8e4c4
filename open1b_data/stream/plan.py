"""The stream's plan: which document segments make up window m. Pure index arithmetic over
the manifest and the per-shard document lengths; no token shard is opened here.

Definition (STREAM.md restates it for re-implementers; ``rng.py`` defines the primitives):

* Draw i (i = 0, 1, ...) picks source ``s`` with ``cumW[s-1] <= bounded(K_mix, i, W) <
  cumW[s]`` where ``W_s`` are the exact integer weights of ``mixview.py`` in manifest order
  and ``K_mix = derive_key("mix", seed)``.
* The k-th draw of source s (k = 0, 1, ... over all epochs) takes the document at position
  ``p = k mod D_s`` of epoch ``e = k div D_s`` of that source's order. Epoch e's order is the
  shards in the order ``sigma_e(j) = feistel_permute(derive_key("shard-order", seed, s, e),
  j, n_shards)``, each shard's documents in the order ``pi_(e,h)(q) =
  feistel_permute(derive_key("doc-order", seed, s, e, h), q, D_h)`` (h = shard index in
  the manifest). Every epoch is one full permutation of the source; sources roll over to the
  next epoch independently.
* Each drawn document contributes its ``length`` tokens then one separator token; windows
  are consecutive, non-overlapping slices of ``window`` (4,097) tokens of that sequence.
  A ``Segment`` is the part of one drawn document inside one window: document token
  positions ``[doc_start, doc_start + length)``, where position ``doc_length`` (== the
  document's length) is the separator.

Seeking never replays: a ``Cursor`` (token position, draw counter, offset into that draw,
documents consumed per source before it) is all that is needed to continue, and the draws
after it are computed vectorized in chunks. Known cursors come from the start of the
stream, the seek index (``seekindex.py``), states given to ``from_state`` and the ends of
earlier requests. Nothing here depends on world size or rank. (The forward plan and its
inverse - which draw/windows hold a document - share one file: they share every helper.)
"""
from __future__ import annotations

import bisect
import threading

import numpy as np

from open1b_data.stream import rng
from open1b_data.errors import HeldOutError, StateMismatchError, StreamError
from open1b_data.stream.mixview import MixView
from open1b_data.stream.segments import SEG_FIELDS, Cursor, DrawInfo, Draws, Segment, Segments
from open1b_data.stream.state import BufferDoc, StreamState, differing_fields

__all__ = ["StreamPlan", "HeldOutError"]

CHUNK_DRAWS = 1 << 22       # draws planned per vectorized block when advancing far
CURSOR_CACHE = 4096


class StreamPlan:
    """The plan of one built mix and seed (see module docstring)."""

    def __init__(self, view: MixView, seed: int | None = None, index=None) -> None:
        self.view = view
        self.seed = view.seed if seed is None else int(seed)
        if not 0 <= self.seed < 2**64:
            raise StreamError(f"seed must be in [0, 2^64), got {self.seed!r}")
        self.window: int = view.window
        self.fingerprint: str = view.fingerprint
        self.sources: tuple[str, ...] = view.names
        # documents the stream draws from: a source's held-out ones are never drawn
        self.documents = np.array([s.train_documents for s in view.sources], dtype=np.int64)
        for sv, w in zip(view.sources, view.weights):
            if w > 0 and sv.train_documents == 0:     # STREAM.md section 3: not defined
                raise StreamError(f"source {sv.name!r} of mix {view.name!r} has a weight but "
                                  f"no document to train on: all {sv.documents} are held "
                                  f"out; the stream is not defined - give the source a "
                                  f"smaller held-out fraction and rebuild the mix")
        self.mix_key = rng.derive_key("mix", self.seed)
        self._cum_w = np.cumsum(np.array(view.weights, dtype=np.uint64))
        w = np.array(view.weights, dtype=np.float64)
        mean = np.array([s.tokens / max(s.documents, 1) for s in view.sources])
        self._tokens_per_draw = float((w * (mean + 1)).sum() / w.sum())  # chunk sizing only
        self._order_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._cursors: list[tuple[int, Cursor]] = []
        self._lock = threading.Lock()
        self.index = None
        if index is not None:
            self.attach_index(index)

    @classmethod
    def open(cls, mix_url: str, seed: int | None = None, use_index: bool = True,
             build_index: bool = False) -> "StreamPlan":
        """Plan of the built mix at ``mix_url`` (seed None = the mix's seed). With
        ``use_index`` a seek index found under ``<mix>/stream/`` is verified and used; with
        ``build_index`` a missing one is built and saved first (``seekindex.ensure``: one
        pass over the schedule's windows, ~1-1.5 min at Open-1B scale)."""
        plan = cls(MixView.open(mix_url), seed)
        if use_index or build_index:
            from open1b_data.stream import seekindex

            idx = seekindex.find(plan)
            if idx is None and build_index:
                idx = seekindex.ensure(plan)
            if idx is not None:
                plan.attach_index(idx)
        return plan

    def attach_index(self, index) -> None:
        if index.fingerprint != self.fingerprint or index.seed != self.seed:
            raise StateMismatchError(
                f"seek index for fingerprint {index.fingerprint[:16]}... seed {index.seed} "
                f"does not belong to this mix ({self.fingerprint[:16]}..., seed {self.seed})")
        self.index = index

    # ------------------------------------------------------------------ document order

    def shard_order(self, source: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(shards in epoch order, cumulative document counts in that order, len n+1)."""
        key = (source, epoch)
        hit = self._order_cache.get(key)
        if hit is None:
            sv = self.view.sources[source]
            k = rng.derive_key("shard-order", self.seed, sv.name, epoch)
            order = rng.permutation(k, sv.shards)
            docs = np.array(sv.shard_train, dtype=np.int64)
            cum = np.concatenate([[0], np.cumsum(docs[order])]).astype(np.int64)
            hit = (order, cum)
            if len(self._order_cache) > 256:
                self._order_cache.clear()
            self._order_cache[key] = hit
        return hit

    def doc_key(self, source: int, epoch: int, shard: int) -> int:
        return rng.derive_key("doc-order", self.seed, self.view.sources[source].name, epoch,
                              shard)

    def lookup(self, source: int, ordinal: np.ndarray, ids: bool = True):
        """The documents of source ``source`` at draw ordinals ``ordinal`` (ascending):
        (epoch, shard, doc, length) int64 arrays; with ``ids=False`` only the lengths
        (the others None) - all that advancing through the stream needs."""
        n = ordinal.shape[0]
        out = [np.empty(n, dtype=np.int64) if ids or c == 3 else None for c in range(4)]
        if n == 0:
            return tuple(out)
        d = int(self.documents[source])
        if d == 0:
            raise StreamError(f"source {self.sources[source]!r} has no documents"
                              + (" to train on (all held out)" if
                                 self.view.sources[source].heldout else ""))
        sv = self.view.sources[source]
        epoch = ordinal // d
        pos = ordinal - epoch * d
        ep_cuts = np.flatnonzero(np.diff(epoch)) + 1
        for lo, hi in zip(np.r_[0, ep_cuts], np.r_[ep_cuts, n]):
            e = int(epoch[lo])
            order, cum = self.shard_order(source, e)
            p = pos[lo:hi]
            j = np.searchsorted(cum, p, side="right") - 1
            cuts = np.flatnonzero(np.diff(j)) + 1
            for a, b in zip(np.r_[0, cuts], np.r_[cuts, hi - lo]):
                jj = int(j[a])
                h = int(order[jj])
                q = p[a:b] - cum[jj]
                docs = sv.train_rows(h, rng.feistel_permute(self.doc_key(source, e, h), q,
                                                            int(cum[jj + 1] - cum[jj])))
                if ids:
                    out[0][lo + a:lo + b] = e
                    out[1][lo + a:lo + b] = h
                    out[2][lo + a:lo + b] = docs
                out[3][lo + a:lo + b] = self.view.lengths(source, h)[docs]
        return tuple(out)

    def ordinal_of(self, source: int, shard: int, doc: int, epoch: int) -> int:
        """Inverse of ``lookup``: the draw ordinal k of (shard, doc) in ``epoch``."""
        sv = self.view.sources[source]
        if not 0 <= shard < sv.shards or not 0 <= doc < sv.shard_documents[shard]:
            raise StreamError(f"source {sv.name!r} has no document {doc} in shard {shard} "
                              f"({sv.shards} shards)")
        index = sv.train_index(shard, doc)
        if index is None:
            raise HeldOutError(f"document {doc} of shard {shard} of source {sv.name!r} is "
                               f"held out (STREAM.md section 10): the stream never draws it")
        order, cum = self.shard_order(source, epoch)
        j = int(rng.feistel_invert(rng.derive_key("shard-order", self.seed, sv.name, epoch),
                                   [shard], sv.shards)[0])
        q = int(rng.feistel_invert(self.doc_key(source, epoch, shard), [index],
                                   sv.shard_train[shard])[0])
        return epoch * int(self.documents[source]) + int(cum[j]) + q

    # ------------------------------------------------------------------ draws

    def source_choices(self, first: int, count: int) -> np.ndarray:
        """The sources of draws ``first .. first+count-1`` (int64 indices)."""
        x = rng.bounded_range(self.mix_key, first, count, int(self._cum_w[-1]))
        return np.searchsorted(self._cum_w, x, side="right").astype(np.int64)

    def draws(self, first: int, consumed: tuple[int, ...], count: int, start_pos: int,
              ids: bool = True) -> Draws:
        """Draws ``first .. first+count-1`` given the per-source counts before ``first``;
        ``start_pos`` is the token position of draw ``first``. With ``ids=False`` only
        ``source``, ``length`` and ``start`` are filled (the rest None)."""
        src = self.source_choices(first, count)
        ordinal = np.empty(count, dtype=np.int64) if ids else None
        cols = [np.empty(count, dtype=np.int64) if ids or c == 3 else None for c in range(4)]
        for s in range(len(self.sources)):
            idx = np.flatnonzero(src == s)
            if idx.size == 0:
                continue
            k = np.arange(consumed[s], consumed[s] + idx.size, dtype=np.int64)
            if ids:
                ordinal[idx] = k
            for col, vals in zip(cols, self.lookup(s, k, ids)):
                if col is not None:
                    col[idx] = vals
        start = np.empty(count + 1, dtype=np.int64)
        start[0] = start_pos
        np.cumsum(cols[3] + 1, out=start[1:])
        start[1:] += start_pos
        return Draws(first, src, ordinal, *cols, start)

    def _chunk_for(self, tokens: int) -> int:
        return int(min(CHUNK_DRAWS, max(64, tokens / self._tokens_per_draw * 1.1 + 64)))

    def _cursor_in(self, blk: Draws, base: Cursor, i: int, pos: int) -> Cursor:
        """Cursor at token ``pos`` inside draw ``blk.first + i``."""
        counts = np.bincount(blk.source[:i], minlength=len(self.sources))
        return Cursor(pos, blk.first + i, pos - int(blk.start[i]),
                      tuple(int(c) + int(n) for c, n in zip(base.consumed, counts)))

    def _blocks(self, cur: Cursor, end_pos: int | None = None, end_draw: int | None = None,
                ids: bool = True):
        """Yield (cursor, Draws) blocks from ``cur`` until a block reaches token ``end_pos``
        (or contains draw ``end_draw``); the cursor's counts refer to the block's first draw.
        ``ids=False``: blocks carry only sources and lengths (for advancing)."""
        while True:
            if end_pos is not None:
                n = self._chunk_for(end_pos - cur.pos)
            else:
                n = max(64, min(CHUNK_DRAWS, end_draw - cur.draw + 1))
            blk = self.draws(cur.draw, cur.consumed, n, cur.pos - cur.offset, ids)
            yield cur, blk
            if (blk.start[-1] > end_pos) if end_pos is not None else (end_draw < cur.draw + n):
                return
            counts = np.bincount(blk.source, minlength=len(self.sources))
            cur = Cursor(int(blk.start[-1]), cur.draw + n, 0,
                         tuple(int(c) + int(k) for c, k in zip(cur.consumed, counts)))

    # ------------------------------------------------------------------ cursors

    def origin(self) -> Cursor:
        return Cursor(0, 0, 0, (0,) * len(self.sources))

    def _remember(self, cur: Cursor) -> None:
        with self._lock:   # plans may be shared with a loader's prefetch thread
            i = bisect.bisect_left(self._cursors, cur.pos, key=lambda t: t[0])
            if i < len(self._cursors) and self._cursors[i][0] == cur.pos:
                return
            self._cursors.insert(i, (cur.pos, cur))
            if len(self._cursors) > CURSOR_CACHE:
                del self._cursors[0]

    def _known_before(self, pos: int) -> Cursor:
        best = self.origin()
        if self.index is not None:
            c = self.index.cursor_before(pos)
            if c is not None and c.pos > best.pos:
                best = c
        with self._lock:
            i = bisect.bisect_right(self._cursors, pos, key=lambda t: t[0])
            if i and self._cursors[i - 1][0] > best.pos:
                best = self._cursors[i - 1][1]
        return best

    def cursor_at(self, m: int) -> Cursor:
        """The cursor at the first token of window m."""
        self._check_window(m)
        pos = m * self.window
        cur = self._known_before(pos)
        if cur.pos == pos:
            return cur
        for base, blk in self._blocks(cur, pos, ids=False):
            if blk.start[-1] > pos:
                i = int(np.searchsorted(blk.start, pos, side="right")) - 1
                found = self._cursor_in(blk, base, i, pos)
                self._remember(found)
                return found
        raise AssertionError("unreachable")

    def _check_window(self, m: int) -> None:
        if not isinstance(m, (int, np.integer)) or m < 0:
            raise StreamError(f"window index must be an integer >= 0, got {m!r}")

    # ------------------------------------------------------------------ segments

    def segments_range(self, a: int, b: int) -> Segments:
        """Every segment of windows a .. b-1, vectorized, ordered by (window, draw). Memory
        is ~100 bytes per segment (3-4 per window at Open-1B): ask in chunks of <= 1e6
        windows; consecutive chunks continue from the remembered cursor without replay."""
        self._check_window(a)
        if b < a:
            raise StreamError(f"window range [{a}, {b}) is empty or reversed")
        w = self.window
        lo, hi = a * w, b * w
        cur = self.cursor_at(a)
        parts = []
        for base, blk in self._blocks(cur, hi):
            parts.append(self._cut(blk, lo, hi))
        if b > a:   # remember where the next request will start (sequential readers)
            i = int(np.searchsorted(blk.start, hi, side="right")) - 1
            self._remember(self._cursor_in(blk, base, i, hi))
        if len(parts) == 1:
            return parts[0]
        return Segments(*(np.concatenate([getattr(p, f) for p in parts]) for f in SEG_FIELDS))

    def _cut(self, blk: Draws, lo: int, hi: int) -> Segments:
        w = self.window
        s, e = blk.start[:-1], blk.start[1:]
        sel = np.flatnonzero((e > lo) & (s < hi))
        s, e = s[sel], e[sel]
        first_w = np.maximum(s, lo) // w
        last_w = (np.minimum(e, hi) - 1) // w
        reps = last_w - first_w + 1
        rep = np.repeat(np.arange(sel.size), reps)
        within = np.arange(rep.size) - np.repeat(np.cumsum(reps) - reps, reps)
        win = first_w[rep] + within
        seg_lo = np.maximum(s[rep], win * w)
        seg_hi = np.minimum(e[rep], (win + 1) * w)
        d = sel[rep]
        return Segments(window=win, draw=blk.first + d, source=blk.source[d],
                        shard=blk.shard[d], doc=blk.doc[d], epoch=blk.epoch[d],
                        doc_start=seg_lo - s[rep], length=seg_hi - seg_lo,
                        window_offset=seg_lo - win * w, doc_length=blk.length[d])

    def segments(self, m: int) -> list[Segment]:
        """The segments of window m, in order (doc_id left None: content code fills it)."""
        return self.segments_range(m, m + 1).to_list(self.sources)

    # ------------------------------------------------------------------ state

    def state_at(self, m: int) -> StreamState:
        """The resumable state just before window m."""
        return self.state_of(self.cursor_at(m), m)

    def state_of(self, cur: Cursor, m: int) -> StreamState:
        consumed = list(cur.consumed)
        buffer = None
        next_draw = cur.draw
        if cur.offset:
            blk = self.draws(cur.draw, cur.consumed, 1, cur.pos - cur.offset)
            s = int(blk.source[0])
            consumed[s] += 1
            next_draw += 1
            buffer = BufferDoc(self.sources[s], int(blk.shard[0]), int(blk.doc[0]),
                               int(blk.epoch[0]), int(blk.length[0]), cur.offset)
        return StreamState(self.fingerprint, self.seed, self.window, m, next_draw,
                           self.sources, tuple(int(d) for d in self.documents),
                           tuple(consumed), buffer)

    def from_state(self, state: StreamState) -> int:
        """Check ``state`` against this mix (fingerprint, seed, sources, that its per-source
        counts are what the mix RNG's draws give - counted from the nearest known cursor,
        so O(K) with a seek index - and that its buffer is the document its draw counter
        gives), that it is exactly the state the stream has at its window - every field,
        the packing buffer's offset included, re-derived from the draws - and return its
        window index. A state is never trusted as a seek point: a record whose offset was
        edited would otherwise shift the content of every later window."""
        state.check_mix(self.fingerprint, self.seed, self.sources)
        if state.window_tokens != self.window:
            raise StateMismatchError(f"state window {state.window_tokens} tokens, mix window "
                                     f"{self.window}")
        consumed = list(state.consumed)
        draw = state.next_draw
        if state.buffer is not None:
            b = state.buffer
            s = self.sources.index(b.source)
            consumed[s] -= 1
            draw -= 1
            blk = self.draws(draw, tuple(consumed), 1, 0)
            got = (self.sources[int(blk.source[0])], int(blk.shard[0]), int(blk.doc[0]),
                   int(blk.epoch[0]), int(blk.length[0]))
            if got != (b.source, b.shard, b.doc, b.epoch, b.length) or consumed[s] < 0:
                raise StateMismatchError(
                    f"stream state buffer {b.to_dict()} is not what draw {draw} gives "
                    f"({got}); the state is corrupt or from another stream definition")
        base = self._known_before_draw(draw)   # per-source counts must match the draws
        counts = np.bincount(self.source_choices(base.draw, draw - base.draw),
                             minlength=len(self.sources))
        want = tuple(int(c) + int(n) for c, n in zip(base.consumed, counts))
        if want != tuple(consumed):
            raise StateMismatchError(f"stream state counts {state.consumed} disagree with the "
                                     f"mix RNG's first {state.next_draw} draws; the state is "
                                     f"corrupt")
        derived = self.state_at(state.window).to_dict()
        diff = differing_fields(state.to_dict(), derived)
        if diff:
            f = diff[0]
            raise StateMismatchError(
                f"stream state at window {state.window}: {f[0]} is {f[1]!r}, the stream gives "
                f"{f[2]!r} there ({len(diff)} field(s) differ); the state was edited or is "
                f"corrupt - it is re-derived from (seed, mix), never trusted")
        return state.window

    # ------------------------------------------------------------------ reverse direction

    def draw_info(self, i: int) -> DrawInfo:
        """Which document draw i took and the windows it spans."""
        cur = self._known_before_draw(i)
        for _, blk in self._blocks(cur, end_draw=i):
            pass
        j = i - blk.first
        start, end = int(blk.start[j]), int(blk.start[j + 1])
        return DrawInfo(i, self.sources[int(blk.source[j])], int(blk.ordinal[j]),
                        int(blk.epoch[j]), int(blk.shard[j]), int(blk.doc[j]),
                        int(blk.length[j]), start, start // self.window,
                        (end - 1) // self.window)

    def draw_of(self, source: int, ordinal: int) -> int:
        """The draw i that is source ``source``'s ``ordinal``-th draw (k, from 0). Only the
        source choices are generated (no document lookups)."""
        cur = self._known_before_consumed(source, ordinal)
        first, need = cur.draw, ordinal - cur.consumed[source] + 1
        rate = self.view.weights[source] / self.view.total_weight
        while True:
            n = int(min(CHUNK_DRAWS, need / rate * 1.2 + 64))
            hits = np.flatnonzero(self.source_choices(first, n) == source)
            if hits.size >= need:
                return first + int(hits[need - 1])
            need -= hits.size
            first += n

    def _best(self, from_index: Cursor | None, ok) -> Cursor:
        """The known cursor with the highest draw satisfying ``ok`` (the origin always does)."""
        best = self.origin()
        with self._lock:
            known = [c for _, c in self._cursors]
        for c in [from_index] + known:
            if c is not None and c.draw > best.draw and ok(c):
                best = c
        return best

    def _known_before_draw(self, i: int) -> Cursor:
        idx = self.index.cursor_before_draw(i) if self.index is not None else None
        return self._best(idx, lambda c: c.draw <= i)

    def _known_before_consumed(self, s: int, k: int) -> Cursor:
        idx = self.index.cursor_before_consumed(s, k) if self.index is not None else None
        return self._best(idx, lambda c: c.consumed[s] <= k)

    def occurrences(self, source: int, shard: int, doc: int, a: int, b: int
                    ) -> list[DrawInfo]:
        """Every draw of document (source, shard, doc) with tokens in windows [a, b)
        (none for a held-out document)."""
        if (0 <= shard < self.view.sources[source].shards and
                self.view.sources[source].train_index(shard, doc) is None):
            return []
        lo, hi = self.cursor_at(a), self.cursor_at(b)
        first = lo.consumed[source]            # ordinals >= first (incl. the buffer doc)
        last = hi.consumed[source] + (1 if hi.offset else 0)
        d = int(self.documents[source])
        out: list[DrawInfo] = []
        if last <= first:
            return out
        for e in range(first // d, (last - 1) // d + 1):
            k = self.ordinal_of(source, shard, doc, e)
            if first <= k < last:
                info = self.draw_info(self.draw_of(source, k))
                if info.last_window >= a and info.first_window < b:
                    out.append(info)
        return out
