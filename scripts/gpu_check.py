"""GPU check of the reproducible-operations runtime: parity, PTX scan, speed vs PyTorch.

Run it as-is on any machine with an NVIDIA GPU, after building the C extensions there
(the CPU references run them):

    python setup.py -q build_ext --inplace
    python scripts/gpu_check.py --budget-s 480 --mixes gpumix --out gpu_check.json

One run is a plan of sections, most important first (scripts/gpu_plan.py): the card's
ceilings, the goal ops (causal attention first, then the kernels redesigned toward the
roofline), one full Open-1B step against the per-block compiled stock model, the golden
trajectories on the GPU, then every other op and the remaining training checks. A section
starts only if its estimate fits what is left of ``--budget-s`` and is cut by an alarm if
it overruns; the JSON (``--out``) is rewritten after every section, so a lease that ends
early still returns the first figures, and ``--resume gpu_check.json`` runs only what the
last run did not finish. ``--dry-run`` prints the plan and its budget without a GPU.

For every ``GPU_CHECKS`` entry of every ``kernels.<noun>`` module (open1b_kernels/core/registry.py):
1. parity: the op on CUDA (Triton) vs the CPU reference on the same inputs, bit for bit;
   mismatched elements are counted per output (NaN positions must agree; payloads are
   outside the contract). Shapes are the check's ``parity_scale`` of Open-1B's: the CPU
   reference runs only there, never at the speed shape.
2. PTX scan: every Triton kernel the op compiled is searched for instructions the
   contract forbids: float fma/mad (contraction), ``.approx``, ``.ftz`` (flush to zero),
   ``ex2``, ``lg2``, ``rsqrt``, ``div.full``.
3. speed: median of CUDA-event timings of the op and of stock PyTorch doing the same job
   (``torch_baseline``), same GPU, same run, at ``bench_scale``; ratio = torch / ours
   (>= 1 means we are faster), achieved bandwidth against the memory roofline.

The training checks are scripts/gpu_train.py's. The golden trajectories must train on
their committed mixes, and a machine whose pyarrow or tokenizers differs rebuilds other
shard bytes (docs/FORMATS.md): build them where the fingerprints match and carry them
(``--build-mixes DIR`` there, ``--mixes DIR`` on the GPU machine).

Without CUDA it exits with status 2. ``--ptx-only`` needs no GPU: it compiles every
kernel on the real launch path for sm_90 (the H200's architecture) without launching,
runs the PTX scan, and reports each kernel's registers, stack frame, local-memory
instructions (spills) and instruction count from the cubin (``cuobjdump``, shipped with
Triton). CI runs that whole scan (tests/kernels/test_gpu_check.py), because the Triton
interpreter executes kernels with numpy and cannot see an approximate instruction; only
the compiled PTX shows one. It compiles in this one process: spread over two spawned
processes on the project's 2-vCPU VM it took 5.9-6.1 min against 3.0 min here (34
checks, load average 3-5, 2026-12-01). With another Triton on ``PYTHONPATH`` (the GPU
machine's 3.6, unpacked from its wheel) it shows what that compiler makes of the kernels.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))      # gpu_train beside this file

import gpu_device  # noqa: E402
import gpu_plan  # noqa: E402
import gpu_train  # noqa: E402
from open1b_kernels.core import backend  # noqa: E402
from open1b_kernels.core.registry import FORBIDDEN, GpuCheck, discover  # noqa: E402

PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}


# ------------------------------------------------------------------ kernel capture
class KernelRecorder:
    """Wraps JITFunction.run to record every compiled kernel (optionally without launching)."""

    def __init__(self, compile_only: bool) -> None:
        from triton.runtime.jit import JITFunction

        self.jit_cls, self.original = JITFunction, JITFunction.run
        self.compile_only = compile_only
        self.kernels: dict[str, object] = {}

    def __enter__(self) -> "KernelRecorder":
        recorder = self

        def run(fn, *args, grid, warmup, **kwargs):
            kernel = recorder.original(fn, *args, grid=grid, warmup=warmup or recorder.compile_only,
                                       **kwargs)
            if kernel is not None:
                recorder.kernels[f"{fn.fn.__module__}.{fn.fn.__name__}#{id(kernel)}"] = kernel
            return kernel

        self.jit_cls.run = run
        return self

    def __exit__(self, *exc) -> None:
        self.jit_cls.run = self.original

    def scan(self) -> dict[str, dict[str, int]]:
        """{kernel name: {forbidden pattern: count}} for kernels with any hit."""
        hits: dict[str, dict[str, int]] = {}
        for name, kernel in self.kernels.items():
            ptx = kernel.asm.get("ptx", "")
            body = "\n".join(line for line in ptx.splitlines() if not line.lstrip().startswith("//"))
            found = {k: len(p.findall(body)) for k, p in FORBIDDEN.items() if p.search(body)}
            if found:
                hits[name.split("#")[0]] = found
        return hits


class _OfflineDriver:
    """Just enough of a Triton driver to compile for sm_90 on a machine without a GPU."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


