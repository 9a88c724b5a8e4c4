"""The training tests run tiny steps, which spend their time in per-op overhead: pin torch
to one thread (the shared mixes and reference run are in ``testkit/runs.py``)."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
