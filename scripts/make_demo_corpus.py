"""Extract the demo corpus (``manifests/demo/``) from real text shipped with Python and with
packages of this project's environment, laid out in the four upstream formats of Mix 0626.

Run once; its output is committed, so every machine builds the identical demo mix (golden
hashes depend on it). Re-running needs the same versions (checked below) to reproduce the
same bytes. Nothing here generates text: every document is a real page, docstring or
source file; the only derived values are metadata no local tool can reproduce (quality
scores, ids), each by a rule written in ``manifests/demo/ATTRIBUTION.md``.

    .venv/bin/python scripts/make_demo_corpus.py [--out manifests/demo]

The provenance reads one upstream format at a time, next to ATTRIBUTION.md which states it
in prose: ``demo_corpus/dclm.py`` (web pages), ``fineweb.py`` (NumPy reference pages),
``stack.py`` (CPython sources), ``proofpile.py`` (mpmath/SymPy math), ``licenses.py``
(what may be redistributed, and the license files copied beside it) and ``records.py``
(ids, digests and the deterministic file writers they share).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

import pyarrow as pa
import zstandard

from demo_corpus.dclm import make_dclm
from demo_corpus.fineweb import make_fineweb
from demo_corpus.licenses import copy_licenses
from demo_corpus.proofpile import make_proof_pile
from demo_corpus.stack import make_stack

EXPECTED = {"python": "3.11.7", "numpy": "2.4.6", "sympy": "1.14.0", "mpmath": "1.3.0",
            "torch": "2.13.0+cpu", "pyarrow": "26.0.1", "zstandard": "0.25.0"}


def check_versions() -> None:
    import mpmath
    import numpy
    import sympy
    import torch

    got = {"python": ".".join(map(str, sys.version_info[:3])), "numpy": numpy.__version__,
           "sympy": sympy.__version__, "mpmath": mpmath.__version__,
           "torch": torch.__version__, "pyarrow": pa.__version__,
           "zstandard": zstandard.__version__}
    if got != EXPECTED:
        sys.exit(f"versions differ from the committed corpus's: {got} vs {EXPECTED}; the "
                 f"output would not match manifests/demo byte for byte")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..",
                                                  "manifests", "demo"))
    args = ap.parse_args()
    check_versions()
    out = os.path.normpath(args.out)
    for sub in ("dclm-baseline", "fineweb-edu", "the-stack-v2", "proof-pile-2"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    sizes = {}
    sizes["dclm-baseline"], licenses = make_dclm(out)
    sizes["fineweb-edu"] = make_fineweb(out)
    sizes["the-stack-v2"] = make_stack(out)
    sizes["proof-pile-2"] = make_proof_pile(out)
    copy_licenses(out, licenses)
    total = sum(sizes.values())
    for name, b in sizes.items():
        print(f"{name:15s} {b:>10,d} bytes of text written")
    print(f"{'total':15s} {total:>10,d}")
    print_shares(os.path.join(os.path.dirname(out), "demo.toml"))


def print_shares(mix_path: str) -> None:
    """The text bytes each source keeps after its filters, read back through the real
    readers: the `share` values of demo.toml are these bytes' proportions."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from open1b_data.ingest.document import Document
    from open1b_data.formats.definition import load_mix
    from open1b_data.ingest.sources import list_inputs, read_input

    if not os.path.exists(mix_path):
        return
    kept = {}
    for spec in load_mix(mix_path).sources:
        kept[spec.name] = sum(len(r.text.encode()) for inp in list_inputs(spec)
                              for r in read_input(spec, inp) if isinstance(r, Document))
    total = sum(kept.values())
    for name, b in kept.items():
        print(f"{name:15s} {b:>10,d} bytes kept   share = {b / total:.3f}")


if __name__ == "__main__":
    main()
