"""Benchmarks of open1b_train: a CPU step and a run against stock PyTorch (``stock_model``),
the deterministic collectives, and training on several processes."""
