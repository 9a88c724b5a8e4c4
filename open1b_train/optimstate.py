"""The optimizer's state between steps: the Adam moments and the two counters.

Its own module so that ``run.py`` (which opens, resumes and checkpoints it) and
``step.py`` (which updates it) both import it, and neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class OptimState:
    """Adam moments (flat float32, model order: tensors, or ``memory.diskflat.DiskFlat`` files under
    the lean memory plan), the update counter and the skip counter."""

    m: Any
    v: Any
    adam_step: int = 0
    skip_left: int = 0


