"""How big and how slow the run explorer's step pages are for an Open-1B-sized step.

Input, built once under ``--work`` (a benchmark input, not a test fixture): the committed
demo corpus (``manifests/demo``: 1,912 documents, 1.93M tokens of real text with the demo's
8,192-entry vocabulary) built with Open-1B's window and step shapes - 4,097-token windows,
micro-batch 4, reference world 48, and a schedule of two steps of the main phase's batch
(1,152 windows, 4.72M tokens) then two of the late phase's (2,304 windows, 9.44M tokens: the
largest step of ``manifests/mix-0626.toml``). A step needs several times the corpus, so the
stream runs through several epochs of every source (each epoch a fresh permutation;
``open1b_data/stream/plan.py``): the windows hold real text, decoded per document, as an
Open-1B step's do (Open-1B's 128,256-entry vocabulary puts more characters in a token, so
its pages hold more text per window than measured here, up to ``data.TEXT_BUDGET``). The
run beside it is a synthetic, validly chained ``steps.jsonl`` of those four steps (one
float32 loss per window, mesh 48x1) on that mix: the explorer reads no model, only the
log, the mix and the stream.

Measured, best of ``--repeat`` (wall seconds on this machine, bytes as written/sent):
``open1b-audit serve``'s pages of one step of each size over HTTP on loopback (rendered on
demand: the step page, its first and last window pages, its statistics page, the page of
its first document) and ``open1b-audit site --steps S:S`` for that step (every file it
writes, by kind), with document pages for the first ``--docs`` documents only: a document
page's reverse provenance costs per occurrence, and on this repeating corpus every document
occurs many times in the four steps (the report gives the measured page's count).

    .venv/bin/python -m benchmarks.audit.site_step_scale [--work build/site-step-bench]
        [--repeat 2] [--steps 1,3] [--docs 64] [--out benchmarks/results/results-site-step.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import time
import tomllib

MAIN, LATE = 1152, 2304            # mix-0626's main and late phases (windows a step)
SEQ = 4096
WORLD = (48, 1)                    # mix-0626's reference world: 48 GPUs, data-parallel
STEPS = 4


def build_input_mix(work: str) -> str:
    """The demo corpus built with Open-1B's step shapes (module docstring); reused when
    already built."""
    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.ingest.pipeline import BuildOptions, build_mix
    from testkit.mixfixture import dump_toml

    out = os.path.join(work, "mix")
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    demo = default_mix_path()
    with open(demo, "rb") as f:
        raw = tomllib.load(f)
    base = os.path.dirname(demo)
    for src in raw["sources"]:
        src["root"] = os.path.join(base, src["root"])
        if "content_store" in src:
            src["content_store"] = os.path.join(base, src["content_store"])
    raw["mix"].update(name="demo-open1b-steps", window=SEQ + 1)
    raw["schedule"] = {
        "seq_tokens": SEQ, "micro_batch": 4, "reference_world": WORLD[0] * WORLD[1],
        "stop_tokens": 2 * (MAIN + LATE) * SEQ, "lr_peak": 4.5e-4, "lr_final_ratio": 0.1,
        "warmup_tokens": MAIN * SEQ,
        "phases": [{"start_tokens": 0, "batch_sequences": MAIN},
                   {"start_tokens": 2 * MAIN * SEQ, "batch_sequences": LATE}]}
    os.makedirs(work, exist_ok=True)
    toml = os.path.join(work, "demo-open1b-steps.toml")
    with open(toml, "w") as f:
        f.write(dump_toml(raw))
    build_mix(load_mix(toml), out, BuildOptions(workers=2, progress=False))
    return out


def synthetic_run(work: str, mix: str) -> str:
    """A run directory on ``mix``: config (mesh 48x1), run info and a validly chained log of
    ``STEPS`` steps with one logged loss per window."""
    from open1b_data import StreamPlan
    from open1b_data.stream.schedule import Schedule
    from open1b_train import runlog
    from open1b_train.config import open1b
    from open1b_train.step import float32_hex
    from testkit.fakelog import COMPONENTS, _digest, rechain

    run = os.path.join(work, "run")
    plan = StreamPlan.open(mix)
    sched = Schedule.from_definition(plan.view.definition)
    rng = random.Random(0)
    g = {"config_identity": _digest("config"), "mix_fingerprint": plan.fingerprint,
         "seed": plan.seed, "params": _digest("params"), "optim": _digest("optim")}
    lines = [{"step": 0, "genesis": g, "prev": None}]
    for s in range(1, STEPS + 1):
        batch = sched.step(s).batch_sequences
        losses = [2.4 + rng.gauss(0, 0.15) for _ in range(batch)]
        sc = {"loss": float32_hex(sum(losses) / batch), "grad_norm": float32_hex(0.4),
              "lr": (4.5e-4).hex(), "skipped": False, "spike": False, "tokens": batch * SEQ,
              "window_loss": [float32_hex(x) for x in losses]}
        lines.append({"step": s, "scalars": sc, "tokens_per_s": 1.9e6,
                      "components": {c: _digest(c, s) for c in COMPONENTS}})
    rechain(lines, 0)
    os.makedirs(run, exist_ok=True)
    runlog.rewrite(run, lines)
    cfg = dataclasses.replace(open1b(), mesh=WORLD, steps=STEPS)
    with open(os.path.join(run, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f)
    with open(os.path.join(run, "run.json"), "w") as f:
        json.dump({"mix": mix}, f)
    return run


def best(f, repeat: int):
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return out, min(times)


def served(ex, step: int, repeat: int) -> list[dict]:
    """``serve``'s pages of ``step`` over HTTP on loopback: bytes and best wall seconds."""
    import threading
    import urllib.request

    from open1b_audit.site import render
    from open1b_audit.site.serve import make_server

    server = make_server(ex, 0)
    host, port = server.server_address[:2]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pages = ex.pages(step)
    names = [f"step-{step}.html"]
    if pages > 1:
        names += [render.window_page_name(step, 0), render.window_page_name(step, pages - 1),
                  render.stats_page_name(step)]
    names.append(f"doc-{ex.doc_keys(step)[0]}.html")
    out = []
    try:
        for name in names:
            def get():
                with urllib.request.urlopen(f"http://{host}:{port}/{name}", timeout=600) as f:
                    assert f.status == 200, (name, f.status)
                    return f.read()
            body, t = best(get, repeat)
            out.append({"page": name, "bytes": len(body), "seconds": round(t, 3)})
            if name.startswith("doc-"):
                occ = ex.document_page(name[4:-5])["occurrences"]
                out[-1]["note"] = f"{len(occ)} occurrences in steps 1..{ex.last}"
    finally:
        server.shutdown()
        server.server_close()
    return out


