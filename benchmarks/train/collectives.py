"""Deterministic collectives vs gloo's own, side by side on the same processes and tensors.

For P gloo processes on loopback and a float32 gradient of ``--mb`` MiB per process:

* reduce-scatter: ours (``open1b_train.distributed.collectives.reduce_scatter`` on a 1 x P mesh:
  all-to-all of P slices, ascending sums, reciprocal multiply) vs
  ``torch.distributed.reduce_scatter_tensor`` (or ``reduce_scatter`` where gloo lacks it);
* all-reduce: ours (``all_reduce`` on a P x 1 mesh: an all-to-all of pieces, each piece
  folded by its owner exactly as TreeFold folds replicas, an all-gather) vs
  ``torch.distributed.all_reduce``.

Median of ``--repeats`` after a warm-up, interleaved. Ratio = stock time / our time (>= 1:
ours is at least as fast). Also prints the cost model of the all-reduce for R replicas:
data each replica sends and rounds of messages, for recursive doubling with whole partials
(how the reduction tree is defined), ours, and a ring.

    .venv/bin/python -m benchmarks.train.collectives --procs 2 4 --mb 64 512 --repeats 5
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.machine import report_end, report_head
from open1b_train.memory.allocator import keep_freed_memory
from open1b_train.distributed import collectives as C
from open1b_train.distributed.exchange import Exchange
from open1b_train.distributed.placement import Placement
from open1b_train.reduction.treefold import blocks


def _worker(rank: int, world: int, port: int, mbs: list[int], repeats: int, q) -> None:
    torch.set_num_threads(1)
    keep_freed_memory()          # as in the trainer's processes; both sides share it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    out = {}
    for mb in mbs:
        n = mb * (1 << 20) // 4
        g = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        cut = [(i * n // world, (i + 1) * n // world) for i in range(world)]
        rs_pl, ar_pl = Placement(1, world, world, rank), Placement(world, 1, world, rank)
        rs_ex, ar_ex = Exchange(rs_pl), Exchange(ar_pl)
        slice_out = torch.empty(n // world)

        def stock_rs():
            try:
                dist.reduce_scatter_tensor(slice_out, g[:world * (n // world)])
            except (RuntimeError, AttributeError):   # gloo without the fused form
                dist.reduce_scatter(slice_out, list(g[:world * (n // world)].chunk(world)))

        jobs = {"ours_rs": lambda: C.reduce_scatter({rank: g}, cut, rs_ex),
                "stock_rs": stock_rs,
                "ours_ar": lambda: C.all_reduce({rank: g}, ar_ex),
                "stock_ar": lambda: dist.all_reduce(g.clone())}
        times = {k: [] for k in jobs}
        for k, f in jobs.items():                 # warm-up
            f()
        for _ in range(repeats):
            for k, f in jobs.items():
                dist.barrier()
                t0 = time.perf_counter()
                f()
                dist.barrier()
                times[k].append(time.perf_counter() - t0)
        out[mb] = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


def measure(world: int, mbs: list[int], repeats: int) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, mbs, repeats, q))
             for r in range(world)]
    for p in procs:
        p.start()
    res = q.get()
    for p in procs:
        p.join()
    return res


def model(replicas: int) -> dict:
    """Data each replica sends per all-reduce, in gradient sizes (the large-message regime),
    and rounds of messages (the latency-bound regime), for R replicas:

    * recursive doubling with whole partials, as in the butterfly the reference algorithm
      is defined by: log2(b) whole vectors in a power-of-two block of b, plus one whole
      vector per other block to fold the blocks;
    * ours: an all-to-all of pieces, the fold on the owner, an all-gather: 2(R-1)/R in two
      rounds, for any R;
    * a ring all-reduce: 2(R-1)/R in 2(R-1) rounds."""
    bl = blocks(replicas)
    doubling = max(math.log2(size) for _, size in bl) + (len(bl) - 1)
    ring = 2 * (replicas - 1) / replicas
    return {"replicas": replicas, "doubling_traffic": doubling, "ours_traffic": ring,
            "ring_traffic": ring, "ours_rounds": 2, "ring_rounds": 2 * (replicas - 1),
            "doubling_vs_ring": ring / doubling if doubling else 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--mb", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lines = report_head("python -m benchmarks.train.collectives") + [
        "gloo on loopback",
        "| P | MiB | ours RS s | gloo RS s | RS ratio | ours AR s | gloo AR s | AR ratio |",
        "|---|---|---|---|---|---|---|---|"]
    for world in a.procs:
        res = measure(world, a.mb, a.repeats)
        for mb, t in res.items():
            lines.append(f"| {world} | {mb} | {t['ours_rs']:.3f} | {t['stock_rs']:.3f} | "
                         f"{t['stock_rs'] / t['ours_rs']:.2f} | {t['ours_ar']:.3f} | "
                         f"{t['stock_ar']:.3f} | {t['stock_ar'] / t['ours_ar']:.2f} |")
    lines.append("\nCost model: data each replica sends per all-reduce, in gradient sizes, "
                 "and rounds of messages (see ``model``):")
    lines.append("| R | recursive doubling | ours | ring | doubling / ring speed (bandwidth "
                 "bound) | ours / ring | rounds: ours, ring |\n|---|---|---|---|---|---|---|")
    for r in (2, 3, 4, 5, 6, 8, 16, 48, 64):
        m = model(r)
        lines.append(f"| {r} | {m['doubling_traffic']:.2f} | {m['ours_traffic']:.2f} | "
                     f"{m['ring_traffic']:.2f} | {m['doubling_vs_ring']:.2f} | 1.00 | "
                     f"{m['ours_rounds']}, {m['ring_rounds']} |")
    report_end(lines, a.out)


if __name__ == "__main__":
    main()
