"""Training in one process: the run, its state (fresh or resumed), and the step written once.

``train(cfg, mix, run)`` trains ``cfg`` on the built mix ``mix`` into the run directory
``run`` (``RUN/config.json``, ``RUN/steps.jsonl``, ``RUN/checkpoints/``). A run directory
that already holds steps is resumed from its latest good checkpoint - only with the same
config identity (``TrainConfig.identity``), mix fingerprint and seed; anything else is
refused naming what differs. Steps the log already holds past that checkpoint (a run
killed after logging them) are recomputed and must come out bit-identical: a difference
is a ``ReproducibilityError`` naming the step and component, never a silent overwrite.

``compute_step`` is Algorithm 1 + the recipe over every virtual rank of the logical mesh;
the trainer, and the audit's replay, run steps through it. The loop around it (load ->
step -> check -> log -> checkpoint) is ``loop.run_steps``, shared with the distributed
engine. Data comes from ``open1b_data``'s ``StreamLoader`` serving all virtual ranks in
mesh order; the trainer never reorders it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

import kernels.backend as kb
from open1b_data import StreamPlan
from open1b_data.build.manifest import load_manifest
from open1b_data.stream.loader import step_boundary_state
from open1b_data.stream.schedule import Schedule
from open1b_data.stream.state import differing_fields
from open1b_train import __version__, checkpoint, runlog, statehash
from open1b_train.allocator import keep_freed_memory
from open1b_train.config import TrainConfig, from_dict
from open1b_train.errors import CheckpointError, ConfigError, Open1bTrainError, ResumeError
from open1b_train.loop import Computed, Summary, run_steps
from open1b_train.params import Layout, init_params, param_specs
from open1b_train.safeio import read_json_object
from open1b_train.trace import Tracer
from open1b_train.trace import path_of as trace_path
from open1b_train.step import MicroBatch, OptimState, apply_update, float32_hex, reduce_step

CONFIG = "config.json"
RUN_INFO = "run.json"      # where the run's mix lives (not part of its identity)


@dataclass
class Run:
    """A resolved run: config (vocab and seed filled in), mix, schedule, directories."""

    cfg: TrainConfig
    mix: str
    dir: str
    plan: StreamPlan
    schedule: Schedule
    last_step: int
    device: torch.device


@dataclass
class State:
    """What evolves from step to step."""

    step: int                       # last completed step (0 = the initial state)
    params: dict[str, torch.Tensor]
    opt: OptimState
    prev_hash: str
    loader: dict[str, Any] | None   # StreamLoader state at the next step's boundary


@dataclass(frozen=True)
class StepOut:
    line: dict[str, Any]
    upd: Any
    loss: torch.Tensor
    hash_seconds: float
    peak_partials: int


def _device(cfg: TrainConfig) -> torch.device:
    if cfg.backend != "cpu" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def backend_scope(cfg: TrainConfig):
    """``kernels.backend.force`` for the config's backend (auto: by device)."""
    return kb.force(None if cfg.backend == "auto" else cfg.backend)


def resolve(cfg: TrainConfig, mix: str, run_dir: str, use_index: bool = True) -> Run:
    """Fill the config from the mix (vocabulary, seed) and check that they fit. An auditor
    passes ``use_index=False``: a seek index stored in the mix is derived data its owner
    could have rewritten, so the replay plans from the stream's origin."""
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
    return Run(cfg, mix, run_dir, plan, schedule, last, _device(cfg))


# ----------------------------------------------------------------------------- state

def _genesis(run: Run, params: dict[str, torch.Tensor], opt: OptimState) -> dict[str, Any]:
    layout = Layout(param_specs(run.cfg.model))
    rec = {"config_identity": run.cfg.identity_sha256(), "mix_fingerprint": run.plan.fingerprint,
           "seed": run.cfg.seed, "params": statehash.tensors_digest(params),
           "optim": statehash.optim_digest(layout.views(opt.m), layout.views(opt.v),
                                           opt.adam_step, opt.skip_left)}
    return {"step": 0, "hash": statehash.genesis_hash(rec), "prev": None, "genesis": rec}


def fresh_state(run: Run) -> tuple[State, dict[str, Any]]:
    params = init_params(run.cfg.model, run.cfg.seed, run.device)
    layout = Layout(param_specs(run.cfg.model))
    opt = OptimState(layout.zeros(run.device), layout.zeros(run.device))
    line = _genesis(run, params, opt)
    return State(0, params, opt, line["hash"], None), line


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
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(cfg.to_dict(), f, sort_keys=True, indent=1)
    os.replace(tmp, path)


