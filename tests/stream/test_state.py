"""state.py + StreamPlan.state_at/from_state: resume anywhere == uninterrupted (property 2),
and a changed mix or seed is refused (property 5)."""
import json
import os

import numpy as np
import pytest

from open1b_data.errors import StateMismatchError, StreamError
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.state import StreamState
from tests.stream.test_plan import SOURCES, small_mix

FIELDS = ("window", "draw", "source", "shard", "doc", "epoch", "doc_start", "length",
          "window_offset", "doc_length")


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return small_mix(tmp_path_factory.mktemp("mix"))


def same(a, b):
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in FIELDS)


def interesting_windows(plan, n):
    """Windows that start inside a document, at a document boundary, and right at an epoch
    rollover of the smallest source."""
    segs = plan.segments_range(0, n)
    first = segs.window_offset == 0
    inside = segs.window[first & (segs.doc_start > 0)][:3].tolist()
    boundary = segs.window[first & (segs.doc_start == 0)][:2].tolist()
    small = len(SOURCES) - 1
    e = segs.epoch[segs.source == small]
    w = segs.window[segs.source == small]
    roll = w[np.flatnonzero(np.diff(e)) + 1][:2].tolist()
    return sorted(set(inside + boundary + roll + [n - 1]))


def test_resume_anywhere_is_identical(mix):
    n = 900
    full = StreamPlan.open(mix, use_index=False).segments_range(0, n)
    plan = StreamPlan.open(mix, use_index=False)
    rs = np.random.default_rng(0)
    windows = interesting_windows(plan, n) + rs.integers(0, n, 5).tolist()
    for m in windows:
        text = plan.state_at(m).to_json()
        fresh = StreamPlan.open(mix, use_index=False)
        assert fresh.from_state(StreamState.from_json(text)) == m
        got = fresh.segments_range(m, n)
        assert same(got, full.select(full.window >= m)), m
        assert fresh.state_at(n - 1) == plan.state_at(n - 1)


def test_state_record_contents(mix):
    plan = StreamPlan.open(mix, use_index=False)
    segs = plan.segments_range(0, 400)
    for m in (0, 1, 399):
        st = plan.state_at(m)
        d = json.loads(st.to_json())
        assert d["format"] == "open1b-stream-state" and d["version"] == 1
        assert d["mix"]["fingerprint"] == plan.fingerprint and d["window"] == m
        before = segs.select(segs.window < m)
        drawn = np.unique(before.draw)
        first = segs.select(segs.window == m)
        if m and first.doc_start[0] > 0:
            b = d["buffer"]
            assert b["offset"] == first.doc_start[0] and b["doc"] == first.doc[0]
            assert d["mix_rng"]["next_draw"] == int(first.draw[0]) + 1
        else:
            assert d["buffer"] is None
            assert d["mix_rng"]["next_draw"] == (int(drawn.max()) + 1 if m else 0)
        assert len(st.to_json()) < 1024


def test_changed_mix_is_refused(mix, tmp_path):
    st = StreamPlan.open(mix, use_index=False).state_at(50)
    other = small_mix(tmp_path / "other")       # identical content: same fingerprint
    assert StreamPlan.open(other, use_index=False).from_state(st) == 50
    # one document length changed -> lengths sha256 -> fingerprint changes -> refused
    changed = [SOURCES[0], SOURCES[1],
               type(SOURCES[2])(**{**SOURCES[2].__dict__, "mean_tokens": 2001})]
    moved = small_mix(tmp_path / "changed", sources=changed)
    p2 = StreamPlan.open(moved, use_index=False)
    assert p2.fingerprint != st.fingerprint
    with pytest.raises(StateMismatchError, match="fingerprint"):
        p2.from_state(st)
    with pytest.raises(StateMismatchError, match="seed"):
        StreamPlan.open(mix, seed=1, use_index=False).from_state(st)


def test_lengths_file_edit_is_detected(tmp_path):
    from open1b_data.errors import ManifestError

    url = small_mix(tmp_path / "m")
    f = os.path.join(url, "math", "shard-00000-00000.lengths.npy")
    arr = np.load(f, allow_pickle=False)
    np.save(f, arr)                         # the same lengths, written again: accepted
    StreamPlan.open(url, use_index=False).segments_range(0, 200)
    arr[0] += 1
    np.save(f, arr)
    with pytest.raises(ManifestError, match="its document lengths have digest"):
        StreamPlan.open(url, use_index=False).segments_range(0, 200)


def test_corrupt_states_are_refused(mix):
    plan = StreamPlan.open(mix, use_index=False)
    m = next(w for w in range(1, 100) if plan.state_at(w).buffer is not None)
    d = json.loads(plan.state_at(m).to_json())
    bad = json.loads(json.dumps(d))
    bad["buffer"]["doc"] += 1
    with pytest.raises(StateMismatchError, match="buffer"):
        plan.from_state(StreamState.from_dict(bad))
    # counts moved between the two sources that are not in the buffer (same total, same
    # buffer document): only the count check can notice
    late = next(w for w in range(200, 400) if (st := plan.state_at(w)).buffer is not None
                and min(st.consumed) > 0)
    bad = json.loads(plan.state_at(late).to_json())
    names = [x["name"] for x in bad["sources"]]
    i, j = [k for k in range(3) if names[k] != bad["buffer"]["source"]]
    for k, delta in ((i, 1), (j, -1)):
        c = bad["sources"][k]["consumed"] + delta
        dd = bad["sources"][k]["documents"]
        bad["sources"][k].update(consumed=c, epoch=c // dd, position=c % dd)
    with pytest.raises(StateMismatchError, match="counts"):
        StreamPlan.open(mix, use_index=False).from_state(StreamState.from_dict(bad))
    bad = json.loads(json.dumps(d))
    bad["version"] = 2
    with pytest.raises(StreamError, match="version"):
        StreamState.from_dict(bad)
    bad = json.loads(json.dumps(d))
    bad["mix_rng"]["next_draw"] += 1
    with pytest.raises(StreamError, match="corrupt"):
        StreamState.from_dict(bad)
    bad = json.loads(json.dumps(d))
    bad["sources"][0]["epoch"] += 1
    with pytest.raises(StreamError, match="disagree"):
        StreamState.from_dict(bad)
    with pytest.raises(StreamError, match="JSON"):
        StreamState.from_json("{not json")
