"""Training configuration: typed, frozen dataclasses, presets derived from one base.

``ModelConfig`` fixes the architecture, ``TrainConfig`` the run (model, seed, logical mesh,
optimizer, spike protocol, checkpointing, backend). Presets are small functions that derive
from the Open-1B base with ``dataclasses.replace``:

* ``open1b`` - the paper's shapes: 24 layers x 2,048, 16/4 heads of 128, SwiGLU 5,632,
  vocabulary 128,256, sliding window 512 with full causal attention on the layers listed by
  ``ModelConfig.full_layers`` (every 5th layer and the last: indices 4, 9, 14, 19, 23).
* ``demo`` - small enough to train on the demo mix on 2 CPU cores at a useful speed. Its
  LM head uses 2 int8 slices (``open1b_kernels.ops.lmhead``: 3 exact int8 GEMMs per product instead of
  6, accurate to ~5e-4 relative, about what bf16 logits cost) because at vocabulary 8,192
  and width 256 the LM head is most of a CPU step's work.
* ``micro`` - a few thousand parameters per matrix, for tests under the Triton interpreter.

The vocabulary of ``demo`` and ``micro`` is taken from the built mix (``vocab=0`` in the
preset means "the mix's tokenizer vocabulary"); ``open1b`` pins 128,256 and a mix with
another vocabulary is refused.

A config file (TOML) selects a preset and overrides fields::

    preset = "demo"
    seed = 7
    mesh = [2, 1]            # dp_replicate x dp_shard
    [model]
    n_layers = 2

Unknown fields, wrong types and out-of-range values fail with ``ConfigError`` naming the
field. ``TrainConfig.identity()`` is the part of a config that determines the bits of a run
(everything but ``steps``, ``checkpoint_every``, ``keep_checkpoints`` and ``backend``,
which change how far and how a run goes, never what it computes); resuming with another
identity is refused. ``eval_every`` (validation loss on the mix's held-out windows every N
steps, hashed into those steps' scalars) and ``eval_windows`` are part of the identity when
validation is on, and absent from ``to_dict`` (so from the identity) when it is off: a run
without validation has the identity it always had.
"""
from __future__ import annotations

import dataclasses
import difflib
import tomllib
from dataclasses import dataclass, field
from typing import Any

from open1b.canonical import sha256_json
from open1b_train.errors import ConfigError

LSQ_INIT_NORMED = 0.125     # activation step of q/k/v and gate_up (inputs are RMS-normalized)
LSQ_INIT_INNER = 0.03125    # activation step of o and down (attention / SwiGLU outputs)


@dataclass(frozen=True)
class ModelConfig:
    """The Open-1B architecture (see the module docstring for the full-causal layers)."""

    vocab: int = 128_256
    d_model: int = 2048
    n_layers: int = 24
    n_heads: int = 16
    n_kv_heads: int = 4
    head_dim: int = 128
    ffn: int = 5632
    window: int = 512            # sliding attention window (keys i-window+1 .. i)
    full_every: int = 5          # layer i is fully causal iff (i + 1) % full_every == 0 ...
    theta: float = 500_000.0     # RoPE base
    eps: float = 1e-6            # RMSNorm epsilon (all norms, QK-norm included)
    init_std: float = 0.02       # truncated normal, +-2 sigma, no depth scaling
    lmhead_slices: int = 3       # int8 slices of the exact bf16 LM-head GEMM (3 or 2)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn",
                     "window", "full_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"model.{name}: must be an integer >= 1, got {v!r}")
        if isinstance(self.vocab, bool) or not isinstance(self.vocab, int) or self.vocab < 0:
            raise ConfigError(f"model.vocab: must be an integer >= 0 (0 = the mix's), got "
                              f"{self.vocab!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_heads ({self.n_heads}) must be a multiple of "
                              f"model.n_kv_heads ({self.n_kv_heads})")
        hd = self.head_dim
        if hd < 16 or hd > 256 or hd & (hd - 1):
            raise ConfigError(f"model.head_dim: must be a power of two in [16, 256] (the "
                              f"attention kernel's tiles), got {hd}")
        if not (self.theta > 0 and self.eps > 0 and self.init_std > 0):
            raise ConfigError(f"model.theta, model.eps and model.init_std must be > 0, got "
                              f"{self.theta}, {self.eps}, {self.init_std}")
        if self.lmhead_slices not in (2, 3):
            raise ConfigError(f"model.lmhead_slices: must be 2 or 3, got {self.lmhead_slices}")

    @property
    def full_layers(self) -> tuple[int, ...]:
        """Indices (from 0) of the fully causal layers: every ``full_every``-th layer
        (i + 1 divisible by it) and the last layer; all others use the sliding window."""
        every = {i for i in range(self.n_layers) if (i + 1) % self.full_every == 0}
        return tuple(sorted(every | {self.n_layers - 1}))

    def layer_window(self, i: int) -> int | None:
        """The attention window of layer ``i``: None (fully causal) or ``window``."""
        return None if i in self.full_layers else self.window