def resume_state(run: Run, lines: list[dict[str, Any]]) -> tuple[State, list[dict]]:
    """The state at the latest good checkpoint; returns it and the log lines to keep."""
    fresh, genesis = fresh_state(run)
    if lines[0].get("hash") != genesis["hash"]:
        raise ResumeError(_genesis_difference(run, lines[0], genesis))
    steps = [s for s in checkpoint.list_steps(run.dir) if s < len(lines)]
    if not steps:
        return fresh, lines[:1]
    c = steps[-1]
    ck = checkpoint.load(checkpoint.step_dir(run.dir, c), run.device)
    rec = ck.record
    for key, want in (("mix_fingerprint", run.plan.fingerprint), ("seed", run.cfg.seed),
                      ("config_identity", run.cfg.identity_sha256())):
        if rec.get(key) != want:
            raise ResumeError(f"checkpoint {ck.path} has {key} {rec.get(key)!r}, this run "
                              f"{want!r}; it belongs to another run")
    if rec.get("run_hash") != lines[c]["hash"]:
        raise ResumeError(f"checkpoint {ck.path} records step hash {rec.get('run_hash')}, the "
                          f"log's step {c} is {lines[c]['hash']}; they are from different runs")
    layout = Layout(param_specs(run.cfg.model))
    params, opt = tensors_of(ck, run)
    got = {"params": statehash.tensors_digest(params),
           "optim": statehash.optim_digest(layout.views(opt.m), layout.views(opt.v),
                                           opt.adam_step, opt.skip_left)}
    logged = lines[c]["genesis"] if c == 0 else lines[c]["components"]
    for comp, digest in got.items():
        if digest != logged[comp]:
            raise ResumeError(f"checkpoint {ck.path}: its {comp} digest {digest} differs from "
                              f"the log's step {c} ({logged[comp]}); the checkpoint was "
                              f"altered - resume from an earlier one")
    loader = derived_loader_state(run, c, rec.get("loader"))
    if isinstance(loader, str):
        raise ResumeError(f"checkpoint {ck.path}: {loader}; resume from an earlier checkpoint")
    return State(c, params, opt, lines[c]["hash"], loader), lines[:c + 1]


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
    specs = param_specs(run.cfg.model)
    missing = [s.name for s in specs if s.name not in ck.params or s.name not in ck.m]
    if missing:
        raise CheckpointError(f"checkpoint {ck.path} lacks parameters {missing[:3]} of this "
                              f"run's model; it was written for another config")
    layout = Layout(specs)
    rec = ck.record
    opt = OptimState(layout.zeros(run.device), layout.zeros(run.device),
                     int(rec["adam_step"]), int(rec["skip_left"]))
    for name, view in layout.views(opt.m).items():
        view.copy_(ck.m[name])
    for name, view in layout.views(opt.v).items():
        view.copy_(ck.v[name])
    return {s.name: ck.params[s.name] for s in specs}, opt


def read_run(run_dir: str, mix: str | None = None) -> tuple[TrainConfig, str]:
    """A run directory's config and its mix (``mix`` overrides the one it recorded)."""
    cpath = os.path.join(run_dir, CONFIG)
    if not os.path.lexists(cpath):
        raise Open1bTrainError(f"{run_dir} is not a run directory ({cpath} is missing)")
    cfg = from_dict(read_json_object(cpath, "run config"))
    if mix is None:
        info = read_json_object(os.path.join(run_dir, RUN_INFO), "run info")
        mix = info.get("mix")
        if not isinstance(mix, str) or not mix:
            raise Open1bTrainError(f"{run_dir}/{RUN_INFO}: 'mix' must name the run's mix, got "
                                   f"{mix!r}; pass --mix")
    return cfg, mix


def _genesis_difference(run: Run, old: dict, new: dict) -> str:
    o, n = old.get("genesis", {}), new["genesis"]
    diff = [k for k in n if o.get(k) != n[k]]
    return (f"{run.dir}: its step 0 differs from this run's ({', '.join(diff) or 'hash'}): "
            f"another mix, seed or config; resume with the run's own mix and config, or use "
            f"another --out")


# ----------------------------------------------------------------------------- running

def open_run(cfg: TrainConfig, mix: str, run_dir: str, lead: bool = True,
             sync=lambda: None) -> tuple[Run, State, dict[int, dict], bool]:
    """Resolve the run and its state: resumed from the latest good checkpoint, or fresh.

    Returns (run, state, expected, fresh): ``expected`` holds the log lines past the
    resumed checkpoint (recomputed steps must equal them). Only the ``lead`` process
    writes the config, the log's first line or its rewrite; ``sync`` is a barrier between
    processes (none for one process). Call inside ``backend_scope(cfg)``."""
    run = resolve(cfg, mix, run_dir)
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


