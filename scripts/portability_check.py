"""The portability matrix (docs/PORTABILITY.md): the golden trajectories, and the replay of
one demo step, under every CPU dispatch level, oneDNN ISA, thread count, math-extension
setting, flush-to-zero state, torch / numpy / Python release we can reach - each variant in
its own process - recording "equal" or the first differing step and component.

    python scripts/portability_check.py                   # every row; table on stdout
    python scripts/portability_check.py --rows threads-3 fma-control --steps 10
    python scripts/portability_check.py --json out.json --markdown table.md
    python scripts/portability_check.py --inside [...]    # one variant, in this process

The toolchain rows run interpreters of scripts/portability_envs.sh's environments (ENVS,
default /tmp/open1b-envs) on a copy of this checkout with the C extensions built for them;
a missing environment is reported as "not set up". The FMA row is the negative control: the
loop extensions of core, ops and int8 compiled with -ffp-contract=fast -mfma, loaded in place
of the real ones - the matrix must show a difference there, and ``open1b-audit bisect`` must
name the operator.
"""
from __future__ import annotations

import argparse
import datetime
import glob
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(ROOT, "tests", "assets")
ENVS = os.environ.get("ENVS", "/tmp/open1b-envs")

# name -> (environment additions, inside arguments, interpreter environment or None)
ROWS: dict[str, tuple[dict[str, str], list[str], str | None]] = {
    "baseline": ({}, [], None),
    "aten-default": ({"ATEN_CPU_CAPABILITY": "default"}, [], None),
    "aten-avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, [], None),
    "aten-avx512": ({"ATEN_CPU_CAPABILITY": "avx512"}, [], None),
    "onednn-sse41": ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, [], None),
    "onednn-avx2": ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, [], None),
    "onednn-avx512-core": ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, [], None),
    "threads-1": ({"OMP_NUM_THREADS": "1"}, ["--threads", "1"], None),
    "threads-2": ({"OMP_NUM_THREADS": "2"}, ["--threads", "2"], None),
    "threads-3": ({"OMP_NUM_THREADS": "3"}, ["--threads", "3"], None),
    "threads-7": ({"OMP_NUM_THREADS": "7"}, ["--threads", "7"], None),
    "mathc-off": ({"OPEN1B_MATHC": "0"}, [], None),
    # the compiled loops' pieces on open1b_kernels.core.pieces' own thread pool instead of torch's
    # OpenMP team (open1b_kernels/core/_pieces.h), three of them
    "pool-3": ({"OPEN1B_MATHC_OMP": "0", "OMP_NUM_THREADS": "3"}, ["--threads", "3"], None),
    # the four exact integer GEMM routes (open1b_kernels.int8.route): the project's AMX tile
    # GEMM (AMX-INT8 CPUs, checked; elsewhere this row runs the float route and says so), the
    # library's int8 GEMM (fast on VNNI-class CPUs, checked), the project's int16-pair GEMM
    # (x86-64 with AVX2; elsewhere the float route) and float32 GEMMs of int8 values; auto
    # picks one per CPU
    "int-gemm-amx": ({"OPEN1B_INT_GEMM": "amx"}, [], None),
    "int-gemm-int": ({"OPEN1B_INT_GEMM": "int"}, [], None),
    "int-gemm-pairs": ({"OPEN1B_INT_GEMM": "pairs"}, [], None),
    "int-gemm-float": ({"OPEN1B_INT_GEMM": "float"}, [], None),
    # every AMX loop off (attention's tile products back to float64 BLAS products, the int8
    # GEMM to the next route auto takes): on a CPU without AMX the same as baseline
    "amx-off": ({"OPEN1B_AMX": "0"}, [], None),
    # attention's Q K^T and dO V^T back to float64 BLAS products where AVX-512 VNNI ran them
    # (open1b_kernels/attention/vnni.py; on a CPU without VNNI, or with AMX, as baseline)
    "vnni-off": ({"OPEN1B_VNNI": "0"}, [], None),
    # an AVX2 CPU on this one: the loops built with -DOPEN1B_CPU_CAP=1 (BUILDS: no copy above
    # x86-64-v3, no VNNI or AMX loop, the pair GEMM route) and torch, oneDNN and MKL capped
    # to AVX2 - the AVX2 copies of every compiled loop, which an AVX-512 CPU never runs
    "avx2-build": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX2"}, [], None),
    "flush-denormal": ({}, ["--flush-denormal"], None),
    "matmul-medium": ({}, ["--matmul-precision", "medium"], None),
    "fma-control": ({}, ["--fma-control"], None),
    # Combined rows: one 100-step run covers a value of each CPU axis at once (a difference
    # there is then split into the single rows above to name the setting).
    "cpu-a": ({"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
               "OMP_NUM_THREADS": "1"}, ["--threads", "1"], None),
    "cpu-b": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "3",
               "OPEN1B_MATHC": "0"}, ["--threads", "3"], None),
    "cpu-c": ({"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "OMP_NUM_THREADS": "7"}, ["--threads", "7", "--matmul-precision", "medium"], None),
    "torch-2.11": ({}, [], "torch211"),
    "torch-2.14.1": ({}, [], "torch214"),
    "numpy-2.3": ({}, [], "numpy23"),
    "python-3.12": ({}, [], "py312"),
}
# rows that run a copy of this checkout with its loops built with these C flags
BUILDS: dict[str, str] = {"avx2-build": "-DOPEN1B_CPU_CAP=1"}


# --------------------------------------------------------------------------- inside

# The loop extensions the negative control rebuilds with FMA contraction (folder -> module):
# every one whose float loops the trainer runs, attention's tile loops excepted (they keep
# their normal build, so a difference is the contracted loops')
FMA_EXTENSIONS = {"core": "_corec", "ops": "_opsc", "int8": "_int8c"}


def _load_fma_extension(work: str) -> str:
    """Compile the loop extensions of FMA_EXTENSIONS (every ``_*.c`` file of the folder, as
    setup.py builds them) with FMA contraction and register them in place of the real ones
    before anything imports the kernels (the negative control)."""
    out = os.path.join(work, "fma")
    os.makedirs(out, exist_ok=True)
    import numpy
    cc = os.environ.get("CC", "cc")
    built = []
    for folder, name in FMA_EXTENSIONS.items():
        so = os.path.join(out, name + sysconfig.get_config_var("EXT_SUFFIX"))
        sources = sorted(glob.glob(os.path.join(ROOT, "open1b_kernels", folder, "_*.c")))
        subprocess.run([cc, "-shared", "-fPIC", "-O3", "-std=c11", "-ffp-contract=fast",
                        "-mfma", f"-I{sysconfig.get_paths()['include']}",
                        f"-I{numpy.get_include()}", *sources, "-o", so], check=True)
        full = f"open1b_kernels.{folder}.{name}"
        spec = importlib.util.spec_from_file_location(full, so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[full] = mod
        built.append(so)
    return " ".join(built)


def inside(args) -> dict:
    """One variant in this process: the trajectories against the goldens, the demo replay."""
    t0 = time.perf_counter()
    res: dict = {"rows": {}}
    work = args.work or tempfile.mkdtemp(prefix="open1b-port-")
    if args.fma_control:
        res["fma_extension"] = _load_fma_extension(work)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.flush_denormal:
        res["flush_denormal_set"] = torch.set_flush_denormal(True)
    if args.matmul_precision:     # bfloat16 / TF32 products where the CPU or GPU has them
        torch.set_float32_matmul_precision(args.matmul_precision)
        from open1b_kernels.core import ieee
        res["matmul_precision_set"] = ieee.matmul_precision()
    from open1b_audit.selftest import machine, trajectory as tj
    res["machine"] = machine.describe()
    names = ["micro", "demo"] if args.trajectory == "all" else [args.trajectory]
    for name in names:
        with open(os.path.join(ASSETS, f"trajectory_{name}.json")) as f:
            golden = json.load(f)
        steps = min(args.steps or golden["steps"], golden["steps"])
        r: dict = {"steps": steps}
        try:
            mix = (args.mix if (args.mix and name == "micro") else
                tj.build_mix(name, os.path.join(work, f"mix-{name}")))
            with open(os.path.join(mix, "manifest.json")) as f:
                fp = json.load(f)["fingerprint"]
            if fp != golden["mix_fingerprint"]:
                r["result"] = {"step": 0, "component": "mix fingerprint"}
            else:
                run = os.path.join(work, f"run-{name}")
                shutil.rmtree(run, ignore_errors=True)
                lines = tj.train_lines(name, mix, run, steps=steps)
                r["result"] = tj.first_difference(dict(golden, lines=golden["lines"][:steps]),
                                                  lines)
                if name == "demo" and r["result"] is None and not args.no_replay:
                    from open1b_audit.replay import replay
                    rep = replay(run, steps, backend="cpu")
                    res["demo_replay"] = {"step": steps, "from": rep.start,
                                          "ok": rep.ok, "finding": None if rep.finding is None
                                          else rep.finding.to_dict()}
        except Exception as e:        # a refusal (FTZ) or a crash is this row's result
            r["error"] = f"{type(e).__name__}: {e}"
        res["rows"][name] = r
    if args.bisect:
        from open1b_audit.bisect import bisect
        b = bisect(args.bisect, args.bisect_until)
        res["bisect"] = {"step": b["step"], "finding": b["finding"], "operator": b["operator"],
                         "vouched": b["vouched"]}
    from open1b_kernels.attention import compiled
    from open1b_kernels.int8.route import int_gemm_status
    res["machine"]["int_gemm"] = int_gemm_status()   # after the work: route and failures
    # attention's exact products: every one on AMX tiles, Q K^T and dO V^T (where their low
    # digits are sparse enough, per call) and the forward's P V on VNNI, or all float BLAS
    # products
    res["machine"]["attention"] = ("AMX tiles" if compiled.tiles_in_use() else
                                   "VNNI rows and P V" if compiled.vnni_in_use() else "float64")
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


# --------------------------------------------------------------------------- outside

def copy_tree(py: str, dst: str, cflags: str = "") -> str:
    """This checkout's tracked files under ``dst`` with the C extension built for ``py``
    (with ``cflags`` added to the compiler's flags)."""
    if not os.path.exists(os.path.join(dst, "setup.py")):
        os.makedirs(dst, exist_ok=True)
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                               check=True).stdout.split(b"\0")
        for f in filter(None, files):
            src, to = os.path.join(ROOT, f.decode()), os.path.join(dst, f.decode())
            os.makedirs(os.path.dirname(to), exist_ok=True)
            shutil.copy2(src, to)
        for extra in ("open1b_audit/selftest/data", "tests/assets"):   # maybe uncommitted
            shutil.copytree(os.path.join(ROOT, extra), os.path.join(dst, extra),
                            dirs_exist_ok=True)
    # every time (up to date: a second): a copy whose build failed before is not run as is
    # (py made absolute: it runs from the copy, and an interpreter found through a relative
    # PATH entry has a relative sys.executable)
    subprocess.run([os.path.abspath(py), "setup.py", "-q", "build_ext", "--inplace"], cwd=dst,
                   check=True, capture_output=True,
                   env=dict(os.environ, CFLAGS=cflags) if cflags else None)
    return dst


def reference_run(work: str) -> str:
    """A micro trajectory prefix trained here (4 steps, traces published) for bisect."""
    run = os.path.join(work, "ref-micro")
    if not os.path.exists(os.path.join(run, "steps.jsonl")):
        code = ("import sys; sys.path.insert(0, %r); from open1b_audit.selftest import "
                "trajectory as tj; tj.train_lines('micro', tj.build_mix('micro', %r), %r, "
                "steps=4, trace_steps=frozenset(range(1, 5)))" % (ROOT, os.path.join(
                    work, "mix-ref"), run))
        subprocess.run([sys.executable, "-c", code], check=True)
    return run


def run_row(name: str, args, work: str) -> dict:
    env_add, extra, venv = ROWS[name]
    env = dict(os.environ, **env_add)
    py, root = sys.executable, ROOT
    if venv is not None:
        py = os.path.join(ENVS, venv, "bin", "python")
        if not os.path.exists(py):
            return {"row": name, "status": "not set up",
                    "detail": f"no {py}: run scripts/portability_envs.sh {venv}"}
    try:
        if venv is not None:
            root = copy_tree(py, os.path.join(work, f"tree-{venv}"))
        elif name in BUILDS:
            root = copy_tree(py, os.path.join(work, f"tree-{name}"), BUILDS[name])
    except subprocess.CalledProcessError as e:
        tail = ((e.stderr or b"").decode(errors="replace").strip().splitlines() or ["?"])[-1]
        return {"row": name, "status": "crashed",
                "detail": f"building the row's copy of the checkout failed: {tail}"}
    env["PYTHONPATH"] = root
    rw = os.path.join(work, name)
    cmd = [py, os.path.join(root, "scripts", "portability_check.py"), "--inside", "--work", rw,
           "--trajectory", args.trajectory] + extra
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    if name == "fma-control":
        cmd += ["--bisect", reference_run(work), "--bisect-until", "4"]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"row": name, "status": "timeout", "detail": f"> {args.timeout} s"}
    out = {"row": name, "env": env_add, "args": extra, "seconds": round(time.perf_counter() - t0)}
    if p.returncode != 0 or not p.stdout.strip():
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return dict(out, status="crashed", detail=f"exit {p.returncode}: {tail}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return dict(out, status="ran", result=res)


def verdict(r: dict) -> str:
    if r["status"] != "ran":
        return f"{r['status']}: {r.get('detail', '')}"
    res, parts = r["result"], []
    for name, t in res["rows"].items():
        if "error" in t:
            parts.append(f"{name}: refused/failed - {t['error']}")
        elif t["result"] is None:
            parts.append(f"{name} {t['steps']} steps equal")
        else:
            parts.append(f"{name}: DIFFERS at step {t['result']['step']} "
                         f"{t['result']['component']}")
    if "demo_replay" in res:
        d = res["demo_replay"]
        parts.append(f"demo replay of step {d['step']}: " + ("match" if d["ok"] else
                                                            f"MISMATCH {d['finding']}"))
    if "bisect" in res:
        b = res["bisect"]
        op = ((b.get("operator") or {}).get("name") if isinstance(b.get("operator"), dict)
            else b.get("operator"))
        parts.append(f"bisect: step {b['step']}, operator {op}")
    return "; ".join(parts)


def describe_row(r: dict) -> str:
    m = (r.get("result") or {}).get("machine")
    if not m:
        return ""
    return (f"py {m['python']}, torch {m['torch']} ({m['torch_cpu_capability']}), numpy "
            f"{m['numpy']}, {m['torch_threads']} thr, mathc {'on' if m['mathc'] else 'off'}"
            + "".join(f" ({mod}: {why})" for mod, why in (m.get("mathc_errors") or {}).items())
            + (" built as an AVX2 CPU" if m.get("mathc_cpu_cap", 2) < 2 else "")
            + f", FTZ {'on' if m['flush']['ftz'] else 'off'}"
            + (f", int GEMM {m['int_gemm']['route']}" if m.get("int_gemm") else "")
            + (f", attention {m['attention']}" if m.get("attention") else ""))


def markdown(results: list[dict], machine: dict) -> str:
    cpu = machine["cpu"]
    simd = " ".join(f for f in cpu["flags"] if f.startswith(("avx", "fma", "sse", "f16c", "amx",
                                                             "asimd", "sve")))
    lines = [f"Measured {datetime.date.today().isoformat()} on {cpu['arch']} {cpu['model']} "
             f"({cpu['cores']} cores; SIMD flags: {simd}), {platform.platform()}.", "",
             "| row | setting | what ran | result | s |", "|---|---|---|---|---|"]
    for r in results:
        setting = (" ".join([*(f"{k}={v}" for k, v in (r.get("env") or {}).items()),
                             *([f"loops built with {BUILDS[r['row']]}"] if r["row"] in BUILDS
                               else [])]) or
            " ".join(r.get("args") or []) or ROWS[r["row"]][2] or "-")
        lines.append(f"| {r['row']} | {setting} | {describe_row(r)} | {verdict(r)} | "
                     f"{r.get('seconds', '')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inside", action="store_true", help="Run one variant in this process.")
    ap.add_argument("--rows", nargs="*", default=None, choices=list(ROWS), metavar="ROW",
                    help=f"Rows to run (default all): {', '.join(ROWS)}.")
    ap.add_argument("--trajectory", choices=["micro", "demo", "all"], default="all")
    ap.add_argument("--steps", type=int, default=None, help="Only the first N steps.")
    ap.add_argument("--work", default=None, help="Working directory (default: a temporary one).")
    ap.add_argument("--mix", default=None, help="(inside) a prebuilt micro trajectory mix.")
    ap.add_argument("--threads", type=int, default=None, help="(inside) torch threads.")
    ap.add_argument("--flush-denormal", action="store_true",
                    help="(inside) torch.set_flush_denormal(True) first.")
    ap.add_argument("--matmul-precision", default=None, choices=["high", "medium"],
                    help="(inside) torch.set_float32_matmul_precision(...) first.")
    ap.add_argument("--fma-control", action="store_true",
                    help="(inside) load the C math extension compiled with FMA contraction.")
    ap.add_argument("--no-replay", action="store_true", help="(inside) skip the demo replay.")
    ap.add_argument("--bisect", default=None, help="(inside) bisect this run directory.")
    ap.add_argument("--bisect-until", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=3600, help="Seconds per row.")
    ap.add_argument("--parallel", type=int, default=1, help="Rows run at once.")
    ap.add_argument("--json", default=None, help="Write every row's result here.")
    ap.add_argument("--markdown", default=None, help="Write the table here.")
    args = ap.parse_args()
    if args.inside:
        print(json.dumps(inside(args)))
        return
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, ROOT)
    from open1b_audit.selftest import machine
    work = args.work or tempfile.mkdtemp(prefix="open1b-matrix-")
    rows = args.rows or list(ROWS)
    if "fma-control" in rows:
        reference_run(work)
    with ThreadPoolExecutor(args.parallel) as pool:
        results = []
        for r in pool.map(lambda n: run_row(n, args, work), rows):
            results.append(r)
            print(f"{r['row']:<20} {verdict(r)}", flush=True)
            if args.json:                      # rows so far survive an interrupted matrix
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
    table = markdown(results, machine.describe())
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
