"""Held-out lists are not trusted: a self-consistent mix whose manifest lists no held-out
rows (its fingerprint recomputed) would put validation documents into training. Whatever
reads the stream for training, replay or an audit refuses it, naming the shard, row and
doc_id: the trainer's loader, a run trained on it by a dishonest trainer (the check
bypassed) replayed by ``open1b-audit replay``, ``open1b-audit fetch-step`` and
``stream-at``."""
from __future__ import annotations

import re

import pytest
import torch
from click.testing import CliRunner

from open1b_audit.cli import main as audit_cli
from open1b_data.cli import main as data_cli
from open1b_data.errors import HeldOutError
from open1b_data.ingest.verify import verify
from open1b_data.stream.loader import StreamLoader
from open1b_train.train import train
from testkit.heldout import bypassed, emptied
from testkit.runs import micro_cfg
from testkit.trainmix import train_mix

STEPS = 4
NAMED = re.compile(r"shard \S+\.parquet row \d+ \(doc_id '[^']+'\) is held out by the "
                   r"definition's rule")


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> str:
    return train_mix(tmp_path_factory.mktemp("heldout-mix"), steps=40, batch=4,
                     heldout="0.2")


@pytest.fixture(scope="module")
def forged(honest, tmp_path_factory) -> str:
    """The honest mix with every held-out list emptied, re-fingerprinted."""
    mix = emptied(honest, str(tmp_path_factory.mktemp("forged") / "mix"))
    assert any("held-out rows differ" in p for p in verify(mix))    # only verify knew
    return mix


def test_the_training_loader_refuses_the_forged_mix(honest, forged):
    assert next(iter(StreamLoader(honest, rank=0, world=1)))["input_ids"].shape[0] > 0
    with pytest.raises(HeldOutError) as e:
        for _ in StreamLoader(forged, rank=0, world=1):
            pass
    assert NAMED.search(str(e.value)), str(e.value)


def test_training_refuses_it(forged, tmp_path):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.raises(HeldOutError, match=NAMED.pattern):
            train(micro_cfg(steps=STEPS), forged, str(tmp_path / "run"), progress=False)
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module")
def dishonest_run(forged, tmp_path_factory) -> str:
    run = str(tmp_path_factory.mktemp("dishonest") / "run")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with bypassed():
            train(micro_cfg(steps=STEPS), forged, run, progress=False)
    finally:
        torch.set_num_threads(n)
    return run


def test_replay_refuses_a_run_trained_on_it(dishonest_run, forged):
    with bypassed():       # the dishonest run replays on the forged mix: it is self-consistent
        ok = CliRunner().invoke(audit_cli, ["replay", dishonest_run, "--step", str(STEPS)])
    assert ok.exit_code == 0, ok.output
    res = CliRunner().invoke(audit_cli, ["replay", dishonest_run, "--step", str(STEPS)])
    assert res.exit_code == 1 and "MISMATCH" in res.output, res.output
    assert NAMED.search(res.output), res.output


def test_fetch_step_and_stream_at_refuse_it(honest, forged):
    """Random access checks the documents it reads: a step that draws a document the rule
    holds out is refused; one that draws none is served (its documents are training
    documents by the rule too)."""
    from open1b_data import StreamPlan
    from open1b_data.stream.schedule import Schedule

    held = {(s, h, int(r)) for s, sv in enumerate(StreamPlan.open(honest).view.sources)
            for h, rows in enumerate(sv.shard_heldout) for r in rows}
    plan = StreamPlan.open(forged, use_index=False)
    sched = Schedule.from_definition(plan.view.definition)
    segs = plan.segments_range(0, sched.total_windows)
    bad = {sched.step_of_window(int(m)) for m, s, h, r in zip(segs.window, segs.source,
                                                             segs.shard, segs.doc)
           if (int(s), int(h), int(r)) in held}
    assert bad and len(bad) < sched.last_step
    for step in (min(bad), min(set(range(1, sched.last_step + 1)) - bad)):
        fetched = CliRunner().invoke(audit_cli, ["fetch-step", forged, "--step", str(step)])
        shown = CliRunner().invoke(data_cli, ["stream-at", forged, "--step", str(step)])
        if step in bad:
            assert fetched.exit_code == shown.exit_code == 1, (fetched.output, shown.output)
            assert "held out by the definition's rule" in fetched.output, fetched.output
            assert NAMED.search(shown.output), shown.output
        else:
            assert fetched.exit_code == shown.exit_code == 0, (fetched.output, shown.output)
