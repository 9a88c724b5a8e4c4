"""The mix's ``tokenizer.json``: the BPE the build trained, as the stream, the trainer and
the auditor read it. ``save_tokenizer`` writes it compact and deterministic (identical
inputs give byte-identical files), atomically; ``load_tokenizer`` reads it (path or URL)
with ``encode_special_tokens = True``: document text is encoded as text, so a literal
``<|endoftext|>`` inside a document is not the separator."""
from __future__ import annotations

import os
from typing import Any

from open1b_data.errors import BuildError
from open1b_data.storage import atomic_write_bytes, read_bytes


def save_tokenizer(tok: Any, path_or_url: str) -> None:
    """Write ``tokenizer.json`` (compact JSON, deterministic) atomically."""
    atomic_write_bytes(str(path_or_url), tok.to_str(pretty=False).encode("utf-8"))


def load_tokenizer(path_or_url: str) -> Any:
    """Read a ``tokenizer.json`` (local path or URL) into a ``tokenizers.Tokenizer``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(read_bytes(str(path_or_url)).decode("utf-8"))
    except FileNotFoundError:
        raise BuildError(f"tokenizer file {path_or_url!r} does not exist; build the mix "
                         f"(it trains the tokenizer) or pass the right path") from None
    except Exception as e:  # tokenizers raises plain Exception on a malformed file
        raise BuildError(f"tokenizer file {path_or_url!r} cannot be loaded: {e}") from None
    tok.encode_special_tokens = True
    return tok
