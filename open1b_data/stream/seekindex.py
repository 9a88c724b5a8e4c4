"""The seek index: the stream's cursor every K windows, built once per mix and seed so any
window is found without replaying the run.

Contract:
- Stored beside the mix: ``<mix>/stream/seek-<seed>-<K>.npz`` (arrays ``draw``, ``offset``
  int64 ``[n]`` and ``consumed`` int64 ``[n, sources]``; entry j is the cursor at window
  ``j*K``: draw counter, tokens of that draw already emitted, documents consumed per source
  before that draw) and ``seek-<seed>-<K>.json`` (format, version, stream definition, mix
  fingerprint, seed, K, windows covered, tokens per window, sources, sha256 of the .npz).
  The .npz is written first and the JSON last, each atomically, so a reader never sees a
  half-written index.
- ``load`` checks the format, version, definition, seed, sources, window, the .npz sha256
  and the fingerprint;
  an index of another mix or seed raises ``StateMismatchError``. ``find`` returns the
  valid index with the smallest K (stale ones are skipped with a warning), or None.
- How far an index is trusted. It is derived data that anyone who can write the mix can
  rewrite, header and sha256 included, and a wrong cursor would change the content of
  every window planned from it. So the cursors themselves are checked: on load, that the
  first is the stream's origin and that all are consistent (draw counters non-decreasing,
  per-source counts non-decreasing and summing to the draw counter); and before a cursor
  is first used, that replaying the stream from the entry before it (K windows, a few ms)
  arrives exactly at it. A failed check is a ``StreamError`` naming the file. Residual
  risk: a forger who rewrites two or more consecutive entries so that each follows from
  the one before passes the lazy check for the later ones (checking the whole chain is a
  full replay, the index's build cost). What an auditor checks is the window hashes a
  training run publishes, recomputed from the mix without any index (or with one they
  built); the index only makes lookups fast.
- Building is one vectorized forward pass of ``StreamPlan`` in blocks of draws, so memory
  stays bounded (a few hundred MB at Open-1B scale) whatever the run length. An index is
  an acceleration only: planning with and without it gives identical segments (tested).
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from open1b_data.stream import rng
from open1b_data.errors import StateMismatchError, StreamError
from open1b_data.stream.segments import Cursor
from open1b_data.storage import atomic_write_bytes, exists, join, read_bytes

FORMAT = "open1b-seek-index"
DEFINITION = rng.KEY_DOMAIN.decode()   # the stream definition the cursors were computed by
VERSION = 1
TARGET_ENTRIES = 100_000
log = logging.getLogger(__name__)


def default_windows(definition: dict) -> int:
    """Windows to cover: a bound on the windows the mix's schedule consumes (the stop
    token count in sequences, plus one largest batch for the step that crosses it)."""
    s = definition["schedule"]
    return -(-int(s["stop_tokens"]) // int(s["seq_tokens"])) + max(
        int(p["batch_sequences"]) for p in s["phases"])


def default_every(windows: int) -> int:
    """K: a power of two >= 64 giving at most ~TARGET_ENTRIES entries."""
    return max(64, 1 << max(0, math.ceil(math.log2(max(1, windows) / TARGET_ENTRIES))))


def paths(mix_url: str, seed: int, every: int) -> tuple[str, str]:
    base = join(mix_url, f"stream/seek-{seed}-{every}")
    return base + ".json", base + ".npz"


@dataclass(frozen=True)
class SeekIndex:
    fingerprint: str
    seed: int
    every: int
    windows: int                 # windows [0, windows) are covered
    window_tokens: int           # tokens per window (the mix's window)
    sources: tuple[str, ...]
    draw: np.ndarray
    offset: np.ndarray
    consumed: np.ndarray
    path: str = ""
    plan: object = field(default=None, compare=False, repr=False)   # checks cursors if set
    checked: set = field(default_factory=set, compare=False, repr=False)

    def _raw(self, j: int) -> Cursor:
        return Cursor(j * self.every * self.window_tokens, int(self.draw[j]),
                      int(self.offset[j]), tuple(int(c) for c in self.consumed[j]))

    def _cursor(self, j: int) -> Cursor:
        cur = self._raw(j)
        if j and self.plan is not None and j not in self.checked:
            want = replay_to(self.plan, _latest(self.plan, self._raw(j - 1), cur.pos),
                             cur.pos)
            if want != cur:
                raise StreamError(
                    f"seek index {self.path} entry {j} (window {j * self.every}) is {cur}, "
                    f"but the stream from entry {j - 1} arrives at {want}: the index was "
                    f"edited or corrupted. Delete seek-{self.seed}-{self.every}.json/.npz "
                    f"under the mix's stream/ directory; the next query rebuilds it")
            self.checked.add(j)
        return cur

    def cursor_before(self, pos: int):
        j = min(pos // (self.every * self.window_tokens), len(self.draw) - 1)
        return self._cursor(j) if j >= 0 else None

    def cursor_before_draw(self, i: int):
        j = int(np.searchsorted(self.draw, i, side="right")) - 1
        return self._cursor(j) if j >= 0 else None

    def cursor_before_consumed(self, s: int, k: int):
        # consumed[:, s] is non-decreasing; an entry whose count is <= k precedes draw k
        j = int(np.searchsorted(self.consumed[:, s], k, side="right")) - 1
        return self._cursor(j) if j >= 0 else None


def build(plan, windows: int | None = None, every: int | None = None, progress=None
          ) -> SeekIndex:
    """One forward pass over windows [0, windows), recording the cursor every K windows."""
    windows = default_windows(plan.view.definition) if windows is None else windows
    every = default_every(windows) if every is None else every
    if windows < 1 or every < 1:
        raise StreamError(f"seek index needs windows >= 1 and K >= 1, got {windows}, {every}")
    w = plan.window
    n = (windows - 1) // every + 1
    draw = np.empty(n, dtype=np.int64)
    offset = np.empty(n, dtype=np.int64)
    consumed = np.empty((n, len(plan.sources)), dtype=np.int64)
    targets = np.arange(n, dtype=np.int64) * every * w
    done = 0
    for base, blk in plan._blocks(plan.origin(), int(targets[-1]), ids=False):
        end = blk.start[-1]
        stop = int(np.searchsorted(targets, end, side="left"))   # targets inside this block
        if stop > done:
            t = targets[done:stop]
            i = np.searchsorted(blk.start, t, side="right") - 1
            draw[done:stop] = blk.first + i
            offset[done:stop] = t - blk.start[i]
            for s in range(len(plan.sources)):
                idx = np.flatnonzero(blk.source == s)
                consumed[done:stop, s] = base.consumed[s] + np.searchsorted(idx, i)
            done = stop
        if progress:
            progress(done, n)
    return SeekIndex(plan.fingerprint, plan.seed, every, windows, w, plan.sources, draw,
                     offset, consumed)


def replay_to(plan, cur: Cursor, pos: int) -> Cursor:
    """The cursor at token ``pos``, replayed from ``cur`` (lengths only, no document ids)."""
    if cur.pos == pos:
        return cur
    for base, blk in plan._blocks(cur, pos, ids=False):
        if blk.start[-1] > pos:
            i = int(np.searchsorted(blk.start, pos, side="right")) - 1
            return plan._cursor_in(blk, base, i, pos)
    raise AssertionError("unreachable")


def _latest(plan, prev: Cursor, pos: int) -> Cursor:
    """Where to replay from to check the entry at ``pos``: the entry before it, or a cursor
    the plan reached after it (a sequential reader has one just before ``pos``)."""
    with plan._lock:
        known = [c for p, c in plan._cursors if prev.pos < p <= pos]
    return max(known, key=lambda c: c.pos, default=prev)


def _check_entries(path: str, draw: np.ndarray, offset: np.ndarray,
                   consumed: np.ndarray) -> None:
    """The structural checks of ``load`` (see module docstring)."""
    bad = []
    if draw.shape[0] and (draw[0] != 0 or offset[0] != 0 or consumed[0].any()):
        bad.append("entry 0 is not the stream's origin")
    if (np.diff(draw) < 0).any() or (np.diff(consumed, axis=0) < 0).any():
        bad.append("its counters go backwards")
    if (consumed.sum(axis=1) != draw).any() or (offset < 0).any():
        bad.append("its per-source counts do not add up to its draw counters")
    if bad:
        raise StreamError(f"seek index {path}: {'; '.join(bad)}; the index was edited or "
                          f"corrupted - delete it (and its .json) and rebuild it")


def save(index: SeekIndex, mix_url: str) -> str:
    jpath, npath = paths(mix_url, index.seed, index.every)
    buf = io.BytesIO()
    np.savez(buf, draw=index.draw, offset=index.offset, consumed=index.consumed)
    raw = buf.getvalue()
    atomic_write_bytes(npath, raw)
    header = {"format": FORMAT, "version": VERSION, "definition": DEFINITION,
              "fingerprint": index.fingerprint,
              "seed": index.seed, "every": index.every, "windows": index.windows,
              "window_tokens": index.window_tokens,
              "entries": int(index.draw.shape[0]), "sources": list(index.sources),
              "npz_sha256": hashlib.sha256(raw).hexdigest()}
    atomic_write_bytes(jpath, json.dumps(header, sort_keys=True, indent=1).encode())
    return jpath


def load(plan, mix_url: str, every: int) -> SeekIndex:
    jpath, npath = paths(mix_url, plan.seed, every)
    try:
        h = json.loads(read_bytes(jpath))
    except (OSError, ValueError) as e:
        raise StreamError(f"cannot read seek index {jpath}: {e}") from None
    if (h.get("format"), h.get("version"), h.get("definition")) != (FORMAT, VERSION,
                                                                     DEFINITION):
        raise StreamError(f"{jpath} is not a version-{VERSION} {FORMAT} file of stream "
                          f"definition {DEFINITION!r}; rebuild it")
    if h["fingerprint"] != plan.fingerprint or h["seed"] != plan.seed:
        raise StateMismatchError(
            f"seek index {jpath} was built for fingerprint {h['fingerprint'][:16]}... seed "
            f"{h['seed']}, this mix is {plan.fingerprint[:16]}... seed {plan.seed}; delete "
            f"it and rebuild with seekindex.ensure")
    if tuple(h["sources"]) != plan.sources or h["window_tokens"] != plan.window:
        raise StateMismatchError(f"seek index {jpath} sources {h['sources']} / window "
                                 f"{h['window_tokens']} differ from the mix's "
                                 f"{list(plan.sources)} / {plan.window}")
    raw = read_bytes(npath)
    if hashlib.sha256(raw).hexdigest() != h["npz_sha256"]:
        raise StreamError(f"seek index data {npath} does not match its header's sha256; "
                          f"delete both files and rebuild")
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        draw, offset, consumed = z["draw"], z["offset"], z["consumed"]
    if draw.shape != (h["entries"],) or consumed.shape != (h["entries"], len(plan.sources)):
        raise StreamError(f"seek index {npath}: array shapes do not match the header")
    _check_entries(npath, draw, offset, consumed)
    return SeekIndex(h["fingerprint"], h["seed"], h["every"], h["windows"],
                     h["window_tokens"], tuple(h["sources"]), draw, offset, consumed,
                     path=npath, plan=plan)


def find(plan) -> SeekIndex | None:
    """The valid seek index with the smallest K under ``<mix>/stream/``, or None."""
    from open1b_data.storage import url_to_fs

    fs, root = url_to_fs(join(plan.view.mix_url, "stream"))
    try:
        names = fs.ls(root, detail=False)
    except (FileNotFoundError, OSError):
        return None
    prefix = f"seek-{plan.seed}-"
    ks = sorted(int(n.rsplit("/", 1)[-1][len(prefix):-5]) for n in names
                if n.rsplit("/", 1)[-1].startswith(prefix) and n.endswith(".json")
                and n.rsplit("/", 1)[-1][len(prefix):-5].isdigit())
    for k in ks:
        try:
            return load(plan, plan.view.mix_url, k)
        except StreamError as e:
            log.warning("ignoring seek index K=%d: %s", k, e)
    return None


def ensure(plan, windows: int | None = None, every: int | None = None,
           progress=None) -> SeekIndex:
    """Load the index for (mix, seed, K) or build and save it; attach it to ``plan``."""
    mix_url = plan.view.mix_url
    windows = default_windows(plan.view.definition) if windows is None else windows
    every = default_every(windows) if every is None else every
    idx = None
    if exists(paths(mix_url, plan.seed, every)[0]):
        try:
            idx = load(plan, mix_url, every)
            if idx.windows < windows:
                idx = None
        except StreamError as e:
            log.warning("rebuilding seek index: %s", e)
            idx = None
    if idx is None:
        idx = build(plan, windows, every, progress)
        save(idx, mix_url)
    plan.attach_index(idx)
    return idx
