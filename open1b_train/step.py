"""One optimizer step, written once: Algorithm 1 over the logical mesh, then the recipe.

Reduction (the logical mesh is ``dp_replicate`` R x ``dp_shard`` S virtual ranks, virtual
rank ``v = rep * S + shard``, replica-major; every "average" multiplies by a float32
reciprocal, never divides):

1. Virtual ranks run in mesh order. Rank v's gradient is its micro-batches' gradients
   accumulated in order: ``g_v = g_0 * r``, then ``g_v = g_v + g_j * r`` for j = 1 .. A-1,
   with ``r = fp32(1 / A)`` (A = accumulation; each multiply and add one IEEE float32
   operation).
2. The shards of a replica add in ascending shard order into one running partial,
   ``p = g_(rep,0)``, ``p = p + g_(rep,s)``; at the last shard ``p = p * fp32(1 / S)``.
3. The replica partials fold by ``TreeFold`` (the cluster's butterfly, ``treefold.py``);
   ``g = fold.result() * fp32(1 / R)``.
The step's loss goes through exactly the same reduction as the gradient (micro-batch
losses in place of gradients), so it is the mean over the step's tokens in that order.
Multiplying by fp32(1/1) = 1.0 is exact and skipped. At most one rank gradient, one
replica partial and O(log2 R) fold partials are alive at once.

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

import math
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from open1b_kernels.ops.adamw import AdamWConfig, adamw_step_
from open1b_kernels.ops.gradnorm import clip_coefficient, grad_norm
from open1b_kernels.core.reduce import reciprocal_f32
from open1b_train import memplan, statehash, validate
from open1b_train.config import TrainConfig
from open1b_train.errors import DivergenceError
from open1b_train.model import Trace, forward_backward
from open1b_train.params import Layout, ParamSpec
from open1b_train.treefold import Spill, TreeFold, file_spill

if TYPE_CHECKING:                      # run.py imports this module
    from open1b_train.run import Run, State

SPIKE_INJECTION = 1e4


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of one virtual rank: windows ``(B, window_tokens)`` int64."""

    rank: int
    index: int
    windows: tuple[int, ...]
    tokens: torch.Tensor

    @property
    def input_ids(self) -> torch.Tensor:
        return self.tokens[:, :-1]

    @property
    def labels(self) -> torch.Tensor:
        return self.tokens[:, 1:]


@dataclass
class OptimState:
    """Adam moments (flat float32, model order: tensors, or ``diskflat.DiskFlat`` files under
    the lean memory plan), the update counter and the skip counter."""

    m: Any
    v: Any
    adam_step: int = 0
    skip_left: int = 0


@dataclass(frozen=True)
class Reduced:
    grad: torch.Tensor                  # flat float32, reduced, before clipping
    loss: torch.Tensor                  # 0-d float32
    window_losses: torch.Tensor         # (windows,) float32 in mesh order
    peak_partials: int                  # most TreeFold partials alive at once


@dataclass(frozen=True)
class Update:
    norm: float                         # pre-clip global norm (float32 value)
    skipped: bool
    spike: bool
    lr: float


def _into(flat: torch.Tensor, layout: Layout, grads: dict[str, torch.Tensor], r: float,
          add: bool, names=None) -> None:
    """flat (+)= grads * r, per parameter, one IEEE multiply and one add per element
    (``names``: only those parameters)."""
    for slot in layout.slots if names is None else [layout.by_name[n] for n in names]:
        g = grads[slot.name].reshape(-1)
        view = flat[slot.offset:slot.offset + slot.numel]
        scaled = g if r == 1.0 else g * r
        if add:
            view.add_(scaled)
        else:
            view.copy_(scaled)


class GradSink(MutableMapping):
    """The lean plan's gradient mapping for ``model.forward_backward``: each parameter's
    gradient goes into its slot of the flat buffer the moment it is stored - exactly
    ``_into``'s ``flat (+)= g * r`` for that parameter - and is not kept, so at most one
    parameter's gradient exists outside the flat buffer. Parameters are independent
    elementwise, so the order they arrive in cannot change a bit."""

    def __init__(self, flat: torch.Tensor, layout: Layout, r: float, add: bool) -> None:
        self.flat, self.layout, self.r, self.add = flat, layout, r, add
        self.seen: set[str] = set()

    def __setitem__(self, name: str, g: torch.Tensor) -> None:
        if name in self.seen:
            raise ValueError(f"gradient of {name} stored twice")
        _into(self.flat, self.layout, {name: g}, self.r, self.add, (name,))
        self.seen.add(name)

    def __getitem__(self, name: str) -> torch.Tensor:
        raise KeyError(f"{name}: a GradSink keeps no gradient (it is in the flat buffer)")

    def __delitem__(self, name: str) -> None:
        raise KeyError(name)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def check_complete(self) -> None:
        missing = [s.name for s in self.layout.slots if s.name not in self.seen]
        if missing:
            raise ValueError(f"the backward produced no gradient for {missing[:3]}")


