"""The inference forward: the training forward's logits bit for bit, prefill + decode equal
to the full-sequence forward at every decoded position, and generation independent of the
backend, the thread count and the batch."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend
from open1b_eval.decoder import Decoder
from open1b_eval.generate import generate
from open1b_train.model import forward_backward
from tests.kernels.support import bits, needs_interpreter

TEXT = ("The electric field of a point charge falls off as the inverse square of the "
        "distance, and Coulomb wave functions describe the scattering of charged particles.")


def _ids(trained, n):
    ids = trained.encode_prompt(TEXT * 4)
    assert len(ids) >= n
    return ids[:n]


def test_forward_gives_the_training_forwards_logits(trained):
    ids = torch.tensor([_ids(trained, 33)[:32], _ids(trained, 33)[1:33]])
    seen = {}
    forward_backward(trained.cfg, trained.params, ids, ids.roll(-1, 1),
                     trace=lambda name, t: seen.setdefault(name, t.clone()))
    got = Decoder(trained.cfg, trained.params).forward(ids)
    assert torch.equal(bits(got.reshape(64, -1)), bits(seen["lm_head.fwd"]))


def test_decode_equals_the_full_forward_at_each_position(trained):
    """Prompt of 5, then decodes up to position 79: past the micro window (16) and the
    attention block (64). Logits equal bit for bit at every decoded position."""
    dec = Decoder(trained.cfg, trained.params)
    ids = _ids(trained, 80)
    full = dec.forward(torch.tensor([ids]))[0]                         # (80, V)
    cache = dec.new_cache(1, 80)
    first = dec.forward(torch.tensor([ids[:5]]), cache)[0]
    assert torch.equal(bits(first), bits(dec.forward(torch.tensor([ids[:5]]))[0]))
    for p in range(5, 80):
        got = dec.decode(cache, torch.tensor([ids[p]]), torch.tensor([p]))[0]
        want = dec.forward(torch.tensor([ids[:p + 1]]))[0, p] if p % 25 == 0 else full[p]
        assert torch.equal(bits(got), bits(want)), p


def _prompts(trained):
    return [trained.encode_prompt(t) for t in ("The electric", "Coulomb wave functions of",
                                               "def main():\n")]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batch_of_several_equals_each_alone_and_threads_do_not_matter(trained, temperature):
    dec = Decoder(trained.cfg, trained.params)
    prompts = _prompts(trained)
    batch = generate(dec, prompts, 8, temperature, seed=7)
    alone = [generate(dec, [p], 8, temperature, seed=7)[0] for p in prompts]
    assert batch == alone and all(len(b) == 8 for b in batch)
    torch.set_num_threads(2)
    try:
        assert generate(dec, prompts, 8, temperature, seed=7) == batch
    finally:
        torch.set_num_threads(1)


def test_the_seed_changes_samples_and_stop_id_ends_a_sequence(trained):
    dec = Decoder(trained.cfg, trained.params)
    p = _prompts(trained)[:1]
    a, b = generate(dec, p, 16, 1.0, seed=1), generate(dec, p, 16, 1.0, seed=2)
    assert a != b
    stop = a[0][3]
    cut = generate(dec, p, 16, 1.0, seed=1, stop_id=stop)[0]
    assert cut == a[0][:a[0].index(stop) + 1]


@needs_interpreter
def test_triton_interpreter_gives_the_cpu_tokens_and_logits(trained):
    prompts = _prompts(trained)[:2]
    dec = Decoder(trained.cfg, trained.params)
    want = generate(dec, prompts, 4, 0.7, seed=3)
    cache = dec.new_cache(1, len(prompts[0]) + 2)
    ids = prompts[0]
    want_logits = dec.forward(torch.tensor([ids]), cache)[0, -1]
    want_next = dec.decode(cache, torch.tensor([5]), torch.tensor([len(ids)]))
    with backend.force("triton"):
        dec_t = Decoder(trained.cfg, trained.params)
        assert generate(dec_t, prompts, 4, 0.7, seed=3) == want
        cache = dec_t.new_cache(1, len(ids) + 2)
        got_logits = dec_t.forward(torch.tensor([ids]), cache)[0, -1]
        got_next = dec_t.decode(cache, torch.tensor([5]), torch.tensor([len(ids)]))
    assert torch.equal(bits(got_logits), bits(want_logits))
    assert torch.equal(bits(got_next), bits(want_next))
