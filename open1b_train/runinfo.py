"""``RUN/run.json``: where a run's mix lies, as its trainer wrote it (``{"mix": ...}``).

The file is not hashed (the mix is identified by the genesis's fingerprint, not by its
location), so whoever reads someone else's run reads the owner's word. A local path there
is only read (and the mix found must have the genesis's fingerprint); a URL there
(``s3://``, ``https://``, an fsspec chain ``a::b``) is refused unless the reader is the
run's own trainer resuming it: an auditor's machine must never fetch a location the owner
chose - an internal address, a bucket that logs who reads it, a server that answers
slowly - when the auditor did not pass it (``--mix``).
"""
from __future__ import annotations

import os

from open1b.safeio import read_json_object
from open1b_train.errors import Open1bTrainError

NAME = "run.json"


def is_url(location: str) -> bool:
    """Whether ``location`` names anything but a local path (fsspec would fetch it)."""
    return "://" in location or "::" in location


def named_mix(run_dir: str, own: bool = False) -> str:
    """The mix ``run_dir/run.json`` names; a URL only when ``own`` (module docstring)."""
    path = os.path.join(run_dir, NAME)
    if not os.path.lexists(path):
        raise Open1bTrainError(f"{run_dir}: no {NAME} naming its mix; pass --mix")
    mix = read_json_object(path, "run info").get("mix")
    if not isinstance(mix, str) or not mix:
        raise Open1bTrainError(f"{path}: 'mix' must name the run's mix, got {mix!r}; pass "
                               f"--mix")
    if is_url(mix) and not own:
        raise Open1bTrainError(f"{path} names the mix {mix!r}, a location its owner chose "
                               f"(run.json is not hashed); refusing to fetch it - pass --mix "
                               f"with a mix you chose (that URL, if you trust it)")
    return mix
