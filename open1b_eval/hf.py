"""Open-1B as a Hugging Face transformers model: ``model_type = "open1b"``.

Importing this module registers ``Open1bConfig`` with ``AutoConfig`` and
``Open1bForCausalLM`` with ``AutoModelForCausalLM``, so that after ``import
open1b_eval.hf`` a directory written by ``open1b-train export`` loads with
``AutoModelForCausalLM.from_pretrained(DIR)`` - the code comes from this installed
package, never from the directory (no ``trust_remote_code``).

The module is plain torch: float32 arithmetic (torch's own matmul, softmax, rsqrt, sin and
cos), with activations rounded to bf16 where the runtime rounds them (after every norm,
linear, RoPE, attention, SwiGLU and residual add), whatever ``torch_dtype`` it is loaded in.
The W8A8 linears are reproduced by fake quantization, not by dequantized weights: the
export stores each linear's bf16 weight, its per-output-channel weight step (the
runtime's ``weight_step``, bit-exact, as ``weight_scale``) and its trained LSQ activation
step (``act_step``); the forward uses the codes ``clamp(round(w / weight_scale))`` and
``clamp(round(x / act_step))`` exactly as the runtime, then ``(q_x @ q_w^T) * act_step *
weight_scale`` in float32 (a float GEMM of integer codes: exact while partial sums stay
below 2^24). What differs from the runtime: attention (float32 softmax and P V here,
fixed-point Q K^T and int8 P V there), the transcendental functions, RoPE tables, the
LM head (float32 GEMM vs the exact one) and summation orders - so the logits agree to a
measured tolerance, not bit for bit (docs/EVAL.md, tests/eval/test_hf.py).

It has no KV cache: each generated token recomputes the sequence (fine for the demo sizes;
use ``open1b-train generate`` for reproducible, cached decoding).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from transformers import (AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig,
                          PreTrainedModel)
from transformers.modeling_outputs import CausalLMOutputWithPast

F32, BF16 = torch.float32, torch.bfloat16


class Open1bConfig(PretrainedConfig):
    model_type = "open1b"

    def __init__(self, vocab_size: int = 128_256, hidden_size: int = 2048,
                 num_hidden_layers: int = 24, num_attention_heads: int = 16,
                 num_key_value_heads: int = 4, head_dim: int = 128,
                 intermediate_size: int = 5632, sliding_window: int = 512,
                 full_attention_layers: list[int] | None = None, rope_theta: float = 500_000.0,
                 rms_norm_eps: float = 1e-6, max_position_embeddings: int = 8192,
                 **kwargs) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.intermediate_size = intermediate_size
        self.sliding_window = sliding_window
        self.full_attention_layers = list(full_attention_layers or [num_hidden_layers - 1])
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


def _bf(x: torch.Tensor) -> torch.Tensor:
    """Round to bf16 (nearest even) and continue in float32."""
    return x.to(BF16).to(F32)


def _rms(x: torch.Tensor, gain: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    return _bf(y * gain.to(F32) if gain is not None else y)


class Open1bLinear(nn.Module):
    """W8A8 fake-quant linear (see the module docstring)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in, dtype=BF16))
        self.weight_scale = nn.Parameter(torch.ones(n_out, dtype=F32), requires_grad=False)
        self.act_step = nn.Parameter(torch.ones(1, dtype=F32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sw = self.weight_scale.to(F32)
        sx = self.act_step.to(F32)
        qw = torch.clamp(torch.round(self.weight.to(F32) / sw[:, None]), -127, 127)
        qx = torch.clamp(torch.round(x / sx), -127, 127)
        return _bf((qx @ qw.t()) * sx * sw)


class Open1bLayer(nn.Module):
    def __init__(self, c: Open1bConfig, i: int) -> None:
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.c = c
        self.window = None if i in c.full_attention_layers else c.sliding_window
        self.attn_norm = nn.Parameter(torch.ones(d, dtype=BF16))
        self.q = Open1bLinear(d, c.num_attention_heads * hd)
        self.k = Open1bLinear(d, c.num_key_value_heads * hd)
        self.v = Open1bLinear(d, c.num_key_value_heads * hd)
        self.o = Open1bLinear(c.num_attention_heads * hd, d)
        self.mlp_norm = nn.Parameter(torch.ones(d, dtype=BF16))
        self.gate_up = Open1bLinear(d, 2 * c.intermediate_size)
        self.down = Open1bLinear(c.intermediate_size, d)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:                       # (B, S, H, hd)
        s, hd = x.shape[1], x.shape[-1]
        inv = self.c.rope_theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
        ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = ang.cos().to(F32)[:, None, :], ang.sin().to(F32)[:, None, :]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return _bf(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.c
        b, s, _ = x.shape
        eps, hd = c.rms_norm_eps, c.head_dim
        xn = _rms(x, self.attn_norm, eps)
        q = self.q(xn).reshape(b, s, c.num_attention_heads, hd)                # (B, S, H, hd)
        k = self.k(xn).reshape(b, s, c.num_key_value_heads, hd)
        v = self.v(xn).reshape(b, s, c.num_key_value_heads, hd)
        q = self._rope(_rms(q, None, eps)).transpose(1, 2)                    # (B, H, S, hd)
        k = self._rope(_rms(k, None, eps)).transpose(1, 2)
        group = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(group, 1), v.transpose(1, 2).repeat_interleave(group, 1)
        i = torch.arange(s, device=x.device)
        vis = i[None, :] <= i[:, None]
        if self.window is not None:
            vis = vis & (i[None, :] > i[:, None] - self.window)
        sc = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        att = torch.softmax(sc.masked_fill(~vis, float("-inf")), -1)
        o = _bf(att @ v).transpose(1, 2).reshape(b, s, -1)                   # (B, S, H*hd)
        h = _bf(x + self.o(o))
        gu = self.gate_up(_rms(h, self.mlp_norm, eps))
        g, u = gu.chunk(2, -1)
        a = _bf(g * torch.sigmoid(g) * u)
        return _bf(h + self.down(a))


class Open1bForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = Open1bConfig
    base_model_prefix = "open1b"
    _no_split_modules = ["Open1bLayer"]

    def __init__(self, config: Open1bConfig) -> None:
        super().__init__(config)
        d = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, d, dtype=BF16)
        self.embed_norm = nn.Parameter(torch.ones(d, dtype=BF16))
        self.layers = nn.ModuleList(Open1bLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = nn.Parameter(torch.ones(d, dtype=BF16))
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False, dtype=BF16)
        self.post_init()

    def _init_weights(self, module) -> None:     # weights always come from a checkpoint
        pass

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids: torch.LongTensor, attention_mask=None, labels=None,
                **kwargs) -> CausalLMOutputWithPast:
        """Logits (B, S, V) float32 of ``input_ids``; left padding is not supported (the
        runtime's windows are packed, never padded): pass unpadded sequences."""
        eps = self.config.rms_norm_eps
        x = _rms(self.embed.weight[input_ids].to(F32), self.embed_norm, eps)
        for layer in self.layers:
            x = layer(x)
        xf = _rms(x, self.final_norm, eps)
        logits = xf @ self.lm_head.weight.to(F32).t()
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                               labels[:, 1:].reshape(-1))
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}           # no cache: the whole sequence each step

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False


AutoConfig.register("open1b", Open1bConfig, exist_ok=True)
AutoModelForCausalLM.register(Open1bConfig, Open1bForCausalLM, exist_ok=True)
