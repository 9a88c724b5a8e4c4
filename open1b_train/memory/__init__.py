"""Where a step's state lives, never what it computes: the memory plans (``memplan.py``),
the Adam moments kept in files on disk under the lean plan (``diskflat.py``) and the C
library's reuse of large freed buffers (``allocator.py``). Every plan gives the same bits.
"""
