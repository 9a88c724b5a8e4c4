"""Reproducible-operations runtime: every op gives the same bits on CPU and on GPU.

A leaf package: nothing here imports from ``open1b_*``. Each op lives in one file that
holds its CPU reference (built only from exactly specified operations), its Triton
kernel and launcher; ``open1b_kernels.core.backend`` dispatches on the tensor's device.
See ``open1b_kernels/CONTRACT.md`` for the arithmetic contract shared by every op.
"""
