"""Messages between virtual ranks: torch.distributed point-to-point between processes,
plain references inside one.

Every collective step is a list of messages ``(src_v, dst_v, tensor)`` that all processes
enumerate identically; ``Exchange.run`` posts the receives and sends that involve this
process (``isend`` / ``irecv`` with a tag per message, so any number of messages between
two processes can be in flight) and returns what arrived, keyed by (src_v, dst_v). A
message between two virtual ranks of one process is the sender's tensor itself (it must
not be modified until the step's messages are consumed). This is the distributed
engine's own transport (gloo on CPU, NCCL on GPU), nothing hand-made; a peer that dies
makes the pending receive fail after the process group's timeout.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from open1b_train.dist.placement import Placement

Message = tuple[int, int, torch.Tensor | None]      # (src_v, dst_v, payload at the sender)


class Exchange:
    """Delivers one step's messages between virtual ranks (see the module docstring)."""

    def __init__(self, placement: Placement, group=None) -> None:
        self.pl = placement
        self.group = group
        self._round = 0

    def run(self, messages: Sequence[tuple[int, int]], payload: Callable[[int, int], torch.Tensor],
            like: Callable[[int, int], torch.Tensor]) -> dict[tuple[int, int], torch.Tensor]:
        """``messages``: (src_v, dst_v) pairs (the same list on every process);
        ``payload(src, dst)`` the tensor to send (called only on the sender's process);
        ``like(src, dst)`` an empty tensor of the right shape/dtype to receive into.
        Returns {(src, dst): tensor} for the messages whose dst is local."""
        pl, V = self.pl, self.pl.virtual
        self._round += 1
        base = (self._round % 1024) * V * V
        out, pending, keep = {}, [], []
        for src, dst in messages:
            ps, pd = pl.host(src), pl.host(dst)
            if pd != pl.rank or ps == pl.rank:
                continue
            buf = like(src, dst)
            pending.append(dist.irecv(buf, src=ps, group=self.group, tag=base + src * V + dst))
            out[(src, dst)] = buf
        for src, dst in messages:
            ps, pd = pl.host(src), pl.host(dst)
            if ps != pl.rank:
                continue
            t = payload(src, dst)
            if pd == pl.rank:
                out[(src, dst)] = t
            else:
                keep.append(t.contiguous())      # alive until the send completes
                pending.append(dist.isend(keep[-1], dst=pd, group=self.group,
                                          tag=base + src * V + dst))
        for w in pending:
            w.wait()
        return out
