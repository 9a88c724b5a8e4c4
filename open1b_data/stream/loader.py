"""The training loader: the micro-batches of one rank, or of a range of ranks, from the
stream; resumable, and shardable over ``DataLoader`` worker processes.

Contract: ``StreamLoader(mix, rank=r, world=R)`` - or ``ranks=range(a, b)`` for the ranks
``a .. b-1`` of a logical mesh of ``R`` ranks served by one process; exactly one of ``rank``
and ``ranks`` - is a ``torch.utils.data.IterableDataset``. Iterating yields, for steps
``start_step .. end_step`` of the mix's schedule (``schedule.py``), in this order: for each
step, for each rank ascending, that rank's micro-batches ``j = 0 .. accumulation - 1``
(the windows of ``Schedule.rank_plan(step, world, rank)``). Each is a dict:

* ``input_ids``, ``labels``: int64 tensors ``[micro_batch, window - 1]``, a window's first
  and last ``window - 1`` tokens (views of one ``[micro_batch, window]`` tensor);
* ``step``, ``rank``, ``micro_batch`` (j), ``accumulation``, ``windows`` (stream window ids).

Rank r loads window m iff ``m mod R == r``; nothing else depends on R.

Worker processes (``DataLoader(loader, batch_size=None, num_workers=W)``, or torchdata's
``StatefulDataLoader``): worker w of W yields the items ``i`` with ``i mod W == w`` of the
sequence the loader yields without workers, counted from where the loader stands when the
workers start. ``DataLoader`` asks its workers in turn, round-robin (also with
``prefetch_factor`` and ``persistent_workers``), so its output is that sequence exactly.
A worker plans and reads only for its own items.

Reading: a background thread plans the stream about a thousand windows at a time (the plan's
cost per call is amortized), fills each step's micro-batches of this loader (or worker) with
one call (``windows.py``: each segment's slice copied straight into the int64 output) and
keeps ``prefetch`` micro-batches ready; whole shards are checked against the manifest,
decoded once, and the next shard of each source is decoded ahead in another thread
(``shardreader.py``). The plan is not thread-safe: the threads and ``state_dict`` share it
under one lock.

State (``state_dict``; JSON-able): ``{"format": "open1b-loader-state", "version": 2,
"world", "ranks": [a, b], "step", "item", "stream", "worker"}`` - the next micro-batch to
yield is item ``item`` of ``step`` (items of a step counted in the order above), ``stream``
is the stream state record (``state.py``) at the first window of that step, which carries
the mix fingerprint: ``load_state_dict`` refuses another mix or seed
(``StateMismatchError``) and checks that the record is at that step. A state taken at a step
boundary (``item == 0``, no worker) resumes on any world and ranks; a mid-step state only
on the same world and ranks. ``worker`` is null, or ``{"id": w, "workers": W}`` in a state
taken inside DataLoader worker w (its own next item; ``StatefulDataLoader`` saves one per
worker and gives each back to its worker); such a state loads only into that worker of a
loader with W workers. Version-1 states (one ``rank``, ``micro_batch``) still load.
"""
from __future__ import annotations

import bisect
import os
import queue
import threading
from typing import Any

import numpy as np

from open1b_data.errors import StateMismatchError, StreamError
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.schedule import Schedule
from open1b_data.stream.state import StreamState
from open1b_data.stream.windows import WindowReader

FORMAT = "open1b-loader-state"
VERSION = 2
CHUNK_WINDOWS = 1024    # windows planned per request (whole steps; at least one)

try:
    from torch.utils.data import IterableDataset as _Base
