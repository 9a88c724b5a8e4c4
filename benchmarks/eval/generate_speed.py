"""Decode speed of ``open1b-train generate`` (the reproducible runtime, CPU reference, KV
cache) against the exported model in transformers (``open1b_eval.hf``, float32 torch, no
KV cache), side by side in one run on one machine, plus the agreement of their logits on
held-out windows (text this repository wrote, never in a mix).

    .venv/bin/python -m benchmarks.eval.generate_speed --run build/demo-run
        --out benchmarks/results/results-generate.md

Greedy decoding of ``--new`` tokens after a ``--prompt-tokens`` prompt, ``--repeat`` times
each, median reported; torch threads = ``--threads``. Tokens/s counts new tokens over the
whole call (prefill included). Both sides must produce the same number of tokens (the
separator is not treated as a stop).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import LoadLog, cores, cpu_model  # noqa: E402
from open1b_eval.decoder import Decoder  # noqa: E402
from open1b_eval.export import export  # noqa: E402
from open1b_eval.generate import generate  # noqa: E402
from open1b_eval.trained import load  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = [ROOT / "docs" / "TRAINING.md", ROOT / "open1b_train" / "reduction" / "treefold.py",
            ROOT / "STREAM.md"]


def cpu_flags() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    flags = next((ln.split(":", 1)[1].split() for ln in out.splitlines()
                  if ln.startswith("Flags")), [])
    keep = [f for f in flags if f.startswith(("avx", "amx", "fma", "sse4", "f16c", "vnni"))]
    return " ".join(keep) or "none listed"


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def agreement(t, hf, window: int) -> dict:
    dec = Decoder(t.cfg, t.params)
    diffs, agree, n = [], 0, 0
    for path in HELD_OUT:
        ids = t.encode_prompt(path.read_text(encoding="utf-8"))
        for s in range(0, min(len(ids) - window, 4 * window), window):
            x = torch.tensor([ids[s:s + window]])
            rt = dec.forward(x)[0]
            with torch.no_grad():
                h = hf(x).logits[0].float()
            diffs.append((h - rt).abs().flatten())
            agree += int((h.argmax(-1) == rt.argmax(-1)).sum())
            n += window
    d = torch.cat(diffs)
    return {"windows": n // window, "window": window, "max_abs": d.max().item(),
            "mean_abs": d.mean().item(), "top1": agree / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    log = LoadLog()
    t = load(a.run, a.step)
    prompt = t.encode_prompt((ROOT / "README.md").read_text())[:a.prompt_tokens]
    dec = Decoder(t.cfg, t.params)
    rt_s, rt_tokens = timed(lambda: generate(dec, [prompt], a.new)[0], a.repeat)
    log.sample("runtime")

    import open1b_eval.hf  # noqa: F401
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        export(t, os.path.join(tmp, "hf"))
        hf = AutoModelForCausalLM.from_pretrained(os.path.join(tmp, "hf")).eval()
    x = torch.tensor([prompt])
    with torch.no_grad():
        hf_s, hf_out = timed(lambda: hf.generate(x, max_new_tokens=a.new, min_new_tokens=a.new,
                                                 do_sample=False), a.repeat)
    log.sample("transformers")
    hf_tokens = hf_out[0, len(prompt):].tolist()
    same = next((i for i, (p, q) in enumerate(zip(rt_tokens, hf_tokens)) if p != q), len(rt_tokens))
    agr = agreement(t, hf, a.window)
    log.sample("agreement")
    c = t.cfg
    lines = [
        "# Decode speed: `open1b-train generate` vs the exported model in transformers",
        "",
        f"`{' '.join(['.venv/bin/python', 'benchmarks/eval/generate_speed.py'] + sys.argv[1:])}`",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {cpu_model()}, {cores()} usable cores, torch threads {a.threads}; "
        f"CPU flags (lscpu, SIMD subset): {cpu_flags()}",
        f"- software: Python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"transformers {__import__('transformers').__version__}",
        f"- {log.summary()}",
        f"- model: run `{a.run}` step {t.step} ({c.n_layers} layers x {c.d_model}, "
        f"{c.n_heads}/{c.n_kv_heads} heads x {c.head_dim}, FFN {c.ffn}, vocab {c.vocab})",
        f"- greedy, prompt {len(prompt)} tokens, {a.new} new tokens, median of {a.repeat}",
        "",
        "| side | what runs | seconds | new tokens/s |",
        "|---|---|---|---|",
        f"| open1b `generate` | reproducible runtime, CPU reference kernels, KV cache | "
        f"{rt_s:.3f} | {a.new / rt_s:.1f} |",
        f"| transformers `generate` | exported model (`open1b_eval.hf`), float32 torch, "
        f"W8A8 fake-quant, no KV cache | {hf_s:.3f} | {a.new / hf_s:.1f} |",
        "",
        f"Ratio (runtime / transformers time): {rt_s / hf_s:.2f}x. Greedy tokens identical "
        f"for the first {same} of {a.new}.",
        "",
        f"Logit agreement on {agr['windows']} held-out windows of {agr['window']} tokens "
        f"({', '.join(p.name for p in HELD_OUT)}: text of this repository, in no mix): max "
        f"|diff| {agr['max_abs']:.4f}, mean |diff| {agr['mean_abs']:.5f}, top-1 agreement "
        f"{100 * agr['top1']:.2f}%.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
