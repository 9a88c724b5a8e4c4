"""Checkpoints: safetensors files plus a JSON record, written atomically, verified on load.

Layout of ``RUN/checkpoints/step-<nnnnnnnn>/``:

* ``params.safetensors`` - every parameter under its model name, in its own dtype (bf16
  weights and gains, float32 LSQ activation steps);
* ``optim-<i>-of-<S>.safetensors`` - the Adam moments as float32 ``m.<name>`` /
  ``v.<name>`` of the parameters of logical shard i (``Layout.shards(S)``, S = the mesh's
  dp_shard): one file per shard of the logical mesh, whichever process wrote it, so a run
  on any number of processes writes the same files and any number can read them;
* ``record.json``        - ``{"format": "open1b-checkpoint", "version": 1, "step",
  "adam_step", "skip_left", "run_hash" (the hash of this step), "loader" (the stream
  loader's state at the step boundary), "config" (TrainConfig.to_dict), "config_identity"
  (its sha256), "mix_fingerprint", "seed", "software", "components" (this step's params
  and optim digests), "files": {name: sha256 of the file's bytes}}``.

Writing: every file goes into ``step-<n>.tmp-<tag>/`` (each file fsynced; several
processes may write their shards there), the record last, then one ``rename`` to the final
name and an fsync of the parent - a process killed at any point leaves either the previous
checkpoints alone or a complete new one; stale ``.tmp-`` directories are ignored and
removed by the next writer. Nothing is pickled: safetensors
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
from open1b.safeio import read_json_object, read_regular

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


def tmp_dir(run: str, step: int, tag: str) -> str:
    return f"{step_dir(run, step)}.tmp-{tag}"


def clear_debris(run: str) -> None:
    """Remove temporary directories left by writers killed mid-checkpoint."""
    parent = os.path.join(run, DIR)
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):
        if ".tmp-" in name:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def tensor_files(params: dict[str, torch.Tensor] | None,
                 optim_shards: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]],
                 n_shards: int) -> dict[str, bytes]:
    """The safetensors files of a checkpoint: params (if given) and the optim shards given
    as {shard index: (m by name, v by name)}."""
    host = lambda t: t.detach().cpu().contiguous()  # noqa: E731
    out = {}
    if params is not None:
        out["params.safetensors"] = st_save({k: host(t) for k, t in params.items()})
    for i, (m, v) in optim_shards.items():
        out[f"optim-{i:05d}-of-{n_shards:05d}.safetensors"] = st_save(
            {**{f"m.{k}": host(t) for k, t in m.items()}, **{f"v.{k}": host(t) for k, t in v.items()}})
    return out


def write_files(tmp: str, files: dict[str, bytes]) -> dict[str, str]:
    """Write ``files`` into ``tmp`` (fsynced); returns their sha256."""
    os.makedirs(tmp, exist_ok=True)
    sums = {}
    for name, data in files.items():
        _fsync_write(os.path.join(tmp, name), data)
        sums[name] = hashlib.sha256(data).hexdigest()
    return sums


def commit(run: str, step: int, tmp: str, record: dict[str, Any], files: dict[str, str]) -> str:
    """Write the record (last) into ``tmp`` and rename it to checkpoint ``step``."""
    final = step_dir(run, step)
    rec = {"format": FORMAT, "version": VERSION, "step": step, **record, "files": files}
    _fsync_write(os.path.join(tmp, "record.json"),
                 json.dumps(rec, sort_keys=True, indent=1).encode())
    if os.path.exists(final):                  # a re-run of the same step: same bits
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(os.path.dirname(final))
    return final


def save(run: str, step: int, params: dict[str, torch.Tensor],
         optim_shards: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]],
         n_shards: int, record: dict[str, Any]) -> str:
    """Write checkpoint ``step`` atomically from one process; returns its directory."""
    clear_debris(run)
    tmp = tmp_dir(run, step, str(os.getpid()))
    files = write_files(tmp, tensor_files(params, optim_shards, n_shards))
    return commit(run, step, tmp, record, files)


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
    if not os.path.lexists(rpath):
        raise CheckpointError(f"{path}: no record.json; it is not a checkpoint")
    rec = read_json_object(rpath, "checkpoint record", CheckpointError)
    if (rec.get("format"), rec.get("version")) != (FORMAT, VERSION):
        raise CheckpointError(f"{rpath}: not a version-{VERSION} {FORMAT} record")
    for key in ("step", "adam_step", "skip_left"):     # hashed into the optim digest / path
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CheckpointError(f"{rpath}: {key} must be an integer >= 0, got {v!r}; the "
                                  f"record is corrupt")
    name = os.path.basename(os.path.normpath(path))
    if name.startswith("step-") and name[5:].isdigit() and int(name[5:]) != rec["step"]:
        raise CheckpointError(f"{rpath}: records step {rec['step']} inside {name}; the "
                              f"checkpoint was moved or edited")
    return rec


def load(path: str, device: torch.device | str = "cpu") -> Checkpoint:
    """Read and verify a checkpoint directory (see the module docstring)."""
    rec = read_record(path)
    files = rec.get("files") or {}
    if not isinstance(files, dict) or "params.safetensors" not in files or \
            not any(str(f).startswith("optim-") for f in files):
        raise CheckpointError(f"{path}: the record lists no params/optim files; corrupt")
    params: dict[str, torch.Tensor] = {}
    m: dict[str, torch.Tensor] = {}
    v: dict[str, torch.Tensor] = {}
    for name in sorted(files):
        if not isinstance(name, str) or not isinstance(files[name], str) or \
                os.path.basename(name) != name or not name.endswith(".safetensors"):
            raise CheckpointError(f"{path}/record.json: files lists {name!r}; a checkpoint "
                                  f"file is a plain *.safetensors name with its sha256")
        fpath = os.path.join(path, name)
        data = read_regular(fpath, "checkpoint file", CheckpointError)
        got = hashlib.sha256(data).hexdigest()
        if got != files[name]:
            raise CheckpointError(f"{fpath}: sha256 {got} differs from the record's "
                                  f"{files[name]}; the checkpoint is corrupt or was edited - "
                                  f"resume from an earlier one")
        try:
            tensors = st_load(data)
        except Exception as e:  # safetensors raises its own error types for malformed files
            raise CheckpointError(f"{fpath}: malformed safetensors data ({e})") from None
        if name == "params.safetensors":
            params.update(tensors)
        else:
            m.update({k[2:]: t for k, t in tensors.items() if k.startswith("m.")})
            v.update({k[2:]: t for k, t in tensors.items() if k.startswith("v.")})
    move = lambda d: {k: t.to(device) for k, t in d.items()}  # noqa: E731
    return Checkpoint(rec["step"], path, rec, move(params), move(m), move(v))


def prune(run: str, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (keep = 0: keep all)."""
    if keep <= 0:
        return
    for step in list_steps(run)[:-keep]:
        shutil.rmtree(step_dir(run, step), ignore_errors=True)