except ImportError:     # pragma: no cover - torch is a dependency; keep the module importable
    _Base = object


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    """Put unless the consumer has gone away (then never block: the thread must end)."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _worker() -> tuple[int, int]:
    """(this DataLoader worker's id, number of workers); (0, 1) outside workers."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:     # pragma: no cover
        return 0, 1
    info = get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


def _rank_range(rank: int | None, ranks, world: int) -> range:
    """The ranks a loader serves, from ``rank=`` or ``ranks=`` (not both; neither = 0)."""
    if rank is not None and ranks is not None:
        raise StreamError(f"give exactly one of rank= (one rank) or ranks= (a range of "
                          f"ranks), got rank={rank!r} and ranks={ranks!r}")
    rs = [0 if rank is None else rank] if ranks is None else list(ranks)
    if (not rs or any(isinstance(r, bool) or not isinstance(r, int) for r in rs) or
            rs != list(range(rs[0], rs[0] + len(rs)))):
        raise StreamError(f"ranks must be a non-empty, contiguous, ascending range of "
                          f"integers in [0, {world}) (e.g. range(0, {world})), got "
                          f"{rank if ranks is None else ranks!r}")
    return range(rs[0], rs[-1] + 1)


class StreamLoader(_Base):
    """Micro-batches of ranks ``ranks`` (or ``rank``) of ``world`` (see module docstring)."""

    def __init__(self, mix: str | StreamPlan, rank: int | None = None, world: int = 1,
                 start_step: int = 1, end_step: int | None = None, prefetch: int = 4,
                 cache_shards: int | None = None, ranks=None) -> None:
        self.plan = mix if isinstance(mix, StreamPlan) else StreamPlan.open(mix)
        self.schedule = Schedule.from_definition(self.plan.view.definition)
        self.world = int(world)
        self.ranks = _rank_range(rank, ranks, self.world)
        self.rank = self.ranks[0]
        self.end_step = self.schedule.last_step if end_step is None else int(end_step)
        self.schedule.step(self.end_step)          # checks the range
        for r in (self.ranks[0], self.ranks[-1]):  # checks world and ranks
            self.schedule.rank_plan(start_step, self.world, r)
        for run in self.schedule.runs:      # fail now, not mid-run, if a later batch won't fit
            if run.first_step + run.steps > start_step and run.first_step <= self.end_step:
                self.schedule.accumulation(max(run.first_step, start_step), self.world)
        self.prefetch = max(1, int(prefetch))
        self.cache_shards = 2 if cache_shards is None else cache_shards
        self._step, self._item = int(start_step), 0
        self._share: tuple[int, int] | None = None   # (w, W) once the position is worker w's
        self._records: dict[int, dict] = {}          # step -> stream record at its start
        self._run_steps = [r.first_step for r in self.schedule.runs]
        self._setup()

    def _setup(self) -> None:
        """What a process must not share with another: threads, locks, caches."""
        self._lock = threading.Lock()
        self._plan_lock = threading.Lock()     # the plan's cursor cache is not thread-safe
        self.reader = WindowReader(self.plan, whole_shards=True, readahead=True,
                                   cache_shards=self.cache_shards, plan_lock=self._plan_lock)
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        """Picklable for spawned DataLoader workers: the plan is reopened from its mix."""
        d = {k: v for k, v in self.__dict__.items()
             if k not in ("reader", "_lock", "_plan_lock", "plan")}
        d["_mix"] = (self.plan.view.mix_url, self.plan.seed)
        return d

    def __setstate__(self, d: dict) -> None:
        mix_url, seed = d.pop("_mix")
        self.__dict__.update(d)
        self.plan = StreamPlan.open(mix_url, seed=seed)
        self._setup()

    # ------------------------------------------------------------------ positions

    # Step arithmetic from the schedule's runs: ``Schedule.step`` also evaluates the
    # learning rate (an exact cosine), far too slow to call per micro-batch.

    def _run(self, step: int):
        return self.schedule.runs[bisect.bisect_right(self._run_steps, step) - 1]

    def _accumulation(self, step: int) -> int:
        acc, rest = divmod(self._run(step).batch, self.world * self.schedule.spec.micro_batch)
        if rest or step > self.schedule.last_step:
            return self.schedule.accumulation(step, self.world)    # raises, saying why
        return acc

    def _first_window(self, step: int) -> int:
        if step > self.schedule.last_step:
            return self.schedule.total_windows
        r = self._run(step)
        return r.tokens_before // self.schedule.spec.seq_tokens + (step - r.first_step) * r.batch

    def _windows(self, step: int, rank: int, j: int) -> tuple[int, ...]:
        """Micro-batch j of ``rank`` in ``step``: ``Schedule.rank_plan``'s rule (tested
        equal), without its learning rate."""
        first, mb = self._first_window(step), self.schedule.spec.micro_batch
        start = first + (rank - first) % self.world + j * mb * self.world
        return tuple(range(start, start + mb * self.world, self.world))

    def _items(self, step: int) -> int:
        """This loader's micro-batches in ``step`` (all its ranks)."""
        return len(self.ranks) * self._accumulation(step)

    def _advance(self, step: int, item: int, n: int) -> tuple[int, int]:
        """The position ``n`` items after (step, item); past ``end_step`` it stays in the
        step after it (where a loader running longer would continue)."""
        item += n
        while step <= self.end_step and item >= self._items(step):
            item -= self._items(step)
            step += 1
        return step, item

    def __len__(self) -> int:
        """Micro-batches left to yield from the current position (all workers together)."""
        n = 0
        for r in self.schedule.runs:
            a, b = max(r.first_step, self._step), min(r.first_step + r.steps - 1, self.end_step)
            if a <= b:
                n += (b - a + 1) * self._items(a)
        return max(0, n - self._item)

    # ------------------------------------------------------------------ iteration

    def _chunks(self, step: int):
        """Consecutive runs of steps from ``step`` to ``end_step``, each covering at least
        ``CHUNK_WINDOWS`` windows (or the rest)."""
        while step <= self.end_step:
            first = self._first_window(step)
            last = step
            while (last < self.end_step and
                    self._first_window(last + 1) - first < CHUNK_WINDOWS):
                last += 1
            yield step, last
            step = last + 1

    def _produce(self, q: queue.Queue, stop: threading.Event, step: int, item: int,
                 stride: int) -> None:
        try:
            for a, b in self._chunks(step):
                with self._plan_lock:
                    segs = self.plan.segments_range(self._first_window(a),
                                                    self._first_window(b + 1))
                for s in range(a, b + 1):
                    n = self._items(s)
                    ks = list(range(item, n, stride))
                    item = (ks[-1] + stride if ks else item) - n
                    if not ks:
                        continue
                    acc = self._accumulation(s)
                    wins = [self._windows(s, self.ranks[k // acc], k % acc) for k in ks]
                    toks = self.reader.fill_windows(segs, [m for w in wins for m in w],
                                                    np.int64)
                    mb = self.schedule.spec.micro_batch
                    for i, (k, w) in enumerate(zip(ks, wins)):
                        out = (s, k, self.ranks[k // acc], k % acc, acc, w,
                               toks[i * mb:(i + 1) * mb])
                        if not _put(q, out, stop):
                            return
            _put(q, None, stop)
        except BaseException as e:   # hand any failure to the consumer, which re-raises it
            _put(q, e, stop)

    def _begin(self) -> tuple[int, int, int]:
        """(step, item, stride) of this iterator; in a DataLoader worker, its own share."""
        if self._pid != os.getpid():      # a forked worker: none of the parent's threads
            self._setup()
        w, W = _worker()
        with self._lock:
            if W > 1 and self._share != (w, W):
                if self._share is not None:
                    raise StreamError(f"this loader's position belongs to DataLoader worker "
                                      f"{self._share[0]} of {self._share[1]}, not worker {w} "
                                      f"of {W}")
                self._step, self._item = self._advance(self._step, self._item, w)
                self._share = (w, W)
            return self._step, self._item, W

    def __iter__(self):
        import torch

        step, item, stride = self._begin()
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        t = threading.Thread(target=self._produce, args=(q, stop, step, item, stride),
                             name=f"open1b-loader-r{self.rank}", daemon=True)
        t.start()
        try:
            while True:
                got = q.get()
                if got is None:
                    return
                if isinstance(got, BaseException):
                    raise got
                s, k, r, j, acc, wins, toks = got
                t64 = torch.from_numpy(toks)
                with self._lock:
                    self._step, self._item = self._advance(s, k, stride)
                yield {"input_ids": t64[:, :-1], "labels": t64[:, 1:], "step": s, "rank": r,
                       "micro_batch": j, "accumulation": acc, "windows": list(wins)}
        finally:
            stop.set()
            t.join()
            self.reader.close()     # the readahead thread too; the decoded shards stay

    # ------------------------------------------------------------------ state

    def _record(self, step: int) -> dict:
        """The stream state record at the first window of ``step`` (memoized)."""
        hit = self._records.get(step)
        if hit is None:
            with self._plan_lock:
                hit = self.plan.state_at(self._first_window(step)).to_dict()
            if len(self._records) > 64:
                self._records.clear()
            self._records[step] = hit
        return hit

    def state_dict(self) -> dict[str, Any]:
        """Position of the next micro-batch to yield (see module docstring)."""
        w, W = _worker()
        with self._lock:
            step, item, share = self._step, self._item, self._share
        if W > 1 and share is None:        # a worker that has not started: its first item
            step, item = self._advance(step, item, w)
            share = (w, W)
        return {"format": FORMAT, "version": VERSION, "world": self.world,
                "ranks": [self.ranks[0], self.ranks[-1] + 1], "step": step, "item": item,
                "stream": self._record(step),
                "worker": None if share is None else {"id": share[0], "workers": share[1]}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (refuses another mix, seed, or an incompatible topology)."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise StreamError(f"not an open1b loader state (format "
                              f"{state.get('format') if isinstance(state, dict) else state!r},"
                              f" expected {FORMAT!r})")
        if state.get("version") not in (1, VERSION):
            raise StreamError(f"loader state version {state.get('version')!r} is not "
                              f"{VERSION}; it was written by another open1b version")
        if state["version"] == 1:
            r = int(state["rank"])
            state = {**state, "ranks": [r, r + 1], "item": state["micro_batch"],
                     "worker": None}
        step, item = int(state["step"]), int(state["item"])
        ranks = tuple(int(r) for r in state["ranks"])
        share = state.get("worker")
        here = (state["world"], ranks)
        mine = (self.world, (self.ranks[0], self.ranks[-1] + 1))
        stream = StreamState.from_dict(state["stream"])
        with self._plan_lock:
            at = self.plan.from_state(stream)   # fingerprint/seed/sources checked here
        expected = self._first_window(step)
        if at != expected:
            raise StateMismatchError(f"loader state says step {step} but its stream record "
                                     f"is at window {at}, not the step's first window "
                                     f"{expected}; the state is corrupt")
        if (item or share) and here != mine:
            raise StreamError(
                f"this state is in the middle of step {step} (item {item}) of ranks "
                f"{ranks[0]}..{ranks[1] - 1} of world {state['world']}; it can only resume "
                f"on those ranks and world. States taken at a step boundary resume on any "
                f"world size")
        w, W = _worker()
        if share is not None and (int(share["id"]), int(share["workers"])) != (w, W):
            raise StreamError(
                f"this state is DataLoader worker {share['id']} of {share['workers']}'s "
                f"share of the stream, and this loader is "
                + ("not in a worker" if W == 1 else f"worker {w} of {W}") +
                "; save and load the StatefulDataLoader's state (it holds every worker's), "
                f"with num_workers={share['workers']}")
        if step <= self.end_step and item >= self._items(step):
            raise StreamError(f"item {item} out of range for step {step} "
                              f"({self._items(step)} micro-batches on these ranks)")
        with self._lock:
            self._step, self._item = step, item
            self._share = None if share is None else (w, W)
            self._records[step] = stream.to_dict()


def step_boundary_state(plan: StreamPlan, world: int, step: int) -> dict[str, Any]:
    """The state of a loader serving all ``world`` ranks, standing at the start of ``step``
    (past the last step: at the end of the schedule) - what ``state_dict`` gives there.
    A pure function of (seed, mix, step): a resume or an audit replay derives it and
    compares a stored one with it, never trusting the stored one."""
    sched = Schedule.from_definition(plan.view.definition)
    first = sched.total_windows if step > sched.last_step else sched.step(step).first_window
    return {"format": FORMAT, "version": VERSION, "world": int(world), "ranks": [0, int(world)],
            "step": int(step), "item": 0, "stream": plan.state_at(first).to_dict(),
            "worker": None}

