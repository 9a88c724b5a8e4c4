"""The order and the time budget of one ``scripts/gpu_check.py`` run.

A lent GPU comes for minutes (15 of device time per session, 10 per command, ~1.5 of them
starting the machine), so one run must fit ~8 minutes with room for a second, and a run cut
short must already hold the figures that matter most. The plan is a list of sections, most
important first:

1. ``ceilings`` - the card's copy bandwidth and bf16 matrix rate, measured (seconds): the
   roofline every ratio is read against.
2. ``attention.fwd_bwd_causal`` - its parity was never measured (the H200 run's lease
   ended in its CPU reference); now at a shape whose reference takes seconds.
3. ``train:speed`` - one full Open-1B optimizer step against the per-block compiled stock
   model (scripts/gpu_train.py): the step's ratio, the headline figure.
4. the other goal ops (``GOAL_OPS``), the kernels redesigned to move toward the roofline -
   RMSNorm, grad-norm + clip, the embedding backward, windowed attention, the four W8A8
   linears, the LM head - each its bit parity against the CPU reference at a small shape
   and its speed against stock PyTorch at the Open-1B shape.
5. ``train:golden`` - the committed golden trajectories trained on the GPU with every
   redesigned kernel in them, compared component by component.
6. the other ops, then ``train:parity`` and ``train:collectives`` (equal on the H200 run).

Each section has an estimate (the H200 run's measured parity seconds plus its timings for
the ops it ran, at most OP_CAP_S; a stated guess for the others). A section starts only if its estimate fits
what is left of ``--budget-s``; a section that runs past what is left is stopped by an
alarm and recorded as cut. The JSON is rewritten after every section, and ``--resume``
with the last run's JSON skips the sections it already holds: a second run finishes the
plan.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREVIOUS = ROOT / "benchmarks" / "results" / "gpu-h200-2026-12-04" / "run1-all-ops.json"

FIRST_OP = "attention.fwd_bwd_causal"
GOAL_OPS = ("rmsnorm.fwd_bwd", "gradnorm.clip",
            "embedding.fwd_bwd", "attention.fwd_bwd_w512", "linear_int8.gate_up_fwd_bwd",
            "linear_int8.down_fwd_bwd", "linear_int8.attn_qo_fwd_bwd",
            "linear_int8.attn_kv_fwd_bwd", "lmhead.fwd", "lmhead.bwd", "lmhead.bwd_dense")
TRAIN_LAST = ("parity", "collectives")

# Guesses where the H200 run measured nothing (seconds, first-use compilation included):
# the causal check ran only into its CPU reference; the step never finished its 85 s cut
# (ours compiles ~40 kernels on first use, the stock model compiles its blocks).
GUESS = {"ceilings": 5.0, "op": 20.0, "attention.fwd_bwd_causal": 40.0, "train:speed": 200.0,
         "train:golden": 80.0, "train:parity": 80.0, "train:collectives": 10.0}
COMPILE_S = 4.0   # an op's first-use compilation on top of its measured seconds
# An op's estimate is at most this: the H200 run's RMSNorm took 152 s, nearly all of it
# compiling the old tree (a 27,784-instruction kernel with a 5,680-byte stack under
# Triton 3.6), which the redesigned kernels do not have.
OP_CAP_S = 30.0


@dataclass(frozen=True)
class Section:
    kind: str          # "ceilings", "op" or "train"
    name: str          # the check's name, the training section's, or "ceilings"
    estimate_s: float

    @property
    def key(self) -> str:
        return f"train:{self.name}" if self.kind == "train" else self.name


def previous_seconds(path: Path = PREVIOUS, repeats: int = 10) -> dict[str, float]:
    """Seconds each op took on the H200 run: its parity plus its timed repeats."""
    if not path.exists():
        return {}
    out = {}
    for r in json.loads(path.read_text()).get("results", []):
        if "parity_s" in r:
            bench = (r.get("ours_ms", 0.0) + r.get("torch_ms", 0.0)) * (repeats + 2) / 1e3
            out[r["name"]] = min(OP_CAP_S, r["parity_s"] + bench + COMPILE_S)
    return out


def make_plan(op_names: list[str], train_sections: tuple[str, ...], ops: bool, train: bool,
              seconds: dict[str, float]) -> list[Section]:
    """The sections in order of importance (module docstring)."""
    def op(name: str) -> Section:
        return Section("op", name, seconds.get(name, GUESS.get(name, GUESS["op"])))

    def tr(name: str) -> Section:
        return Section("train", name, GUESS[f"train:{name}"])

    plan = [Section("ceilings", "ceilings", GUESS["ceilings"])]
    if ops and FIRST_OP in op_names:
        plan.append(op(FIRST_OP))
    if train and "speed" in train_sections:
        plan.append(tr("speed"))
    if ops:
        plan += [op(n) for n in GOAL_OPS if n in op_names]
    if train and "golden" in train_sections:
        plan.append(tr("golden"))
    if ops:
        plan += [op(n) for n in op_names if n not in GOAL_OPS and n != FIRST_OP]
    if train:
        plan += [tr(n) for n in TRAIN_LAST if n in train_sections]
    return plan


def fit(plan: list[Section], budget_s: float, done: frozenset[str] = frozenset()
        ) -> list[tuple[Section, str]]:
    """Each section with what the budget lets it do: "run", "done" (in ``done``) or
    "over budget" (its estimate does not fit what the sections before it leave)."""
    left, out = budget_s, []
    for s in plan:
        if s.key in done:
            out.append((s, "done"))
        elif s.estimate_s <= left:
            out.append((s, "run"))
            left -= s.estimate_s
        else:
            out.append((s, "over budget"))
    return out


def done_keys(payload: dict) -> frozenset[str]:
    """The sections a previous run's JSON already holds (errors and cuts do not count)."""
    keys = {r["name"] for r in payload.get("results", []) if "error" not in r}
    keys |= {f"train:{k}" for k, v in payload.get("train", {}).items()
             if isinstance(v, dict) and "error" not in v}
    if "ceilings" in payload and "error" not in payload["ceilings"]:
        keys.add("ceilings")
    return frozenset(keys)


def format_plan(fitted: list[tuple[Section, str]], budget_s: float) -> str:
    lines = [f"plan for a budget of {budget_s:.0f} s (estimates: the H200 run of 2026-12-04 "
             "where measured, else a stated guess):"]
    total = 0.0
    for i, (s, what) in enumerate(fitted, 1):
        if what == "run":
            total += s.estimate_s
        lines.append(f"  {i:2d}. {s.key:34s} ~{s.estimate_s:5.0f} s  {what}"
                     + (f"  (cumulative {total:.0f} s)" if what == "run" else ""))
    return "\n".join(lines)
