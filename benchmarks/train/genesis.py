"""What starting a run or a replay from genesis costs before its first step: the parameters
drawn from the seed and the genesis's digests, each side by side with the way it ran before.

At Open-1B's size (``--layers``: its 24 by default; 1,607,569,552 parameters) the trainer
(``run.fresh_state``) and every replay from genesis (``run.initial_state``) do the same
three things before step 1; each is timed twice in this one process, the anchor first:

* **the draw** (``params.init_params``): every weight's truncated normal by the torch
  definition (``philox.truncnormal_from_uniform`` with mathfn's erfinv as its torch code,
  ``mathfn._erfinv``, passes over chunks of the compiled words - what ran before) against the compiled loop
  (``_philox.c``: words, uniform, erfinv, clamp and scale in one pass). The two must give
  the same parameters' digest.
* **the genesis's optimizer digest** of the two fresh Adam moments (zeros) under the lean
  plan: their bytes hashed (``memplan.optim_digest``) against the digest from the hash
  format (``memplan.fresh_optim_digest``). They must be equal.
* **the parameters' digest** (``statehash.tensors_digest``, SHA-256 of 16 KiB chunks) on one
  thread against torch's threads.

    python -m benchmarks.train.genesis [--layers 24] [--out benchmarks/results/results-full-step.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

# as the commands run (open1b/cli.py): passive OpenMP waits, set before torch loads OpenMP -
# the torch definition's many small passes pay a wake-up each there, ~10x their time with
# spinning waits on the 2-core Zen 4
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def draw_by_definition(cfg, seed: int) -> dict[str, torch.Tensor]:
    """``init_params`` with each truncated normal by the torch definition (the code before
    the compiled loop: compiled words, then the torch passes, in chunks)."""
    from open1b_kernels.core import mathfn
    from open1b_kernels.ops import philox
    from open1b_train.params import param_specs, stream_of

    std = float(torch.tensor(cfg.init_std, dtype=torch.float32))
    out = {}
    for s in param_specs(cfg):
        if s.init != "normal":
            out[s.name] = (torch.ones(s.shape, dtype=s.dtype) if s.init == "ones" else
                           torch.full(s.shape, float(s.init.split(":")[1]), dtype=s.dtype))
            continue
        flat = torch.empty(s.numel, dtype=torch.float32)
        for i in range(0, s.numel, philox.CPU_CHUNK):
            k = min(philox.CPU_CHUNK, s.numel - i)
            u = philox.uniform_from_words(philox.random_words_cpu(seed, stream_of(s.name), i, k))
            # philox.truncnormal_from_uniform with erfinv's torch code (mathfn._erfinv)
            v = (u * 2.0 - 1.0) * philox.ERF_SQRT2
            z = (mathfn.map_chunks(mathfn._erfinv, v) * philox.SQRT2).clamp(-philox.TRUNC,
                                                                           philox.TRUNC)
            flat[i:i + k] = z * std
        out[s.name] = flat.view(s.shape).to(s.dtype)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=None, help="model.n_layers (default 24)")
    ap.add_argument("--out", default=None, help="append the markdown report here")
    a = ap.parse_args()
    if a.layers is not None and a.layers < 1:
        ap.error(f"--layers {a.layers}: a model needs at least 1 layer (Open-1B has 24)")

    from benchmarks.machine import report_end, report_head
    from open1b_kernels.core.backend import force
    from open1b_train import statehash
    from open1b_train.config import open1b
    from open1b_train.memory import memplan
    from open1b_train.memory.diskflat import DiskFlat
    from open1b_train.optimstate import OptimState
    from open1b_train.params import Layout, count, init_params, param_specs

    torch.set_num_threads(os.cpu_count() or 1)
    lines = report_head("python -m benchmarks.train.genesis")
    cfg = open1b().model
    if a.layers is not None:
        cfg = dataclasses.replace(cfg, n_layers=a.layers)
    seed = 1
    n = count(cfg)["total"]
    rows = []
    with force("cpu"):
        ref, t_ref = timed(lambda: draw_by_definition(cfg, seed))
        d_ref = statehash.tensors_digest(ref)
        del ref
        print(f"draw, torch definition: {t_ref:.1f} s", flush=True)
        got, t_new = timed(lambda: init_params(cfg, seed))
        print(f"draw, compiled loop: {t_new:.1f} s", flush=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        d_one, t_one = timed(lambda: statehash.tensors_digest(got))
        torch.set_num_threads(threads)
        d_new, t_all = timed(lambda: statehash.tensors_digest(got))
        if not d_ref == d_one == d_new:
            raise SystemExit("the compiled draw's parameters differ from the definition's")
        rows += [("the draw (init_params)", t_ref, t_new),
                 (f"the parameters' digest (1 vs {threads} threads)", t_one, t_all)]
        layout = Layout(param_specs(cfg))
        with tempfile.TemporaryDirectory(dir=".") as d:
            opt = OptimState(DiskFlat(d, "m", layout.numel), DiskFlat(d, "v", layout.numel))
            hashed, t_hash = timed(lambda: memplan.optim_digest(layout, opt))
            fresh, t_fresh = timed(lambda: memplan.fresh_optim_digest(layout, opt))
            opt.m.close()
            opt.v.close()
        if hashed != fresh:
            raise SystemExit("the fresh moments' digest from the format differs from hashing them")
        rows.append(("the genesis's optimizer digest (lean: moments in files)", t_hash, t_fresh))
    lines += [f"Open-1B with {cfg.n_layers} layers: {n:,} parameters; the same digests both "
              f"ways (asserted); OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}", "",
              "| part | before (anchor) s | now s | ratio |", "|---|---|---|---|"]
    lines += [f"| {name} | {b:.2f} | {t:.2f} | **{b / t:.1f}x** |" for name, b, t in rows]
    before, now = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines.append(f"| all three | {before:.1f} | {now:.1f} | **{before / now:.1f}x** |")
    report_end(lines, a.out)


if __name__ == "__main__":
    main()
