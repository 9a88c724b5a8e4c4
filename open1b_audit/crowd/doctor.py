"""``open1b-audit doctor RUN_URL``: can this machine take a leg of the run before joining?

1. The selftest (``open1b_audit.selftest``, one golden step): a machine that computes other
   bits can decide nothing. Its verdict is kept in the cache for a day (per software
   version and machine), so a volunteer restarting does not pay it again.
2. A short measured calibration on the run's own model (its hashed config, the mix's
   vocabulary): one micro-batch of the run's window length, forward and backward, through
   models of one layer (the last layer is always fully causal), two layers (one windowed)
   and two fully causal layers, each with the full LM head - so the head, a windowed layer
   and a fully causal layer are each measured, and a step's
   forward-backward time is ``head + windowed x t_w + full x t_f`` per micro-batch times the
   step's micro-batches (its windows / the micro-batch). The optimizer update and the four
   state hashes are added from this machine's measured SHA-256 and elementwise rates over
   the model's bytes. An estimate, stated as one; BENCHMARKS.md sets it beside measured
   steps.
3. Memory: the memory plan ``auto`` would choose (``memplan.choose``: the project's peak
   estimate against MemAvailable) and whether it fits; disk: the cache's checkpoints (a
   start state, two spills and a hand-off) plus the log and the mix's metadata, against the
   cache's free space.
4. The leg: ``leg_steps`` of the plan's largest step must end within the lease, with a
   margin (``MARGIN``); otherwise the machine is refused - it would hold legs it cannot
   finish.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from typing import Any

from open1b.safeio import write_atomic

MARGIN = 0.8                # a leg must fit in 80% of the lease
SELFTEST_TTL = 24 * 3600


def _selftest(cache_root: str, refresh: bool = False) -> dict[str, Any]:
    from open1b_audit import __version__
    from open1b_audit.selftest import run_selftest

    path = os.path.join(cache_root, "selftest.json")
    ident = {"version": __version__, "machine": platform.platform(),
             "processor": platform.processor()}
    if not refresh:
        try:
            with open(path) as f:
                kept = json.load(f)
            if kept.get("ident") == ident and time.time() - kept.get("time", 0) < SELFTEST_TTL:
                return {**kept["result"], "cached": True}
        except (OSError, ValueError, AttributeError):
            pass
    rep = run_selftest(steps=1)
    result = {"ok": rep["ok"], "verdict": rep["verdict"], "seconds": rep["seconds"],
              "failed": [c["check"] for c in rep["checks"] if c["verdict"] != "MATCH"]}
    os.makedirs(cache_root, exist_ok=True)
    write_atomic(path, json.dumps({"ident": ident, "time": time.time(), "result": result}
                                  ).encode(), fsync=False)
    return {**result, "cached": False}


def _time_model(model, seq: int, mb: int, seed: int, lean: bool) -> float:
    import torch

    from open1b_train.model import forward_backward
    from open1b_train.params import init_params

    params = init_params(model, seed, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, model.vocab, (mb, seq + 1), generator=g)
    forward_backward(model, params, toks[:, :-1], toks[:, 1:], lean=lean)      # warm
    t0 = time.perf_counter()
    forward_backward(model, params, toks[:, :-1], toks[:, 1:], lean=lean)
    return time.perf_counter() - t0


def _rates() -> dict[str, float]:
    """Bytes per second of SHA-256 and of an AdamW-like elementwise pass, here."""
    import torch

    buf = os.urandom(1 << 26)
    t0 = time.perf_counter()
    hashlib.sha256(buf).digest()
    sha = len(buf) / (time.perf_counter() - t0)
    a = torch.rand(1 << 22)
    b, c = torch.rand(1 << 22), torch.rand(1 << 22)
    t0 = time.perf_counter()
    for _ in range(4):
        a.mul_(0.9).add_(b, alpha=0.1)
        c.addcmul_(b, b, value=0.001)
        a.div_(c.sqrt().add_(1e-8))
    elem = 4 * 3 * 4 * a.numel() / (time.perf_counter() - t0)
    return {"sha256_bytes_per_s": sha, "elementwise_bytes_per_s": elem}


def calibrate(cfg, vocab: int, seq: int, mb: int, lean: bool) -> dict[str, Any]:
    """Per micro-batch forward-backward seconds of ``cfg``'s model (module docstring, 2)."""
    import torch

    from open1b_kernels.core import backend as kb
    from open1b_train.params import Layout, param_specs

    m = dataclasses.replace(cfg.model, vocab=vocab)
    big = max(m.full_every, 3)                 # layer 0 windowed, the last always full
    seed = cfg.seed or 0
    with kb.force("cpu"), torch.no_grad():
        t1 = _time_model(dataclasses.replace(m, n_layers=1, full_every=big), seq, mb, seed,
                         lean)
        t2 = _time_model(dataclasses.replace(m, n_layers=2, full_every=big), seq, mb, seed,
                         lean)
        t2f = _time_model(dataclasses.replace(m, n_layers=2, full_every=big,
                                              window=max(m.window, seq + 1)), seq, mb, seed,
                          lean)
    per_w = max(t2 - t1, 0.0)                  # a windowed layer
    per_f = max(t2f - t1, per_w)               # a fully causal layer
    head = max(t1 - per_f, 0.0)                # embedding, final norm, LM head and loss
    n_full = len(m.full_layers)
    micro = head + (m.n_layers - n_full) * per_w + n_full * per_f
    layout = Layout(param_specs(m))
    rates = _rates()
    # hashes of params, grad, m, v (4 bytes each but bf16 params) and AdamW over m, v, params
    hashed = 4 * 4 * layout.numel
    update = (hashed / rates["sha256_bytes_per_s"]
              + 3 * 4 * layout.numel / rates["elementwise_bytes_per_s"])
    return {"microbatch_s": micro, "head_s": head, "windowed_layer_s": per_w,
            "full_layer_s": per_f, "layers": m.n_layers, "full_layers": n_full,
            "update_s": update, "params": layout.numel, **rates,
            "measured": {"one_layer_s": t1, "two_layers_s": t2, "two_full_layers_s": t2f}}


