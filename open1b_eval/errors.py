"""The exceptions of ``open1b_eval``: a bad run, step, prompt or option, said in words."""
from __future__ import annotations

from open1b.errors import Open1bError


class EvalError(Open1bError):
    """A user-facing error: the message names the bad value and what to do."""
