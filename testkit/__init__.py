"""What the tests and the benchmarks share: built mixes and reference runs (``runs.py``,
``trainmix.py``, ``mixfixture.py``, ``synthetic.py``), forgers and hostile files
(``tamper.py``, ``hostile.py``, ``released.py``, ``forger.py``, ``rewrite.py``), fake
logs, the audit collective's local server (``crowd.py``), the explorer's subject run
(``sitefixture.py``) and a transformer block composed from the ops (``kernels/``).

Not shipped (pyproject.toml's package list names only the open1b packages); the tests and
the benchmarks import it, it imports neither (tests/test_layout.py).
"""
