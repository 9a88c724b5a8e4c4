"""A logged step's hashed scalars, decoded for the explorer: float32 values travel as
their 8 hex digits of bits, the learning rate as a hex float (``open1b_train.step``)."""
from __future__ import annotations

import struct
from typing import Any


def f32(h: Any) -> float | None:
    """A float32 logged as its 8 hex digits of bits (None when absent or malformed)."""
    if not isinstance(h, str) or len(h) != 8:
        return None
    try:
        return struct.unpack("<f", struct.pack("<I", int(h, 16)))[0]
    except ValueError:
        return None


def hexfloat(h: Any) -> float | None:
    try:
        return float.fromhex(h) if isinstance(h, str) else None
    except ValueError:
        return None


def _val_loss(val: Any) -> float | None:
    """A hashed ``val_loss``: one float32 hex or hex float, or the trainer's per-source
    ``{source: float32 hex}`` (``open1b_train.validate``), shown as the mean over its
    sources (the per-source values are in ``val_loss_sources``)."""
    if isinstance(val, dict):
        xs = [f32(v) for v in val.values()]
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None
    return f32(val) if isinstance(val, str) and len(val) == 8 else hexfloat(val)


def scalars_of(line: dict) -> dict[str, Any]:
    """The hashed scalars of a step, decoded (an optional ``val_loss`` in any form)."""
    sc = line.get("scalars") or {}
    val = sc.get("val_loss")
    return {"loss": f32(sc.get("loss")), "lr": hexfloat(sc.get("lr")),
            "grad_norm": f32(sc.get("grad_norm")),
            "val_loss": _val_loss(val),
            "val_loss_sources": {k: f32(v) for k, v in val.items()}
            if isinstance(val, dict) else None,
            "tokens": sc.get("tokens") if isinstance(sc.get("tokens"), int) else None,
            "skipped": sc.get("skipped") is True, "spike": sc.get("spike") is True,
            "window_loss": [f32(x) for x in sc.get("window_loss") or []]}
