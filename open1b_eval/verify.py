"""``open1b-audit verify-model DIR --run RUN --expect-run-hash H``: is a model found elsewhere
step N of a published run?

DIR is a checkpoint directory (``record.json`` + ``params.safetensors``, as a run publishes
it) or a folder written by ``open1b-train export`` (``config.json`` + ``model.safetensors``,
as a user downloads it from a model hub). The answer is "step N of run H" or the first thing
that differs, named:

1. The run is opened as every loader opens it (``open1b_train.published``): one chain,
   pinned to H, the hashed config, the mix's fingerprint and its tokenizer files.
2. DIR's tensors are read as safetensors (never unpickled); an export's are mapped back to
   the model's parameters (``export.params_from_hf``), its derived ``weight_scale`` tensors
   recomputed from the weights and compared. Missing or extra tensors are named.
3. Their digest is compared with the log: the step DIR claims first (its provenance record
   or checkpoint record), then every logged step. Where none matches and the run publishes a
   checkpoint at the claimed step, the tensors are compared one by one and the first
   differing one is named.
4. An export's ``config.json`` must hold the values the hashed config gives (each field
   named) and no other field - no ``auto_map`` or other hook that would load code - and its
   ``generation_config.json`` likewise; every tokenizer file must be byte-identical to the
   manifest's; the folder holds only the files ``export`` writes; ``README.md`` is the one
   export writes; every field of ``open1b_provenance.json`` is compared with the chain.
   A checkpoint directory's record must be the chain's (``checkpoint.record_difference``)
   and its moments are compared too.

A folder in the Hugging Face cache (``huggingface_hub.snapshot_download`` without
``local_dir``: ``<repo>/snapshots/<revision>/<name>`` are links to ``<repo>/blobs/<sha>``) is
read through those links, and only those: a link whose target is not a file directly in its
own repo's ``blobs`` folder is refused, named. Everywhere else a link is refused (``safeio``).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from open1b.safeio import parse_json, read_regular
from open1b_eval import export as ex
from open1b_eval.errors import EvalError
from open1b_eval.trained import Trained
from open1b_train import checkpoint, statehash
from open1b_train.errors import CheckpointError
from open1b_train.params import param_specs
from open1b_train.published import PublishedRun

GENERATION_FIELDS = {"_from_model_config", "output_attentions", "output_hidden_states",
                     "transformers_version", "eos_token_id", "pad_token_id"}
# informational fields transformers writes, not the model's
BOOKKEEPING = {"transformers_version", "dtype", "torch_dtype", "_name_or_path"}


@dataclass
class Verdict:
    dir: str
    kind: str                                  # checkpoint | export
    run_hash: str
    pinned: bool
    step: int | None = None                    # the step DIR is (None: none)
    difference: dict[str, str] | None = None   # {"what", "name", "detail"}
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.difference is None and self.step is not None

    def to_dict(self) -> dict[str, Any]:
        return {"dir": self.dir, "kind": self.kind, "run_hash": self.run_hash,
                "run_hash_pinned": self.pinned, "verdict": "match" if self.ok else "differs",
                "step": self.step, "difference": self.difference, "checked": self.checked}


class Differs(Exception):
    """The first difference found: what (tensor, config, tokenizer, file, provenance,
    record), its name, and a sentence."""

    def __init__(self, what: str, name: str, detail: str) -> None:
        super().__init__(detail)
        self.what, self.name, self.detail = what, name, detail


def _hf_blobs(d: str) -> str | None:
    """The ``blobs`` folder of the Hugging Face cache repo that holds snapshot ``d``, if
    ``d`` is one (module docstring)."""
    parent = os.path.dirname(os.path.abspath(d))
    blobs = os.path.join(os.path.dirname(parent), "blobs")
    if os.path.basename(parent) == "snapshots" and os.path.isdir(blobs):
        return os.path.realpath(blobs)
    return None


def _file(d: str, name: str) -> str:
    """The path to read DIR's file ``name`` from: itself, or in a Hugging Face cache snapshot
    the blob its link names - a file directly in the repo's ``blobs`` (anything else is a
    ``Differs`` naming the link)."""
    p = os.path.join(d, name)
    if not os.path.islink(p):
        return p
    blobs = _hf_blobs(d)
    target = os.path.realpath(p)
    if blobs is None or os.path.dirname(target) != blobs:
        where = ("outside its Hugging Face cache repo's blobs folder" if blobs else
                 "and the folder is not a Hugging Face cache snapshot")
        raise Differs("file", name, f"{name} is a symbolic link to {target}, {where}; refusing "
                                    f"to follow it (download with --local-dir, or replace the "
                                    f"link with the file)")
    return target


def _tensors(path: str, name: str | None = None) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (``checkpoint.read_tensors``: a name given twice in its
    header is refused - a reader keeps one of the two, so the file does not say which
    tensor it holds)."""
    try:
        return checkpoint.read_tensors(path)
    except CheckpointError as e:
        raise Differs("file", name or os.path.basename(path), str(e)) from None


