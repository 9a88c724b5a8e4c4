"""The training part of ``scripts/gpu_check.py`` (``--train``): bit parity of whole
training steps between the CPU reference and the GPU, and the speed of one full-size
Open-1B step against stock PyTorch.

1. parity - the ``micro`` preset trains ``steps`` steps on the demo mix twice: on the CPU
   reference and on CUDA (Triton kernels). Every component digest of every step must be
   identical (data, gradient, parameters, optimizer state, scalars).
2. speed - one optimizer step of the ``open1b`` preset (the paper's shapes, 1.61B
   parameters) on one micro-batch of 4 x 4,096 tokens: forward, backward, global norm,
   clip and fused AdamW, timed with CUDA events (median of ``repeats``), as tokens/s.
   Anchor, same GPU, same run: the stock model of ``benchmarks/train/stock_model.py`` (bf16
   ``nn.Linear``, SDPA, ``torch.optim.AdamW(fused=True)``) with every block compiled by
   ``torch.compile``. Ratio = ours / stock (>= 1: we are faster).
3. hashing - the share of the step's time spent hashing parameters, gradient and moments
   on the device (``open1b_kernels.hashing.sha256``).
4. golden - the committed golden trajectories (docs/PORTABILITY.md: 100 steps of the
   ``micro`` trajectory with a batch ramp, accumulation, a spike skip and a 3-replica
   mesh; 3 steps of the ``demo`` one whose GEMMs contract over 1,536 tokens) trained on
   the device, every component of every step against ``tests/assets/trajectory_*.json``:
   the GPU row of the portability matrix.
5. collectives - a one-process torch.distributed group (NCCL on a GPU, gloo in the dry run):
   the deterministic reduce-scatter + all-reduce of ``open1b_train.distributed`` on 64 MB device
   gradients of a 4x2 logical mesh, bit for bit against the sequential reference, timed;
   and the distributed trainer (``train_distributed``) on that group gives the
   single-process run hash of the same mesh. One process exercises the code path; the
   multi-process bits are tested on CPU gloo processes in CI.

``--dry-run`` (what CI exercises, no GPU needed) runs the same code on the CPU with tiny
shapes: parity between the CPU reference and the CPU reference under ``force("cpu")``
twice, the speed section on a micro model, and the first steps of each golden trajectory.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from open1b_train.config import micro, open1b  # noqa: E402
from open1b_train.params import Layout, init_params, param_specs  # noqa: E402


def _demo_mix(workdir: str) -> str:
    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.ingest.pipeline import BuildOptions, build_mix

    out = os.path.join(workdir, "demo-mix")
    build_mix(load_mix(default_mix_path()), out, BuildOptions(workers=2, progress=False))
    return out


def parity(device: str, steps: int, workdir: str) -> dict:
    """Train the micro preset on the CPU reference and on ``device``; compare digests."""
    from open1b_train import runlog
    from open1b_train.train import train

    mix = _demo_mix(workdir)
    lines = {}
    for name, backend in (("cpu", "cpu"), (device, "auto" if device == "cuda" else "cpu")):
        run = os.path.join(workdir, f"run-{name}-{len(lines)}")
        cfg = dataclasses.replace(micro(), steps=steps, backend=backend)
        t0 = time.perf_counter()
        train(cfg, mix, run, progress=False, echo=lambda m: None)
        lines[f"{name}-{len(lines)}"] = (runlog.read(run), time.perf_counter() - t0)
    (a, ta), (b, tb) = lines.values()
    diff = [(x["step"], c) for x, y in zip(a[1:], b[1:]) for c in x["components"]
            if x["components"][c] != y["components"][c]]
    return {"steps": steps, "equal": not diff and a[-1]["hash"] == b[-1]["hash"],
            "mismatches": diff[:10], "run_hash": b[-1]["hash"],
            "seconds_reference": round(ta, 2), "seconds_device": round(tb, 2)}


GOLDEN = ("micro", "demo")


def build_golden_mixes(dst: str) -> list[str]:
    """The golden trajectories' mixes, built here into ``dst/golden-mix-<name>``: a machine
    whose pyarrow or tokenizers differs writes other shard bytes (open1b_data/formats/
    shards.py: the environment fixes them), so a device run trains on mixes carried from a
    machine that rebuilds the committed fingerprints, as an auditor trains on the published
    mix rather than a rebuilt one."""
    from open1b_audit.selftest import trajectory as tj

    return [tj.build_mix(name, os.path.join(dst, f"golden-mix-{name}")) for name in GOLDEN]


def compare_mixes(a: str, b: str) -> dict:
    """Which of two builds' files differ (by their manifests' records of the files' bytes,
    each manifest checked against its fingerprint on loading), and whether their documents
    agree (every shard's Merkle root - tokens and provenance - equal). Files may differ
    where the fingerprints agree: the fingerprint is content (docs/FORMATS.md)."""
    from open1b_data.formats.manifest import load_manifest, tokenizer_files

    def files(mix: str) -> tuple[str, dict[str, str], dict[str, str | None]]:
        m = load_manifest(mix)
        hashes = {f["path"]: f["sha256"] for f in tokenizer_files(m.tokenizer)}
        shards = [sh for src in m.sources for sh in src.shards]
        hashes.update({sh.path: sh.sha256 for sh in shards})
        hashes.update({sh.lengths_path: sh.lengths_content for sh in shards})
        return m.fingerprint, hashes, {sh.path: sh.merkle and sh.merkle.root for sh in shards}

    (fa, ha, ra), (fb, hb, rb) = files(a), files(b)
    return {"fingerprint_equal": fa == fb,
            "files_differing": sorted(p for p in ha.keys() | hb.keys() if ha.get(p) != hb.get(p)),
            "tokens_equal": ra == rb}


def golden(device: str, dry_run: bool, workdir: str, mixes: str | None = None) -> dict:
    """The golden trajectories trained on ``device``, compared step by step, component by
    component with the committed ones (the dry run: their first steps on the CPU). With
    ``mixes`` (a folder ``build_golden_mixes`` filled) their mixes are read from there,
    else built here."""
    import pyarrow
    import tokenizers

    from open1b_audit.selftest import trajectory as tj
    from open1b_data.formats.manifest import load_manifest

    out = {}
    for name, dry_steps in zip(GOLDEN, (2, 1)):
        with open(ROOT / "tests" / "assets" / f"trajectory_{name}.json") as f:
            gold = json.load(f)
        steps = dry_steps if dry_run else gold["steps"]
        mix = (os.path.join(mixes, f"golden-mix-{name}") if mixes
               else tj.build_mix(name, os.path.join(workdir, f"golden-mix-{name}")))
        fingerprint = load_manifest(mix).fingerprint
        t0 = time.perf_counter()
        if fingerprint != gold["mix_fingerprint"]:
            diff = {"step": 0, "component": "mix fingerprint", "mix": "carried" if mixes
                    else f"built here with pyarrow {pyarrow.__version__}, tokenizers "
                         f"{tokenizers.__version__} (carry one: --mixes)"}
        else:
            lines = tj.train_lines(name, mix, os.path.join(workdir, f"golden-run-{name}"),
                                   steps=steps, backend="auto" if device == "cuda" else "cpu")
            diff = tj.first_difference(dict(gold, lines=gold["lines"][:steps]), lines)
            if diff is None and len(lines) != steps + 1:   # a short log matches nothing
                diff = {"step": len(lines), "component": "missing steps"}
        out[name] = {"steps": steps, "equal": diff is None, "first_difference": diff,
                     "mix": "carried" if mixes else "built here",
                     "seconds": round(time.perf_counter() - t0, 2)}
        if mixes:   # the rebuild here, file by file against the carried one (docs/FORMATS.md)
            rebuilt = tj.build_mix(name, os.path.join(workdir, f"golden-rebuild-{name}"))
            out[name]["rebuilt_here"] = {"pyarrow": pyarrow.__version__,
                                         "tokenizers": tokenizers.__version__,
                                         **compare_mixes(mix, rebuilt)}
    return out


def _timed(fn, device: str, repeats: int) -> float:
    """Median seconds of ``fn()`` (one warm-up call first)."""
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def speed(device: str, dry_run: bool, repeats: int, partial=None) -> dict:
    """One optimizer step of ours vs the compiled stock model (see the module docstring).
    ``partial(result so far)`` is called once ours is timed (its first call - Triton's
    first-use compilation included - and its median), before the stock model compiles:
    a run cut short by its time limit still returns our step's figures."""
    from open1b_train import statehash
    from open1b_train.optimstate import OptimState
    from open1b_train.reduction.gradient import MicroBatch, reduce_step
    from open1b_train.step import apply_update
    from benchmarks.train.stock_model import StockModel, optimizer
    from benchmarks.train.stock_model import train_step as stock_step

    cfg = open1b() if not dry_run else dataclasses.replace(
        micro(), model=dataclasses.replace(micro().model, vocab=512))
    batch, seq = (4, 4096) if not dry_run else (2, 64)
    mc = cfg.model
    specs = param_specs(mc)
    layout = Layout(specs)
    params = init_params(mc, 42, device)
    opt = OptimState(layout.zeros(device), layout.zeros(device))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, mc.vocab, (batch, seq + 1), generator=g).to(device)
    mb = [[MicroBatch(0, 0, tuple(range(batch)), tokens)]]
    state = {"step": 0}

    def ours():
        state["step"] += 1
        red = reduce_step(cfg, params, layout, mb, device=device)
        apply_update(cfg, specs, params, layout, red.grad, red.loss, opt, state["step"], 1e-5)
        return red

    t0 = time.perf_counter()
    ours()                                  # the first call compiles every kernel it runs
    if device == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    t_ours = _timed(ours, device, repeats)
    red = ours()
    n = batch * seq
    mine = {"preset": "open1b" if not dry_run else "micro (dry run)", "tokens": n,
            "ours_first_call_seconds": round(first_s, 2),
            "ours_tokens_per_s": round(n / t_ours, 1), "step_seconds": round(t_ours, 4)}
    if partial is not None:
        partial(dict(mine))

    def hashing():
        statehash.tensors_digest(layout.views(red.grad))
        statehash.tensors_digest(params)
        statehash.optim_digest(layout.views(opt.m), layout.views(opt.v), 1, 0)

    t_hash = _timed(hashing, device, repeats)
    params.clear()                         # free ours before the stock model is built
    opt.m = opt.v = red = None
    if device == "cuda":
        torch.cuda.empty_cache()
    stock = StockModel(mc).to(device)
    stock.load_from(init_params(mc, 42, device))
    if device == "cuda" and not dry_run:
        for blk in stock.layers:
            blk.compile()
    sopt = optimizer(stock, 1e-5)
    ids, labels = tokens[:, :-1], tokens[:, 1:]
    t_stock = _timed(lambda: stock_step(stock, sopt, [(ids, labels)], 1e-5), device, repeats)
    return {**mine, "stock_compiled_tokens_per_s": round(n / t_stock, 1),
            "ratio_ours_over_stock": round(t_stock / t_ours, 3),
            "hash_seconds": round(t_hash, 4), "hash_share_of_step": round(t_hash / t_ours, 4),
            "stock_step_seconds": round(t_stock, 4)}


