"""A tiny run whose corpus holds markup and script, with a signed certificate: the run
explorer's test subject (``site_run``, session-scoped in tests/audit/conftest.py).

Every dclm-baseline document of the small training mix starts with ``ATTACK``, so every
page that shows one of them must show the markup as text and run none of it. The run is
the ``micro`` preset for ``STEPS`` steps; ``keygen`` + ``replay --certify --key`` (the real
commands) certify step ``CERTIFIED``, replayed from checkpoint 0: so steps 1 and 2.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import zstandard

ATTACK = '<script>window.PWNED=1</script><img src=x onerror="window.PWNED=2"><!-- \u2028'
STEPS = 4
CERTIFIED = 2
CERTIFIED_STEPS = (1, 2)      # replay --step 2 verifies (and certifies) 1..2


@dataclass(frozen=True)
class SiteRun:
    run: str
    mix: str
    certs: str


def plant(toml_path: Path) -> None:
    """Prefix every dclm-baseline document of the cut corpus with ``ATTACK``."""
    from open1b_data.build.definition import load_mix
    from open1b_data.build.sources import list_inputs

    for spec in load_mix(toml_path).sources:
        if spec.format != "dclm":
            continue
        for inp in list_inputs(spec):
            with open(inp.url, "rb") as f:
                raw = zstandard.ZstdDecompressor().stream_reader(f).read()
            recs = [json.loads(x) for x in raw.splitlines() if x.strip()]
            for r in recs:
                r["text"] = ATTACK + "\n" + r["text"]
            data = "\n".join(json.dumps(r) for r in recs).encode() + b"\n"
            Path(inp.url).write_bytes(zstandard.ZstdCompressor(level=3).compress(data))


def make_site_run(root: Path, env: dict[str, str]) -> SiteRun:
    import dataclasses

    from open1b_train.config import micro
    from open1b_train.train import train
    from tests.train.trainmix import train_mix

    mix = train_mix(root / "mix", steps=24, batch=4, prepare=plant)
    run = str(root / "run")
    train(dataclasses.replace(micro(), checkpoint_every=2, steps=STEPS), mix, run,
          progress=False)
    key, certs = str(root / "auditor.pem"), str(root / "certs")
    for args in (["keygen", key],
                 ["replay", run, "--step", str(CERTIFIED), "--certify", certs, "--key", key,
                  "--auditor", "alice"]):
        r = subprocess.run([sys.executable, "-m", "open1b_audit.cli", *args], env=env,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
    return SiteRun(run, mix, certs)
