"""The model: parameter counts, init, and agreement with an independent float64 forward."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from open1b_train.config import ModelConfig, demo, micro, open1b
from open1b_train.model import forward_backward
from open1b_train.params import count, init_params, param_specs, stream_of
from tests.train import reference


def test_open1b_parameter_count_on_the_meta_device(capsys):
    """Every parameter materialized on the meta device (no memory): 1.61B total, 1.08B
    without the input embedding and the LM head, as the paper states."""
    cfg = open1b().model
    tensors = {s.name: torch.empty(s.shape, dtype=s.dtype, device="meta")
               for s in param_specs(cfg)}
    total = sum(t.numel() for t in tensors.values())
    emb = tensors["embed.weight"].numel() + tensors["lm_head.weight"].numel()
    with capsys.disabled():
        print(f"\nOpen-1B parameters: {total:,} total, {total - emb:,} non-embedding")
    assert total == count(cfg)["total"] == 1_607_569_552
    assert total - emb == 1_082_232_976
    assert round(total / 1e9, 2) == 1.61 and round((total - emb) / 1e9, 2) == 1.08


def test_full_causal_layers_are_every_fifth_and_the_last():
    assert open1b().model.full_layers == (4, 9, 14, 19, 23)
    assert [open1b().model.layer_window(i) for i in (0, 3, 4, 22, 23)] == [512, 512, None, 512, None]


def test_init_depends_on_seed_name_and_shape_only():
    cfg = dataclasses.replace(micro().model, vocab=300)
    a, b = init_params(cfg, 7), init_params(cfg, 7)
    assert all(torch.equal(a[k].view(torch.int16) if a[k].dtype == torch.bfloat16 else a[k],
                           b[k].view(torch.int16) if b[k].dtype == torch.bfloat16 else b[k])
               for k in a)
    c = init_params(dataclasses.replace(cfg, n_layers=cfg.n_layers + 1), 7)
    assert torch.equal(c["layers.0.attn.q.weight"].view(torch.int16),
                       a["layers.0.attn.q.weight"].view(torch.int16))   # adding a layer: same
    d = init_params(cfg, 8)
    assert not torch.equal(d["embed.weight"].view(torch.int16), a["embed.weight"].view(torch.int16))
    w = a["layers.1.mlp.down.weight"].float()
    assert float(w.abs().max()) <= 0.04 * (1 + 2**-8) and abs(float(w.std()) - 0.02 * 0.88) < 0.003
    assert float(a["layers.0.attn.q.step"]) == 0.125 and float(a["layers.0.attn.o.step"]) == 0.03125
    assert torch.equal(a["final_norm.gain"].float(), torch.ones(cfg.d_model))
    names = [s.name for s in param_specs(open1b().model)]
    assert len({stream_of(n) for n in names}) == len(names)


def test_weight_decay_groups():
    decayed = {s.name for s in param_specs(micro().model.__class__(vocab=300, n_layers=1))
               if s.decay}
    assert "lm_head.weight" in decayed and "layers.0.mlp.down.weight" in decayed
    assert not decayed & {"embed.weight", "embed_norm.gain", "final_norm.gain",
                          "layers.0.attn.q.step", "layers.0.attn_norm.gain"}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("preset", [micro, demo])
def test_forward_agrees_with_a_float64_reference(preset):
    """Against the independent float64 forward (tests/train/reference.py, W8A8 simulated):

    * op by op - each op of every layer recomputed in float64 from the model's own traced
      inputs: within 3% (relative Frobenius) for ops whose input the model rounds to bf16
      before quantizing (an int8 code flips where bf16 rounding crosses a half-step) and 1%
      for the others. A composition error (a misplaced norm, a wrong window, RoPE pairing
      or KV head) is an O(1) disagreement in one of them;
    * end to end - the loss within 0.5% (errors of the single ops compound through the
      layers in the logits, so they are only checked op by op)."""
    cfg: ModelConfig = dataclasses.replace(preset().model, vocab=384, n_layers=3)
    if preset is demo:
        cfg = dataclasses.replace(cfg, window=24)
    params = init_params(cfg, 3)
    # a trained-looking model: larger weights than at init make the layers matter, and
    # activation steps sized for the larger activations (as training would set them)
    for name, t in params.items():
        if name.endswith(".weight") and not name.startswith(("embed", "lm_head")):
            params[name] = (t.float() * 4).to(t.dtype)
        if name.endswith(".step"):
            params[name] = torch.full_like(t, 0.125)
    p = {k: t.double() for k, t in params.items()}
    b, s = 2, 64
    ids = torch.randint(0, cfg.vocab, (b, s + 1), generator=torch.Generator().manual_seed(1))
    got = {}
    loss, per_seq, _ = forward_backward(cfg, params, ids[:, :-1], ids[:, 1:],
                                        trace=lambda n, t: got.__setitem__(n, t.clone()))
    tr = {k: t.double() for k, t in got.items()}

    def lin(x, name):
        return reference._linear(x, p[f"{name}.weight"], p[f"{name}.step"], True)

    x = tr["embed_norm.fwd"]
    assert _rel(x, reference._rms(p["embed.weight"][ids[:, :-1]], p["embed_norm.gain"],
                                  cfg.eps)) < 0.01
    for i in range(cfg.n_layers):
        pre = f"layers.{i}"
        xn = reference._rms(x, p[f"{pre}.attn_norm.gain"], cfg.eps)
        heads = {}
        for name, nh in (("q", cfg.n_heads), ("k", cfg.n_kv_heads), ("v", cfg.n_kv_heads)):
            assert _rel(tr[f"{pre}.fwd.attn.{name}"].view(b, s, -1), lin(xn, f"{pre}.attn.{name}")) < 0.03
            heads[name] = tr[f"{pre}.fwd.attn.{name}"].view(b, s, nh, cfg.head_dim)
        q = reference._rope(reference._rms(heads["q"], None, cfg.eps), cfg.theta)
        k = reference._rope(reference._rms(heads["k"], None, cfg.eps), cfg.theta)
        window = None if (i + 1) % cfg.full_every == 0 or i == cfg.n_layers - 1 else cfg.window
        core = tr[f"{pre}.fwd.attn.core"].transpose(1, 2)            # (B, S, H, hd)
        assert _rel(core, reference._attention(q, k, heads["v"], window)) < 0.03
        o_in = core.reshape(b, s, -1)
        assert _rel(tr[f"{pre}.fwd.attn.o"].view(b, s, -1), lin(o_in, f"{pre}.attn.o")) < 0.01
        h = tr[f"{pre}.fwd.h"]
        assert _rel(h, x + tr[f"{pre}.fwd.attn.o"].view(b, s, -1)) < 0.01
        hn = reference._rms(h, p[f"{pre}.mlp_norm.gain"], cfg.eps)
        gu = tr[f"{pre}.fwd.mlp.gate_up"].view(b, s, -1)
        assert _rel(gu, lin(hn, f"{pre}.mlp.gate_up")) < 0.03
        g, u = gu[..., :cfg.ffn], gu[..., cfg.ffn:]
        a = tr[f"{pre}.fwd.mlp.swiglu"].view(b, s, -1)
        assert _rel(a, g * torch.sigmoid(g) * u) < 0.01
        assert _rel(tr[f"{pre}.fwd.mlp.down"].view(b, s, -1), lin(a, f"{pre}.mlp.down")) < 0.01
        x = tr[f"{pre}.fwd.out"]
        assert _rel(x, h + tr[f"{pre}.fwd.mlp.down"].view(b, s, -1)) < 0.01
    logits = reference._rms(x, p["final_norm.gain"], cfg.eps) @ p["lm_head.weight"].T
    assert _rel(tr["lm_head.fwd"], logits.reshape(b * s, -1)) < 0.01
    ref_loss, _ = reference.forward(cfg, params, ids[:, :-1], ids[:, 1:])
    assert abs(float(loss) - float(ref_loss)) < 0.005 * float(ref_loss)
    # per-sequence losses are the same rows, summed per sequence
    assert abs(float(per_seq.double().mean()) - float(loss)) < 1e-5


def test_lean_recompute_skips_attention_and_keeps_the_bits(monkeypatch):
    """The lean plan recomputes a layer's forward before its backward but not its attention:
    the forward holds each layer's (o, lse) (``model.lean_entry``). Attention's forward runs
    once per layer, not twice, and the loss and every gradient are the resident plan's bits
    (``lean:0`` and with one layer kept). The recompute uses the core as given: another
    layer's changes the gradients."""
    from open1b_train import model
    cfg = dataclasses.replace(micro().model, vocab=300, n_layers=3)
    params = init_params(cfg, 5)
    ids = torch.randint(0, cfg.vocab, (2, 33), generator=torch.Generator().manual_seed(2))
    calls = []
    real = model.attention_forward
    monkeypatch.setattr(model, "attention_forward",
                        lambda *a, **k: calls.append(1) or real(*a, **k))

    def run(lean, kept=frozenset()):
        calls.clear()
        loss, _, grads = forward_backward(cfg, params, ids[:, :-1], ids[:, 1:], lean=lean,
                                          kept=kept)
        return loss, dict(grads), len(calls)

    loss, grads, n = run(False)
    assert n == cfg.n_layers
    for kept in (frozenset(), frozenset({1})):
        l2, g2, n2 = run(True, kept)
        assert n2 == cfg.n_layers                       # no attention forward recomputed
        assert torch.equal(l2, loss) and grads.keys() == g2.keys()
        assert all(torch.equal(grads[k], g2[k]) for k in grads)
    # the core really is what the backward uses: every layer handed layer 0's
    entry, first = model.lean_entry, []

    def stale(x_in, saved):
        first.append(entry(x_in, saved))
        return (x_in, *first[0][1:])

    monkeypatch.setattr(model, "lean_entry", stale)
    _, g3, _ = run(True)
    assert not torch.equal(g3["layers.2.attn.q.weight"], grads["layers.2.attn.q.weight"])
