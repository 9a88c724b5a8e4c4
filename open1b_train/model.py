"""The Open-1B model, composed only from ``kernels`` ops, with an explicit backward.

    x   = RMSNorm(Embed(ids))                                         (B, S, D) bf16
    for each layer i:
        h   = x + Attn_i(RMSNorm(x))          Attn: W8A8 q, k, v; gain-free QK-norm per head,
                                              RoPE; causal GQA attention (sliding window,
                                              or fully causal on ModelConfig.full_layers);
                                              W8A8 o
        x   = h + MLP_i(RMSNorm(h))           MLP: W8A8 fused gate|up, SwiGLU, W8A8 down
    loss = CrossEntropy+zloss(LMHead(RMSNorm(x)), labels)             exact bf16 GEMM, fp32

Why not autograd: the backward is written out, op by op, because the bits of a training
step must be defined, not left to an engine. Every gradient's dtype and every sum is
stated here: activation gradients are bf16 like the activations; weight, gain, LSQ-step
and embedding gradients come out of the kernels in float32 (autograd would round them to
the bf16 parameter dtype); where one activation feeds several branches its gradients add
as ``bf16(fp32(a) + fp32(b) [+ fp32(c)])`` left to right in the order written below (q, k,
v for the attention input; branch then residual elsewhere). The same code runs the CPU
reference or the Triton kernels (``open1b_kernels.core.backend``), so the two give the same bits.
The LM head's input gradient (fp32 from the exact GEMM) is rounded once to bf16.

``layer_forward`` / ``layer_backward`` are one layer's part of it (what the block benchmark
times). ``forward_backward(cfg, params, input_ids, labels, trace=None)`` returns the micro-batch
loss (mean over its tokens, float32), each sequence's loss (float32, mean over its tokens:
the same rows, summed by the pairwise tree then times fp32(1/S)) and the float32 gradient
of every parameter. ``trace(name, tensor)`` (optional) is called with every op's output in
execution order, e.g. ``layers.3.fwd.attn`` or ``layers.3.bwd.mlp.down.dw``: per-op digests
for dispute bisection.

``forward_backward(..., lean=True)`` is the memory plan ``lean`` of ``memory/memplan.py``: the same
ops on the same values, so the same bits, holding less. The forward keeps only each
layer's input (B, S, D) and its attention's output and log-sum-exp (``lean_entry``), and
the backward recomputes that layer's forward but the attention before its backward (one
more forward pass of work less attention's) - except the layers in ``kept``, whose
activations are held as the resident plan holds them (the plan keeps as many as the free
memory allows: each kept layer saves its recompute); the LM head and the loss run over
blocks of HEAD_ROWS tokens into one (M, V) float32 buffer that the loss's backward then overwrites
with dlogits block by block (the logits, the loss rows and dlogits are row by row, so blocks
cannot change a bit: ``open1b_kernels.ops.lmhead``'s rows are sliced per row, ``xent`` takes the
mean's row count); the head's weight gradient runs over blocks of HEAD_COLS vocabulary
rows (each of its rows is one column of dlogits sliced over all tokens, so blocks of rows
cannot change a bit either, and only a block of dlogits^T is copied and sliced at once).
``grads`` (optional) is the mapping the gradients are stored into: a ``reduction.gradient.GradSink`` adds
each into the flat reduced buffer as it is produced instead of holding all of them.
"""
from __future__ import annotations

from collections.abc import Callable, MutableMapping

import torch

from open1b_kernels.attention.forward import attention_forward
from open1b_kernels.attention.backward import attention_backward
from open1b_kernels.ops.embedding import embedding_bwd, embedding_fwd
from open1b_kernels.int8.linear import linear_int8_backward, linear_int8_forward, linear_int8_forward_cpu
from open1b_kernels.core.rounding import add_bf16
from open1b_kernels.core.backend import use_triton
from open1b_kernels.ops.lmhead import lmhead_backward, lmhead_forward, ozaki_mm
from open1b_kernels.core.reduce import reciprocal_f32, tree_sum
from open1b_kernels.core.workspace import release
from open1b_kernels.ops.rmsnorm import rmsnorm_bwd, rmsnorm_fwd
from open1b_kernels.ops.rope import rope_bwd, rope_fwd
from open1b_kernels.ops.swiglu import swiglu_bwd, swiglu_fwd
from open1b_kernels.ops.xent import Z_LOSS, xent_backward, xent_forward
from open1b_train.config import ModelConfig