# ------------------------------------------------------------------ measurements
def mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (NaN positions must agree; NaN payloads are not compared)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return max(a.numel(), b.numel())
    a, b = a.detach().cpu().reshape(-1), b.detach().cpu().reshape(-1)
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        itype = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        differ = (a.view(itype) != b.view(itype)) & ~(na & nb)
        return int(differ.sum())
    return int((a != b).sum())


def call(check: GpuCheck, fn, args):
    return fn(check.fresh(args) if check.fresh else args)


def time_ms(check: GpuCheck, fn, args, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        call(check, fn, args)
    times = []
    for _ in range(repeats):
        a = check.fresh(args) if check.fresh else args
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(a)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_check(module: str, check: GpuCheck, repeats: int, do_parity: bool, do_bench: bool,
              peak_gbps: float | None) -> dict:
    row: dict = {"name": check.name, "module": module, "notes": check.notes}
    with KernelRecorder(compile_only=False) as rec:
        if do_parity:
            t0 = time.time()
            gpu_out = call(check, check.run, check.make_inputs(check.parity_scale, "cuda"))
            torch.cuda.synchronize()
            gpu_out = [t.detach().cpu() for t in gpu_out]
            cpu_out = call(check, check.run, check.make_inputs(check.parity_scale, "cpu"))
            row["parity_shape"] = check.describe(check.parity_scale)
            row["mismatched"] = [mismatches(a, b) for a, b in zip(gpu_out, cpu_out)]
            row["elements"] = [t.numel() for t in gpu_out]
            row["parity_s"] = round(time.time() - t0, 2)
            del gpu_out, cpu_out
        if do_bench:
            args = check.make_inputs(check.bench_scale, "cuda")
            ours = time_ms(check, check.run, args, repeats)
            theirs = time_ms(check, check.torch_baseline, args, repeats)
            cost = check.cost(args)
            row.update(bench_shape=check.describe(check.bench_scale), ours_ms=ours, torch_ms=theirs,
                       ratio=theirs / ours, gbps=cost.bytes / ours / 1e6,
                       tflops=cost.flops / ours / 1e9, bound=check.bound)
            if peak_gbps:
                row["roofline"] = row["gbps"] / peak_gbps
            del args
    row["ptx_forbidden"] = rec.scan()
    row["kernels"] = sorted({k.split("#")[0] for k in rec.kernels})
    torch.cuda.empty_cache()
    return row


def ptx_only_check(module: str, check: GpuCheck, scale: float) -> dict:
    row: dict = {"name": check.name, "module": module}
    try:
        with KernelRecorder(compile_only=True) as rec, backend.force("triton"):
            call(check, check.run, check.make_inputs(scale, "cpu"))
    except Exception as exc:  # one op that fails to compile must not hide the others
        return {**row, "error": short_error(exc), "traceback": traceback.format_exc()}
    row["ptx_forbidden"] = rec.scan()
    row["kernels"] = sorted({k.split("#")[0] for k in rec.kernels})
    row["resources"] = {k.split("#")[0]: gpu_device.resources(kern)
                        for k, kern in rec.kernels.items()}
    return row


def go_offline() -> None:
    """Compile for sm_90 in this process without a GPU (nothing is ever launched)."""
    from triton.runtime.driver import driver

    driver.set_active(_OfflineDriver())
    backend.triton_available = lambda: True


def short_error(exc: BaseException) -> str:
    """One line: the innermost cause's type and message (Triton errors embed source)."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [ln for ln in str(root).splitlines() if ln.strip() and ln.strip() != "^"]
    return f"{type(root).__name__}: {lines[-1].strip() if lines else ''}"[:300]


# ------------------------------------------------------------------ report
def fmt_table(rows: list[dict]) -> str:
    head = ("| op | parity shape | mismatched / elements | forbidden PTX | bench shape | ours ms "
            "| torch ms | torch/ours | GB/s (roofline) |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | ERROR: {r['error'][:120]} |" + " |" * 7)
            continue
        mm = (" + ".join(str(m) for m in r["mismatched"]) + " / " + " + ".join(str(e) for e in r["elements"])
              if "mismatched" in r else "-")
        ptx = "none" if not r.get("ptx_forbidden") else "; ".join(
            f"{k.split('.')[-1]}: {v}" for k, v in r["ptx_forbidden"].items())
        bench = "| - | - | - | - | - |"
        if "ours_ms" in r:
            roof = f" ({100 * r['roofline']:.0f}%)" if "roofline" in r else ""
            bench = (f"| {r['bench_shape']} | {r['ours_ms']:.3f} | {r['torch_ms']:.3f} | "
                     f"{r['ratio']:.2f}x | {r['gbps']:.0f}{roof} |")
        lines.append(f"| {r['name']} | {r.get('parity_shape', '-')} | {mm} | {ptx} {bench}")
    return "\n".join(lines)


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)


class BudgetCut(BaseException):
    """The section ran past what was left of ``--budget-s`` (a BaseException, so that the
    sections' own ``except Exception`` handlers do not swallow it)."""


def _alarm(signum, frame):
    raise BudgetCut()


def _cuda(fn) -> None:
    if torch.cuda.is_available():
        fn()


def run_plan(fitted: list, checks: dict, payload: dict, out: Path, budget_s: float,
             repeats: int, parity: bool, bench: bool, mixes: str | None) -> bool:
    """Run the planned sections in order within the budget; True when every one that ran
    agreed bit for bit. The JSON is rewritten after each section."""
    start, bad = time.monotonic(), False
    rows, skipped = payload["results"], payload.setdefault("not_run", [])
    signal.signal(signal.SIGALRM, _alarm)
    for section, what in fitted:
        left = budget_s - (time.monotonic() - start)
        if what != "run" or section.estimate_s > left:
            skipped.append({"section": section.key,
                            "why": what if what != "run" else "over budget"})
            continue
        click.echo(f"[{time.monotonic() - start:6.1f} s] {section.key} "
                   f"(~{section.estimate_s:.0f} s, {left:.0f} s left)", err=True)
        t0 = time.monotonic()
        signal.alarm(max(1, int(left)))
        try:
            if section.kind == "ceilings":
                payload["ceilings"] = gpu_device.ceilings()
                if payload["meta"].get("peak_source") != "--peak-gbps":
                    payload["meta"].update(peak_gbps=payload["ceilings"]["copy_gbps"],
                                           peak_source="measured copy")
            elif section.kind == "op":
                module, check = checks[section.name]
                try:
                    row = run_check(module, check, repeats, parity, bench,
                                    payload["meta"].get("peak_gbps"))
                except Exception as exc:  # one failing op must not hide the others
                    row = {"name": check.name, "module": module, "error": short_error(exc),
                           "traceback": traceback.format_exc()}
                    _cuda(torch.cuda.empty_cache)
                rows.append(row)
                bad |= bool(row.get("error") or row.get("ptx_forbidden")
                            or any(row.get("mismatched", [])))
            else:
                bad |= not train_checks((section.name,), out, payload, mixes)
        except BudgetCut:
            signal.alarm(0)
            skipped.append({"section": section.key, "why": "cut: ran past the budget",
                            "seconds": round(time.monotonic() - t0, 1)})
            _cuda(torch.cuda.synchronize)
            write_json(out, payload)
            return False
        signal.alarm(0)
        payload.setdefault("seconds", {})[section.key] = round(time.monotonic() - t0, 1)
        write_json(out, payload)
    return not bad


@click.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("gpu_check.json"),
              show_default=True, help="Where to write the JSON results.")
@click.option("--only", default=None, help="Run only checks whose name contains this text.")
@click.option("--repeats", default=10, show_default=True, help="Timed repeats per op (median).")
@click.option("--budget-s", type=float, default=480.0, show_default=True,
              help="Seconds the planned sections may take (a section starts only if its "
                   "estimate fits what is left, and is cut when it overruns it).")
@click.option("--resume", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A previous run's JSON: skip the sections it holds, keep "
                                 "its results, and write the union to --out.")
@click.option("--dry-run", is_flag=True, help="Print the plan and its budget (no GPU needed).")
@click.option("--no-parity", is_flag=True, help="Skip the CPU-reference parity comparison.")
@click.option("--no-bench", is_flag=True, help="Skip the timing against stock PyTorch.")
@click.option("--ptx-only", is_flag=True, help="No GPU needed: compile for sm_90 and scan PTX only.")
@click.option("--ptx-scale", default=1 / 256, show_default=True, help="Input scale for --ptx-only.")
@click.option("--peak-gbps", type=float, default=None,
              help="Memory bandwidth for the roofline column (default: the measured copy "
                   "ceiling, else by GPU name).")
@click.option("--train/--no-train", default=True, show_default=True,
              help="Also the training checks (scripts/gpu_train.py): micro-preset step hashes "
                   "CPU vs GPU, the golden trajectories, one full Open-1B step vs the "
                   "compiled stock model, hashing share, collectives on a one-process NCCL group.")
@click.option("--train-sections", default=",".join(gpu_train.SECTIONS),
              show_default=True, help="Which training checks to plan (comma-separated; the "
              "plan orders them: speed after the causal attention check, golden after the "
              "goal ops, the others last: scripts/gpu_plan.py).")
@click.option("--ops/--no-ops", default=True, show_default=True,
              help="The per-op checks (parity, PTX scan, speed of every open1b_kernels/ op).")
@click.option("--mixes", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=None,
              help="A folder of golden-trajectory mixes built on a machine that rebuilds the "
                   "committed fingerprints (--build-mixes); the golden section trains on them "
                   "instead of building its own.")
@click.option("--build-mixes", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Only build the golden trajectories' mixes into this folder (no GPU needed) "
                   "and exit; carry the folder to the GPU machine and pass it as --mixes.")
@click.option("--train-dry-run", is_flag=True,
              help="Only the training checks, on the CPU with tiny shapes (no GPU needed).")
def main(out, only, repeats, budget_s, resume, dry_run, no_parity, no_bench, ptx_only,
         ptx_scale, peak_gbps, train, train_sections, ops, mixes, build_mixes, train_dry_run):
    """Parity, PTX scan and speed of every open1b_kernels/ op on this machine's GPU, then whole
    training steps and collectives, in order of importance within a time budget."""
    sections = tuple(x.strip() for x in train_sections.split(",") if x.strip())
    unknown = sorted(set(sections) - set(gpu_train.SECTIONS))
    if unknown:
        raise click.BadParameter(f"unknown sections {unknown}; choose from "
                                 f"{', '.join(gpu_train.SECTIONS)}", param_hint="--train-sections")
    if budget_s <= 0:
        raise click.BadParameter(f"must be positive, got {budget_s}", param_hint="--budget-s")
    mixes = str(mixes) if mixes else None
    if build_mixes:
        for path in gpu_train.build_golden_mixes(str(build_mixes)):
            click.echo(path)
        sys.exit(0)
    if train_dry_run:
        res = gpu_train.train_check(dry_run=True, steps=1, repeats=1, sections=sections,
                                    mixes=mixes)
        click.echo(gpu_train.format_report(res))
        write_json(out, {"mode": "train-dry-run", "train": res})
        sys.exit(0 if gpu_train.passed(res) else 1)
    checks, errors = discover(only)
    previous = _previous(resume)
    fitted = gpu_plan.fit(gpu_plan.make_plan([c.name for _, c in checks], sections, ops, train,
                                             gpu_plan.previous_seconds(repeats=repeats)),
                          budget_s, gpu_plan.done_keys(previous))
    if dry_run:
        click.echo(gpu_plan.format_plan(fitted, budget_s))
        sys.exit(1 if errors else 0)
    if not backend.HAVE_TRITON:
        click.echo("gpu_check: triton is not installed; install the 'gpu' extra (pip install -e '.[gpu]').",
                   err=True)
        sys.exit(2)
    if backend.interpreting():
        click.echo("gpu_check: unset TRITON_INTERPRET; this script compiles real kernels.", err=True)
        sys.exit(2)
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "triton": __import__("triton").__version__,
            "host": platform.node(), "python": platform.python_version()}
    rows: list[dict] = [{"name": e["module"], **e} for e in errors]
    if ptx_only:
        meta["device"] = "none (compile-only, target sm_90)"
        for r in rows:
            click.echo(f"{r['name']:32s} kernels=0 forbidden={r['error']}")
        go_offline()
        for module, check in checks:
            r = ptx_only_check(module, check, ptx_scale)
            rows.append(r)
            status = r.get("error") or (r["ptx_forbidden"] or "clean")
            click.echo(f"{r['name']:32s} kernels={len(r.get('kernels', []))} forbidden={status}")
        write_json(out, {"meta": meta, "mode": "ptx-only", "results": rows})
        sys.exit(1 if any(r.get("error") or r.get("ptx_forbidden") for r in rows) else 0)
    if not torch.cuda.is_available():
        click.echo("gpu_check: no CUDA device found. This script needs an NVIDIA GPU; "
                   "use --ptx-only to compile and scan the kernels without one.", err=True)
        sys.exit(2)
    name = torch.cuda.get_device_name()
    meta.update(device=name, budget_s=budget_s, repeats=repeats)
    payload: dict = {"meta": meta, "mode": "full",
                     "results": rows + list(previous.get("results", [])),
                     "train": dict(previous.get("train", {}))}
    if "ceilings" in previous:
        payload["ceilings"] = previous["ceilings"]
    click.echo(gpu_plan.format_plan(fitted, budget_s), err=True)
    # the roofline column: --peak-gbps, else the copy ceiling once measured, else the
    # datasheet's figure by the card's name
    meta["peak_gbps"] = peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in name), None)
    meta["peak_source"] = "--peak-gbps" if peak_gbps else "datasheet"
    if payload.get("ceilings") and not peak_gbps:
        meta.update(peak_gbps=payload["ceilings"]["copy_gbps"], peak_source="measured copy")
    by_name = {c.name: (m, c) for m, c in checks}
    ok = run_plan(fitted, by_name, payload, out, budget_s, repeats, not no_parity,
                  not no_bench, mixes)
    click.echo(f"\n{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
               f"{meta['date']}\n")
    if payload.get("ceilings"):
        click.echo(f"ceilings: copy {payload['ceilings']['copy_gbps']:.0f} GB/s, bf16 mm "
                   f"{payload['ceilings']['bf16_mm_tflops']:.0f} TFLOP/s")
    click.echo(fmt_table(payload["results"]))
    if payload["train"]:
        click.echo("\n" + gpu_train.format_report({"device": name, **payload["train"]}))
    for s in payload.get("not_run", []):
        click.echo(f"not run: {s['section']} ({s['why']})")
    write_json(out, payload)
    sys.exit(0 if ok and not errors else 1)


