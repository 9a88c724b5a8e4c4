"""What ``open1b-audit fetch-step`` reads for one step, against what it would take without
proofs: the shards the step touches downloaded whole, and the whole mix.

Builds the demo mix (or takes ``--mix``), then for each ``--steps`` value fetches, proves
and rebuilds the step's windows (``open1b_audit.fetch.fetch_step``, local files: the bytes
and requests are the same over S3, ``tests/audit/test_fetch.py``) and records the bytes by
what they were for, the requests and the wall time. Writes ``--results`` (default
``benchmarks/results/results-fetch.md``).

    .venv/bin/python -m benchmarks.audit.fetch_step [--steps 1,10,70,140] [--mix DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from benchmarks.machine import RESULTS, LoadLog, describe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="1,10,70,140", help="comma-separated steps")
    ap.add_argument("--mix", default=None, help="a built mix (default: build the demo)")
    ap.add_argument("--results", default=str(RESULTS / "results-fetch.md"))
    args = ap.parse_args()

    from open1b_audit.fetch import fetch_step
    from open1b_data.formats.manifest import load_manifest

    load = LoadLog()
    tmp = None
    mix = args.mix
    if mix is None:
        from open1b_data.formats.definition import default_mix_path, load_mix
        from open1b_data.ingest.pipeline import BuildOptions, build_mix

        tmp = tempfile.mkdtemp(prefix="open1b-fetch-")
        mix = os.path.join(tmp, "demo")
        build_mix(load_mix(default_mix_path()), mix, BuildOptions(workers=1, progress=False))
    try:
        m = load_manifest(mix)
        lines = []
        for step in (int(s) for s in args.steps.split(",")):
            fetch_step(mix, step)                      # warm: imports, page cache
            t0 = time.perf_counter()
            d = fetch_step(mix, step)
            wall = time.perf_counter() - t0
            touched = sum(m.source(s).shards[h].bytes
                          for s, h in {(x.source, x.shard) for x in d.documents})
            b = d.bytes_fetched
            lines.append(
                f"| {step} | {len(d.windows)} | {len(d.documents)} | {d.shards} | "
                f"{b['manifest']:,} | {b['lengths']:,} | {b['footers']:,} | "
                f"{b['row_groups']:,} | {b['proofs']:,} | **{b['total']:,}** | {d.requests} | "
                f"{touched:,} ({b['total'] / touched:.2f}x) | "
                f"{d.mix_bytes:,} (**{b['total'] / d.mix_bytes:.1%}**) | {wall:.2f} |")
            load.sample(f"step {step}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    text = [
        "# Bytes one audited step reads (benchmarks/audit/fetch_step.py)", "",
        f"- command: `.venv/bin/python -m benchmarks.audit.fetch_step --steps {args.steps}"
        f"{' --mix ' + args.mix if args.mix else ''}`",
        f"- machine: {describe()}",
        f"- {load.summary()}",
        f"- mix: {m.name} ({m.totals['documents']:,} documents, {m.totals['tokens']:,} "
        f"tokens, {len(m.shards())} shards, docs_per_row_group "
        f"{m.definition['shards']['docs_per_row_group']})", "",
        "| step | windows | documents | shards | manifest | lengths | footers | row groups | "
        "proofs | total bytes | requests | anchor 1: touched shards whole | anchor 2: whole "
        "mix (token shards) | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *lines, ""]
    with open(args.results, "w") as f:
        f.write("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
