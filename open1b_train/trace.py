"""Per-op digest traces of a step (emitted on demand by ``open1b-train run --trace-steps``
and by ``open1b-audit trace``).

A trace is the sequence, in execution order, of ``(op, digest)`` for every op output of one
step: each virtual rank's micro-batches' forward and backward ops (names like
``rank1.mb0.layers.3.fwd.mlp.swiglu`` or ``rank0.mb2.layers.0.bwd.attn.core.dq``, see
``open1b_train.model``), each rank's accumulated gradient, each replica partial and the
reduced gradient. The digest is the tensor's ``kernels.sha256`` root (hex). Stored as JSON
lines ``{"i": index, "op": name, "digest": hex}``, one per op, under a header line
``{"format": "open1b-trace", "version": 1, "step": N}`` in ``RUN/traces/step-<n>.jsonl``.
"""
from __future__ import annotations

import json
import os

import torch

from open1b_train import statehash

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
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(json.dumps({"format": FORMAT, "version": 1, "step": self.step}) + "\n")
            for i, (op, d) in enumerate(self.ops):
                f.write(json.dumps({"i": i, "op": op, "digest": d}) + "\n")
        os.replace(tmp, path)


def read(path: str) -> tuple[int, list[tuple[str, str]]]:
    try:
        with open(path) as f:
            head = json.loads(f.readline())
            ops = [(r["op"], r["digest"]) for r in map(json.loads, f)]
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a readable trace ({e})") from None
    if head.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} file")
    return int(head["step"]), ops
