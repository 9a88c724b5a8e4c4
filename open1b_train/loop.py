"""The training loop, written once: load -> step -> check -> log -> checkpoint.

One process training every virtual rank (``train.py``) and P torch.distributed processes
(``dist/engine.py``) differ only in how a step is computed, how processes agree on it and
how a checkpoint is written; each brings a ``Stepper`` and both run ``run_steps``. So the
order of what happens around a step - the resume check, the log line, the loader's
boundary state, the checkpoint cadence - cannot drift between the two.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch

from open1b.safeio import write_atomic
from open1b_data import StreamLoader
from open1b_train import runlog, statehash
from open1b_train.errors import ReproducibilityError
from open1b_train.reduction.gradient import MicroBatch

if TYPE_CHECKING:                      # run.py needs nothing of this module
    from open1b_train.run import Run, State


@dataclass(frozen=True)
class Computed:
    """One computed step: its hashed log line, the update, the loss and unhashed extras."""

    line: dict[str, Any]
    upd: Any
    loss: torch.Tensor
    extra: dict[str, Any] = field(default_factory=dict)


class Stepper(Protocol):
    ranks: Sequence[int]     # the virtual ranks whose micro-batches this process loads
    lead: bool               # this process appends the log and shows the progress bar

    def compute(self, state: State, step: int, info, batches: list[list[MicroBatch]]
                ) -> Computed:
        """Algorithm 1 + the recipe: updates ``state``'s tensors in place."""

    def agree(self, step: int, line: dict[str, Any]) -> None:
        """Raise if the processes computed different step hashes."""

    def save(self, state: State) -> None:
        """Write the checkpoint of ``state`` (atomically)."""


@dataclass(frozen=True)
class Summary:
    run: str
    first_step: int
    last_step: int
    run_hash: str
    loss: float | None
    seconds: float
    tokens: int
    skipped_steps: int


def run_steps(run: Run, state: State, expected: dict[int, dict], stepper: Stepper,
              progress: bool | None, echo) -> Summary:
    """Train from ``state.step + 1`` to the run's last step. ``expected`` holds log lines
    past the resumed checkpoint: those steps must come out bit-identical."""
    cfg, sched = run.cfg, run.schedule
    V = cfg.virtual_ranks
    first = state.step + 1
    if first > run.last_step:
        if stepper.lead:
            echo(f"{run.dir}: already trained to step {state.step} (last step {run.last_step})")
        return Summary(run.dir, first, state.step, state.prev_hash, None, 0.0, 0, 0)
    # the loader seeks to ``first`` from (seed, mix) alone: a checkpoint's stored position
    # was compared with the derived one on resume and is never loaded
    loader = StreamLoader(run.plan, world=V, ranks=stepper.ranks, start_step=first,
                          end_step=run.last_step)
    bar = _progress(run, first, progress if stepper.lead else False)
    t_start = time.perf_counter()
    tokens = skipped = 0
    loss = None
    it = iter(loader)
    try:
        for step in range(first, run.last_step + 1):
            info = sched.step(step)
            items = [next(it) for _ in range(sched.accumulation(step, V) * len(stepper.ranks))]
            t0 = time.perf_counter()
            out = stepper.compute(state, step, info, micro_batches(items, V, run.device))
            seconds = time.perf_counter() - t0
            stepper.agree(step, out.line)
            annotate(out.line, run, info, out.upd, out.loss, seconds, **out.extra)
            if step in expected:             # published before: it stays, never rewritten
                check_reproduced(step, out.line, expected, run.dir if stepper.lead else None)
            elif stepper.lead:
                runlog.append(run.dir, out.line)
            state.step, state.prev_hash = step, out.line["hash"]
            state.loader = boundary_state(loader.state_dict(), V)
            tokens += info.batch_sequences * sched.spec.seq_tokens
            skipped += out.upd.skipped
            loss = float(out.loss)
            if step % cfg.checkpoint_every == 0 or step == run.last_step:
                stepper.save(state)
            if bar is not None:
                bar.set_postfix_str(f"loss {loss:.4f} | {out.line['tokens_per_s']:,.0f} tok/s"
                                    + (" | skip" if out.upd.skipped else ""))
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return Summary(run.dir, first, state.step, state.prev_hash, loss,
                   time.perf_counter() - t_start, tokens, skipped)


def micro_batches(items: list[dict], V: int, device: torch.device) -> list[list[MicroBatch]]:
    """The loader's items of one step as micro-batches per virtual rank (stream order)."""
    out: list[list[MicroBatch]] = [[] for _ in range(V)]
    for it in items:
        toks = torch.cat([it["input_ids"], it["labels"][:, -1:]], 1).to(device)
        out[it["rank"]].append(MicroBatch(it["rank"], it["micro_batch"],
                                          tuple(it["windows"]), toks))
    return out


def check_reproduced(step: int, line: dict, expected: dict[int, dict],
                     run_dir: str | None = None) -> None:
    """A step recomputed after a resume must equal its logged line, component for component.
    On a difference the published line stays where it is and the recomputed one is written
    beside it (``RUN/recomputed/step-<n>.json``, when ``run_dir`` is given): both kept."""
    want = expected.get(step)
    if want is not None and want.get("hash") != line["hash"]:
        comps = want.get("components") if isinstance(want.get("components"), dict) else {}
        comp = [c for c in statehash.COMPONENTS if comps.get(c) != line["components"][c]]
        where = ""
        if run_dir is not None:
            path = recomputed_path(run_dir, step)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, json.dumps(line, sort_keys=True, indent=1).encode())
            where = (f"; the published line is kept as line {step + 1} of "
                     f"{runlog.path_of(run_dir)}, the recomputed one is in {path}")
        raise ReproducibilityError(
            f"step {step} recomputed after a resume differs from the logged step "
            f"({', '.join(comp) or 'hash'}); the same inputs gave other bits - this "
            f"machine or build does not reproduce the run{where}")


def recomputed_path(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, "recomputed", f"step-{step:08d}.json")


def annotate(line: dict, run: Run, info, upd, loss, seconds: float, **extra) -> None:
    """The informational (unhashed) fields of a step's log line."""
    tokens = info.batch_sequences * run.schedule.spec.seq_tokens
    line.update(loss=float(loss), grad_norm=upd.norm, lr=upd.lr, phase=info.phase,
                windows=[info.first_window, info.first_window + info.batch_sequences],
                mesh=list(run.cfg.mesh), seconds=round(seconds, 4), **extra,
                tokens_per_s=round(tokens / max(seconds, 1e-9), 1))


def boundary_state(state: dict[str, Any], V: int) -> dict[str, Any]:
    """The loader's state at a step boundary as if one process served all V virtual ranks:
    the same record whatever the number of processes (a boundary state loads on any)."""
    if state.get("item") or state.get("worker"):
        raise ReproducibilityError(f"the loader stopped inside step {state.get('step')}; a "
                                   f"checkpoint needs a step boundary")
    return {**state, "ranks": [0, V], "world": V}


def _progress(run: Run, first: int, enabled: bool | None):
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=run.last_step - first + 1, initial=0, unit="step", dynamic_ncols=True,
                desc=f"train {os.path.basename(run.dir.rstrip('/'))}", file=sys.stderr)
