"""open1b-audit: check a published training run step by step, on one machine.

``chain.py`` checks a run's log is one unbroken hash chain; ``replay.py`` re-executes steps
from the nearest checkpoint with Algorithm 1 and compares every component digest;
``certificate.py`` turns a verified step into a (signed) certificate; ``assign.py`` and
``coverage.py`` split a run among auditors and combine their certificates; ``trace.py`` and
``bisect.py`` find, when two parties disagree, the first step and then the first operator
whose output differs. The command is ``open1b-audit`` (``cli.py``); docs/AUDIT.md walks
an outside auditor through it.
"""

__version__ = "0.1.0"
