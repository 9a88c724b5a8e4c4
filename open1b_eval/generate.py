"""Reproducible generation: the same checkpoint, prompt ids, temperature and seed give the
same tokens on every machine, backend, thread count and batch.

Each prompt is prefilled alone (``Decoder.forward`` into its row of the cache), then all
sequences decode together, one token per step, sequence b feeding its last token at its
own position; the next token follows ``open1b_eval.sampling.next_token`` at the position
it will take. Since every logit is the full-sequence forward's (``open1b_eval.decoder``),
a batch changes nothing but speed. A sequence stops after ``max_tokens`` new tokens or
after emitting ``stop_id`` (kept in its output).
"""
from __future__ import annotations

import torch

from open1b_eval.decoder import Decoder
from open1b_eval.sampling import next_token


def generate(dec: Decoder, prompts: list[list[int]], max_tokens: int,
             temperature: float = 0.0, seed: int = 0, stop_id: int | None = None
             ) -> list[list[int]]:
    """The new token ids of each prompt (lists of ids, each at least one token)."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (encode_prompt adds the "
                         "separator)")
    if max_tokens < 1 or not prompts:
        return [[] for _ in prompts]
    cache = dec.new_cache(len(prompts), max(len(p) for p in prompts) + max_tokens)
    out: list[list[int]] = []
    for b, p in enumerate(prompts):
        logits = dec.forward(torch.tensor([p], device=dec.device), cache, row=b)
        out.append([next_token(logits[0, -1], temperature, seed, len(p))])
    live = [stop_id is None or o[-1] != stop_id for o in out]
    for _ in range(max_tokens - 1):
        if not any(live):
            break
        # every sequence decodes (a finished one's extra tokens are dropped): a row's bits
        # do not depend on the others, so keeping the batch whole costs only their work
        ids = torch.tensor([o[-1] for o in out], device=dec.device)
        pos = torch.tensor([len(p) + len(o) - 1 for p, o in zip(prompts, out)])
        logits = dec.decode(cache, ids, pos)
        for b in range(len(prompts)):
            if live[b]:
                out[b].append(next_token(logits[b], temperature, seed, int(pos[b]) + 1))
                live[b] = stop_id is None or out[b][-1] != stop_id
    return out
