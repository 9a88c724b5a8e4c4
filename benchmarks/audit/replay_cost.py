"""What replaying a step costs: measured on the demo preset, projected for a full Open-1B step.

1. ``replay``: a short demo-preset run on the demo mix (logical mesh ``--mesh``, checkpoint
   at step 0 only through the genesis state), then ``open1b-audit replay RUN --step N
   --json`` in a fresh process, with and without ``--spill``: wall time, seconds per
   replayed step, peak resident memory, TreeFold partials resident at once.
2. ``per-op``: the CPU reference's cost of every op of the Open-1B architecture at its real
   shapes (d_model 2,048, 24 layers' worth of one windowed and one fully causal layer, the
   128,256-token LM head), timed through the model's trace hook (the time between two
   trace calls goes to the later op), plus AdamW per parameter and SHA-256 per byte.
3. The projection on paper of one full-size Open-1B step (4,718,592 tokens: 1,152 windows
   of 4,096) from those per-op costs: this machine's cores scaled linearly to a 16-core
   CPU (an upper bound on the speed: memory bandwidth does not scale with cores), and a
   consumer GPU from its datasheet throughput at a stated efficiency (no GPU was measured).

    .venv/bin/python -m benchmarks.audit.replay_cost --steps 4 --mesh 2x1
        --out benchmarks/results/results-replay.md
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import torch

from benchmarks.machine import report_end, report_head
from open1b_train.config import open1b
from open1b_train.model import forward_backward
from open1b_train.params import count, init_params

BIN = os.path.dirname(sys.executable)
STEP_TOKENS = 4_718_592          # the main phase of the Open-1B schedule
SEQ = 4096


def _mix() -> str:
    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.ingest.pipeline import BuildOptions, build_mix

    out = os.path.join("build", "demo-mix")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        build_mix(load_mix(default_mix_path()), out, BuildOptions(workers=2, progress=False))
    return out


def replay_figures(steps: int, mesh: str) -> dict:
    mix = _mix()
    out = {}
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "run")
        subprocess.run([f"{BIN}/open1b-train", "run", "--preset", "demo", "--mix", mix,
                        "--steps", str(steps), "--mesh", mesh, "--out", run, "--quiet"],
                       check=True, capture_output=True)
        for label, extra in (("in memory", []), ("--spill", ["--spill", os.path.join(d, "sp")])):
            t0 = time.perf_counter()
            p = subprocess.run([f"{BIN}/open1b-audit", "replay", run, "--step", str(steps),
                                "--from-step", "0", "--json", *extra],
                               check=True, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            r = json.loads(p.stdout)
            out[label] = {"wall_s": wall, "seconds": r.get("seconds"),
                          "step_seconds": r.get("step_seconds"),
                          "peak_memory_bytes": r.get("peak_memory_bytes"),
                          "partials": r.get("treefold_peak_partials"),
                          "verdict": r.get("verdict", r.get("ok"))}
    return out


def _timed(mc, seq: int, seed: int = 1) -> tuple[dict[str, float], float]:
    """Seconds per trace name of one forward + backward of one ``seq``-token sequence."""
    p = init_params(mc, seed)
    ids = torch.randint(0, mc.vocab, (1, seq + 1), generator=torch.Generator().manual_seed(0))
    forward_backward(mc, p, ids[:, :64], ids[:, 1:65])          # warm-up (caches, threads)
    times: dict[str, float] = defaultdict(float)
    last = [time.perf_counter()]

    def hook(name, _t):
        now = time.perf_counter()
        times[name] += now - last[0]
        last[0] = now

    t0 = time.perf_counter()
    forward_backward(mc, p, ids[:, :-1], ids[:, 1:], trace=hook)
    return dict(times), time.perf_counter() - t0


def _layer_of(name: str) -> int | None:
    for prefix in ("layers.", "grad.layers."):
        if name.startswith(prefix):
            return int(name[len(prefix):].split(".")[0])
    return None


def per_op() -> dict:
    base = open1b().model
    # one windowed layer (0) and one fully causal layer (1, the last), a small vocabulary
    two = dataclasses.replace(base, n_layers=2, vocab=1024)
    t2, wall2 = _timed(two, SEQ)
    layer = {0: defaultdict(float), 1: defaultdict(float)}
    for name, s in t2.items():
        i = _layer_of(name)
        if i is not None:
            kind = name.split(".")[-1] if "grad." in name else ".".join(
                name.split(".")[2:4] if ".bwd." not in name else name.split(".")[2:5])
            layer[i][kind] += s
    windowed, full = sum(layer[0].values()), sum(layer[1].values())
    # the LM head, loss and embedding at the real vocabulary, on fewer tokens (linear in them)
    head_tokens = 512
    one = dataclasses.replace(base, n_layers=1)
    t1, wall1 = _timed(one, head_tokens)
    head = {k: v for k, v in t1.items() if _layer_of(k) is None}
    # AdamW per parameter, SHA-256 per byte
    from open1b_kernels.ops.adamw import AdamWConfig, adamw_step_
    n = 1 << 24
    w, g = torch.randn(n) * 0.02, torch.randn(n) * 1e-3
    m, v = torch.zeros(n), torch.zeros(n)
    adamw_step_(w, g, m, v, 1, 1e-4, 0.1, AdamWConfig(0.9, 0.95, 1e-8, 0.1))
    t0 = time.perf_counter()
    for k in range(2, 5):
        adamw_step_(w, g, m, v, k, 1e-4, 0.1, AdamWConfig(0.9, 0.95, 1e-8, 0.1))
    adam_per_param = (time.perf_counter() - t0) / (3 * n)
    buf = w.numpy().tobytes()
    t0 = time.perf_counter()
    hashlib.sha256(buf).digest()
    sha_per_byte = (time.perf_counter() - t0) / len(buf)
    return {"seq": SEQ, "windowed_layer_s": windowed, "full_layer_s": full,
            "two_layer_wall_s": wall2, "layer_ops": {i: dict(layer[i]) for i in layer},
            "head_tokens": head_tokens, "head_s": sum(head.values()), "head_ops": head,
            "head_wall_s": wall1, "adam_s_per_param": adam_per_param,
            "sha_s_per_byte": sha_per_byte}


def project(po: dict) -> dict:
    cfg = open1b().model
    full_layers = len(cfg.full_layers)
    windowed_layers = cfg.n_layers - full_layers
    seqs = STEP_TOKENS // SEQ
    params = count(cfg)["total"]
    fwd_bwd = seqs * (windowed_layers * po["windowed_layer_s"] + full_layers * po["full_layer_s"]
                      + SEQ / po["head_tokens"] * po["head_s"])
    optim = params * po["adam_s_per_param"]
    # hashed per step: parameters, gradient, two moments (fp32 bytes)
    hashing = 4 * params * 4 * po["sha_s_per_byte"]
    here = fwd_bwd + optim + hashing
    cores = os.cpu_count() or 1
    flops = 6 * params * STEP_TOKENS            # the matmul work of one step, attention aside
    return {"seqs": seqs, "params": params, "here_s": here, "fwd_bwd_s": fwd_bwd,
            "optim_s": optim, "hash_s": hashing, "cores": cores,
            "cpu16_s": here * cores / 16, "flops": flops,
            "achieved_gflops_here": flops / fwd_bwd / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--mesh", default="2x1")
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--skip-per-op", action="store_true")
    ap.add_argument("--gpu-tops", type=float, default=330.0,
                    help="consumer GPU dense int8 tensor TOPS for the projection (RTX 4090: 660 "
                         "dense int8 at full rate; the default assumes half of it usable)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    lines = report_head("python -m benchmarks.audit.replay_cost")
    if not a.skip_replay:
        r = replay_figures(a.steps, a.mesh)
        lines.append(f"\nReplay of step {a.steps} of a demo-preset run (mesh {a.mesh}) from the "
                     f"genesis state, in a fresh process:\n")
        lines.append("| mode | wall s | s / step (each) | peak RSS MiB | TreeFold partials | "
                     "verdict |\n|---|---|---|---|---|---|")
        for k, v in r.items():
            per = ", ".join(f"{x:.2f}" for x in (v["step_seconds"] or {}).values())
            lines.append(f"| {k} | {v['wall_s']:.1f} | {per} | "
                         f"{(v['peak_memory_bytes'] or 0) / 2**20:,.0f} | {v['partials']} | "
                         f"{v['verdict']} |")
    if not a.skip_per_op:
        po = per_op()
        pr = project(po)
        lines.append(f"\nPer-op costs of the CPU reference at Open-1B shapes ({po['seq']}-token "
                     f"sequence; seconds):\n")
        lines.append("| op | windowed layer | fully causal layer |\n|---|---|---|")
        for k in sorted(set(po["layer_ops"][0]) | set(po["layer_ops"][1])):
            lines.append(f"| {k} | {po['layer_ops'][0].get(k, 0):.3f} | "
                         f"{po['layer_ops'][1].get(k, 0):.3f} |")
        lines.append(f"| **layer total** | {po['windowed_layer_s']:.2f} | "
                     f"{po['full_layer_s']:.2f} |")
        lines.append(f"\nLM head, loss, norms and embedding at vocabulary 128,256 over "
                     f"{po['head_tokens']} tokens: {po['head_s']:.2f} s ("
                     + ", ".join(f"{k} {v:.2f}" for k, v in sorted(po["head_ops"].items()))
                     + f"); AdamW {po['adam_s_per_param'] * 1e9:.2f} ns / parameter; SHA-256 "
                     f"{po['sha_s_per_byte'] * 1e9:.2f} ns / byte.")
        gpu_s = pr["flops"] / (a.gpu_tops * 1e12)
        lines.append(
            f"\nProjection of one full Open-1B step ({STEP_TOKENS:,} tokens = {pr['seqs']:,} "
            f"windows of {SEQ:,}; {pr['params']:,} parameters):\n\n"
            f"| machine | forward + backward | AdamW | hashing | total |\n|---|---|---|---|---|\n"
            f"| this machine ({pr['cores']} cores, measured per-op costs) | "
            f"{pr['fwd_bwd_s'] / 3600:.1f} h | {pr['optim_s']:.1f} s | {pr['hash_s']:.1f} s | "
            f"{pr['here_s'] / 3600:.1f} h |\n"
            f"| 16-core CPU (same cores, linear in cores: a lower bound on time) | "
            f"{pr['fwd_bwd_s'] * pr['cores'] / 16 / 3600:.1f} h | "
            f"{pr['optim_s'] * pr['cores'] / 16:.1f} s | {pr['hash_s'] * pr['cores'] / 16:.1f} s | "
            f"{pr['cpu16_s'] / 3600:.1f} h |\n"
            f"| consumer GPU at {a.gpu_tops:.0f} usable int8 TOPS (6 N D matmul work only, "
            f"{pr['flops'] / 1e15:.1f} PFLOP) | {gpu_s / 60:.1f} min | - | - | >= "
            f"{gpu_s / 60:.1f} min |\n\n"
            f"The CPU reference reaches {pr['achieved_gflops_here']:.1f} GFLOP/s of 6 N D work "
            f"here. Memory of a one-device replay of that step: parameters, two moments and "
            f"one reduced gradient in fp32 = {pr['params'] * 16 / 2**30:.1f} GiB, plus one "
            f"partial gradient ({pr['params'] * 4 / 2**30:.1f} GiB) and at most log2(R) + 1 "
            f"TreeFold partials of that size (spilled to disk with --spill).")
    report_end(lines, a.out)


if __name__ == "__main__":
    main()