@dataclass(frozen=True)
class TrainConfig:
    """One training run (see the module docstring)."""

    preset: str = "open1b"
    model: ModelConfig = field(default_factory=ModelConfig)
    seed: int | None = None          # None = the mix's seed (data order and init share it)
    mesh: tuple[int, int] = (1, 1)   # (dp_replicate, dp_shard): the logical mesh
    lr_scale: float = 1.0            # multiplies the mix schedule's learning rate
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.1
    clip: float = 1.0                # global L2 gradient clipping
    spike_threshold: float = 5.0     # pre-clip norm above this starts a skip
    spike_skip: int = 5              # optimizer updates skipped per spike (the spiking one too)
    inject_spike: tuple[int, ...] = ()   # steps whose reduced gradient is scaled by 1e4
    steps: int | None = None         # stop after this step (None = the schedule's last)
    checkpoint_every: int = 100
    keep_checkpoints: int = 0        # 0 = keep all; else the newest N
    backend: str = "auto"            # auto | cpu | triton (Triton on CUDA or the interpreter)
    eval_every: int = 0              # validation loss on held-out windows every N steps (0: off)
    eval_windows: int = 8            # held-out windows per source the validation loss covers

    def __post_init__(self) -> None:
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**64):
            raise ConfigError(f"seed: must be an integer in [0, 2^64), got {self.seed!r}")
        if (len(self.mesh) != 2 or any(isinstance(m, bool) or not isinstance(m, int) or m < 1
                                       for m in self.mesh)):
            raise ConfigError(f"mesh: must be [dp_replicate, dp_shard], two integers >= 1, "
                              f"got {list(self.mesh)!r}")
        for name, lo, hi in (("beta1", 0.0, 1.0), ("beta2", 0.0, 1.0)):
            v = getattr(self, name)
            if not lo <= v < hi:
                raise ConfigError(f"{name}: must be in [{lo}, {hi}), got {v!r}")
        for name in ("adam_eps", "clip", "spike_threshold", "lr_scale"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay: must be >= 0, got {self.weight_decay!r}")
        for name, lo in (("spike_skip", 1), ("checkpoint_every", 1), ("keep_checkpoints", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name}: must be an integer >= {lo}, got {v!r}")
        if self.steps is not None and (isinstance(self.steps, bool) or
                                       not isinstance(self.steps, int) or self.steps < 1):
            raise ConfigError(f"steps: must be an integer >= 1, got {self.steps!r}")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in self.inject_spike):
            raise ConfigError(f"inject_spike: must list steps >= 1, got {list(self.inject_spike)}")
        for name, lo in (("eval_every", 0), ("eval_windows", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name}: must be an integer >= {lo}, got {v!r}")
        if self.backend not in ("auto", "cpu", "triton"):
            raise ConfigError(f"backend: must be 'auto', 'cpu' or 'triton', got {self.backend!r}")

    @property
    def virtual_ranks(self) -> int:
        return self.mesh[0] * self.mesh[1]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mesh"] = list(self.mesh)
        d["inject_spike"] = list(self.inject_spike)
        if not self.eval_every:      # no validation: the record every run had before it
            for k in EVAL_FIELDS:
                d.pop(k)
        return d

    def identity(self) -> dict[str, Any]:
        """The fields that fix a run's bits (see the module docstring)."""
        d = self.to_dict()
        for k in IDENTITY_FREE:
            d.pop(k)
        return d

    def identity_sha256(self) -> str:
        return sha256_json(self.identity())


IDENTITY_FREE = ("steps", "checkpoint_every", "keep_checkpoints", "backend")
# which preset it claims; the topology (fixes bits, not recipe); validation (adds hashed
# val_loss scalars, never changes a training bit)
EVAL_FIELDS = ("eval_every", "eval_windows")
NOT_RECIPE = ("preset", "mesh", *EVAL_FIELDS)


def config_departures(cfg: TrainConfig, mix_seed: int | None = None
                      ) -> list[tuple[str, Any, Any]]:
    """Every field of ``cfg``'s identity that differs from its published preset, as
    (field, preset value, run value), ``model.*`` fields by their dotted name. The preset's
    "take it from the mix" values (``model.vocab = 0``, ``seed = None``) stand for the
    mix's; the mesh is a topology, not a recipe constant, and is not listed. A replay and
    its certificate name these, so a run that injects spikes or changes any constant of
    the recipe is flagged, however honestly its steps reproduce."""
    base = preset(cfg.preset)
    if cfg.seed is None:
        cfg = dataclasses.replace(cfg, seed=mix_seed)
    if base.model.vocab == 0:
        base = dataclasses.replace(base, model=dataclasses.replace(base.model,
                                                                   vocab=cfg.model.vocab))
    if base.seed is None and mix_seed is not None:
        base = dataclasses.replace(base, seed=mix_seed)

    def flat(c: TrainConfig) -> dict[str, Any]:
        d = c.identity()
        out = {f"model.{k}": v for k, v in d.pop("model").items()}
        out.update({k: v for k, v in d.items() if k not in NOT_RECIPE})
        return out
    want, got = flat(base), flat(cfg)
    return [(k, want.get(k), got.get(k)) for k in sorted(got) if got.get(k) != want.get(k)]


# --------------------------------------------------------------------------- presets

def open1b() -> TrainConfig:
    """The Open-1B recipe: the paper's shapes and optimizer (1.61B parameters)."""
    return TrainConfig()


def demo() -> TrainConfig:
    """Trains on the demo mix (512-token windows) on 2 CPU cores."""
    base = open1b()
    model = dataclasses.replace(base.model, vocab=0, d_model=128, n_layers=2, n_heads=2,
                                n_kv_heads=1, head_dim=64, ffn=384, window=128, full_every=2,
                                lmhead_slices=2)
    # a 2-layer model takes a higher rate than Open-1B's 4.5e-4 peak; at 10x it diverged
    # (step 19 of the demo mix), 4x trains smoothly
    return dataclasses.replace(base, preset="demo", model=model, checkpoint_every=20,
                               lr_scale=4.0)


def micro() -> TrainConfig:
    """Tiny shapes for tests under the Triton interpreter."""
    base = open1b()
    model = dataclasses.replace(base.model, vocab=0, d_model=64, n_layers=2, n_heads=2,
                                n_kv_heads=1, head_dim=32, ffn=96, window=16, full_every=2)
    return dataclasses.replace(base, preset="micro", model=model, checkpoint_every=2,
                               lr_scale=10.0)


PRESETS = {"open1b": open1b, "demo": demo, "micro": micro}


def preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}"
                          + _suggest(name, PRESETS))
    return PRESETS[name]()


