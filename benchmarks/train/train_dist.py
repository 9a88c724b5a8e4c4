"""Training throughput of the demo preset on 1 and on P processes, and the collectives' share.

The same run (demo preset, logical mesh ``--mesh``, ``--steps`` steps) through the command a
user types, ``open1b-train run --nproc P``, for each P in ``--procs``, alternating so that
load drifts hit every side; from each run's ``steps.jsonl``: the median tokens/s of the
steps after the first, the median share of a step spent in the collectives (the logged
``collective_seconds``: reduce-scatter, all-reduce, gathers and the parameter broadcast,
waits included) and the run hash, which must be the same for every P.

    .venv/bin/python -m benchmarks.train.train_dist --procs 1 2 --mesh 2x1 --steps 6 --repeats 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


from benchmarks.machine import report_end, report_head

BIN = os.path.dirname(sys.executable)


def _mix() -> str:
    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.ingest.pipeline import BuildOptions, build_mix

    out = os.path.join("build", "demo-mix")
    if not os.path.exists(os.path.join(out, "manifest.json")):
        build_mix(load_mix(default_mix_path()), out, BuildOptions(workers=2, progress=False))
    return out


def one(mix: str, procs: int, mesh: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "run")
        subprocess.run([f"{BIN}/open1b-train", "run", "--preset", "demo", "--mix", mix,
                        "--mesh", mesh, "--steps", str(steps), "--nproc", str(procs),
                        "--out", run, "--quiet"], check=True, capture_output=True)
        with open(os.path.join(run, "steps.jsonl")) as f:
            lines = [json.loads(x) for x in f if x.strip()][1:]
    later = lines[1:] or lines
    share = [ln.get("collective_seconds", 0.0) / ln["seconds"] for ln in later]
    return {"tokens_per_s": statistics.median(ln["tokens_per_s"] for ln in later),
            "step_s": statistics.median(ln["seconds"] for ln in later),
            "collective_share": statistics.median(share), "hash": lines[-1]["hash"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--mesh", default="2x1")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    mix = _mix()
    lines = report_head("python -m benchmarks.train.train_dist")
    res: dict[int, list[dict]] = {p: [] for p in a.procs}
    for _ in range(a.repeats):
        for p in a.procs:
            res[p].append(one(mix, p, a.mesh, a.steps))
    hashes = {r["hash"] for rs in res.values() for r in rs}
    base = max(r["tokens_per_s"] for r in res[a.procs[0]])
    lines.append(f"demo preset, mesh {a.mesh}, {a.steps} steps (medians over steps 2..N; best "
                 f"of {a.repeats} runs):\n")
    lines.append("| processes | tokens/s | s / step | collectives share | vs P = "
                 f"{a.procs[0]} |\n|---|---|---|---|---|")
    for p, rs in res.items():
        best = max(rs, key=lambda r: r["tokens_per_s"])
        lines.append(f"| {p} | {best['tokens_per_s']:,.0f} | {best['step_s']:.2f} | "
                     f"{100 * best['collective_share']:.1f}% | "
                     f"{best['tokens_per_s'] / base:.2f}x |")
    lines.append(f"run hash identical across every run and P: {len(hashes) == 1} "
                 f"({sorted(hashes)[0][:16]}...)")
    report_end(lines, a.out)


if __name__ == "__main__":
    main()
