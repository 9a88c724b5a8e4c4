"""Validation loss on the mix's held-out windows: forward only, the same bits everywhere.

Contract: with ``eval_every = N > 0`` (config), every step with ``step % N == 0`` carries
``scalars.val_loss = {source: float32 hex}`` in its hashed log line, after the step's
update. Source s's value is over its first ``K = eval_windows`` held-out windows
(``open1b_data.stream.heldout``: a pure function of the mix; fewer when the source has
fewer, and a source with none is left out):

1. the windows run in order through ``model.forward_loss`` (the training forward, no
   backward) in micro-batches of the schedule's ``micro_batch`` windows (a last shorter
   one when K is not a multiple), each window's loss as ``model.sequence_losses`` gives it;
2. ``val_loss_s = tree_sum(window losses, in order) * fp32(1 / K)`` (pairwise tree,
   ``open1b_kernels.core.reduce``; one IEEE float32 multiply).

Every op is a ``kernels`` op with a defined order (per window the same rows as the
training loss), so the CPU reference and the Triton kernels give the same bits and the
audit replay recomputes them.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.reduce import reciprocal_f32, tree_sum
from open1b_train.config import TrainConfig
from open1b_train.errors import ConfigError
from open1b_train.model import forward_loss


def load_windows(cfg: TrainConfig, view, device) -> dict[str, torch.Tensor]:
    """The held-out windows validation uses, per source: ``[n, window]`` int64 tensors
    (``n <= eval_windows``; sources without any are left out). Refuses a mix without a
    held-out set."""
    from open1b_data.stream.heldout import HeldoutWindows

    ho = HeldoutWindows(view)
    try:
        if not ho.sources:
            raise ConfigError(f"eval_every = {cfg.eval_every} needs a mix with held-out data; "
                              f"mix {view.name!r} has none - add [heldout] fraction = \"0.001\" "
                              f"to its definition and rebuild it, or set eval_every = 0")
        out = {}
        for name in ho.sources:
            w = ho.windows(name, cfg.eval_windows)
            if w.shape[0]:
                out[name] = torch.from_numpy(w.astype("int64")).to(device)
        return out
    finally:
        ho.close()


def due(cfg: TrainConfig, step: int) -> bool:
    """Whether ``step`` carries a validation loss."""
    return cfg.eval_every > 0 and step % cfg.eval_every == 0


def val_losses(cfg: TrainConfig, params: dict[str, torch.Tensor],
               windows: dict[str, torch.Tensor], micro_batch: int) -> dict[str, torch.Tensor]:
    """{source: 0-d float32 validation loss} by the rule of the module docstring."""
    out = {}
    for name, w in windows.items():
        per = []
        for a in range(0, w.shape[0], micro_batch):
            mb = w[a:a + micro_batch]
            per.append(forward_loss(cfg.model, params, mb[:, :-1], mb[:, 1:])[1])
        losses = torch.cat(per)
        total = tree_sum(losses.to(torch.float32).contiguous(), -1)
        r = reciprocal_f32(losses.shape[0])
        out[name] = (total if r == 1.0 else total * r).reshape(())
    return out
