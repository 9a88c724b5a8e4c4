"""A run: resolved, opened, verified and resumed in one place - for the trainer on one
process, the distributed engine on P processes, and the auditor's replay.

``resolve(cfg, mix, run_dir)`` fills the config from the mix (vocabulary, seed) and plans
its stream; ``open_run`` resolves a run directory and gives the state to train from: fresh
(the initial weights from the seed, the genesis line) or resumed from the latest good
checkpoint - only with the same config identity (``TrainConfig.identity``), mix fingerprint
and seed; anything else is refused naming what differs. The lines the log already holds
past that checkpoint stay published: the loop recomputes them and each must come out
bit-identical (``loop.check_reproduced``).

What a state is built from is verified, never trusted (docs/AUDIT.md has the table):
``initial_state`` re-derives the weights from the seed and compares them with the genesis;
``checkpoint_state`` re-hashes a checkpoint's files, compares its record with the log
(step hash, run identity), its tensors' digests with the log's step digests, and
re-derives the stream position from (seed, mix, step) - a stored one that differs is
refused naming the field. A difference is a ``StateMismatch`` naming the step and the
component (a ``ResumeError`` for the trainer, a finding for the auditor).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

import open1b_kernels.core.backend as kb
from open1b_kernels.core import ieee
from open1b_data import StreamPlan
from open1b_data.formats.manifest import load_manifest
from open1b_data.stream.loader import step_boundary_state
from open1b_data.stream.schedule import Schedule
from open1b_data.stream.state import differing_fields
from open1b_train import __version__, checkpoint, runinfo, runlog, statehash, validate
from open1b_train.memory import memplan
from open1b_train.config import TrainConfig, from_dict
from open1b_train.errors import CheckpointError, ConfigError, Open1bTrainError, ResumeError
from open1b_train.memory.memplan import MemoryPlan
from open1b_train.optimstate import OptimState
from open1b_train.params import Layout, ParamSpec, init_params, param_specs
from open1b.safeio import read_json_object, write_atomic

CONFIG = "config.json"
RUN_INFO = "run.json"      # where the run's mix lives (not part of its identity)


@dataclass
class Run:
    """A resolved run: config (vocab and seed filled in), mix, schedule, directories, and
    its model's parameter list and flat layout (derived from the config once, here)."""

    cfg: TrainConfig
    mix: str
    dir: str
    plan: StreamPlan
    schedule: Schedule
    last_step: int
    device: torch.device
    validation: dict[str, torch.Tensor] | None = None   # held-out windows (eval_every > 0)
    memory: MemoryPlan | None = None     # how the state is held (memory/memplan.py); never hashed
    specs: list[ParamSpec] = field(init=False, repr=False)
    layout: Layout = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.specs = param_specs(self.cfg.model)
        self.layout = Layout(self.specs)


@dataclass
class State:
    """What evolves from step to step."""

    step: int                       # last completed step (0 = the initial state)
    params: dict[str, torch.Tensor]
    opt: OptimState
    prev_hash: str
    loader: dict[str, Any] | None   # StreamLoader state at the next step's boundary



def _device(cfg: TrainConfig) -> torch.device:
    if cfg.backend != "cpu" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def backend_scope(cfg: TrainConfig):
    """``open1b_kernels.core.backend.force`` for the config's backend (auto: by device), after
    refusing a process that flushes subnormals (``open1b_kernels.core.ieee``): its CPU steps would
    have other bits, so it may neither train nor replay."""
    try:
        ieee.require_ieee()
    except ieee.FlushToZeroError as e:
        raise Open1bTrainError(str(e)) from None
    return kb.force(None if cfg.backend == "auto" else cfg.backend)


