"""Where build-mix tasks run: threads of this process or helper processes, and in what order.

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
import multiprocessing
import os
import queue as queue_mod
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

from open1b_data.errors import BuildError, Open1bDataError
from open1b_data.ingest.report import Progress
from open1b_data.ingest.task import Job, build_input, encoders

PARENT_POLL_S = 0.25     # how often a helper checks that its build process is alive

_HELPER: dict[str, Any] = {}     # a helper process's progress queue (``_init_worker``)


def _init_worker(queue: Any, parent: int) -> None:
    # Parallelism comes from the worker processes; HF tokenizers must not add threads.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _HELPER["queue"] = queue
    threading.Thread(target=_exit_with, args=(parent,), daemon=True,
                     name="parent-watch").start()


def _exit_with(parent: int) -> None:
    """A helper whose build process died (SIGKILL, OOM) would wait for jobs forever: it
    leaves as soon as it is orphaned. Whatever it was writing stays a temporary file,
    which the next build sweeps."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


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
    return build_input(job, _HELPER["queue"].put)


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
            encoders(todo[0].out, todo[0].tokenizer_sha256)
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
    page faults (benchmarks/HISTORY.md, "Data identity") - so one worker of N is the warm parent
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
