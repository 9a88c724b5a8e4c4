"""Opening a built mix's manifest at Open-1B scale: ``load_manifest`` now vs a baseline.

``load_manifest`` parses manifest.json, checks every field of every shard entry (two
confined paths, two sha256 digests and three counts per shard: 3,322 shards at Open-1B
scale) and recomputes the fingerprint. Measured side by side in one process, interleaved,
``--repeat`` times each (median and best):

  * ``load_manifest`` of this checkout;
  * ``load_manifest`` of ``--baseline REV`` (``git show REV:open1b_data/formats/manifest.py``,
    imported as its own module; the rest of the package is this checkout's);
  * ``check_path`` alone over the manifest's 6,644 paths, both versions;
  * anchor: ``json.loads`` of the bytes + the fingerprint (sha256 of the canonical JSON) -
    what any load that checks the fingerprint pays, whatever its field checks cost.

The mix is the synthetic Open-1B-scale one of ``benchmarks/data/stream_scale.py`` (only
its manifest.json is read here; ``stream_scale`` writes it). Results:
benchmarks/results/results-manifest-load.md, summarised in BENCHMARKS.md.

    .venv/bin/python -m benchmarks.data.manifest_load [--mix benchmarks/out/open1b-synthetic]
        [--baseline 6e2ae2d~1] [--repeat 15]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import REPO, cores, cpu_model


def baseline_module(rev: str):
    """``open1b_data/formats/manifest.py`` as it was at ``rev``, as a separate module."""
    source = subprocess.run(["git", "show", f"{rev}:open1b_data/formats/manifest.py"],
                            cwd=REPO, check=True, capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("manifest_baseline", f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules["manifest_baseline"] = module      # dataclasses look their module up
    spec.loader.exec_module(module)
    os.unlink(f.name)
    return module


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mix", default=str(REPO / "benchmarks" / "out" / "open1b-synthetic"))
    ap.add_argument("--baseline", default="6e2ae2d~1",
                    help="git revision whose manifest.py is the baseline (default: the "
                         "commit before check_path became one regex)")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    from open1b_data.formats import manifest as new

    path = Path(args.mix) / "manifest.json"
    if not path.exists():
        sys.exit(f"{path} does not exist; write the synthetic Open-1B-scale mix first: "
                 f".venv/bin/python -m benchmarks.data.stream_scale --out {args.mix}")
    old = baseline_module(args.baseline)
    raw = path.read_bytes()
    d = json.loads(raw)
    paths = [p for s in d["sources"] for sh in s["shards"]
             for p in (sh["path"], sh["lengths"]["path"])]
    shards = sum(len(s["shards"]) for s in d["sources"])
    assert new.load_manifest(args.mix).to_dict() == old.load_manifest(args.mix).to_dict()
    cases = {
        "load_manifest (this checkout)": lambda: new.load_manifest(args.mix),
        f"load_manifest ({args.baseline})": lambda: old.load_manifest(args.mix),
        "check_path x paths (this checkout)": lambda: [new.check_path(p) for p in paths],
        f"check_path x paths ({args.baseline})": lambda: [old.check_path(p) for p in paths],
        "anchor: json.loads + fingerprint": lambda: new.fingerprint(json.loads(raw)),
    }
    load0 = os.getloadavg()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeat):               # interleaved: load drifts hit all alike
        for name, fn in cases.items():
            times[name].append(timed(fn))
    load1 = os.getloadavg()
    anchor = statistics.median(times["anchor: json.loads + fingerprint"])
    print(f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
          f"{cpu_model()}, {cores()} cores; Python {platform.python_version()}; load average "
          f"{load0[0]:.1f} at the "
          f"start, {load1[0]:.1f} at the end")
    print(f"mix {args.mix}: {shards:,} shards, {len(paths):,} paths, manifest "
          f"{len(raw) / 1e6:.2f} MB; {args.repeat} interleaved repeats")
    print(f"{'what':<44} {'median ms':>10} {'best ms':>9} {'x anchor':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<44} {med * 1e3:>10.1f} {min(ts) * 1e3:>9.1f} {med / anchor:>9.2f}")
    per_old = statistics.median(times[f"check_path x paths ({args.baseline})"]) / len(paths)
    per_new = statistics.median(times["check_path x paths (this checkout)"]) / len(paths)
    print(f"check_path per path: {per_old * 1e6:.1f} us -> {per_new * 1e6:.2f} us")


if __name__ == "__main__":
    main()