def _steps_with(pub: PublishedRun, digest: str, first: int | None) -> int | None:
    """The logged step whose params digest is ``digest`` (``first`` tried first)."""
    def at(s: int) -> str:
        return pub.lines[s]["components"]["params"] if s else pub.genesis["params"]
    order = ([first] if first is not None and 0 <= first < len(pub.lines) else [])
    for s in order + list(range(len(pub.lines) - 1, -1, -1)):
        if at(s) == digest:
            return s
    return None


def _first_tensor_difference(pub: PublishedRun, step: int | None,
                             params: dict[str, torch.Tensor]) -> Differs:
    """The first parameter that differs from the run's own checkpoint at ``step``, or the
    digest difference when the run publishes none there."""
    if step is not None and step in checkpoint.list_steps(pub.dir):
        ref = pub.weights(step)
        for name in ref:
            if params[name].dtype != ref[name].dtype or not torch.equal(params[name],
                                                                        ref[name]):
                return Differs("tensor", name, f"tensor {name} differs from step {step}'s "
                                               f"(the run's own checkpoint, checked against "
                                               f"its log)")
    where = f"step {step}'s" if step is not None else "any logged step's"
    return Differs("tensor", "params", f"the parameters' digest is not {where} params digest "
                                       f"(the run publishes no checkpoint at that step to "
                                       f"name the tensor)")


def _exact_names(params: dict[str, torch.Tensor], pub: PublishedRun, what: str
                 ) -> dict[str, torch.Tensor]:
    specs = param_specs(pub.model)
    names = [s.name for s in specs]
    for s in specs:
        t = params.get(s.name)
        if t is None:
            raise Differs("tensor", s.name, f"{what} lacks the model's tensor {s.name}")
        if tuple(t.shape) != tuple(s.shape):
            raise Differs("tensor", s.name, f"{what}'s {s.name} has shape {tuple(t.shape)}, "
                                            f"the run's model {tuple(s.shape)}")
    extra = sorted(set(params) - set(names))
    if extra:
        raise Differs("tensor", extra[0], f"{what} holds tensor {extra[0]!r}, which is not "
                                          f"the run's model's")
    return {n: params[n] for n in names}


def _match_params(pub: PublishedRun, params: dict[str, torch.Tensor], claimed: int | None
                  ) -> int:
    step = _steps_with(pub, statehash.tensors_digest(params), claimed)
    if step is None:
        raise _first_tensor_difference(pub, claimed, params)
    if claimed is not None and step != claimed:
        raise Differs("provenance", "step", f"it claims step {claimed} but its parameters are "
                                            f"step {step}'s")
    return step


