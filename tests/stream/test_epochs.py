"""The stream past epoch rollovers: a small mix in which every source rolls over at least
three times, checked against the independent naive reference of test_plan.py.

The goldens and test_plan.py's reference comparison cover mostly epoch 0; an error that
only shows from epoch 1 on (an order keyed without the epoch, a consumed count carried
wrongly into the next epoch) passes them. Here the mix is so small (3 shards per source,
uneven shard sizes) that 90 windows hold 5-6 epochs of every source, and the test first
asserts that the epochs really are differently ordered, so a plan that ignored the epoch
could not agree with the reference by luck.
"""
import numpy as np
import pytest

from testkit.synthetic import SyntheticSource
from open1b_data.stream import seekindex
from open1b_data.stream.plan import StreamPlan
from tests.stream.test_plan import WINDOW, flatten, reference_tokens, small_mix

# documents, mean tokens, docs per shard: 3 shards each, the last one shorter
SOURCES = [SyntheticSource("web", 22, 40, 0.8, 8),
           SyntheticSource("code", 13, 60, 1.0, 5),
           SyntheticSource("math", 9, 90, 0.6, 4)]
WINDOWS = 90
EPOCHS = 4  # complete epochs every source must show (3+ rollovers)


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return small_mix(tmp_path_factory.mktemp("epochs"), sources=SOURCES)


@pytest.fixture(scope="module")
def segs(mix):
    return StreamPlan.open(mix, use_index=False).segments_range(0, WINDOWS)


def epoch_orders(segs, s: int) -> list[list[tuple[int, int]]]:
    """[(shard, doc) in draw order] of each complete epoch of source ``s``."""
    first = (segs.doc_start == 0) & (segs.source == s)
    epochs = segs.epoch[first]
    pairs = list(zip(segs.shard[first].tolist(), segs.doc[first].tolist()))
    last = int(epochs.max())  # the last epoch may be cut off by the end of the range
    return [[p for p, e in zip(pairs, epochs) if e == k] for k in range(last)]


def test_every_source_rolls_over_into_differently_ordered_epochs(mix, segs):
    plan = StreamPlan.open(mix, use_index=False)
    for s, sv in enumerate(plan.view.sources):
        orders = epoch_orders(segs, s)
        assert len(orders) >= EPOCHS, f"{sv.name}: only {len(orders)} complete epochs"
        for k, order in enumerate(orders):  # each epoch is one permutation of the source
            assert sorted(order) == sorted({p for p in order}) and len(order) == sv.documents, (
                sv.name, k)
        shard_orders = [list(dict.fromkeys(h for h, _ in order)) for order in orders]
        assert len({tuple(o) for o in shard_orders}) > 1, f"{sv.name}: one shard order"
        for h in range(sv.shards):  # within each shard of 4+ documents, epochs differ
            if sv.shard_documents[h] < 4:
                continue
            doc_orders = [tuple(d for g, d in order if g == h) for order in orders]
            assert all(a != b for a, b in zip(doc_orders, doc_orders[1:])), (sv.name, h)


def test_plan_past_rollovers_equals_the_reference(mix, segs):
    assert flatten(segs, 0, WINDOWS) == reference_tokens(mix, WINDOWS * WINDOW)


def test_other_seed_past_rollovers_equals_the_reference(mix):
    segs = StreamPlan.open(mix, seed=2**64 - 5, use_index=False).segments_range(0, WINDOWS)
    assert int(segs.epoch.max()) >= EPOCHS
    assert flatten(segs, 0, WINDOWS) == reference_tokens(mix, WINDOWS * WINDOW, seed=2**64 - 5)


def test_random_access_and_reverse_lookups_in_later_epochs(mix, segs):
    for m in (WINDOWS - 1, 61, 40, 17):
        fresh = StreamPlan.open(mix, use_index=False)
        assert fresh.segments(m) == segs.select(segs.window == m).to_list(fresh.sources)
    plan = StreamPlan.open(mix, use_index=False)
    late = np.flatnonzero((segs.epoch >= 2) & (segs.doc_start == 0))
    for k in late[:: max(1, len(late) // 12)]:
        s, i = int(segs.source[k]), int(segs.draw[k])
        info = plan.draw_info(i)
        assert (info.shard, info.doc, info.epoch) == (
            int(segs.shard[k]), int(segs.doc[k]), int(segs.epoch[k]))
        ordinal = plan.ordinal_of(s, info.shard, info.doc, info.epoch)
        assert ordinal == info.ordinal and ordinal // plan.view.sources[s].documents == info.epoch
        assert plan.draw_of(s, ordinal) == i


def test_seek_index_resumes_inside_later_epochs(mix, segs):
    cold = StreamPlan.open(mix, use_index=False)
    seekindex.ensure(cold, windows=WINDOWS, every=8)
    warm = StreamPlan.open(mix)
    assert warm.index is not None and warm.index.every == 8
    for m in (WINDOWS - 1, 75, 48, 33):
        assert int(segs.epoch[segs.window == m].max()) >= 1
        assert warm.segments(m) == segs.select(segs.window == m).to_list(warm.sources)
        assert warm.state_at(m) == cold.state_at(m)
