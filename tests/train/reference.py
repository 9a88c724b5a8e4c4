"""An independent float64 reference of the Open-1B forward (no kernels): written from the
architecture's description, not from open1b_train.model, so that a mistake in the
composition (norm placement, RoPE pairing, the window per layer, GQA head mapping, SwiGLU
halves, the z-loss, the quantizers) shows up as a disagreement.

The W8A8 projections are simulated in float64 (``quantized=True``): activations round to
``clamp(round(x / s), -127, 127) * s`` with the layer's step s, weights likewise per
output channel with step ``2 * mean|w| / sqrt(127)``; everything else is exact float64. The
model itself additionally rounds activations to bf16 and quantizes P V to int8, which is
what the test's tolerance covers."""
from __future__ import annotations

import math

import torch

from open1b_train.config import ModelConfig

F64 = torch.float64


def _rms(x: torch.Tensor, gain: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if gain is None else y * gain


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """(B, S, H, D): pairs (i, i + D/2) rotated by position * theta^(-2i/D)."""
    s, d = x.shape[1], x.shape[-1]
    i = torch.arange(d // 2, dtype=F64)
    ang = torch.arange(s, dtype=F64)[:, None] * theta ** (-2 * i / d)[None, :]
    c, sn = torch.cos(ang)[None, :, None, :], torch.sin(ang)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], -1)


def _attention(q, k, v, window: int | None) -> torch.Tensor:
    """q (B, S, Hq, D), k/v (B, S, Hkv, D): causal softmax attention, query head h reads
    KV head h // (Hq / Hkv); key j visible to query i iff j <= i (and j > i - window)."""
    b, s, hq, d = q.shape
    group = hq // k.shape[2]
    out = torch.empty_like(q)
    i = torch.arange(s)
    vis = i[None, :] <= i[:, None]
    if window is not None:
        vis &= i[None, :] > i[:, None] - window
    for h in range(hq):
        sc = q[:, :, h] @ k[:, :, h // group].transpose(1, 2) / math.sqrt(d)
        sc = sc.masked_fill(~vis, float("-inf"))
        out[:, :, h] = torch.softmax(sc, -1) @ v[:, :, h // group]
    return out


def _fake_quant(x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(x / step), -127, 127) * step


def _linear(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, quantized: bool) -> torch.Tensor:
    if not quantized:
        return x @ w.T
    sw = 2 * w.abs().mean(1, keepdim=True) / math.sqrt(127)
    return _fake_quant(x, s) @ _fake_quant(w, sw).T


def forward(cfg: ModelConfig, params: dict[str, torch.Tensor], ids: torch.Tensor,
            labels: torch.Tensor, quantized: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss incl. z-loss 1e-4, logits (B*S, V)) in float64."""
    p = {k: t.to(F64) for k, t in params.items()}

    def lin(x, name):
        return _linear(x, p[f"{name}.weight"], p[f"{name}.step"], quantized)

    b, s = ids.shape
    x = _rms(p["embed.weight"][ids], p["embed_norm.gain"], cfg.eps)
    for li in range(cfg.n_layers):
        pre = f"layers.{li}"
        xn = _rms(x, p[f"{pre}.attn_norm.gain"], cfg.eps)
        q = lin(xn, f"{pre}.attn.q").view(b, s, cfg.n_heads, cfg.head_dim)
        k = lin(xn, f"{pre}.attn.k").view(b, s, cfg.n_kv_heads, cfg.head_dim)
        v = lin(xn, f"{pre}.attn.v").view(b, s, cfg.n_kv_heads, cfg.head_dim)
        q, k = _rope(_rms(q, None, cfg.eps), cfg.theta), _rope(_rms(k, None, cfg.eps), cfg.theta)
        window = None if (li + 1) % cfg.full_every == 0 or li == cfg.n_layers - 1 else cfg.window
        o = _attention(q, k, v, window).reshape(b, s, -1)
        h = x + lin(o, f"{pre}.attn.o")
        gu = lin(_rms(h, p[f"{pre}.mlp_norm.gain"], cfg.eps), f"{pre}.mlp.gate_up")
        g, u = gu[..., : cfg.ffn], gu[..., cfg.ffn:]
        x = h + lin(g * torch.sigmoid(g) * u, f"{pre}.mlp.down")
    logits = (_rms(x, p["final_norm.gain"], cfg.eps) @ p["lm_head.weight"].T).reshape(b * s, -1)
    lse = torch.logsumexp(logits, -1)
    rows = lse - logits.gather(1, labels.reshape(-1, 1))[:, 0] + 1e-4 * lse * lse
    return rows.mean(), logits
