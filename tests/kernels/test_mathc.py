"""The compiled CPU loops' plumbing (open1b_kernels.core.mathc): one extension per folder, the
switch that turns them all off, and mathfn's exp, log and erfinv by their loops
(open1b_kernels/core/_mathfn.c) - exactly mathfn's torch bits."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import mathc, mathfn
from tests.kernels.support import needs_loops


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -104.0,
                             -104.00001, 89.0, 89.00001, 88.72, -87.33, 1e-45, -1e-45,
                             1.1754942e-38, 1.17549435e-38, 3.4028235e38, -3.4028235e38,
                             0.5, 1.0, 2.0, 0.6931472, -0.6931472])
    # every float32 exponent and sign, with random mantissas
    bits = ((torch.arange(512, dtype=torch.int64).repeat_interleave(2048) << 23)
            | torch.randint(0, 1 << 23, (512 * 2048,), generator=g))
    every = bits.to(torch.int32).view(torch.float32)          # (int64 -> int32 wraps the sign)
    random_bits = torch.randint(-2**31, 2**31, (1 << 20,), generator=g,
                                dtype=torch.int64).to(torch.int32).view(torch.float32)
    ranges = torch.cat([torch.randn(1 << 18, generator=g) * s for s in (1e-3, 1.0, 30.0, 1e4)])
    return torch.cat([specials, every, random_bits, ranges])


@needs_loops
@pytest.mark.parametrize("name,ref", [("exp", mathfn._exp), ("log", mathfn._log),
                                      ("erfinv", mathfn._erfinv)])
def test_compiled_loop_equals_the_torch_definition(name, ref):
    x = _inputs()
    want = mathfn.map_chunks(ref, x)
    got = mathc.unary(mathfn.LOOPS, name, x)
    assert got is not None
    same = (got.view(torch.int32) == want.view(torch.int32))
    assert bool(same.all()), f"{int((~same).sum())} mismatches, e.g. x={x[~same][:4].tolist()}"
    # non-contiguous input and odd lengths take the same path
    assert torch.equal(mathc.unary(mathfn.LOOPS, name, x[1::3]).view(torch.int32),
                       want[1::3].view(torch.int32))


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    assert mathc.unary(mathfn.LOOPS, "exp", torch.ones(3)) is None
    assert torch.equal(mathfn.exp(torch.zeros(3)), torch.ones(3))
    assert not mathc.available() and not mathfn.LOOPS.available()


# Each folder's extension and the loops of its ops (one C file beside each op).
LOOPS = {
    "open1b_kernels.core._corec": {"exp", "log", "erfinv", "tree_rows", "tree_blocks",
                                   "add_bf16"},
    "open1b_kernels.ops._opsc": {"rms_fwd", "rms_bwd", "swiglu", "rope", "xent_lse",
                                 "xent_grad", "adamw", "philox_words",
                                 "philox_truncnormal", "slice_planes",
                                 "levels_round_weighted", "float_sum", "rows_add",
                                 "sparse_quads", "sparse_mm", "sparse_loop"},
    "open1b_kernels.int8._int8c": {"fwht_dim0", "rotq", "rotq_rows", "rotq_codes", "widen_t", "quant",
                                   "rot_steps",
                                   "codes", "ste", "ste_sums", "v4", "v3", "dequant",
                                   "bf16_rne",
                                   "int_sums", "mv_int8", "widen_sq", "pack", "product",
                                   "product64", "round", "pair_cpu",
                                   # the AMX tile GEMM (int8/_amxmm.c)
                                   "amx_cpu", "amx_pack", "amx_packed_bytes", "amx_product",
                                   "amx_product_dq", "amx_stream", "amx_levels"},
    "open1b_kernels.attention._tilesc": {"fwd_rows", "fwd_acc", "bwd_tiles", "dq_tiles",
                                         "kv_tiles", "fixed_planes", "tile_level",
                                         "fwd_rows32", "fwd_rows_i8", "digit_planes",
                                         # the AMX tile products (attention/_tileamx.c)
                                         "amx_bwd_tiles", "amx_dq", "amx_kv", "amx_pv",
                                         "amx_scores", "amx_tiles", "amx_value_tiles",
                                         # the forward's and the backward's steps in one
                                         # loop each (_tileloops.c)
                                         "amx_forward", "amx_backward",
                                         # the VNNI row products and P V
                                         # (attention/_tilevnni.c)
                                         "vnni_rows", "vnni_products", "vnni_tiles",
                                         "vnni_values", "vnni_pv_acc"},
}


@needs_loops
def test_every_folder_has_one_extension_with_its_ops_loops():
    # the shared module init (core/_ext.h's EXT_MODULE) gathers every file's table, plus
    # openmp(), which every extension answers alike (one set of flags)
    team = set()
    for name, loops in LOOPS.items():
        lib = mathc.Loops(name)
        assert lib.available(), name
        got = {n for n in dir(lib.lib) if not n.startswith("_")}
        assert got == loops | {"openmp", "cpu_cap"}, (name, got ^ (loops | {"openmp", "cpu_cap"}))
        team.add(lib.openmp())
    assert len(team) == 1


def test_a_missing_extension_is_unavailable_and_names_itself(monkeypatch):
    lib = mathc.Loops("open1b_kernels.core._no_such_loops")
    assert not lib.available() and "_no_such_loops" in lib.error
    assert mathc.import_errors() == {} or not mathc.available()   # all loaded here, or named
    with pytest.raises(AttributeError, match="_no_such_loops was not compiled: no loop 'exp'"):
        lib.exp
    monkeypatch.setattr(mathc, "EXTENSIONS", (*mathc.EXTENSIONS, lib.module))
    assert not mathc.available()             # one folder's missing loops: not "all built"
    assert "_no_such_loops" in mathc.import_errors()[lib.module]     # and why, by name


def test_the_portability_row_names_an_extension_that_failed_to_load():
    """A build whose extension does not load (aarch64 once: an undefined symbol) shows as
    "mathc off (module: reason)" in the portability matrix, not as a plain "off"."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "portability_check.py")
    spec = importlib.util.spec_from_file_location("portability_check", path)
    port = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(port)
    m = {"python": "3.11", "torch": "2.13", "torch_cpu_capability": "DEFAULT", "numpy": "2",
         "torch_threads": 1, "mathc": False, "flush": {"ftz": False},
         "mathc_errors": {"open1b_kernels.int8._int8c": "undefined symbol: pack"}}
    row = port.describe_row({"result": {"machine": m}})
    assert "mathc off (open1b_kernels.int8._int8c: undefined symbol: pack)" in row


