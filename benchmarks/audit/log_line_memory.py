"""Memory of reading a step log with one giant line: the peak resident memory of
``open1b-audit chain`` on an honest 8-step log (made-up digests, ``testkit/fakelog``)
and on the same log with an unhashed field of N MiB added to line 4 (the chain still holds,
so a reader that parses the line accepts it). The reader streams with a per-line bound
(``open1b_train.runlog.MAX_LINE_BYTES``): the extra memory should be about the bound, not
the line. Run it on another checkout for the anchor (the code before the bound).

    .venv/bin/python -m benchmarks.audit.log_line_memory --mib 64 400
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from benchmarks.machine import report_end, report_head
from open1b_train import runlog
from testkit import fakelog

PROBE = ("import resource, subprocess, sys\n"
         "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
         "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")


def peak_kib(run: str) -> tuple[int, int]:
    """(exit status, peak RSS KiB) of ``open1b-audit chain RUN`` in a fresh process."""
    r = subprocess.run([sys.executable, "-c", PROBE, sys.executable, "-m", "open1b_audit.cli",
                        "chain", run], capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=os.getcwd()))
    rc, kib = r.stdout.split()
    return int(rc), int(kib)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, nargs="+", default=[64, 400])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    lines = report_head("python -m benchmarks.audit.log_line_memory") + [
        f"bound: {getattr(runlog, 'MAX_LINE_BYTES', None)} bytes per line "
        f"(None: this checkout reads the log whole)", "",
        "| line 4 | exit | peak RSS MiB | over the honest log MiB | extra / line size |",
        "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as d:
        log = fakelog.lines_of(8)
        run = fakelog.write_run(os.path.join(d, "run"), log)
        rc, honest = peak_kib(run)
        lines.append(f"| honest (~1 KB) | {rc} | {honest / 1024:.0f} | - | - |")
        for mib in a.mib:
            padded = [dict(x) for x in log]
            padded[3]["pad"] = "x" * (mib << 20)
            runlog.rewrite(run, padded)
            del padded
            rc, kib = peak_kib(run)
            extra = (kib - honest) / 1024
            lines.append(f"| {mib} MiB | {rc} | {kib / 1024:.0f} | {extra:.0f} | "
                         f"{extra / mib:.2f}x |")
    report_end(lines, a.out)


if __name__ == "__main__":
    main()
