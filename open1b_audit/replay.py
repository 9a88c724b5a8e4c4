"""``open1b-audit replay RUN --step N``: re-execute steps of a published run on this machine
and compare every component digest with its log.

1. The log must be one unbroken hash chain up to step N (``chain.py``).
2. The run's config and mix must be the ones its genesis names (config identity, mix
   fingerprint, seed).
3. The nearest checkpoint before N (or ``--from-step``) is loaded and checked: its files
   against its record's sha256, its record against the log (the step's hash), its
   parameters and optimizer state against the log's digests for that step. From step 0 the
   initial parameters are also re-derived from the seed and compared.
4. Each step up to N is re-executed with Algorithm 1 (``open1b_train.step.compute_step``:
   virtual ranks in mesh order, TreeFold over replicas) on one device, on the CPU reference
   or the Triton kernels. Its data digest is compared before anything is computed, then the
   gradient, scalars, parameters and optimizer state, and the step hash.
5. The published checkpoint of every reproduced step is compared with the replayed state
   (``published_checkpoint_difference``): the released weights of the last step are what
   users take away, and no later replay starts from them.
Before any of this, the run's recipe is reported (``open1b_train.recipe``: preset, mix
fingerprint, every departure from the preset's published recipe) and checked against what
its owner announced (``announce``). The first difference stops the replay with a
``Finding`` naming the step and the component.

Memory: the replay holds the parameters, the Adam moments, one virtual rank's gradient,
one replica partial (when dp_shard > 1) and the TreeFold stack (at most log2(dp_replicate)
+ 1 partials); ``spill`` moves TreeFold partials that are not on top of the stack to disk.
``memory_plan`` (``open1b_train.memory.memplan``) picks how: resident, or lean (the moments in
files under RUN/memplan, activations recomputed, the LM head in token blocks, partials
spilled), or auto from the machine's free memory; every plan gives the same bits.
The peak resident memory and the time of every step are reported.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from open1b_train import chain
from open1b_train.chain import Finding
from open1b_data import StreamLoader
from open1b_data.errors import Open1bDataError
from open1b_train import checkpoint, recipe, runlog, statehash
from open1b_train.memory import memplan
from open1b_train.memory.allocator import keep_freed_memory
from open1b_train.errors import CheckpointError, DivergenceError
from open1b_audit.errors import Open1bAuditError
from open1b_train.loop import micro_batches
from open1b_train.recipe import Announcement
from open1b_train.run import (Run, State, StateMismatch, backend_scope, checkpoint_state,
                              initial_state, read_run, resolve, tensors_of)
from open1b_train.step import compute_step, data_digest_of
from open1b_train.reduction.treefold import file_spill

ORDER = ("grad", "scalars", "params", "optim")     # the order a step computes them in


@dataclass
class ReplayResult:
    run: str
    mix: str
    target: int
    start: int
    backend: str
    device: str
    verified: list[int] = field(default_factory=list)
    finding: Finding | None = None
    lines: dict[int, dict] = field(default_factory=dict)     # recomputed lines
    step_seconds: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    peak_memory_bytes: int = 0
    fold_peak_partials: int = 0
    recipe: dict[str, Any] | None = None    # preset, mix fingerprint, departures (recipe.py)
    checkpoints_compared: list[int] = field(default_factory=list)   # published, replayed steps
    memory_plan: str | None = None          # memory/memplan.py's choice (never changes a bit)
    memory_plan_text: str = ""

    @property
    def ok(self) -> bool:
        return self.finding is None and self.target in self.verified

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "mix": self.mix, "step": self.target,
                "replayed_from": self.start, "backend": self.backend, "device": self.device,
                "verdict": "match" if self.ok else "mismatch", "verified_steps": self.verified,
                "finding": None if self.finding is None else self.finding.to_dict(),
                "seconds": round(self.seconds, 3), "step_seconds": self.step_seconds,
                "peak_memory_bytes": self.peak_memory_bytes,
                "treefold_peak_partials": self.fold_peak_partials, "recipe": self.recipe,
                "checkpoints_compared": self.checkpoints_compared,
                "memory_plan": self.memory_plan, "memory_plan_text": self.memory_plan_text}


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "processor": platform.processor() or
            platform.machine(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def make_spill(directory: str):
    """A TreeFold spill: dormant partials go to ``directory`` as .npy files."""
    return file_spill(directory)


def _start_state(run: Run, lines: list[dict], c: int) -> tuple[State, Finding | None]:
    """The verified state after step ``c`` (a checkpoint, or the seed's init for 0):
    ``open1b_train.run``'s checks, a difference as a finding."""
    try:
        state = (initial_state(run, lines[0]["genesis"]) if c == 0 else
            checkpoint_state(run, lines, c))
    except StateMismatch as e:
        return None, Finding(e.step, e.component, e.detail)
    return state, None


def replay(run_dir: str, step: int, mix: str | None = None, backend: str = "cpu",
           spill: str | None = None, from_step: int | None = None, trace=None,
           trace_steps: set[int] | None = None, memory_plan: str = "auto",
           announce: Announcement = Announcement(), windows=None,
           on_verified=None) -> ReplayResult:
    """Replay up to ``step`` (see the module docstring). ``trace(step, name, tensor)`` is
    called with every op's output of the steps in ``trace_steps``. ``memory_plan``: auto,
    resident or lean (``open1b_train.memory.memplan``; the bits do not depend on it).
    ``announce``: the preset and mix its owner announced - a run that is not on them is a
    ``recipe`` finding at step 0, before any work. ``windows(run, first, last)``: the
    items of steps first..last in the stream loader's order from another source (the
    crowd's proved windows, ``open1b_audit.crowd.windows``; each step's data digest is
    still compared with the log); None: the stream loader. ``on_verified(run, state, s,
    line)`` is called after each step that matched (the crowd spills its state there; an
    exception it raises stops the replay and reaches the caller)."""
    t_start = time.perf_counter()
    lines = runlog.read(run_dir, strict=False)
    cfg, mix = read_run(run_dir, mix)
    cfg = dataclasses.replace(cfg, backend=backend)
    res = ReplayResult(run_dir, mix, step, 0, backend, "cpu")
    if step < 1 or step >= len(lines):
        raise Open1bAuditError(f"{run_dir} logs steps 1..{len(lines) - 1}; cannot replay step "
                               f"{step}")
    res.finding = chain.check(lines[:step + 1])
    if res.finding is not None:
        return _done(res, t_start)
    run = resolve(cfg, mix, run_dir, use_index=False, memory_plan=memory_plan)
    keep_freed_memory(run.memory.lean)
    res.device = str(run.device)
    res.memory_plan, res.memory_plan_text = run.memory.name, run.memory.describe()
    res.recipe = recipe.summary(run.cfg, run.plan.view.definition, run.plan.fingerprint,
                                run.plan.view.seed)
    g = lines[0]["genesis"]
    for key, have in (("config_identity", run.cfg.identity_sha256()),
                      ("mix_fingerprint", run.plan.fingerprint), ("seed", run.cfg.seed)):
        if g.get(key) != have:
            res.finding = Finding(0, "data" if key == "mix_fingerprint" else "config",
                                  f"the run's genesis names {key} {g.get(key)!r}, the "
                                  f"replay has {have!r}")
            return _done(res, t_start)
    why = announce.refusal(g, run.cfg.preset)
    if why is None and announce.preset is not None and res.recipe["departures"]:
        why = recipe.on_recipe(res.recipe)          # the announced preset, departed from
    if why is not None:
        res.finding = Finding(0, "recipe", f"not the announced recipe: {why}")
        return _done(res, t_start)
    published = set(checkpoint.list_steps(run_dir))
    avail = [s for s in published if s < step]
    c = from_step if from_step is not None else (avail[-1] if avail else 0)
    if c >= step or (c and c not in avail):
        raise Open1bAuditError(f"no checkpoint at step {c} before step {step} in {run_dir} "
                               f"(available: {avail})")
    res.start = c
    V = run.cfg.virtual_ranks
    with backend_scope(run.cfg):
        state, res.finding = _start_state(run, lines, c)
        if res.finding is not None:
            return _done(res, t_start)
        # the position is derived from (seed, mix, step): nothing stored is loaded
        loader = StreamLoader(run.plan, world=V, ranks=range(V), start_step=c + 1,
                              end_step=step) if windows is None else windows(run, c + 1, step)
        it = iter(loader)
        sp = make_spill(spill) if spill else None
        for s in range(c + 1, step + 1):
            t0 = time.perf_counter()
            info = run.schedule.step(s)
            want = lines[s]
            try:
                items = [next(it) for _ in range(run.schedule.accumulation(s, V) * V)]
            except Open1bDataError as e:
                res.finding = Finding(s, "data", f"the step's windows cannot be read as "
                                                 f"published: {e}")
                break
            shown = informational_difference(run, info, want)
            if shown:
                res.finding = Finding(s, "log", shown)
                break
            batches = micro_batches(items, V, run.device)
            if data_digest_of(batches) != want["components"]["data"]:
                res.finding = Finding(s, "data", "the step's windows (from the mix, in stream "
                                                 "order) differ from the logged data digest")
                break
            tr = None
            if trace is not None and (trace_steps is None or s in trace_steps):
                tr = lambda name, t, s=s: trace(s, name, t)  # noqa: E731
            try:
                out = compute_step(run, state, batches, s, info, trace=tr, spill=sp)
            except DivergenceError as e:
                res.finding = Finding(s, "scalars", str(e))
                break
            line = out.line
            res.lines[s] = line
            res.fold_peak_partials = max(res.fold_peak_partials, out.peak_partials)
            diff = [k for k in ORDER if line["components"][k] != want["components"][k]]
            if diff:
                res.finding = Finding(s, diff[0], _explain(diff[0], line, want))
                break
            if line["hash"] != want["hash"]:
                res.finding = Finding(s, "chain", "every component matches but the step hash "
                                                  "does not")
                break
            state.step, state.prev_hash = s, line["hash"]
            if s in published:          # the published state at s: what users take away
                res.finding = published_checkpoint_difference(run, lines, s,
                                                              moments=not run.memory.lean)
                if res.finding is not None:
                    break
                res.checkpoints_compared.append(s)
            res.verified.append(s)
            res.step_seconds[s] = round(time.perf_counter() - t0, 3)
            if on_verified is not None:
                on_verified(run, state, s, line)
    return _done(res, t_start)


def published_checkpoint_difference(run: Run, lines: list[dict], s: int,
                                    moments: bool = True) -> Finding | None:
    """The published checkpoint at a replayed step ``s`` against the log (which the replay
    just reproduced): its record must be the chain's, its parameters - and, with
    ``moments``, its optimizer state - the log's digests. A checkpoint swapped after
    training (the released weights of the last step, which no later replay starts from)
    is a ``params`` finding at ``s``, edited moments an ``optim`` one, a record that is not
    the chain's a ``checkpoint`` one. The lean plan compares the parameters only: the
    moments would not fit beside its own; the replay that starts from that checkpoint
    compares them."""
    path = checkpoint.step_dir(run.dir, s)
    names = [p.name for p in run.specs]
    comps = lines[s]["components"]
    try:
        ck = checkpoint.load(path, params_only=not moments)
        why = checkpoint.record_difference(ck.record, lines, s)
        if why is not None:
            return Finding(s, "checkpoint", f"the published checkpoint {path}: {why}")
        params, opt = tensors_of(ck, run) if moments else (ck.params, None)
    except CheckpointError as e:
        return Finding(s, "checkpoint", f"the published checkpoint {path}: {e}")
    if (sorted(params) != sorted(names) or
            statehash.tensors_digest({n: params[n] for n in names}) != comps["params"]):
        return Finding(s, "params", f"the published checkpoint {path}: its parameters are not "
                                    f"the replayed step's (swapped or edited)")
    if opt is not None and memplan.optim_digest(run.layout, opt) != comps["optim"]:
        return Finding(s, "optim", f"the published checkpoint {path}: its optimizer state "
                                   f"(moments or counters) is not the replayed step's (edited)")
    return None


def informational_difference(run: Run, info, line: dict) -> str | None:
    """The unhashed fields a reader of the log sees that the replay can re-derive (the
    step's window range, batch-ramp phase and mesh): a sentence naming the first that
    disagrees with the schedule, or None. (Loss, LR and gradient norm are checked against
    the hashed scalars by ``chain``; timings are never trusted or derived.)"""
    want = {"windows": [info.first_window, info.first_window + info.batch_sequences],
            "phase": info.phase, "mesh": list(run.cfg.mesh)}
    for k, v in want.items():
        if k in line and line[k] != v:
            return (f"the log's unhashed field {k} says {line[k]!r}, the run's schedule and "
                    f"config give {v!r} (edited)")
    return None


def _explain(comp: str, got: dict, want: dict) -> str:
    if comp == "scalars":
        keys = [k for k in got["scalars"] if got["scalars"][k] != want["scalars"].get(k)]
        return (f"the replayed scalars differ in {', '.join(keys)} (published "
                f"{ {k: want['scalars'].get(k) for k in keys if k != 'window_loss'} }, replayed "
                f"{ {k: got['scalars'][k] for k in keys if k != 'window_loss'} })")
    what = {"grad": "the reduced gradient", "params": "the parameters after the update",
            "optim": "the optimizer state after the update"}[comp]
    return (f"{what} differs: published {want['components'][comp][:16]}..., replayed "
            f"{got['components'][comp][:16]}...")


def _done(res: ReplayResult, t_start: float) -> ReplayResult:
    res.seconds = time.perf_counter() - t_start
    res.peak_memory_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if torch.cuda.is_available():
        res.peak_memory_bytes = max(res.peak_memory_bytes, torch.cuda.max_memory_allocated())
    return res