# --------------------------------------------------------------------------- files

def _suggest(key: str, valid) -> str:
    near = difflib.get_close_matches(key, list(valid), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _coerce(where: str, current: Any, value: Any) -> Any:
    """``value`` as the type of the field's current value (TOML ints for floats, lists
    for tuples); anything else is a ConfigError naming the field."""
    if isinstance(current, tuple) or where in ("mesh", "inject_spike"):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return tuple(value)
    if isinstance(current, bool) or isinstance(value, bool):
        raise ConfigError(f"{where}: booleans are not valid here, got {value!r}")
    if isinstance(current, float) and isinstance(value, (int, float)):
        return float(value)
    if current is None or isinstance(value, type(current)):
        return value
    raise ConfigError(f"{where}: expected {type(current).__name__}, got {value!r} "
                      f"({type(value).__name__})")


def apply_overrides(cfg: TrainConfig, overrides: dict[str, Any], where: str = "") -> TrainConfig:
    """``cfg`` with the fields of ``overrides`` (a parsed TOML table) replaced."""
    top = {f.name for f in dataclasses.fields(TrainConfig)} - {"preset"}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "preset":
            continue
        if key == "model":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}model: expected a table, got {value!r}")
            mchanges = {}
            for mk, mv in value.items():
                if mk not in model_fields:
                    raise ConfigError(f"{where}model.{mk}: unknown field"
                                      + _suggest(mk, model_fields))
                mchanges[mk] = _coerce(f"model.{mk}", getattr(cfg.model, mk), mv)
            changes["model"] = dataclasses.replace(cfg.model, **mchanges)
            continue
        if key not in top:
            raise ConfigError(f"{where}{key}: unknown field" + _suggest(key, top | {"model"}))
        changes[key] = _coerce(key, getattr(cfg, key), value)
    return dataclasses.replace(cfg, **changes)


def load_config(path: str) -> TrainConfig:
    """A TOML config file: ``preset = "..."`` (default open1b) plus overridden fields."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path!r} is not valid TOML: {e}") from None
    name = data.get("preset", "open1b")
    if not isinstance(name, str):
        raise ConfigError(f"{path}: preset must be a string, got {name!r}")
    return apply_overrides(preset(name), data, where=f"{path}: ")


def from_dict(d: dict[str, Any]) -> TrainConfig:
    """The config recorded in a run (``TrainConfig.to_dict``), validated again."""
    name = d.get("preset", "open1b")
    if not isinstance(name, str):
        raise ConfigError(f"preset: must be a string, got {name!r}")
    return apply_overrides(preset(name), d)
