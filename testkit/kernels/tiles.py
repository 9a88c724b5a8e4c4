"""Which tiles of int8 slices hold a nonzero, counted from the slices themselves: the LM
head's tile-map tests' reference and the tile-count benchmark's measure
(``benchmarks.kernels.lmhead_tiles``)."""
from __future__ import annotations

import torch


def tile_hits(s: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """bool (S, ceil(R / rows), ceil(K / cols)) for slices ``s`` (S, R, K): True where a
    ``rows`` x ``cols`` tile of a slice has a nonzero (tiles past the edge padded with 0)."""
    sl, r, k = s.shape
    rb, kb = -(-r // rows), -(-k // cols)
    hit = torch.zeros(sl, rb * rows, kb * cols, dtype=torch.bool)
    hit[:, :r, :k] = s != 0
    return hit.view(sl, rb, rows, kb, cols).any(4).any(2)
