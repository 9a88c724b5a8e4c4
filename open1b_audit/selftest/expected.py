"""What ``open1b-audit selftest`` compares with: ``data/expected.json``, written with the
golden trajectories by ``python -m tests.train.test_trajectory --write`` (never by hand):

* ``micro``: the golden micro trajectory's genesis, mix fingerprint, config identity and its
  first ``STEPS`` lines (tests/train/test_trajectory.py checks they are the golden file's);
* ``traces``: the per-op digest trace of each of those steps (``open1b_train.trace``), so a
  difference is named down to the operator;
* ``demo_init``: the digest of the ``demo`` preset's initial parameters for the demo mix's
  vocabulary and seed (manifests/demo.toml), re-derived from the seed by the selftest.
"""
from __future__ import annotations

import json
import os
import tomllib
from typing import Any

from open1b_audit.errors import SelftestError

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "expected.json")
STEPS = 3
FORMAT = "open1b-selftest-expected"


def load() -> dict[str, Any]:
    try:
        with open(PATH) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise SelftestError(f"{PATH}: cannot read the selftest's expected values ({e}); "
                          f"reinstall open1b") from None
    if data.get("format") != FORMAT:
        raise SelftestError(f"{PATH}: not a {FORMAT} file")
    return data


def write(data: dict[str, Any]) -> None:
    with open(PATH, "w") as f:
        json.dump(dict(data, format=FORMAT), f, indent=0, sort_keys=True)
        f.write("\n")


def demo_mix_values() -> dict[str, int]:
    """The demo mix's vocabulary and seed, from manifests/demo.toml (a checkout)."""
    from open1b_data.formats.definition import default_mix_path

    with open(default_mix_path(), "rb") as f:
        raw = tomllib.load(f)
    return {"vocab": raw["tokenizer"]["vocab_size"], "seed": raw["mix"]["seed"]}


def demo_init_digest(vocab: int, seed: int) -> str:
    """Digest of the demo preset's initial parameters (as in a run's genesis)."""
    import dataclasses

    from open1b_train import statehash
    from open1b_train.config import demo
    from open1b_train.params import init_params

    cfg = demo()
    model = dataclasses.replace(cfg.model, vocab=vocab)
    return statehash.tensors_digest(init_params(model, seed))


def demo_init() -> dict[str, Any]:
    v = demo_mix_values()
    return dict(v, params=demo_init_digest(v["vocab"], v["seed"]))
