"""A step's training windows from proved documents, in the stream loader's order: what a
replay of a published run reads instead of whole token shards.

``ProvedWindows(cache)`` is ``replay``'s ``windows`` source. For each step it asks
``fetch.fetch_step`` for the step's windows - planned from the cache's verified mirror of
the mix's metadata, each document fetched from the mix URL with only its row group and
proved against its shard's Merkle root in the manifest - and yields them as the stream
loader's items (``StreamLoader``'s dict: ``input_ids``, ``labels``, ``step``, ``rank``,
``micro_batch``, ``accumulation``, ``windows``), rank by rank and micro-batch by
micro-batch as ``Schedule.rank_plan`` assigns them. The replay still compares each step's
data digest with the log before computing anything.

A store that cannot be reached is retried (``source.patiently``) and then fails the leg as
inconclusive: never a ``data`` finding, which would blame the run for the network. Fetched
windows are kept in ``<cache>/data/step-N.npy`` (uint32) with their SHA-256 beside
them (``.sha256``), checked on every read; a file that fails is fetched again. Bytes fetched
are counted per step (``bytes_by_step``).
"""
from __future__ import annotations

import hashlib
import io
import os

import numpy as np
import torch

from open1b.safeio import write_atomic


class ProvedWindows:
    """``replay``'s window source over a ``RunCache`` (module docstring)."""

    def __init__(self, cache) -> None:
        self.cache = cache
        self.dir = os.path.join(cache.root, "data")
        self.bytes_by_step: dict[int, int] = {}
        self.requests = 0
        self._ranges_checked = False

    @property
    def bytes_total(self) -> int:
        return sum(self.bytes_by_step.values())

    def tokens(self, step: int) -> np.ndarray:
        """The step's windows (uint32 [batch, window]), fetched and proved, or cached."""
        from open1b_audit.crowd.source import patiently
        from open1b_audit.fetch import fetch_step, run_step

        path = os.path.join(self.dir, f"step-{step:08d}.npy")
        cached = self._read(path)
        if cached is not None:
            return cached
        c = self.cache
        if not self._ranges_checked:
            self._check_ranges()
        data = patiently(f"{c.mix_url} (step {step})", lambda: fetch_step(
            c.mix_url, step, run_step(c.source.url, c.lines, step),
            lengths_from=c.mirror_mix()))
        self.bytes_by_step[step] = self.bytes_by_step.get(step, 0) + data.bytes_fetched["total"]
        self.requests += data.requests
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(data.tokens, dtype="<u4"), allow_pickle=False)
        raw = buf.getvalue()
        os.makedirs(self.dir, exist_ok=True)
        for p, b in ((path, raw), (path + ".sha256", hashlib.sha256(raw).hexdigest().encode())):
            write_atomic(p, b, fsync=False)
        return data.tokens

    def _check_ranges(self) -> None:
        """The mix's server must answer a byte range with those bytes (S3 and static hosts
        do; one that sends the whole file instead would make every proof fail, blaming the
        run for its server): compared once with the verified manifest's bytes."""
        from open1b_audit.crowd.source import SourceError

        c = self.cache
        with open(os.path.join(c.mirror_mix(), "manifest.json"), "rb") as f:
            want = f.read()[8:40]
        src = c.mix_source_()
        got = src.fs.cat_file(f"{src.root}/manifest.json", start=8, end=40)
        src.count("mix", len(got))
        if got != want:
            raise SourceError(f"{c.mix_url}: the server does not answer byte ranges (asked for "
                              f"bytes 8..40 of manifest.json, got {len(got)} other bytes); a "
                              f"step's documents cannot be fetched alone from it")
        self._ranges_checked = True

    @staticmethod
    def _read(path: str) -> np.ndarray | None:
        try:
            with open(path, "rb") as f:
                raw = f.read()
            with open(path + ".sha256", "rb") as f:
                want = f.read().decode().strip()
        except (OSError, UnicodeDecodeError):
            return None
        if hashlib.sha256(raw).hexdigest() != want:
            return None                     # changed on disk: fetched again
        return np.load(io.BytesIO(raw), allow_pickle=False)

    def __call__(self, run, first: int, last: int):
        """The loader's items of steps ``first..last`` (``replay``'s ``windows``)."""
        V = run.cfg.virtual_ranks
        for s in range(first, last + 1):
            info = run.schedule.step(s)
            toks = self.tokens(s)
            for r in range(V):
                plan = run.schedule.rank_plan(s, V, r)
                for j, wins in enumerate(plan.micro_batches):
                    rows = torch.from_numpy(toks[[m - info.first_window for m in wins]]
                                            .astype(np.int64))
                    yield {"input_ids": rows[:, :-1], "labels": rows[:, 1:], "step": s,
                           "rank": r, "micro_batch": j, "accumulation": plan.accumulation,
                           "windows": list(wins)}