def collectives(device: str, dry_run: bool, workdir: str, repeats: int) -> dict:
    """Section 4 (see the module docstring) on a one-process group."""
    import torch.distributed as dist

    from open1b_train import runlog
    from open1b_train.distributed import collectives as C
    from open1b_train.distributed.engine import train_distributed
    from open1b_train.distributed.exchange import Exchange
    from open1b_train.distributed.placement import Placement
    from open1b_train.train import train

    if not dist.is_initialized():
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("nccl" if device == "cuda" else "gloo",
                                init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    R, S, n = 4, 2, (16 << 20) if not dry_run else (1 << 16)
    g = torch.Generator().manual_seed(3)
    grads = [(torch.randn(n, generator=g) * 10.0 ** torch.randint(-6, 6, (n,), generator=g)
              ).to(device) for _ in range(R * S)]
    cut = n // 2
    slices = [(0, cut), (cut, n)]
    pl = Placement(R, S, 1, 0)
    ex = Exchange(pl)

    def ours():
        return C.all_reduce(C.reduce_scatter({v: grads[v] for v in pl.local}, slices, ex), ex)

    red = ours()
    want = C.all_reduce_reference(C.reduce_scatter_reference(grads, R, S, slices))
    equal = all(torch.equal(t.view(torch.int32), want[slice(*slices[v % S])].view(torch.int32))
                for v, t in red.items())
    t_ours = _timed(ours, device, repeats)
    t_ref = _timed(lambda: C.all_reduce_reference(C.reduce_scatter_reference(grads, R, S, slices)),
                   device, repeats)
    mix = os.path.join(workdir, "demo-mix")
    if not os.path.exists(os.path.join(mix, "manifest.json")):
        mix = _demo_mix(workdir)
    cfg = dataclasses.replace(micro(), steps=2, mesh=(2, 1),   # the demo's batch: 2 x 4
                              backend="auto" if device == "cuda" else "cpu")
    a, b = os.path.join(workdir, "dist-1p"), os.path.join(workdir, "single")
    train_distributed(cfg, mix, a, progress=False, echo=lambda m: None)
    train(cfg, mix, b, progress=False, echo=lambda m: None)
    dist.destroy_process_group()
    same = runlog.read(a)[-1]["hash"] == runlog.read(b)[-1]["hash"]
    return {"backend": "nccl" if device == "cuda" else "gloo", "mesh": [R, S],
            "bytes_per_rank": 4 * n, "collectives_equal_reference": equal,
            "seconds_ours": round(t_ours, 5), "seconds_sequential_reference": round(t_ref, 5),
            "distributed_trainer_equals_single_process": same}


SECTIONS = ("parity", "golden", "collectives", "speed")


def train_check(dry_run: bool = False, steps: int = 2, repeats: int = 3,
                sections: tuple[str, ...] = SECTIONS, on_section=None,
                mixes: str | None = None) -> dict:
    """The chosen sections, in ``SECTIONS`` order: the bitwise ones first, the speed one (which
    compiles the stock model) last. A section that raises is recorded as ``{"error": ...}`` and
    the others still run; ``on_section(result so far)`` after each one lets the caller write
    partial results, which a device lease cut short by its time limit still returns."""
    device = "cpu" if dry_run else "cuda"
    if not dry_run and not torch.cuda.is_available():
        raise RuntimeError("--train needs a CUDA device (use --train-dry-run on a CPU)")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown training sections {unknown}; choose from {list(SECTIONS)}")
    out: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}

    def speed_so_far(res: dict) -> None:      # ours timed, the stock model still to come
        out["speed"] = {**res, "stock": "not yet timed"}
        if on_section is not None:
            on_section(out)

    run = {"parity": lambda work: parity(device, steps, work),
           "golden": lambda work: golden(device, dry_run, work, mixes),
           "collectives": lambda work: collectives(device, dry_run, work, repeats),
           "speed": lambda work: speed(device, dry_run, repeats, speed_so_far)}
    with tempfile.TemporaryDirectory(prefix="open1b-gpu-train-") as work:
        for name in (s for s in SECTIONS if s in sections):
            t0 = time.perf_counter()
            try:
                out[name] = run[name](work)
            except Exception as exc:  # one broken section must not hide the others
                import traceback

                out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300],
                             "traceback": traceback.format_exc()}
            out[name]["section_seconds"] = round(time.perf_counter() - t0, 2)
            if device == "cuda":
                torch.cuda.empty_cache()
            if on_section is not None:
                on_section(out)
    return out


