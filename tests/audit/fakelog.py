"""A run's ``steps.jsonl`` without training: a valid hash chain of made-up digests (for the
tests of what the audit reads before it re-executes anything - chain, pin, coverage)."""
from __future__ import annotations

import hashlib
import os

from open1b_train import runlog, statehash
from open1b_train.step import float32_hex
from open1b_train.show import f32_from_hex

COMPONENTS = ("data", "grad", "params", "optim")


def _digest(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def lines_of(steps: int, seed: int = 42, tag: str = "") -> list[dict]:
    g = {"config_identity": _digest("config", tag), "mix_fingerprint": _digest("mix", tag),
         "seed": seed, "params": _digest("params", 0, tag), "optim": _digest("optim", 0, tag)}
    lines = [{"step": 0, "genesis": g, "hash": statehash.genesis_hash(g), "prev": None}]
    for s in range(1, steps + 1):
        scalars = {"loss": float32_hex(6.0 / s), "grad_norm": float32_hex(0.3 + s / 7),
                   "lr": (1e-3 * s / 3).hex(), "skipped": False, "spike": False,
                   "tokens": 128 * s, "window_loss": []}
        lines.append({"step": s, "prev": lines[-1]["hash"], "scalars": scalars,
                      "components": {c: _digest(c, s, tag) for c in COMPONENTS}})
        rechain(lines, s)
    return lines


def rechain(lines: list[dict], start: int) -> None:
    """Recompute hashes and informational decimals from ``start`` on (what a forger does)."""
    for s in range(start, len(lines)):
        ln = lines[s]
        if s == 0:
            ln["hash"] = statehash.genesis_hash(ln["genesis"])
            continue
        ln["prev"] = lines[s - 1]["hash"]
        ln["components"]["scalars"] = statehash.sha(ln["scalars"])
        ln["hash"] = statehash.step_hash(s, ln["prev"], ln["components"])
        sc = ln["scalars"]
        ln.update(loss=f32_from_hex(sc["loss"]), grad_norm=f32_from_hex(sc["grad_norm"]),
                  lr=float.fromhex(sc["lr"]))


def write_run(run: str, lines: list[dict], tail: bytes = b"") -> str:
    """A run directory holding only ``steps.jsonl`` (plus ``tail`` with no newline)."""
    os.makedirs(run, exist_ok=True)
    runlog.rewrite(run, lines)
    if tail:
        with open(runlog.path_of(run), "ab") as f:
            f.write(tail)
    return run
