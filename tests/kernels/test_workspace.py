"""open1b_kernels.core.workspace: scratch buffers reused by name, the last view per name returned
again for the same shape and dtype, never a stale view after the buffer grew or was
released."""
from __future__ import annotations

import torch

from open1b_kernels.core.workspace import release, scratch, total_bytes


def test_scratch_reuses_memory_and_views_by_name():
    release("test.ws")
    a = scratch("test.ws.a", (4, 5), torch.float32)
    assert a.shape == (4, 5) and a.dtype == torch.float32 and a.is_contiguous()
    assert scratch("test.ws.a", (4, 5), torch.float32) is a          # the cached view
    b = scratch("test.ws.a", (5, 4), torch.float32)                   # same bytes, new view
    assert b.shape == (5, 4) and b.data_ptr() == a.data_ptr()
    c = scratch("test.ws.a", (2, 10), torch.int32)
    assert c.dtype == torch.int32 and c.data_ptr() == a.data_ptr()
    big = scratch("test.ws.a", (100, 100), torch.float64)             # grows: a new buffer
    assert big.shape == (100, 100) and big.numel() * 8 <= total_bytes()
    again = scratch("test.ws.a", (4, 5), torch.float32)
    assert again is not a and again.data_ptr() == big.data_ptr()     # never the stale view
    other = scratch("test.ws.b", (4, 5), torch.float32)
    assert other.data_ptr() != again.data_ptr()                       # one buffer per name
    release("test.ws.a")
    fresh = scratch("test.ws.a", (4, 5), torch.float32)
    assert fresh is not again                                         # released: allocated anew
    release("test.ws")
