"""One build-mix task: a single input file -> its token shards and completion marker.

Contract: ``build_input(job)`` reads input ``job.index`` of ``job.source`` through the
source's reader (which applies the filters and turns every bad record into a ``Dropped``),
encodes the kept documents with the fast encoder in batches, writes
``<source>/shard-<index:05d>-<k:05d>.parquet`` (+ ``.lengths.npy``, ``.merkle``) through
``ShardWriter`` and, LAST, the marker ``_work/inputs/<source>/<index:05d>.json``. Its output
depends only on the input and the tokenizer - never on which process or machine runs it,
or when - which is what makes builds byte-identical across worker counts and task splits
and lets a rerun skip any input whose marker matches (``valid_marker``; a marker from
before content identity does not match, so that input is built again).

Before the marker is written, every shard is checked: a deterministic uniform sample of its
documents (``sample_size``: 1% of them, between 1 and 64) is encoded by the reference HF
tokenizer and compared with the ids the fast encoder gave (``check_equivalence``), and the
ids stored in the written shard are read back and compared with them; any difference
raises ``BuildError``.

``run_jobs`` runs tasks on ``Workers``: ``workers`` threads of this process (one shared
encoder), or helper processes; ``choose_executor`` picks. On Linux helpers are forked once
this process has loaded the encoders (milliseconds; they inherit imports and encoders);
elsewhere they are spawned early so their interpreter start overlaps listing and tokenizer
training. A fork is safe here: jobs reach helpers pickled (fsspec clients are rebuilt there;
fsspec resets its event loop in a forked child), and helpers set
``TOKENIZERS_PARALLELISM=false`` before any HF call, so HF never touches the parent's thread
pool (parallelism comes from the processes; ``load_tokenizer`` sets the variable in the
parent, so HF does not warn about the fork either). A helper whose build process dies
leaves (``_exit_with``). Per-batch counts (documents, tokens, text bytes) go to a
``Progress``.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import multiprocessing
import os
import queue as queue_mod
import random
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from open1b_data.ingest.report import Progress
from open1b_data.storage import join, read_json, write_json
from open1b_data.errors import BuildError, Open1bDataError
from open1b_data.formats.definition import MixSpec

log = logging.getLogger("open1b_data.ingest.pipeline")

EQUIVALENCE_SAMPLE = 64  # at most this many documents per shard encoded by both encoders
EQUIVALENCE_MIN = 1      # at least this many documents per shard
PARENT_POLL_S = 0.25     # how often a helper checks that its build process is alive
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
# Stage (c): one input -> its shards and marker (runs in a worker thread or process).

_WORKER: dict[str, Any] = {}
_ENCODERS_LOCK = threading.Lock()


def _init_worker(queue: Any, parent: int) -> None:
    # Parallelism comes from the worker processes; HF tokenizers must not add threads.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["queue"] = queue
    threading.Thread(target=_exit_with, args=(parent,), daemon=True,
                     name="parent-watch").start()


def _exit_with(parent: int) -> None:
    """A helper whose build process died (SIGKILL, OOM) would wait for jobs forever: it
    leaves as soon as it is orphaned. Whatever it was writing stays a temporary file,
    which the next build sweeps."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _encoders(out: str, sha: str) -> tuple[Any, Any]:
    """The HF tokenizer and the fast encoder, built once per process and shared by its
    threads (both are safe to call from several threads)."""
    key = (out, sha)
    with _ENCODERS_LOCK:
        if _WORKER.get("encoders_key") != key:
            from open1b_data.ingest import tokenizer as tk

            tok = tk.load_tokenizer(join(out, TOKENIZER))
            _WORKER["encoders"] = (tok, tk.FastEncoder.from_tokenizer(tok))
            _WORKER["encoders_key"] = key
        return _WORKER["encoders"]


def hf_tokenizer(out: str, sha: str) -> Any:
    """The HF tokenizer: the one this process's jobs loaded, else read now."""
    with _ENCODERS_LOCK:
        if _WORKER.get("encoders_key") == (out, sha):
            return _WORKER["encoders"][0]
    from open1b_data.ingest import tokenizer as tk

    return tk.load_tokenizer(join(out, TOKENIZER))


def forget_encoders() -> None:
    """Drop this process's cached encoders (the next job loads them again, as a fresh
    command does); benchmarks use it to time what a command pays."""
    with _ENCODERS_LOCK:
        _WORKER.pop("encoders", None)
        _WORKER.pop("encoders_key", None)


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
            or m.get("tokenizer_sha256") != job.tokenizer_sha256
            or "first_error" not in m):  # a marker from before per-input accounting
        return None
    # A marker from before content identity (no ``lengths.content``: its tree's leaves
    # covered the tokens alone) is stale: that input is built again, so a mix never mixes
    # the two kinds of roots.
    if not all(s["path"] in existing and s["lengths"]["path"] in existing
               and "content" in s["lengths"] and "merkle" in s
               and s["merkle"]["path"] in existing
               for s in m.get("shards", [])):
        return None
    return m


