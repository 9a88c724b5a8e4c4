"""Golden step hashes: a short run of the demo preset on the demo mix (built by build-mix
from the committed corpus) must give exactly these step hashes and components, on the CPU
reference. They pin the model, the kernels' CPU path, the recipe and the hash format.
Regenerate only on purpose (a change of the bits, the hash format or the demo mix), then
say why in the commit:
    .venv/bin/python -m tests.train.test_golden --write
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile

import pytest
import torch

from open1b_train import runlog
from open1b_train.config import demo
from open1b_train.train import train

ASSET = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "train_golden.json")
STEPS = 2


def compute(tmp: str) -> dict:
    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.ingest.pipeline import BuildOptions, build_mix

    mix = os.path.join(tmp, "demo-mix")
    built = build_mix(load_mix(default_mix_path()), mix, BuildOptions(workers=1, progress=False))
    run = os.path.join(tmp, "run")
    train(dataclasses.replace(demo(), steps=STEPS, backend="cpu"), mix, run, progress=False,
          echo=lambda m: None)
    lines = runlog.read(run)
    return {"mix_fingerprint": built.fingerprint, "preset": "demo", "steps": STEPS,
            "genesis": lines[0]["hash"],
            "lines": [{"step": ln["step"], "hash": ln["hash"], "components": ln["components"]}
                      for ln in lines[1:]]}


@pytest.mark.slow
def test_demo_preset_golden_hashes(tmp_path):
    with open(ASSET) as f:
        want = json.load(f)
    n = torch.get_num_threads()
    try:
        got = compute(str(tmp_path))
    finally:
        torch.set_num_threads(n)
    assert got["mix_fingerprint"] == want["mix_fingerprint"], (
        "the demo mix changed: regenerate (see the module docstring) if that is intended")
    assert got["genesis"] == want["genesis"]
    for g, w in zip(got["lines"], want["lines"]):
        assert g["components"] == w["components"], (g["step"], [
            c for c in w["components"] if g["components"][c] != w["components"][c]])
        assert g["hash"] == w["hash"]


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        with tempfile.TemporaryDirectory() as d:
            data = compute(d)
        with open(ASSET, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {ASSET}")
    else:
        print(__doc__)
