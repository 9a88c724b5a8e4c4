"""Autograd wrappers of the kernels' explicit forward/backward pairs, for tests only: the
model writes its backward out op by op (``open1b_train.model``), so production never goes
through autograd. The tests use these to compare an op's gradients with a float64
autograd reference, and ``testkit/kernels/block.py`` to compose a block.
"""
from __future__ import annotations

import torch

from open1b_kernels.attention.backward import attention_backward
from open1b_kernels.attention.forward import attention_forward
from open1b_kernels.core.backend import use_triton
from open1b_kernels.int8.linear import (linear_int8_backward, linear_int8_forward,
                                 linear_int8_forward_cpu)
from open1b_kernels.ops.embedding import embedding_bwd, embedding_fwd
from open1b_kernels.ops.lmhead import SLICES, lmhead_backward, lmhead_forward
from open1b_kernels.ops.rmsnorm import EPS, rmsnorm_bwd, rmsnorm_fwd
from open1b_kernels.ops.rope import THETA, rope_bwd, rope_fwd
from open1b_kernels.ops.swiglu import swiglu_bwd, swiglu_fwd
from open1b_kernels.ops.xent import xent_backward, xent_forward


class AttentionFunction(torch.autograd.Function):
    """Autograd wrapper: forward saves (q, k, v, out, lse); backward is ``attention_backward``."""

    @staticmethod
    def forward(ctx, q, k, v, window):
        out, lse = attention_forward(q, k, v, window)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.window = window
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(
            q, k, v, out, lse, dout.to(torch.bfloat16).contiguous(), ctx.window
        )
        return dq, dk, dv, None


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None
) -> torch.Tensor:
    """Differentiable causal (sliding-window) GQA attention, bf16 in and out."""
    return AttentionFunction.apply(q, k, v, window)


class EmbeddingFn(torch.autograd.Function):
    """Autograd wrapper; dW is float32 (autograd casts it to W's dtype)."""

    @staticmethod
    def forward(ctx, weight, ids):
        ctx.save_for_backward(ids)
        ctx.vocab = weight.shape[0]
        return embedding_fwd(weight, ids)

    @staticmethod
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        return embedding_bwd(dy, ids, ctx.vocab), None


def embedding(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Embedding lookup (differentiable in ``weight``)."""
    return EmbeddingFn.apply(weight, ids)


class LinearInt8Function(torch.autograd.Function):
    """autograd wrapper: ``LinearInt8Function.apply(x (..., K), w (N, K), s_x)``."""

    @staticmethod
    def forward(ctx, x, w, s_x):
        x2 = x.reshape(-1, x.shape[-1])
        if use_triton(x2):
            y, codes = linear_int8_forward(x2, w, s_x), ()
        else:  # keep the CPU forward's codes: the backward needs the same ones
            y, codes = linear_int8_forward_cpu(x2, w, s_x)
        ctx.save_for_backward(x, w, s_x, *codes)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, w, s_x, *codes = ctx.saved_tensors
        # dw straight in w's dtype: the rounding autograd would apply, minus a copy
        dx, dw, ds = linear_int8_backward(dy.reshape(-1, w.shape[0]), x.reshape(-1, x.shape[-1]),
                                          w, s_x, tuple(codes) or None, dw_dtype=w.dtype)
        return dx.reshape(x.shape), dw, ds


def linear_int8(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """Differentiable W8A8 linear: x (..., K) bf16, w (N, K) bf16, s_x (1,) float32."""
    return LinearInt8Function.apply(x, w, s_x)


class LMHeadFunction(torch.autograd.Function):
    """autograd wrapper: ``LMHeadFunction.apply(h (..., K), w (V, K), slices)`` -> fp32 logits.

    autograd casts dh and dw to the dtypes of h and w (bf16: one more RNE rounding); call
    ``lmhead_backward`` for the fp32 gradients.
    """

    @staticmethod
    def forward(ctx, h, w, slices=SLICES):
        ctx.save_for_backward(h, w)
        ctx.slices = slices
        y = lmhead_forward(h.reshape(-1, h.shape[-1]), w, slices)
        return y.reshape(*h.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dlogits):
        h, w = ctx.saved_tensors
        dh, dw = lmhead_backward(dlogits.reshape(-1, w.shape[0]), h.reshape(-1, h.shape[-1]), w,
                                 ctx.slices)
        return dh.reshape(h.shape), dw, None


def lmhead(h: torch.Tensor, w: torch.Tensor, slices: int = SLICES) -> torch.Tensor:
    """Differentiable LM head: fp32 logits of bf16 ``h`` and ``w``."""
    return LMHeadFunction.apply(h, w, slices)


class RMSNormFn(torch.autograd.Function):
    """Autograd wrapper; the gain gradient is float32 (autograd casts it to gain.dtype)."""

    @staticmethod
    def forward(ctx, x, gain, eps):
        y, rstd = rmsnorm_fwd(x, gain, eps)
        ctx.save_for_backward(x, gain, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, gain, rstd = ctx.saved_tensors
        dx, dgain = rmsnorm_bwd(dy, x, gain, rstd)
        return dx, dgain, None


def rmsnorm(x: torch.Tensor, gain: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """RMSNorm with gain over the last dimension (differentiable)."""
    return RMSNormFn.apply(x, gain, eps)


def qk_norm(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Gain-free RMSNorm over the last dimension (per head: x is (..., heads, head_dim))."""
    return RMSNormFn.apply(x, None, eps)


class RoPEFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, theta):
        ctx.theta = theta
        return rope_fwd(x, theta)

    @staticmethod
    def backward(ctx, dy):
        return rope_bwd(dy, ctx.theta), None


def rope(x: torch.Tensor, theta: float = THETA) -> torch.Tensor:
    """RoPE on (..., T, H, D) (differentiable)."""
    return RoPEFn.apply(x, theta)


class SwiGLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return swiglu_fwd(h)

    @staticmethod
    def backward(ctx, dy):
        (h,) = ctx.saved_tensors
        return swiglu_bwd(dy, h)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up on the fused gate|up tensor (differentiable)."""
    return SwiGLUFn.apply(h)


class XentFunction(torch.autograd.Function):
    """autograd wrapper: ``XentFunction.apply(logits, targets)`` -> (loss, lse)."""

    @staticmethod
    def forward(ctx, x, t):
        loss, lse = xent_forward(x, t)
        ctx.save_for_backward(x, t, lse)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, dloss, _dlse):
        x, t, lse = ctx.saved_tensors
        return xent_backward(dloss, x, t, lse), None


def xent(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable fused cross-entropy + z-loss: (loss, lse)."""
    return XentFunction.apply(x, t)
