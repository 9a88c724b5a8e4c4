"""The one compiled part: ``open1b_data.build._bpe`` (see open1b_data/build/_bpe.c). It is optional: where
no C compiler is available the install goes on and ``FastEncoder`` uses tiktoken alone."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("open1b_data.build._bpe", ["open1b_data/build/_bpe.c"],
                             depends=[f"open1b_data/build/_bpe_{h}.h" for h in
                                      ("split", "table", "merge", "unicode")],
                             extra_compile_args=["-O3", "-std=c11"], optional=True)])
