"""The loader through DataLoader worker processes and torchdata's StatefulDataLoader, and
several ranks of a logical mesh from one loader: the same micro-batches, in the same order,
as the plain loader; states that resume exactly the remainder."""
import json
import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from open1b_data.errors import StreamError
from open1b_data.stream.loader import StreamLoader
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.schedule import Schedule
from testkit.s2mix import STEPS, token_mix


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return token_mix(str(tmp_path_factory.mktemp("workers")))


def run(items, n=None):
    out = []
    for item in items:
        out.append(item)
        if n is not None and len(out) == n:
            break
    return out


def same(a, b):
    assert [x["windows"] for x in a] == [y["windows"] for y in b]
    assert ([(x["step"], x["rank"], x["micro_batch"]) for x in a] ==
           [(y["step"], y["rank"], y["micro_batch"]) for y in b])
    for x, y in zip(a, b):
        assert torch.equal(x["input_ids"], y["input_ids"])
        assert torch.equal(x["labels"], y["labels"])


@pytest.fixture(scope="module")
def direct(mix):
    return run(StreamLoader(mix, rank=1, world=2, end_step=STEPS))


@pytest.mark.parametrize("workers,extra", [
    (0, {}), (1, {}), (2, {}), (3, {}),
    (2, {"prefetch_factor": 1}), (3, {"prefetch_factor": 5, "persistent_workers": True})])
def test_workers_yield_the_plain_sequence(mix, direct, workers, extra):
    dl = DataLoader(StreamLoader(mix, rank=1, world=2, end_step=STEPS), batch_size=None,
                    num_workers=workers, **extra)
    assert len(direct) == 84                 # 3 steps x 12 + 2 steps x 24 micro-batches
    same(run(dl), direct)


def test_persistent_workers_second_epoch_is_empty(mix):
    # the loader covers the run once: a second pass over a finished loader yields nothing,
    # with or without (persistent) workers
    dl = DataLoader(StreamLoader(mix, rank=0, world=2, end_step=2), batch_size=None,
                    num_workers=2, persistent_workers=True)
    assert len(run(dl)) == 24
    assert run(dl) == []


@pytest.mark.parametrize("cut", [1, 24, 37])   # a worker not yet started; boundary; mid-step
def test_stateful_dataloader_with_workers_resumes_exactly(mix, direct, cut):
    from torchdata.stateful_dataloader import StatefulDataLoader

    dl = StatefulDataLoader(StreamLoader(mix, rank=1, world=2, end_step=STEPS),
                            batch_size=None, num_workers=2)
    head = []
    for item in dl:
        head.append(item)
        if len(head) == cut:
            state = dl.state_dict()
            break
    del dl
    state = json.loads(json.dumps(state))                  # what a checkpoint keeps
    fresh = StatefulDataLoader(StreamLoader(mix, rank=1, world=2, end_step=STEPS),
                               batch_size=None, num_workers=2)
    fresh.load_state_dict(state)
    same(head + run(fresh), direct)


def test_stateful_dataloader_without_workers_resumes_exactly(mix, direct):
    from torchdata.stateful_dataloader import StatefulDataLoader

    dl = StatefulDataLoader(StreamLoader(mix, rank=1, world=2, end_step=STEPS),
                            batch_size=None)
    head = run(dl, 30)
    state = json.loads(json.dumps(dl.state_dict()))
    fresh = StatefulDataLoader(StreamLoader(mix, rank=1, world=2, end_step=STEPS),
                               batch_size=None)
    fresh.load_state_dict(state)
    same(head + run(fresh), direct)


def test_worker_state_loads_only_into_its_worker(mix):
    from torchdata.stateful_dataloader import StatefulDataLoader

    dl = StatefulDataLoader(StreamLoader(mix, rank=1, world=2, end_step=STEPS),
                            batch_size=None, num_workers=2)
    run(dl, 3)
    snap = dl.state_dict()["_snapshot"]["_worker_snapshots"]
    worker_state = next(iter(snap.values()))["dataset_state"]
    assert worker_state["worker"] == {"id": 0, "workers": 2}
    with pytest.raises(StreamError, match="worker 0 of 2's share"):
        StreamLoader(mix, rank=1, world=2).load_state_dict(worker_state)


