"""HF encode_batch vs FastEncoder (native and tiktoken backends) on the demo corpus.

Usage: .venv/bin/python -m benchmarks.data.tokenizer_speed [--threads 1 2] [--repeats 3] [--vocab 8192]

Trains the demo mix's tokenizer (its own deterministic sample), then encodes every kept
document of the demo corpus with both encoders at each thread count, in a fresh
subprocess per thread count (HF's Rayon pool size is fixed at first use by
``RAYON_RS_NUM_CPUS``). Reports best-of-``repeats`` MB/s and the ratio, and checks the ids
are identical on every document (a speedup with different ids would be meaningless).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _measure(threads: int, repeats: int, vocab: int) -> dict:
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    os.environ["RAYON_RS_NUM_CPUS"] = str(threads)
    import dataclasses

    import numpy as np

    from open1b_data.ingest import tokenizer as tk
    from open1b_data.ingest.document import Document
    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.ingest.sources import list_inputs, read_input

    mix = load_mix(default_mix_path())
    mix = dataclasses.replace(mix, tokenizer=dataclasses.replace(mix.tokenizer,
                                                                 vocab_size=vocab))
    inputs = {s.name: list_inputs(s) for s in mix.sources}
    tok = tk.train_tokenizer(mix.tokenizer, tk.select_sample(mix, inputs).texts())
    texts = [r.text for s in mix.sources for i in inputs[s.name] for r in read_input(s, i)
             if isinstance(r, Document)]
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    best = {"hf": float("inf"), "native": float("inf"), "tiktoken": float("inf")}
    same = True
    for _ in range(repeats):
        t0 = time.perf_counter()
        ref = tok.encode_batch(texts, add_special_tokens=False)
        best["hf"] = min(best["hf"], time.perf_counter() - t0)
        for backend in ("native", "tiktoken"):
            # Built afresh each round: the native encoder's piece cache starts empty.
            fast = tk.FastEncoder.from_tokenizer(tok, threads=threads, backend=backend)
            t0 = time.perf_counter()
            got = fast.encode_batch(texts)
            best[backend] = min(best[backend], time.perf_counter() - t0)
            same = same and all(r.ids == g.tolist() for r, g in zip(ref, got))
    tokens = int(sum(len(g) for g in got))
    mb = nbytes / 1e6
    return {"threads": threads, "documents": len(texts), "mb": mb, "tokens": tokens,
            "hf_mb_s": mb / best["hf"], "native_mb_s": mb / best["native"],
            "tiktoken_mb_s": mb / best["tiktoken"], "native_ratio": best["hf"] / best["native"],
            "tiktoken_ratio": best["hf"] / best["tiktoken"], "identical_ids": bool(same),
            "vocab": tok.get_vocab_size(), "numpy": np.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(_measure(args.child, args.repeats, args.vocab)))
        return
    print("| threads | docs | MB | tokens | HF encode_batch MB/s | native MB/s | ratio | "
          "tiktoken MB/s | ratio | ids identical |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.threads:
        out = subprocess.run([sys.executable, "-m", __spec__.name, "--child", str(n), "--repeats",
                              str(args.repeats), "--vocab", str(args.vocab)],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {r['threads']} | {r['documents']} | {r['mb']:.2f} | {r['tokens']} | "
              f"{r['hf_mb_s']:.2f} | {r['native_mb_s']:.2f} | {r['native_ratio']:.2f}x | "
              f"{r['tiktoken_mb_s']:.2f} | {r['tiktoken_ratio']:.2f}x | {r['identical_ids']} |")


if __name__ == "__main__":
    main()
