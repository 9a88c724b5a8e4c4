"""Algorithm 1 on one process: the gradient and loss of a step, reduced over the logical mesh.

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
"""
from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

import torch

from open1b_kernels.core.reduce import reciprocal_f32
from open1b_train.config import TrainConfig
from open1b_train.model import Trace, forward_backward
from open1b_train.params import Layout
from open1b_train.reduction.treefold import Spill, TreeFold


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


@dataclass(frozen=True)
class Reduced:
    grad: torch.Tensor                  # flat float32, reduced, before clipping
    loss: torch.Tensor                  # 0-d float32
    window_losses: torch.Tensor         # (windows,) float32 in mesh order
    peak_partials: int                  # most TreeFold partials alive at once


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


