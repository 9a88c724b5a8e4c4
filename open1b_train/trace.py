"""Per-op digest traces of a step (emitted on demand by ``open1b-train run --trace-steps``
and by ``open1b-audit trace``).

A trace is the sequence, in execution order, of ``(op, digest)`` for every op output of one
step: each virtual rank's micro-batches' forward and backward ops (names like
``rank1.mb0.layers.3.fwd.mlp.swiglu`` or ``rank0.mb2.layers.0.bwd.attn.core.dq``, see
``open1b_train.model``), each rank's accumulated gradient, each replica partial, the
reduced gradient, then the optimizer (``open1b_train.step``): ``optim.norm`` (the pre-clip
norm), and unless the step is skipped ``optim.clip_coef`` and, per parameter in model
order, ``optim.clip.<param>`` (the gradient AdamW consumes) and ``optim.adamw.<param>.m``,
``.v``, ``.param`` after its update. Tracing only reads tensors: a traced step has the
same bits as an untraced one. The digest is the tensor's ``open1b_kernels.hashing.sha256`` root (hex).
Stored as JSON lines ``{"i": index, "op": name, "digest": hex}``, one per op, under a
header line ``{"format": "open1b-trace", "version": 1, "step": N}`` in
``RUN/traces/step-<n>.jsonl``.
"""
from __future__ import annotations

import json
import os

import torch

from open1b_train import statehash
from open1b_train.errors import Open1bTrainError
from open1b.safeio import parse_json, read_regular, refuse_linked_dirs, write_atomic

FORMAT = "open1b-trace"


def path_of(run: str, step: int) -> str:
    return os.path.join(run, "traces", f"step-{step:08d}.jsonl")


class Tracer:
    """Collects (op, digest) of one step; pass the tracer itself as the trace callback."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.ops: list[tuple[str, str]] = []

    def __call__(self, name: str, t: torch.Tensor) -> None:
        self.ops.append((name, statehash.roots({name: t.detach()})[name].hex()))

    def write(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        lines = [json.dumps({"format": FORMAT, "version": 1, "step": self.step})]
        lines += [json.dumps({"i": i, "op": op, "digest": d}) for i, (op, d) in enumerate(self.ops)]
        write_atomic(path, ("\n".join(lines) + "\n").encode())   # a temporary made exclusively


def read(path: str) -> tuple[int, list[tuple[str, str]]]:
    """A trace file written by ``Tracer.write`` (another party's: a regular file only,
    every line checked); a malformed one is an ``Open1bTrainError`` naming the path."""
    parent = os.path.dirname(os.path.normpath(path))
    if os.path.basename(parent) == "traces":   # inside a run: its folders are the owner's
        refuse_linked_dirs(os.path.dirname(parent), path, "trace", Open1bTrainError)
    lines = read_regular(path, "trace").split(b"\n")
    head = parse_json(lines[0], path)
    if (not isinstance(head, dict) or head.get("format") != FORMAT or
            isinstance(head.get("step"), bool) or not isinstance(head.get("step"), int)):
        raise Open1bTrainError(f"{path}: not an {FORMAT} file (its first line must be the "
                               f"header with the step)")
    ops = []
    for i, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            continue
        r = parse_json(raw, f"{path} line {i}")
        if (not isinstance(r, dict) or not isinstance(r.get("op"), str) or
                not isinstance(r.get("digest"), str)):
            raise Open1bTrainError(f"{path} line {i}: not a trace entry (needs string 'op' and "
                                   f"'digest')")
        ops.append((r["op"], r["digest"]))
    return head["step"], ops
