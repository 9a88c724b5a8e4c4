"""``open1b-train show RUN --step N``: one step of a run, for forensics.

The step's hash and components, loss, learning rate, pre-clip gradient norm and skip flag
(from ``RUN/steps.jsonl``), and its windows in mesh order with each window's loss; the
``top`` highest-loss windows are listed with the source documents behind them (the
stream's own provenance: source, shard file, row, source-native id, token span), so a
loss spike can be traced to the documents that caused it.

Every value shown is one an audit checks: the scalars are the step's hashed ``scalars``
(float32 bits, the LR's hex float), never the decimal ``loss`` / ``lr`` / ``grad_norm``
beside them, which nothing hashes. The phase is the schedule's at the step, from the run's
mix, whose fingerprint must equal the hashed genesis record's and whose token count for
the step must equal the hashed ``tokens``. The one unhashed value, the step's wall time,
is reported apart, under ``unhashed``.
"""
from __future__ import annotations

import os
import struct

from open1b.safeio import read_json_object
from open1b_train import runinfo, runlog
from open1b_train.errors import Open1bTrainError


def f32_from_hex(h: str) -> float:
    return struct.unpack("<f", struct.pack("<I", int(h, 16)))[0]


def mesh_windows(schedule, step: int, mesh: tuple[int, int]) -> list[tuple[int, int, int]]:
    """(window, virtual rank, micro-batch) of ``step`` in mesh order."""
    V = mesh[0] * mesh[1]
    out = []
    for v in range(V):
        rp = schedule.rank_plan(step, V, v)
        for j, mb in enumerate(rp.micro_batches):
            out.extend((m, v, j) for m in mb)
    return out


def _check_shape(run: str, step: int, line: dict) -> None:
    """The fields a report reads, with the types the trainer writes (a log is published
    data: an edited one gets a one-line refusal, not a traceback)."""
    want = {"genesis": dict} if step == 0 else {"components": dict, "scalars": dict}
    for key, kind in {"hash": str, **want}.items():
        if not isinstance(line.get(key), kind):
            raise Open1bTrainError(f"{run}: step {step}'s {key} must be {kind.__name__}, got "
                                   f"{line.get(key)!r:.60}; the log was edited or damaged - "
                                   f"check it with `open1b-audit chain {run}`")
    if step:
        sc = line["scalars"]
        bad = [k for k in ("loss", "grad_norm", "lr") if not isinstance(sc.get(k), str)]
        if bad or not all(isinstance(v, str) for v in line["components"].values()):
            raise Open1bTrainError(f"{run}: step {step}'s scalars or components are not the "
                                   f"hex digests the trainer writes; the log was edited or "
                                   f"damaged - check it with `open1b-audit chain {run}`")


def step_report(run: str, step: int, top: int = 5, mix: str | None = None) -> dict:
    lines = runlog.read(run)
    if not lines:
        raise Open1bTrainError(f"{run}: no steps.jsonl; is it a run directory?")
    if step >= len(lines):
        raise Open1bTrainError(f"{run} has steps 0..{len(lines) - 1}; step {step} was not "
                               f"trained (yet)")
    line = lines[step]
    _check_shape(run, step, line)
    rep = {"run": run, "step": step, "hash": line["hash"], "prev": line["prev"]}
    if step == 0:
        rep["genesis"] = line["genesis"]
        return rep
    sc = line["scalars"]
    rep.update(components=line["components"], loss=f32_from_hex(sc["loss"]),
               grad_norm=f32_from_hex(sc["grad_norm"]), lr=float.fromhex(sc["lr"]),
               skipped=sc["skipped"], spike=sc["spike"], tokens=sc["tokens"],
               unhashed={"seconds": line.get("seconds")})
    if isinstance(sc.get("val_loss"), dict):      # a validation step (eval_every)
        rep["val_loss"] = {k: f32_from_hex(v) for k, v in sc["val_loss"].items()}
    if mix is None:
        mix = runinfo.named_mix(run)
    cfg = read_json_object(os.path.join(run, "config.json"), "run config")
    from open1b_data import StreamPlan, WindowReader
    from open1b_data.stream.schedule import Schedule

    plan = StreamPlan.open(mix, seed=cfg["seed"])
    want = lines[0]["genesis"].get("mix_fingerprint")
    if plan.fingerprint != want:
        raise Open1bTrainError(f"{run}: mix {mix} has fingerprint {plan.fingerprint[:16]}..., "
                               f"the run was trained on {str(want)[:16]}...; pass its --mix")
    sched = Schedule.from_definition(plan.view.definition)
    info = sched.step(step)
    if info.tokens_after != sc["tokens"]:
        raise Open1bTrainError(f"{run}: step {step} logs {sc['tokens']} tokens consumed, the "
                               f"schedule gives {info.tokens_after}; wrong --mix?")
    rep["phase"] = info.phase
    order = mesh_windows(sched, step, tuple(cfg["mesh"]))
    losses = [f32_from_hex(h) for h in sc["window_loss"]]
    if len(losses) != len(order):
        raise Open1bTrainError(f"{run}: step {step} logs {len(losses)} window losses, the "
                               f"schedule gives {len(order)} windows; wrong --mix?")
    rep["windows"] = [{"window": m, "rank": v, "micro_batch": j, "loss": x}
                      for (m, v, j), x in zip(order, losses)]
    reader = WindowReader(plan, whole_shards=False)
    worst = sorted(rep["windows"], key=lambda w: -w["loss"])[:top]
    rep["top"] = []
    for w in worst:
        segs = reader.segments_with_ids(w["window"])
        rep["top"].append({**w, "documents": [
            {"source": s.source, "shard": plan.view.sources[plan.sources.index(s.source)]
             .shard_paths[s.shard], "row": s.doc, "doc_id": s.doc_id,
             "tokens": [s.doc_start, min(s.doc_start + s.length, s.doc_length)],
             "epoch": s.epoch} for s in segs]})
    return rep


def print_report(rep: dict, echo) -> None:
    echo(f"{rep['run']}  step {rep['step']}  hash {rep['hash']}")
    if rep["step"] == 0:
        for k, v in rep["genesis"].items():
            echo(f"  {k:<16} {v}")
        return
    echo(f"  loss {rep['loss']:.6f}   grad norm {rep['grad_norm']:.6f}   lr {rep['lr']:.6g}"
         f"   {'SKIPPED' if rep['skipped'] else 'applied'}{'  (spike)' if rep['spike'] else ''}"
         f"   tokens {rep['tokens']:,}   phase {rep['phase']}")
    if rep.get("val_loss"):
        echo("  validation loss (held-out): " + "   ".join(
            f"{k} {v:.6f}" for k, v in rep["val_loss"].items()))
    for k, v in rep["components"].items():
        echo(f"  {k:<8} {v}")
    ws = rep["windows"]
    echo(f"  windows {ws[0]['window']}..{max(w['window'] for w in ws)} ({len(ws)}), "
         f"loss min {min(w['loss'] for w in ws):.4f} max {max(w['loss'] for w in ws):.4f}")
    for w in rep["top"]:
        echo(f"\n  window {w['window']}  rank {w['rank']}  micro-batch {w['micro_batch']}  "
             f"loss {w['loss']:.4f}")
        for d in w["documents"]:
            echo(f"    {d['source']:<14} {d['shard']}  row {d['row']}  tokens "
                 f"[{d['tokens'][0]},{d['tokens'][1]})  {d['doc_id']}")
