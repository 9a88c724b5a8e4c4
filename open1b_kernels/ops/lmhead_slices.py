"""The LM head's int8 slices on the CPU (``open1b_kernels.ops.lmhead``, step 1): the compiled
slicer (``_lmhead_slices.c``: integer and bit operations only, so the values of the torch
code, ``open1b_kernels.ops.lmhead.slice_rows_cpu``, in any split), and the slices stored so
that every level's operand is a view (``LevelSlices``).

The LM head's integer route multiplies, per level L, the slices a_1 .. a_(L-1) of one
operand side by side along the contraction with b_(L-1) .. b_1 of the other (the level's
pairs (i, L - i)). Stored as separate planes (S, R, K), each level operand of more than
one slice was a copy: 1.5x the slices of the operand went through memory again per call
(~50 MB for the demo's 2,048 x 8,192 logits gradient). Here the slicer writes them where
the levels want them:

- a row-major operand (R, K) into (R, S, K): row r holds its S slices one after another,
  so slices 1 .. c of rows ``rows`` are the view ``store[rows, :c].reshape(n, c K)``;
- a transposed view (its storage (K, R) row-major, sliced per storage column) into the
  planes (S, K, R): slices 1 .. c are the contiguous first c planes, a (c K, R) matrix whose
  transpose is the level operand;
- the b side in descending order (slice S first), so its level operands b_(L-1) .. b_1 are
  the last L - 1 positions, again one view.

The same int8 values as ``slice_rows_cpu`` (only where they are written changes), so the
same products and bits; without the compiled slicer, ``from_planes`` arranges the torch
slicer's planes the same way. The slicer also writes the planes (S, R, K) of the operand's
storage (``slice_rows``: ``slice_rows_cpu``'s compiled path). A contraction cut into
several chunks (K > ``K_CHUNK``) still copies each chunk's level operand (``level_copy``).
The exactness guard's sums run over the whole store at once: the column sums of every
slice in one pass, and ``sum_i slice_i @ v_i`` as one matrix-vector product of the store
with the v_i side by side.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.mathc import Loops, span
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8.checksum import _mv, col_sums

LOOPS = Loops("open1b_kernels.ops._opsc")    # the slicer compiled: _lmhead_slices.c


def slice_rows(x: torch.Tensor, slices: int, out: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``open1b_kernels.ops.lmhead.slice_rows_cpu`` by the compiled loop (integer operations
    only, so the same result), or None when the loop is unavailable.

    A transposed view of a row-major matrix (a weight seen as ``w.t()``) is sliced in its
    storage's layout, one exponent per storage column, and the slices come back as the
    matching transposed views - no transposed copy of the operand or of its slices. ``out``:
    a contiguous int8 buffer of ``slices * x.numel()`` elements to write the slices into
    (reused memory: no page faults), else a new tensor."""
    if out is None:
        out = torch.empty((slices * x.numel(),), dtype=torch.int8)
    got = _slice(x, slices, out, None)
    if got is None:
        return None
    planes, exps, by_cols = got
    return (planes.transpose(1, 2) if by_cols else planes), exps


def slice_store(x: torch.Tensor, slices: int, out: torch.Tensor, descending: bool
                ) -> tuple[torch.Tensor, torch.Tensor, bool] | None:
    """``slice_rows``'s slices stored so that the slices of a level sit side by side along
    the contraction (``LevelSlices``): a row-major ``x`` (R, K) into (R, S, K) - each row's
    slices interleaved - and a transposed view into the planes (S, K, R) of its storage;
    ``descending``: slice S first. Returns (that storage view of ``out``, the exponents,
    whether ``x`` was sliced by storage columns), or None when the loop is unavailable."""
    if not LOOPS.available():
        return None
    return _slice(x, slices, out, descending)


def _rows_in_place(x: torch.Tensor) -> bool:
    """Whether ``x`` (2-D, or any contiguous tensor) is rows of contiguous elements, each
    row at least a row's length after the one before (the slicer reads it in place)."""
    if x.is_contiguous():
        return True
    return (x.dim() == 2 and x.stride(1) == 1 and x.stride(0) >= x.shape[1]
            and x.shape[1] > 0)


