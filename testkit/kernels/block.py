"""One Open-1B transformer block composed only from ``kernels`` ops (autograd wrappers).

    h   = x + Attn(RMSNorm(x))                  pre-norm, residual adds in float32 -> bf16 RNE
    out = h + MLP(RMSNorm(h))
    Attn: q, k, v = W8A8 linears; per-head gain-free QK-norm, then RoPE (theta 500,000);
          causal GQA attention with a sliding window; o = W8A8 linear.
    MLP:  one fused gate|up W8A8 linear (2F outputs), SwiGLU, down W8A8 linear.

Layout: x is (B, S, D) bf16. Every op is one of kernels' bit-exact ops, so the block gives
the same bits under ``force("cpu")`` and ``force("triton")``. The residual adds are
``bf16_rne(fp32(a) + fp32(b))``: bf16 -> fp32 is exact, one IEEE add, one RNE rounding
(plain torch ops, identical on every backend). Gradient accumulation at the residual
branches is autograd's bf16 add (fp32 add rounded once to bf16 on CPU and GPU alike).

Parameters (``init_params``): norm gains bf16 (D,), weights bf16 (N, K), one float32 (1,)
LSQ activation step per linear (``s_q``, ``s_k``, ...). Deterministic init from a seeded
``torch.Generator`` on the CPU (the init is not part of the bit contract across torch
versions; tests pin it through the golden hashes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from open1b_kernels.ops.philox import truncated_normal
from open1b_kernels.ops.rmsnorm import EPS
from open1b_kernels.ops.rope import THETA
from testkit.kernels.autograd import attention, linear_int8, qk_norm, rmsnorm, rope, swiglu

LINEARS = ("q", "k", "v", "o", "gate_up", "down")


@dataclass(frozen=True)
class BlockConfig:
    d_model: int = 2048
    n_heads: int = 16
    n_kv_heads: int = 4
    head_dim: int = 128
    ffn: int = 5632
    window: int | None = 4096
    theta: float = THETA
    eps: float = EPS

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} must be a multiple of n_kv_heads "
                             f"{self.n_kv_heads}")

    def weight_shapes(self) -> dict[str, tuple[int, int]]:
        d, hd = self.d_model, self.head_dim
        return {"q": (self.n_heads * hd, d), "k": (self.n_kv_heads * hd, d),
                "v": (self.n_kv_heads * hd, d), "o": (d, self.n_heads * hd),
                "gate_up": (2 * self.ffn, d), "down": (d, self.ffn)}


def init_params(cfg: BlockConfig, seed: int = 0, requires_grad: bool = True
                ) -> dict[str, torch.Tensor]:
    """Seeded parameters: ``w_<name>`` bf16, ``s_<name>`` float32 (1,), ``g_attn``/``g_mlp``.

    Drawn from the runtime's own Philox truncated normal (one stream per tensor), so the
    parameters - and the golden hashes built on them - do not depend on torch's RNG.
    """
    p: dict[str, torch.Tensor] = {}
    for stream, (name, (n, k)) in enumerate(cfg.weight_shapes().items()):
        w = truncated_normal(seed, stream, (n, k), std=1.0 / math.sqrt(k))
        p[f"w_{name}"] = w.to(torch.bfloat16)
        # LSQ step ~ 2 * E|x| / sqrt(127) for unit-RMS inputs (rounded to a short float)
        p[f"s_{name}"] = torch.tensor([0.125 if name in ("q", "k", "v", "gate_up") else 0.03125],
                                      dtype=torch.float32)
    for stream, name in enumerate(("g_attn", "g_mlp"), start=len(p)):
        p[name] = (1.0 + truncated_normal(seed, stream, (cfg.d_model,), std=0.1)).to(torch.bfloat16)
    if requires_grad:
        for t in p.values():
            t.requires_grad_(True)
    return p


def residual_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16_rne(fp32(a) + fp32(b)): one exactly specified IEEE add and rounding."""
    return (a.to(torch.float32) + b.to(torch.float32)).to(torch.bfloat16)


def attn_branch(cfg: BlockConfig, p: dict[str, torch.Tensor], xn: torch.Tensor) -> torch.Tensor:
    b, s, _ = xn.shape
    hd = cfg.head_dim
    q = linear_int8(xn, p["w_q"], p["s_q"]).reshape(b, s, cfg.n_heads, hd)
    k = linear_int8(xn, p["w_k"], p["s_k"]).reshape(b, s, cfg.n_kv_heads, hd)
    v = linear_int8(xn, p["w_v"], p["s_v"]).reshape(b, s, cfg.n_kv_heads, hd)
    q = rope(qk_norm(q, cfg.eps), cfg.theta)  # (B, S, H, D): RoPE's (..., T, H, D) layout
    k = rope(qk_norm(k, cfg.eps), cfg.theta)
    o = attention(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
                  v.transpose(1, 2).contiguous(), cfg.window)  # (B, H, S, D)
    o = o.transpose(1, 2).reshape(b, s, cfg.n_heads * hd)
    return linear_int8(o, p["w_o"], p["s_o"])


def mlp_branch(cfg: BlockConfig, p: dict[str, torch.Tensor], hn: torch.Tensor) -> torch.Tensor:
    gu = linear_int8(hn, p["w_gate_up"], p["s_gate_up"])
    return linear_int8(swiglu(gu), p["w_down"], p["s_down"])


def block_forward(cfg: BlockConfig, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """One pre-norm block on x (B, S, D) bf16 -> (B, S, D) bf16 (differentiable)."""
    if x.dtype != torch.bfloat16 or x.dim() != 3 or x.shape[-1] != cfg.d_model:
        raise ValueError(f"block needs x (B, S, {cfg.d_model}) bf16, got "
                         f"{tuple(x.shape)} {x.dtype}")
    h = residual_add(x, attn_branch(cfg, p, rmsnorm(x, p["g_attn"], cfg.eps)))
    return residual_add(h, mlp_branch(cfg, p, rmsnorm(h, p["g_mlp"], cfg.eps)))
