"""Property 2 through the loader: state_dict / load_state_dict at random micro-batches
(inside documents, across epochs of a small source, at step boundaries, into another world
size) resumes exactly the uninterrupted stream; other mixes and bad states are refused."""
import json
import random

import numpy as np
import pytest
import torch

from open1b_data.errors import StateMismatchError, StreamError
from open1b_data.stream.loader import StreamLoader
from testkit.synthetic import SyntheticSource, write_synthetic_mix
from testkit.s2mix import SCHEDULE, STEPS, token_mix


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return token_mix(str(tmp_path_factory.mktemp("loader")))


def run(loader, n=None):
    out = []
    for item in loader:
        out.append(item)
        if n is not None and len(out) == n:
            break
    return out


def same(a, b):
    assert ([(x["step"], x["micro_batch"], x["windows"]) for x in a] ==
           [(y["step"], y["micro_batch"], y["windows"]) for y in b])
    for x, y in zip(a, b):
        assert torch.equal(x["input_ids"], y["input_ids"])
        assert torch.equal(x["labels"], y["labels"])


def test_micro_batch_shapes_and_labels(mix):
    items = run(StreamLoader(mix, rank=1, world=2, end_step=2))
    assert len(items) == 2 * 12
    x = items[0]
    assert x["input_ids"].shape == x["labels"].shape == (2, 128)
    assert x["input_ids"].dtype == x["labels"].dtype == torch.int64
    assert torch.equal(x["input_ids"][:, 1:], x["labels"][:, :-1])
    assert x["accumulation"] == 12 and x["windows"] == [1, 3]


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1), (3, 2)])
def test_resume_at_random_points_is_identical(mix, world, rank):
    full = run(StreamLoader(mix, rank=rank, world=world, end_step=STEPS))
    rng = random.Random(world)
    last = next(i for i, x in enumerate(full) if x["step"] == STEPS)
    cuts = sorted(set(rng.sample(range(1, len(full)), 5)) | {last + 1})
    epochs_b = set()
    for cut in cuts:
        loader = StreamLoader(mix, rank=rank, world=world, end_step=STEPS)
        head = run(loader, cut)
        state = json.loads(json.dumps(loader.state_dict()))     # JSON-able, as saved
        epochs_b.add(state["stream"]["sources"][1]["epoch"])
        resumed = StreamLoader(mix, rank=rank, world=world, end_step=STEPS)
        resumed.load_state_dict(state)
        assert len(resumed) == len(full) - cut
        same(head + run(resumed), full)
    assert max(epochs_b) >= 1       # saved states beyond the small source's first epoch


def test_step_boundary_state_resumes_on_another_world(mix):
    def union(items):
        return {w: row for x in items for w, row in zip(x["windows"], x["input_ids"])}

    ref = union(x for r in range(2) for x in run(StreamLoader(mix, rank=r, world=2,
                                                                  end_step=STEPS)))
    saver = StreamLoader(mix, rank=0, world=2, end_step=STEPS)
    head = run(saver, 2 * 12)            # all of steps 1 and 2 for this rank
    state = saver.state_dict()
    assert (state["step"], state["item"]) == (3, 0)
    got = {}
    for r in range(2):               # the other rank of the old job finished step 2 too
        got.update(union(run(StreamLoader(mix, rank=r, world=2, end_step=2))))
    for r in range(4):               # resumed on 4 ranks
        ld = StreamLoader(mix, rank=r, world=4, end_step=STEPS)
        ld.load_state_dict(state)
        got.update(union(run(ld)))
    assert sorted(got) == sorted(ref)
    assert all(torch.equal(got[m], ref[m]) for m in ref)
    assert all(torch.equal(row, ref[m]) for m, row in union(head).items())


def test_mid_step_state_refuses_other_topology(mix):
    ld = StreamLoader(mix, rank=0, world=2, end_step=STEPS)
    run(ld, 3)
    state = ld.state_dict()
    assert state["item"] == 3
    with pytest.raises(StreamError, match="middle of step 1"):
        StreamLoader(mix, rank=0, world=4).load_state_dict(state)
    with pytest.raises(StreamError, match="middle of step 1"):
        StreamLoader(mix, rank=1, world=2).load_state_dict(state)


def test_other_mix_and_corrupt_state_refused(mix, tmp_path):
    ld = StreamLoader(mix, rank=0, world=2, end_step=STEPS)
    run(ld, 5)
    state = ld.state_dict()
    other = str(tmp_path / "other")
    write_synthetic_mix(other, [SyntheticSource("a", 300, 60.0, docs_per_shard=100),
                                SyntheticSource("b", 12, 41.0, docs_per_shard=5),
                                SyntheticSource("c", 500, 20.0, docs_per_shard=250)],
                        window=129, token_shards=True, vocab=512, schedule=SCHEDULE)
    with pytest.raises(StateMismatchError):
        StreamLoader(other, rank=0, world=2).load_state_dict(state)
    bad = json.loads(json.dumps(state))
    bad["step"] = 4
    with pytest.raises(StateMismatchError, match="not the step's first window"):
        StreamLoader(mix, rank=0, world=2).load_state_dict(bad)
    with pytest.raises(StreamError, match="not an open1b loader state"):
        StreamLoader(mix).load_state_dict({"format": "x"})


def test_through_torch_dataloader(mix):
    from torch.utils.data import DataLoader

    direct = run(StreamLoader(mix, rank=0, world=2, end_step=2))
    via = list(DataLoader(StreamLoader(mix, rank=0, world=2, end_step=2), batch_size=None))
    assert len(via) == len(direct)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(via, direct))


def test_early_break_stops_prefetch_thread(mix):
    import threading

    before = threading.active_count()
    ld = StreamLoader(mix, rank=0, world=1, end_step=STEPS, prefetch=2)
    it = iter(ld)
    next(it)
    it.close()
    assert threading.active_count() == before
    assert np.isfinite(len(ld))


def test_consumer_gone_with_full_queue_does_not_hang(mix):
    ld = StreamLoader(mix, rank=0, world=2, end_step=1, prefetch=1)
    it = iter(ld)
    next(it)
    import time

    time.sleep(0.3)          # the producer fills the queue and waits to put the end marker
    it.close()               # must return: the producer sees the stop and exits
