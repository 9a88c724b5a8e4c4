"""Writes open1b_audit/selftest/data/corpus/: the corpus of the golden trajectories and of
``open1b-audit selftest``, cut once from the committed demo corpus (manifests/demo) by
``testkit.mixfixture.small_mix`` (the first record-range of the first input of every
source, re-written in its upstream format) and committed, so that the trajectories'
mix does not depend on the pyarrow or zstandard release that would re-write a cut.

    python scripts/make_trajectory_corpus.py     # then regenerate the goldens
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from testkit.mixfixture import small_mix

DST = Path(__file__).resolve().parents[1] / "open1b_audit" / "selftest" / "data" / "corpus"


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        small_mix(Path(d), docs=30, inputs_per_source=1, vocab=512, tokens_per_shard=4000)
        shutil.rmtree(DST, ignore_errors=True)
        shutil.copytree(Path(d) / "corpus", DST)
    print(f"wrote {DST}")


if __name__ == "__main__":
    main()