def test_pickled_loader_continues_where_it_stood(mix, direct):
    ld = StreamLoader(mix, rank=1, world=2, end_step=STEPS)
    head = run(ld, 17)
    copy = pickle.loads(pickle.dumps(ld))         # what a spawned worker receives
    same(head + run(copy), direct)


# ------------------------------------------------------------------ several ranks


def mesh_order(per_rank):
    """Items of single-rank loaders merged in mesh order: by step, then rank, then j."""
    return sorted((x for items in per_rank for x in items),
                  key=lambda x: (x["step"], x["rank"], x["micro_batch"]))


@pytest.mark.parametrize("world", [2, 4])
def test_mesh_is_the_union_of_single_rank_loaders_in_mesh_order(mix, world):
    single = [run(StreamLoader(mix, rank=r, world=world, end_step=STEPS))
              for r in range(world)]
    mesh = run(StreamLoader(mix, world=world, ranks=range(world), end_step=STEPS))
    same(mesh, mesh_order(single))
    sched = Schedule.from_definition(StreamPlan.open(mix).view.definition)
    assert all(x["windows"] == list(sched.rank_plan(x["step"], world, x["rank"])
                                    .micro_batches[x["micro_batch"]]) for x in mesh)
    part = run(StreamLoader(mix, world=world, ranks=range(1, world), end_step=STEPS))
    same(part, mesh_order(single[1:]))


def test_mesh_with_workers(mix):
    ref = run(StreamLoader(mix, world=4, ranks=range(4), end_step=3))
    dl = DataLoader(StreamLoader(mix, world=4, ranks=range(4), end_step=3),
                    batch_size=None, num_workers=3)
    same(run(dl), ref)


def test_mesh_step_boundary_state_resumes_on_another_world(mix):
    ref4 = [run(StreamLoader(mix, rank=r, world=4, end_step=STEPS)) for r in range(4)]
    saver = StreamLoader(mix, world=2, ranks=range(2), end_step=STEPS)
    run(saver, 2 * 12)                          # all of step 1 on both ranks
    state = json.loads(json.dumps(saver.state_dict()))
    assert (state["step"], state["item"], state["ranks"]) == (2, 0, [0, 2])
    resumed = StreamLoader(mix, world=4, ranks=range(4), end_step=STEPS)
    resumed.load_state_dict(state)
    same(run(resumed), [x for x in mesh_order(ref4) if x["step"] >= 2])
    half = StreamLoader(mix, world=4, ranks=range(2, 4), end_step=STEPS)
    half.load_state_dict(state)
    same(run(half), [x for x in mesh_order(ref4[2:]) if x["step"] >= 2])


def test_mesh_mid_step_state_needs_the_same_ranks(mix):
    ld = StreamLoader(mix, world=4, ranks=range(4), end_step=STEPS)
    run(ld, 7)
    state = ld.state_dict()
    assert (state["step"], state["item"]) == (1, 7)
    again = StreamLoader(mix, world=4, ranks=range(4), end_step=STEPS)
    again.load_state_dict(state)
    assert [x["windows"] for x in run(again, 2)] == [[9, 13], [17, 21]]   # rank 1, j = 1, 2
    with pytest.raises(StreamError, match="middle of step 1"):
        StreamLoader(mix, world=4, ranks=range(2)).load_state_dict(state)


@pytest.mark.parametrize("kwargs,match", [
    ({"rank": 0, "ranks": range(2)}, "exactly one of"),
    ({"ranks": [0, 2]}, "contiguous"),
    ({"ranks": range(2, 6)}, "rank must be"),
    ({"ranks": []}, "non-empty")])
def test_bad_ranks_are_refused(mix, kwargs, match):
    with pytest.raises(StreamError, match=match):
        StreamLoader(mix, world=4, **kwargs)
