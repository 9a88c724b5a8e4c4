"""Tamper detection: how many ways of tampering with a published run the audit catches.

An honest ``micro`` run (8 steps, checkpoints every 2) on a small built mix, then a copy
tampered in each way of ``testkit/tamper.py``; each copy is audited the way auditors
covering a whole run do it (every checkpoint interval replayed with ``open1b-audit``'s
``replay``). A case counts as caught when the audit reports a finding, and as named when
that finding's step and component are the expected ones. The honest run must pass. Then
forged auditors (``testkit/auditors.py``); the hostile files of
``testkit/hostile.py``, each through the real ``open1b-audit`` command in a
subprocess: caught when it exits as expected naming the file and what is wrong, and nothing
of the auditor's was published, written through or fetched; and forgeries of what users take
away (``testkit/released.py``), each where a user meets it.

    .venv/bin/python -m benchmarks.audit.audit_tamper --out benchmarks/results/results-tamper.md
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.machine import report_end, report_head
from open1b_train import runlog
from open1b_train.train import train
from testkit import auditors, hostile, released, tamper
from testkit.runs import cli_env, micro_cfg
from testkit.trainmix import train_mix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    lines = report_head("python -m benchmarks.audit.audit_tamper") + [
        "", "| tampering | caught | reported at (step, component) | expected | audit s |",
        "|---|---|---|---|---|"]
    caught = named = 0
    with tempfile.TemporaryDirectory() as d:
        mix4 = train_mix(Path(d) / "mix4", steps=24, batch=4)
        ref = os.path.join(d, "ref")
        train(micro_cfg(steps=tamper.STEPS), mix4, ref, progress=False)
        published = runlog.read(ref)[-1]["hash"]
        honest = tamper.audit_all(ref, expect=published)
        other = tamper.rank_gradient(mix4, os.path.join(d, "other"))[0]
        for i, (case, (component, step)) in enumerate(tamper.CASES.items()):
            work = os.path.join(d, f"case{i}")
            os.makedirs(work)
            run, mix, at = tamper.make(case, ref, mix4, other, work)
            want = (component, at if step is None else step)
            t0 = time.perf_counter()
            pinned = any(k in case for k in tamper.PINNED)
            found = tamper.audit_all(run, mix, published if pinned else None)
            dt = time.perf_counter() - t0
            got = None if found is None else (found.component, found.step)
            caught += found is not None
            named += got == want
            lines.append(f"| {case} | {'yes' if found else '**no**'} | "
                         f"{'-' if got is None else f'{got[1]}, {got[0]}'} | "
                         f"{want[1]}, {want[0]} | {dt:.1f} |")
        n = len(tamper.CASES)
        lines.append(f"\n**caught {caught} / {n}**, step and component named as expected in "
                     f"{named} / {n}; the honest run: "
                     f"{'passes' if honest is None else 'FLAGGED: ' + str(honest)}.")
        lines += ["", "Forged auditors (`open1b-audit coverage`, redundancy 3, certificates "
                  "written from the log without replaying anything):", "",
                  "| forgery | caught | steps counted covered | listed at step |",
                  "|---|---|---|---|"]
        forged = auditors.coverage_forgeries(runlog.read(ref), os.path.join(d, "keys"))
        ok = 0
        for name, (rep, step) in forged.items():
            hit = auditors.coverage_caught(rep, step)
            ok += hit
            lines.append(f"| {name} | {'yes' if hit else '**no**'} | {rep['covered']} | {step} |")
        lines.append(f"\n**caught {ok} / {len(forged)}** forged-auditor cases.")
        lines += ["", "Hostile files (each through the real `open1b-audit` command in a "
                  "subprocess; testkit/hostile.py):", "",
                  "| hostile file | class | caught | what the command said | s |",
                  "|---|---|---|---|---|"]
        ok = 0
        for i, (name, (kind, _)) in enumerate(hostile.CASES.items()):
            t0 = time.perf_counter()
            got = hostile.run(hostile.make(name, ref, mix4, os.path.join(d, f"hostile{i}")),
                              cli_env())
            ok += got.caught
            said = got.detail.replace("|", "\\|").replace(d, "$TMP")
            lines.append(f"| {name} | {kind} | {'yes' if got.caught else '**no**'} | {said} | "
                         f"{time.perf_counter() - t0:.1f} |")
        lines.append(f"\n**caught {ok} / {len(hostile.CASES)}** hostile files.")
        lines += ["", "What users take away (the released weights, the config they are "
                  "read with, the tokenizer, an export, the recipe and the mix), checked "
                  "where a user meets them (`open1b_train.published` for every loader, "
                  "`replay`, `verify-model`):", "",
                  "| forgery | refused | reported | must name |", "|---|---|---|---|"]
        cases = released.audit_cases(ref, mix4, os.path.join(d, "released"))
        hits = 0
        for case, got, want in cases:
            hit = got is not None and want in got
            hits += hit
            shown = "-" if got is None else got.replace(d, "...").replace("|", "/")
            lines.append(f"| {case} | {'yes' if hit else '**no**'} | {shown} | {want} |")
        lines.append(f"\n**refused and named {hits} / {len(cases)}** (the record's config is "
                     f"never read: refusing it is not needed, its values never reach a model).")
    report_end(lines, a.out)


if __name__ == "__main__":
    main()
