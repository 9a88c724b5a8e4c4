"""The training tests' micro run (8 steps on a small real-text mix, checkpoints every 2)
as the trained model of the evaluation tests, and its loaded form."""
from __future__ import annotations

import pytest

from tests.train.conftest import _one_thread  # noqa: F401  (mix4 and ref_run: tests/conftest.py)


@pytest.fixture(scope="session")
def trained(ref_run):
    from open1b_eval.trained import load

    return load(ref_run)
