"""One build-mix task: a single input file -> its token shards and completion marker.

Contract: ``build_input(job)`` reads input ``job.index`` of ``job.source`` through the
source's reader (which applies the filters and turns every bad record into a ``Dropped``),
encodes the kept documents with the fast encoder in batches, writes
``<source>/shard-<index:05d>-<k:05d>.parquet`` (+ ``.lengths.npy``) through ``ShardWriter``
and, LAST, the marker ``_work/inputs/<source>/<index:05d>.json``. Its output depends only on
the input and the tokenizer - never on which process or machine runs it, or when - which
is what makes builds byte-identical across worker counts and task splits and lets a rerun
skip any input whose marker matches (``valid_marker``).

Before the marker is written, every shard is checked: a deterministic uniform sample of its
documents (``sample_size``: 1% of them, between 2 and 64) is encoded by the reference HF
tokenizer and the fast encoder (``check_equivalence``), and the ids stored in the written
shard are read back and compared with the ids encoded; any difference raises ``BuildError``.

``run_jobs`` runs tasks in this process and in ``Helpers``, ``workers - 1`` spawned
processes (never forked: HF tokenizers' thread pool and fsspec clients do not survive a
fork; helpers set ``TOKENIZERS_PARALLELISM=false`` since parallelism comes from the
processes), and feeds per-batch counts (documents, tokens, text bytes) to a ``Progress``.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import multiprocessing
import os
import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from open1b_data.build_report import Progress
from open1b_data.build_store import join, read_json, write_json
from open1b_data.errors import BuildError
from open1b_data.mixspec import MixSpec

log = logging.getLogger("open1b_data.build")

EQUIVALENCE_SAMPLE = 64  # at most this many documents per shard encoded by both encoders
EQUIVALENCE_MIN = 2      # at least this many (or every document of a smaller shard)
ENCODE_BATCH_DOCS = 256  # documents per fast-encoder call: amortizes per-call overhead
TOKENIZER = "tokenizer.json"


@dataclass(frozen=True)
class Job:
    """One input file to build: everything a worker process needs, picklable."""

    mix: MixSpec
    out: str
    source: str
    index: int  # index of the input within its source (names its shards and marker)
    input: Any  # sources.InputFile
    tokenizer_sha256: str

    @property
    def marker(self) -> str:
        return f"_work/inputs/{self.source}/{self.index:05d}.json"

    @property
    def prefix(self) -> str:
        return join(self.out, f"{self.source}/shard-{self.index:05d}")


def input_record(inp: Any) -> dict[str, Any]:
    """An input as the manifest lists it: relative path, size, sha256 or etag."""
    return inp.manifest_entry()


# --------------------------------------------------------------------------------------
# Stage (c): one input -> its shards and marker (runs in a worker process).

_WORKER: dict[str, Any] = {}


def _init_worker(queue: Any) -> None:
    # Parallelism comes from the worker processes; HF tokenizers must not add threads.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["queue"] = queue


def _encoders(out: str, sha: str) -> tuple[Any, Any]:
    key = (out, sha)
    if _WORKER.get("encoders_key") != key:
        from open1b_data import tokenizer as tk

        tok = tk.load_tokenizer(join(out, TOKENIZER))
        _WORKER["encoders"] = (tok, tk.FastEncoder.from_tokenizer(tok))
        _WORKER["encoders_key"] = key
    return _WORKER["encoders"]


def valid_marker(job: Job, existing: set[str]) -> dict[str, Any] | None:
    """The input's marker if it matches this input and tokenizer and every file it names
    is in ``existing`` (one listing of the output, not one request per file); else None."""
    if job.marker not in existing:
        return None
    try:
        m = read_json(join(job.out, job.marker))
    except (ValueError, OSError):
        return None
    if (m.get("input") != input_record(job.input)
            or m.get("tokenizer_sha256") != job.tokenizer_sha256):
        return None
    if not all(s["path"] in existing and s["lengths"]["path"] in existing
               for s in m.get("shards", [])):
        return None
    return m


def build_input(job: Job) -> dict[str, Any]:
    """Read, filter, encode and shard one input; check the encoders; write the marker."""
    from open1b_data.document import Dropped
    from open1b_data.shards import ShardWriter, read_rows
    from open1b_data.sources import read_input
    from open1b_data import tokenizer as tk

    spec = job.mix.source(job.source)
    tok, fast = _encoders(job.out, job.tokenizer_sha256)
    queue = _WORKER.get("queue")
    writer = ShardWriter(job.prefix, job.source, job.mix.shards)
    dropped: Counter[str] = Counter()
    # A reservoir of documents per shard for the encoder check; the RNG is seeded by the
    # input path so the sample, like the output, is the same on every run.
    rng = random.Random(hashlib.sha256(f"{job.source}/{job.input.path}".encode()).digest())
    reservoirs: dict[int, list[tuple[int, str, Any]]] = {}  # shard -> (doc, text, ids)
    seen_in_shard: Counter[int] = Counter()
    kept = tokens = text_bytes = 0
    batch: list[Any] = []

    def flush() -> None:
        nonlocal kept, tokens, text_bytes
        if not batch:
            return
        texts = [d.text for d in batch]
        ids = fast.encode_batch(texts)
        nbytes = 0
        for doc, arr, text in zip(batch, ids, texts):
            # The document lands in the shard after the ones closed so far.
            _reservoir_add(reservoirs, seen_in_shard, rng, len(writer.entries),
                           (kept, text, arr))
            writer.add(arr, doc.doc_id, doc.input, doc.row)
            kept += 1
            tokens += len(arr)
            nbytes += len(text.encode("utf-8"))
        text_bytes += nbytes
        if queue is not None:
            queue.put((len(batch), sum(len(a) for a in ids), nbytes))
        batch.clear()

    for item in read_input(spec, job.input):
        if isinstance(item, Dropped):
            dropped[item.reason] += 1
            _log_dropped(job, item)
            continue
        batch.append(item)
        if len(batch) >= ENCODE_BATCH_DOCS:
            flush()
    flush()
    entries = list(writer.close())
    _check_shards(job, tok, fast, entries, reservoirs, rng, tk.check_equivalence, read_rows)
    marker = {
        "source": job.source,
        "index": job.index,
        "input": input_record(job.input),
        "tokenizer_sha256": job.tokenizer_sha256,
        "counts": {"read": kept + sum(dropped.values()), "kept": kept,
                   "dropped": dict(sorted(dropped.items()))},
        "tokens": tokens,
        "text_bytes": text_bytes,
        "shards": [_entry_dict(e) for e in entries],
    }
    write_json(join(job.out, job.marker), marker)  # last: the completion marker
    return marker


def _reservoir_add(reservoirs: dict, seen: Counter, rng: random.Random, shard: int,
                   item: tuple[int, str, Any]) -> None:
    """Algorithm R: ``reservoirs[shard]`` stays a uniform sample of that shard's documents."""
    res = reservoirs.setdefault(shard, [])
    seen[shard] += 1
    if len(res) < EQUIVALENCE_SAMPLE:
        res.append(item)
    else:
        j = rng.randrange(seen[shard])
        if j < EQUIVALENCE_SAMPLE:
            res[j] = item


