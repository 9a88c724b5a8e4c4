"""Measured comparisons, grouped by the system they measure.

Each script runs from the repository root as ``python -m benchmarks.<system>.<name>``
(``data``, ``kernels``, ``train``, ``audit``), records the machine, date and load beside
its figures (``benchmarks.machine``) and writes or is summarised in a file under
``benchmarks/results/``; BENCHMARKS.md is the summary, with the command behind each number.
"""
