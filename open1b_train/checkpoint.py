"""Checkpoints: safetensors files plus a JSON record, written atomically, verified on load.

Layout of ``RUN/checkpoints/step-<nnnnnnnn>/``:

* ``params.safetensors`` - every parameter under its model name, in its own dtype (bf16
  weights and gains, float32 LSQ activation steps);
* ``optim.safetensors``  - the Adam moments as float32 ``m.<name>`` / ``v.<name>``;
* ``record.json``        - ``{"format": "open1b-checkpoint", "version": 1, "step",
  "adam_step", "skip_left", "run_hash" (the hash of this step), "loader" (the stream
  loader's state at the step boundary), "config" (TrainConfig.to_dict), "config_identity"
  (its sha256), "mix_fingerprint", "seed", "software", "components" (this step's params
  and optim digests), "files": {name: sha256 of the file's bytes}}``.

Writing: everything goes into ``step-<n>.tmp-<pid>/`` (each file fsynced), the record last,
then one ``rename`` to the final name and an fsync of the parent - a process killed at any
point leaves either the previous checkpoints alone or a complete new one; stale ``.tmp-``
directories are ignored and removed by the next writer. Nothing is pickled: safetensors
cannot execute code on load, and JSON is data.

Loading (``load``) re-hashes both files against the record and re-derives the params and
optim digests from the loaded tensors: a corrupt or edited checkpoint is refused with a
``CheckpointError`` naming the file and both hashes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from open1b_train.errors import CheckpointError

FORMAT = "open1b-checkpoint"
VERSION = 1
DIR = "checkpoints"


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str
    record: dict[str, Any]
    params: dict[str, torch.Tensor]
    m: dict[str, torch.Tensor]
    v: dict[str, torch.Tensor]


def step_dir(run: str, step: int) -> str:
    return os.path.join(run, DIR, f"step-{step:08d}")


def _fsync_write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(run: str, step: int, params: dict[str, torch.Tensor], m: dict[str, torch.Tensor],
         v: dict[str, torch.Tensor], record: dict[str, Any]) -> str:
    """Write checkpoint ``step`` atomically; returns its directory."""
    final = step_dir(run, step)
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):            # debris of a writer killed mid-checkpoint
        if ".tmp-" in name:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    tmp = f"{final}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    blobs = {
        "params.safetensors": st_save({k: t.detach().cpu().contiguous() for k, t in params.items()}),
        "optim.safetensors": st_save({**{f"m.{k}": t.detach().cpu().contiguous()
                                         for k, t in m.items()},
                                      **{f"v.{k}": t.detach().cpu().contiguous()
                                         for k, t in v.items()}}),
    }
    files = {}
    for name, data in blobs.items():
        _fsync_write(os.path.join(tmp, name), data)
        files[name] = hashlib.sha256(data).hexdigest()
    rec = {"format": FORMAT, "version": VERSION, "step": step, **record, "files": files}
    _fsync_write(os.path.join(tmp, "record.json"),
                 json.dumps(rec, sort_keys=True, indent=1).encode())
    if os.path.exists(final):                  # a re-run of the same step: same bits
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(parent)
    return final


def list_steps(run: str) -> list[int]:
    """Steps with a complete checkpoint directory (not verified), ascending."""
    root = os.path.join(run, DIR)
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        if name.startswith("step-") and ".tmp-" not in name and name[5:].isdigit() and \
                os.path.exists(os.path.join(root, name, "record.json")):
            out.append(int(name[5:]))
    return sorted(out)


def read_record(path: str) -> dict[str, Any]:
    rpath = os.path.join(path, "record.json")
    try:
        with open(rpath, "rb") as f:
            rec = json.loads(f.read())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no record.json; it is not a checkpoint") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{rpath}: unreadable ({e}); the checkpoint is corrupt") from None
    if not isinstance(rec, dict) or (rec.get("format"), rec.get("version")) != (FORMAT, VERSION):
        raise CheckpointError(f"{rpath}: not a version-{VERSION} {FORMAT} record")
    return rec


def load(path: str, device: torch.device | str = "cpu") -> Checkpoint:
    """Read and verify a checkpoint directory (see the module docstring)."""
    rec = read_record(path)
    files = rec.get("files") or {}
    blobs = {}
    for name in ("params.safetensors", "optim.safetensors"):
        fpath = os.path.join(path, name)
        try:
            with open(fpath, "rb") as f:
                data = f.read()
        except OSError as e:
            raise CheckpointError(f"{fpath}: cannot read ({e.strerror}); the checkpoint is "
                                  f"incomplete - resume from an earlier one") from None
        got = hashlib.sha256(data).hexdigest()
        if got != files.get(name):
            raise CheckpointError(f"{fpath}: sha256 {got} differs from the record's "
                                  f"{files.get(name)}; the checkpoint is corrupt or was "
                                  f"edited - resume from an earlier one (--from-step)")
        blobs[name] = data
    try:
        params = st_load(blobs["params.safetensors"])
        optim = st_load(blobs["optim.safetensors"])
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise CheckpointError(f"{path}: malformed safetensors data ({e})") from None
    m = {k[2:]: t for k, t in optim.items() if k.startswith("m.")}
    v = {k[2:]: t for k, t in optim.items() if k.startswith("v.")}
    move = lambda d: {k: t.to(device) for k, t in d.items()}  # noqa: E731
    return Checkpoint(int(rec["step"]), path, rec, move(params), move(m), move(v))


def prune(run: str, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (keep = 0: keep all)."""
    if keep <= 0:
        return
    for step in list_steps(run)[:-keep]:
        shutil.rmtree(step_dir(run, step), ignore_errors=True)
