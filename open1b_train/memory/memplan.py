"""Memory plans: how a step holds its state, chosen from free memory; never what it computes.

A plan changes where values live and how long, never an operation on them, so every plan
gives the same bits (tested component by component on the demo and micro presets, across
a resume). It is not part of a run's config or identity and is not hashed; the trainer
prints it and records it in the unhashed fields of each step's log line, the replay in
its report.

* ``resident`` - everything in memory, the code as it always ran: parameters, both Adam
  moments, the flat reduced gradient, each micro-batch's gradients as a dict copied into
  it, every layer's activations, the full logits and dlogits.
* ``lean`` - for a machine smaller than the step: the Adam moments live in files under
  ``RUN/memplan/`` (``diskflat.py``) and the update streams them chunk by chunk through the
  same per-element AdamW; gradients go straight into the flat reduced buffer as the backward
  produces them (``reduction.gradient.GradSink``); the forward keeps only each layer's input
  and its attention's output and log-sum-exp (17 MB a layer at Open-1B's window) and the
  backward recomputes the layer but its attention (``model.lean_entry``) - except as many
  layers as the free memory allows, whose activations it keeps (each saves the layer's
  recompute, 10-20% of its lean forward + backward at Open-1B's shapes; the fully causal
  layers first), or exactly N of them with ``lean:N`` (``lean:0`` recomputes every layer); the
  LM head and the loss run in token blocks with dlogits overwriting the logits; dormant
  TreeFold partials are spilled to ``RUN/memplan/``; checkpoints are written and read in
  chunks (``checkpoint.py``).
* ``auto`` - ``lean`` when the resident plan's estimated peak is above the memory the
  kernel reports available (``/proc/meminfo`` MemAvailable), else ``resident``; the
  estimate, the free memory and the choice are printed.

"Fits" means the estimate times HEADROOM is at most MemAvailable; with MemAvailable unknown,
auto takes resident and lean keeps no layer. The lean plan's kept layers stop where its
estimated peak would pass ``LEAN_PEAK`` (16 GB) even where more memory is free: the point of
lean is a step on a 16 GB machine, and at Open-1B's shapes one more kept layer saves its
recompute (0.50 s of a window's ~126 s on 2 cores of a Zen 4, BENCHMARKS.md) for 0.39 GiB -
measured, the step kept 14 layers on a 24 GB VM and peaked at 18.8-19.3 GiB, while
``lean:0`` peaked at 14.1-14.2 GiB (before the attention outputs). The attention outputs
every recomputed layer holds take the 0.4 GB the cap left for one kept layer at Open-1B's
window, and save 19 windowed and 5 causal attention forwards (~8.7 s a window on 2 cores
of a Zen 4) where that layer saved one causal forward (1.45 s). ``lean:N`` keeps exactly N,
whatever either says.

The estimates are arithmetic over the model's shapes and the step's tokens (the terms are
listed in ``estimate``), not measurements; BENCHMARKS.md compares them with measured peaks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from open1b_kernels.ops.lmhead_plan import K_CHUNK
from open1b_train import statehash
from open1b_train.config import TrainConfig
from open1b_train.memory.diskflat import CHUNK, DiskFlat, clear_stale, scratch_dir
from open1b_train.errors import MemoryPlanError
from open1b_train.model import HEAD_ROWS
from open1b_train.params import Layout, param_specs

PLANS = ("resident", "lean")
CHOICES = ("auto", *PLANS)
CHOICE_HELP = "auto, resident, lean or lean:N (N layers' activations kept, 0 = none)"
HEADROOM = 1.10            # auto picks resident only when 110% of its estimate is free
LEAN_PEAK = 16 * 10**9     # lean keeps layers only while its estimated peak stays within
RUNTIME = 512 << 20        # Python, torch and the package imported: 327 MiB measured, rounded up


@dataclass(frozen=True)
class MemoryPlan:
    name: str                        # resident | lean
    requested: str                   # auto | resident | lean
    estimate: dict[str, int]         # estimated peak bytes per plan
    available: int | None            # MemAvailable at the choice (bytes), None if unknown
    scratch: str | None = None       # RUN/memplan for lean
    kept: frozenset[int] = frozenset()   # lean: the layers whose activations it keeps
    layers: int = 0                  # the model's layer count (for the description)

    @property
    def lean(self) -> bool:
        return self.name == "lean"

    def describe(self) -> str:
        gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
        est = ", ".join(f"{k} {gib(v)}" for k, v in self.estimate.items())
        free = "unknown" if self.available is None else gib(self.available)
        how = "forced" if self.requested != "auto" else "auto"
        keeps = (f"activations of {len(self.kept)} of {self.layers} layers kept, the rest "
                 f"recomputed; " if self.lean else "")
        return f"memory plan {self.name} ({how}; {keeps}estimated peak {est}; available {free})"

    def record(self) -> dict:
        return {"memory_plan": self.name}


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def parse(requested: str) -> tuple[str, int | None]:
    """(plan choice, N of ``lean:N`` or None) of a ``--memory-plan`` value."""
    name, colon, n = requested.partition(":")
    if name not in CHOICES or (colon and (name != "lean" or not n.isdigit())):
        raise MemoryPlanError(f"memory plan {requested!r}: choose one of {CHOICE_HELP}")
    return name, int(n) if colon else None


def keep_order(m) -> list[int]:
    """The layers the lean plan keeps first: the fully causal ones (their recompute cost the
    most while it included attention over the whole sequence; without it, 0.51 s against a
    windowed layer's 0.50 s on the Zen 4 - the order stays, the tests pin it), then the
    windowed ones; the last first within each (the backward frees them first)."""
    full = set(m.full_layers)
    return sorted(range(m.n_layers), key=lambda i: (i not in full, -i))


def estimate(cfg: TrainConfig, tokens: int, plan: str, kept: int = 0) -> int:
    """Estimated peak bytes of one step of ``cfg`` with ``tokens`` tokens per micro-batch.

    Both: the parameters (their dtypes) and the flat reduced gradient (4 bytes per slot of
    ``params.Layout``), one more flat buffer per virtual rank of a replica past the first
    when dp_shard > 1. resident adds both moments (8 per slot), the micro-batch's gradient
    dict (4 per parameter), every layer's saved activations and int8 weight codes, the
    logits and dlogits with the loss's full-size temporaries (about 5 x 4 bytes per token
    per vocabulary entry), the weights' rotated dX codes and the head weight's slices a step
    keeps (``weightmemo``), the
    AdamW temporaries of the largest parameter, a checkpoint's bytes held in memory,
    attention's and the linears' working sets; TreeFold partials when dp_replicate > 1
    (log2 R + 1). lean adds every layer's input with its attention's output and log-sum-exp
    (``model.lean_entry``), the largest parameter's
    gradient in flight, and the largest of its three phases' working sets - they do not
    overlap, since the model frees the layers' reused scratch before the head and the head
    its own after each part (``open1b_kernels.core.workspace.release``): the layers (one layer's
    activations, attention's and the linears' working sets), the LM head (the logits
    buffer, the head weight's int8 slices, one token block of dlogits' slices with its
    level operands and products) and the update (the moments' chunks); ``kept`` layers'
    activations (instead of their inputs) live through the first two. Both add RUNTIME,
    the interpreter and libraries before any tensor."""
    m = cfg.model
    specs = param_specs(m)
    layout = Layout(specs)
    flat = 4 * layout.numel
    params = sum(s.numel * torch.empty((), dtype=s.dtype).element_size() for s in specs)
    largest = max(s.numel for s in specs)
    d, f = m.d_model, m.ffn
    hq, hkv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    per_token = 12 * d + 9 * hq + 6 * hkv + 7 * f            # one layer's saved activations
    weight_codes = 2 * d * (2 * hq + 2 * hkv + 3 * f)          # int8 codes + masks per layer
    layer = tokens * per_token + weight_codes
    # attention's backward at work: its float64 fixed-point planes (four query-side, one
    # more while regrouped, three key-side) and the compiled loops' per-block scratch
    # (open1b_kernels.attention.compiled: scores, P, P V, tile operands; kept between calls)
    attention = tokens * (8 * (5 * hq + 3 * hkv) + m.n_heads * (768 + 4 * m.head_dim)
                          + m.n_kv_heads * (2560 + 16 * m.head_dim))
    # the W8A8 linears' reused buffers (kept between calls, sized by the widest): the
    # integer product and dy's rotated float32 tile buffer and codes (tokens x N), the
    # weight's (K x N) and the input's (tokens x K), each float32 plus int8 codes
    n, k = max(2 * f, hq + 2 * hkv, d), max(f, d)
    linears = 9 * tokens * n + 5 * k * n + 5 * tokens * k
    reps, shards = cfg.mesh
    fold = 0 if reps == 1 else (reps.bit_length() + 1) * flat
    extra_shard = flat if shards > 1 else 0
    base = params + flat + extra_shard
    if plan == "resident":
        head = 5 * 4 * tokens * m.vocab
        # a step of several micro-batches keeps each weight's rotated dX codes (int8) for
        # the whole step (open1b_kernels.int8.weightmemo; its codes are in ``layer``), and
        # the LM head weight's int8 slices both ways (the forward's rows, dh's columns)
        memo = (m.n_layers * d * (2 * hq + 2 * hkv + 3 * f)
                + 2 * m.lmhead_slices * m.vocab * d)
        return (base + 2 * flat + 4 * sum(s.numel for s in specs) + m.n_layers * layer
                + head + 10 * largest + params + 2 * flat + fold + attention + linears
                + memo + RUNTIME)
    # the head's dh part, its largest: the logits buffer (float32, dlogits in place), the
    # weight's int8 slices (by columns: the contraction runs over the vocabulary), one
    # HEAD_ROWS block of dlogits' slices, the level operands of one contraction chunk
    # (all levels' pairs for b, S for a) and every level's and chunk's int32 product
    s_, rows = m.lmhead_slices, min(HEAD_ROWS, tokens)
    chunks = -(-m.vocab // K_CHUNK)
    head = (4 * tokens * m.vocab + s_ * m.vocab * d + s_ * rows * m.vocab
            + s_ * (d + rows) * K_CHUNK + 4 * s_ * chunks * rows * d)
    kept = min(kept, m.n_layers)
    phases = max(kept * layer + max(layer + attention + linears, head), 6 * 4 * CHUNK)
    entry = tokens * (2 * d + 2 * hq + 4 * m.n_heads)   # input, attention's o (bf16), lse
    return (base + (m.n_layers - kept) * entry + 4 * largest + phases
            + min(fold, 2 * flat) + RUNTIME)


def fitting(cfg: TrainConfig, tokens: int, free: int | None, peak: int | None = None) -> int:
    """The most layers whose activations the lean plan can keep within ``free`` bytes
    (HEADROOM included) with its estimated peak at most ``peak`` (default ``LEAN_PEAK``); 0
    when ``free`` is unknown."""
    peak = LEAN_PEAK if peak is None else peak
    n = 0
    while (free is not None and n < cfg.model.n_layers
           and estimate(cfg, tokens, "lean", n + 1) * HEADROOM <= free
           and estimate(cfg, tokens, "lean", n + 1) <= peak):
        n += 1
    return n


def choose(requested: str, cfg: TrainConfig, tokens: int, run_dir: str,
           available: int | None = None) -> MemoryPlan:
    """The plan for ``requested`` (auto | resident | lean | lean:N); see the module
    docstring."""
    name, n = parse(requested)
    free = mem_available() if available is None else available
    resident = estimate(cfg, tokens, "resident")
    if name == "auto":
        name = "resident" if free is None or resident * HEADROOM <= free else "lean"
    kept: frozenset[int] = frozenset()
    if name == "lean":
        n = fitting(cfg, tokens, free) if n is None else min(n, cfg.model.n_layers)
        kept = frozenset(keep_order(cfg.model)[:n])
    est = {"resident": resident, "lean": estimate(cfg, tokens, "lean", len(kept))}
    return MemoryPlan(name, requested, est, free,
                      scratch_dir(run_dir) if name == "lean" else None, kept,
                      cfg.model.n_layers)


# ----------------------------------------------------------------------------- the moments

def new_moments(plan: MemoryPlan | None, layout: Layout, device) -> tuple:
    """Zero Adam moments (m, v): flat tensors, or ``DiskFlat`` files under the lean plan."""
    if plan is None or not plan.lean:
        return layout.zeros(device), layout.zeros(device)
    clear_stale(plan.scratch)
    return (DiskFlat(plan.scratch, "m", layout.numel), DiskFlat(plan.scratch, "v", layout.numel))


def on_disk(t) -> bool:
    return isinstance(t, DiskFlat)


def flat_digest(layout: Layout, flat) -> str:
    """``statehash.tensors_digest(layout.views(flat))`` of a flat tensor or a ``DiskFlat``,
    the latter read in chunks (each parameter starts at a 16 KiB hash-chunk boundary)."""
    if not on_disk(flat):
        return statehash.tensors_digest(layout.views(flat))
    from open1b_kernels.hashing.sha256 import streamed_root

    rts = {}
    for s in layout.slots:
        parts = (t for _, t in flat.chunks(s.offset, s.offset + s.numel))
        rts[s.name] = bytes.fromhex(streamed_root(s.name, s.shape, torch.float32, parts))
    return statehash.roots_digest(rts)


def optim_digest(layout: Layout, opt) -> str:
    """The step's optim component for resident or on-disk moments (the same digest)."""
    return statehash.optim_digest_of(flat_digest(layout, opt.m), flat_digest(layout, opt.v),
                                     opt.adam_step, opt.skip_left)


def fresh_optim_digest(layout: Layout, opt) -> str:
    """``optim_digest`` of ``opt`` whose moments are fresh from ``new_moments`` (all zeros:
    never trained), from the hash format instead of their bytes (``zero_root``): at
    Open-1B's size the genesis's two 6.4 GB moments are not read back from the lean plan's
    files and hashed. The counters are ``opt``'s own, hashed as they are."""
    from open1b_kernels.hashing.sha256 import zero_root

    zero = statehash.roots_digest({s.name: bytes.fromhex(zero_root(s.name, s.shape,
                                                                    torch.float32))
                                   for s in layout.slots})
    return statehash.optim_digest_of(zero, zero, opt.adam_step, opt.skip_left)


def moment_parts(layout: Layout, flat, name: str):
    """A parameter's moment as consecutive 1-D parts (a view, or chunks from disk)."""
    s = layout.by_name[name]
    if not on_disk(flat):
        yield flat[s.offset:s.offset + s.numel]
        return
    for _, t in flat.chunks(s.offset, s.offset + s.numel):
        yield t
