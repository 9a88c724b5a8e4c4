"""Peak resident memory (VmHWM) of each memory plan (``open1b_train.memory.memplan``), each case in
a fresh subprocess, the resident plan the anchor of every ratio.

* ``demo``: the demo golden trajectory's mix (6 windows of 512 tokens per step, mesh 2x1),
  ``--steps`` steps trained from genesis under each plan forced; the run hashes must agree.
* ``optim``: the ``open1b`` preset's parameter and optimizer memory alone - random
  parameters of its shapes and dtypes, a random flat gradient, one AdamW update
  (``step.apply_update``: norm, clip, update) and the optim digest - under each plan; no
  forward pass. ``--layers`` shrinks the model (the resident plan of the full model needs
  ~23 GB: more than this VM can give).

    python -m benchmarks.train.memory_plans [--cases demo,optim] [--layers 24]
        [--plans resident,lean:0,lean] [--out benchmarks/results/results-memplan.md]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.machine import LoadLog, report_end, report_head


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child_demo(plan: str, steps: int, work: str) -> dict:
    from open1b_audit.selftest import trajectory as tj
    from open1b_train import runlog
    from open1b_train.train import train

    mix = tj.build_mix("demo", os.path.join(work, "mix"))
    run = os.path.join(work, f"run-{plan}")
    t0 = time.perf_counter()
    train(tj.config("demo", steps), mix, run, progress=False, echo=lambda m: None,
          memory_plan=plan)
    return {"seconds": time.perf_counter() - t0, "hash": runlog.read(run)[-1]["hash"]}


def child_optim(plan: str, layers: int, work: str) -> dict:
    import dataclasses

    import torch

    from open1b_train.memory import memplan
    from open1b_train.config import open1b
    from open1b_train.params import Layout, param_specs
    from open1b_train.optimstate import OptimState
    from open1b_train.step import apply_update

    cfg = open1b()
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=layers))
    mp = memplan.choose(plan, cfg, 4097, work)
    specs = param_specs(cfg.model)
    layout = Layout(specs)
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(2)
    # random parameters of the model's shapes and dtypes (the seeded init is slow at this
    # size and its values do not change what is held)
    params = {s.name: (torch.randn(s.shape, generator=g) * 0.02).to(s.dtype) for s in specs}
    grad = layout.zeros()
    for a in range(0, layout.numel, 1 << 24):           # random gradient, in place
        part = grad[a:a + (1 << 24)]
        part.copy_(torch.randn(part.numel(), generator=g) * 1e-4)
    opt = OptimState(*memplan.new_moments(mp, layout, "cpu"))
    t1 = time.perf_counter()
    apply_update(cfg, specs, params, layout, grad, torch.zeros(()), opt, 1, 4.5e-4)
    digest = memplan.optim_digest(layout, opt)
    return {"seconds": time.perf_counter() - t1, "setup_seconds": t1 - t0, "hash": digest,
            "params": layout.numel, "estimate": mp.estimate}


def child(args) -> None:
    out = (child_demo(args.plan, args.steps, args.work) if args.case == "demo"
           else child_optim(args.plan, args.layers, args.work))
    out["vmhwm"] = _hwm()
    print("RESULT " + json.dumps(out))


def run_case(case: str, plan: str, args, work: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.train.memory_plans", "--child", "--case", case,
           "--plan", plan, "--steps", str(args.steps), "--layers", str(args.layers),
           "--work", work]
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{case}/{plan} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="demo,optim")
    ap.add_argument("--plans", default="resident,lean:0,lean",
                    help="plans to compare (lean: as many layers kept as fit; lean:0: none)")
    ap.add_argument("--steps", type=int, default=2, help="demo steps")
    ap.add_argument("--layers", type=int, default=24, help="open1b layers for the optim case")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from open1b_kernels.int8.route import cpu_flags

    lines = report_head("python -m benchmarks.train.memory_plans")
    lines.append(f"CPU flags: {cpu_flags()}")
    load = LoadLog()
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    for case in args.cases.split(","):
        what = (f"demo preset, {args.steps} steps" if case == "demo" else
                f"open1b parameters + one AdamW update, {args.layers} layers")
        lines += ["", f"{case} ({what}):",
                  "", "| plan | peak RSS (VmHWM) | vs resident | seconds | hash |",
                  "|---|---|---|---|---|"]
        res = {}
        with tempfile.TemporaryDirectory(dir=os.environ.get("MEMPLAN_TMP")) as work:
            for plan in args.plans.split(","):
                res[plan] = run_case(case, plan, args, work)
                load.sample(f"{case}/{plan}")
        anchor = res.get("resident", {}).get("vmhwm")
        for plan, r in res.items():
            ratio = f"{r['vmhwm'] / anchor:.3f}x" if anchor else "-"
            lines.append(f"| {plan} | {gib(r['vmhwm'])} | {ratio} | {r['seconds']:.1f} | "
                         f"{r['hash'][:16]} |")
        hashes = {r["hash"] for r in res.values()}
        lines.append(f"\nsame bits under every plan: {len(hashes) == 1}")
        est = next(iter(res.values())).get("estimate")
        if est:
            lines.append(f"estimated whole-step peaks at 4,097 tokens: "
                         f"{ {k: gib(v) for k, v in est.items()} }")
    lines.append(load.summary())
    report_end(lines, args.out)


if __name__ == "__main__":
    main()
