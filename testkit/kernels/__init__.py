"""The kernels' autograd wrappers (``autograd.py``) and one Open-1B block composed from them
(``block.py``): the kernel tests' reference and the block benchmarks' subject; which slice
tiles hold a nonzero (``tiles.py``)."""
