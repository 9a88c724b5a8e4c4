"""A trained model as one value: a run's checkpoint, config and tokenizer, each checked
against the run's chain before use.

``load(run, step=None)`` opens the run through ``open1b_train.published``: the log must be
one chain (and end in the published run hash when the user pins it), the model config comes
from the run's ``config.json`` only when its identity is the one the genesis hashes (never
from a checkpoint's ``record.json``), the mix's fingerprint must be the genesis's, every
tokenizer file must have the sha256 its manifest lists, and the checkpoint's parameters
must have the log's digest for that step. ``notes`` carries what was not pinned, for the
commands to print. Text becomes ids as in training: byte-level BPE, the separator
``<|endoftext|>`` (``eot``) never produced from text; ``encode_prompt`` puts one separator
first, since in the stream every document follows one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from open1b_eval.errors import EvalError
from open1b_train import checkpoint
from open1b_train.config import ModelConfig
from open1b_train.errors import Open1bTrainError
from open1b_train.published import PublishedRun, open_published
from open1b_train.recipe import Announcement


@dataclass
class Trained:
    run: str
    step: int
    cfg: ModelConfig
    params: dict[str, torch.Tensor]
    mix: str
    tokenizer: Any            # tokenizers.Tokenizer
    eot: int
    run_hash: str             # the run's (its log's last hash; the published one when pinned)
    published: PublishedRun

    @property
    def step_hash(self) -> str:
        return self.published.lines[self.step]["hash"]

    @property
    def notes(self) -> list[str]:
        return self.published.notes

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        return [self.eot] + self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def resolve_step(run: str, step: int | None) -> int:
    steps = checkpoint.list_steps(run)
    if not steps:
        raise EvalError(f"{run}: no checkpoints (RUN/checkpoints/step-*); train first or pass "
                        f"another run")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise EvalError(f"{run}: no checkpoint at step {step}; checkpointed steps: {steps}")
    return step


def open_run(run: str, mix: str | None = None, expect: str | None = None) -> PublishedRun:
    """The run, checked for use (``open1b_train.published``); ``expect``: the published run
    hash."""
    try:
        return open_published(run, mix, Announcement(run_hash=expect))
    except Open1bTrainError as e:
        raise EvalError(str(e)) from None


def at_step(pub: PublishedRun, step: int | None = None,
            device: torch.device | str = "cpu") -> Trained:
    """The checked checkpoint of ``pub`` at ``step`` (default: the latest)."""
    step = resolve_step(pub.dir, step)
    try:
        params = pub.weights(step)
    except Open1bTrainError as e:
        raise EvalError(str(e)) from None
    return Trained(pub.dir, step, pub.model, {k: t.to(device) for k, t in params.items()},
                   pub.mix, pub.tokenizer(), pub.eot, pub.run_hash, pub)


def load(run: str, step: int | None = None, mix: str | None = None,
         device: torch.device | str = "cpu", expect: str | None = None) -> Trained:
    """The checkpoint of ``run`` at ``step`` (default: the latest) with its tokenizer."""
    return at_step(open_run(run, mix, expect), step, device)
