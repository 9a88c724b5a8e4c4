"""Where two per-op traces of a step first differ (``open1b_train.trace`` writes them).

``first_difference(a, b)`` is the first op whose digest differs (or where the op sequences
diverge), parsed into virtual rank, micro-batch, layer, direction and op: refereed
delegation's bisection over the operator graph, which only works because every op is
bitwise reproducible.
"""
from __future__ import annotations

import re
from typing import Any

from open1b_train.trace import Tracer, path_of, read  # noqa: F401 (the trace format)

NAME = re.compile(r"^(?:rank(?P<rank>\d+)\.mb(?P<mb>\d+)\.)?(?:layers\.(?P<layer>\d+)\.)?"
                  r"(?:(?P<dir>fwd|bwd)\.)?(?P<op>.+)$")


def describe(op: str) -> dict[str, Any]:
    m = NAME.match(op)
    d = {k: (int(v) if v is not None and v.isdigit() else v) for k, v in m.groupdict().items()}
    d["name"] = op
    return d


def first_difference(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> dict | None:
    """The first op where traces ``a`` and ``b`` differ, or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x[0] != y[0]:
            return {"index": i, "why": f"the op sequences diverge ({x[0]} vs {y[0]})",
                    **describe(x[0])}
        if x[1] != y[1]:
            return {"index": i, "why": "the op's output differs", **describe(x[0])}
    if len(a) != len(b):
        i = min(len(a), len(b))
        return {"index": i, "why": f"one trace has {abs(len(a) - len(b))} more ops",
                **describe((a if len(a) > len(b) else b)[i][0])}
    return None