def train(cfg: TrainConfig, mix: str, run_dir: str, progress: bool | None = None,
          echo=print, trace_steps: frozenset[int] = frozenset()) -> Summary:
    """Train (or resume) the run in ``run_dir``; see the module docstring."""
    keep_freed_memory()
    with backend_scope(cfg):
        run, state, expected, fresh = open_run(cfg, mix, run_dir)
        if fresh:
            _save_checkpoint(run, state)
        return run_steps(run, state, expected, LocalStepper(run, trace_steps), progress, echo)


class LocalStepper:
    """Every virtual rank in this process, in mesh order (``loop.Stepper``)."""

    lead = True

    def __init__(self, run: Run, trace_steps: frozenset[int] = frozenset()) -> None:
        self.run, self.trace_steps = run, trace_steps
        self.ranks = range(run.cfg.virtual_ranks)
        self.specs = param_specs(run.cfg.model)
        self.layout = Layout(self.specs)

    def compute(self, state: State, step: int, info, batches) -> Computed:
        tracer = Tracer(step) if step in self.trace_steps else None
        out = compute_step(self.run, state, batches, step, info, self.specs, self.layout,
                           trace=tracer)
        if tracer is not None:
            tracer.write(trace_path(self.run.dir, step))
        return Computed(out.line, out.upd, out.loss, {"hash_seconds": round(out.hash_seconds, 4)})

    def agree(self, step: int, line: dict) -> None:
        pass                                  # one process: nothing to agree with

    def save(self, state: State) -> None:
        _save_checkpoint(self.run, state)


def data_digest_of(batches: list[list[MicroBatch]]) -> str:
    """The step's data component from its micro-batches (any order: stream order inside)."""
    windows = [(m, d) for mbs in batches for mb in mbs
               for m, d in zip(mb.windows, statehash.window_digests(mb.tokens))]
    return statehash.data_digest(*zip(*windows))


def compute_step(run: Run, state: State, batches: list[list[MicroBatch]], step: int, info,
                 specs, layout: Layout, trace=None, spill=None):
    """Algorithm 1 + the recipe on ``state`` (updated in place) and the step's hashed log
    line: ``StepOut`` (line, Update, loss tensor, seconds spent hashing, most TreeFold
    partials alive). The trainer and the audit replay both run steps through here."""
    red = reduce_step(run.cfg, state.params, layout, batches, trace=trace, spill=spill,
                      device=run.device)
    t1 = time.perf_counter()
    grad_digest = statehash.tensors_digest(layout.views(red.grad))   # before clipping
    t_hash = time.perf_counter() - t1
    # trace only when tracing: stand-ins for apply_update (tests/audit/tamper.py) keep
    # its nine-argument signature
    upd = apply_update(run.cfg, specs, state.params, layout, red.grad, red.loss, state.opt,
                       step, info.lr * run.cfg.lr_scale, trace=trace)
    t1 = time.perf_counter()
    comps = {"data": data_digest_of(batches), "grad": grad_digest,
             "params": statehash.tensors_digest(state.params),
             "optim": statehash.optim_digest(layout.views(state.opt.m), layout.views(state.opt.v),
                                             state.opt.adam_step, state.opt.skip_left)}
    line = step_line(step, state.prev_hash, comps,
                     scalars_record(red.loss, upd, info.tokens_after, red.window_losses))
    return StepOut(line, upd, red.loss, t_hash + time.perf_counter() - t1, red.peak_partials)


def scalars_record(loss, upd, tokens_after: int, window_losses) -> dict[str, Any]:
    """The exact scalars of a step, as hashed (float32 bits as hex, LR as a hex float)."""
    return {"loss": float32_hex(loss), "grad_norm": float32_hex(upd.norm),
            "lr": float(upd.lr).hex(), "skipped": upd.skipped, "spike": upd.spike,
            "tokens": tokens_after,
            "window_loss": [float32_hex(x) for x in window_losses.tolist()]}


def step_line(step: int, prev: str, comps: dict[str, str], scalars: dict[str, Any]) -> dict:
    """The hashed part of a step's log line (``runlog``)."""
    comps = {**comps, "scalars": statehash.sha(scalars)}
    return {"step": step, "hash": statehash.step_hash(step, prev, comps), "prev": prev,
            "components": comps, "scalars": scalars}


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


def _save_checkpoint(run: Run, state: State) -> None:
    layout = Layout(param_specs(run.cfg.model))
    n = run.cfg.mesh[1]
    checkpoint.save(run.dir, state.step, state.params, optim_shards(layout, state.opt, n), n,
                    checkpoint_record(run, state))
    checkpoint.prune(run.dir, run.cfg.keep_checkpoints)