def build_input(job: Job, report: Callable[[tuple[int, int, int]], None] | None = None
                ) -> dict[str, Any]:
    """Read, filter, encode and shard one input; check the encoders; write the marker.
    ``report`` receives (documents, tokens, text bytes) after every encoded batch."""
    from open1b_data.ingest.document import BAD_INPUT_REASONS, Dropped
    from open1b_data.formats.shards import ShardWriter, read_rows
    from open1b_data.ingest.sources import read_input
    from open1b_data.ingest import tokenizer as tk

    spec = job.mix.source(job.source)
    tok, fast = _encoders(job.out, job.tokenizer_sha256)
    writer = ShardWriter(job.prefix, job.source, job.mix.shards,
                         heldout=job.mix.heldout_fraction(job.source))
    dropped: Counter[str] = Counter()
    # A reservoir of documents per shard for the encoder check; the RNG is seeded by the
    # input path so the sample, like the output, is the same on every run.
    rng = random.Random(hashlib.sha256(f"{job.source}/{job.input.path}".encode()).digest())
    # shard -> [(document index, text, ids, input row)]
    reservoirs: dict[int, list[tuple[int, str, Any, int]]] = {}
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
                           (kept, text, arr, doc.row))
            writer.add(arr, doc.doc_id, doc.input, doc.row)
            kept += 1
            tokens += len(arr)
            nbytes += len(text.encode("utf-8"))
        text_bytes += nbytes
        if report is not None:
            report((len(batch), sum(len(a) for a in ids), nbytes))
        batch.clear()

    first_error: dict[str, Any] | None = None
    for item in read_input(spec, job.input):
        if isinstance(item, Dropped):
            dropped[item.reason] += 1
            _log_dropped(job, item)
            if first_error is None and item.reason in BAD_INPUT_REASONS:
                first_error = {"reason": item.reason, "row": item.row, "detail": item.detail}
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
        "first_error": first_error,  # the first bad-input drop (not a filter's): where, why
        "tokens": tokens,
        "text_bytes": text_bytes,
        "shards": [_entry_dict(e) for e in entries],
    }
    write_json(join(job.out, job.marker), marker)  # last: the completion marker
    return marker


