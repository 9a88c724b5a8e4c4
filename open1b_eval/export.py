"""``open1b-train export``: a checked checkpoint as a transformers directory, with its
provenance.

Writes into ``OUT`` exactly these files (``FILES`` plus the tokenizer files):

* ``config.json`` (``model_type = "open1b"``, the shapes, the full-attention layers, the
  separator as ``eos_token_id``, ``open1b_source``: step, step hash, run hash - never a local
  path) and ``generation_config.json`` and ``model.safetensors`` (``save_pretrained``);
* the tokenizer files the mix's manifest lists under its transformers folder
  (``tokenizer/``), the verified bytes (``open1b_train.published``) - nothing else of the
  mix's folder, no code, no ``auto_map``: the model's code comes from the installed
  ``open1b_eval.hf``, never from the folder;
* ``README.md``: how to load it and how to check it (``open1b-audit verify-model``);
* ``open1b_provenance.json``: what the folder claims to be - ``run_hash``, ``step``,
  ``step_hash``, ``params_digest`` (the log's digest of the checkpoint's parameters),
  ``config_identity``, ``mix_fingerprint``, ``tokenizer_digest`` and the sha256 of every
  other file of the folder. It is a claim, not evidence: ``verify-model`` checks every part
  of it against the run's chain.

Tensors: every parameter under its ``open1b_eval.hf`` name in its own dtype (bf16 weights and
gains, float32 LSQ activation steps as ``act_step``), plus each linear's float32
``weight_scale`` = the runtime's per-output-channel weight step re-pinned from the weight
(``open1b_kernels.int8.linear.weight_step``, CPU reference: the bits training uses).
``params_from_hf`` is the inverse (the ``weight_scale`` tensors are derived, so they are
recomputed and compared, not inverted). The folder is written beside ``OUT`` and renamed into
place once complete; an existing ``OUT`` is replaced only then.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import torch

from open1b_kernels.core import backend
from open1b_kernels.int8.linear import weight_step
from open1b_eval.trained import Trained
from open1b_train.config import ModelConfig
from open1b_train.params import ATTN, MLP

PROVENANCE = "open1b_provenance.json"
FORMAT = "open1b-export"
VERSION = 1
FILES = ("config.json", "generation_config.json", "model.safetensors", "README.md", PROVENANCE)
TOKENIZER_DIR = "tokenizer/"        # the manifest's transformers tokenizer folder


def hf_config(t: Trained):
    from open1b_eval.hf import Open1bConfig

    c = t.cfg
    return Open1bConfig(
        vocab_size=c.vocab, hidden_size=c.d_model, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
        intermediate_size=c.ffn, sliding_window=c.window,
        full_attention_layers=list(c.full_layers), rope_theta=c.theta, rms_norm_eps=c.eps,
        eos_token_id=t.eot, pad_token_id=t.eot,
        open1b_source={"step": t.step, "step_hash": t.step_hash, "run_hash": t.run_hash})


def _names(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(open1b name, hf name) of every parameter, in model order."""
    out = [("embed.weight", "embed.weight"), ("embed_norm.gain", "embed_norm"),
           ("final_norm.gain", "final_norm"), ("lm_head.weight", "lm_head.weight")]
    for i in range(cfg.n_layers):
        pre = f"layers.{i}"
        out += [(f"{pre}.attn_norm.gain", f"{pre}.attn_norm"),
                (f"{pre}.mlp_norm.gain", f"{pre}.mlp_norm")]
        for grp, names in (("attn", ATTN), ("mlp", MLP)):
            for n in names:
                out += [(f"{pre}.{grp}.{n}.weight", f"{pre}.{n}.weight"),
                        (f"{pre}.{grp}.{n}.step", f"{pre}.{n}.act_step")]
    return out


