"""The parts of one full ``open1b`` step at full width, timed here, projected to a step.

A full 24-layer step of ``benchmarks.train.full_step`` takes hours on a 2-core machine,
so its wall time is projected from parts measured at Open-1B's shapes on the CPU
reference (``force("cpu")``, the bits the trainer computes):

* **a layer** (d_model 2,048, 16/4 heads of 128, SwiGLU 5,632; ``--windows``: window 512
  and/or fully causal) on one 4,096-token sequence: ``layer_forward``, its recompute
  and ``layer_backward`` timed apart (``benchmarks.kernels.layer.setup``, one run each). The
  lean plan keeps only each layer's input and attention output and recomputes the rest of
  the layer before its backward (``model.lean_entry``), so a lean layer costs forward +
  recompute + backward - except the layers whose activations it keeps
  as the free memory and the lean plan's peak allow (``memplan.fitting``: ``--free-gib``,
  default 22, what a 24 GB machine reports available, and ``memplan.LEAN_PEAK``, 16 GB),
  which cost forward + backward as under resident. The resident plan's step opens the
  weight memo (``open1b_kernels.int8.weightmemo``: each linear's codes and rotated dX
  codes made by the step's first micro-batch, reused by the other 1,151 windows), so its
  layer is also timed as a later window sees it: one forward + backward inside the memo's
  scope first (reported as ``memo_first``), then the timed one (``resident``); the layer
  with every value made (``resident_memo_off``, the code before 2026-12-07) is projected
  beside it as the anchor.
* **the LM head and loss** (2,048 -> 128,256, 3 int8 slices, cross-entropy + z-loss,
  forward and backward: ``lmhead_forward``, ``xent_forward``/``xent_backward``,
  ``lmhead_backward``) on ``--head-tokens`` tokens, scaled linearly to 4,096 (its GEMMs are
  linear in tokens; the weight's per-call conversions are not, so the scaling slightly
  overstates the head); for the resident plan also as a later window of the memo's scope
  sees it (``memo_at_4096``: the head weight's slices made by the step's first window).

Projection = 19 windowed + 5 fully causal layers (``ModelConfig.full_layers``; a kind not
measured counts as the other) + the scaled head, per 4,096-token window. Not in it: the
embedding, the AdamW update and the state hashes (parameter-proportional, once per step:
``--update-seconds`` adds a measured figure, e.g. the optimizer time of a real
``benchmarks.train.full_step`` run) and the checkpoint. An estimate, stated as one.

The full Open-1B step is mix-0626's main batch (``manifests/mix-0626.toml``: 1,152 windows,
4,718,592 tokens): its windows are independent until the reduction, so ``--cores`` cores
run ``cores / threads`` windows at once (each at this run's thread count); the projection
counts that as linear in cores - a lower bound on time, since memory bandwidth is shared.

Each plan is timed under the allocator setting its trainer runs with
(``open1b_train.memory.allocator.keep_freed_memory``): the resident plan's process keeps freed
blocks below 1 GiB for reuse, the lean plan's those below ``LEAN_KEEP``. The parts are
therefore measured twice by default (``--allocator plans``), each time in a fresh child
process - "resident" for the resident figures, "lean" for the lean ones: one process cannot
measure both, since the setting is process-wide and sticks. "fresh" (malloc as it is) is
what the lean plan ran with before 2026-12-05, and what every projection before that date
timed all plans with: on the Zen 4 VM a window-512 layer took 2.6-2.9 s with freed memory
kept against 4.0-4.1 s with fresh pages (the page faults of its large temporaries).
``--allocator resident``, ``lean`` or ``fresh`` times everything in this process under
that one setting.

    python -m benchmarks.train.full_step_parts [--windows 512] [--head-tokens 64] [--repeats 1]
        [--allocator plans|resident|lean|fresh] [--out benchmarks/results/results-full-step.md]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

SEQ = 4096


def time_layer(window: str) -> dict:
    from benchmarks.kernels.layer import setup
    from open1b_kernels.core.backend import force
    from open1b_kernels.int8 import weightmemo
    from open1b_train.model import layer_backward, layer_forward, lean_entry

    mc, p, x, dy, _, _ = setup(SEQ, window)
    with force("cpu"):
        # untimed: this layer's fresh tensors and buffers met once, so that both ways below
        # are timed as a later window meets them
        layer_backward(mc, p, 0, dy, layer_forward(mc, p, 0, x, None)[1], {}, None)
        t0 = time.perf_counter()
        _, saved = layer_forward(mc, p, 0, x, None)
        t1 = time.perf_counter()
        x_in, o, lse = lean_entry(x, saved)
        del saved
        t2 = time.perf_counter()
        _, saved = layer_forward(mc, p, 0, x_in, None, core=(o, lse))
        t3 = time.perf_counter()
        layer_backward(mc, p, 0, dy, saved, {}, None)
        t4 = time.perf_counter()
        del saved
        # the resident plan's steady window: a step's later micro-batches find the weights'
        # values made by its first (open1b_kernels.int8.weightmemo) - timed after that first
        with weightmemo.held():
            t5 = time.perf_counter()
            layer_backward(mc, p, 0, dy, layer_forward(mc, p, 0, x, None)[1], {}, None)
            t6 = time.perf_counter()
            _, saved = layer_forward(mc, p, 0, x, None)
            t7 = time.perf_counter()
            layer_backward(mc, p, 0, dy, saved, {}, None)
            t8 = time.perf_counter()
    forward, recompute, backward = t1 - t0, t3 - t2, t4 - t3
    return {"forward": forward, "recompute": recompute, "backward": backward,
            "lean": forward + recompute + backward, "resident": t8 - t6,
            "resident_memo_off": forward + backward, "memo_first": t6 - t5,
            "memo_forward": t7 - t6, "memo_backward": t8 - t7}


def time_head(tokens: int) -> dict:
    from open1b_kernels.core.backend import force
    from open1b_kernels.int8 import weightmemo
    from open1b_kernels.ops import lmhead as lm
    from open1b_kernels.ops.xent import xent_backward, xent_forward
    from open1b_train.config import open1b

    m = open1b().model
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, m.d_model, generator=g).to(torch.bfloat16)
    w = (torch.randn(m.vocab, m.d_model, generator=g) * 0.02).to(torch.bfloat16)
    labels = torch.randint(0, m.vocab, (tokens,), generator=g)

    def window() -> tuple[float, float]:
        t0 = time.perf_counter()
        logits = lm.lmhead_forward(h, w, m.lmhead_slices)
        loss, lse = xent_forward(logits, labels)
        t1 = time.perf_counter()
        dl = xent_backward(torch.ones(()), logits, labels, lse, overwrite=True)  # the trainer's way
        del logits
        lm.lmhead_backward(dl, h, w, m.lmhead_slices)
        return t1 - t0, time.perf_counter() - t1

    scale = SEQ / tokens
    with force("cpu"):
        forward, backward = window()
        # the resident plan's steady window: the head weight's slices made by the step's
        # first window (open1b_kernels.int8.weightmemo) - timed after that first
        with weightmemo.held():
            window()
            memo = sum(window())
    return {"tokens": tokens, "forward": forward, "backward": backward,
            "at_4096": (forward + backward) * scale, "memo_at_4096": memo * scale}


def _median_run(fn, repeats: int) -> dict:
    """``fn()``'s timings: one run when ``repeats`` is 1, else one untimed warm-up and the
    run with the median total of ``repeats`` timed ones - the slower middle one for an even
    count - (all runs listed under "runs")."""
    if repeats <= 1:
        return fn()
    fn()
    runs = [fn() for _ in range(repeats)]
    key = "at_4096" if "at_4096" in runs[0] else "resident"
    best = sorted(runs, key=lambda r: r[key])[len(runs) // 2]
    return {**best, "runs": [round(r[key], 2) for r in runs]}


def main_batch_windows() -> int:
    """Windows of one full Open-1B step: mix-0626's main phase (its second, 4.7M tokens)."""
    import os
    import tomllib
    path = os.path.join(os.path.dirname(__file__), "..", "..", "manifests", "mix-0626.toml")
    with open(path, "rb") as f:
        phases = tomllib.load(f)["schedule"]["phases"]
    return int(phases[1]["batch_sequences"])