def test_every_loop_file_compiles_in_a_build_without_the_tile_loops():
    """A build for another architecture (aarch64) or by an older compiler has AMX_BUILD 0
    (core/_amx.h). setup.py builds the loop extensions as optional: a file that fails to
    compile there switches its folder's loops off quietly. So every loop file is compiled
    here as such a build would (-DOPEN1B_NO_AMX) - once, a setting used outside the AMX
    section of _amxmm.c was declared inside it and only that build failed."""
    import pathlib
    import shutil
    import subprocess
    import sysconfig
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc or gcc) on PATH")
    root = pathlib.Path(__file__).resolve().parents[2]
    files = sorted((root / "open1b_kernels").glob("*/_*.c"))
    assert len(files) > 20
    failed = []
    for f in files:
        got = subprocess.run([cc, "-fsyntax-only", "-std=c11", "-DOPEN1B_NO_AMX",
                              "-Werror=implicit-function-declaration",
                              f"-I{sysconfig.get_paths()['include']}", str(f)],
                             capture_output=True, text=True, timeout=120)
        if got.returncode:
            errors = [x for x in got.stderr.splitlines() if "error" in x] or [got.stderr]
            failed.append(f"{f.relative_to(root)}: {errors[0].strip()}")
    assert not failed, "\n".join(failed)
