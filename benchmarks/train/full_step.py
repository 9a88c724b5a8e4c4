"""One real step of the ``open1b`` preset, end to end: train, checkpoint, replay.

Input, built once under ``--work`` (a benchmark input, not a test fixture; ``--mix`` reuses
a built one): the committed demo corpus (``manifests/demo``, 1,912 documents of real text)
built as ``benchmarks.audit.site_step_scale`` builds it - Open-1B's 4,097-token windows,
the demo's sources and filters - with two changes:

* **the tokenizer has Open-1B's vocabulary.** ``open1b`` pins ``model.vocab = 128,256`` and
  the trainer refuses a mix whose tokenizer has another size (``run.resolve``). The demo's
  own tokenizer has 8,192 entries. Under mix-0626's word-level split the corpus has too few
  distinct merges for 128,256 (the BPE stops at 60,599 entries with ``min_frequency = 1``
  on the whole corpus, measured), so the benchmark's tokenizer pre-splits on lines
  (``LINE_SPLIT``: merges may cross words, up to mix-0626's 32 bytes a token) and trains on
  the whole corpus (``sample_bytes`` above its size) with ``min_frequency = 1``: it reaches
  128,256 entries exactly (686,944 tokens; the build checks the trained size). The split
  changes which tokens a window holds, not the step's shapes or work. ``--vocab N`` builds
  the same mix with an N-entry tokenizer for a smoke run.
* **the schedule makes a step one window per virtual rank**: ``micro_batch = 1``,
  ``reference_world = R*S`` of ``--mesh`` (default 1x1) and ``batch_sequences = R*S``, so
  step 1 is ``R*S`` windows of 4,096 trained tokens. A schedule's batch must be a multiple
  of ``micro_batch * reference_world`` and a run's mesh must divide it, so one window on
  mesh 1x1 is the smallest step the recipe allows; it is also the micro-batch the memory
  plans' estimates are stated for (4,097 tokens). A larger mesh adds one full forward and
  backward per virtual rank (all on this one process) and, for dp_shard > 1 or
  dp_replicate > 1, a flat gradient buffer or TreeFold partials. Learning rate: mix-0626's
  peak and final ratio, warm-up over 8 steps, 16 steps to the stop: step 1 updates with
  lr_peak / 8, a real (non-zero) update.

Then, each a subprocess of the CLIs, with ``--memory-plan lean`` (the plan a 24 GB machine
needs for the full model: estimated ~14 GiB recomputing every layer against ~66 GiB
resident; by default lean keeps as many layers' activations as the free memory holds,
``--plan lean:0`` recomputes all):

1. ``open1b-train run --config CFG --mix MIX --steps 1 --memory-plan lean``, CFG = the
   ``open1b`` preset with ``mesh`` and ``checkpoint_every = 1`` (a checkpoint at step 1);
   ``--layers`` / ``--width`` override ``model.n_layers`` / the width (d_model, heads of 128,
   SwiGLU at 2.75 x) for a smoke run of the same code path - the replay then names these
   as departures from the recipe, as it must.
2. ``open1b-audit replay RUN --step 1 --memory-plan lean --json``: re-executes step 1 from
   genesis and compares every component digest.

Recorded per subprocess: wall seconds, peak resident memory (VmHWM, polled from
``/proc/PID/status`` every 0.2 s; the kernel keeps the high-water mark, so polling loses
nothing but the last 0.2 s) and the lines it printed; plus the run hash, the replay's
verdict and its own timing. Progress goes to the terminal; results to ``--json`` and
``--out`` (markdown, appended).

    python -m benchmarks.train.full_step [--work build/full-step-bench] [--mix DIR]
        [--mesh 1x1] [--layers 24] [--width 2048] [--vocab 128256]
        [--json FILE] [--out benchmarks/results/results-full-step.md]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import tomllib

SEQ = 4096
OPEN1B_VOCAB = 128_256
WARMUP_STEPS, STOP_STEPS = 8, 16
# pre-tokens are whole lines (module docstring): under mix-0626's word-level split the demo
# corpus has only 60,599 reachable BPE entries (measured, min_frequency 1, whole corpus)
LINE_SPLIT = "[^\\n]+\\n*|\\n+"


# ----------------------------------------------------------------------------- the mix

def mix_toml(vocab: int, ranks: int) -> dict:
    """The demo mix definition with Open-1B's windows, a ``vocab``-entry tokenizer and a
    schedule of ``ranks`` windows a step (module docstring)."""
    from open1b_data.formats.definition import default_mix_path

    demo = default_mix_path()
    with open(demo, "rb") as f:
        raw = tomllib.load(f)
    with open(os.path.join(os.path.dirname(demo), "mix-0626.toml"), "rb") as f:
        big = tomllib.load(f)
    base = os.path.dirname(demo)
    for src in raw["sources"]:
        src["root"] = os.path.join(base, src["root"])
        if "content_store" in src:
            src["content_store"] = os.path.join(base, src["content_store"])
    raw["mix"].update(name=f"demo-open1b-step-v{vocab}-r{ranks}", window=SEQ + 1)
    # the whole corpus as the BPE's sample, every pair mergeable: 128,256 entries need it
    raw["tokenizer"] = {**big["tokenizer"], "vocab_size": vocab, "sample_bytes": 100_000_000,
                        "min_frequency": 1, "split_pattern": LINE_SPLIT}
    step = ranks * SEQ
    raw["schedule"] = {
        "seq_tokens": SEQ, "micro_batch": 1, "reference_world": ranks,
        "stop_tokens": STOP_STEPS * step, "lr_peak": big["schedule"]["lr_peak"],
        "lr_final_ratio": big["schedule"]["lr_final_ratio"],
        "warmup_tokens": WARMUP_STEPS * step,
        "phases": [{"start_tokens": 0, "batch_sequences": ranks}]}
    return raw


def build_input_mix(work: str, vocab: int, ranks: int) -> str:
    """Build (or reuse) the mix of ``mix_toml`` under ``work``; its tokenizer must have
    exactly ``vocab`` entries."""
    from open1b_data.formats.definition import load_mix
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.ingest.pipeline import BuildOptions, build_mix
    from testkit.mixfixture import dump_toml

    raw = mix_toml(vocab, ranks)
    out = os.path.join(work, raw["mix"]["name"])
    if not os.path.exists(os.path.join(out, "manifest.json")):
        os.makedirs(work, exist_ok=True)
        toml = out + ".toml"
        with open(toml, "w") as f:
            f.write(dump_toml(raw))
        build_mix(load_mix(toml), out, BuildOptions(workers=2, progress=True))
    got = int(load_manifest(out).tokenizer["vocab_size"])
    if got != vocab:
        raise SystemExit(f"{out}: the BPE reached {got:,} entries, not {vocab:,}: the corpus "
                         f"has too few distinct merges for this vocabulary")
    return out


# ----------------------------------------------------------------------------- the runs

def model_overrides(layers: int | None, width: int | None) -> dict:
    """``[model]`` overrides of a smoke run: layers, and a width with Open-1B's proportions
    (heads of 128, 4 query heads per KV head where there are 4, SwiGLU at 2.75 x d_model)."""
    out: dict = {}
    if layers is not None:
        out["n_layers"] = layers
    if width is not None:
        if width % 128:
            raise SystemExit(f"--width must be a multiple of 128 (heads of 128), got {width}")
        heads = width // 128
        out.update(d_model=width, n_heads=heads, n_kv_heads=max(1, heads // 4),
                   ffn=-(-width * 11 // 4 // 64) * 64)
    return out


def write_config(path: str, mesh: tuple[int, int], model: dict) -> None:
    from testkit.mixfixture import dump_toml

    body = {"preset": "open1b", "mesh": list(mesh), "checkpoint_every": 1}
    text = "\n".join(f"{k} = {json.dumps(v)}" for k, v in body.items()) + "\n\n"
    if model:
        text += dump_toml({"model": model})
    with open(path, "w") as f:
        f.write(text)


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def timed(label: str, cmd: list[str], log: str, echo: bool = True) -> dict:
    """Run ``cmd``, echo its output (prefixed, unless ``echo`` is off) and tee it to
    ``log``; wall seconds, peak RSS (VmHWM polled every 0.2 s) and the output lines."""
    print(f"[{label}] {' '.join(cmd)}", flush=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, bufsize=1)
    hwm = [0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            hwm[0] = max(hwm[0], _status_kib(p.pid, "VmHWM"))
            done.wait(0.2)
    threading.Thread(target=poll, daemon=True).start()
    out = []
    with open(log, "w") as f:
        for line in p.stdout:
            f.write(line)
            out.append(line.rstrip("\n"))
            if echo:
                print(f"[{label}] {line.rstrip()[:200]}", flush=True)
    rc = p.wait()
    done.set()
    seconds = time.perf_counter() - t0
    print(f"[{label}] exit {rc}, {seconds:.1f} s, peak RSS {hwm[0] / 2**20:.2f} GiB", flush=True)
    return {"command": cmd, "rc": rc, "seconds": round(seconds, 1),
            "vmhwm_bytes": hwm[0] * 1024, "output": out}


def train_and_replay(mix: str, work: str, mesh: tuple[int, int], model: dict,
                     plan: str = "lean") -> dict:
    import shutil

    name = "run" + "".join(f"-{k}{v}" for k, v in sorted(model.items()))
    os.makedirs(work, exist_ok=True)            # a new --work with a reused --mix
    run = os.path.join(work, name)
    shutil.rmtree(run, ignore_errors=True)
    cfg = run + ".toml"
    write_config(cfg, mesh, model)
    py = sys.executable
    train = timed("train", [py, "-m", "open1b_train.cli", "run", "--config", cfg, "--mix", mix,
                            "--out", run, "--steps", "1", "--memory-plan", plan, "--quiet"],
                  run + "-train.log")
    if train["rc"]:
        raise SystemExit(f"train failed (exit {train['rc']}): see {run}-train.log")
    run_hash = next(ln.split(": ", 1)[1] for ln in train["output"] if ln.startswith("run hash"))
    ckpt = os.path.join(run, "checkpoints")
    ckpt_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(ckpt)
                     for f in fs) if os.path.isdir(ckpt) else 0
    replay = timed("replay", [py, "-m", "open1b_audit.cli", "replay", run, "--step", "1",
                              "--memory-plan", plan, "--json"], run + "-replay.log",
                    echo=False)
    text = "\n".join(replay["output"])
    rep = json.loads(text[text.index("{"):text.rindex("}") + 1])
    return {"run": run, "run_hash": run_hash, "checkpoint_bytes": ckpt_bytes,
            "train": {k: v for k, v in train.items() if k != "output"},
            "train_tail": train["output"][-8:],
            "replay": {k: v for k, v in replay.items() if k != "output"},
            "replay_report": {k: rep.get(k) for k in (
                "verdict", "verified_steps", "finding", "seconds", "step_seconds",
                "peak_memory_bytes", "recipe", "memory_plan_text")}}


# ----------------------------------------------------------------------------- the report

def report(res: dict, load: str) -> str:
    from benchmarks.machine import describe, simd_flags

    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    tr, rp, rr = res["train"], res["replay"], res["replay_report"]
    m = res["model"]
    what = ("the full `open1b` preset" if not res["overrides"] else
            "a **smoke** run: `open1b` with " + ", ".join(f"model.{k} = {v}" for k, v in
                                                          res["overrides"].items()))
    dep = (rr.get("recipe") or {}).get("departures") or []
    lines = [
        f"\n## {res['date']} - `python -m benchmarks.train.full_step {res['args']}`", "",
        f"- machine: {describe()}; CPU flags: {simd_flags()}",
        f"- {load}",
        f"- what: {what} ({m['n_layers']} layers x {m['d_model']:,}, vocabulary "
        f"{m['vocab']:,}, {res['params']:,} parameters), mesh {res['mesh']}, one step of "
        f"{res['windows']} window(s) x 4,097 tokens, `--memory-plan {res['plan']}` in train "
        f"and replay",
        f"- the replay's plan: {rr.get('memory_plan_text') or '-'}",
        f"- mix: `{res['mix']}` ({res['mix_documents']:,} documents, "
        f"{res['mix_tokens']:,} tokens, tokenizer {res['mix_vocab']:,} entries)", "",
        "| phase | wall s | peak RSS (VmHWM) | notes |", "|---|---|---|---|",
        f"| `open1b-train run --steps 1` | {tr['seconds']:.1f} | {gib(tr['vmhwm_bytes'])} | "
        f"checkpoint at step 1: {res['checkpoint_bytes'] / 2**30:.2f} GiB on disk |",
        f"| `open1b-audit replay --step 1` | {rp['seconds']:.1f} | {gib(rp['vmhwm_bytes'])} | "
        f"verdict **{rr['verdict']}**, replay's own timing {rr['seconds']:.1f} s, its "
        f"peak {gib(rr['peak_memory_bytes'])} |", "",
        f"- run hash (step 1): `{res['run_hash']}`",
        f"- estimated peak (memplan.estimate, 4,097 tokens): lean recomputing every layer "
        f"{gib(res['estimate']['lean'])}, resident {gib(res['estimate']['resident'])}",
        "- recipe departures named by the replay: "
        + (", ".join(f"{d['field']} {d['preset']!r} -> {d['run']!r}" for d in dep) or "none")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="build/full-step-bench", help="mix, runs and logs")
    ap.add_argument("--mix", default=None, help="a built mix to reuse (default: build it)")
    ap.add_argument("--mesh", default="1x1", help="RxS; a step is R*S windows")
    ap.add_argument("--layers", type=int, default=None, help="smoke: model.n_layers")
    ap.add_argument("--width", type=int, default=None, help="smoke: d_model (heads of 128, "
                    "FFN 2.75x)")
    ap.add_argument("--vocab", type=int, default=OPEN1B_VOCAB, help="smoke: tokenizer and "
                    "model vocabulary (default Open-1B's 128,256)")
    ap.add_argument("--plan", default="lean", help="--memory-plan of train and replay "
                    "(lean: as many layers kept as fit; lean:0 recomputes all)")
    ap.add_argument("--json", default=None, help="write the result as JSON here")
    ap.add_argument("--out", default=None, help="append the markdown report here")
    a = ap.parse_args()

    import dataclasses
    import datetime

    from benchmarks.machine import LoadLog
    from open1b_data.formats.manifest import load_manifest
    from open1b_train.memory import memplan
    from open1b_train.config import apply_overrides, open1b
    from open1b_train.params import count

    load = LoadLog()
    mesh = tuple(int(x) for x in a.mesh.lower().split("x"))
    ranks = mesh[0] * mesh[1]
    t = time.perf_counter()
    mix = a.mix or build_input_mix(a.work, a.vocab, ranks)
    print(f"[mix] {mix} ({time.perf_counter() - t:.0f} s)", flush=True)
    load.sample("mix")
    man = load_manifest(mix)
    overrides = model_overrides(a.layers, a.width)
    if a.vocab != OPEN1B_VOCAB:
        overrides["vocab"] = a.vocab
    cfg = apply_overrides(dataclasses.replace(open1b(), mesh=mesh), {"model": overrides})
    res = train_and_replay(mix, a.work, mesh, overrides, a.plan)
    load.sample("runs")
    res.update(
        date=f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        args=" ".join(sys.argv[1:]), mix=mix, mesh=a.mesh, windows=ranks, plan=a.plan,
        overrides=overrides, model=dataclasses.asdict(cfg.model),
        params=count(cfg.model)["total"],
        mix_documents=man.totals["documents"], mix_tokens=man.totals["tokens"],
        mix_vocab=int(man.tokenizer["vocab_size"]),
        estimate={p: memplan.estimate(cfg, SEQ + 1, p) for p in memplan.PLANS})
    text = report(res, load.summary())
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text)
    if res["replay_report"]["verdict"] != "match":
        raise SystemExit("the replay did not match")


if __name__ == "__main__":
    main()
