"""A small built mix of real text for training tests: the demo corpus cut by
``tests.build.mixfixture.small_mix``, with a schedule whose batch of 12 windows splits
over 1, 2, 3, 4 and 6 virtual ranks (micro-batch 1), short 33-token windows and a
512-token vocabulary, so the ``micro`` preset runs a step in well under a second."""
from __future__ import annotations

import tomllib
from pathlib import Path

from open1b_data.build.definition import load_mix
from open1b_data.build.pipeline import BuildOptions, build_mix
from tests.build.mixfixture import dump_toml, small_mix

SEQ = 32
BATCH = 12


def train_mix(dst: Path, steps: int = 12, batch: int = BATCH, seq: int = SEQ,
              phases: list[dict] | None = None, prepare=None) -> str:
    """Build the mix under ``dst``; returns the built mix directory. ``prepare(toml_path)``
    may edit the cut corpus first (e.g. plant a document)."""
    path = small_mix(dst, docs=30, inputs_per_source=1, vocab=512, tokens_per_shard=4000)
    if prepare is not None:
        prepare(path)
    raw = tomllib.loads(path.read_text())
    raw["mix"]["window"] = seq + 1
    raw["schedule"] = {
        "seq_tokens": seq, "micro_batch": 1, "reference_world": 1,
        "stop_tokens": steps * batch * seq, "lr_peak": 1e-3, "lr_final_ratio": 0.1,
        "warmup_tokens": 2 * batch * seq,
        "phases": phases or [{"start_tokens": 0, "batch_sequences": batch}]}
    path.write_text(dump_toml(raw))
    out = dst / "built"
    build_mix(load_mix(path), str(out), BuildOptions(workers=1, progress=False))
    return str(out)