def written(ex, step: int, out: str, docs: int) -> dict:
    """``open1b-audit site --steps S:S`` for one step, with at most ``docs`` document pages:
    what it wrote, by kind of file."""
    import shutil

    from open1b_audit.site.static import write_site

    shutil.rmtree(out, ignore_errors=True)
    rep = write_site(ex, out, [step], max_docs=docs)
    kinds: dict[str, list[int]] = {}
    for root, _, files in os.walk(out):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), out)
            kind = ("step page" if rel == f"step-{step}.html" else
                    "window pages" if rel.startswith(f"step-{step}-windows-") else
                    "statistics page" if rel == f"step-{step}-stats.html" else
                    "document pages" if rel.startswith("doc-") else
                    "search index (data/search.js)" if rel == "data/search.js" else
                    "search text (data/search-text-*.js)" if rel.startswith("data/search-text")
                    else "other (run, curves, mix, coverage, step 0, assets)")
            kinds.setdefault(kind, []).append(os.path.getsize(os.path.join(root, name)))
    return {"files": rep["files"], "bytes": rep["bytes"], "largest": rep["largest"],
            "documents": rep["documents"], "seconds": round(rep["seconds"], 1),
            "step_seconds": round(rep["step_seconds_max"], 1),
            "kinds": {k: {"files": len(v), "max_bytes": max(v), "bytes": sum(v)}
                      for k, v in sorted(kinds.items())}}


