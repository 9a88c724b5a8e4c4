"""Deterministic data-parallel training on gloo processes: the same step hashes and the
same checkpoint files as the single-process trainer with the same logical mesh, for every
process count that divides the mesh; a killed worker stops the job naming its rank, and
the run resumes on another process count with identical hashes."""
from __future__ import annotations

import filecmp
import os
import signal
import subprocess
import sys
import time

import pytest

from open1b_train import checkpoint, runlog
from open1b_train.train import train
from tests.train import distproc
from testkit.runs import cli_env, micro_cfg
from testkit.trainmix import train_mix

MESHES = [(1, 2), (2, 1), (2, 2), (3, 1), (3, 2), (5, 1)]
STEPS = 2


@pytest.fixture(scope="session")
def mix10(tmp_path_factory) -> str:
    return train_mix(tmp_path_factory.mktemp("mix10"), steps=6, batch=10)


def _mix_for(mesh, mix12, mix10) -> str:
    return mix10 if mesh == (5, 1) else mix12


def _dist_worker(rank: int, world: int, jobs: list[tuple[tuple[int, int], str, str]]) -> None:
    from open1b_train.distributed.engine import train_distributed

    for mesh, mix, run in jobs:
        train_distributed(micro_cfg(steps=STEPS, mesh=mesh), mix, run, progress=False,
                          echo=lambda m: None)


def _same_checkpoints(a: str, b: str) -> None:
    steps = checkpoint.list_steps(a)
    assert steps == checkpoint.list_steps(b) and steps
    for s in steps:
        da, db = checkpoint.step_dir(a, s), checkpoint.step_dir(b, s)
        names = sorted(os.listdir(da))
        assert names == sorted(os.listdir(db))
        _, mismatch, errors = filecmp.cmpfiles(da, db, names, shallow=False)
        assert not mismatch and not errors, (s, mismatch, errors)


@pytest.mark.slow
def test_every_process_count_gives_the_single_process_bits(tmp_path, mix12, mix10):
    ref = {}
    for mesh in MESHES:
        run = str(tmp_path / f"single-{mesh[0]}x{mesh[1]}")
        train(micro_cfg(steps=STEPS, mesh=mesh), _mix_for(mesh, mix12, mix10), run,
              progress=False)
        ref[mesh] = run
    for world in (2, 3, 4, 5, 6):
        jobs = [(m, _mix_for(m, mix12, mix10), str(tmp_path / f"p{world}-{m[0]}x{m[1]}"))
                for m in MESHES if (m[0] * m[1]) % world == 0]
        distproc.run(world, _dist_worker, jobs)
        for mesh, _, run in jobs:
            got, want = runlog.read(run), runlog.read(ref[mesh])
            assert [x["hash"] for x in got] == [x["hash"] for x in want], (world, mesh)
            assert got[-1]["processes"] == world
            _same_checkpoints(run, ref[mesh])


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.mark.slow
def test_a_killed_worker_stops_the_job_naming_its_rank_and_the_run_resumes_elsewhere(
        tmp_path, mix4):
    ref = str(tmp_path / "ref")
    train(micro_cfg(steps=6, mesh=(2, 2)), mix4, ref, progress=False)
    run = str(tmp_path / "run")
    env = dict(cli_env(), OPEN1B_DIST_TIMEOUT="60")
    cmd = [sys.executable, "-m", "open1b_train.cli", "run", "--preset", "micro", "--mix", mix4,
           "--steps", "6", "--mesh", "2x2", "--out", run, "--nproc", "2", "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            lines = runlog.read(run) if os.path.exists(runlog.path_of(run)) else []
            if len(lines) >= 3:                 # past step 2 (its checkpoint is written)
                break
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        workers = sorted(_children(proc.pid))
        assert len(workers) == 2
        victim = workers[1]                     # rank 1 (started second)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1
    assert "worker rank 1 of 2 was killed by SIGKILL" in err.decode(), err.decode()[-2000:]
    assert stopped_in < 15, stopped_in
    assert not any(p for p in _children(proc.pid))
    # resume on 4 processes (another P): the reference hashes, step for step
    r = subprocess.run([sys.executable, "-m", "open1b_train.cli", "resume", run, "--nproc", "4",
                        "--quiet"], env=env, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert [x["hash"] for x in runlog.read(run)] == [x["hash"] for x in runlog.read(ref)]
    _same_checkpoints(run, ref)     # written by 1 (ref), 2 and then 4 processes: same bytes
