"""Batch statistics (explore/stats.py) on hand-built token arrays and segments with known
answers, the repeat search against a brute force (also with a hash that collides on every
n-gram, so only the token-by-token check decides), and ties to the earliest position."""
import json

import numpy as np
import pytest

from open1b_data.explore import stats
from open1b_data.stream.segments import Segments


def arr(rows):
    return np.array(rows, dtype=np.uint32)


def test_distinct_and_unique_ratio():
    tok = arr([[1, 1, 2, 3], [5, 5, 5, 5]])
    assert stats.distinct_per_window(tok).tolist() == [3, 1]
    assert stats.distinct_per_window(arr([[7]])).tolist() == [1]


def test_longest_run_stays_inside_a_window():
    r = stats.longest_run(arr([[1, 2, 2, 2, 3], [4, 4, 4, 4, 9]]), np.array([7, 8]))
    assert r == stats.Run(4, 4, 8, 0)
    # 3,3,3 | 3,3 would be a run of 5 if windows were one sequence; they are not
    r = stats.longest_run(arr([[1, 2, 3, 3, 3], [3, 3, 5, 6, 7]]), np.array([0, 1]))
    assert r == stats.Run(3, 3, 0, 2)
    # ties: the earliest window, then the earliest offset
    r = stats.longest_run(arr([[1, 2, 9, 9], [6, 6, 1, 1]]), np.array([3, 4]))
    assert r == stats.Run(2, 9, 3, 2)
    assert stats.longest_run(arr([[1, 2, 3]]), np.array([0])) == stats.Run(1, 1, 0, 0)


@pytest.mark.parametrize("row,length,offsets", [
    ([1, 2, 3, 9, 1, 2, 3, 8], 3, (0, 4)),
    ([5, 5, 5, 5, 5], 4, (0, 1)),              # overlapping occurrences of a run
    ([1, 2, 1, 2, 1, 2], 4, (0, 2)),           # period 2
    ([4, 0, 0, 7, 1, 2, 3, 1, 2, 3], 3, (4, 7)),
    ([1, 2, 3, 4], 0, None),
])
def test_longest_repeat_known(row, length, offsets):
    r = stats.longest_repeat(arr([row]), np.array([11]))
    assert (r.length, r.offsets) == (length, offsets)
    assert r.window == (11 if length else None)


def test_repeat_never_spans_two_windows():
    r = stats.longest_repeat(arr([[1, 2, 3, 4], [1, 2, 3, 4]]), np.array([0, 1]))
    assert r == stats.Repeat(0, None, None)
    r = stats.longest_repeat(arr([[1, 2, 3, 4, 1], [9, 8, 9, 8, 7]]), np.array([5, 6]))
    assert r == stats.Repeat(2, 6, (0, 2))     # window 5 repeats only "1"


def brute(tok: np.ndarray) -> tuple[int, int | None, tuple[int, int] | None]:
    best = (0, None, None)
    for w, row in enumerate(tok.tolist()):
        n = len(row)
        for L in range(n - 1, best[0], -1):
            pairs = [(i, j) for i in range(n - L + 1) for j in range(i + 1, n - L + 1)
                     if row[i:i + L] == row[j:j + L]]
            if pairs:
                best = (L, w, min(pairs))
                break
    return best


def random_cases(n_cases):
    rng = np.random.default_rng(5)
    for _ in range(n_cases):
        w, n = int(rng.integers(1, 4)), int(rng.integers(2, 30))
        yield rng.integers(0, int(rng.integers(2, 6)), size=(w, n)).astype(np.uint32)


@pytest.mark.parametrize("probe", [1, 3, 16])
def test_longest_repeat_equals_brute_force(monkeypatch, probe):
    monkeypatch.setattr(stats, "FIRST_PROBE", probe)     # doubling and bisecting paths
    for tok in random_cases(150):
        r = stats.longest_repeat(tok, np.arange(tok.shape[0]))
        assert (r.length, r.window, r.offsets) == brute(tok), tok


def test_hash_collisions_never_change_the_answer(monkeypatch):
    # every n-gram gets the same key: only the token-by-token check can tell them apart
    monkeypatch.setattr(stats, "_gram_keys", lambda t, length: np.zeros(
        (t.shape[0], t.shape[1] - length + 1), dtype=np.uint64))
    for tok in random_cases(60):
        r = stats.longest_repeat(tok, np.arange(tok.shape[0]))
        assert (r.length, r.window, r.offsets) == brute(tok), tok


def segs(**cols) -> Segments:
    return Segments(**{k: np.array(v, dtype=np.int64) for k, v in cols.items()})


# Two windows of 6 tokens: draw 0 (source 0, doc 3, 3 tokens + separator), draw 1 (source
# 1, doc 5, 4 tokens + separator) spanning both windows, draw 2 = source 0's doc 3 again
# in its next epoch (its separator falls in the next window).
SEGS = segs(window=[0, 0, 1, 1], draw=[0, 1, 1, 2], source=[0, 1, 1, 0], shard=[0, 0, 0, 0],
            doc=[3, 5, 5, 3], epoch=[0, 0, 0, 1], doc_start=[0, 0, 2, 0],
            length=[4, 2, 3, 3], window_offset=[0, 4, 0, 3], doc_length=[3, 4, 4, 3])
TOKENS = arr([[10, 11, 12, 0, 20, 21], [22, 23, 0, 10, 11, 12]])


def test_segment_statistics():
    names = ("web", "code")
    assert stats.separators_of(SEGS).tolist() == [1, 0, 1, 0]
    assert stats.source_counts(SEGS, names) == (
        stats.SourceCount("web", 6, 0.6, 2), stats.SourceCount("code", 4, 0.4, 1))
    assert stats.redrawn(SEGS, names) == (stats.Redrawn("web", 0, 3, (0, 2), (0, 1)),)
    assert stats.spanning(SEGS) == (1, 2)
    one = SEGS.select(SEGS.window == 0)       # within one window nothing spans or repeats
    assert stats.spanning(one) == (0, 1) and stats.redrawn(one, names) == ()


def test_batch_stats_together():
    paths = (("web/shard-00000-00000.parquet",), ("code/shard-00000-00000.parquet",))
    b = stats.batch_stats([40, 41], TOKENS, SEGS, ("web", "code"), paths)
    assert b.tokens == 12 and b.window_distinct == (6, 6)
    assert b.distinct == 8 and b.unique_ratio == pytest.approx(8 / 12)
    assert b.separators == 2 and b.spanning_draws == 1 and b.longest_span == 2
    assert b.longest_run == stats.Run(1, 10, 40, 0)
    assert b.longest_repeat == stats.Repeat(0, None, None)   # 10 11 12 repeats across windows
    d = json.loads(json.dumps(b.to_dict()))
    assert d["windows"] == [{"window": 40, "distinct": 6, "unique_ratio": 1.0},
                            {"window": 41, "distinct": 6, "unique_ratio": 1.0}]
    assert d["redrawn"] == [{"source": "web", "shard": 0,
                             "shard_path": "web/shard-00000-00000.parquet", "doc": 3,
                             "draws": [0, 2], "epochs": [0, 1]}]
    with pytest.raises(ValueError, match="one row per window"):
        stats.batch_stats([1], TOKENS, SEGS, ("web", "code"))
