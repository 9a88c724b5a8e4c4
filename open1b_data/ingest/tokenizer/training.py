"""Training, saving and loading the BPE, and its transformers directory.

- ``train_tokenizer(spec, texts)``: HF ``tokenizers`` BPE; pre-tokenizer = Split on
  ``spec.split_pattern`` ("isolated") then ByteLevel(add_prefix_space=False,
  use_regex=False); ByteLevel decoder; ``spec.eot`` is the only special token (id 0); no
  normalizer, no post-processor (the stream appends the separator itself). The model has
  ``ignore_merges=True`` (as Llama-3): a pre-token that is itself in the vocabulary is
  one token, which is also what tiktoken does.
- ``save_tokenizer`` writes the compact ``tokenizer.json`` atomically; identical inputs give
  byte-identical files (tested). It loads with ``tokenizers.Tokenizer.from_file`` and
  ``transformers.PreTrainedTokenizerFast(tokenizer_file=...)``; ``transformers_files`` gives
  the directory ``AutoTokenizer.from_pretrained`` opens with the separator as eos_token.
- Document text is encoded as text: a literal ``<|endoftext|>`` inside a document is *not*
  the separator. Tokenizers returned by ``train_tokenizer``/``load_tokenizer`` have
  ``encode_special_tokens = True`` (not stored in the file).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any


from open1b_data.errors import BuildError
from open1b_data.formats.definition import TokenizerSpec
from open1b_data.formats.tokenizerfile import load_tokenizer, save_tokenizer  # noqa: F401


def train_tokenizer(spec: TokenizerSpec, texts: Iterable[str]) -> Any:
    """Train the byte-level BPE of ``spec`` from scratch on ``texts``."""
    # Explicit: HF warns and silently goes serial if a process forks after using its pool.
    # Training in the main process may use the pool unless the caller decided otherwise.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer(spec.split_pattern)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, min_frequency=spec.min_frequency,
        special_tokens=[spec.eot], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=spec.max_token_length, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.model.ignore_merges = True
    tok.encode_special_tokens = True
    return tok


def _pre_tokenizer(pattern: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# ---------------------------------------------------------------------------------------
# The tokenizer as a transformers directory

HF_DIRECTORY = "tokenizer"  # beside tokenizer.json in the mix root


def transformers_files(tokenizer_json: bytes, eot: str, model_max_length: int
                       ) -> dict[str, bytes]:
    """The files of a directory ``transformers.AutoTokenizer.from_pretrained`` opens with the
    mix's special tokens set, by name; deterministic bytes (sorted keys, no timestamps).

    ``eos_token`` is the separator ``eot`` (what the stream puts after every document).
    ``bos_token``, ``pad_token`` and ``unk_token`` are unset: training windows have no BOS,
    are packed (never padded), and byte-level BPE has no unknown token; a user who pads
    sets ``pad_token = eos_token`` and relies on the attention mask. ``split_special_tokens``
    makes transformers encode a literal ``<|endoftext|>`` inside text as text, as the shards
    do; ``clean_up_tokenization_spaces`` is off so decoding returns the text exactly.
    ``model_max_length`` is the training sequence length (``schedule.seq_tokens``)."""
    d = json.loads(tokenizer_json)
    special = {t["content"]: t for t in d.get("added_tokens", [])}
    if eot not in special:
        raise BuildError(f"tokenizer.json has no {eot!r} special token; it was not trained "
                         f"for this mix (delete it and build again)")
    t = special[eot]
    config = {
        "added_tokens_decoder": {str(t["id"]): {
            "content": eot, "lstrip": t["lstrip"], "normalized": t["normalized"],
            "rstrip": t["rstrip"], "single_word": t["single_word"], "special": True}},
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": eot,
        "model_max_length": model_max_length,
        "pad_token": None,
        "split_special_tokens": True,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }

    def dumps(obj: Any) -> bytes:
        return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode()

    return {"special_tokens_map.json": dumps({"eos_token": eot}),
            "tokenizer.json": tokenizer_json,
            "tokenizer_config.json": dumps(config)}
