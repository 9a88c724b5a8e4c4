"""Kill -9 the real `open1b-train` process at several points - mid-step, mid-checkpoint-
write, after a step was logged but before its checkpoint - and resume: every step hash
equals the uninterrupted reference run's."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from open1b_train import checkpoint, runlog
from testkit.runs import REF_STEPS, cli_env


def _cmd(mix: str, run: str) -> list[str]:
    return [sys.executable, "-m", "open1b_train.cli", "run", "--preset", "micro", "--mix", mix,
            "--steps", str(REF_STEPS), "--out", run, "--quiet"]


def _kill_when(cmd: list[str], ready, timeout: float = 120.0) -> bool:
    """Start ``cmd``, SIGKILL it as soon as ``ready()``; False if it ended first."""
    proc = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if ready():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            if proc.poll() is not None:
                assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
                return False
            time.sleep(0.0005)
        raise AssertionError("the run neither reached the kill point nor ended")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _logged(run: str) -> int:
    try:
        return len(runlog.read(run)) - 1
    except Exception:       # a partial write in progress
        return -1


def _writing_checkpoint(run: str) -> bool:
    root = os.path.join(run, checkpoint.DIR)
    try:
        return any(".tmp-" in n for n in os.listdir(root))
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_kill_at_random_points_then_resume_gives_the_reference_hashes(tmp_path, mix4, ref_run):
    run = str(tmp_path / "run")
    cmd = _cmd(mix4, run)
    rng = random.Random(5)
    # 1. mid-step: after step 1 is logged, at a random moment within the next steps
    t_kill = [None]

    def mid_step():
        if _logged(run) >= 1 and t_kill[0] is None:
            t_kill[0] = time.monotonic() + rng.uniform(0.0, 0.5)
        return t_kill[0] is not None and time.monotonic() >= t_kill[0]

    assert _kill_when(cmd, mid_step)
    # 2. mid-checkpoint-write: a temporary checkpoint directory exists at the kill
    caught = False
    for _ in range(6):
        if _kill_when(cmd, lambda: _writing_checkpoint(run)):
            if _writing_checkpoint(run):
                caught = True
                break
    assert caught, "never killed inside a checkpoint write"
    # 3. a step logged past the newest checkpoint (odd steps have none)
    target = max(_logged(run), 0) + 1 | 1
    if target <= REF_STEPS:
        assert _kill_when(cmd, lambda: _logged(run) >= target)
        assert _logged(run) > max(checkpoint.list_steps(run))
    resumed = subprocess.run([sys.executable, "-m", "open1b_train.cli", "resume", run, "--quiet"],
                             env=cli_env(), capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    got, want = runlog.read(run), runlog.read(ref_run)
    assert [x["hash"] for x in got] == [x["hash"] for x in want]
    assert not any(".tmp-" in n for n in os.listdir(os.path.join(run, checkpoint.DIR)))
    assert want[-1]["hash"] in resumed.stdout.decode()
