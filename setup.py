"""The compiled parts, both optional (where no C compiler is available the install goes on):

* ``open1b_data.ingest.tokenizer._bpe`` (open1b_data/ingest/tokenizer/_bpe.c): the build's
  fast encoder; without it ``FastEncoder`` uses tiktoken alone.
* ``kernels.core._mathc`` (kernels/core/_mathc.c): compiled loops of ``kernels.core.mathfn``'s exp and log
  for the CPU reference, the same bits as its torch code; without it the torch code runs.
  Its flags keep every float operation a separate IEEE float32 operation: no fused
  multiply-add contraction, no value-changing optimization; -fno-trapping-math only lets
  the compiler vectorize the selects (no program here reads floating-point exception
  flags), it changes no value.
"""
import setuptools
from setuptools import Extension, setup

# The license in the form the running setuptools reads without a deprecation notice (pip
# prints one box per build step for the old form): an SPDX expression from setuptools 77
# on, the License field before it (pyproject.toml requires setuptools>=68 and lists
# "license" as dynamic, so both forms come from here).
LICENSE = ({"license_expression": "Apache-2.0"} if int(setuptools.__version__.split(".")[0]) >= 77
           else {"license": "Apache-2.0"})

setup(**LICENSE, ext_modules=[
    Extension("open1b_data.ingest.tokenizer._bpe", ["open1b_data/ingest/tokenizer/_bpe.c"],
              depends=[f"open1b_data/ingest/tokenizer/_bpe_{h}.h" for h in
                       ("split", "table", "merge", "unicode")],
              extra_compile_args=["-O3", "-std=c11"], optional=True),
    Extension("kernels.core._mathc", ["kernels/core/_mathc.c"],
              extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-fno-fast-math",
                                  "-fno-trapping-math"],
              optional=True),
])
