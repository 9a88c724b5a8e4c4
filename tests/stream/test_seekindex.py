"""seekindex.py: built once, stored beside the mix, verified; planning with it == without."""
import os
import shutil

import numpy as np
import pytest

from open1b_data.stream import seekindex
from open1b_data.errors import StateMismatchError, StreamError
from open1b_data.stream.plan import StreamPlan
from tests.stream.test_plan import small_mix
from tests.stream.test_state import FIELDS


@pytest.fixture()
def mix(tmp_path):
    return small_mix(tmp_path / "mix")


def test_index_equals_replay(mix):
    cold = StreamPlan.open(mix, use_index=False)
    full = cold.segments_range(0, 1000)
    idx = seekindex.ensure(StreamPlan.open(mix, use_index=False), windows=1000, every=64)
    assert os.path.exists(os.path.join(mix, "stream", "seek-42-64.json"))
    assert os.path.exists(os.path.join(mix, "stream", "seek-42-64.npz"))
    assert len(idx.draw) == 16
    warm = StreamPlan.open(mix)
    assert warm.index is not None and warm.index.every == 64
    for m in (999, 64, 63, 640, 5):
        got = warm.segments_range(m, m + 1)
        want = full.select(full.window == m)
        assert all(np.array_equal(getattr(got, f), getattr(want, f)) for f in FIELDS)
        assert warm.state_at(m) == cold.state_at(m)
    assert warm.draw_info(1500) == cold.draw_info(1500)
    assert warm.draw_of(2, 9) == cold.draw_of(2, 9)
    # past the covered range the plan continues from the last entry
    assert StreamPlan.open(mix).segments(1500) == cold.segments(1500)


def test_stale_or_tampered_index_is_refused(mix, tmp_path):
    plan = StreamPlan.open(mix, use_index=False)
    seekindex.ensure(plan, windows=300, every=64)
    other = small_mix(tmp_path / "other", seed=43)
    p43 = StreamPlan.open(other, use_index=False)
    with pytest.raises(StateMismatchError):
        p43.attach_index(seekindex.load(plan, mix, 64))
    # an index file presented under another seed's name is refused by its header
    st = os.path.join(mix, "stream")
    shutil.copy(os.path.join(st, "seek-42-64.json"), os.path.join(st, "seek-43-64.json"))
    with pytest.raises(StateMismatchError, match="seed"):
        seekindex.load(StreamPlan.open(mix, seed=43, use_index=False), mix, 64)
    npz = os.path.join(mix, "stream", "seek-42-64.npz")
    with open(npz, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(StreamError, match="sha256"):
        seekindex.load(plan, mix, 64)
    assert seekindex.find(StreamPlan.open(mix, use_index=False)) is None  # skipped, warned


def test_default_sizes():
    assert seekindex.default_every(97_700_000) == 1024
    assert seekindex.default_every(500) == 64
    d = {"schedule": {"stop_tokens": 4096 * 10, "seq_tokens": 4096,
                      "phases": [{"batch_sequences": 4}, {"batch_sequences": 8}]}}
    assert seekindex.default_windows(d) == 18


def test_open_can_build_the_index(mix):
    plan = StreamPlan.open(mix, build_index=True)
    assert plan.index is not None and plan.index.windows == seekindex.default_windows(
        plan.view.definition)
    assert os.path.exists(os.path.join(mix, "stream", f"seek-42-{plan.index.every}.json"))
    assert StreamPlan.open(mix).index.every == plan.index.every