def _previous(path: Path | None) -> dict:
    """A previous run's JSON (--resume), refused with one line if it is not one."""
    if path is None:
        return {}
    try:
        previous = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise click.BadParameter(f"{path} is not a gpu_check JSON ({exc}); give the --out "
                                 "file of an earlier run", param_hint="--resume") from None
    if not isinstance(previous, dict) or previous.get("mode") != "full":
        raise click.BadParameter(f"{path} is not the JSON of a full gpu_check run (mode "
                                 f"{previous.get('mode') if isinstance(previous, dict) else None!r})",
                                 param_hint="--resume")
    return previous


def train_checks(sections: tuple[str, ...], out: Path, payload: dict,
                 mixes: str | None) -> bool:
    """The training checks of scripts/gpu_train.py, merged into ``payload["train"]`` and
    written after each section (and once more when the step's own half is timed); True
    when every one that ran agreed bit for bit."""
    def flush(res: dict) -> None:
        payload["train"] = {**payload.get("train", {}), **res}
        write_json(out, payload)

    try:
        res = gpu_train.train_check(sections=sections, on_section=flush, mixes=mixes)
    except Exception as exc:
        payload["train"] = {**payload.get("train", {}), "error": short_error(exc),
                            "traceback": traceback.format_exc()}
        click.echo(f"training checks failed: {payload['train']['error']}")
        return False
    flush(res)
    return gpu_train.passed(res)


if __name__ == "__main__":
    main()
