"""Benchmarks of open1b_kernels/: each op's CPU reference (elementwise/norm/optimizer ops,
attention, int8 linear and LM head, SHA-256) and a whole block, against stock torch."""