def sample_size(documents: int) -> int:
    """Documents of one shard encoded by both encoders: 1% of them (rounded up), at least
    ``EQUIVALENCE_MIN`` (all of a smaller shard) and at most ``EQUIVALENCE_SAMPLE``. The HF
    reference encoder is ~10x slower than the fast one on the demo corpus, so a fixed 64
    would cost more than encoding the demo's small shards; Mix 0626's shards (tens of
    thousands of documents) get the full 64."""
    return min(documents, EQUIVALENCE_SAMPLE, max(EQUIVALENCE_MIN, -(-documents // 100)))


def _check_shards(job: Job, tok: Any, fast: Any, entries: list[Any], reservoirs: dict,
                  rng: random.Random, check_equivalence: Any, read_rows: Any) -> None:
    """Both encoders agree on a sample of every shard, and the shard holds those ids."""
    start = 0
    for n, e in enumerate(entries):
        res = sorted(reservoirs.get(n, []), key=lambda item: item[0])
        k = sample_size(int(e.documents))
        if k > len(res) or (res and not start <= res[0][0] < start + int(e.documents)):
            raise BuildError(f"{job.prefix}: the encoder-check sample of {e.path} does not "
                             f"match the shard written (a bug in build_task.py); the build "
                             f"stops rather than trust an unchecked shard")
        picked = sorted(rng.sample(res, k), key=lambda item: item[0])
        check_equivalence(tok, fast, [text for _, text, _ in picked])
        url = join(job.out, e.path)
        stored = read_rows(url, [i - start for i, _, _ in picked])
        for (i, _, want), got in zip(picked, stored):
            if not np.array_equal(got, want):
                raise BuildError(f"{url}: row {i - start} holds tokens that differ from the "
                                 f"ids encoded for it; the shard writer is inconsistent")
        start += int(e.documents)


def _entry_dict(e: Any) -> dict[str, Any]:
    if hasattr(e, "to_dict"):
        return e.to_dict()
    return {"path": e.path, "sha256": e.sha256, "bytes": e.bytes, "documents": e.documents,
            "tokens": e.tokens, "lengths": {"path": e.lengths_path, "sha256": e.lengths_sha256}}


def _log_dropped(job: Job, item: Any) -> None:
    from open1b_data.document import FILTER_REASONS

    # Filter drops are the expected outcome of the three ingest filters; bad input is not.
    level = logging.DEBUG if item.reason in FILTER_REASONS else logging.WARNING
    log.log(level, "dropped %s: %s/%s row %s: %s", item.reason, job.source, item.input,
            item.row, item.detail)


# --------------------------------------------------------------------------------------
# Stage (c) driver: which inputs this process builds, and how.

class Helpers:
    """``n`` spawned helper processes, started early (``start``) so their interpreter start
    and imports overlap this process's listing and tokenizer training."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool: cf.ProcessPoolExecutor | None = None
        self.queue: Any = None
        if n > 0:
            ctx = multiprocessing.get_context("spawn")  # no fork: tokenizers' threads and
            self.queue = ctx.Queue()                    # fsspec clients do not survive one
            self.pool = cf.ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker,
                                               initargs=(self.queue,))
            for _ in range(n):  # the pool spawns on demand: one warm-up task per helper
                self.pool.submit(_warm_up)

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _warm_up() -> None:
    import importlib

    for name in ("pyarrow.parquet", "tiktoken", "tokenizers", "open1b_data.shards",
                 "open1b_data.sources", "open1b_data.tokenizer"):  # build_input's imports
        importlib.import_module(name)


def run_jobs(jobs: list[Job], helpers: Helpers, progress: Progress) -> None:
    """Build ``jobs`` in this process and the helpers (this process would otherwise sit
    idle while it waits: it takes the next job whenever every helper is busy)."""
    # Largest inputs first so the slowest input does not start last (order of completion
    # never changes the output: every job writes only its own files).
    todo = deque(sorted(jobs, key=lambda j: (-int(j.input.size), j.source, j.index)))
    pending: dict[cf.Future, Job] = {}
    n = helpers.n if len(jobs) > 1 else 0
    try:
        while todo or pending:
            # This process is ready now, a helper may still be starting: it takes the
            # largest remaining input, the helpers the next ones.
            mine = todo.popleft() if todo and n else None
            while todo and len(pending) < n:
                job = todo.popleft()
                pending[helpers.pool.submit(build_input, job)] = job
            if mine is None and todo:
                mine = todo.popleft()
            if mine is not None:
                _build_here(mine, progress)
            if pending:
                _collect(pending, helpers.queue, progress, timeout=0 if todo else 0.5)
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise
    if helpers.queue is not None:
        _drain(helpers.queue, progress)


def _build_here(job: Job, progress: Progress) -> None:
    _WORKER["queue"] = _InlineQueue(progress)
    try:
        build_input(job)
    finally:
        _WORKER.pop("queue", None)
    progress.input_done()


def _collect(pending: dict[cf.Future, Job], queue: Any, progress: Progress,
             timeout: float) -> None:
    done, _ = cf.wait(pending, timeout=timeout, return_when=cf.FIRST_COMPLETED)
    _drain(queue, progress)
    for fut in done:
        job = pending.pop(fut)
        try:
            fut.result()
        except BuildError:
            raise
        except Exception as e:
            raise BuildError(f"building {job.source} input {job.input.path!r} failed: "
                             f"{type(e).__name__}: {e}") from e
        progress.input_done()


class _InlineQueue:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def put(self, item: tuple[int, int, int]) -> None:
        self.progress.add(*item)


def _drain(queue: Any, progress: Progress) -> None:
    import queue as q

    while True:
        try:
            progress.add(*queue.get_nowait())
        except q.Empty:
            return
