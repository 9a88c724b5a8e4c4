"""The model's parameters: names, shapes, dtypes, weight-decay groups, init, flat layout.

Model order (the order of every list, flat buffer and reduction over parameters)::

    embed.weight                      (V, D)   bf16  no decay   truncated normal
    embed_norm.gain                   (D,)     bf16  no decay   ones
    layers.{i}.attn_norm.gain         (D,)     bf16  no decay   ones
    layers.{i}.attn.{q,k,v,o}.weight  (N, K)   bf16  decay      truncated normal
    layers.{i}.attn.{q,k,v,o}.step    (1,)     fp32  no decay   LSQ activation step
    layers.{i}.mlp_norm.gain          (D,)     bf16  no decay   ones
    layers.{i}.mlp.{gate_up,down}.weight       bf16  decay      truncated normal
    layers.{i}.mlp.{gate_up,down}.step (1,)    fp32  no decay   LSQ activation step
    final_norm.gain                   (D,)     bf16  no decay   ones
    lm_head.weight                    (V, D)   bf16  decay      truncated normal

(within a layer: attn_norm, q.weight, q.step, k.weight, k.step, v..., o..., mlp_norm,
gate_up.weight, gate_up.step, down.weight, down.step). Weight decay follows the Open-1B
recipe: linear layers and the LM head decay; the input embedding, norm gains and LSQ steps
do not. (RoPE has no parameters: its tables are computed.)

Init (bit-exact on every backend, ``open1b_kernels.ops.philox``): every truncated-normal tensor draws
``truncated_normal(seed, stream, shape, std=init_std)`` (mean 0, +-2 sigma, no depth
scaling) rounded once to bf16, where ``stream = stream_of(name)`` = the first four bytes of
SHA-256(name as UTF-8) read as a little-endian uint32 - so a tensor's values depend only on
(seed, its name, its shape), never on the order of creation or on other tensors. Norm gains
are 1.0. LSQ activation steps start at ``2 E|x| / sqrt(127)`` for the input each linear
sees: 0.125 for q/k/v/gate_up (unit-RMS inputs after RMSNorm: 2 sqrt(2/pi) / sqrt(127) =
0.1416, rounded down to a power of two) and 0.03125 for o and down (attention and SwiGLU
outputs, measured at init on the demo preset at roughly a quarter of that scale); they are
trained. Weight steps are not parameters: the linear re-pins them from the weights at every
call (``open1b_kernels.int8.linear``).

``Layout`` places every parameter in one flat float32 index space (model order) for the
gradient, the Adam moments and their reductions.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from open1b_kernels.ops.philox import truncated_normal
from open1b_train.config import LSQ_INIT_INNER, LSQ_INIT_NORMED, ModelConfig
from open1b_train.errors import ConfigError

ATTN = ("q", "k", "v", "o")
MLP = ("gate_up", "down")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    decay: bool
    init: str          # "normal", "ones" or "step:<value>"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of every linear of a block."""
    d, hd = cfg.d_model, cfg.head_dim
    return {"q": (cfg.n_heads * hd, d), "k": (cfg.n_kv_heads * hd, d),
            "v": (cfg.n_kv_heads * hd, d), "o": (d, cfg.n_heads * hd),
            "gate_up": (2 * cfg.ffn, d), "down": (d, cfg.ffn)}


def param_specs(cfg: ModelConfig) -> list[ParamSpec]:
    """Every parameter in model order (see the module docstring)."""
    if cfg.vocab < 1:
        raise ConfigError("model.vocab is 0 (take it from the mix): resolve it first")
    bf, f32 = torch.bfloat16, torch.float32
    d = cfg.d_model
    out = [ParamSpec("embed.weight", (cfg.vocab, d), bf, False, "normal"),
           ParamSpec("embed_norm.gain", (d,), bf, False, "ones")]
    shapes = linear_shapes(cfg)
    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        out.append(ParamSpec(f"{p}.attn_norm.gain", (d,), bf, False, "ones"))
        for name in ATTN:
            out.append(ParamSpec(f"{p}.attn.{name}.weight", shapes[name], bf, True, "normal"))
            step = LSQ_INIT_INNER if name == "o" else LSQ_INIT_NORMED
            out.append(ParamSpec(f"{p}.attn.{name}.step", (1,), f32, False, f"step:{step}"))
        out.append(ParamSpec(f"{p}.mlp_norm.gain", (d,), bf, False, "ones"))
        for name in MLP:
            out.append(ParamSpec(f"{p}.mlp.{name}.weight", shapes[name], bf, True, "normal"))
            step = LSQ_INIT_INNER if name == "down" else LSQ_INIT_NORMED
            out.append(ParamSpec(f"{p}.mlp.{name}.step", (1,), f32, False, f"step:{step}"))
    out.append(ParamSpec("final_norm.gain", (d,), bf, False, "ones"))
    out.append(ParamSpec("lm_head.weight", (cfg.vocab, d), bf, True, "normal"))
    return out