def _slice(x: torch.Tensor, slices: int, out: torch.Tensor, descending: bool | None):
    """The slicer's call: planes (S, r, k) of the storage when ``descending`` is None, else
    the level-ready layout in that order. (storage view of ``out``, exponents, by_cols)."""
    if (not LOOPS.available() or x.device.type != "cpu"
            or x.dtype not in (torch.float32, torch.bfloat16)):
        return None
    # read in place where the rows (or, by_cols, the columns) are contiguous, at any distance
    # apart: a block of columns of a wider matrix - the lean head's weight gradient slices
    # column blocks of dlogits, whose copies took 3.75 s of a 2-layer replay's 63 s step
    rows = _rows_in_place(x)
    by_cols = x.dim() == 2 and not rows and _rows_in_place(x.t())
    src = x.t() if by_cols else (x if rows else x.contiguous())
    r, k = src.shape
    if out.dtype != torch.int8 or not out.is_contiguous() or out.numel() != slices * r * k:
        raise ValueError(f"the slicer's out must be contiguous int8 with {slices * r * k} "
                         f"elements, got {out.dtype} {tuple(out.shape)}")
    ld = src.stride(0) if r > 1 and k > 0 else k
    n = k if by_cols else r
    exps = torch.empty((n,), dtype=torch.int32)
    interleave = descending is not None and not by_cols
    layout = (1 if interleave else 0) | (2 if descending else 0)
    bits = span(src).view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32)
    a, o, e = bits.numpy(), out.reshape(-1).numpy(), exps.numpy()
    parallel(lambda lo, hi, p: LOOPS.slice_planes(a, x.dtype == torch.bfloat16, r, k, slices,
                                                  by_cols, o, e, lo, hi, p, layout, ld),
             n, grain=64 if by_cols else 1)
    return (out.view(r, slices, k) if interleave else out.view(slices, r, k)), exps, by_cols


def _buffer(name: str | None, shape: tuple[int, ...]) -> torch.Tensor:
    """An int8 store for slices: the scratch buffer ``name``, or (None) one of its own."""
    return (scratch(name, shape, torch.int8) if name is not None
            else torch.empty(shape, dtype=torch.int8))


