"""Property 1: for R in {1, 2, 3, 4, 6, 8} the union of all ranks' windows over a range of
steps is the same window sequence with the same bytes - through the training loader and
through ``stream-at``; a world size that does not divide the batch fails clearly."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from open1b_data.cli.stream import stream_at
from open1b_data.errors import StreamError
from open1b_data.stream.loader import StreamLoader
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.windows import WindowReader, window_sha256
from testkit.s2mix import STEPS, WINDOWS, token_mix

WORLDS = [1, 2, 3, 4, 6, 8]


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return token_mix(str(tmp_path_factory.mktemp("topo")))


@pytest.fixture(scope="module")
def reference(mix):
    return WindowReader(StreamPlan.open(mix)).windows(0, WINDOWS)


@pytest.mark.parametrize("world", WORLDS)
def test_loader_union_is_the_stream(mix, reference, world):
    got = np.zeros((WINDOWS, reference.shape[1]), dtype=np.int64)
    seen = np.zeros(WINDOWS, dtype=np.int64)
    plan = StreamPlan.open(mix)       # one plan shared by the ranks, like one process each
    for rank in range(world):
        for item in StreamLoader(plan, rank=rank, world=world, end_step=STEPS):
            w = np.array(item["windows"])
            assert (w % world == rank).all()
            ids = item["input_ids"].numpy()
            assert item["input_ids"].dtype.is_floating_point is False
            got[w, :-1] = ids
            got[w, -1] = item["labels"].numpy()[:, -1]
            seen[w] += 1
    assert (seen == 1).all()
    assert np.array_equal(got, reference.astype(np.int64))


def test_stream_at_union_is_the_stream(mix, reference):
    runner = CliRunner()
    for step in (1, 4):
        hashes = {}
        for world in WORLDS:
            res = runner.invoke(stream_at, [mix, "--step", str(step), "--world", str(world),
                                            "--json"])
            assert res.exit_code == 0, res.output
            rep = json.loads(res.output)
            a, b = rep["window_range"]
            by_window = {w["window"]: w for w in rep["windows"]}
            assert sorted(by_window) == list(range(a, b))
            for m, w in by_window.items():
                assert w["rank"] == m % world
                assert w["sha256"] == window_sha256(reference[m])
                assert w["tokens"] == reference[m].tolist()
            hashes[world] = [by_window[m]["sha256"] for m in range(a, b)]
        assert all(h == hashes[1] for h in hashes.values())


@pytest.mark.parametrize("world", [5, 16])
def test_non_divisor_fails_clearly(mix, world):
    with pytest.raises(StreamError, match=f"world size {world} does not fit step 1"):
        StreamLoader(mix, rank=0, world=world)
    res = CliRunner().invoke(stream_at, [mix, "--step", "1", "--world", str(world)])
    assert res.exit_code != 0
    assert f"world size {world} does not fit step 1" in res.output


def test_a_mesh_range_is_a_slice_of_the_steps_mesh_order(mix):
    from open1b_data.explore.inspect import stream_at as lib_stream_at

    whole = lib_stream_at(mix, step=2, world=2)["windows"]
    n = len(whole)
    parts = [lib_stream_at(mix, step=2, world=2, mesh_range=(a, min(n, a + 3)))["windows"]
             for a in range(0, n, 3)]
    assert [w for p in parts for w in p] == whole
    for bad in ((0, n + 1), (2, 2)):
        with pytest.raises(StreamError, match="mesh_range"):
            lib_stream_at(mix, step=2, world=2, mesh_range=bad)
