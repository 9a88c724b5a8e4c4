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

from kernels.reduce import reciprocal_f32, tree_sum
from kernels.rounding import sqrt_rn
from open1b_train import checkpoint, statehash
from open1b_train.allocator import keep_freed_memory
from open1b_train.config import TrainConfig
from open1b_train.dist.collectives import all_reduce, reduce_scatter
from open1b_train.dist.exchange import Exchange
from open1b_train.dist.placement import Placement
from open1b_train.errors import ReproducibilityError
from open1b_train.loop import Computed, Summary, run_steps
from open1b_train.params import ALIGN, Layout, param_specs
from open1b_train.step import (SPIKE_INJECTION, MicroBatch, Update, _into, decide,
                               forward_backward, update)
from open1b_train.train import (Run, State, backend_scope, checkpoint_record, open_run,
                                optim_shards, scalars_record, step_line)
from open1b_train.treefold import TreeFold


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


def _loss_reduction(losses: dict[int, torch.Tensor], R: int, S: int) -> torch.Tensor:
    """Algorithm 1's loss order over the gathered per-virtual-rank losses."""
    fold = TreeFold()
    inv_s, inv_r = reciprocal_f32(S), reciprocal_f32(R)
    for r in range(R):
        p = losses[r * S]
        for s in range(1, S):
            p = p + losses[r * S + s]
        fold.push(p * inv_s if inv_s != 1.0 else p)
    g = fold.result()
    return (g * inv_r if inv_r != 1.0 else g).reshape(())


def train_distributed(cfg: TrainConfig, mix: str, run_dir: str, progress: bool | None = None,
                      echo=print) -> Summary:
    """``train.train`` on the current torch.distributed process group."""
    keep_freed_memory()
    rank, world = dist.get_rank(), dist.get_world_size()
    pl = Placement(cfg.mesh[0], cfg.mesh[1], world, rank)      # refuses a bad P first
    with backend_scope(cfg):
        run, state, expected, fresh = open_run(cfg, mix, run_dir, lead=rank == 0,
                                               sync=dist.barrier)
        shards = Shards(Layout(param_specs(run.cfg.model)), pl, run.device)
        shards.load(state.opt)
        state.opt.m = state.opt.v = None           # only the owned slices stay
        stepper = DistStepper(run, shards, pl)
        if fresh:
            stepper.save(state)
        dist.barrier()
        return run_steps(run, state, expected, stepper, progress, echo)


class DistStepper:
    """This process's virtual ranks, the collectives and the sharded update
    (``loop.Stepper``)."""

    def __init__(self, run: Run, shards: Shards, pl: Placement) -> None:
        self.run, self.shards, self.pl = run, shards, pl
        self.ranks, self.lead = pl.local, pl.rank == 0
        self.ex = Exchange(pl)
        self.specs = param_specs(run.cfg.model)

    def compute(self, state: State, step: int, info, batches) -> Computed:
        line, upd, loss, comm = _step(self.run, state, self.shards, self.pl, self.ex,
                                      self.specs, self.shards.layout, step, info, batches)
        return Computed(line, upd, loss, {"processes": self.pl.procs,
                                          "collective_seconds": round(comm, 4)})

    def agree(self, step: int, line: dict) -> None:
        _check_same(f"step {step}'s hash", line["hash"])

    def save(self, state: State) -> None:
        _save(self.run, state, self.shards, self.pl)