def doctor(cache, plan_numbers: dict[str, Any], refresh_selftest: bool = False,
           selftest: bool = True) -> dict[str, Any]:
    """The report (module docstring); ``plan_numbers``: leg_steps and lease_s (the store's
    plan when it has one)."""
    from open1b_train import runlog
    from open1b_train.memory import memplan
    from open1b_train.run import resolve

    t0 = time.perf_counter()
    reasons: list[str] = []
    rep: dict[str, Any] = {"run_hash": cache.run_hash}
    if selftest:
        st = _selftest(cache.root, refresh_selftest)
        rep["selftest"] = st
        if not st["ok"]:
            reasons.append(f"the selftest fails ({', '.join(st['failed'])}): this machine "
                           f"computes other bits")
    cfg = dataclasses.replace(cache.config(), eval_every=0)
    mirror = cache.mirror_mix()
    with tempfile.TemporaryDirectory(dir=cache.root) as tmp:
        run = resolve(cfg, mirror, tmp, use_index=False, memory_plan="auto")
    sched = run.schedule
    last = len(cache.lines) - 1
    biggest = max(sched.step(s).batch_sequences for s in
                  sorted({r.first_step for r in sched.runs if r.first_step <= last} | {last}))
    spec = sched.spec
    cal = calibrate(run.cfg, run.cfg.model.vocab, spec.seq_tokens, spec.micro_batch,
                    run.memory.lean)
    step_s = cal["microbatch_s"] * biggest / spec.micro_batch + cal["update_s"]
    leg_steps, lease = int(plan_numbers["leg_steps"]), float(plan_numbers["lease_s"])
    leg_s = step_s * leg_steps
    rep["calibration"] = cal
    rep["step"] = {"windows": biggest, "seconds": step_s,
                   "per_window_s": cal["microbatch_s"] / spec.micro_batch}
    rep["leg"] = {"steps": leg_steps, "seconds": leg_s, "lease_s": lease,
                  "fits": leg_s <= MARGIN * lease}
    if not rep["leg"]["fits"]:
        reasons.append(f"a leg of {leg_steps} step(s) takes about {leg_s:.0f} s here, more than "
                       f"{MARGIN:.0%} of the {lease:.0f} s lease")
    mem = run.memory
    est = mem.estimate[mem.name]
    fits = mem.available is None or est * memplan.HEADROOM <= mem.available
    rep["memory"] = {"plan": mem.name, "estimate_bytes": est, "available_bytes": mem.available,
                     "fits": fits, "text": mem.describe()}
    if not fits:
        reasons.append(f"the {mem.name} memory plan needs about {est / 2**30:.1f} GiB, "
                       f"{(mem.available or 0) / 2**30:.1f} GiB are available")
    layout_bytes = cal["params"] * (2 + 8)
    log_bytes = os.path.getsize(runlog.path_of(cache.run_dir))
    mix_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(mirror)
                    for f in fs)
    need = 4 * layout_bytes + log_bytes + mix_bytes
    free = shutil.disk_usage(cache.root).free
    rep["disk"] = {"needed_bytes": need, "free_bytes": free, "fits": need <= free,
                   "checkpoint_bytes": layout_bytes}
    if need > free:
        reasons.append(f"the cache needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB "
                       f"are free at {cache.root}")
    rep["ok"] = not reasons
    rep["reasons"] = reasons
    rep["seconds"] = round(time.perf_counter() - t0, 1)
    return rep
