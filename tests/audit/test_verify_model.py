"""``open1b-audit verify-model``: a model found elsewhere - a checkpoint directory, or a
folder written by ``open1b-train export`` as a user downloads it from a model hub - is
answered "step N of run H", or the first differing tensor, config field, tokenizer file or
provenance field is named. Each forgery below is a change a re-uploader could make."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from testkit import released as forge
from testkit.runs import REF_STEPS, cli_env


def _verify(folder: str, run: str, *extra: str) -> tuple[int, dict]:
    """The command in this process (the subprocess cases below run it as a user does)."""
    from click.testing import CliRunner

    from open1b_audit.cli import main

    r = CliRunner().invoke(main, ["verify-model", folder, "--run", run, "--json", *extra],
                           catch_exceptions=False)
    return r.exit_code, json.loads(r.stdout)


@pytest.fixture(scope="module")
def exported(ref_run, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("export") / "hf")
    p = subprocess.run([sys.executable, "-m", "open1b_train.cli", "export", ref_run, "--out",
                        out, "--expect-run-hash", forge.last_hash(ref_run)], env=cli_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return out


def _differs(folder: str, run: str, what: str, name: str) -> dict:
    rc, rep = _verify(folder, run)
    assert rc == 1 and rep["verdict"] == "differs", rep
    assert (rep["difference"]["what"], rep["difference"]["name"]) == (what, name), rep
    return rep


def test_an_honest_export_is_its_step_of_the_run(exported, ref_run):
    h = forge.last_hash(ref_run)
    p = subprocess.run([sys.executable, "-m", "open1b_audit.cli", "verify-model", exported,
                        "--run", ref_run, "--expect-run-hash", h], env=cli_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert f"is step {REF_STEPS} of run {h} (the published run hash)" in p.stdout
    rc, rep = _verify(exported, ref_run, "--expect-run-hash", h)
    assert rc == 0 and rep["verdict"] == "match" and rep["step"] == REF_STEPS, rep
    assert rep["run_hash"] == h and rep["run_hash_pinned"]


def test_the_export_holds_no_local_path_and_no_code(exported, ref_run):
    names = set(os.listdir(exported))
    assert names == {"config.json", "generation_config.json", "model.safetensors",
                     "README.md", "open1b_provenance.json", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json"}, names
    for n in names:
        data = open(os.path.join(exported, n), "rb").read()
        assert os.path.abspath(ref_run).encode() not in data, n
        assert b"auto_map" not in data, n
    prov = json.load(open(os.path.join(exported, "open1b_provenance.json")))
    assert prov["step"] == REF_STEPS and prov["run_hash"] == forge.last_hash(ref_run)


def test_an_honest_checkpoint_directory_is_its_step(ref_run):
    rc, rep = _verify(os.path.join(ref_run, "checkpoints", "step-00000006"), ref_run)
    assert rc == 0 and rep["step"] == 6 and rep["kind"] == "checkpoint", rep


def test_a_changed_tensor_is_named(exported, ref_run, tmp_path):
    f = forge.copy_export(exported, str(tmp_path), "t")
    forge.export_tensor(f, "layers.1.gate_up.weight")
    _differs(f, ref_run, "tensor", "layers.1.mlp.gate_up.weight")


def test_a_changed_weight_scale_is_named(exported, ref_run, tmp_path):
    f = forge.copy_export(exported, str(tmp_path), "s")
    forge.export_tensor(f, "layers.0.q.weight_scale")
    _differs(f, ref_run, "tensor", "layers.0.q.weight_scale")


@pytest.mark.parametrize("field,value", [("rope_theta", 10_000.0), ("sliding_window", 4),
                                         ("tie_word_embeddings", True)])
def test_a_changed_config_field_is_named(exported, ref_run, tmp_path, field, value):
    f = forge.copy_export(exported, str(tmp_path), "c")
    forge.export_file(f, "config.json", lambda c: c.update({field: value}))
    _differs(f, ref_run, "config", field)


def test_a_code_hook_in_the_config_is_refused(exported, ref_run, tmp_path):
    f = forge.copy_export(exported, str(tmp_path), "a")
    forge.export_file(f, "config.json", lambda c: c.update(
        auto_map={"AutoModelForCausalLM": "modeling_open1b.Open1bForCausalLM"}))
    open(os.path.join(f, "modeling_open1b.py"), "w").write("import os\n")
    _differs(f, ref_run, "config", "auto_map")
    forge.export_file(f, "config.json", lambda c: c.pop("auto_map"))
    _differs(f, ref_run, "file", "modeling_open1b.py")


def test_an_edited_tokenizer_file_is_named(exported, ref_run, tmp_path):
    f = forge.copy_export(exported, str(tmp_path), "k")
    forge.export_file(f, "tokenizer_config.json", lambda c: c.update(model_max_length=7))
    _differs(f, ref_run, "tokenizer", "tokenizer_config.json")


def test_a_false_provenance_is_named(exported, ref_run, tmp_path):
    f = forge.copy_export(exported, str(tmp_path), "p")
    forge.export_file(f, "open1b_provenance.json",
                      lambda p: p.update(mix_fingerprint="0" * 64))
    _differs(f, ref_run, "provenance", "mix_fingerprint")


def test_weights_of_another_step_claimed_as_the_last_are_named(exported, ref_run, tmp_path):
    f = forge.copy_export(exported, str(tmp_path), "o")
    forge.export_file(f, "open1b_provenance.json", lambda p: p.update(step=6))
    _differs(f, ref_run, "provenance", "step")


def test_a_swapped_checkpoint_tensor_is_named(ref_run, tmp_path):
    swapped = forge.swapped_release(ref_run, str(tmp_path))
    folder = os.path.join(swapped, "checkpoints", f"step-{REF_STEPS:08d}")
    _differs(folder, ref_run, "tensor", "lm_head.weight")


def test_not_a_model_folder_is_one_line(ref_run, tmp_path):
    p = subprocess.run([sys.executable, "-m", "open1b_audit.cli", "verify-model",
                        str(tmp_path), "--run", ref_run], env=cli_env(), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "neither a checkpoint directory" in p.stderr
    shutil.rmtree(tmp_path)


def _hf_cache(exported: str, root) -> str:
    """``exported`` laid out as huggingface_hub's cache keeps a download: the files in
    ``blobs/<sha256>``, the snapshot's names links to them."""
    import hashlib

    repo = root / "models--someone--open1b"
    snap = repo / "snapshots" / ("0" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for name in sorted(os.listdir(exported)):
        data = open(os.path.join(exported, name), "rb").read()
        sha = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / sha).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", sha), snap / name)
    return str(snap)


