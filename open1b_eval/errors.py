"""The one exception of open1b_eval: a bad run, step, prompt or option, said in words."""
from __future__ import annotations


class EvalError(Exception):
    """A user-facing error: the message names the bad value and what to do."""
