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
``CheckpointError`` naming the file and both hashes. Tensors are refused by name, never
dropped or merged silently: a name twice in one file's header (JSON parsers disagree on
which entry wins), a moment twice across the optim files, an optim entry that is not
``m.<name>`` / ``v.<name>``, and (``check_names``, given the model's parameter names) a
tensor the model does not have or a parameter it lacks.

The lean memory plan (``memory/memplan.py``) writes and reads the same files in chunks
(``save_streamed`` / ``load_streamed``): the safetensors layout written by hand - tensors
ordered float32 before bf16, then by name, the header compact JSON padded with spaces to
a multiple of 8 bytes, as ``safetensors.torch.save`` lays it out (tested byte for byte) -
with the Adam moments streamed from and to the plan's ``DiskFlat`` files, so a
checkpoint's bytes are never all in memory. A streamed load reads each file once, hashing
the bytes it parses (never a second read after the check).
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
from open1b.safeio import open_fd, read_json_object, read_regular, refuse_linked_dirs

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
    m_flat: object = None            # load_streamed: the moments in DiskFlat files
    v_flat: object = None


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
        if (name.startswith("step-") and ".tmp-" not in name and name[5:].isdigit() and
                os.path.exists(os.path.join(root, name, "record.json"))):
            out.append(int(name[5:]))
    return sorted(out)


def read_record(path: str) -> dict[str, Any]:
    rpath = os.path.join(path, "record.json")
    parent = os.path.dirname(os.path.normpath(path))
    if os.path.basename(parent) == DIR:     # inside a run: its folders are the owner's
        refuse_linked_dirs(os.path.dirname(parent), rpath, "checkpoint record",
                           CheckpointError)
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


def _record_and_files(path: str) -> tuple[dict, dict]:
    """The checkpoint's verified record and its file table, which must list the params and
    at least one optimizer file (both loaders start here)."""
    rec = read_record(path)
    files = rec.get("files") or {}
    if (not isinstance(files, dict) or "params.safetensors" not in files or
            not any(str(f).startswith("optim-") for f in files)):
        raise CheckpointError(f"{path}: the record lists no params/optim files; corrupt")
    return rec, files


# ----------------------------------------------------------------------------- checks

def record_difference(rec: dict[str, Any], lines: list[dict[str, Any]], step: int
                      ) -> str | None:
    """Why a checkpoint record is not step ``step`` of this chain (None: it is). Its
    ``run_hash`` is the step's hash; mix fingerprint, seed and config identity the
    genesis's."""
    g = lines[0]["genesis"]
    for key in ("mix_fingerprint", "seed", "config_identity"):
        if rec.get(key) != g.get(key):
            return (f"its record has {key} {rec.get(key)!r}, the run's genesis {g.get(key)!r}; "
                    f"it belongs to another run")
    if rec.get("run_hash") != lines[step]["hash"]:
        return (f"its record names step hash {rec.get('run_hash')!r}, the log's step {step} is "
                f"{lines[step]['hash']!r} (a checkpoint of another run or step)")
    return None


def load(path: str, device: torch.device | str = "cpu", params_only: bool = False
         ) -> Checkpoint:
    """Read and verify a checkpoint directory (see the module docstring); ``params_only``
    reads the parameters alone (a model for use, not a state to train from)."""
    rec, files = _record_and_files(path)
    params: dict[str, torch.Tensor] = {}
    m: dict[str, torch.Tensor] = {}
    v: dict[str, torch.Tensor] = {}
    for name in sorted(files):
        if params_only and name != "params.safetensors":
            continue
        if (not isinstance(name, str) or not isinstance(files[name], str) or
                os.path.basename(name) != name or not name.endswith(".safetensors")):
            raise CheckpointError(f"{path}/record.json: files lists {name!r}; a checkpoint "
                                  f"file is a plain *.safetensors name with its sha256")
        fpath = os.path.join(path, name)
        data = read_regular(fpath, "checkpoint file", CheckpointError)
        got = hashlib.sha256(data).hexdigest()
        if got != files[name]:
            raise CheckpointError(f"{fpath}: sha256 {got} differs from the record's "
                                  f"{files[name]}; the checkpoint is corrupt or was edited - "
                                  f"resume from an earlier one")
        _unique_header(data[8:8 + _header_size(data[:8], len(data), fpath)], fpath)
        try:
            tensors = st_load(data)
        except Exception as e:  # safetensors raises its own error types for malformed files
            raise CheckpointError(f"{fpath}: malformed safetensors data ({e})") from None
        if name == "params.safetensors":
            params.update(tensors)
            continue
        for key, t in tensors.items():
            which, _, pname = key.partition(".")
            into = {"m": m, "v": v}.get(which)
            if into is None or not pname:
                raise CheckpointError(f"{fpath}: tensor {key!r} is not an Adam moment "
                                      f"(m.<name> or v.<name>); refusing the checkpoint")
            if pname in into:
                raise CheckpointError(f"{fpath}: tensor {key!r} is also in another optim "
                                      f"file of {path}; refusing the checkpoint (which one "
                                      f"holds the moment?)")
            into[pname] = t
    move = lambda d: {k: t.to(device) for k, t in d.items()}  # noqa: E731
    return Checkpoint(rec["step"], path, rec, move(params), move(m), move(v))


def _header_size(raw: bytes, size: int, fpath: str) -> int:
    n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
    if not 2 <= n <= min(size - 8, 100 << 20):
        raise CheckpointError(f"{fpath}: safetensors header of {n} bytes in a {size}-byte "
                              f"file; malformed")
    return n


def _unique_header(text: bytes, fpath: str) -> dict[str, Any]:
    """A safetensors header parsed with every object's names distinct (a duplicate is
    refused by name: safetensors keeps the last entry, other readers the first)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, val in items:
            if k in out:
                raise CheckpointError(f"{fpath}: the safetensors header names {k!r} twice; "
                                      f"refusing the checkpoint (which entry is the tensor?)")
            out[k] = val
        return out
    try:
        hdr = json.loads(text, object_pairs_hook=pairs)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise CheckpointError(f"{fpath}: malformed safetensors header") from None
    if not isinstance(hdr, dict):
        raise CheckpointError(f"{fpath}: malformed safetensors header")
    return hdr


def read_tensors(path: str, what: str = "safetensors file") -> dict[str, torch.Tensor]:
    """A safetensors file written by others: a regular file, its header's names distinct
    (``_unique_header``), its tensors (never unpickled); ``CheckpointError`` names what is
    wrong."""
    data = read_regular(path, what, CheckpointError)
    _unique_header(data[8:8 + _header_size(data[:8], len(data), path)], path)
    try:
        return st_load(data)
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise CheckpointError(f"{path}: malformed safetensors data ({e})") from None


def check_names(ck: Checkpoint, names: list[str]) -> None:
    """Refuse a checkpoint whose tensors are not exactly the model's parameters ``names``
    (and, loaded whole, their two moments): an extra tensor is named, never ignored."""
    want = set(names)
    parts = [("params.safetensors", ck.params, "")]
    if ck.m_flat is None:
        parts += [("optim files", ck.m, "m."), ("optim files", ck.v, "v.")]
    for where, got, prefix in parts:
        extra = sorted(set(got) - want)
        if extra:
            raise CheckpointError(f"checkpoint {ck.path}: its {where} hold tensor(s) "
                                  f"{[prefix + k for k in extra[:3]]} that this run's model "
                                  f"does not have; refusing it")
        missing = sorted(want - set(got))
        if missing:
            raise CheckpointError(f"checkpoint {ck.path} lacks parameters "
                                  f"{[prefix + k for k in missing[:3]]} of this run's model; "
                                  f"it was written for another config")


def prune(run: str, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (keep = 0: keep all)."""
    if keep <= 0:
        return
    for step in list_steps(run)[:-keep]:
        shutil.rmtree(step_dir(run, step), ignore_errors=True)


# ----------------------------------------------------------------------------- streamed

ST_DTYPES = {torch.float32: ("F32", 4), torch.bfloat16: ("BF16", 2)}
ST_ORDER = {"F32": 0, "BF16": 1}          # safetensors: larger dtypes first, then by name
ST_BY_NAME = {v[0]: k for k, v in ST_DTYPES.items()}
IO_CHUNK = 1 << 24                          # bytes per read / write


def _bytes_of(t: torch.Tensor) -> memoryview:
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return memoryview(t.numpy()).cast("B")


def write_safetensors(path: str, entries: list[tuple[str, torch.dtype, tuple, object]]) -> str:
    """Write ``entries`` (name, dtype, shape, parts: a callable giving the tensor's
    consecutive 1-D parts) as one safetensors file, fsynced; returns its sha256."""
    order = sorted(entries, key=lambda e: (ST_ORDER[ST_DTYPES[e[1]][0]], e[0]))
    header, off = {}, 0
    for name, dtype, shape, _ in order:
        n = ST_DTYPES[dtype][1]
        for d in shape:
            n *= d
        header[name] = {"dtype": ST_DTYPES[dtype][0], "shape": list(shape),
                        "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (len(text).to_bytes(8, "little"), text):
            f.write(chunk)
            h.update(chunk)
        for name, _, _, parts in order:
            for part in parts():
                data = _bytes_of(part)
                f.write(data)
                h.update(data)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


def save_streamed(run: str, step: int, params: dict[str, torch.Tensor], layout, m, v,
                  n_shards: int, record: dict[str, Any]) -> str:
    """``save`` with the moments read in chunks from ``m`` / ``v`` (``DiskFlat``) and every
    file written in chunks: the same files, never whole in memory."""
    from open1b_train.memory.memplan import moment_parts

    clear_debris(run)
    tmp = tmp_dir(run, step, str(os.getpid()))
    os.makedirs(tmp, exist_ok=True)
    sums = {"params.safetensors": write_safetensors(
        os.path.join(tmp, "params.safetensors"),
        [(k, t.dtype, tuple(t.shape), lambda t=t: [t.reshape(-1)]) for k, t in params.items()])}
    for i, (a, b) in enumerate(layout.shards(n_shards)):
        entries = []
        for name in layout.names_in(a, b):
            shape = layout.by_name[name].shape
            for which, flat in (("m", m), ("v", v)):
                entries.append((f"{which}.{name}", torch.float32, shape,
                                lambda f=flat, n=name: moment_parts(layout, f, n)))
        fname = f"optim-{i:05d}-of-{n_shards:05d}.safetensors"
        sums[fname] = write_safetensors(os.path.join(tmp, fname), entries)
    return commit(run, step, tmp, record, sums)


def _read_exact(f, n: int, fpath: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError(f"{fpath}: truncated safetensors data; corrupt")
    return data


def _header_entries(f, size: int, fpath: str, h) -> list[tuple[str, torch.dtype, list, int, int]]:
    """The validated header of a safetensors file: (name, dtype, shape, start, end) in data
    order, covering the data exactly."""
    raw = _read_exact(f, 8, fpath)
    h.update(raw)
    n = _header_size(raw, size, fpath)
    text = _read_exact(f, n, fpath)
    h.update(text)
    hdr = _unique_header(text, fpath)
    out = []
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(e, dict) and e.get("dtype") in ST_BY_NAME
              and isinstance(e.get("shape"), list) and isinstance(e.get("data_offsets"), list)
              and len(e["data_offsets"]) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                      for x in e["shape"] + e["data_offsets"]))
        if not ok:
            raise CheckpointError(f"{fpath}: malformed safetensors entry {name!r}")
        dtype = ST_BY_NAME[e["dtype"]]
        numel = 1
        for d in e["shape"]:
            numel *= d
        a, b = e["data_offsets"]
        if b - a != numel * ST_DTYPES[dtype][1]:
            raise CheckpointError(f"{fpath}: entry {name!r} has {b - a} bytes for shape "
                                  f"{e['shape']}; malformed")
        out.append((name, dtype, e["shape"], a, b))
    out.sort(key=lambda x: x[3])
    pos = 0
    for name, _, _, a, b in out:
        if a != pos:
            raise CheckpointError(f"{fpath}: entry {name!r} starts at byte {a}, expected "
                                  f"{pos}; malformed")
        pos = b
    if 8 + n + pos != size:
        raise CheckpointError(f"{fpath}: {size} bytes but the header describes {8 + n + pos}; "
                              f"malformed")
    return out


def load_streamed(path: str, layout, m_flat, v_flat) -> Checkpoint:
    """``load`` for the lean plan: parameters into memory, moments straight into the
    ``DiskFlat`` files ``m_flat`` / ``v_flat``; each file read once in chunks, its sha256
    taken over the bytes parsed and compared with the record's at the end."""
    rec, files = _record_and_files(path)
    params: dict[str, torch.Tensor] = {}
    seen = {"m": set(), "v": set()}
    for name in sorted(files):
        if (not isinstance(name, str) or not isinstance(files[name], str) or
                os.path.basename(name) != name or not name.endswith(".safetensors")):
            raise CheckpointError(f"{path}/record.json: files lists {name!r}; a checkpoint "
                                  f"file is a plain *.safetensors name with its sha256")
        fpath = os.path.join(path, name)
        fd = open_fd(fpath, "checkpoint file", CheckpointError)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            h = hashlib.sha256()
            for key, dtype, shape, a, b in _header_entries(f, st.st_size, fpath, h):
                if name == "params.safetensors":
                    t = torch.empty(shape, dtype=dtype)
                    buf = _bytes_of(t) if t.numel() else memoryview(b"")
                    for c in range(0, b - a, IO_CHUNK):
                        part = buf[c:c + IO_CHUNK]
                        if f.readinto(part) != len(part):
                            raise CheckpointError(f"{fpath}: truncated; corrupt")
                        h.update(part)
                    params[key] = t
                    continue
                which, _, pname = key.partition(".")
                slot = layout.by_name.get(pname)
                if (which not in seen or slot is None or dtype != torch.float32 or
                        tuple(shape) != tuple(slot.shape) or pname in seen[which]):
                    raise CheckpointError(f"{fpath}: entry {key!r} is not a moment of this "
                                          f"run's model; it was written for another config")
                flat = m_flat if which == "m" else v_flat
                for c in range(0, b - a, IO_CHUNK):
                    data = _read_exact(f, min(IO_CHUNK, b - a - c), fpath)
                    h.update(data)
                    flat.write(slot.offset + c // 4, torch.frombuffer(bytearray(data),
                                                                      dtype=torch.float32))
                seen[which].add(pname)
            if f.read(1):
                raise CheckpointError(f"{fpath}: data past the described tensors; malformed")
        if h.hexdigest() != files[name]:
            raise CheckpointError(f"{fpath}: sha256 {h.hexdigest()} differs from the record's "
                                  f"{files[name]}; the checkpoint is corrupt or was edited - "
                                  f"resume from an earlier one")
    missing = [s.name for s in layout.slots if s.name not in params or s.name not in seen["m"]
               or s.name not in seen["v"]]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks parameters {missing[:3]} of this "
                              f"run's model; it was written for another config")
    return Checkpoint(rec["step"], path, rec, params, {}, {}, m_flat, v_flat)