class LevelSlices:
    """The S slices of ``x`` (R, K) in the level-ready layout (module docstring), the
    exponents in ``exps``; ``planes[i]`` is slice i + 1 as an (R, K) view. ``make`` slices
    by the compiled loop (None when it is unavailable); ``from_planes`` arranges the torch
    slicer's planes (a copy: the fallback)."""

    def __init__(self, store: torch.Tensor, exps: torch.Tensor, by_cols: bool,
                 descending: bool) -> None:
        self.store, self.exps, self.by_cols, self.descending = store, exps, by_cols, descending
        n = store.shape[0] if by_cols else store.shape[1]
        self.planes = [self._at(self._pos(i, n)) for i in range(n)]
        self._col_sums: list[torch.Tensor] | None = None

    @classmethod
    def make(cls, x: torch.Tensor, slices: int, name: str | None, descending: bool
             ) -> LevelSlices | None:
        """``x`` sliced into the scratch buffer ``name``, or (``name`` None) into a buffer
        of its own: slices kept past the call (the head weight's, ``weightmemo``)."""
        got = slice_store(x, slices, _buffer(name, (slices * x.numel(),)), descending)
        return None if got is None else cls(got[0], got[1], got[2], descending)

    @classmethod
    def from_planes(cls, planes: torch.Tensor, exps: torch.Tensor, name: str | None,
                    descending: bool) -> LevelSlices:
        """The planes (S, R, K) of ``slice_rows_cpu`` copied into the row-interleaved
        layout (R, S, K): the same values (``name`` None: a buffer of its own)."""
        s, r, k = planes.shape
        store = _buffer(name, (r, s, k))
        for i in range(s):
            store[:, s - 1 - i if descending else i] = planes[i]
        return cls(store, exps, False, descending)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.planes), *self.planes[0].shape)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.planes[i]

    def _pos(self, i: int, n: int) -> int:
        return n - 1 - i if self.descending else i

    def _at(self, pos: int) -> torch.Tensor:
        return self.store[pos].t() if self.by_cols else self.store[:, pos]

    def level(self, count: int, rows: slice) -> torch.Tensor:
        """Slices 1 .. ``count`` (ascending store) or ``count`` .. 1 (descending) of the rows
        ``rows``, side by side along K: (n, count K), a view of the store."""
        which = range(count, 0, -1) if self.descending else range(1, count + 1)
        return self.run(tuple(which), rows)

    def run(self, which: tuple[int, ...], rows: slice) -> torch.Tensor | None:
        """The slices ``which`` (1-based) of the rows ``rows`` side by side along K as a view,
        or None where they do not lie one after another in the store."""
        at = self.run_at(which)
        return None if at is None else self.span(at, rows)

    def run_at(self, which: tuple[int, ...]) -> slice | None:
        """Where the slices ``which`` (1-based) lie side by side in the store: their
        positions, or None where they do not lie one after another."""
        n = len(self.planes)
        pos = [self._pos(i - 1, n) for i in which]
        if pos != list(range(pos[0], pos[0] + len(pos))):
            return None
        return slice(pos[0], pos[0] + len(pos))

    def slices_at(self, span: slice) -> list[int]:
        """The slices (1-based) at the store's positions ``span``, in store order."""
        return [self._pos(p, len(self.planes)) + 1 for p in range(span.start, span.stop)]

    def gather(self, i: int, rows: slice, cols: torch.Tensor, name: str) -> torch.Tensor:
        """Slice ``i`` (1-based) of the rows ``rows`` at the contraction columns ``cols``:
        (n, len(cols)), a copy into the scratch buffer ``name`` (contiguous, or for a
        transposed store the transposed view of a contiguous (len(cols), n))."""
        pos = self._pos(i - 1, len(self.planes))
        if self.by_cols:
            part = self.store[pos][:, rows]                           # (K, n)
            got = scratch(name, (cols.numel(), part.shape[1]), torch.int8)
            return torch.index_select(part, 0, cols, out=got).t()
        part = self.store[rows, pos]                                  # (n, K), rows 3K apart
        got = scratch(name, (part.shape[0], cols.numel()), torch.int8)
        # gather, not index_select: along dim 1 of a strided matrix index_select copied the
        # whole slice first (measured: 1,024 rows of 128,256, 1,100 columns: 62 vs 6 ms)
        return torch.gather(part, 1, cols.expand(part.shape[0], -1), out=got)

    def span(self, span: slice, rows: slice) -> torch.Tensor:
        """The slices at the store's positions ``span`` of the rows ``rows``, side by side
        along K: (n, count K), a view."""
        count = span.stop - span.start
        if self.by_cols:
            part = self.store[span]                                   # (count, K, R)
            return part.reshape(count * part.shape[1], part.shape[2])[:, rows].t()
        part = self.store[rows, span]                                 # (n, count, K)
        return part.reshape(part.shape[0], count * part.shape[2])

    def col_sums(self) -> list[torch.Tensor]:
        """Each slice's exact int64 column sums (K,), slice order, from one pass - made
        once per object: kept slices (the head weight's, held across a step's windows)
        are summed by their first check only. The slices are never written after
        ``make``, so the sums stay theirs."""
        if self._col_sums is None:
            self._col_sums = self._sums()
        return self._col_sums

    def _sums(self) -> list[torch.Tensor]:
        s, k = len(self.planes), self.planes[0].shape[1]
        flat = self.store.view(s * k, -1).t() if self.by_cols else self.store.view(-1, s * k)
        sums = col_sums(flat)                                         # (S K,) by position
        n = len(self.planes)
        return [sums[self._pos(i, n) * k:(self._pos(i, n) + 1) * k] for i in range(n)]

    def mv(self, vs: list[torch.Tensor]) -> torch.Tensor:
        """``sum_i slice_i @ vs[i]`` exactly (``checksum._mv``'s dtype rules): one product of
        the store with the vectors placed at their slices' positions."""
        n = len(self.planes)
        v = torch.cat([vs[self._pos(p, n)] for p in range(n)])  # position p holds slice pos(p)
        s, k = n, self.planes[0].shape[1]
        flat = self.store.view(s * k, -1).t() if self.by_cols else self.store.view(-1, s * k)
        return _mv(flat, v)


def level_copy(s, which: list[int], rows: slice, k0: int, k1: int, name: str) -> torch.Tensor:
    """The slices ``s[i - 1][rows, k0:k1]`` (i in ``which``, ``s`` a ``LevelSlices``) side by
    side along K, (n, K_level) - contiguous,
    or for transposed slices (of a transposed view) the transposed view of a contiguous
    (K_level, n): either way a copy of contiguous rows, and the int8 GEMM takes both
    layouts. Written into the scratch buffer ``name`` (a fresh operand of up to 100 MB cost
    5x the copy in page faults)."""
    parts = [s[i - 1][rows, k0:k1] for i in which]
    n, width = parts[0].shape[0], sum(p.shape[1] for p in parts)
    if s[0].stride(-1) == 1:
        return torch.cat(parts, 1, out=scratch(name, (n, width), torch.int8))
    return torch.cat([p.t() for p in parts], 0,
                     out=scratch(name, (width, n), torch.int8)).t()