def test_a_download_in_the_hugging_face_cache_is_read_through_its_links_only(
        exported, ref_run, tmp_path):
    """The cache's links are followed into the repo's own blobs; the forgery - a snapshot
    link to a file elsewhere (another repo's blob, a file of the auditor's) - is named."""
    snap = _hf_cache(exported, tmp_path)
    rc, rep = _verify(snap, ref_run, "--expect-run-hash", forge.last_hash(ref_run))
    assert rc == 0 and rep["verdict"] == "match" and rep["step"] == REF_STEPS, rep
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copyfile(os.path.join(snap, "config.json"), elsewhere / "config.json")
    os.unlink(os.path.join(snap, "config.json"))
    os.symlink(elsewhere / "config.json", os.path.join(snap, "config.json"))
    rep = _differs(snap, ref_run, "file", "config.json")
    assert "outside its Hugging Face cache repo's blobs folder" in rep["difference"]["detail"]
    plain = tmp_path / "plain"                   # a link in a folder that is not a snapshot
    shutil.copytree(exported, plain)
    os.unlink(plain / "README.md")
    os.symlink(os.path.join(exported, "README.md"), plain / "README.md")
    rep = _differs(str(plain), ref_run, "file", "README.md")
    assert "not a Hugging Face cache snapshot" in rep["difference"]["detail"]