def rank_gradient(cfg: TrainConfig, params: dict[str, torch.Tensor], layout: Layout,
                  mbs: list[MicroBatch], out: torch.Tensor, trace: Trace = None,
                  rank: int = 0, lean: bool = False, kept: frozenset[int] = frozenset()
                  ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Algorithm 1, step 1, for one virtual rank: its micro-batches' gradients accumulated
    in order into the flat ``out`` (overwritten), each times fp32(1/A); returns the rank's
    loss reduced the same way (shape (1,)) and each micro-batch's per-sequence losses.
    ``lean``: the memory plan's forward/backward (``model.py``) and, unless traced (a trace
    lists the gradients after the backward), a ``GradSink`` instead of a gradient dict;
    ``kept``: the layers whose activations it holds instead of recomputing them."""
    r = reciprocal_f32(len(mbs))
    loss_v, per = None, []
    for j, mb in enumerate(mbs):
        tr = None if trace is None else (
            lambda name, t, j=j: trace(f"rank{rank}.mb{j}.{name}", t))
        sink = GradSink(out, layout, r, add=j > 0) if lean and tr is None else None
        loss, per_seq, grads = forward_backward(cfg.model, params, mb.input_ids, mb.labels, tr,
                                                lean=lean, grads=sink, kept=kept)
        if sink is None:
            _into(out, layout, grads, r, add=j > 0)
        else:
            sink.check_complete()
        del grads, sink
        scaled = loss.reshape(1) if r == 1.0 else loss.reshape(1) * r
        loss_v = scaled if j == 0 else loss_v + scaled
        per.append(per_seq)
    return loss_v, per


def loss_reduction(losses: list[torch.Tensor], reps: int, shards: int) -> torch.Tensor:
    """Algorithm 1's order over the virtual ranks' losses (mesh order): shards added in
    ascending order then times fp32(1/S), replicas folded by TreeFold, times fp32(1/R)."""
    fold = TreeFold()
    inv_s, inv_r = reciprocal_f32(shards), reciprocal_f32(reps)
    for rep in range(reps):
        p = losses[rep * shards]
        for sh in range(1, shards):
            p = p + losses[rep * shards + sh]
        fold.push(p * inv_s if inv_s != 1.0 else p)
    g = fold.result()
    return (g * inv_r if inv_r != 1.0 else g).reshape(())


def reduce_step(cfg: TrainConfig, params: dict[str, torch.Tensor], layout: Layout,
                batches: list[list[MicroBatch]], trace: Trace = None,
                spill: Spill | None = None, device: torch.device | str = "cpu",
                lean: bool = False, kept: frozenset[int] = frozenset()) -> Reduced:
    """Algorithm 1 on one process: ``batches[v]`` are virtual rank v's micro-batches in
    order. At most one rank gradient, one replica partial and the fold's partials live."""
    reps, shards = cfg.mesh
    if len(batches) != reps * shards:
        raise ValueError(f"need {reps * shards} virtual ranks' micro-batches, got {len(batches)}")
    inv_s, inv_r = reciprocal_f32(shards), reciprocal_f32(reps)
    fold = TreeFold(spill)
    losses, window_losses = [], []
    g_v = layout.zeros(device) if shards > 1 else None
    partial = None
    for v, mbs in enumerate(batches):
        shard = v % shards
        target = layout.zeros(device) if shard == 0 else g_v   # rank 0 of a replica: in place
        loss_v, per = rank_gradient(cfg, params, layout, mbs, target, trace, v, lean, kept)
        losses.append(loss_v)
        window_losses.extend(per)
        if trace is not None:
            trace(f"rank{v}.grad", target)
        if shard == 0:
            partial = target
        else:
            partial.add_(target)
        if shard == shards - 1:
            if inv_s != 1.0:
                partial.mul_(inv_s)
            if trace is not None:
                trace(f"replica{v // shards}.partial", partial)
            fold.push(partial)
            partial = None
    g = fold.result()
    if inv_r != 1.0:
        g = g * inv_r
    if trace is not None:
        trace("reduced", g)
    return Reduced(g, loss_reduction(losses, reps, shards), torch.cat(window_losses), fold.peak)


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
                 specs, layout: Layout, trace=None, spill=None):
    """Algorithm 1 + the recipe on ``state`` (updated in place) and the step's hashed log
    line: ``StepOut`` (line, Update, loss tensor, seconds spent hashing, most TreeFold
    partials alive). The trainer and the audit replay both run steps through here."""
    lean = run.memory is not None and run.memory.lean
    if lean and spill is None:
        spill = file_spill(run.memory.scratch)
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
