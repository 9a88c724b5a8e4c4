"""Training in one process: every virtual rank of the logical mesh, in mesh order.

``train(cfg, mix, run)`` trains ``cfg`` on the built mix ``mix`` into the run directory
``run`` (``RUN/config.json``, ``RUN/steps.jsonl``, ``RUN/checkpoints/``), fresh or resumed
(``run.open_run``: the same config identity, mix fingerprint and seed, or refused). Each
step is ``step.compute_step`` (Algorithm 1 + the recipe, the hashed log line), the loop
around it (load -> step -> check -> log -> checkpoint) is ``loop.run_steps``, shared with
the distributed engine; data comes from ``open1b_data``'s ``StreamLoader`` serving all
virtual ranks in mesh order, never reordered.
"""
from __future__ import annotations

from open1b_train.memory.allocator import keep_freed_memory
from open1b_train.config import TrainConfig
from open1b_train.loop import Computed, Summary, run_steps
from open1b_train.run import Run, State, backend_scope, open_run, save_checkpoint
from open1b_train.step import compute_step
from open1b_train.trace import Tracer
from open1b_train.trace import path_of as trace_path


def train(cfg: TrainConfig, mix: str, run_dir: str, progress: bool | None = None,
          echo=print, trace_steps: frozenset[int] = frozenset(),
          memory_plan: str = "auto") -> Summary:
    """Train (or resume) the run in ``run_dir``; see the module docstring. ``memory_plan``:
    auto, resident or lean (``memory/memplan.py``; the bits do not depend on it)."""
    with backend_scope(cfg):
        run, state, expected, fresh = open_run(cfg, mix, run_dir, memory_plan=memory_plan)
        keep_freed_memory(run.memory.lean)
        echo(f"{run.dir}: {run.memory.describe()}")
        if fresh:
            save_checkpoint(run, state)
        return run_steps(run, state, expected, LocalStepper(run, trace_steps), progress, echo)


class LocalStepper:
    """Every virtual rank in this process, in mesh order (``loop.Stepper``)."""

    lead = True

    def __init__(self, run: Run, trace_steps: frozenset[int] = frozenset()) -> None:
        self.run, self.trace_steps = run, trace_steps
        self.ranks = range(run.cfg.virtual_ranks)

    def compute(self, state: State, step: int, info, batches) -> Computed:
        tracer = Tracer(step) if step in self.trace_steps else None
        out = compute_step(self.run, state, batches, step, info, trace=tracer)
        if tracer is not None:
            tracer.write(trace_path(self.run.dir, step))
        return Computed(out.line, out.upd, out.loss, {"hash_seconds": round(out.hash_seconds, 4),
                                                      "update_seconds": round(out.update_seconds, 4),
                                                      **self.run.memory.record()})

    def agree(self, step: int, line: dict) -> None:
        pass                                  # one process: nothing to agree with

    def save(self, state: State) -> None:
        save_checkpoint(self.run, state)


