"""The stock PyTorch anchor: the same architecture as ``open1b_train.model`` the usual way.

bf16 ``nn.Linear`` weights (no quantization), ``torch.nn.functional.scaled_dot_product_attention``
(GQA by repeating KV heads; a boolean sliding-window mask on the windowed layers), RMSNorm,
RoPE (rotate-half, same theta), SwiGLU on the fused gate|up projection, untied LM head,
cross-entropy + z-loss 1e-4 in float32, autograd, and ``torch.optim.AdamW`` (fused where
the device supports it) with the same betas, eps, weight decay groups, clipping and LR.
It starts from exactly the same initial weights (``load_from``) and sees the same windows,
so loss curves compare like for like. Not bit-exact anywhere (that is the point of the
anchor): it measures what a user would get from stock PyTorch.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from open1b_train.config import ModelConfig

Z_LOSS = 1e-4


def _rms(x: torch.Tensor, gain: torch.Tensor | None, eps: float) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if gain is not None:
        y = y * gain.float()
    return y.to(x.dtype)


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """(B, S, H, D) rotate-half RoPE, positions 0..S-1."""
    s, d = x.shape[1], x.shape[-1]
    inv = theta ** (-torch.arange(0, d // 2, dtype=torch.float32, device=x.device) * 2 / d)
    ang = torch.arange(s, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, window: int | None) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.cfg, self.window = cfg, window
        self.attn_norm = nn.Parameter(torch.ones(d, dtype=torch.bfloat16))
        self.mlp_norm = nn.Parameter(torch.ones(d, dtype=torch.bfloat16))
        lin = lambda i, o: nn.Linear(i, o, bias=False, dtype=torch.bfloat16)  # noqa: E731
        self.q, self.k = lin(d, cfg.n_heads * hd), lin(d, cfg.n_kv_heads * hd)
        self.v, self.o = lin(d, cfg.n_kv_heads * hd), lin(cfg.n_heads * hd, d)
        self.gate_up, self.down = lin(d, 2 * cfg.ffn), lin(cfg.ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        b, s, _ = x.shape
        xn = _rms(x, self.attn_norm, c.eps)
        q = self.q(xn).view(b, s, c.n_heads, c.head_dim)
        k = self.k(xn).view(b, s, c.n_kv_heads, c.head_dim)
        v = self.v(xn).view(b, s, c.n_kv_heads, c.head_dim)
        q = _rope(_rms(q, None, c.eps), c.theta).transpose(1, 2)
        k = _rope(_rms(k, None, c.eps), c.theta).transpose(1, 2)
        v = v.transpose(1, 2)
        rep = c.n_heads // c.n_kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        if self.window is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            i = torch.arange(s, device=x.device)
            mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - self.window)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = x + self.o(o.transpose(1, 2).reshape(b, s, -1))
        gu = self.gate_up(_rms(h, self.mlp_norm, c.eps))
        g, u = gu.chunk(2, -1)
        return h + self.down(F.silu(g) * u)


class StockModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model, dtype=torch.bfloat16)
        self.embed_norm = nn.Parameter(torch.ones(cfg.d_model, dtype=torch.bfloat16))
        self.layers = nn.ModuleList(Block(cfg, cfg.layer_window(i)) for i in range(cfg.n_layers))
        self.final_norm = nn.Parameter(torch.ones(cfg.d_model, dtype=torch.bfloat16))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False, dtype=torch.bfloat16)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = _rms(self.embed(ids), self.embed_norm, self.cfg.eps)
        for blk in self.layers:
            x = blk(x)
        logits = self.lm_head(_rms(x, self.final_norm, self.cfg.eps)).float()
        flat = logits.reshape(-1, logits.shape[-1])
        lse = torch.logsumexp(flat, -1)
        return F.cross_entropy(flat, labels.reshape(-1)) + Z_LOSS * (lse * lse).mean()

    def load_from(self, params: dict[str, torch.Tensor]) -> None:
        """Copy ``open1b_train`` parameters (same names up to layout); LSQ steps have no
        counterpart (no quantization here)."""
        own = {"embed.weight": self.embed.weight, "embed_norm.gain": self.embed_norm,
               "final_norm.gain": self.final_norm, "lm_head.weight": self.lm_head.weight}
        for i, blk in enumerate(self.layers):
            p = f"layers.{i}"
            own[f"{p}.attn_norm.gain"], own[f"{p}.mlp_norm.gain"] = blk.attn_norm, blk.mlp_norm
            for n in ("q", "k", "v", "o"):
                own[f"{p}.attn.{n}.weight"] = getattr(blk, n).weight
            for n in ("gate_up", "down"):
                own[f"{p}.mlp.{n}.weight"] = getattr(blk, n).weight
        with torch.no_grad():
            for name, t in own.items():
                t.copy_(params[name])

    def param_groups(self, weight_decay: float) -> list[dict]:
        decay = [m.weight for blk in self.layers for m in
                 (blk.q, blk.k, blk.v, blk.o, blk.gate_up, blk.down)] + [self.lm_head.weight]
        ids = {id(t) for t in decay}
        rest = [t for t in self.parameters() if id(t) not in ids]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": rest, "weight_decay": 0.0}]


def optimizer(model: StockModel, lr: float, betas=(0.9, 0.95), eps=1e-8,
              weight_decay=0.1) -> torch.optim.AdamW:
    fused = next(model.parameters()).is_cuda
    return torch.optim.AdamW(model.param_groups(weight_decay), lr=lr, betas=betas, eps=eps,
                             fused=fused or None)


def train_step(model: StockModel, opt: torch.optim.AdamW, micro_batches, lr: float,
               clip: float = 1.0) -> tuple[float, float]:
    """One optimizer step over ``micro_batches`` [(ids, labels)]: (mean loss, pre-clip norm)."""
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for ids, labels in micro_batches:
        loss = model(ids, labels) / len(micro_batches)
        loss.backward()
        total += float(loss.detach())
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return total, norm if math.isfinite(norm) else float("nan")
