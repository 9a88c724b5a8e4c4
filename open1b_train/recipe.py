"""The recipe a run is audited against, and what its owner announced out of band.

A run's bits follow from two hashed things its genesis names: the config (``config_identity``)
and the mix (``mix_fingerprint``, which covers the mix definition - and with it the
``[schedule]`` table: learning-rate peak and floor, warmup, batch ramp, stop tokens - and the
``[heldout]`` rule). A replay that reproduces a step proves the step follows *that* config and
mix. Whether they are the recipe the owner announced is a second question, answered here:

* ``departures(cfg, definition)`` - every difference between the run and its preset's
  published recipe: the config's fields (``config.config_departures``), and where the preset
  publishes a schedule (``REFERENCE_MIXES``: ``open1b`` the one of Mix 0626, ``demo`` the demo
  mix's, both shipped with this software in ``manifests/``) every ``schedule.*`` field and
  every source's effective ``heldout.<source>`` fraction that differs from it. The ``micro``
  preset (tests) publishes no schedule: its schedule is whatever its mix says, which only
  ``--expect-mix`` pins - ``summary`` says so instead of listing nothing.
* ``Announcement`` - what the owner published out of band (docs/AUDIT.md's threat model):
  the run hash, the preset and the mix fingerprint. ``Announcement.refusal`` names the first
  announced value the run's hashed records contradict, before any work is done; ``unpinned``
  names what was not announced, so a report can say plainly what it did not check.

A run "on recipe" for coverage is one whose certificates name the announced preset and mix
and no departure (``on_recipe``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from open1b_train.config import TrainConfig, config_departures

# the presets whose schedule and held-out rule are published: the mix definition that carries
# them, relative to the shipped manifests/ folder
REFERENCE_MIXES = {"open1b": "mix-0626.toml", "demo": "demo.toml"}


def _manifests_dir() -> str:
    from open1b_data.formats.definition import default_mix_path

    return os.path.dirname(default_mix_path())


def reference_definition(preset: str) -> dict[str, Any] | None:
    """The mix definition (as a built manifest records it) whose schedule and held-out rule
    the preset publishes, or None (the preset publishes none)."""
    from open1b_data.formats.definition import load_mix

    name = REFERENCE_MIXES.get(preset)
    if name is None:
        return None
    return load_mix(os.path.join(_manifests_dir(), name)).to_dict()


def _heldout_rule(definition: dict[str, Any], sources: list[str]) -> dict[str, str | None]:
    """Each named source's effective held-out fraction in ``definition`` as its text (None:
    it holds nothing out): its own, else the definition's ``[heldout]`` one."""
    default = (definition.get("heldout") or {}).get("fraction")
    own = {s.get("name"): s.get("heldout") for s in definition.get("sources") or []
           if isinstance(s, dict)}
    return {n: own.get(n) if own.get(n) is not None else default for n in sources}


def _same_fraction(a: str | None, b: str | None) -> bool:
    """Held-out fractions compared as exact numbers ("0.05" is "0.050"); the definition's
    parser has already refused text that is not one."""
    if a is None or b is None:
        return a is b
    return Fraction(str(a)) == Fraction(str(b))


def schedule_departures(preset: str, definition: dict[str, Any]
                        ) -> list[tuple[str, Any, Any]] | None:
    """``schedule.*`` and ``heldout.<source>`` differences from the preset's reference mix,
    as (field, preset value, run value); None when the preset publishes no schedule."""
    ref = reference_definition(preset)
    if ref is None:
        return None
    want = json.loads(json.dumps(ref.get("schedule") or {}))     # tuples as the JSON lists
    got = definition.get("schedule") or {}
    out = [(f"schedule.{k}", want.get(k), got.get(k))
           for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)]
    names = [s.get("name") for s in definition.get("sources") or [] if isinstance(s, dict)]
    hw, hg = _heldout_rule(ref, names), _heldout_rule(definition, names)
    out += [(f"heldout.{n}", hw[n], hg[n]) for n in names if not _same_fraction(hw[n], hg[n])]
    return out


def departures(cfg: TrainConfig, definition: dict[str, Any],
               mix_seed: int | None = None) -> list[tuple[str, Any, Any]]:
    """Every departure of the run (config ``cfg`` on a mix with ``definition``) from its
    preset's published recipe (see the module docstring)."""
    return config_departures(cfg, mix_seed) + (schedule_departures(cfg.preset, definition)
                                               or [])


def summary(cfg: TrainConfig, definition: dict[str, Any], mix_fingerprint: str,
            mix_seed: int | None = None) -> dict[str, Any]:
    """The recipe record a replay reports and a certificate signs."""
    published = cfg.preset in REFERENCE_MIXES
    return {"preset": cfg.preset, "mix_fingerprint": mix_fingerprint,
            "schedule": "the preset's" if published else
                        f"the mix's (the {cfg.preset!r} preset publishes no schedule: only "
                        f"--expect-mix pins it)",
            "departures": [{"field": k, "preset": a, "run": b}
                           for k, a, b in departures(cfg, definition, mix_seed)]}


def on_recipe(recipe: Any, preset: str | None = None, mix: str | None = None) -> str | None:
    """None when a signed recipe record is on the announced recipe; else why not."""
    if not isinstance(recipe, dict) or not isinstance(recipe.get("departures"), list):
        return "it names no recipe (preset, mix and departures)"
    if preset is not None and recipe.get("preset") != preset:
        return f"it certifies the {recipe.get('preset')!r} preset, not the announced {preset!r}"
    if mix is not None and recipe.get("mix_fingerprint") != mix:
        return (f"it certifies mix {str(recipe.get('mix_fingerprint'))[:16]}..., not the "
                f"announced {mix[:16]}...")
    if recipe["departures"]:
        return "it departs from the preset's recipe in " + ", ".join(
            str(d.get("field")) if isinstance(d, dict) else repr(d)
            for d in recipe["departures"])
    return None


@dataclass(frozen=True)
class Announcement:
    """What the run's owner published out of band (None: not announced, not pinned)."""

    run_hash: str | None = None
    preset: str | None = None
    mix: str | None = None            # the mix fingerprint

    def refusal(self, genesis: dict[str, Any], preset: str) -> str | None:
        """The first announced value that the run's genesis (hashed) or its config (whose
        identity the genesis hashes) contradicts, as a sentence; None if none does."""
        if self.mix is not None and genesis.get("mix_fingerprint") != self.mix:
            return (f"the run's genesis names mix {genesis.get('mix_fingerprint')!r}, not the "
                    f"announced {self.mix!r}: it trained on another mix")
        if self.preset is not None and preset != self.preset:
            return (f"the run's config claims the {preset!r} preset, not the announced "
                    f"{self.preset!r}")
        return None

    def unpinned(self) -> list[str]:
        """The options an auditor did not give, each as the flag that pins it."""
        return [flag for flag, v in (("--expect-run-hash", self.run_hash),
                                     ("--expect-preset", self.preset),
                                     ("--expect-mix", self.mix)) if v is None]
