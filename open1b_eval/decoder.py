"""The trained model's inference forward on the reproducible runtime: a full-sequence
forward (prefill, scoring) and one-token decoding against a KV cache.

Built from the same ``kernels`` ops, in the same order and with the same roundings, as the
forward half of ``open1b_train.model.forward_backward`` (see that module's docstring):

    x = RMSNorm(Embed(ids)); per layer h = x + Attn(RMSNorm(x)), x = h + MLP(RMSNorm(h));
    logits = LMHead(RMSNorm(x))                                      fp32 (tokens, V)

What is equal, bit for bit (tests/eval/test_decoder.py):

* ``forward(ids)`` gives the logits the training forward computes for the same (B, S)
  batch (its ``lm_head.fwd`` trace);
* ``decode`` of the token at position p (after a prefill of positions 0 .. p-1 and decodes
  in between) gives the logits of row p of ``forward`` of the sequence 0 .. p: every op is
  per token row (embedding, RMSNorm, W8A8 linears with per-tensor activation steps and
  weight steps re-pinned from the weights, SwiGLU, the exact LM head) except RoPE and
  attention, whose decoding forms (``open1b_kernels.ops.rope_at``, ``open1b_kernels.attention.decode``)
  replay the full-sequence arithmetic for that row;
* so a sequence's logits do not depend on the batch it is decoded in, on the thread
  count, or on the backend (CPU reference or Triton).

The W8A8 linears keep their int8 weight codes and steps (``weight_codes``) instead of
re-deriving them at every call: the same values, computed once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from open1b_kernels.attention.forward import attention_forward
from open1b_kernels.attention.decode import attention_decode
from open1b_kernels.core.backend import use_triton
from open1b_kernels.ops.embedding import embedding_fwd
from open1b_kernels.int8.gemm import int8_mm, int8_mm_cpu
from open1b_kernels.int8.linear import weight_codes_cpu, weight_step
from open1b_kernels.ops.lmhead import lmhead_forward
from open1b_kernels.int8.quantize import quantize, quantize_cpu
from open1b_kernels.ops.rmsnorm import rmsnorm_fwd
from open1b_kernels.ops.rope import MAX_T, rope_fwd
from open1b_kernels.ops.rope_at import rope_at
from open1b_kernels.ops.swiglu import swiglu_fwd
from open1b_train.config import ModelConfig
from open1b_train.model import add_bf16
from open1b_train.params import ATTN, MLP

BF16 = torch.bfloat16


class _Linear:
    """One W8A8 linear with its weight codes computed once: y = dequant(q_x @ q_w^T)."""

    def __init__(self, w: torch.Tensor, step: torch.Tensor) -> None:
        self.sx = step.reshape(1).to(torch.float32)
        if use_triton(w):
            self.sw = weight_step(w)
            self.qw = quantize(w, self.sw)
        else:
            self.qw, self.sw, _ = weight_codes_cpu(w)

    def __call__(self, x2: torch.Tensor) -> torch.Tensor:
        if use_triton(x2):
            return int8_mm(quantize(x2, self.sx), self.qw, self.sx, self.sw, BF16)
        return int8_mm_cpu(quantize_cpu(x2, self.sx), self.qw, self.sx, self.sw, BF16)


@dataclass
class KVCache:
    """Per layer k (post QK-norm and RoPE) and v, each (B, Hkv, capacity, head_dim) bf16."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]