def weight_scales(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each linear's ``weight_scale`` re-pinned from its weight (hf names)."""
    out = {}
    with backend.force("cpu"):
        for i in range(cfg.n_layers):
            for n in (*ATTN, *MLP):
                name = f"layers.{i}.{n}"
                out[f"{name}.weight_scale"] = weight_step(weights[f"{name}.weight"]).reshape(-1)
    return out


def hf_state_dict(t: Trained) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the ``open1b_eval.hf`` names (see the docstring)."""
    p = {k: v.detach().cpu() for k, v in t.params.items()}
    out = {hf: p[ours] for ours, hf in _names(t.cfg)}
    for hf in [k for k in out if k.endswith(".act_step")]:
        out[hf] = out[hf].reshape(1)
    return {**out, **weight_scales(t.cfg, out)}


def params_from_hf(cfg: ModelConfig, sd: dict[str, torch.Tensor],
                   shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The open1b parameters an export's tensors stand for (``shapes``: the model's, by
    open1b name); the derived ``weight_scale`` tensors are not among them."""
    return {ours: sd[hf].reshape(shapes[ours]) for ours, hf in _names(cfg)}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_files(t: Trained) -> dict[str, bytes]:
    """The manifest's transformers tokenizer files (verified bytes) by their name in OUT."""
    return {p[len(TOKENIZER_DIR):]: data for p, data in t.published.tokenizer_files.items()
            if p.startswith(TOKENIZER_DIR) and "/" not in p[len(TOKENIZER_DIR):]}


def readme(run_hash: str, step: int) -> str:
    """The folder's README.md: what it is, how to load it, how to check it."""
    return (f"# Open-1B model, step {step} of run {run_hash}\n\n"
            f"Exported by `open1b-train export`. The model's code is the installed `open1b` "
            f"package's, not this folder's:\n\n```python\nimport open1b_eval.hf  # registers "
            f"model_type 'open1b'\nfrom transformers import AutoModelForCausalLM, "
            f"AutoTokenizer\nmodel = AutoModelForCausalLM.from_pretrained(FOLDER)\n"
            f"tokenizer = AutoTokenizer.from_pretrained(FOLDER)\n```\n\n"
            f"Check that this folder is what it claims (the weights, the config and the "
            f"tokenizer against the run's hash chain):\n\n```bash\nopen1b-audit verify-model "
            f"FOLDER --run RUN --expect-run-hash {run_hash}\n```\n\n"
            f"`{PROVENANCE}` lists the run hash, the step, the parameters' digest, the mix "
            f"fingerprint and the sha256 of every file here.\n")


def provenance(t: Trained, files: dict[str, bytes]) -> dict:
    from open1b_train import statehash

    pub = t.published
    return {"format": FORMAT, "version": VERSION, "run_hash": t.run_hash, "step": t.step,
            "step_hash": t.step_hash, "params_digest": statehash.tensors_digest(t.params),
            "config_identity": pub.genesis["config_identity"],
            "mix_fingerprint": pub.genesis["mix_fingerprint"],
            "tokenizer_digest": pub.tokenizer_digest,
            "files": {name: _sha(data) for name, data in sorted(files.items())}}


def export(t: Trained, out: str) -> str:
    """Write the transformers directory ``out`` (see the module docstring); returns it."""
    from open1b_eval.hf import Open1bForCausalLM

    model = Open1bForCausalLM(hf_config(t))
    missing, unexpected = model.load_state_dict(hf_state_dict(t), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"export mapping is incomplete: missing {missing}, unexpected "
                           f"{unexpected}")
    out = os.path.normpath(out)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    model.generation_config.eos_token_id = t.eot
    model.generation_config.pad_token_id = t.eot
    model.save_pretrained(tmp)
    extra = sorted(set(os.listdir(tmp)) - set(FILES))
    if extra:                       # a transformers version that writes more than we check
        raise RuntimeError(f"save_pretrained wrote {extra}, which the export does not list")
    toks = tokenizer_files(t)
    clash = sorted(set(toks) & set(FILES))
    if clash:
        raise RuntimeError(f"the mix's manifest lists tokenizer files named {clash}, the "
                           f"export's own files; refusing to let them replace those")
    for name, data in toks.items():
        with open(os.path.join(tmp, name), "wb") as f:
            f.write(data)
    with open(os.path.join(tmp, "README.md"), "w") as f:
        f.write(readme(t.run_hash, t.step))
    written = {}
    for name in os.listdir(tmp):
        with open(os.path.join(tmp, name), "rb") as f:
            written[name] = f.read()
    prov = provenance(t, written)
    with open(os.path.join(tmp, PROVENANCE), "w") as f:
        json.dump(prov, f, indent=1, sort_keys=True)
    if os.path.lexists(out):
        old = f"{out}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    return out
