"""How big and how slow the run explorer's pages are at Open-1B scale.

The run page: a synthetic, validly chained log of 80,957 steps (Open-1B's step count; the
hashed scalars of each line drawn from a smooth loss curve with noise, ~1 in 1,000 skipped)
on the demo mix's plan, measured as ``open1b-audit site`` / ``serve`` build it: chain check,
run page HTML, ``data/run.js`` (overview) and one full-resolution curve chunk. A step page:
the demo run's steps as ``serve`` renders them on demand (stream plan + shard reads + decode
+ --stats). Sizes in bytes, times wall seconds on this machine (best of ``--repeat``).

    .venv/bin/python -m benchmarks.audit.site_scale --run build/demo-run
        --mix build/demo-mix [--steps 80957] [--repeat 3] [--out benchmarks/results/results-site.json]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import struct
import time


def synthetic_lines(genesis_line: dict, steps: int) -> list[dict]:
    from open1b_train import statehash

    rng = random.Random(0)
    lines = [genesis_line]
    prev = genesis_line["hash"]
    for s in range(1, steps + 1):
        loss = 2.2 + 8.0 * math.exp(-s / 4000) + rng.gauss(0, 0.02)
        sc = {"loss": struct.pack(">f", loss).hex(), "lr": (3e-4 * min(1, s / 2000)).hex(),
              "grad_norm": struct.pack(">f", 0.3 + rng.random()).hex(),
              "skipped": rng.random() < 1e-3, "spike": False, "tokens": 2304 * 4096,
              "window_loss": []}
        comps = {k: statehash.sha({"k": k, "s": s}) for k in ("data", "grad", "params", "optim")}
        comps["scalars"] = statehash.sha(sc)
        h = statehash.step_hash(s, prev, comps)
        lines.append({"step": s, "prev": prev, "hash": h, "components": comps, "scalars": sc,
                      "tokens_per_s": 1.9e6 + rng.gauss(0, 1e4), "loss": loss})
        prev = h
    return lines


def best(f, repeat: int):
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return out, min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="build/demo-run")
    ap.add_argument("--mix", default="build/demo-mix")
    ap.add_argument("--steps", type=int, default=80_957)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    from open1b_train import chain
    from open1b_audit.site import render, static
    from open1b_audit.site.data import Explorer

    ex = Explorer.open(a.run, a.mix)
    res: dict = {"steps": a.steps}
    lines, res["synthesize_s"] = best(lambda: synthetic_lines(ex.lines[0], a.steps), 1)
    big = Explorer(ex.run, ex.mix, lines, ex.mesh, ex.plan, ex.sched, None, [])
    f, res["chain_check_s"] = best(lambda: chain.check(lines), a.repeat)
    assert f is None, f

    def run_page():
        b = Explorer(ex.run, ex.mix, lines, ex.mesh, ex.plan, ex.sched, None, [])
        return render.run_page(b.run_page()), static.run_script(b)
    (html, js), res["run_page_s"] = best(run_page, a.repeat)
    chunk, res["curve_chunk_s"] = best(
        lambda: render.data_script("OPEN1B_CHUNKS", big.chunk(big.chunks() - 1), 0), a.repeat)
    res.update(run_html_bytes=len(html.encode()), run_js_bytes=len(js.encode()),
               curve_chunk_bytes=len(chunk.encode()), curve_chunks=big.chunks(),
               overview_points=len(json.loads(js.split("=", 1)[1].rstrip(";\n"))
                                   ["overview"]["series"]["loss"]["y"]))
    per_step = []
    for s in sorted({1, ex.last // 2 or 1, ex.last}):
        d, t_data = best(lambda: ex.step_page(s), a.repeat)
        page, t_html = best(lambda: render.step_page(d, ex.has_step, lambda k: True), a.repeat)
        per_step.append({"step": s, "windows": len(d["windows"]),
                         "documents": sum(len(w["documents"]) for w in d["windows"]),
                         "data_s": round(t_data, 3), "html_s": round(t_html, 4),
                         "bytes": len(page.encode())})
    res["step_pages"] = per_step
    res = {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
