"""The golden trajectories: fixed runs whose every step's hash and components are committed
(tests/assets/trajectory_<name>.json), replayed by the tests, by
``scripts/portability_check.py`` under every variant of the portability matrix
(docs/PORTABILITY.md) and, their first steps, by ``open1b-audit selftest``.

Both train on the mix of ``data/mix.toml`` over ``data/corpus/`` (shipped with the package,
so an installed auditor needs no checkout), each with its own window and schedule:

``micro`` - 100 steps of the ``micro`` preset, chosen to run what a short run does not:
  mesh (3, 1) (three replicas: TreeFold's non-power-of-two block); a batch ramp at step
  81 from 3 to 9 windows (one micro-batch per rank, then an accumulation of 3 - not a
  power of two); LR warm-up over 10 steps, then the cosine decay to step 100; a spike
  injected at step 50 (steps 50-54 skip their update); and a resume from the checkpoint of
  step ``resume_at`` = 52 (inside the skip: ``skip_left`` restored) that must continue with
  the very same lines. Its contractions stay <= 1,024 (a wider FFN or 1,024-token
  micro-batches cost 3-4x the time of the 100 steps): the demo trajectory runs the long ones.
``demo`` - 3 steps of the ``demo`` preset on 512-token windows, mesh (2, 1), 3 windows per
  micro-batch: every dW GEMM contracts over 3 x 512 = 1,536 tokens (> 1,024, the CPU path's
  exact float32 chunk: its int8 GEMMs add two exact chunks in int32).

``build_mix(name, dst)`` builds the trajectory's mix; ``train_lines(...)`` trains it (or a
prefix) and returns the log lines; ``first_difference(golden, lines)`` names the first
step and component that differ.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from typing import Any, Callable

from open1b_train.config import TrainConfig, demo, micro

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
COMPONENTS = ("data", "grad", "params", "optim", "scalars")


@dataclass(frozen=True)
class Trajectory:
    name: str
    steps: int
    window: int                     # tokens per training window (seq_tokens)
    micro_batch: int
    phases: tuple[tuple[int, int], ...]   # (first step, windows per step)
    warmup_steps: int
    config: Callable[[], TrainConfig]
    resume_at: int | None = None    # the test trains to here, then resumes to ``steps``

    def schedule(self) -> dict[str, Any]:
        """The mix's [schedule]: phase starts in tokens, the LR decays to the last step."""
        phases, tokens, prev = [], 0, None
        for first, batch in self.phases:
            if prev is not None:
                tokens += (first - prev[0]) * prev[1] * self.window
            phases.append({"start_tokens": tokens, "batch_sequences": batch})
            prev = (first, batch)
        stop = tokens + (self.steps + 1 - prev[0]) * prev[1] * self.window
        return {"seq_tokens": self.window, "micro_batch": self.micro_batch,
                "reference_world": 1, "stop_tokens": stop, "lr_peak": 1e-3,
                "lr_final_ratio": 0.1,
                "warmup_tokens": self.warmup_steps * self.phases[0][1] * self.window,
                "phases": phases}


def _micro() -> TrainConfig:
    return dataclasses.replace(micro(), mesh=(3, 1), inject_spike=(50,), checkpoint_every=4,
                               backend="cpu")


def _demo() -> TrainConfig:
    return dataclasses.replace(demo(), mesh=(2, 1), checkpoint_every=2, backend="cpu")


TRAJECTORIES = {
    "micro": Trajectory("micro", steps=100, window=32, micro_batch=1,
                        phases=((1, 3), (81, 9)), warmup_steps=10, config=_micro,
                        resume_at=52),
    "demo": Trajectory("demo", steps=3, window=512, micro_batch=3, phases=((1, 6),),
                       warmup_steps=1, config=_demo),
}


def mix_definition(name: str):
    """The parsed mix definition (``MixSpec``) of trajectory ``name``."""
    from open1b_data.formats.definition import parse_mix

    t = TRAJECTORIES[name]
    path = os.path.join(DATA, "mix.toml")
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    raw["mix"]["name"] = f"trajectory-{name}"
    raw["mix"]["window"] = t.window + 1
    raw["schedule"] = t.schedule()
    return parse_mix(raw, base_dir=DATA, path=path)


def build_mix(name: str, dst: str) -> str:
    """Build trajectory ``name``'s mix into ``dst`` (kept if already built); returns it."""
    from open1b_data.ingest.pipeline import BuildOptions, build_mix as build

    if not os.path.exists(os.path.join(dst, "manifest.json")):
        build(mix_definition(name), dst, BuildOptions(workers=1, progress=False))
    return dst


def config(name: str, steps: int | None = None, backend: str = "cpu") -> TrainConfig:
    t = TRAJECTORIES[name]
    return dataclasses.replace(t.config(), steps=steps or t.steps, backend=backend)


def train_lines(name: str, mix: str, run: str, steps: int | None = None,
                backend: str = "cpu", trace_steps: frozenset[int] = frozenset()
                ) -> list[dict]:
    """Train (or resume) trajectory ``name`` in ``run`` up to ``steps``; its log lines."""
    from open1b_train import runlog
    from open1b_train.train import train

    train(config(name, steps, backend), mix, run, progress=False, echo=lambda m: None,
          trace_steps=trace_steps)
    return runlog.read(run)


def record(name: str, mix_fingerprint: str, lines: list[dict]) -> dict[str, Any]:
    """The golden record of ``lines`` (genesis first)."""
    return {"trajectory": name, "mix_fingerprint": mix_fingerprint,
            "config_identity": config(name).identity_sha256(), "steps": len(lines) - 1,
            "genesis": lines[0]["hash"],
            "lines": [{"step": ln["step"], "hash": ln["hash"], "components": ln["components"]}
                      for ln in lines[1:]]}


def first_difference(golden: dict[str, Any], lines: list[dict]) -> dict[str, Any] | None:
    """The first step (0 = genesis) and component where ``lines`` depart from ``golden``
    (over the steps both have), or None."""
    if lines[0]["hash"] != golden["genesis"]:
        return {"step": 0, "component": "genesis", "want": golden["genesis"],
                "got": lines[0]["hash"]}
    for want, got in zip(golden["lines"], lines[1:]):
        for c in COMPONENTS:
            if got["components"][c] != want["components"][c]:
                return {"step": want["step"], "component": c, "want": want["components"][c],
                        "got": got["components"][c]}
        if got["hash"] != want["hash"]:
            return {"step": want["step"], "component": "hash", "want": want["hash"],
                    "got": got["hash"]}
    return None
