"""CPU path of open1b_kernels.hashing.sha256 (hashlib per 16 KiB chunk) vs one hashlib.sha256 of the buffer.

    .venv/bin/python -m benchmarks.kernels.sha256 [--sizes-mb 64,512] [--repeats 3] [--json out.json]

The anchor is what a user does without the op: one SHA-256 over the whole buffer. Both
run side by side in one process on the same bytes, median of repeats after a warm-up.
Rows: ``chunk_digests`` on a bf16 tensor (the real case: includes open1b_kernels.hashing.tensorbytes's NaN
refusal pass) and on a uint8 view of the same bytes (no NaN pass: the chunking alone).
ratio = anchor time / ours (1.0 = parity; below 1 we are slower). Results:
benchmarks/results/results-kernels-sha256.md.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import click
import torch

from benchmarks.machine import cores, cpu_model, median_s
from open1b_kernels.hashing import sha256
from open1b_kernels.core.backend import force


def bf16_buffer(n_bytes: int) -> torch.Tensor:
    # Finite bf16 bit patterns (0 .. 0x7F7F), so the NaN refusal passes.
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 0x7F80, (n_bytes // 2,), generator=g, dtype=torch.int16).view(torch.bfloat16)


def measure(size_mb: int, repeats: int) -> list[dict]:
    t = bf16_buffer(size_mb << 20)
    raw = t.view(torch.uint8)
    buf = t.view(torch.int16).numpy()
    anchor = median_s(lambda: hashlib.sha256(buf).digest(), repeats)
    rows = []
    with force("cpu"):
        for label, x in (("chunk_digests bf16", t), ("chunk_digests u8 view", raw)):
            ours = median_s(lambda x=x: sha256.chunk_digests(x), repeats)
            rows.append({"case": label, "mb": size_mb, "ours_s": ours, "anchor_s": anchor,
                         "ours_gbps": t.numel() * 2 / ours / 1e9,
                         "anchor_gbps": t.numel() * 2 / anchor / 1e9, "ratio": anchor / ours})
    return rows


@click.command()
@click.option("--sizes-mb", default="64,512", show_default=True,
              help="Comma-separated buffer sizes in MiB.")
@click.option("--repeats", default=3, show_default=True, help="Timed repeats per case (median).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the rows as JSON here.")
def main(sizes_mb: str, repeats: int, json_out: Path | None) -> None:
    """Time the chunked CPU path against one hashlib.sha256 of the same bytes."""
    sizes = [int(s) for s in sizes_mb.split(",") if s.strip()]
    meta = {"machine": cpu_model(), "cpus": cores(),
            "torch": torch.__version__, "load_before": os.getloadavg()}
    print(f"chunk size {sha256.CHUNK_BYTES} bytes; load average before {meta['load_before']}")
    print("| case | MiB | ours s | ours GB/s | hashlib s | hashlib GB/s | hashlib / ours |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for size in sizes:
        for r in measure(size, repeats):
            rows.append(r)
            print(f"| {r['case']} | {r['mb']} | {r['ours_s']:.3f} | {r['ours_gbps']:.2f} | "
                  f"{r['anchor_s']:.3f} | {r['anchor_gbps']:.2f} | {r['ratio']:.2f}x |", flush=True)
    meta["load_after"] = os.getloadavg()
    print(f"load average after {meta['load_after']}")
    if json_out:
        json_out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
