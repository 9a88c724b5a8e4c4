"""Token log-probabilities from the runtime's logits, shared by perplexity and the harness.

The logits are the runtime's (bit-identical everywhere, ``open1b_eval.decoder``); a token's
log-probability is ``logit - logsumexp(logits)`` computed in float64 by torch on the CPU,
sums in float64: reported to 1e-12, not part of the bitwise contract.
"""
from __future__ import annotations

import torch

from open1b_eval.decoder import Decoder


def token_logprobs(dec: Decoder, ids: list[int]) -> tuple[list[float], list[bool]]:
    """Log-probability of ids[1:] each given all ids before it, and whether each is the
    argmax token. The caller bounds the length."""
    logits = dec.forward(torch.tensor([ids], device=dec.device))[0, :-1]
    lg = logits.double().cpu()
    target = torch.tensor(ids[1:])
    lp = lg.gather(1, target[:, None])[:, 0] - torch.logsumexp(lg, -1)
    return lp.tolist(), (lg.argmax(-1) == target).tolist()


def rolling_nll(dec: Decoder, ids: list[int], window: int) -> tuple[float, int]:
    """(sum of -log p, count) over ids[1:] (ids[0] is the separator that opens the
    document), in disjoint windows of ``window`` predictions, each seeing up to
    ``window`` tokens of input (lm-eval's rolling windows with context 1)."""
    total, n = 0.0, 0
    for start in range(1, len(ids), window):
        end = min(start + window, len(ids))
        lp, _ = token_logprobs(dec, ids[max(0, end - window - 1):end])
        part = lp[-(end - start):]
        total -= sum(part)
        n += len(part)
    return total, n