def _step(run, state, shards: Shards, pl: Placement, ex: Exchange, specs, layout, step, info,
          batches: list[list[MicroBatch]]):
    cfg, dev = run.cfg, run.device
    # 1. the local virtual ranks' gradients and losses (Algorithm 1, step 1)
    grads, losses, wl, wins = {}, {}, {}, []
    for v in pl.local:
        mbs = batches[v]
        r = reciprocal_f32(len(mbs))
        g = layout.zeros(dev)
        loss_v = None
        per = []
        for j, mb in enumerate(mbs):
            loss, per_seq, gr = forward_backward(cfg.model, state.params, mb.input_ids,
                                                 mb.labels)
            _into(g, layout, gr, r, add=j > 0)
            scaled = loss.reshape(1) if r == 1.0 else loss.reshape(1) * r
            loss_v = scaled if j == 0 else loss_v + scaled
            per.append(per_seq)
            wins.extend(zip(mb.windows, statehash.window_digests(mb.tokens)))
        grads[v], losses[v], wl[v] = g, loss_v.cpu(), torch.cat(per).cpu()
    # 2. the collectives (steps 2 and 3)
    tc = time.perf_counter()
    red = all_reduce(reduce_scatter(grads, shards.ranges, ex), ex)
    del grads
    gathered = _gather({"loss": losses, "wl": wl, "wins": wins})
    comm = time.perf_counter() - tc
    all_losses = {v: t for g in gathered for v, t in g["loss"].items()}
    loss = _loss_reduction(all_losses, pl.replicas, pl.shards)
    window_losses = torch.cat([t for g in gathered for _, t in sorted(g["wl"].items())])
    windows = [w for g in gathered for w in g["wins"]]
    own = {s: red[s] for s in pl.owned_shards}        # virtual rank (0, s) = s
    # the gradient's roots, before any injection or clipping, where the slices live
    groots = {k: r for s, t in own.items()
              for k, r in statehash.roots(shards.views(s, t)).items()}
    if step in cfg.inject_spike:
        for t in own.values():
            t.mul_(SPIKE_INJECTION)
    # 3. the global norm from chunk partials in shard order
    parts = {s: tree_sum((t * t).reshape(-1, ALIGN), -1).cpu() for s, t in own.items()}
    tc = time.perf_counter()
    allp = {s: p for g in _gather(parts) for s, p in g.items()}
    comm += time.perf_counter() - tc
    total = tree_sum(torch.cat([allp[s] for s in range(pl.shards)]), 0)
    norm_t = sqrt_rn(total.reshape(1)).reshape(())
    upd = decide(cfg, step, float(norm_t), float(loss), state.opt)
    lr = info.lr * cfg.lr_scale
    # 4. the update on the owned slices, then every process gets the new parameters
    if not upd.skipped:
        state.opt.adam_step += 1
        for s, t in own.items():
            update(cfg, specs, state.params, shards.views(s, t), shards.views(s, shards.m[s]),
                   shards.views(s, shards.v[s]), norm_t, state.opt.adam_step, lr)
        if pl.procs > 1:
            tc = time.perf_counter()
            for s in range(pl.shards):
                for name in shards.names(s):
                    dist.broadcast(state.params[name], src=pl.owner(s))
            comm += time.perf_counter() - tc
    upd = Update(upd.norm, upd.skipped, upd.spike, lr)
    # 5. digests
    mroots = {k: r for s in own for k, r in statehash.roots(shards.views(s, shards.m[s])).items()}
    vroots = {k: r for s in own for k, r in statehash.roots(shards.views(s, shards.v[s])).items()}
    tc = time.perf_counter()
    allr = _gather({"g": groots, "m": mroots, "v": vroots})
    comm += time.perf_counter() - tc
    merge = lambda key: {k: r for g in allr for k, r in g[key].items()}  # noqa: E731
    params_digest = statehash.tensors_digest(state.params)
    _check_same(f"step {step}'s parameters digest", params_digest)
    comps = {"data": statehash.data_digest(*zip(*windows)),
             "grad": statehash.roots_digest(merge("g")), "params": params_digest,
             "optim": statehash.optim_digest_of(statehash.roots_digest(merge("m")),
                                                statehash.roots_digest(merge("v")),
                                                state.opt.adam_step, state.opt.skip_left)}
    line = step_line(step, state.prev_hash, comps,
                     scalars_record(loss, upd, info.tokens_after, window_losses))
    return line, upd, loss, comm


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


__all__ = ["train_distributed", "optim_shards"]