# called with each op's output as it is made; a later op may reuse that buffer (dlogits
# overwrite the logits), so a callback that keeps a tensor keeps a copy of it
Trace = Callable[[str, torch.Tensor], None] | None
BF16 = torch.bfloat16
F32 = torch.float32
HEAD_ROWS = 1024        # tokens per LM-head / loss block of the lean plan
HEAD_COLS = 16_384      # vocabulary rows per block of the lean plan's LM-head weight gradient


def _linear(x2: torch.Tensor, w: torch.Tensor, s: torch.Tensor):
    """Forward of one W8A8 linear; returns (y, codes kept for the CPU backward)."""
    if use_triton(x2):
        return linear_int8_forward(x2, w, s), None
    return linear_int8_forward_cpu(x2, w, s)


class _Tracer:
    def __init__(self, trace: Trace) -> None:
        self.fn = trace

    def __call__(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if self.fn is not None:
            self.fn(name, t)
        return t


def _attn_fwd(cfg: ModelConfig, p: dict, i: int, xn: torch.Tensor, tr: _Tracer,
              core: tuple[torch.Tensor, torch.Tensor] | None = None):
    b, s, d = xn.shape
    hd, pre = cfg.head_dim, f"layers.{i}"
    x2 = xn.reshape(b * s, d)
    saved = {"x2": x2}
    heads = {}
    for name, nh in (("q", cfg.n_heads), ("k", cfg.n_kv_heads), ("v", cfg.n_kv_heads)):
        y, saved[f"codes_{name}"] = _linear(x2, p[f"{pre}.attn.{name}.weight"],
                                            p[f"{pre}.attn.{name}.step"])
        heads[name] = tr(f"{pre}.fwd.attn.{name}", y).reshape(b, s, nh, hd)  # (B, S, H, hd)
    for name in ("q", "k"):
        saved[name] = heads[name]
        normed, saved[f"rstd_{name}"] = rmsnorm_fwd(heads[name], None, cfg.eps)
        rotated = rope_fwd(normed, cfg.theta)                                # (B, S, H, hd)
        heads[name] = rotated.transpose(1, 2).contiguous()                   # (B, H, S, hd)
    vt = heads["v"].transpose(1, 2).contiguous()
    window = cfg.layer_window(i)
    # core: (o, lse) this layer's attention computed before on the same values (the lean
    # plan's recompute): the same tensors, so the same bits, without the work
    o, lse = core if core is not None else attention_forward(heads["q"], heads["k"], vt,
                                                             window)     # (B, H, S, hd)
    tr(f"{pre}.fwd.attn.core", o)
    saved.update(qt=heads["q"], kt=heads["k"], vt=vt, o=o, lse=lse)
    o2 = o.transpose(1, 2).reshape(b * s, cfg.n_heads * hd)                   # (B*S, H*hd)
    out, saved["codes_o"] = _linear(o2, p[f"{pre}.attn.o.weight"], p[f"{pre}.attn.o.step"])
    saved["o2"] = o2
    return tr(f"{pre}.fwd.attn.o", out).reshape(b, s, d), saved


def _attn_bwd(cfg: ModelConfig, p: dict, i: int, dout: torch.Tensor, sv: dict,
              grads: dict, tr: _Tracer) -> torch.Tensor:
    b, s, d = dout.shape
    hd, pre = cfg.head_dim, f"layers.{i}"
    do2, grads[f"{pre}.attn.o.weight"], grads[f"{pre}.attn.o.step"] = linear_int8_backward(
        dout.reshape(b * s, d), sv["o2"], p[f"{pre}.attn.o.weight"], p[f"{pre}.attn.o.step"],
        sv["codes_o"])
    tr(f"{pre}.bwd.attn.o.dx", do2)
    do = do2.reshape(b, s, cfg.n_heads, hd).transpose(1, 2).contiguous()      # (B, H, S, hd)
    dq, dk, dv = attention_backward(sv["qt"], sv["kt"], sv["vt"], sv["o"], sv["lse"], do,
                                    cfg.layer_window(i))
    tr(f"{pre}.bwd.attn.core.dq", dq)
    tr(f"{pre}.bwd.attn.core.dk", dk)
    tr(f"{pre}.bwd.attn.core.dv", dv)
    dheads = {"v": dv.transpose(1, 2)}                                        # (B, S, H, hd)
    for name, g in (("q", dq), ("k", dk)):
        dn = rope_bwd(g.transpose(1, 2).contiguous(), cfg.theta)
        dheads[name], _ = rmsnorm_bwd(dn, sv[name], None, sv[f"rstd_{name}"])
    dxs = []
    for name in ("q", "k", "v"):
        dy = dheads[name].reshape(b * s, -1)
        dx, grads[f"{pre}.attn.{name}.weight"], grads[f"{pre}.attn.{name}.step"] = (
            linear_int8_backward(dy, sv["x2"], p[f"{pre}.attn.{name}.weight"],
                                 p[f"{pre}.attn.{name}.step"], sv[f"codes_{name}"]))
        dxs.append(tr(f"{pre}.bwd.attn.{name}.dx", dx))
    return add_bf16(*dxs).reshape(b, s, d)


def _mlp_fwd(cfg: ModelConfig, p: dict, i: int, hn: torch.Tensor, tr: _Tracer):
    b, s, d = hn.shape
    pre = f"layers.{i}"
    x2 = hn.reshape(b * s, d)
    gu, codes_gu = _linear(x2, p[f"{pre}.mlp.gate_up.weight"], p[f"{pre}.mlp.gate_up.step"])
    tr(f"{pre}.fwd.mlp.gate_up", gu)
    a = tr(f"{pre}.fwd.mlp.swiglu", swiglu_fwd(gu))                           # (B*S, F)
    out, codes_down = _linear(a, p[f"{pre}.mlp.down.weight"], p[f"{pre}.mlp.down.step"])
    tr(f"{pre}.fwd.mlp.down", out)
    return out.reshape(b, s, d), {"x2": x2, "gu": gu, "a": a, "codes_gu": codes_gu,
                                  "codes_down": codes_down}


def _mlp_bwd(cfg: ModelConfig, p: dict, i: int, dout: torch.Tensor, sv: dict,
             grads: dict, tr: _Tracer) -> torch.Tensor:
    b, s, d = dout.shape
    pre = f"layers.{i}"
    da, grads[f"{pre}.mlp.down.weight"], grads[f"{pre}.mlp.down.step"] = linear_int8_backward(
        dout.reshape(b * s, d), sv["a"], p[f"{pre}.mlp.down.weight"], p[f"{pre}.mlp.down.step"],
        sv["codes_down"])
    tr(f"{pre}.bwd.mlp.down.dx", da)
    dgu = tr(f"{pre}.bwd.mlp.swiglu", swiglu_bwd(da, sv["gu"]))
    dx, grads[f"{pre}.mlp.gate_up.weight"], grads[f"{pre}.mlp.gate_up.step"] = (
        linear_int8_backward(dgu, sv["x2"], p[f"{pre}.mlp.gate_up.weight"],
                             p[f"{pre}.mlp.gate_up.step"], sv["codes_gu"]))
    return tr(f"{pre}.bwd.mlp.gate_up.dx", dx).reshape(b, s, d)


def layer_forward(cfg: ModelConfig, p: dict[str, torch.Tensor], i: int, x: torch.Tensor,
                  trace: Trace | _Tracer = None,
                  core: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[torch.Tensor, tuple]:
    """Layer ``i``'s forward on x (B, S, D) bf16: (its output, what ``layer_backward``
    needs). The ops ``forward_backward`` runs for that layer, in the same order. ``core``:
    the (o, lse) of this layer's attention from an earlier forward on the same ``x`` and
    parameters (``lean_entry``), used instead of computing them again."""
    tr = trace if isinstance(trace, _Tracer) else _Tracer(trace)
    xn, r1 = rmsnorm_fwd(x, p[f"layers.{i}.attn_norm.gain"], cfg.eps)
    a, sa = _attn_fwd(cfg, p, i, xn, tr, core)
    h = tr(f"layers.{i}.fwd.h", add_bf16(x, a))
    hn, r2 = rmsnorm_fwd(h, p[f"layers.{i}.mlp_norm.gain"], cfg.eps)
    m, sm = _mlp_fwd(cfg, p, i, hn, tr)
    return tr(f"layers.{i}.fwd.out", add_bf16(h, m)), (x, r1, sa, h, r2, sm)


class _LeanStore:
    """The lean plan's entries (``lean_entry``) of every recomputed layer, copied into one
    buffer allocated at the first: a block the size of all of them (0.76 GiB at Open-1B's
    window, above the lean plan's mmap threshold, ``memory.allocator.LEAN_KEEP``: pages of
    its own) instead of 72 long-lived heap blocks of 0.3-17 MB among the layers'
    temporaries."""

    def __init__(self, count: int) -> None:
        self.count, self.buf, self.used = count, None, 0

    def put(self, parts: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        sizes = [t.numel() * t.element_size() for t in parts]
        spans = [-(-n // 64) * 64 for n in sizes]          # each part 64-byte aligned
        if self.buf is None:
            self.buf = torch.empty(self.count * sum(spans), dtype=torch.uint8,
                                   device=parts[0].device)
        assert self.used + sum(spans) <= self.buf.numel(), "more entries than counted"
        out = []
        for t, n, span in zip(parts, sizes, spans):
            view = self.buf[self.used:self.used + n].view(t.dtype).view(t.shape)
            out.append(view.copy_(t))
            self.used += span
        return tuple(out)


def lean_entry(x_in: torch.Tensor, saved: tuple) -> tuple:
    """What the lean plan holds of a layer it recomputes: its input and its attention's
    output and log-sum-exp (``layer_forward``'s ``core``). At Open-1B's 4,096-token window
    the pair is 17 MB a layer against the layer's 0.4 GB of activations, and it spares the
    recompute the attention forward - 0.2 s of a windowed layer's forward, 0.9 s of a fully
    causal one's on 2 cores of a Zen 4 (BENCHMARKS.md), the layer's costliest op per byte
    kept."""
    sa = saved[2]
    return x_in, sa["o"], sa["lse"]


def layer_backward(cfg: ModelConfig, p: dict[str, torch.Tensor], i: int, dx: torch.Tensor,
                   saved: tuple, grads: dict[str, torch.Tensor],
                   trace: Trace | _Tracer = None) -> torch.Tensor:
    """Layer ``i``'s backward: the gradient (bf16) of its input x given ``dx`` of its
    output and ``saved`` from ``layer_forward``; its parameters' float32 gradients go into
    ``grads``. The ops ``forward_backward`` runs for that layer, in the same order."""
    tr = trace if isinstance(trace, _Tracer) else _Tracer(trace)
    x_in, r1, sa, h, r2, sm = saved
    dhn = _mlp_bwd(cfg, p, i, dx, sm, grads, tr)
    dh_norm, grads[f"layers.{i}.mlp_norm.gain"] = rmsnorm_bwd(
        dhn, h, p[f"layers.{i}.mlp_norm.gain"], r2)
    dh = tr(f"layers.{i}.bwd.h", add_bf16(dh_norm, dx))
    dxn = _attn_bwd(cfg, p, i, dh, sa, grads, tr)
    dx_norm, grads[f"layers.{i}.attn_norm.gain"] = rmsnorm_bwd(
        dxn, x_in, p[f"layers.{i}.attn_norm.gain"], r1)
    return tr(f"layers.{i}.bwd.x", add_bf16(dx_norm, dh))


def sequence_losses(logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
                    batch: int) -> torch.Tensor:
    """Each sequence's loss: the cross-entropy + z-loss rows of ``open1b_kernels.ops.xent`` (same
    expression, one IEEE op each), pairwise-tree summed per sequence, times fp32(1/S)."""
    xt = logits.gather(1, labels[:, None])[:, 0]
    rows = (lse - xt) + Z_LOSS * (lse * lse)                                  # (B*S,)
    seq = rows.shape[0] // batch
    return tree_sum(rows.reshape(batch, seq), -1) * reciprocal_f32(seq)


def _head_blocks(cfg: ModelConfig, p: dict[str, torch.Tensor], xf2: torch.Tensor,
                 labels: torch.Tensor, batch: int):
    """The lean plan's LM head and loss over blocks of HEAD_ROWS tokens: (loss, per-sequence
    losses, logits (M, V) float32, lse (M,)). Each block's logits and lse are the rows of
    the whole's; the rows of the loss are ``xent``'s expression and sum by the same tree
    over all M rows, times fp32(1/M), as ``xent_forward`` does."""
    m = xf2.shape[0]
    # one call: the head weight is sliced (and its products checked) once, not per block;
    # the call's own temporaries are blocks, its output is the logits buffer itself
    logits = lmhead_forward(xf2, p["lm_head.weight"], cfg.lmhead_slices)
    lse = torch.empty((m,), dtype=F32, device=xf2.device)
    for r0 in range(0, m, HEAD_ROWS):
        rows = slice(r0, r0 + HEAD_ROWS)
        lse[rows] = xent_forward(logits[rows], labels[rows])[1]
    xt = logits.gather(1, labels[:, None])[:, 0]
    rows = (lse - xt) + Z_LOSS * (lse * lse)                                  # (M,)
    loss = tree_sum(rows, 0) * reciprocal_f32(m)
    seq = m // batch
    per_seq = tree_sum(rows.reshape(batch, seq), -1) * reciprocal_f32(seq)
    return loss, per_seq, logits, lse


def _forward(cfg: ModelConfig, p: dict[str, torch.Tensor], input_ids: torch.Tensor,
             labels: torch.Tensor, tr: _Tracer, keep: bool, lean: bool = False,
             kept: frozenset[int] = frozenset()):
    """The forward pass: (loss, per-sequence losses, what the backward needs - or None
    when not ``keep``: the activations are then freed layer by layer). ``lean``: the tape
    holds each layer's input and attention output only (``lean_entry``; all activations
    for the layers in ``kept``), the LM head runs in token blocks (module docstring)."""
    b, s = input_ids.shape
    d = cfg.d_model
    e = tr("embed.fwd", embedding_fwd(p["embed.weight"], input_ids))           # (B, S, D)
    x, rstd_e = rmsnorm_fwd(e, p["embed_norm.gain"], cfg.eps)
    tr("embed_norm.fwd", x)
    tape = []
    store = _LeanStore(cfg.n_layers - len(kept)) if keep and lean else None
    for i in range(cfg.n_layers):
        x_in = x
        x, saved = layer_forward(cfg, p, i, x, tr)
        if keep:
            tape.append(store.put(lean_entry(x_in, saved)) if lean and i not in kept
                        else saved)
        del saved
    xf, rstd_f = rmsnorm_fwd(x, p["final_norm.gain"], cfg.eps)
    xf2 = xf.reshape(b * s, d)
    flat_labels = labels.reshape(-1)
    if lean:
        # the layers' reused scratch (the linears' and attention's buffers, ~1 GB at
        # Open-1B) is idle while the head's GBs are live: freed, faulted in again later
        release()
        loss, per_seq, logits, lse = _head_blocks(cfg, p, xf2, flat_labels, b)
        tr("lm_head.fwd", logits)
    else:
        logits = tr("lm_head.fwd", lmhead_forward(xf2, p["lm_head.weight"],
                                                  cfg.lmhead_slices))
        loss, lse = xent_forward(logits, flat_labels)
        per_seq = sequence_losses(logits, flat_labels, lse, b)
    tr("loss", loss.reshape(1))
    saved = (e, rstd_e, tape, x, xf2, rstd_f, logits, flat_labels, lse) if keep else None
    return loss, per_seq, saved


def forward_loss(cfg: ModelConfig, p: dict[str, torch.Tensor], input_ids: torch.Tensor,
                 labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-sequence losses) of one micro-batch, forward only: the same ops, so the
    same bits, as ``forward_backward``'s (validation on held-out windows)."""
    loss, per_seq, _ = _forward(cfg, p, input_ids, labels, _Tracer(None), keep=False)
    return loss, per_seq


def _head_backward(cfg: ModelConfig, p: dict[str, torch.Tensor], xf2: torch.Tensor,
                   logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
                   lean: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dxf (M, D) float32, the LM head's weight gradient) from the loss. ``lean``: dlogits
    overwrite the logits block by block and dxf is computed per block (rows again); the
    weight gradient contracts over all M rows at once (its slicing is per vocabulary column
    over every token, so it cannot be blocked by tokens) in blocks of HEAD_COLS vocabulary
    columns."""
    one = torch.ones((), dtype=F32, device=logits.device)
    w = p["lm_head.weight"]
    if not lean:
        dlogits = xent_backward(one, logits, labels, lse, overwrite=True)   # the logits' buffer
        del logits
        return lmhead_backward(dlogits, xf2, w, cfg.lmhead_slices)
    m = logits.shape[0]
    for r0 in range(0, m, HEAD_ROWS):
        rows = slice(r0, r0 + HEAD_ROWS)
        # in place (the assignment then copies nothing: the same view of the same data)
        logits[rows] = xent_backward(one, logits[rows], labels[rows], lse[rows], rows=m,
                                     overwrite=True)
    dlogits = logits                                                          # (M, V)
    dxf = torch.cat([ozaki_mm(dlogits[r0:r0 + HEAD_ROWS], w.t(), cfg.lmhead_slices,
                              sparse_a=True) for r0 in range(0, m, HEAD_ROWS)])
    # the CPU path's scratch only grows: the weight's slices (~0.8 GB at Open-1B) would
    # otherwise stay through the weight gradient's blocks and the layers' backward
    release("lmhead.")
    dw = torch.empty(w.shape, dtype=F32, device=w.device)
    for v0 in range(0, w.shape[0], HEAD_COLS):
        dw[v0:v0 + HEAD_COLS] = ozaki_mm(dlogits[:, v0:v0 + HEAD_COLS].t(), xf2.t(),
                                         cfg.lmhead_slices)
    release("lmhead.")
    return dxf, dw


def forward_backward(cfg: ModelConfig, p: dict[str, torch.Tensor], input_ids: torch.Tensor,
                     labels: torch.Tensor, trace: Trace = None, lean: bool = False,
                     grads: MutableMapping[str, torch.Tensor] | None = None,
                     kept: frozenset[int] = frozenset()
                     ) -> tuple[torch.Tensor, torch.Tensor, MutableMapping[str, torch.Tensor]]:
    """(loss, per-sequence losses, float32 gradients by parameter name) of one micro-batch
    ``input_ids`` / ``labels`` (B, S) int64; see the module docstring (``kept``: the layers
    whose activations ``lean`` holds instead of recomputing them)."""
    tr = _Tracer(trace)
    b, s = input_ids.shape
    d = cfg.d_model
    grads = {} if grads is None else grads
    loss, per_seq, saved = _forward(cfg, p, input_ids, labels, tr, keep=True, lean=lean,
                                    kept=kept)
    e, rstd_e, tape, x, xf2, rstd_f, logits, flat_labels, lse = saved
    del saved
    # ---- backward
    dxf, grads["lm_head.weight"] = _head_backward(cfg, p, xf2, logits, flat_labels, lse, lean)
    del logits
    dx, grads["final_norm.gain"] = rmsnorm_bwd(dxf.to(BF16).reshape(b, s, d), x,
                                               p["final_norm.gain"], rstd_f)
    del dxf
    tr("final_norm.bwd", dx)
    for i in reversed(range(cfg.n_layers)):
        saved = tape.pop()
        if lean and i not in kept:   # recompute the layer's forward, untraced, but attention
            x_in, o, lse = saved
            saved = layer_forward(cfg, p, i, x_in, _Tracer(None), core=(o, lse))[1]
            del x_in, o, lse
        dx = layer_backward(cfg, p, i, dx, saved, grads, tr)
        del saved
    de, grads["embed_norm.gain"] = rmsnorm_bwd(dx, e, p["embed_norm.gain"], rstd_e)
    grads["embed.weight"] = embedding_bwd(de, input_ids, cfg.vocab)
    for name, g in grads.items():
        tr(f"grad.{name}", g)
    return loss, per_seq, grads