def report(res: dict, args: str, machine: str, flags: str, load: str) -> str:
    m = res["mix"]
    lines = [
        "# One Open-1B-sized step in the run explorer "
        "(`python -m benchmarks.audit.site_step_scale`)", "",
        f"- command: `.venv/bin/python -m benchmarks.audit.site_step_scale {args}`",
        f"- machine: {machine}; CPU flags (SIMD subset of /proc/cpuinfo): {flags}",
        f"- {load}",
        f"- input: the demo corpus built with Open-1B's step shapes (`{m['name']}`: "
        f"{m['documents']:,} documents, {m['tokens']:,} tokens, window {m['window']:,}; "
        f"reference world {WORLD[0] * WORLD[1]}, micro-batch 4), run mesh "
        f"{WORLD[0]}x{WORLD[1]}, a synthetic validly chained log of {STEPS} steps; "
        f"best of {res['repeat']}, wall seconds", ""]
    for st in res["steps"]:
        lines += [f"## Step {st['step']}: {st['windows']:,} windows x 4,097 tokens "
                  f"({st['tokens']:,} tokens, {st['segments']:,} document segments), "
                  f"{st['pages']} window pages", "",
                  "`open1b-audit serve`, rendered on demand (HTTP on loopback):", "",
                  "| page | bytes | seconds |", "|---|---|---|"]
        lines += [f"| `{p['page']}`{' (' + p['note'] + ')' if 'note' in p else ''} | "
                  f"{p['bytes']:,} | {p['seconds']:.2f} |" for p in st["served"]]
        w = st["static"]
        lines += ["", f"`open1b-audit site --steps {st['step']}:{st['step']}` (`write_site`, "
                  f"document pages for the first {res['docs']} of the step's "
                  f"{st['documents']:,} documents): {w['files']:,} "
                  f"files, {w['bytes'] / 2**20:.1f} MiB, {w['documents']:,} document pages, "
                  f"{w['seconds']:.1f} s in all ({w['step_seconds']:.1f} s for the step's "
                  f"own pages); largest file `{w['largest']['file']}` "
                  f"{w['largest']['bytes']:,} bytes", "",
                  "| files | count | largest (bytes) | total (bytes) |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['files']:,} | {v['max_bytes']:,} | {v['bytes']:,} |"
                  for k, v in w["kinds"].items()]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="build/site-step-bench")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--steps", default="1,3", help="comma-separated steps (1-2: 1,152 "
                    "windows; 3-4: 2,304)")
    ap.add_argument("--docs", type=int, default=64, help="document pages the static site "
                    "writes (the CLI's default is 5,000; each costs what serve's doc page does)")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    a = ap.parse_args()

    from benchmarks.machine import LoadLog, describe, simd_flags
    from open1b_audit.site.data import Explorer
    from open1b_data.formats.manifest import load_manifest

    load = LoadLog()
    t = time.perf_counter()
    mix = build_input_mix(a.work)
    print(f"mix {mix} ({time.perf_counter() - t:.0f} s)", flush=True)
    run = synthetic_run(a.work, mix)
    man = load_manifest(mix)
    res: dict = {"repeat": a.repeat, "docs": a.docs, "mix": {"name": man.name, "window": man.window,
                                             "documents": man.totals["documents"],
                                             "tokens": man.totals["tokens"]}, "steps": []}
    ex = Explorer.open(run, mix)
    assert ex.finding is None, ex.finding
    for s in (int(x) for x in a.steps.split(",")):
        info = ex.sched.step(s)
        keys = ex.doc_keys(s)
        st = {"step": s, "windows": info.batch_sequences,
              "tokens": info.tokens_after - info.tokens_before, "pages": ex.pages(s),
              "segments": len(keys), "documents": len(set(keys))}
        st["served"] = served(ex, s, a.repeat)
        load.sample(f"served {s}")
        print(json.dumps(st), flush=True)
        st["static"] = written(ex, s, os.path.join(a.work, f"site-{s}"), a.docs)
        load.sample(f"static {s}")
        print(json.dumps(st["static"]), flush=True)
        res["steps"].append(st)
    args = " ".join(x for x in (f"--work {a.work}" if a.work != "build/site-step-bench"
                                else "", f"--repeat {a.repeat}", f"--steps {a.steps}",
                                f"--docs {a.docs}", f"--out {a.out}" if a.out else "") if x)
    text = report(res, args, describe(), simd_flags(), load.summary())
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
