"""Run a function in P gloo processes on loopback (torch.multiprocessing.spawn)."""
from __future__ import annotations

import datetime
import os
import socket

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run(world: int, fn, *args) -> None:
    """``fn(rank, world, *args)`` in ``world`` processes; raises if any of them fails."""
    mp.start_processes(_entry, args=(world, free_port(), fn, args), nprocs=world,
                       join=True, start_method="spawn")
