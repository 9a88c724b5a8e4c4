"""``open1b-train export``: a checkpoint as a transformers directory.

Writes ``OUT/config.json`` (``model_type = "open1b"``, the shapes, the full-attention
layers, the separator as ``eos_token_id``, and ``open1b_source``: run, step, run hash),
``OUT/model.safetensors`` and ``OUT/generation_config.json`` (``save_pretrained``), and
the mix's ``tokenizer/`` files. Tensors: every parameter of the checkpoint under its
``open1b_eval.hf`` name in its own dtype (bf16 weights and gains, float32 LSQ activation
steps as ``act_step``), plus each linear's float32 ``weight_scale`` = the runtime's
per-output-channel weight step re-pinned from the weight (``open1b_kernels.int8.linear
.weight_step``, CPU reference: the same bits as training uses).
Load with ``import open1b_eval.hf`` then ``AutoModelForCausalLM.from_pretrained(OUT)``.
"""
from __future__ import annotations

import os
import shutil

import torch

from open1b_kernels.core import backend
from open1b_kernels.int8.linear import weight_step
from open1b_eval.trained import Trained
from open1b_train.params import ATTN, MLP


def hf_config(t: Trained):
    from open1b_eval.hf import Open1bConfig

    c = t.cfg
    return Open1bConfig(
        vocab_size=c.vocab, hidden_size=c.d_model, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
        intermediate_size=c.ffn, sliding_window=c.window,
        full_attention_layers=list(c.full_layers), rope_theta=c.theta, rms_norm_eps=c.eps,
        eos_token_id=t.eot, pad_token_id=t.eot,
        open1b_source={"run": os.path.abspath(t.run), "step": t.step, "run_hash": t.run_hash})


def hf_state_dict(t: Trained) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the ``open1b_eval.hf`` names (see the docstring)."""
    p = {k: v.detach().cpu() for k, v in t.params.items()}
    out = {"embed.weight": p["embed.weight"], "embed_norm": p["embed_norm.gain"],
           "final_norm": p["final_norm.gain"], "lm_head.weight": p["lm_head.weight"]}
    with backend.force("cpu"):
        for i in range(t.cfg.n_layers):
            pre = f"layers.{i}"
            out[f"{pre}.attn_norm"] = p[f"{pre}.attn_norm.gain"]
            out[f"{pre}.mlp_norm"] = p[f"{pre}.mlp_norm.gain"]
            for grp, names in (("attn", ATTN), ("mlp", MLP)):
                for n in names:
                    w = p[f"{pre}.{grp}.{n}.weight"]
                    out[f"{pre}.{n}.weight"] = w
                    out[f"{pre}.{n}.act_step"] = p[f"{pre}.{grp}.{n}.step"].reshape(1)
                    out[f"{pre}.{n}.weight_scale"] = weight_step(w).reshape(-1)
    return out


def export(t: Trained, out: str) -> str:
    """Write the transformers directory ``out`` (created or overwritten); returns it."""
    from open1b_eval.hf import Open1bForCausalLM

    model = Open1bForCausalLM(hf_config(t))
    missing, unexpected = model.load_state_dict(hf_state_dict(t), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"export mapping is incomplete: missing {missing}, unexpected "
                           f"{unexpected}")
    os.makedirs(out, exist_ok=True)
    model.generation_config.eos_token_id = t.eot
    model.generation_config.pad_token_id = t.eot
    model.save_pretrained(out)
    for name in sorted(os.listdir(t.tokenizer_dir)):
        shutil.copyfile(os.path.join(t.tokenizer_dir, name), os.path.join(out, name))
    return out