class Decoder:
    """The inference forward of one set of parameters (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, params: dict[str, torch.Tensor]) -> None:
        self.cfg = cfg
        self.p = params
        # weight codes are computed under the backend in force now
        self.lin = {f"layers.{i}.{grp}.{n}": _Linear(params[f"layers.{i}.{grp}.{n}.weight"],
                                                     params[f"layers.{i}.{grp}.{n}.step"])
                    for i in range(cfg.n_layers)
                    for grp, names in (("attn", ATTN), ("mlp", MLP)) for n in names}
        self.device = params["embed.weight"].device

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        if not 1 <= capacity <= MAX_T:
            raise ValueError(f"a cache holds 1 .. {MAX_T} positions (RoPE's domain), got "
                             f"{capacity}")
        c = self.cfg
        shape = (batch, c.n_kv_heads, capacity, c.head_dim)
        z = lambda: torch.zeros(shape, dtype=BF16, device=self.device)  # noqa: E731
        return KVCache([z() for _ in range(c.n_layers)], [z() for _ in range(c.n_layers)])

    # ------------------------------------------------------------------ blocks
    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        d = h.shape[-1]
        hn, _ = rmsnorm_fwd(h, self.p[f"layers.{i}.mlp_norm.gain"], c.eps)
        gu = self.lin[f"layers.{i}.mlp.gate_up"](hn.reshape(-1, d))
        return self.lin[f"layers.{i}.mlp.down"](swiglu_fwd(gu)).reshape(h.shape)

    def _qkv(self, i: int, x: torch.Tensor):
        """q, k, v (B, S, H, hd); q and k QK-normed (gain-free), not yet rotated."""
        c = self.cfg
        b, s, d = x.shape
        xn, _ = rmsnorm_fwd(x, self.p[f"layers.{i}.attn_norm.gain"], c.eps)
        x2 = xn.reshape(b * s, d)
        out = []
        for name, nh in (("q", c.n_heads), ("k", c.n_kv_heads), ("v", c.n_kv_heads)):
            y = self.lin[f"layers.{i}.attn.{name}"](x2).reshape(b, s, nh, c.head_dim)
            out.append(rmsnorm_fwd(y, None, c.eps)[0] if name != "v" else y)
        return out

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = embedding_fwd(self.p["embed.weight"], ids)                         # (B, S, D)
        return rmsnorm_fwd(e, self.p["embed_norm.gain"], self.cfg.eps)[0]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        xf, _ = rmsnorm_fwd(x, self.p["final_norm.gain"], self.cfg.eps)
        return lmhead_forward(xf.reshape(-1, x.shape[-1]), self.p["lm_head.weight"],
                              self.cfg.lmhead_slices)

    # ------------------------------------------------------------------ entry points
    def forward(self, ids: torch.Tensor, cache: KVCache | None = None, row: int = 0
                ) -> torch.Tensor:
        """fp32 logits (B, S, V) of token ids (B, S) at positions 0 .. S-1; with ``cache``
        (and B = 1) the keys and values are also written to its batch row ``row``."""
        c = self.cfg
        b, s = ids.shape
        if s > MAX_T:
            raise ValueError(f"sequences hold at most {MAX_T} tokens, got {s}")
        x = self._embed(ids)
        for i in range(c.n_layers):
            q, k, v = self._qkv(i, x)
            qt = rope_fwd(q, c.theta).transpose(1, 2).contiguous()            # (B, H, S, hd)
            kt = rope_fwd(k, c.theta).transpose(1, 2).contiguous()
            vt = v.transpose(1, 2).contiguous()
            if cache is not None:
                cache.k[i][row, :, :s] = kt[0]
                cache.v[i][row, :, :s] = vt[0]
            o, _ = attention_forward(qt, kt, vt, c.layer_window(i))           # (B, H, S, hd)
            o2 = o.transpose(1, 2).reshape(b * s, c.n_heads * c.head_dim)
            h = add_bf16(x, self.lin[f"layers.{i}.attn.o"](o2).reshape(b, s, -1))
            x = add_bf16(h, self._mlp(i, h))
        return self._logits(x).reshape(b, s, -1)

    def decode(self, cache: KVCache, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """fp32 logits (B, V) of token ids[b] at position pos[b] of sequence b, whose
        positions 0 .. pos[b]-1 are in the cache; writes its keys and values there."""
        c = self.cfg
        b = ids.shape[0]
        if int(pos.max()) >= cache.capacity:
            raise ValueError(f"position {int(pos.max())} is past the cache's capacity "
                             f"{cache.capacity}")
        rows = torch.arange(b, device=self.device)
        pos_d = pos.to(self.device)
        x = self._embed(ids.reshape(b, 1))                                    # (B, 1, D)
        for i in range(c.n_layers):
            q, k, v = self._qkv(i, x)                                         # (B, 1, H, hd)
            q = rope_at(q[:, 0], pos_d, c.theta)                              # (B, Hq, hd)
            cache.k[i][rows, :, pos_d] = rope_at(k[:, 0], pos_d, c.theta)
            cache.v[i][rows, :, pos_d] = v[:, 0]
            o = attention_decode(q, cache.k[i], cache.v[i], pos_d, c.layer_window(i))
            a = self.lin[f"layers.{i}.attn.o"](o.reshape(b, c.n_heads * c.head_dim))
            h = add_bf16(x, a.reshape(b, 1, -1))
            x = add_bf16(h, self._mlp(i, h))
        return self._logits(x)
