"""``open1b-audit publish RUN URL``: put a run directory (and, if asked, its mix) where a
crowd of auditors reads it - an object-store prefix or a local directory.

What is uploaded is what an auditor reads: ``steps.jsonl``, ``config.json``, every
complete checkpoint directory (``record.json`` last, so a listed record means its files
are there), any ``traces/``, and a ``run.json`` that names the mix by the URL given
(``--mix-url``, or relative to the run, e.g. ``../mix``) - never a local path of the
owner's machine. With ``--mix DIR`` the built mix is uploaded to that URL first (its
manifest last). Nothing here is trusted by an auditor: every file is checked against the
chain when it is read (``cache.py``).
"""
from __future__ import annotations

import json
import os

from open1b_audit.errors import Open1bAuditError

RUN_FILES = ("steps.jsonl", "config.json")


def _put(fs, local: str, remote: str) -> int:
    if _is_local(fs):
        os.makedirs(os.path.dirname(remote), exist_ok=True)
    fs.put_file(local, remote)
    return os.path.getsize(local)


def _is_local(fs) -> bool:
    from open1b_data.storage import is_local

    return is_local(fs)


def _tree(fs, src: str, dst: str, last: tuple[str, ...] = ()) -> tuple[int, int]:
    """Upload every regular file under ``src`` to ``dst`` (names in ``last`` after the
    others of their directory); (files, bytes)."""
    files = n = 0
    for d, dirs, names in os.walk(src):
        dirs[:] = sorted(x for x in dirs if ".tmp-" not in x and x not in ("memplan", "_work"))
        for name in sorted(names, key=lambda x: (x in last, x)):
            p = os.path.join(d, name)
            if ".tmp-" in name or not os.path.isfile(p) or os.path.islink(p):
                continue
            rel = os.path.relpath(p, src).replace(os.sep, "/")
            n += _put(fs, p, f"{dst}/{rel}")
            files += 1
    return files, n


def publish(run_dir: str, url: str, mix_url: str, mix_dir: str | None = None) -> dict:
    """Upload ``run_dir`` to ``url`` naming its mix ``mix_url`` (module docstring)."""
    from open1b_data.storage import url_to_fs

    if not os.path.isfile(os.path.join(run_dir, "steps.jsonl")):
        raise Open1bAuditError(f"{run_dir}: no steps.jsonl; not a run directory")
    rep = {"run": url, "mix": mix_url, "files": 0, "bytes": 0}
    if mix_dir is not None:
        from open1b_audit.crowd.cache import named_mix

        fs, root = url_to_fs(named_mix(url, mix_url))
        f, n = _tree(fs, mix_dir, root.rstrip("/"), last=("manifest.json",))
        rep["files"] += f
        rep["bytes"] += n
    fs, root = url_to_fs(url)
    root = root.rstrip("/")
    if _is_local(fs):
        os.makedirs(root, exist_ok=True)
    for name in RUN_FILES:
        rep["bytes"] += _put(fs, os.path.join(run_dir, name), f"{root}/{name}")
        rep["files"] += 1
    info = json.dumps({"mix": mix_url}).encode()
    fs.pipe_file(f"{root}/run.json", info)
    rep["files"] += 1
    for sub in ("checkpoints", "traces"):
        if os.path.isdir(os.path.join(run_dir, sub)):
            f, n = _tree(fs, os.path.join(run_dir, sub), f"{root}/{sub}", last=("record.json",))
            rep["files"] += f
            rep["bytes"] += n
    return rep
