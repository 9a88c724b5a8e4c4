"""What the shards' Merkle trees cost a build, measured side by side in one process.

On the demo corpus, interleaved ``--repeat`` times:
  1. anchor     - the build-mix pipeline, 1 worker, into an output holding only the trained
                  tokenizer (list + read + filter + encode + shard + check + merge), as
                  ``benchmarks/data/build_throughput.py`` times it;
  2. writer now - ``ShardWriter`` of this checkout writing every kept document of the
                  built mix (same sources, same order, the demo's shard spec) to Parquet,
                  lengths and tree files;
  3. writer then - ``ShardWriter`` of ``--baseline REV`` (``git show``; default the commit
                  before trees) writing the same documents (Parquet and lengths only);
  4. trees alone - the leaf hashes, levels and encoding of every shard's tree, in memory;
  5. opening a mix - ``parse_manifest`` of the synthetic Open-1B-scale manifest
                  (``--synthetic``, written by ``benchmarks/data/stream_scale.py``; skipped when
                  absent) as it is and with a ``merkle`` entry added to every shard, side
                  by side: the cost of three more fields per shard entry.
The build's slowdown is (2) - (3) against (1): the median of the per-round differences
(each round runs both writers back to back, in alternating order, so a burst of load or
the aftermath of the pipeline run hits both alike). Writes
the table, command, machine and load to ``--results`` (default
``benchmarks/results/results-merkle.md``).

    .venv/bin/python -m benchmarks.data.merkle_build [--repeat 7] [--baseline REV]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.data.build_throughput import time_pipeline, train
from benchmarks.machine import REPO, RESULTS, LoadLog, describe

BASELINE = "7988655~1"     # open1b_data/formats/shards.py before shards had trees


def baseline_shards(rev: str):
    """``open1b_data/formats/shards.py`` at ``rev`` as a separate module."""
    source = subprocess.run(["git", "show", f"{rev}:open1b_data/formats/shards.py"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("shards_baseline", f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules["shards_baseline"] = module      # dataclasses look their module up
    spec.loader.exec_module(module)
    os.unlink(f.name)
    return module


def documents(mix_dir: str) -> dict[str, list]:
    """Every kept document of the built mix, per source in shard order."""
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.formats.shards import iter_documents

    m = load_manifest(mix_dir)
    return {s.name: [r for sh in s.shards for r in iter_documents(f"{mix_dir}/{sh.path}")]
            for s in m.sources}


def write_all(writer_cls, docs: dict[str, list], spec, out: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    for source, rows in docs.items():
        w = writer_cls(f"{out}/{source}/shard-00000", source, spec)
        for r in rows:
            w.add(r.tokens, r.doc_id, r.input, r.row)
        w.close()
    return time.perf_counter() - t0


def trees_alone(docs: dict[str, list], spec) -> float:
    from open1b_data.formats import merkle

    t0 = time.perf_counter()
    for rows in docs.values():
        leaves, count = [], 0
        for r in rows:
            leaves.append(merkle.leaf_hash(len(leaves), r.tokens, r.doc_id, r.input, r.row))
            count += r.tokens.size
            if count >= spec.tokens_per_shard:   # where the writer closes a shard
                merkle.encode(merkle.levels(leaves))
                leaves, count = [], 0
        merkle.encode(merkle.levels(leaves))
    return time.perf_counter() - t0


def manifest_cost(path: str, repeat: int) -> tuple[int, int, int, float, float] | None:
    """(shards, bytes without trees, bytes with, median s without, median s with)."""
    import json

    from open1b_data.formats import manifest as mf

    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        plain = f.read()
    d = json.loads(plain)
    shards = 0
    for s in d["sources"]:
        for sh in s["shards"]:
            sh["merkle"] = {"root": "a" * 64, "sha256": "b" * 64,
                            "path": sh["path"].removesuffix(".parquet") + ".merkle"}
            shards += 1
    d["fingerprint"] = mf.fingerprint(d)
    trees = (json.dumps(d, indent=1) + "\n").encode()
    runs: dict[bytes, list[float]] = {plain: [], trees: []}
    for _ in range(repeat):
        for raw in runs:
            t0 = time.perf_counter()
            mf.parse_manifest(raw, path)
            runs[raw].append(time.perf_counter() - t0)
    return (shards, len(plain), len(trees), statistics.median(runs[plain]),
            statistics.median(runs[trees]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="interleaved runs; medians kept")
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the old writer")
    ap.add_argument("--synthetic", default=str(
        REPO / "benchmarks" / "out" / "open1b-synthetic" / "manifest.json"))
    ap.add_argument("--results", default=str(RESULTS / "results-merkle.md"))
    args = ap.parse_args()

    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.formats.shards import ShardWriter

    old = baseline_shards(args.baseline)
    mix = load_mix(default_mix_path())
    tmp = tempfile.mkdtemp(prefix="open1b-merkle-")
    runs: dict[str, list[float]] = {k: [] for k in ("pipeline", "now", "then", "trees")}
    load = LoadLog()
    try:
        out = os.path.join(tmp, "mix")
        train(mix, out)
        result = time_pipeline(mix, out, 1)[2]
        docs = documents(out)
        writers = [("now", ShardWriter), ("then", old.ShardWriter)]
        for k in range(args.repeat):
            runs["pipeline"].append(time_pipeline(mix, out, 1)[0])
            for name, cls in writers[::1 if k % 2 else -1]:   # alternate who goes first
                runs[name].append(write_all(cls, docs, mix.shards, f"{tmp}/{name}"))
            runs["trees"].append(trees_alone(docs, mix.shards))
            load.sample("round")
        for name in os.listdir(f"{tmp}/now/dclm-baseline"):   # same shards, plus the trees
            if name.endswith((".parquet", ".lengths.npy")):
                with (open(f"{tmp}/now/dclm-baseline/{name}", "rb") as a,
                        open(f"{tmp}/then/dclm-baseline/{name}", "rb") as b):
                    assert a.read() == b.read(), name
        opening = manifest_cost(args.synthetic, 2 * args.repeat + 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in runs.items()}
    extra = statistics.median(a - b for a, b in zip(runs["now"], runs["then"]))
    build = med["pipeline"]
    n_docs = sum(len(v) for v in docs.values())
    rows = [("anchor: build-mix pipeline, 1 worker (tokenizer trained)", "pipeline"),
            ("ShardWriter now (Parquet + lengths + tree)", "now"),
            (f"ShardWriter at {args.baseline} (Parquet + lengths)", "then"),
            ("trees alone (leaf hashes + levels + encoding)", "trees")]
    text = [
        "# What Merkle trees cost a build (benchmarks/data/merkle_build.py)", "",
        f"- command: `.venv/bin/python -m benchmarks.data.merkle_build --repeat {args.repeat}"
        f"{'' if args.baseline == BASELINE else ' --baseline ' + args.baseline}`",
        f"- machine: {describe()}",
        f"- {load.summary()}",
        f"- mix: {mix.name} ({n_docs:,} documents, {result.tokens:,} tokens, "
        f"{sum(len(s.shards) for s in result.manifest.sources)} shards); medians of "
        f"{args.repeat} interleaved runs; both writers wrote byte-identical Parquet and "
        f"lengths files (asserted)", "",
        "| what | median s | runs (s) | x anchor |", "|---|---|---|---|",
        *[f"| {name} | {med[k]:.4f} | {', '.join(f'{x:.3f}' for x in runs[k])} | "
          f"{med[k] / build:.4f} |" for name, k in rows], "",
        f"- **build slowdown: median of per-round (writer now - writer then) = "
        f"{extra * 1e3:.1f} ms = {extra / build:+.2%} of the pipeline**; the trees' own work is "
        f"{med['trees'] / build:.2%} of the build ({med['trees'] / result.tokens * 1e9:.1f} "
        f"ns per token, {med['trees'] / n_docs * 1e6:.1f} us per document)", ""]
    if opening is not None:
        shards, a, b, ta, tb = opening
        text += [f"- opening a mix: `parse_manifest` of the synthetic Open-1B-scale manifest "
                 f"({shards:,} shards), median of {2 * args.repeat + 1} interleaved: "
                 f"{ta * 1e3:.1f} ms as built without trees ({a / 1e6:.2f} MB, the anchor), "
                 f"**{tb * 1e3:.1f} ms with a tree entry per shard ({b / 1e6:.2f} MB, "
                 f"{tb / ta:.2f}x)**", ""]
    with open(args.results, "w") as f:
        f.write("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