def passed(r: dict) -> bool:
    """Every section that ran agreed bit for bit (a section that raised did not)."""
    checks = {"parity": lambda p: p["equal"],
              "golden": lambda g: all(t["equal"] for t in g.values() if isinstance(t, dict)),
              "collectives": lambda c: (c["collectives_equal_reference"]
                                        and c["distributed_trainer_equals_single_process"]),
              "speed": lambda s: True}
    return all("error" not in r[k] and ok(r[k]) for k, ok in checks.items() if k in r)


def format_report(r: dict) -> str:
    lines = [f"training check on {r['device']}"]
    for name in (s for s in SECTIONS if s in r):
        sec = r[name]
        if "error" in sec:
            lines.append(f"  {name}: ERROR {sec['error']}")
            continue
        lines.extend(_section_lines(name, sec, r["device"]))
    return "\n".join(lines)


def _section_lines(name: str, sec: dict, device: str) -> list[str]:
    if name == "parity":
        return [f"  micro preset, {sec['steps']} steps, CPU reference vs device: "
                f"{'IDENTICAL' if sec['equal'] else 'DIFFERENT ' + str(sec['mismatches'])} "
                f"(run hash {sec['run_hash'][:16]}...)"]
    if name == "speed" and "stock_compiled_tokens_per_s" not in sec:   # cut after ours
        return [f"  {sec['preset']} step of {sec['tokens']:,} tokens: ours "
                f"{sec['ours_tokens_per_s']:,.0f} tokens/s (first call "
                f"{sec['ours_first_call_seconds']:.1f} s); the stock model was not timed"]
    if name == "speed":
        return [f"  {sec['preset']} step of {sec['tokens']:,} tokens: ours "
                f"{sec['ours_tokens_per_s']:,.0f} tokens/s, stock compiled "
                f"{sec['stock_compiled_tokens_per_s']:,.0f} tokens/s, "
                f"ratio {sec['ratio_ours_over_stock']:.3f}x",
                f"  hashing params + gradient + moments: {sec['hash_seconds']:.4f} s = "
                f"{100 * sec['hash_share_of_step']:.2f}% of the step"]
    if name == "golden":
        return [f"  golden {tname} trajectory, {g['steps']} steps on {device}: "
                + ("EQUAL to the committed one" if g["equal"] else
                   f"DIFFERS at step {g['first_difference']['step']} "
                   f"({g['first_difference']['component']}"
                   + (f"; mix {g['first_difference']['mix']}" if "mix" in g["first_difference"]
                      else "") + ")") + f", {g['seconds']:.1f} s"
                for tname, g in sec.items() if isinstance(g, dict)]
    return [f"  collectives ({sec['backend']}, mesh 4x2, {sec['bytes_per_rank'] / 2**20:.0f} MiB "
            f"per rank): {'IDENTICAL' if sec['collectives_equal_reference'] else 'DIFFERENT'} "
            f"to the sequential reference, {sec['seconds_ours'] * 1e3:.1f} ms; distributed "
            "trainer " + ("=" if sec["distributed_trainer_equals_single_process"] else "!=")
            + " single process"]
