"""What a reader of a run sees (``open1b-train plot`` and ``show``) is what was audited: the
hashed ``scalars`` of each step, never the unhashed decimal fields beside them."""
from __future__ import annotations

import json
import shutil
import struct

import pytest

from open1b_train import plot, runlog, show

EDITED = 3                                     # the step whose decimal fields are forged


def _f32(h: str) -> float:
    return struct.unpack(">f", bytes.fromhex(h))[0]


@pytest.fixture
def forged_run(ref_run, tmp_path) -> str:
    """A copy of the reference run's log whose step 3 claims a wild loss, LR, norm and
    phase in its unhashed decimal fields (the chain and the replay do not notice)."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.json", "run.json"):
        shutil.copy(f"{ref_run}/{name}", run / name)
    lines = runlog.read(ref_run)
    lines[EDITED].update(loss=1234.5, lr=42.0, grad_norm=1e-30, phase=7)
    runlog.rewrite(str(run), lines)
    return str(run)


def _hashed(run: str) -> list[dict]:
    return [ln["scalars"] for ln in runlog.read(run)[1:]]


def test_plot_shows_the_hashed_scalars(forged_run, tmp_path):
    lines = runlog.read(forged_run)
    s = plot.series(lines[1:], plot.phase_start_tokens(forged_run, lines[0]))
    sc = _hashed(forged_run)
    assert s.loss == [_f32(x["loss"]) for x in sc] and s.loss[EDITED - 1] != 1234.5
    assert s.lr == [float.fromhex(x["lr"]) for x in sc] and s.lr[EDITED - 1] != 42.0
    assert s.grad_norm == [_f32(x["grad_norm"]) for x in sc]
    assert s.phase_source == plot.FROM_SCHEDULE and s.phase_starts == []   # one phase
    fig = plot.figure(s)
    for ax, want in zip(fig.axes, (s.loss, s.lr, s.grad_norm)):
        assert list(ax.lines[0].get_ydata()) == want
    assert "unhashed" in fig.axes[3].get_ylabel()
    assert fig.axes[3].get_xlabel() == "step"         # no phase starts, no skipped updates
    png = plot.plot_run(forged_run, str(tmp_path / "t.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_show_prints_the_hashed_scalars(forged_run):
    rep = show.step_report(forged_run, EDITED, top=1)
    sc = _hashed(forged_run)[EDITED - 1]
    assert (rep["loss"], rep["lr"], rep["grad_norm"]) == (
        _f32(sc["loss"]), float.fromhex(sc["lr"]), _f32(sc["grad_norm"]))
    assert rep["phase"] == 0 and "seconds" in rep["unhashed"]
    out: list[str] = []
    show.print_report(rep, out.append)
    text = "\n".join(out)
    assert f"loss {rep['loss']:.6f}" in text and f"lr {rep['lr']:.6g}" in text
    assert "1234.5" not in text and "lr 42" not in text and "phase 7" not in text


def test_show_refuses_a_mix_the_genesis_did_not_hash(forged_run, mix12):
    with pytest.raises(Exception, match="fingerprint"):
        show.step_report(forged_run, EDITED, top=1, mix=mix12)


def _line(step: int, tokens: int, loss: str = "3f800000") -> dict:
    return {"step": step, "phase": 0, "loss": 9.0, "tokens_per_s": 1.0,
            "scalars": {"loss": loss, "grad_norm": "40000000", "lr": (1e-3).hex(),
                        "skipped": step == 2, "spike": False, "tokens": tokens}}


def test_phase_boundaries_come_from_the_hashed_tokens():
    # a batch of 2 sequences of 32 tokens, then 4 from token 128 (the unhashed phase: all 0)
    lines = [_line(s, t) for s, t in enumerate((64, 128, 256, 384, 512), start=1)]
    by_schedule = plot.series(lines, [0, 128])
    assert by_schedule.phase_starts == [3] and by_schedule.phase_source == plot.FROM_SCHEDULE
    by_tokens = plot.series(lines)
    assert by_tokens.phase_starts == [3] and by_tokens.phase_source == plot.FROM_TOKENS
    assert by_tokens.skipped == [2] and by_tokens.grad_norm == [2.0] * 5
    assert plot.series(lines[2:]).phase_starts == []     # a slice: step 3's batch is unknown


def test_phase_starts_need_the_runs_own_mix(forged_run, mix12):
    genesis = runlog.read(forged_run)[0]
    assert plot.phase_start_tokens(forged_run, genesis) == [0]
    assert plot.phase_start_tokens(forged_run, genesis, mix=mix12) is None   # another mix
    with open(f"{forged_run}/run.json", "w") as f:
        json.dump({"mix": "/nonexistent/mix"}, f)
    assert plot.phase_start_tokens(forged_run, genesis) is None


def test_the_step_axis_names_only_the_marks_the_run_has():
    def label(starts, skipped):
        return plot.xlabel(plot.Series([1, 2], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1, 2],
                                       skipped, starts, plot.FROM_SCHEDULE, [None, None]))
    assert label([], []) == "step"
    assert label([2], []) == f"step (dashed: {plot.FROM_SCHEDULE})"
    assert label([], [2]) == "step (red: skipped updates)"
    assert label([2], [2]) == f"step (dashed: {plot.FROM_SCHEDULE}; red: skipped updates)"

