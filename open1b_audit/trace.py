"""Where two per-op traces of a step first differ (``open1b_train.trace`` writes them).

``first_difference(a, b)`` is the first op whose digest differs (or where the op sequences
diverge), parsed by ``describe`` into where it ran: refereed delegation's bisection over
the operator graph, which only works because every op is bitwise reproducible.

``describe(op)`` always returns ``name``, ``stage``, ``rank``, ``mb``, ``layer``, ``dir``,
``op``, ``param`` and ``tensor`` (None where they do not apply):

* model ops (``stage`` "model"): ``rank1.mb0.layers.3.bwd.attn.core.dq`` - virtual rank,
  micro-batch, layer, direction (fwd/bwd), op;
* the reduction (``stage`` "reduce"): ``rank1.grad``, ``replica0.partial``, ``reduced``;
* the optimizer (``stage`` "optim"): ``optim.norm`` (pre-clip norm), ``optim.clip_coef``,
  ``optim.clip.<param>`` (op "clip", tensor "grad": the gradient AdamW consumes) and
  ``optim.adamw.<param>.<m|v|param>`` (op "adamw", tensor m, v or param, after the
  update); ``layer`` is the parameter's layer when it has one.
"""
from __future__ import annotations

import re
from typing import Any

from open1b_train.trace import Tracer, path_of, read  # noqa: F401 (the trace format)

NAME = re.compile(r"^(?:rank(?P<rank>\d+)\.mb(?P<mb>\d+)\.)?(?:layers\.(?P<layer>\d+)\.)?"
                  r"(?:(?P<dir>fwd|bwd)\.)?(?P<op>.+)$")
REDUCE = re.compile(r"^(?:rank(?P<rank>\d+)\.(?P<grad>grad)|(?P<partial>replica\d+\.partial)"
                    r"|(?P<reduced>reduced))$")
OPTIM = re.compile(r"^optim\.(?:(?P<scalar>norm|clip_coef)|clip\.(?P<clipped>.+)"
                   r"|adamw\.(?P<param>.+)\.(?P<tensor>m|v|param))$")
LAYER = re.compile(r"^layers\.(\d+)\.")


def _optim(m: re.Match) -> dict[str, Any]:
    if m["scalar"]:
        return {"op": m["scalar"], "param": None, "tensor": None}
    if m["clipped"]:
        return {"op": "clip", "param": m["clipped"], "tensor": "grad"}
    return {"op": "adamw", "param": m["param"], "tensor": m["tensor"]}


def describe(op: str) -> dict[str, Any]:
    d: dict[str, Any] = {"name": op, "rank": None, "mb": None, "layer": None, "dir": None,
                         "param": None, "tensor": None}
    if (m := OPTIM.match(op)) is not None:
        d.update(stage="optim", **_optim(m))
        layer = LAYER.match(d["param"] or "")
        d["layer"] = int(layer[1]) if layer else None
        return d
    if (m := REDUCE.match(op)) is not None:
        d.update(stage="reduce", rank=None if m["rank"] is None else int(m["rank"]),
                 op=m["grad"] or m["partial"] or m["reduced"])
        return d
    m = NAME.match(op)
    d.update(stage="model", **{k: (int(v) if v is not None and v.isdigit() else v)
                               for k, v in m.groupdict().items()})
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