def layers_seconds(layers: dict, m, kept: frozenset[int] | None,
                   resident: str = "resident") -> float:
    """One window's layers: resident (``kept`` None: forward + backward for every layer, the
    weights' values made by the step's first window - ``resident`` = "resident_memo_off":
    made in every window, as before 2026-12-07) or lean (forward + recompute + backward,
    forward + backward for the layers in ``kept``); a layer kind not measured counts as the
    other."""
    win = layers.get("512", layers.get("full"))
    full = layers.get("full", win)
    return sum((full if i in m.full_layers else win)[
        resident if kept is None else "resident_memo_off" if i in kept else "lean"]
        for i in range(m.n_layers))


def full_step_lines(parts: dict, m, cores: int, update: float | None,
                    kept: frozenset[int] = frozenset(), free_gib: float = 0.0) -> list[str]:
    """The projection of one full Open-1B step (module docstring) as markdown lines, from
    ``parts`` = {allocator: (layers, head)} (each plan from its own allocator's parts where
    measured, else from the one measured); ``kept``: the layers the lean plan keeps with
    ``free_gib`` available."""
    from open1b_train.memory import memplan

    threads = torch.get_num_threads()
    keeps = f"lean, {len(kept)} layers kept"

    def window(alloc: str, k: frozenset[int] | None, resident: str = "resident") -> float:
        layers, head = parts.get(alloc) or next(iter(parts.values()))
        memo = k is None and resident == "resident"      # the resident plan's steady window
        return (layers_seconds(layers, m, k, resident)
                + head["memo_at_4096" if memo and "memo_at_4096" in head else "at_4096"])

    memo_off = "resident, weight memo off"
    per = {"resident": window("resident", None),
           memo_off: window("resident", None, "resident_memo_off"),
           "lean:0": window("lean", frozenset()), keeps: window("lean", kept)}
    windows = main_batch_windows()
    out = [f"Full Open-1B step ({windows:,} windows of 4,096 tokens), per window: resident "
           f"plan (forward + backward, the weights' values made by the step's first window: "
           f"`weightmemo`) {per['resident']:,.0f} s ({per[memo_off]:,.0f} s with them made in "
           f"every window), lean plan recomputing every "
           f"layer (`lean:0`, forward + recompute + backward) {per['lean:0']:,.0f} s, lean keeping "
           f"the {len(kept)} layers' activations {free_gib:g} GiB available and the plan's "
           f"{memplan.LEAN_PEAK / 1e9:g} GB peak hold (`memplan.fitting`) {per[keeps]:,.0f} s, "
           f"at {threads} threads"
           + (" (each plan timed under its trainer's allocator setting)" if len(parts) > 1
              else f" (every plan timed under the allocator setting '{next(iter(parts))}')")
           + "; the update "
           + (f"{update:,.0f} s (measured, added once)." if update is not None else
              "not included."), "",
           "| machine | plan | one full step |", "|---|---|---|"]
    for plan in ("resident", memo_off, "lean:0", keeps):
        for c, label in ((threads, f"this machine, {threads} cores"),
                         (cores, f"{cores} cores of this kind ({max(1, cores // threads)} "
                                 f"windows at once, linear: a lower bound)")):
            n = max(1, c // threads)
            t = windows * per[plan] / n + (update or 0.0) * (threads / c)
            out.append(f"| {label} | {plan} | {t:,.0f} s = **{t / 3600:.1f} h** |")
    return out


def measure(windows: str, head_tokens: int, repeats: int) -> dict:
    """The parts timed in this process (under whatever allocator setting it has): {"layers":
    {window: timings}, "head": timings}, with the load samples' summary."""
    from benchmarks.machine import LoadLog

    load = LoadLog()
    layers = {}
    for w in windows.split(","):
        print(f"[layer {w}] forward + backward at {SEQ} tokens ...", flush=True)
        layers[w] = _median_run(lambda: time_layer(w), repeats)
        print(f"[layer {w}] {layers[w]}", flush=True)
        load.sample(f"layer {w}")
    print(f"[head] {head_tokens} tokens ...", flush=True)
    head = _median_run(lambda: time_head(head_tokens), repeats)
    print(f"[head] {head}", flush=True)
    load.sample("head")
    return {"layers": layers, "head": head, "load": load.summary()}


def _child(alloc: str, a) -> dict:
    """``measure`` in a fresh interpreter whose allocator is set as ``alloc`` says: the
    setting is per process and cannot be undone (module docstring)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "parts.json")
        cmd = [sys.executable, "-m", "benchmarks.train.full_step_parts", "--allocator", alloc,
               "--windows", a.windows, "--head-tokens", str(a.head_tokens), "--repeats",
               str(a.repeats), "--parts-json", path]
        print(f"[{alloc}] {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True)
        with open(path) as f:
            return json.load(f)


def _settle(limit_s: float = 120.0) -> None:
    """Wait (at most ``limit_s``) until the 1-minute load average is back within the usable
    cores: the first child's own threads are still in it, and the next child's load log
    would mark its run "under load" for them (``benchmarks.machine``'s rule)."""
    from benchmarks.machine import cores

    t0 = time.monotonic()
    while os.getloadavg()[0] > cores() and time.monotonic() - t0 < limit_s:
        time.sleep(5)
    print(f"[plans] load {os.getloadavg()[0]:.2f} after {time.monotonic() - t0:.0f} s",
          flush=True)


ALLOCATORS = {"resident": "freed blocks below 1 GiB kept for reuse (`keep_freed_memory()`: "
                          "the resident plan's trainer)",
              "lean": "freed blocks below `LEAN_KEEP` kept (`keep_freed_memory(lean=True)`: "
                      "the lean plan's trainer)",
              "fresh": "malloc as it is, fresh pages (the lean plan's trainer before "
                       "2026-12-05)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", default="512", help="layer kinds: 512 and/or full")
    ap.add_argument("--head-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="append the markdown report here")
    ap.add_argument("--cores", type=int, default=16, help="cores of the projected machine")
    ap.add_argument("--update-seconds", type=float, default=None,
                    help="measured AdamW update + hashes of one full step, added once")
    ap.add_argument("--free-gib", type=float, default=22.0,
                    help="memory available to the lean plan, which keeps as many layers' "
                         "activations as fit (default: a 24 GB machine's)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timed runs of each part after one untimed warm-up (the median "
                         "counts); 1 = one run, no warm-up (the first call also pays for "
                         "the scratch buffers every later layer reuses)")
    ap.add_argument("--allocator", choices=("plans", *ALLOCATORS), default="plans",
                    help="plans: each plan under its trainer's allocator setting, measured in "
                         "two child processes (module docstring); resident / lean / fresh: "
                         "everything in this process under that setting")
    ap.add_argument("--parts-json", default=None, help=argparse.SUPPRESS)  # a child's output
    a = ap.parse_args()

    from benchmarks.machine import describe, simd_flags
    from open1b_train.memory import memplan
    from open1b_train.memory.allocator import keep_freed_memory
    from open1b_train.config import open1b

    if a.allocator == "plans":
        got = {}
        for n, alloc in enumerate(("resident", "lean")):
            if n:
                _settle()
            got[alloc] = _child(alloc, a)
    else:
        if a.allocator != "fresh" and not keep_freed_memory(lean=a.allocator == "lean"):
            raise SystemExit(f"--allocator {a.allocator}: this C library has no mallopt (not "
                             "glibc) or OPEN1B_MALLOPT=0 is set; use --allocator fresh")
        got = {a.allocator: measure(a.windows, a.head_tokens, a.repeats)}
        if a.parts_json:
            with open(a.parts_json, "w") as f:
                json.dump(got[a.allocator], f)
            return
    cfg = open1b()
    m = cfg.model
    n_kept = memplan.fitting(cfg, SEQ + 1, int(a.free_gib * 2**30))
    kept = frozenset(memplan.keep_order(m)[:n_kept])
    n_full = len(m.full_layers)
    lines = []
    for alloc, r in got.items():
        layers, head = r["layers"], r["head"]
        layer_s = layers_seconds(layers, m, frozenset())
        total = layer_s + head["at_4096"]
        rows = [f"| layer, window {w}, {SEQ:,} tokens | {t['forward']:.2f} | "
                f"{t['recompute']:.2f} | {t['backward']:.2f} | "
                f"{t.get('resident_memo_off', t['resident']):.2f} | {t['resident']:.2f} | "
                f"{t['lean']:.2f} |" for w, t in layers.items()]
        memo = head.get("memo_at_4096")
        rows.append(f"| LM head + loss, {head['tokens']} tokens | {head['forward']:.1f} | - | "
                    f"{head['backward']:.1f} | {head['at_4096']:.1f} (x "
                    f"{SEQ // head['tokens']}, at {SEQ:,} tokens) | "
                    + (f"{memo:.1f} (the weight's slices held)" if memo is not None
                       else "the same") + " | the same |")
        runs = [f"{name}: {t['runs']}" for name, t in [*layers.items(), ("head", head)]
                if "runs" in t]
        lines += [
            f"Allocator **{alloc}**: {ALLOCATORS[alloc]}. {r['load']}", "",
            "| part (CPU reference, Open-1B shapes) | forward s | lean recompute s (the "
            "forward but attention) | backward s | fwd + bwd s | resident s (fwd + bwd of a "
            "step's later window: the weight memo) | lean s (fwd + recompute + bwd) |",
            "|---|---|---|---|---|---|---|", *rows, "",
            *([f"Median of {a.repeats} timed runs after a warm-up (totals, s: "
               + "; ".join(runs) + ")", ""] if runs else []),
            f"Per window recomputing every layer: {m.n_layers - n_full} windowed + {n_full} "
            f"fully causal layers {layer_s:,.0f} s + LM head {head['at_4096']:,.0f} s = "
            f"**{total:,.0f} s (~{total / 60:.1f} min)**"
            + (" (the fully causal layers counted as windowed ones: not measured)"
               if "full" not in layers else "") + ".", ""]
    text = "\n".join([
        f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC - "
        f"`python -m benchmarks.train.full_step_parts --windows {a.windows} "
        f"--head-tokens {a.head_tokens} --repeats {a.repeats} --allocator {a.allocator}`", "",
        f"- machine: {describe()}; CPU flags: {simd_flags()}", "",
        *lines,
        "An estimate: the embedding, AdamW update, hashes and checkpoint are not in the "
        "per-window figures; the replay re-executes the same step, so about as long again.", "",
        *full_step_lines({k: (r["layers"], r["head"]) for k, r in got.items()}, m, a.cores,
                         a.update_seconds, kept, a.free_gib), ""])
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