def resolve(cfg: TrainConfig, mix: str, run_dir: str, use_index: bool = True,
            memory_plan: str = "resident") -> Run:
    """Fill the config from the mix (vocabulary, seed) and check that they fit, and choose
    the memory plan (``memplan.choose``: auto, resident or lean). An auditor passes
    ``use_index=False``: a seek index stored in the mix is derived data its owner could
    have rewritten, so the replay plans from the stream's origin."""
    manifest = load_manifest(mix)
    vocab = int(manifest.tokenizer["vocab_size"])
    if cfg.model.vocab == 0:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab=vocab))
    elif cfg.model.vocab != vocab:
        raise ConfigError(f"model.vocab is {cfg.model.vocab} but the mix's tokenizer has "
                          f"{vocab} tokens; set model.vocab = 0 (take the mix's) or use "
                          f"another mix")
    if cfg.seed is None:
        cfg = dataclasses.replace(cfg, seed=manifest.seed)
    plan = StreamPlan.open(mix, seed=cfg.seed, use_index=use_index)
    schedule = Schedule.from_definition(plan.view.definition)
    last = schedule.last_step if cfg.steps is None else min(cfg.steps, schedule.last_step)
    V = cfg.virtual_ranks
    for r in schedule.runs:                     # every batch must split over the mesh
        if r.first_step <= last:
            schedule.accumulation(r.first_step, V)
    device = _device(cfg)
    val = validate.load_windows(cfg, plan.view, device) if cfg.eval_every else None
    tokens = schedule.spec.micro_batch * (schedule.spec.seq_tokens + 1)
    memory = memplan.choose(memory_plan, cfg, tokens, run_dir)
    return Run(cfg, mix, run_dir, plan, schedule, last, device, val, memory)


# ----------------------------------------------------------------------------- state

def genesis_line(run: Run, params: dict[str, torch.Tensor], opt: OptimState) -> dict[str, Any]:
    """The log's line 0 for fresh ``params`` and ``opt`` (moments from ``new_moments``)."""
    rec = {"config_identity": run.cfg.identity_sha256(), "mix_fingerprint": run.plan.fingerprint,
           "seed": run.cfg.seed, "params": statehash.tensors_digest(params),
           "optim": memplan.fresh_optim_digest(run.layout, opt)}
    return {"step": 0, "hash": statehash.genesis_hash(rec), "prev": None, "genesis": rec}


def fresh_state(run: Run) -> tuple[State, dict[str, Any]]:
    params = init_params(run.cfg.model, run.cfg.seed, run.device)
    layout = run.layout
    opt = OptimState(*memplan.new_moments(run.memory, layout, run.device))
    line = genesis_line(run, params, opt)
    loader = step_boundary_state(run.plan, run.cfg.virtual_ranks, 1)
    return State(0, params, opt, line["hash"], loader), line


def _check_config(run_dir: str, cfg: TrainConfig) -> None:
    """Write RUN/config.json, or check that an existing one has the same identity."""
    path = os.path.join(run_dir, CONFIG)
    if os.path.exists(path):
        with open(path, "rb") as f:
            old = from_dict(json.loads(f.read()))
        if old.identity() != cfg.identity():
            diff = [k for k in cfg.identity() if cfg.identity()[k] != old.identity().get(k)]
            raise ResumeError(f"{run_dir} was trained with another config (differs in "
                              f"{', '.join(diff)}: {[old.identity()[k] for k in diff]} there, "
                              f"{[cfg.identity()[k] for k in diff]} now); resume with its "
                              f"config (`open1b-train resume {run_dir}`) or use another --out")
        return
    os.makedirs(run_dir, exist_ok=True)
    write_atomic(path, json.dumps(cfg.to_dict(), sort_keys=True, indent=1).encode())


class StateMismatch(ResumeError):
    """What a state is built from differs from the log: ``step`` and ``component`` (params,
    optim, checkpoint) name it, the message says how."""

    def __init__(self, step: int, component: str, detail: str) -> None:
        super().__init__(detail)
        self.step, self.component, self.detail = step, component, detail


class CheckpointMismatch(StateMismatch, CheckpointError):
    """A checkpoint that cannot be used at all (unreadable, edited files, another run's):
    a ``CheckpointError`` too, for callers that handle those."""


def initial_state(run: Run, genesis: dict[str, Any]) -> State:
    """The state before step 1, re-derived from the seed, checked against the genesis."""
    params = init_params(run.cfg.model, run.cfg.seed, run.device)
    if statehash.tensors_digest(params) != genesis.get("params"):
        raise StateMismatch(0, "params", f"the initial parameters re-derived from the seed "
                                         f"{run.cfg.seed} differ from the genesis digest "
                                         f"(another seed or init)")
    layout = run.layout
    opt = OptimState(*memplan.new_moments(run.memory, layout, run.device))
    if memplan.fresh_optim_digest(layout, opt) != genesis.get("optim"):   # hashed, so compared
        raise StateMismatch(0, "optim", "the genesis's optimizer digest is not the digest of "
                                        "zero Adam moments and counters, the state every run "
                                        "starts from (the genesis was forged)")
    return State(0, params, opt, statehash.genesis_hash(genesis),
                 step_boundary_state(run.plan, run.cfg.virtual_ranks, 1))


