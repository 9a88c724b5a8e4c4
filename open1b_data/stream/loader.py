"""The training loader: rank r of R's micro-batches from the stream, resumable.

Contract: ``StreamLoader(mix, rank, world)`` is a ``torch.utils.data.IterableDataset``
(use it directly or through ``DataLoader(loader, batch_size=None)`` /
torchdata's ``StatefulDataLoader``, which call its ``state_dict`` / ``load_state_dict``).
Iterating yields, for steps ``start_step .. end_step`` of the mix's schedule
(``schedule.py``), this rank's micro-batches in order: dicts with ``input_ids`` and
``labels`` (int64 tensors ``[micro_batch, window - 1]``: a window's first ``window - 1``
tokens and its last ``window - 1`` tokens), ``step``, ``micro_batch`` (index within the
step), ``accumulation`` and ``windows`` (the stream window ids). ``input_ids`` and
``labels`` are views of one ``[micro_batch, window]`` tensor (no extra copy). Rank r loads
window m iff ``m mod R == r``; nothing else depends on R.

Shards are read lazily by a background prefetch thread (whole-shard cache,
``windows.py``), ``prefetch`` micro-batches ahead; plain threads and queues, no shared
memory, no worker processes. The plan is not thread-safe: the thread and ``state_dict``
share it under one lock.

State (``state_dict``; JSON-able): ``{"format": "open1b-loader-state", "version": 1,
"world", "rank", "step", "micro_batch", "stream"}`` - the next micro-batch to yield is
``micro_batch`` of ``step``, and ``stream`` is the stream state record (``state.py``) at
the first window of that step, which carries the mix fingerprint: ``load_state_dict``
refuses another mix or seed (``StateMismatchError``) and checks that the record is at that
step. A state taken at a step boundary (``micro_batch == 0``) may be loaded by a job of
another world size; a mid-step state only by the same world and rank.
"""
from __future__ import annotations

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
VERSION = 1

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


class StreamLoader(_Base):
    """Micro-batches of rank ``rank`` of ``world`` (see module docstring)."""

    def __init__(self, mix: str | StreamPlan, rank: int = 0, world: int = 1,
                 start_step: int = 1, end_step: int | None = None, prefetch: int = 4,
                 cache_shards: int | None = None) -> None:
        self.plan = mix if isinstance(mix, StreamPlan) else StreamPlan.open(mix)
        self.schedule = Schedule.from_definition(self.plan.view.definition)
        self.world, self.rank = int(world), int(rank)
        self.end_step = self.schedule.last_step if end_step is None else int(end_step)
        self.schedule.step(self.end_step)          # checks the range
        self.schedule.rank_plan(start_step, self.world, self.rank)  # checks world/rank
        for run in self.schedule.runs:      # fail now, not mid-run, if a later batch won't fit
            if run.first_step + run.steps > start_step and run.first_step <= self.end_step:
                self.schedule.accumulation(max(run.first_step, start_step), self.world)
        self.prefetch = max(1, int(prefetch))
        self.reader = WindowReader(self.plan, whole_shards=True,
                                   cache_shards=2 if cache_shards is None else cache_shards)
        self._step, self._mb = int(start_step), 0
        # where _step starts: a (plan cursor, window) pair or a loaded state record
        self._stream: tuple | dict | None = None
        self._lock = threading.Lock()
        self._plan_lock = threading.Lock()     # the plan's cursor cache is not thread-safe

    # ------------------------------------------------------------------ iteration

    def __len__(self) -> int:
        """Micro-batches left to yield from the current position."""
        n = 0
        for s in range(self._step, self.end_step + 1):
            n += self.schedule.accumulation(s, self.world)
        return n - self._mb

    def _produce(self, q: queue.Queue, stop: threading.Event, step: int, mb0: int) -> None:
        try:
            for s in range(step, self.end_step + 1):
                rp = self.schedule.rank_plan(s, self.world, self.rank)
                info = self.schedule.step(s)
                with self._plan_lock:
                    # cursors (tiny, cheap) now; state records only when state_dict asks
                    here = (self.plan.cursor_at(info.first_window), info.first_window)
                    ms = [m for mb in rp.micro_batches for m in mb]
                    segs = self.plan.segments_range(ms[0], ms[-1] + 1)
                    end = info.first_window + info.batch_sequences
                    after = (self.plan.cursor_at(end), end)
                for j in range(mb0 if s == step else 0, rp.accumulation):
                    with self._plan_lock:
                        toks = self.reader.fill_windows(segs, rp.micro_batches[j], np.int64)
                    last = j + 1 == rp.accumulation
                    item = (s, j, rp.accumulation, rp.micro_batches[j], toks,
                            after if last else here)
                    if not _put(q, item, stop):
                        return
            _put(q, None, stop)
        except BaseException as e:   # hand any failure to the consumer, which re-raises it
            _put(q, e, stop)

    def __iter__(self):
        import torch

        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        t = threading.Thread(target=self._produce, args=(q, stop, self._step, self._mb),
                             name=f"open1b-loader-r{self.rank}", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                s, j, acc, wins, toks, stream = item
                t64 = torch.from_numpy(toks)
                with self._lock:
                    self._stream = stream
                    self._step, self._mb = (s, j + 1) if j + 1 < acc else (s + 1, 0)
                yield {"input_ids": t64[:, :-1], "labels": t64[:, 1:], "step": s,
                       "micro_batch": j, "accumulation": acc, "windows": list(wins)}
        finally:
            stop.set()
            t.join()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Position of the next micro-batch to yield (see module docstring)."""
        with self._lock:
            step, mb, stream = self._step, self._mb, self._stream
        with self._plan_lock:
            if stream is None:
                stream = self.plan.state_at(self._first_window(step)).to_dict()
            elif isinstance(stream, tuple):
                stream = self.plan.state_of(*stream).to_dict()
        return {"format": FORMAT, "version": VERSION, "world": self.world, "rank": self.rank,
                "step": step, "micro_batch": mb, "stream": stream}

    def _first_window(self, step: int) -> int:
        if step > self.schedule.last_step:
            return self.schedule.total_windows
        return self.schedule.step(step).first_window

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (refuses another mix, seed, or an incompatible topology)."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise StreamError(f"not an open1b loader state (format "
                              f"{state.get('format') if isinstance(state, dict) else state!r},"
                              f" expected {FORMAT!r})")
        if state.get("version") != VERSION:
            raise StreamError(f"loader state version {state.get('version')!r} is not "
                              f"{VERSION}; it was written by another open1b version")
        step, mb = int(state["step"]), int(state["micro_batch"])
        stream = StreamState.from_dict(state["stream"])
        with self._plan_lock:
            at = self.plan.from_state(stream)   # fingerprint/seed/sources checked here
        expected = self._first_window(step)
        if at != expected:
            raise StateMismatchError(f"loader state says step {step} but its stream record "
                                     f"is at window {at}, not the step's first window "
                                     f"{expected}; the state is corrupt")
        if mb and (state["world"], state["rank"]) != (self.world, self.rank):
            raise StreamError(
                f"this state is in the middle of step {step} (micro-batch {mb}) of rank "
                f"{state['rank']} of {state['world']}; it can only resume on that rank and "
                f"world. States taken at a step boundary resume on any world size")
        if step <= self.end_step:
            acc = self.schedule.accumulation(step, self.world)
            if mb >= acc:
                raise StreamError(f"micro-batch {mb} out of range for step {step} "
                                  f"({acc} per rank)")
        with self._lock:
            self._step, self._mb, self._stream = step, mb, stream.to_dict()
