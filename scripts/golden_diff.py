"""Which values of the committed goldens changed between a git revision and the working
tree, and whether each change is one the mix fingerprint explains.

A change of the mix fingerprint (docs/FORMATS.md, "The mix fingerprint") enters a run's
genesis, so it changes the genesis hash and every chained step hash after it, the stream
states' ``mix.fingerprint`` and the recorded ``mix_fingerprint`` - and nothing else: every
step's components (data, grad, params, optim, scalars), the traced ops, the windows'
segments and token sha256s must be equal. This script walks every JSON golden under
``tests/assets/`` and ``open1b_audit/selftest/data/expected.json``, lists every value that
differs, and classifies it: ``fingerprint-derived`` (a key in ``DERIVED``) or ``OTHER``.
It exits 1 when any difference is OTHER.

    python scripts/golden_diff.py [REV]        # default REV: HEAD
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [*sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "assets").glob("*.json")),
         "open1b_audit/selftest/data/expected.json"]
# the keys whose values are (or hash) the mix fingerprint
DERIVED = {"fingerprint", "mix_fingerprint", "genesis", "hash"}


def walk(a, b, path: str, out: list[tuple[str, str]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            walk(a.get(k), b.get(k), f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{i}]", out)
    elif a != b:
        key = path.rsplit(".", 1)[-1].split("[")[0]
        out.append((path, "fingerprint-derived" if key in DERIVED else "OTHER"))


def main() -> int:
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    other = 0
    for name in FILES:
        try:
            old = json.loads(subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT,
                                            check=True, capture_output=True).stdout)
        except subprocess.CalledProcessError:
            print(f"{name}: not in {rev}")
            continue
        new = json.loads((ROOT / name).read_text())
        diffs: list[tuple[str, str]] = []
        walk(old, new, "", diffs)
        kinds: dict[str, int] = {}
        for _, kind in diffs:
            kinds[kind] = kinds.get(kind, 0) + 1
        print(f"{name}: {len(diffs)} value(s) differ {kinds or ''}")
        for path, kind in diffs:
            if kind == "OTHER":
                other += 1
                print(f"  OTHER {path}")
        keys = sorted({p.rsplit(".", 1)[-1].split("[")[0] for p, _ in diffs})
        if keys:
            print(f"  keys: {keys}")
    print("only fingerprint-derived values changed" if not other
          else f"{other} other value(s) changed")
    return 1 if other else 0


if __name__ == "__main__":
    sys.exit(main())