def checkpoint_state(run: Run, lines: list[dict[str, Any]], c: int) -> State:
    """The state after step ``c >= 1`` from its checkpoint, verified against line ``c`` of
    the log (see the module docstring); ``StateMismatch`` names what differs."""
    path = checkpoint.step_dir(run.dir, c)
    try:
        if run.memory is not None and run.memory.lean:   # moments into the plan's files
            ck = checkpoint.load_streamed(path, run.layout,
                                          *memplan.new_moments(run.memory, run.layout,
                                                               run.device))
        else:
            ck = checkpoint.load(path, run.device)
        why = checkpoint.record_difference(ck.record, lines, c)   # its genesis: this run's
        if why:
            raise CheckpointError(f"checkpoint {path}: {why}")
        rec = ck.record
        params, opt = tensors_of(ck, run)
    except CheckpointError as e:
        raise CheckpointMismatch(c, "checkpoint", str(e)) from None
    layout = run.layout
    comps = lines[c]["components"]
    if statehash.tensors_digest(params) != comps["params"]:
        raise StateMismatch(c, "params", f"checkpoint {path}: its parameters digest differs "
                                         f"from the log's step {c}; the checkpoint was "
                                         f"altered - resume from an earlier one")
    if memplan.optim_digest(layout, opt) != comps["optim"]:
        raise StateMismatch(c, "optim", f"checkpoint {path}: its optimizer state (moments or "
                                        f"counters) differs from the log's step {c}; the "
                                        f"checkpoint was altered - resume from an earlier one")
    loader = derived_loader_state(run, c, rec.get("loader"))
    if isinstance(loader, str):
        raise CheckpointMismatch(c, "checkpoint", f"{path}: {loader}")
    return State(c, params, opt, lines[c]["hash"], loader)


def resume_state(run: Run, lines: list[dict[str, Any]]) -> tuple[State, list[dict]]:
    """The state at the latest good checkpoint; returns it and the log lines up to it."""
    fresh, genesis = fresh_state(run)
    if lines[0].get("hash") != genesis["hash"]:
        raise ResumeError(_genesis_difference(run, lines[0], genesis))
    steps = [s for s in checkpoint.list_steps(run.dir) if 0 < s < len(lines)]
    if not steps:
        return fresh, lines[:1]
    c = steps[-1]
    return checkpoint_state(run, lines, c), lines[:c + 1]


def derived_loader_state(run: Run, step: int, stored: Any) -> dict[str, Any] | str:
    """The stream position after ``step``, re-derived from (seed, mix, step) - or, when the
    checkpoint's stored ``loader`` record differs from it in any field, a sentence naming
    the step and the first differing field. The stored record is never used: an edited
    buffer offset there would make every later step train on windows that are not the
    stream's."""
    want = step_boundary_state(run.plan, run.cfg.virtual_ranks, step + 1)
    diff = differing_fields(stored, want)
    if not diff:
        return want
    f = diff[0]
    return (f"its record.json field loader.{f[0]} is {f[1]!r} but the stream gives {f[2]!r} "
            f"at the boundary after step {step} ({len(diff)} field(s) differ): the recorded "
            f"stream position was edited")


def tensors_of(ck: checkpoint.Checkpoint, run: Run) -> tuple[dict[str, torch.Tensor],
                                                             OptimState]:
    """A loaded checkpoint's parameters and optimizer state, laid out for ``run``'s model
    (not yet checked against the log: the caller compares digests)."""
    specs = run.specs
    checkpoint.check_names(ck, [s.name for s in specs])     # no tensor ignored silently
    if ck.m_flat is not None:              # streamed into the lean plan's files (complete)
        return ({s.name: ck.params[s.name] for s in specs},
                OptimState(ck.m_flat, ck.v_flat, int(ck.record["adam_step"]),
                           int(ck.record["skip_left"])))
    layout = run.layout
    rec = ck.record
    opt = OptimState(layout.zeros(run.device), layout.zeros(run.device),
                     int(rec["adam_step"]), int(rec["skip_left"]))
    for name, view in layout.views(opt.m).items():
        view.copy_(ck.m[name])
    for name, view in layout.views(opt.v).items():
        view.copy_(ck.v[name])
    return {s.name: ck.params[s.name] for s in specs}, opt


