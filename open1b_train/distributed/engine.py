"""The training loop on P torch.distributed processes: the same bits as ``train.train``.

Every process runs its block of virtual ranks (``placement.py``) in mesh order, then:

1. the reduce-scatter over shards and the all-reduce over replicas (``collectives.py``):
   virtual rank (r, s) ends with slice s of the reduced gradient;
2. the global norm from the 4,096-element chunk partials of every slice (gathered in
   shard order, one pairwise tree over them: the single-process tree's bits, because the
   tree is blockable and slices start at multiples of 4,096);
3. the spike decision and the clip coefficient (identical on every process, from the
   same norm and loss);
4. AdamW on each slice by its designated owner (virtual rank (0, s)), which alone holds
   that slice's Adam moments (the optimizer state is sharded); then the owner broadcasts
   the slice's parameters to every process;
5. the step's digests: window digests, gradient/moment roots are computed where the data
   lives and gathered; every process computes the step hash, and the processes' hashes
   are checked equal (a difference stops the run naming the process); the parameters
   digest is computed by every process from its full copy and checked equal too.
   Process 0 appends the log line and writes ``params.safetensors``; the owners write their
   shards' optimizer files into the same temporary checkpoint directory, which process 0
   renames once every file is written.

Every cross-process reduction is defined on the logical tensors (the flat gradient in
model order), never on how they are split, so P only changes who computes what. The loss
of the step is gathered from all virtual ranks and reduced with Algorithm 1's order on
every process. The run directory must be on a filesystem every process sees (one machine,
or a shared filesystem across nodes).
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from open1b_kernels.core.reduce import tree_sum
from open1b_kernels.core.rounding import sqrt_rn
from open1b_train import checkpoint, statehash
from open1b_train.memory.allocator import keep_freed_memory
from open1b_train.config import TrainConfig
from open1b_train.distributed.collectives import all_reduce, reduce_scatter
from open1b_train.distributed.exchange import Exchange
from open1b_train.distributed.placement import Placement
from open1b_train.errors import ReproducibilityError
from open1b_train.loop import Computed, Summary, run_steps
from open1b_train.params import ALIGN, Layout
from open1b_train.run import (Run, State, backend_scope, checkpoint_record, open_run)
from open1b_train.reduction.gradient import MicroBatch, loss_reduction, rank_gradient
from open1b_train.step import (SPIKE_INJECTION, Update, decide, scalars_record, step_line,
                               update, validation)


class Shards:
    """This process's view of the flat space: slice ranges and the owned moments."""

    def __init__(self, layout: Layout, pl: Placement, device) -> None:
        self.layout, self.pl = layout, pl
        self.ranges = layout.shards(pl.shards)
        self.m = {s: torch.zeros(b - a, device=device) for s, (a, b) in
                  enumerate(self.ranges) if s in pl.owned_shards}
        self.v = {s: torch.zeros_like(t) for s, t in self.m.items()}

    def views(self, s: int, flat_slice: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views of a slice-s tensor (parameters of shard s only)."""
        a, _ = self.ranges[s]
        return {sl.name: flat_slice[sl.offset - a:sl.offset - a + sl.numel].view(sl.shape)
                for sl in self.layout.slots if sl.name in self.names(s)}

    def names(self, s: int) -> list[str]:
        return self.layout.names_in(*self.ranges[s])

    def load(self, opt) -> None:
        """Take the owned slices of a full OptimState (fresh or from a checkpoint)."""
        for s in self.m:
            a, b = self.ranges[s]
            self.m[s].copy_(opt.m[a:b])
            self.v[s].copy_(opt.v[a:b])


def _gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _check_same(what: str, value) -> None:
    got = _gather(value)
    bad = [p for p, x in enumerate(got) if x != got[0]]
    if bad:
        raise ReproducibilityError(f"{what} differs between processes: process {bad[0]} has "
                                   f"{got[bad[0]]!r}, process 0 {got[0]!r}")


def train_distributed(cfg: TrainConfig, mix: str, run_dir: str, progress: bool | None = None,
                      echo=print) -> Summary:
    """``train.train`` on the current torch.distributed process group."""
    keep_freed_memory()
    rank, world = dist.get_rank(), dist.get_world_size()
    pl = Placement(cfg.mesh[0], cfg.mesh[1], world, rank)      # refuses a bad P first
    with backend_scope(cfg):
        run, state, expected, fresh = open_run(cfg, mix, run_dir, lead=rank == 0,
                                               sync=dist.barrier)
        shards = Shards(run.layout, pl, run.device)
        shards.load(state.opt)
        state.opt.m = state.opt.v = None           # only the owned slices stay
        stepper = DistStepper(run, shards, pl)
        if fresh:
            stepper.save(state)
        dist.barrier()
        return run_steps(run, state, expected, stepper, progress, echo)


class DistStepper:
    """This process's virtual ranks, the collectives and the sharded update
    (``loop.Stepper``); ``compute`` is the module docstring's five stages in order."""

    def __init__(self, run: Run, shards: Shards, pl: Placement) -> None:
        self.run, self.shards, self.pl = run, shards, pl
        self.ranks, self.lead = pl.local, pl.rank == 0
        self.ex = Exchange(pl)
        self.comm = 0.0                       # seconds in collectives this step

    def compute(self, state: State, step: int, info, batches) -> Computed:
        self.comm = 0.0
        grads, losses, wl, wins = self._local_gradients(state, batches)
        own, loss, window_losses, windows = self._reduce(grads, losses, wl, wins)
        groots = self._roots(own)             # the gradient before injection and clipping
        if step in self.run.cfg.inject_spike:
            for t in own.values():
                t.mul_(SPIKE_INJECTION)
        upd = self._update(state, step, info, own, loss)
        line = step_line(step, state.prev_hash, self._components(state, step, windows, groots),
                         scalars_record(loss, upd, info.tokens_after, window_losses,
                                        validation(self.run, state, step)))
        return Computed(line, upd, loss, {"processes": self.pl.procs,
                                          "collective_seconds": round(self.comm, 4)})

    def agree(self, step: int, line: dict) -> None:
        _check_same(f"step {step}'s hash", line["hash"])

    def save(self, state: State) -> None:
        _save(self.run, state, self.shards, self.pl)

    def _gather(self, obj):
        t0 = time.perf_counter()
        out = _gather(obj)
        self.comm += time.perf_counter() - t0
        return out

    def _local_gradients(self, state: State, batches: list[list[MicroBatch]]):
        """1. This process's virtual ranks' gradients and losses (Algorithm 1, step 1)."""
        layout, dev = self.shards.layout, self.run.device
        grads, losses, wl, wins = {}, {}, {}, []
        for v in self.pl.local:
            g = layout.zeros(dev)
            loss_v, per = rank_gradient(self.run.cfg, state.params, layout, batches[v], g,
                                        rank=v)
            for mb in batches[v]:
                wins.extend(zip(mb.windows, statehash.window_digests(mb.tokens)))
            grads[v], losses[v], wl[v] = g, loss_v.cpu(), torch.cat(per).cpu()
        return grads, losses, wl, wins

    def _reduce(self, grads, losses, wl, wins):
        """2. The reduce-scatter and all-reduce (steps 2 and 3); the loss in the same order
        from every virtual rank's loss; the owned slices of the reduced gradient."""
        pl = self.pl
        t0 = time.perf_counter()
        red = all_reduce(reduce_scatter(grads, self.shards.ranges, self.ex), self.ex)
        self.comm += time.perf_counter() - t0
        gathered = self._gather({"loss": losses, "wl": wl, "wins": wins})
        all_losses = {v: t for g in gathered for v, t in g["loss"].items()}
        loss = loss_reduction([all_losses[v] for v in range(pl.replicas * pl.shards)],
                              pl.replicas, pl.shards)
        window_losses = torch.cat([t for g in gathered for _, t in sorted(g["wl"].items())])
        windows = [w for g in gathered for w in g["wins"]]
        return {s: red[s] for s in pl.owned_shards}, loss, window_losses, windows

    def _roots(self, slices: dict[int, torch.Tensor]) -> dict[str, bytes]:
        return {k: r for s, t in slices.items()
                for k, r in statehash.roots(self.shards.views(s, t)).items()}

    def _update(self, state: State, step: int, info, own, loss) -> Update:
        """3.-4. The global norm from chunk partials in shard order, the spike decision,
        AdamW on the owned slices, then every process gets the new parameters."""
        cfg, pl, shards = self.run.cfg, self.pl, self.shards
        parts = {s: tree_sum((t * t).reshape(-1, ALIGN), -1).cpu() for s, t in own.items()}
        allp = {s: p for g in self._gather(parts) for s, p in g.items()}
        total = tree_sum(torch.cat([allp[s] for s in range(pl.shards)]), 0)
        norm_t = sqrt_rn(total.reshape(1)).reshape(())
        upd = decide(cfg, step, float(norm_t), float(loss), state.opt)
        lr = info.lr * cfg.lr_scale
        if not upd.skipped:
            state.opt.adam_step += 1
            for s, t in own.items():
                update(cfg, self.run.specs, state.params, shards.views(s, t),
                       shards.views(s, shards.m[s]), shards.views(s, shards.v[s]), norm_t,
                       state.opt.adam_step, lr)
            if pl.procs > 1:
                t0 = time.perf_counter()
                for s in range(pl.shards):
                    for name in shards.names(s):
                        dist.broadcast(state.params[name], src=pl.owner(s))
                self.comm += time.perf_counter() - t0
        return Update(upd.norm, upd.skipped, upd.spike, lr)

    def _components(self, state: State, step: int, windows, groots) -> dict[str, str]:
        """5. The step's digests: roots computed where the slices live, gathered."""
        own = self.pl.owned_shards
        allr = self._gather({"g": groots, "m": self._roots({s: self.shards.m[s] for s in own}),
                             "v": self._roots({s: self.shards.v[s] for s in own})})
        merge = lambda key: {k: r for g in allr for k, r in g[key].items()}  # noqa: E731
        params_digest = statehash.tensors_digest(state.params)
        _check_same(f"step {step}'s parameters digest", params_digest)
        return {"data": statehash.data_digest(*zip(*windows)),
                "grad": statehash.roots_digest(merge("g")), "params": params_digest,
                "optim": statehash.optim_digest_of(statehash.roots_digest(merge("m")),
                                                   statehash.roots_digest(merge("v")),
                                                   state.opt.adam_step, state.opt.skip_left)}


def _save(run: Run, state: State, shards: Shards, pl: Placement) -> None:
    """Every owner writes its optim shard files, process 0 the params and the record."""
    tag = _gather(os.getpid())[0]
    n = pl.shards
    if pl.rank == 0:
        checkpoint.clear_debris(run.dir)
    dist.barrier()
    tmp = checkpoint.tmp_dir(run.dir, state.step, f"{tag}")
    mine = {s: (shards.views(s, shards.m[s]), shards.views(s, shards.v[s]))
            for s in pl.owned_shards}
    files = checkpoint.write_files(tmp, checkpoint.tensor_files(
        state.params if pl.rank == 0 else None, mine, n))
    allf = {k: v for g in _gather(files) for k, v in g.items()}
    if pl.rank == 0:
        checkpoint.commit(run.dir, state.step, tmp, checkpoint_record(run, state), allf)
        checkpoint.prune(run.dir, run.cfg.keep_checkpoints)
    dist.barrier()


__all__ = ["train_distributed"]
