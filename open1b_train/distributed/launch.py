"""Start P local workers torchrun-style, watch them, stop them all when one fails.

``open1b-train run --nproc P ...`` re-runs the same command line as P processes of
``python -m open1b_train`` with the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR=127.0.0.1, MASTER_PORT). Each worker joins one process group (gloo on the CPU,
NCCL with CUDA) with a collective timeout of ``OPEN1B_DIST_TIMEOUT`` seconds (default 300).
The launcher polls the workers every 0.1 s: when one exits with an error or is killed, it
names that rank, stops the others (SIGTERM, then SIGKILL after 5 s) and exits non-zero
within a bounded time - a peer never waits on a dead rank for the collective timeout. On a
cluster, torchrun's agent plays this part (docs/TRAINING.md).
"""
from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import time

GRACE_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_worker() -> bool:
    """True inside a process started by this launcher or by torchrun."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init_worker() -> None:
    """Join the process group described by the torchrun environment."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = float(os.environ.get("OPEN1B_DIST_TIMEOUT", "300"))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def launch(nproc: int, argv: list[str]) -> tuple[int, str | None]:
    """Run ``python -m open1b_train <argv>`` as ``nproc`` workers; (exit code, message)."""
    port = _free_port()
    procs = []
    # the cores shared out among the workers, as torchrun does (it sets 1): torch's default of
    # every core per process runs nproc x cores threads, and P = 2 on 2 cores ran 3x slower
    # than one process (same bits either way: the ops' results do not depend on threads)
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, _cores() // nproc))
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=threads)
        procs.append(subprocess.Popen([sys.executable, "-m", "open1b_train", *argv], env=env,
                                      stdout=None if r == 0 else subprocess.DEVNULL))
    failed: tuple[int, int] | None = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = bad[0]
                break
            if all(c == 0 for c in codes):
                return 0, None
            time.sleep(0.1)
    except KeyboardInterrupt:
        failed = (-1, -signal.SIGINT)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    rank, code = failed
    if rank < 0:
        return 130, "interrupted; stopped every worker"
    return 1, (f"worker rank {rank} of {nproc} {_describe(code)}; stopped the other workers. "
               f"The run keeps its last checkpoint: continue with `open1b-train resume RUN` "
               f"(on any number of processes that divides the mesh)")