def read_run(run_dir: str, mix: str | None = None, own: bool = False
             ) -> tuple[TrainConfig, str]:
    """A run directory's config and its mix (``mix`` overrides the one it recorded; a URL
    recorded in run.json is used only by the run's ``own`` trainer: ``runinfo``)."""
    cpath = os.path.join(run_dir, CONFIG)
    if not os.path.lexists(cpath):
        raise Open1bTrainError(f"{run_dir} is not a run directory ({cpath} is missing)")
    cfg = from_dict(read_json_object(cpath, "run config"))
    return cfg, mix if mix is not None else runinfo.named_mix(run_dir, own)


def _genesis_difference(run: Run, old: dict, new: dict) -> str:
    o, n = old.get("genesis", {}), new["genesis"]
    diff = [k for k in n if o.get(k) != n[k]]
    return (f"{run.dir}: its step 0 differs from this run's ({', '.join(diff) or 'hash'}): "
            f"another mix, seed or config; resume with the run's own mix and config, or use "
            f"another --out")



def open_run(cfg: TrainConfig, mix: str, run_dir: str, lead: bool = True,
             sync=lambda: None, memory_plan: str = "resident"
             ) -> tuple[Run, State, dict[int, dict], bool]:
    """Resolve the run and its state: resumed from the latest good checkpoint, or fresh.

    Returns (run, state, expected, fresh): ``expected`` holds the log lines past the
    resumed checkpoint (recomputed steps must equal them). Only the ``lead`` process
    writes the config, the log's first line or its rewrite; ``sync`` is a barrier between
    processes (none for one process). Call inside ``backend_scope(cfg)``."""
    run = resolve(cfg, mix, run_dir, memory_plan=memory_plan)
    if lead:
        _check_config(run.dir, run.cfg)
        with open(os.path.join(run.dir, RUN_INFO), "w") as f:
            json.dump({"mix": mix if "://" in mix else os.path.abspath(mix)}, f)
    sync()
    lines = runlog.read(run.dir)
    sync()                                   # every process has read the log before a rewrite
    if not lines:
        state, genesis = fresh_state(run)
        if lead:
            runlog.append(run.dir, genesis)
        return run, state, {}, True
    state, keep = resume_state(run, lines)
    if lead and runlog.has_partial_tail(run.dir):
        runlog.set_aside_partial_tail(run.dir)
    # the lines past the checkpoint stay published: each recomputed step must equal its line
    # (loop.check_reproduced); none is removed before its replacement is known to be equal
    return run, state, {ln["step"]: ln for ln in lines[len(keep):]}, False



def checkpoint_record(run: Run, state: State) -> dict[str, Any]:
    return {"adam_step": state.opt.adam_step, "skip_left": state.opt.skip_left,
            "run_hash": state.prev_hash, "loader": state.loader, "config": run.cfg.to_dict(),
            "config_identity": run.cfg.identity_sha256(),
            "mix_fingerprint": run.plan.fingerprint, "seed": run.cfg.seed,
            "software": {"open1b": __version__, "torch": torch.__version__}}


def optim_shards(layout: Layout, opt: OptimState, n: int, which=None) -> dict:
    """{logical shard: (m, v) by parameter name} for the checkpoint's optim files."""
    m, v = layout.views(opt.m), layout.views(opt.v)
    out = {}
    for i, (a, b) in enumerate(layout.shards(n)):
        if which is None or i in which:
            names = layout.names_in(a, b)
            out[i] = ({k: m[k] for k in names}, {k: v[k] for k in names})
    return out


def save_checkpoint(run: Run, state: State) -> None:
    layout = run.layout
    n = run.cfg.mesh[1]
    if run.memory is not None and run.memory.lean:
        checkpoint.save_streamed(run.dir, state.step, state.params, layout, state.opt.m,
                                 state.opt.v, n, checkpoint_record(run, state))
    else:
        checkpoint.save(run.dir, state.step, state.params, optim_shards(layout, state.opt, n),
                        n, checkpoint_record(run, state))
    checkpoint.prune(run.dir, run.cfg.keep_checkpoints)
