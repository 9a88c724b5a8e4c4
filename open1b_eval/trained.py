"""A trained model as one value: a run's verified checkpoint, its config, its tokenizer.

``load(run, step=None)`` reads ``RUN/checkpoints/step-N`` through
``open1b_train.checkpoint.load`` (every file re-hashed against its record: a corrupt or
edited checkpoint is refused), takes the model config from the checkpoint's own record
(the vocabulary from the embedding's shape when the preset says "the mix's") and the
tokenizer from the run's mix (``<mix>/tokenizer.json``; ``<mix>/tokenizer/`` for
transformers). Text becomes ids as in training: byte-level BPE, the separator
``<|endoftext|>`` (``eot``) never produced from text; ``encode_prompt`` puts one separator
first, since in the stream every document follows one.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

from open1b_eval.errors import EvalError
from open1b_train import checkpoint
from open1b_train.config import ModelConfig, from_dict
from open1b_train.errors import Open1bTrainError


@dataclass
class Trained:
    run: str
    step: int
    cfg: ModelConfig
    params: dict[str, torch.Tensor]
    mix: str
    tokenizer: Any            # tokenizers.Tokenizer
    eot: int
    run_hash: str

    @property
    def tokenizer_dir(self) -> str:
        return os.path.join(self.mix, "tokenizer")

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


def load(run: str, step: int | None = None, mix: str | None = None,
         device: torch.device | str = "cpu") -> Trained:
    """The checkpoint of ``run`` at ``step`` (default: the latest) with its tokenizer."""
    from open1b_data import load_manifest
    from open1b_data.formats.tokenizerfile import load_tokenizer
    from open1b_train.run import read_run

    step = resolve_step(run, step)
    try:
        _, mix = read_run(run, mix)
        ck = checkpoint.load(checkpoint.step_dir(run, step), device)
    except Open1bTrainError as e:
        raise EvalError(str(e)) from None
    model = from_dict(ck.record["config"]).model
    if model.vocab == 0:
        model = dataclasses.replace(model, vocab=int(ck.params["embed.weight"].shape[0]))
    manifest = load_manifest(mix)
    tok = load_tokenizer(os.path.join(mix, "tokenizer.json"))
    return Trained(run, step, model, ck.params, mix, tok, int(manifest.tokenizer["eot_id"]),
                   str(ck.record.get("run_hash", "")))
