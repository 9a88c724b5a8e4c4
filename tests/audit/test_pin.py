"""The published run hash pins a log (``--expect-run-hash``): a truncated log, a log with
steps after the published end, and a re-chained suffix are each a valid chain with another
last hash, and each is refused by every command that reads a run, naming the first step
that is missing or not part of the published run. A cut-off last line is reported, never
silently dropped; the decimals a reader sees must be the hashed scalars' values."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from open1b_train import chain
from open1b_audit.cli import main as audit_cli
from open1b_train import runlog
from testkit.fakelog import lines_of, rechain, write_run

STEPS = 8


def _cli(*args: str):
    return CliRunner().invoke(audit_cli, list(args), catch_exceptions=False)


def _refused(res, *needles: str) -> None:
    assert res.exit_code == 1, res.output
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in res.output, res.output
    for n in needles:
        assert n in err[0], err[0]


@pytest.fixture
def published(tmp_path):
    lines = lines_of(STEPS)
    return write_run(str(tmp_path / "run"), lines), lines[-1]["hash"], lines


def test_the_published_log_passes_its_pin(published):
    run, h, _ = published
    res = _cli("chain", run, "--expect-run-hash", h)
    assert res.exit_code == 0 and "chain OK" in res.output and "published" in res.output
    rep = json.loads(_cli("chain", run, "--expect-run-hash", h.upper(), "--json").output)
    assert rep["finding"] is None and rep["expected_run_hash"] == h


def test_truncated_log_is_refused_naming_the_missing_step(published, tmp_path):
    _, h, lines = published
    run = write_run(str(tmp_path / "cut"), lines[:6])
    assert _cli("chain", run).exit_code == 0            # a valid chain on its own
    _refused(_cli("chain", run, "--expect-run-hash", h), "ends at step 5", "step 6 is missing")


def test_steps_after_the_published_end_are_named(published):
    run, _, lines = published
    _refused(_cli("chain", run, "--expect-run-hash", lines[5]["hash"]),
             "is step 5's", "steps 6..8", "not part of the published run")


def test_a_rechained_suffix_is_refused(published, tmp_path):
    _, h, lines = published
    forged = json.loads(json.dumps(lines))
    forged[6]["scalars"]["lr"] = (5e-2).hex()            # another LR from step 6 on ...
    rechain(forged, 6)                                   # ... and a rebuilt chain
    run = write_run(str(tmp_path / "forged"), forged)
    res = _cli("chain", run)
    assert res.exit_code == 0 and "chain OK" in res.output
    _refused(_cli("chain", run, "--expect-run-hash", h), "no logged step has the published",
             "ends at step 8", "re-chained")


def test_a_cut_off_last_line_is_a_finding_not_dropped(published, tmp_path):
    _, h, lines = published
    tail = json.dumps(lines[7]).encode()[:40]
    run = write_run(str(tmp_path / "partial"), lines[:7], tail=tail)
    assert runlog.read(run) == lines[:7]                 # the trainer's view is unchanged
    log = runlog.read_log(run)
    assert log.lines == lines[:7] and log.partial_bytes == 40 and log.partial_line == 8
    res = _cli("chain", run)
    assert res.exit_code == 1 and "line 8 is cut off (40 bytes" in res.output, res.output
    rep = json.loads(_cli("chain", run, "--json").output)
    assert rep["partial_tail_bytes"] == 40 and rep["finding"]["step"] == 7
    _refused(_cli("chain", run, "--expect-run-hash", h), "step 7 is missing",
             "line 8 is cut off")


@pytest.mark.parametrize("field,value", [("loss", 0.125), ("grad_norm", 3.0), ("lr", 1.0),
                                         ("loss", "2.0")])
def test_decimals_must_be_the_hashed_values(published, tmp_path, field, value):
    _, _, lines = published
    edited = json.loads(json.dumps(lines))
    edited[4][field] = value                             # not hashed: the chain still holds
    run = write_run(str(tmp_path / "edited"), edited)
    res = _cli("chain", run)
    assert res.exit_code == 1 and "step 4: scalars" in res.output and field in res.output, (
        res.output)


def test_pin_is_checked_before_any_work_by_every_command(published, tmp_path):
    """The log is refused before replay/bisect read a config or a mix, coverage reads a
    certificate, fetch-step reads the mix (none exist here)."""
    _, h, lines = published
    run = write_run(str(tmp_path / "cut"), lines[:6])
    (tmp_path / "cert.json").write_text("{}")
    for args in (["replay", run, "--step", "3"], ["bisect", run, "--until", "3"],
                 ["coverage", run, str(tmp_path / "cert.json")],
                 ["fetch-step", str(tmp_path / "no-mix"), "--step", "3", "--run", run]):
        _refused(_cli(*args, "--expect-run-hash", h), "not the published run",
                 "step 6 is missing")
    res = _cli("chain", run, "--expect-run-hash", "12ab")
    assert res.exit_code == 2 and "64 hex digits" in res.output


def test_pin_function():
    lines = lines_of(3)
    assert chain.pin(lines, lines[-1]["hash"]) is None
    f = chain.pin(lines, lines[1]["hash"])
    assert (f.step, f.component) == (2, "log")
    f = chain.pin(lines[:2], lines[-1]["hash"], partial_bytes=9)
    assert f.step == 2 and "cut off: 9 bytes" in f.detail


@pytest.mark.slow
def test_replay_mentions_a_cut_off_line(ref_run, tmp_path):
    import shutil

    run = str(tmp_path / "run")
    shutil.copytree(ref_run, run)
    with open(runlog.path_of(run), "ab") as f:
        f.write(b'{"step": 9, "hash"')
    h = runlog.read(run)[-1]["hash"]
    res = _cli("replay", run, "--step", "1", "--expect-run-hash", h)
    assert res.exit_code == 0, res.output
    assert "line 10 is cut off (18 bytes" in res.output and "not part of the chain" in res.output
    rep = json.loads(_cli("replay", run, "--step", "1", "--json").output)
    assert rep["partial_tail_bytes"] == 18 and rep["verdict"] == "match"
