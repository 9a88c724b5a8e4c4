"""TreeFold: the replica reduction of a data-parallel step, computed online in pushes.

A cluster of R replicas reduces their gradients with a recursive-doubling (butterfly)
all-reduce: at level l, replica r pairs with r XOR 2^l and both compute ``lower + upper``
(the lower replica always on the left of the addition). For R not a power of two, R is
written as a sum of powers of two, largest first (R = 2^a + 2^b + ..., a > b > ...): the
replicas split into consecutive blocks of those sizes, each block reduces by the butterfly,
and the block results fold left to right, largest (lowest replicas) first::

    result = ((block_0 + block_1) + block_2) + ...

Every element is reduced independently with that tree, so the bits do not depend on how
the tensor is sharded or which process holds which block.

``TreeFold`` reproduces exactly that on one device, one replica partial at a time
(``push`` in replica order): a binary-carry stack merges two equal-level entries as
``lower + upper`` (so after pushing replicas 0..3 the top is ``(r0 + r1) + (r2 + r3)``), and
``result()`` adds the remaining entries from the bottom of the stack (the largest, lowest
block) upwards. At most ``log2(R) + 1`` partials are alive. ``butterfly_reference`` is the
cluster's algorithm written directly (all replicas in memory), for tests.

Additions are IEEE float32 adds, round to nearest even, elementwise (the same on every
backend: plain torch adds on tensors of one device). ``spill`` (optional) is called with
each partial that becomes dormant (not on top of the stack) and must return a zero-argument
loader; a replay on a small machine can move dormant partials to disk this way.
"""
from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

from open1b_train.errors import SpillError

Spill = Callable[[torch.Tensor], Callable[[], torch.Tensor]]


def file_spill(directory: str) -> Spill:
    """A spill that writes each dormant partial to ``directory`` as a ``.npy`` file (no
    pickle) and reads it back, then removes it, when the fold needs it. The file's SHA-256
    is kept in memory and checked when it is read back: a bit flipped on disk while the
    partial slept is a ``SpillError`` naming the file, never a gradient with other bits
    (which a replay would report as the run's mismatch)."""
    os.makedirs(directory, exist_ok=True)
    counter = [0]

    def spill(t: torch.Tensor):
        counter[0] += 1
        path = os.path.join(directory, f"partial-{os.getpid()}-{counter[0]}.npy")
        buf = io.BytesIO()
        np.save(buf, t.detach().cpu().numpy(), allow_pickle=False)
        data = buf.getvalue()
        with open(path, "wb") as f:
            f.write(data)
        digest = hashlib.sha256(data).hexdigest()
        device = t.device

        def load() -> torch.Tensor:
            with open(path, "rb") as f:
                raw = f.read()
            got = hashlib.sha256(raw).hexdigest()
            if got != digest:
                raise SpillError(f"{path}: the spilled TreeFold partial's sha256 is {got[:16]}"
                                 f"..., it was written as {digest[:16]}...: the file changed "
                                 f"on disk (a flipped bit or another writer); replay again")
            out = torch.from_numpy(np.load(io.BytesIO(raw), allow_pickle=False)).to(device)
            os.remove(path)
            return out
        return load
    return spill


class TreeFold:
    """Online butterfly fold over replica partials pushed in replica order."""

    def __init__(self, spill: Spill | None = None) -> None:
        self._stack: list[tuple[int, object]] = []      # (level, tensor or loader)
        self._spill = spill
        self.pushed = 0
        self.peak = 0                                    # most entries alive at once

    @staticmethod
    def _get(part: object) -> torch.Tensor:
        return part if isinstance(part, torch.Tensor) else part()

    def push(self, part: torch.Tensor) -> None:
        level = 0
        while self._stack and self._stack[-1][0] == level:
            _, lower = self._stack.pop()
            part = self._get(lower) + part           # the lower replica stays on the left
            level += 1
        if self._spill is not None and self._stack:
            lvl, top = self._stack[-1]
            if isinstance(top, torch.Tensor):        # it goes dormant under the new entry
                self._stack[-1] = (lvl, self._spill(top))
        self._stack.append((level, part))
        self.pushed += 1
        self.peak = max(self.peak, len(self._stack))

    @property
    def resident(self) -> int:
        """Partials held in memory now (not spilled)."""
        return sum(isinstance(p, torch.Tensor) for _, p in self._stack)

    def result(self) -> torch.Tensor:
        """The fold of every pushed partial (the largest block first, see the module doc)."""
        if not self._stack:
            raise ValueError("TreeFold.result() before any push")
        acc = self._get(self._stack[0][1])
        for _, part in self._stack[1:]:
            acc = acc + self._get(part)
        return acc


def blocks(replicas: int) -> list[tuple[int, int]]:
    """The butterfly blocks of R replicas: [(first replica, size)], sizes the powers of two
    of R's binary expansion, largest first."""
    out, start = [], 0
    for bit in reversed(range(replicas.bit_length())):
        if replicas >> bit & 1:
            out.append((start, 1 << bit))
            start += 1 << bit
    return out


def butterfly_reference(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The cluster's reduction, written directly: recursive doubling inside each block,
    then the blocks folded left to right (see the module docstring)."""
    results = []
    for start, size in blocks(len(parts)):
        vals = list(parts[start:start + size])
        step = 1
        while step < size:
            # every replica r computes lower + upper with its partner r ^ step
            vals = [vals[r] + vals[r ^ step] if r & step == 0 else vals[r ^ step] + vals[r]
                    for r in range(size)]
            step *= 2
        results.append(vals[0])
    acc = results[0]
    for r in results[1:]:
        acc = acc + r
    return acc
