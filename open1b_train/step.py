"""One optimizer step, written once: Algorithm 1 over the logical mesh, then the recipe.

The reduction (``reduction/gradient.py``: Algorithm 1 over the virtual ranks, every
"average" a multiply by a float32 reciprocal) gives the step's gradient and loss.

The recipe (after the reduction, on the logical gradient; the same bits however the
gradient is sharded, because every step below is elementwise or a pairwise-tree sum over
the flat gradient in model order):

* ``inject_spike`` steps (a forensics/testing knob of the config) multiply g by 1e4 first.
* norm = ``open1b_kernels.ops.gradnorm.grad_norm([g])``: the pairwise tree sum of g*g over the flat
  gradient (model order, every parameter starting at a multiple of 4,096, zero gaps:
  ``params.Layout``), correctly rounded sqrt. Because the tree is blockable, the same
  value is the tree over the 4,096-element chunk partials, which a sharded run computes.
  A non-finite norm or loss stops the run (``DivergenceError`` naming the step); nothing
  is updated.
* Spike protocol: if ``norm > spike_threshold`` the counter ``skip_left`` is set to
  ``spike_skip`` (5). A step with ``skip_left > 0`` is skipped and decrements it: its
  windows are consumed (the stream moves on; they are not replayed), its forward and
  backward ran (the loss and norm are logged and hashed), but the parameters, both Adam
  moments and the Adam step counter are left exactly as they were; the learning rate keeps
  following the consumed tokens. So a spike skips its own update and the next four; a new
  spike while skipping restarts the count at five.
* Otherwise: clip (g *= ``open1b_kernels.ops.gradnorm.clip_coefficient(norm)`` = min(1, clip /
  (norm + 1e-6)), one correctly rounded division and one multiply per element),
  the Adam step counter t += 1, and the fused AdamW of ``open1b_kernels.ops.adamw`` per parameter at
  ``lr = schedule LR at the step's tokens_after * lr_scale`` (binary64) with weight decay on
  the decayed group only (``params.py``). The weight quantization steps of the W8A8
  linears are re-derived from the updated weights at their next use (``open1b_kernels.int8.linear``
  re-pins them at every call), so they always match the weights.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from open1b_kernels.int8 import weightmemo
from open1b_kernels.ops.adamw import AdamWConfig, adamw_step_
from open1b_kernels.ops.gradnorm import clip_coefficient, grad_norm
from open1b_train import statehash, validate
from open1b_train.memory import memplan
from open1b_train.config import TrainConfig
from open1b_train.errors import DivergenceError
from open1b_train.model import Trace
from open1b_train.optimstate import OptimState
from open1b_train.params import Layout, ParamSpec
from open1b_train.reduction.gradient import MicroBatch, reduce_step
from open1b_train.reduction.treefold import file_spill
from open1b_train.run import Run, State

SPIKE_INJECTION = 1e4


@dataclass(frozen=True)
class Update:
    norm: float                         # pre-clip global norm (float32 value)
    skipped: bool
    spike: bool
    lr: float


def decide(cfg: TrainConfig, step: int, norm: float, loss: float, opt: OptimState) -> Update:
    """The spike protocol on the pre-clip norm (see the module docstring); updates
    ``opt.skip_left``. Raises ``DivergenceError`` on a non-finite loss or norm."""
    if not (math.isfinite(norm) and math.isfinite(loss)):
        raise DivergenceError(
            f"step {step}: non-finite {'loss' if not math.isfinite(loss) else 'gradient'} "
            f"(loss {loss}, gradient norm {norm}); the run stops here and keeps its last "
            f"good checkpoint - lower the learning rate or inspect the step's data with "
            f"`open1b-data stream-at --step {step} --stats`")
    spike = norm > cfg.spike_threshold
    if spike:
        opt.skip_left = cfg.spike_skip
    if opt.skip_left > 0:
        opt.skip_left -= 1
        return Update(norm, True, spike, 0.0)
    return Update(norm, False, spike, 0.0)


def update(cfg: TrainConfig, specs: list[ParamSpec], params: dict[str, torch.Tensor],
           grads: dict[str, torch.Tensor], m: dict[str, torch.Tensor],
           v: dict[str, torch.Tensor], norm: torch.Tensor, adam_step: int, lr: float,
           trace: Trace = None) -> None:
    """Clip by ``clip_coefficient(norm)`` and AdamW every parameter present in ``grads``
    (all of them, or one logical shard's) in place. ``trace`` (read-only) sees
    ``optim.clip_coef``, then per parameter ``optim.clip.<name>`` (the gradient AdamW
    consumes: clipped, or as reduced when the coefficient is 1) and
    ``optim.adamw.<name>.m`` / ``.v`` / ``.param`` after its update."""
    coef, adam = _clip_and_adamw(cfg, norm, trace)
    for spec in specs:
        if spec.name not in grads:
            continue
        g = grads[spec.name]
        if coef != 1.0:
            g.mul_(coef)                    # one IEEE multiply (x 1.0 is exact: skipped)
        wd = cfg.weight_decay if spec.decay else 0.0
        if trace is not None:
            trace(f"optim.clip.{spec.name}", g)
        adamw_step_(params[spec.name], g, m[spec.name], v[spec.name], adam_step, lr, wd, adam)
        if trace is not None:
            for which, t in (("m", m), ("v", v), ("param", params)):
                trace(f"optim.adamw.{spec.name}.{which}", t[spec.name])


def _clip_and_adamw(cfg: TrainConfig, norm: torch.Tensor, trace: Trace
                    ) -> tuple[float, AdamWConfig]:
    """The clip coefficient (traced) and the AdamW constants, shared by both plans' updates.
    The coefficient is computed on the host (CPU float32 ops, one correctly rounded
    division), then applied as one float32 multiply per element on the gradients' device:
    the same bits anywhere."""
    coef_t = clip_coefficient(norm.detach().to("cpu", torch.float32).reshape(()), cfg.clip)
    if trace is not None:
        trace("optim.clip_coef", coef_t)
    return float(coef_t), AdamWConfig(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay)


def update_streamed(cfg: TrainConfig, specs: list[ParamSpec], params: dict[str, torch.Tensor],
                    layout: Layout, grad: torch.Tensor, m, v, norm: torch.Tensor,
                    adam_step: int, lr: float, trace: Trace = None) -> None:
    """``update`` with the moments on disk (``diskflat.DiskFlat``, the lean plan): per
    parameter, per chunk of ``diskflat.CHUNK`` elements, the clip multiply and the fused
    AdamW on flat slices of the gradient, the parameter and the two moments read from disk,
    then the moments written back. Both are elementwise, so chunks give ``update``'s bits.
    ``trace`` sees the same names (the moments read back whole from disk)."""
    coef, adam = _clip_and_adamw(cfg, norm, trace)
    for spec in specs:
        slot = layout.by_name[spec.name]
        p = params[spec.name]
        if not p.is_contiguous():
            raise ValueError(f"{spec.name}: the streamed update needs contiguous parameters")
        p_flat = p.view(-1)
        wd = cfg.weight_decay if spec.decay else 0.0
        g_all = grad[slot.offset:slot.offset + slot.numel]
        if coef != 1.0:
            g_all.mul_(coef)
        if trace is not None:
            trace(f"optim.clip.{spec.name}", g_all.view(spec.shape))
        for a, m_c in m.chunks(slot.offset, slot.offset + slot.numel):
            b = a + m_c.numel()
            v_c = v.read(a, b)
            lo, hi = a - slot.offset, b - slot.offset
            adamw_step_(p_flat[lo:hi], grad[a:b], m_c, v_c, adam_step, lr, wd, adam)
            m.write(a, m_c)
            v.write(a, v_c)
        if trace is not None:
            trace(f"optim.adamw.{spec.name}.m", m.read(slot.offset, slot.offset + slot.numel
                                                         ).view(spec.shape))
            trace(f"optim.adamw.{spec.name}.v", v.read(slot.offset, slot.offset + slot.numel
                                                         ).view(spec.shape))
            trace(f"optim.adamw.{spec.name}.param", p)


def apply_update(cfg: TrainConfig, specs: list[ParamSpec], params: dict[str, torch.Tensor],
                 layout: Layout, grad: torch.Tensor, loss: torch.Tensor, opt: OptimState,
                 step: int, lr: float, trace: Trace = None) -> Update:
    """The recipe after the reduction on one process (see the module docstring).
    ``trace`` (read-only) sees ``optim.norm`` (the pre-clip norm), then ``update``'s ops
    unless the step is skipped."""
    if step in cfg.inject_spike:
        grad.mul_(SPIKE_INJECTION)
    norm_t = grad_norm([grad])
    if trace is not None:
        trace("optim.norm", norm_t)
    upd = decide(cfg, step, float(norm_t), float(loss), opt)
    if not upd.skipped:
        opt.adam_step += 1
        if memplan.on_disk(opt.m):
            update_streamed(cfg, specs, params, layout, grad, opt.m, opt.v, norm_t,
                            opt.adam_step, lr, trace)
        else:
            update(cfg, specs, params, layout.views(grad), layout.views(opt.m),
                   layout.views(opt.v), norm_t, opt.adam_step, lr, trace)
    return Update(upd.norm, upd.skipped, upd.spike, lr)


def float32_hex(x: float | torch.Tensor) -> str:
    """The bits of a float32 value as 8 hex digits (exact, for logs and hashes)."""
    return f"{int(np.array(float(x), dtype=np.float32).view(np.uint32)):08x}"


# ----------------------------------------------------------------------------- the step's line

@dataclass(frozen=True)
class StepOut:
    line: dict[str, Any]
    upd: Any
    loss: torch.Tensor
    hash_seconds: float
    peak_partials: int
    update_seconds: float = 0.0   # AdamW (clip, update, moments) alone: a step's fixed cost



def data_digest_of(batches: list[list[MicroBatch]]) -> str:
    """The step's data component from its micro-batches (any order: stream order inside)."""
    windows = [(m, d) for mbs in batches for mb in mbs
               for m, d in zip(mb.windows, statehash.window_digests(mb.tokens))]
    return statehash.data_digest(*zip(*windows))


def compute_step(run: Run, state: State, batches: list[list[MicroBatch]], step: int, info,
                 trace=None, spill=None):
    """Algorithm 1 + the recipe on ``state`` (updated in place) and the step's hashed log
    line: ``StepOut`` (line, Update, loss tensor, seconds spent hashing, most TreeFold
    partials alive). The trainer and the audit replay both run steps through here."""
    specs, layout = run.specs, run.layout
    lean = run.memory is not None and run.memory.lean
    if lean and spill is None:
        spill = file_spill(run.memory.scratch)
    # the parameters are only read until the update: the linears' weight-side work is made
    # on the first micro-batch and reused by the others (open1b_kernels.int8.weightmemo) -
    # except under the lean plan, whose 16 GB cap the memo's ~1.1 GB would pass
    memo = (weightmemo.held() if not lean and sum(len(mbs) for mbs in batches) > 1
            else contextlib.nullcontext())
    with memo:
        red = reduce_step(run.cfg, state.params, layout, batches, trace=trace, spill=spill,
                          device=run.device, lean=lean,
                          kept=run.memory.kept if lean else frozenset())
    t1 = time.perf_counter()
    grad_digest = statehash.tensors_digest(layout.views(red.grad))   # before clipping
    t_hash = time.perf_counter() - t1
    t_upd = time.perf_counter()
    upd = apply_update(run.cfg, specs, state.params, layout, red.grad, red.loss, state.opt,
                       step, info.lr * run.cfg.lr_scale, trace=trace)
    t1 = time.perf_counter()
    t_upd = t1 - t_upd
    comps = {"data": data_digest_of(batches), "grad": grad_digest,
             "params": statehash.tensors_digest(state.params),
             "optim": memplan.optim_digest(layout, state.opt)}
    line = step_line(step, state.prev_hash, comps,
                     scalars_record(red.loss, upd, info.tokens_after, red.window_losses,
                                    validation(run, state, step)))
    return StepOut(line, upd, red.loss, t_hash + time.perf_counter() - t1, red.peak_partials,
                   t_upd)


def validation(run: Run, state: State, step: int) -> dict[str, torch.Tensor] | None:
    """The step's validation losses on the updated parameters (``validate.py``), or None
    on a step without (``eval_every`` off or not due)."""
    if not validate.due(run.cfg, step):
        return None
    return validate.val_losses(run.cfg, state.params, run.validation,
                               run.schedule.spec.micro_batch)


def scalars_record(loss, upd, tokens_after: int, window_losses,
                   val_loss: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """The exact scalars of a step, as hashed (float32 bits as hex, LR as a hex float);
    ``val_loss`` {source: float32 hex} only on a validation step."""
    out = {"loss": float32_hex(loss), "grad_norm": float32_hex(upd.norm),
           "lr": float(upd.lr).hex(), "skipped": upd.skipped, "spike": upd.spike,
           "tokens": tokens_after,
           "window_loss": [float32_hex(x) for x in window_losses.tolist()]}
    if val_loss is not None:
        out["val_loss"] = {name: float32_hex(v) for name, v in val_loss.items()}
    return out


def step_line(step: int, prev: str, comps: dict[str, str], scalars: dict[str, Any]) -> dict:
    """The hashed part of a step's log line (``runlog``)."""
    comps = {**comps, "scalars": statehash.sha(scalars)}
    return {"step": step, "hash": statehash.step_hash(step, prev, comps), "prev": prev,
            "components": comps, "scalars": scalars}
