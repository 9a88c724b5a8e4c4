"""The compiled parts, all optional (where no C compiler is available the install goes on):

* ``open1b_data.ingest.tokenizer._bpe`` (open1b_data/ingest/tokenizer/_bpe.c): the build's
  fast encoder; without it ``FastEncoder`` uses tiktoken alone.
* The compiled CPU loops, one extension per folder of open1b_kernels, each built from every
  ``_*.c`` file of its folder (``loop_extension``) - one C file beside the Python op it
  serves - with the shared headers of open1b_kernels/core (``_ext.h``: CPU-level copies,
  probes, the wrappers' checks and ends, the module init; ``_pieces.h``; ``_mathfn.h``):
  ``open1b_kernels.core._corec`` (mathfn's exp and log, reduce's tree, rounding's bf16 sum),
  ``open1b_kernels.ops._opsc`` (rmsnorm, SwiGLU, RoPE, the loss, AdamW, Philox, the LM
  head's slicer, sums and row-sparse products), ``open1b_kernels.int8._int8c`` (the
  Hadamard butterflies, the W8A8 quantizer's passes, the GEMM epilogue, the exactness
  guard's sums, the float route's operand, the int16-pair GEMM for x86-64 CPUs with AVX2
  and no VNNI) and ``open1b_kernels.attention._tilesc`` (attention's tile loops between
  torch's exact products). Each computes the bits of the torch code it replaces; without it
  (no C compiler at install, or ``OPEN1B_MATHC=0``) that torch code runs. Their flags keep
  every float operation a separate IEEE float32 operation: no fused multiply-add
  contraction, no value-changing optimization; -fno-trapping-math only lets the compiler
  vectorize the selects (no program here reads floating-point exception flags), it changes
  no value; -fno-math-errno lets it vectorize the correctly rounded square root (AdamW's
  update ran one element at a time around the libm call kept for errno, which nothing here
  reads), also without changing a value. Integer loops (the pair GEMM, the guard's sums,
  the row-sparse products, the slicer) are exact under any flags; they share them.

The loop extensions are built with -fopenmp where the compiler takes it (checked by a trial
build): a loop's pieces then run at once on the OpenMP threads of the libgomp torch loads
(open1b_kernels/core/_pieces.h says why); without it they run one after another, and
open1b_kernels.core.pieces hands them to its own thread pool instead. OpenMP changes no value:
every loop's result is the same whatever the cut.

And one file at the root of site-packages, ``open1b_lmeval.pth``: the startup hook that makes
lm-eval's own ``lm_eval`` command know the ``open1b`` model (open1b_eval/lmeval_hook.py).
"""
import glob
import os
import tempfile

import setuptools
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

# Python's ``site`` runs a .pth line that starts with ``import`` at interpreter startup and
# reports (not raises) an error in it; the try keeps even that report away when the package
# is gone. The name sorts after setuptools' ``__editable__.*.pth``, whose finder must be
# installed first for an editable install's packages to import (``site`` reads .pth files
# in sorted order).
PTH = "open1b_lmeval.pth"
PTH_LINE = 'import sys; exec("try:\\n import open1b_eval.lmeval_hook\\nexcept Exception:\\n pass")\n'


class BuildPyWithPth(build_py):
    """build_py that also writes ``PTH`` at the root of the wheel: ``build_lib`` for a
    wheel; for an editable wheel (PEP 660), where setuptools packs only what it installs
    into the wheel's directory (``install_lib`` of its ``install`` command), that
    directory."""

    def run(self) -> None:
        super().run()
        root = (self.get_finalized_command("install").install_lib if self.editable_mode
                else self.build_lib)
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, PTH), "w", encoding="utf-8") as f:
            f.write(PTH_LINE)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        extra = [] if self.editable_mode else [os.path.join(self.build_lib, PTH)]
        return super().get_outputs(include_bytecode) + extra


class BuildExtWithOpenMP(build_ext):
    """build_ext that adds -fopenmp to the loop extensions (``OPENMP``) when a trial build
    of a small OpenMP source compiles and links with it; else they build without it."""

    def build_extensions(self) -> None:
        if self._takes_openmp():
            for ext in self.extensions:
                if ext.name in OPENMP:
                    ext.extra_compile_args = [*ext.extra_compile_args, "-fopenmp"]
                    ext.extra_link_args = [*ext.extra_link_args, "-fopenmp"]
        super().build_extensions()

    def _takes_openmp(self) -> bool:
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "omp_probe.c")
            with open(src, "w", encoding="utf-8") as f:
                f.write("#include <omp.h>\nint probe(void) { return omp_get_max_threads(); }\n")
            try:
                objs = self.compiler.compile([src], output_dir=d, extra_postargs=["-fopenmp"])
                self.compiler.link_shared_object(objs, os.path.join(d, "omp_probe.so"),
                                                 extra_postargs=["-fopenmp"])
            except Exception:  # noqa: BLE001 - any failure: build without OpenMP
                return False
        return True


# folder of open1b_kernels -> the name of its loop extension
LOOPS = {"core": "_corec", "ops": "_opsc", "int8": "_int8c", "attention": "_tilesc"}
OPENMP = tuple(f"open1b_kernels.{folder}.{name}" for folder, name in LOOPS.items())

# The license in the form the running setuptools reads without a deprecation notice (pip
# prints one box per build step for the old form): an SPDX expression from setuptools 77
# on, the License field before it (pyproject.toml requires setuptools>=68 and lists
# "license" as dynamic, so both forms come from here).
LICENSE = ({"license_expression": "Apache-2.0"} if int(setuptools.__version__.split(".")[0]) >= 77
           else {"license": "Apache-2.0"})

# Every float operation a separate IEEE operation (see above). A call to a function the
# build for this architecture does not define is an error here, not a warning: as a warning
# the extension built and then failed to import (an undefined symbol), and every compiled
# loop of its folder was quietly off (seen on aarch64).
EXACT_FLOAT_FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-fno-fast-math",
                     "-fno-trapping-math", "-fno-math-errno",
                     "-Werror=implicit-function-declaration"]
HEADERS = sorted(glob.glob("open1b_kernels/core/_*.h"))


def loop_extension(folder: str) -> Extension:
    """The loop extension of open1b_kernels/<folder>: its ``_*.c`` files (sorted, so the
    build is the same wherever it runs), its own and core's ``_*.h`` as dependencies."""
    sources = sorted(glob.glob(f"open1b_kernels/{folder}/_*.c"))
    own = sorted(glob.glob(f"open1b_kernels/{folder}/_*.h"))
    return Extension(f"open1b_kernels.{folder}.{LOOPS[folder]}", sources,
                     depends=sorted(set(HEADERS + own)), extra_compile_args=EXACT_FLOAT_FLAGS,
                     optional=True)


setup(**LICENSE, cmdclass={"build_py": BuildPyWithPth, "build_ext": BuildExtWithOpenMP},
      ext_modules=[
          Extension("open1b_data.ingest.tokenizer._bpe", ["open1b_data/ingest/tokenizer/_bpe.c"],
                    depends=[f"open1b_data/ingest/tokenizer/_bpe_{h}.h" for h in
                             ("split", "table", "merge", "unicode")],
                    extra_compile_args=["-O3", "-std=c11"], optional=True),
          *(loop_extension(folder) for folder in LOOPS),
      ])
