"""Shared built mixes and a reference run for the training tests (built once per session).

``mix12``: 12 windows of 32 tokens per step (splits over 1, 2, 3, 4, 6 virtual ranks).
``mix4``:  4 windows per step, for runs that need many cheap steps (kill/resume, spikes).
``ref_run``: an uninterrupted micro run on mix4 (8 steps, checkpoints every 2): the
reference the interrupted and tampered runs are compared with.
Tiny steps spend their time in per-op overhead, so the tests pin torch to one thread.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from open1b_train.config import micro
from open1b_train.train import train
from tests.train.trainmix import train_mix

REF_STEPS = 8


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def mix12(tmp_path_factory) -> str:
    return train_mix(tmp_path_factory.mktemp("mix12"), steps=12, batch=12)


@pytest.fixture(scope="session")
def mix4(tmp_path_factory) -> str:
    return train_mix(tmp_path_factory.mktemp("mix4"), steps=24, batch=4)


def micro_cfg(**kw):
    return dataclasses.replace(micro(), checkpoint_every=2, **kw)


@pytest.fixture(scope="session")
def ref_run(mix4, tmp_path_factory) -> str:
    run = str(tmp_path_factory.mktemp("ref") / "run")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(micro_cfg(steps=REF_STEPS), mix4, run, progress=False)
    finally:
        torch.set_num_threads(n)
    return run


def cli_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