def _reservoir_add(reservoirs: dict, seen: Counter, rng: random.Random, shard: int,
                   item: tuple[int, str, Any, int]) -> None:
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
    """Documents of one shard encoded by both encoders: 1% of them (rounded down), at least
    ``EQUIVALENCE_MIN`` and at most ``EQUIVALENCE_SAMPLE``. The HF reference encoder is
    ~6x slower than the fast one, so the check costs about 6% of the encoding on small
    shards and far less on Mix 0626's (tens of thousands of documents, 64 checked)."""
    return min(documents, EQUIVALENCE_SAMPLE, max(EQUIVALENCE_MIN, documents // 100))


def _check_shards(job: Job, tok: Any, fast: Any, entries: list[Any], reservoirs: dict,
                  rng: random.Random, check_equivalence: Any, read_rows: Any) -> None:
    """Both encoders agree on a sample of every shard, and the shard holds those ids."""
    start = 0
    for n, e in enumerate(entries):
        res = sorted(reservoirs.get(n, []), key=lambda item: item[0])
        k = sample_size(int(e.documents))
        if k > len(res) or (res and not start <= res[0][0] < start + int(e.documents)):
            raise BuildError(f"{e.path}: the encoder-check sample does not match the shard "
                             f"written (a bug in build/task.py); the build stops rather than "
                             f"trust an unchecked shard")
        picked = sorted(rng.sample(res, k), key=lambda item: item[0])
        # The fast side is the ids this build encoded and stored, not a fresh encoding.
        labels = [f"{e.path} row {i - start} (input {job.source}/{job.input.path} row {row})"
                  for i, _, _, row in picked]
        check_equivalence(tok, fast, [text for _, text, _, _ in picked],
                          [ids for _, _, ids, _ in picked], labels)
        stored = read_rows(join(job.out, e.path), [i - start for i, _, _, _ in picked])
        for label, (_, _, want, _), got in zip(labels, picked, stored):
            if not np.array_equal(got, want):
                raise BuildError(f"{label}: the shard holds tokens that differ from the ids "
                                 f"encoded for it; the shard writer is inconsistent")
        start += int(e.documents)


def _entry_dict(e: Any) -> dict[str, Any]:
    if hasattr(e, "to_dict"):
        return e.to_dict()
    return {"path": e.path, "sha256": e.sha256, "bytes": e.bytes, "documents": e.documents,
            "tokens": e.tokens, "lengths": {"path": e.lengths_path,
                                            "content": e.lengths_content}}


def _log_dropped(job: Job, item: Any) -> None:
    from open1b_data.ingest.document import FILTER_REASONS

    # Filter drops are the expected outcome of the three ingest filters; bad input is not.
    level = logging.DEBUG if item.reason in FILTER_REASONS else logging.WARNING
    log.log(level, "dropped %s: %s/%s row %s: %s", item.reason, job.source, item.input,
            item.row, item.detail)


# --------------------------------------------------------------------------------------
# Stage (c) driver: which inputs this process builds, and how.

EXECUTORS = ("auto", "threads", "processes")
PROCESS_MIN_BYTES = 256 << 20  # where helpers must be spawned, "auto" uses them from here on


def start_method() -> str:
    """How helper processes start: ``fork`` on Linux (fork is safe and cheap there, see
    the module contract), ``spawn`` elsewhere (macOS frameworks break after a fork)."""
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def choose_executor(executor: str, input_bytes: int, workers: int,
                    method: str | None = None) -> str:
    """``auto``: forked helper processes whenever there are 2+ workers and fork is the start
    method; with spawned helpers, processes only for large builds.

    Processes do not share a GIL, and the native encoder, JSON decoding and per-document
    Python hold it (tiktoken, the fallback encoder, releases it but scales poorly across
    threads: on the demo 2 threads use 1.4x the CPU time of 1, 2 processes 1.15x). A
    forked helper starts in milliseconds; a spawned one costs ~0.4 CPU-s (interpreter,
    imports, encoders), which pays off only when each worker has many MB to build. Either
    way the output bytes are the same (every job writes only its own files)."""
    if executor != "auto":  # validated by BuildOptions
        return executor
    if workers < 2:
        return "threads"
    if (method or start_method()) == "fork":
        return "processes"
    return "processes" if workers > 2 and input_bytes >= PROCESS_MIN_BYTES else "threads"


class Workers:
    """Where jobs run: ``threads`` (``n`` threads of this process) or ``processes``: this
    process plus ``n - 1`` helpers, forked by ``start_helpers`` once this process holds
    what they should inherit, or spawned by ``start`` as early as possible."""

    def __init__(self, n: int, kind: str = "threads", method: str | None = None) -> None:
        self.n, self.kind = n, kind
        self.method = method or start_method()
        self.pool: cf.Executor | None = None
        self.queue: Any = None

    def start(self) -> Workers:
        if self.pool is not None or self.n <= 1:
            return self
        if self.kind == "processes":
            if self.method != "fork":
                self.start_helpers()
        else:
            self.queue = queue_mod.SimpleQueue()
            self.pool = cf.ThreadPoolExecutor(self.n, thread_name_prefix="build")
        return self

    def start_helpers(self) -> None:
        if self.pool is not None:
            return
        ctx = multiprocessing.get_context(self.method)
        self.queue = ctx.Queue()
        self.pool = cf.ProcessPoolExecutor(self.helpers, mp_context=ctx,
                                           initializer=_init_worker,
                                           initargs=(self.queue, os.getpid()))
        # Spawned helpers start on demand: one warm-up each (a fork pool forks them all at
        # the first submit).
        for _ in range(self.helpers):
            self.pool.submit(_warm_up)

    @property
    def helpers(self) -> int:
        """This process builds too, beside ``n - 1`` helpers (``run_jobs`` says why)."""
        return self.n - 1

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _warm_up() -> None:
    import importlib

    for name in ("pyarrow.parquet", "tiktoken", "tokenizers", "open1b_data.formats.shards",
                 "open1b_data.ingest.sources", "open1b_data.ingest.tokenizer",
                 "open1b_data.ingest.sources.dclm",
                 "open1b_data.ingest.sources.fineweb_edu", "open1b_data.ingest.sources.proof_pile_2",
                 "open1b_data.ingest.sources.stack_v2"):  # build_input's imports
        importlib.import_module(name)


def _build_in_helper(job: Job) -> dict[str, Any]:
    return build_input(job, _WORKER["queue"].put)


def _work_order(job: Job) -> tuple[int, int, str, int]:
    """Largest inputs first, so the slowest one does not start last; inputs whose content
    comes from a content store (Stack v2) before all, since their size is only that of the
    metadata. Completion order never changes the output: every job writes its own files."""
    fetches = job.mix.source(job.source).content_store is not None
    return (0 if fetches else 1, -int(job.input.size), job.source, job.index)


def run_jobs(jobs: list[Job], workers: Workers, progress: Progress) -> None:
    """Build ``jobs`` on ``workers``, feeding per-batch counts to ``progress``."""
    todo = deque(sorted(jobs, key=_work_order))
    report = lambda item: progress.add(*item)  # noqa: E731 - jobs built in this thread
    if workers.n <= 1 or len(jobs) < 2:
        for job in todo:
            build_input(job, report)
            progress.input_done()
        return
    if workers.kind == "threads":
        _wait_all({workers.pool.submit(build_input, job, workers.queue.put): job
                   for job in todo}, workers.queue, progress)
    else:
        if workers.method == "fork":
            _warm_up()  # imported and loaded once here, inherited by every helper
            _encoders(todo[0].out, todo[0].tokenizer_sha256)
            workers.start_helpers()
        _run_with_helpers(todo, workers, progress, report)


def _wait_all(pending: dict[cf.Future, Job], queue: Any, progress: Progress) -> None:
    try:
        while pending:
            _collect(pending, queue, progress, timeout=0.2)
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise
    _drain(queue, progress)


def _run_with_helpers(todo: deque[Job], workers: Workers, progress: Progress,
                      report: Callable[[tuple[int, int, int]], None]) -> None:
    """This process builds too, beside ``workers.helpers`` helper processes, all taking
    the next input of ``todo`` (largest first) as soon as they are free: this process
    between its own inputs, a helper from its last input's done-callback - so no worker
    idles while inputs remain, and a helper holds one input at a time.

    Why this process works rather than waits: a helper starts cold - on the demo its
    inputs took ~14% more CPU than the same inputs in a warm process, with thousands more
    page faults (BENCHMARKS.md, "Data identity") - so one worker of N is the warm parent
    instead of an N-th fresh helper. And a spawned helper starts slowly: this process
    takes the largest input first."""
    lock = threading.Lock()
    pending: dict[cf.Future, Job] = {}
    failed = threading.Event()

    def take() -> Job | None:
        with lock:
            return None if failed.is_set() or not todo else todo.popleft()

    def feed(done: cf.Future | None = None) -> None:
        if done is not None and (done.cancelled() or done.exception() is not None):
            failed.set()                   # stop handing out inputs; the error is raised
            return
        job = take()
        if job is not None:
            fut = workers.pool.submit(_build_in_helper, job)
            with lock:
                pending[fut] = job
            fut.add_done_callback(feed)

    mine = take()
    try:
        for _ in range(workers.helpers):
            feed()
        while mine is not None:
            build_input(mine, report)
            progress.input_done()
            _collect_done(pending, lock, workers.queue, progress)
            mine = take()
        while True:
            with lock:
                live = [f for f in pending if not f.done()]
            if not live:
                break
            cf.wait(live, timeout=0.5, return_when=cf.FIRST_COMPLETED)
            _collect_done(pending, lock, workers.queue, progress)
        _collect_done(pending, lock, workers.queue, progress)
    except BaseException:
        failed.set()
        with lock:
            for fut in pending:
                fut.cancel()
        raise
    _drain(workers.queue, progress)


def _collect_done(pending: dict[cf.Future, Job], lock: threading.Lock, queue: Any,
                  progress: Progress) -> None:
    """Count the helpers' finished inputs (raising the first failure) and their progress."""
    _drain(queue, progress)
    with lock:
        done = {f: j for f, j in pending.items() if f.done()}
        for f in done:
            del pending[f]
    for fut, job in done.items():
        _result(fut, job)
        progress.input_done()


def _result(fut: cf.Future, job: Job) -> None:
    try:
        fut.result()
    except Open1bDataError:
        raise  # already names the file and what to do
    except Exception as e:
        raise BuildError(f"building {job.source} input {job.input.path!r} failed: "
                         f"{type(e).__name__}: {e}") from e


def _collect(pending: dict[cf.Future, Job], queue: Any, progress: Progress,
             timeout: float) -> None:
    done, _ = cf.wait(pending, timeout=timeout, return_when=cf.FIRST_COMPLETED)
    _drain(queue, progress)
    for fut in done:
        _result(fut, pending.pop(fut))
        progress.input_done()


def _drain(queue: Any, progress: Progress) -> None:
    while True:
        try:
            progress.add(*queue.get_nowait())
        except queue_mod.Empty:
            return