def _checkpoint(pub: PublishedRun, d: str, v: Verdict) -> None:
    try:
        ck = checkpoint.load(d)
    except Exception as e:      # CheckpointError: named file, hash or format problem
        raise Differs("file", "checkpoint", str(e)) from None
    params = _exact_names(ck.params, pub, "the checkpoint")
    v.step = _match_params(pub, params, ck.record["step"])
    v.checked.append(f"parameters: step {v.step}'s digest")
    why = checkpoint.record_difference(ck.record, pub.lines, v.step)
    if why:
        raise Differs("record", "record.json", why)
    v.checked.append("record.json: the chain's step hash, mix, seed and config identity")
    if v.step:
        names = list(params)
        if sorted(ck.m) != sorted(names) or sorted(ck.v) != sorted(names):
            raise Differs("tensor", "optim", "its optimizer files do not hold one m and one v "
                                             "per parameter")
        got = statehash.optim_digest(ck.m, ck.v, ck.record["adam_step"],
                                     ck.record["skip_left"])
        if got != pub.lines[v.step]["components"]["optim"]:
            raise Differs("tensor", "optim", f"its optimizer state is not step {v.step}'s "
                                             f"(moments or counters differ from the log)")
        v.checked.append("Adam moments and counters: the log's optim digest")


def _json_file(d: str, name: str) -> dict[str, Any]:
    obj = parse_json(read_regular(_file(d, name), name, EvalError), name, EvalError)
    if not isinstance(obj, dict):
        raise Differs("config", name, f"{name} does not hold a JSON object")
    return obj


def _config(pub: PublishedRun, t: Trained, d: str) -> None:
    from open1b_eval.hf import Open1bConfig

    have = _json_file(d, "config.json")
    want = ex.hf_config(t).to_dict()
    default = Open1bConfig().to_dict()
    model_fields = (set(json.loads(ex.hf_config(t).to_json_string(use_diff=False)))
                    - BOOKKEEPING)
    for k in sorted(set(have) - model_fields - BOOKKEEPING - {"architectures"}):
        raise Differs("config", k, f"config.json has field {k!r}, which export never writes "
                                   f"(a hook that could load code, or an edit); refusing it")
    if have.get("architectures", ["Open1bForCausalLM"]) != ["Open1bForCausalLM"]:
        raise Differs("config", "architectures", f"config.json names architectures "
                                                 f"{have.get('architectures')!r}")
    for k in sorted(model_fields - {"architectures"}):
        got = have.get(k, default.get(k))
        if got != want.get(k):
            raise Differs("config", k, f"config.json's {k} is {got!r}, the run's hashed config "
                                       f"gives {want.get(k)!r}")
    gen = _json_file(d, "generation_config.json")
    for k in sorted(gen):
        if k not in GENERATION_FIELDS:
            raise Differs("config", f"generation_config.{k}",
                          f"generation_config.json has field {k!r}, which export never writes")
        if k in ("eos_token_id", "pad_token_id") and gen[k] != t.eot:
            raise Differs("config", f"generation_config.{k}",
                          f"generation_config.json's {k} is {gen[k]!r}, the mix's separator "
                          f"is {t.eot}")