def stream_of(name: str) -> int:
    """The Philox stream of parameter ``name``: SHA-256(name)[:4] as a little-endian uint32."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "little")


def count(cfg: ModelConfig) -> dict[str, int]:
    """Parameter counts: total, embedding (input embedding + LM head), non-embedding."""
    specs = param_specs(cfg)
    total = sum(s.numel for s in specs)
    emb = sum(s.numel for s in specs if s.name in ("embed.weight", "lm_head.weight"))
    return {"total": total, "embedding": emb, "non_embedding": total - emb}


def init_params(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu"
                ) -> dict[str, torch.Tensor]:
    """Fresh parameters (model order) from ``seed``; see the module docstring."""
    specs = param_specs(cfg)
    streams = [stream_of(s.name) for s in specs]
    if len(set(streams)) != len(streams):    # would correlate two tensors' init
        raise ConfigError("two parameter names share a Philox stream; rename one")
    out: dict[str, torch.Tensor] = {}
    for s, stream in zip(specs, streams):
        if s.init == "normal":
            t = truncated_normal(seed, stream, s.shape, std=cfg.init_std, device=device)
            out[s.name] = t.to(s.dtype)
        elif s.init == "ones":
            out[s.name] = torch.ones(s.shape, dtype=s.dtype, device=device)
        else:
            out[s.name] = torch.full(s.shape, float(s.init.split(":")[1]), dtype=s.dtype,
                                     device=device)
    return out


ALIGN = 4096   # every parameter starts at a multiple of this in the flat index space


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    numel: int
    shape: tuple[int, ...]


class Layout:
    """Every parameter's place in one flat float32 index space, in model order.

    Each parameter starts at a multiple of ``ALIGN`` (4,096); the gaps are zeros and stay
    zero. The flat gradient, the Adam moments and their reductions live in this space, so
    a sum over the whole flat vector (the global gradient norm: a pairwise tree) is also a
    tree over aligned 4,096-element chunk partials - which is how a sharded run computes
    it with the same bits. ``shards(S)`` cuts the parameter list into S contiguous groups
    of whole parameters (the logical shard dimension owns one group each).
    """

    def __init__(self, specs: list[ParamSpec]) -> None:
        self.specs = specs
        self.slots: list[Slot] = []
        off = 0
        for s in specs:
            self.slots.append(Slot(s.name, off, s.numel, s.shape))
            off += -(-s.numel // ALIGN) * ALIGN
        self.numel = off
        self.by_name = {s.name: s for s in self.slots}

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views of a flat buffer (no copies)."""
        return {s.name: flat[s.offset:s.offset + s.numel].view(s.shape) for s in self.slots}

    def zeros(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros(self.numel, dtype=torch.float32, device=device)

    def shards(self, n: int) -> list[tuple[int, int]]:
        """``n`` contiguous groups of whole parameters as flat ranges [start, end), balanced
        by size: group j ends at the first parameter boundary at or past j/n of the total
        (a group may be empty when one parameter outweighs the rest)."""
        if n < 1:
            raise ValueError(f"need >= 1 shards, got {n}")
        ends = [s.offset + -(-s.numel // ALIGN) * ALIGN for s in self.slots]
        out, start = [], 0
        for j in range(1, n + 1):
            target = self.numel * j // n
            end = next((e for e in ends if e >= target), self.numel) if j < n else self.numel
            end = max(end, start)
            out.append((start, end))
            start = end
        return out

    def names_in(self, start: int, end: int) -> list[str]:
        """Parameters whose slot lies in the flat range [start, end)."""
        return [s.name for s in self.slots if start <= s.offset < end]