def _export(pub: PublishedRun, d: str, v: Verdict) -> None:
    prov = (_json_file(d, ex.PROVENANCE) if os.path.lexists(os.path.join(d, ex.PROVENANCE))
        else None)
    claimed = prov.get("step") if prov is not None else None
    claimed = claimed if type(claimed) is int else None
    sd = _tensors(_file(d, "model.safetensors"), "model.safetensors")
    specs = {s.name: tuple(s.shape) for s in param_specs(pub.model)}
    hf_names = {hf for _, hf in ex._names(pub.model)}
    scales = {k for k in sd if k.endswith(".weight_scale")}
    for k in sorted(set(sd) - hf_names - scales):
        raise Differs("tensor", k, f"model.safetensors holds tensor {k!r}, which is not the "
                                   f"run's model's")
    missing = sorted(hf_names - set(sd))
    if missing:
        raise Differs("tensor", missing[0], f"model.safetensors lacks tensor {missing[0]!r}")
    params = _exact_names(ex.params_from_hf(pub.model, sd, specs), pub, "model.safetensors")
    v.step = _match_params(pub, params, claimed)
    v.checked.append(f"parameters: step {v.step}'s digest")
    t = Trained(pub.dir, v.step, pub.model, params, pub.mix, None, pub.eot, pub.run_hash,
                   pub)
    want_scales = ex.weight_scales(pub.model, {hf: sd[hf] for hf in hf_names})
    if scales != set(want_scales):
        name = sorted(scales ^ set(want_scales))[0]
        raise Differs("tensor", name, f"model.safetensors {'lacks' if name in want_scales else 'holds'} "
                                      f"the derived tensor {name!r}")
    for k in sorted(want_scales):
        if sd[k].dtype != want_scales[k].dtype or not torch.equal(sd[k], want_scales[k]):
            raise Differs("tensor", k, f"{k} is not the weight step the runtime derives from "
                                       f"the weight (the quantization the model computes with "
                                       f"was changed)")
    v.checked.append("weight_scale: re-derived from each weight")
    _config(pub, t, d)
    v.checked.append("config.json and generation_config.json: the hashed config's values, no "
                     "other field")
    toks = ex.tokenizer_files(t)
    present = set(os.listdir(d))
    for name in sorted(present - set(ex.FILES) - set(toks)):
        raise Differs("file", name, f"the folder holds {name!r}, which export never writes "
                                    f"(code or an unchecked file); refusing it")
    for name, data in sorted(toks.items()):
        if name not in present:
            raise Differs("tokenizer", name, f"the folder lacks tokenizer file {name}")
        if read_regular(_file(d, name), "tokenizer file", EvalError) != data:
            raise Differs("tokenizer", name, f"tokenizer file {name} differs from the run's "
                                             f"mix's (its manifest's sha256)")
    v.checked.append("tokenizer files: byte-identical to the mix's manifest")
    readme = (read_regular(_file(d, "README.md"), "README.md", EvalError)
        if "README.md" in present else None)
    if readme is not None and readme != ex.readme(pub.run_hash, v.step).encode():
        raise Differs("file", "README.md", "README.md is not the one export writes for this "
                                           "step (its claims were edited)")
    if prov is None:
        v.checked.append(f"no {ex.PROVENANCE}: the step was found by searching the log")
        return
    files = {}
    for name in sorted(present - {ex.PROVENANCE}):
        files[name] = hashlib.sha256(read_regular(_file(d, name), name,
                                                  EvalError)).hexdigest()
    want = ex.provenance(t, {})
    want["files"] = files
    for k in sorted(set(want) | set(prov)):
        if prov.get(k) != want.get(k):
            raise Differs("provenance", k, f"{ex.PROVENANCE}'s {k} is {prov.get(k)!r}, the "
                                           f"chain gives {want.get(k)!r}")
    v.checked.append(f"{ex.PROVENANCE}: every field equals the chain's")


def verify_model(d: str, pub: PublishedRun) -> Verdict:
    """The verdict on DIR ``d`` against the opened run ``pub`` (see the module docstring)."""
    is_ckpt = os.path.lexists(os.path.join(d, "record.json"))
    is_export = os.path.lexists(os.path.join(d, "model.safetensors"))
    if not os.path.isdir(d) or not (is_ckpt or is_export):
        raise EvalError(f"{d}: neither a checkpoint directory (record.json) nor an exported "
                        f"transformers folder (model.safetensors)")
    v = Verdict(d, "checkpoint" if is_ckpt else "export", pub.run_hash, pub.pinned)
    try:
        (_checkpoint if is_ckpt else _export)(pub, d, v)
    except Differs as e:
        v.difference = {"what": e.what, "name": e.name, "detail": e.detail}
    return v
