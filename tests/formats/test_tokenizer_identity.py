"""The tokenizer's identity is its content, checked wherever a mix's tokenizer is used.

``load_mix_tokenizer`` / ``verified_tokenizer_files`` (formats/tokenizerfile.py) refuse a
``tokenizer.json`` edited in place - one merge, one vocabulary entry - and an edited file
of the transformers ``tokenizer/`` folder, naming the file and what differs; a
formatting-only rewrite is accepted. The data-side readers that turn ids into text use it:
``stream-at --decode``, ``provenance --text``. The build pins the tokenizer: ``--tokenizer
FROM`` takes the published one (the same mix as training it), ``[tokenizer] expect`` /
``--expect-tokenizer`` catch a ``tokenizers`` version that trains other merges, by name."""
from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from open1b_data.cli import main as data_cli
from open1b_data.errors import BuildError, TokenizerError
from open1b_data.formats.definition import load_mix
from open1b_data.formats.manifest import load_manifest
from open1b_data.formats.tokenizerfile import (content_digest, load_mix_tokenizer,
                                               verified_tokenizer_files)
from open1b_data.ingest.pipeline import BuildOptions, build_mix
from testkit.mixfixture import dump_toml
from testkit.trainmix import train_mix


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> str:
    return train_mix(tmp_path_factory.mktemp("tokmix"), steps=6, batch=4)


@pytest.fixture
def mix(built, tmp_path) -> Path:
    out = tmp_path / "mix"
    shutil.copytree(built, out)
    return out


def _edit_json(path: Path, edit, **dump) -> None:
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d, **dump))


def test_an_intact_mix_loads_and_decodes(mix):
    files = verified_tokenizer_files(str(mix))
    assert sorted(files) == ["tokenizer.json", "tokenizer/special_tokens_map.json",
                             "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]
    tok = load_mix_tokenizer(str(mix))
    assert tok.decode(tok.encode("hello world").ids) == "hello world"


def test_a_formatting_only_rewrite_is_accepted(mix):
    """Indented, keys reversed, non-ASCII escaped, merges in the pre-0.20 "a b" spelling:
    the same tokenizer."""
    def reverse(d):
        return {k: reverse(v) if isinstance(v, dict) else v for k, v in reversed(d.items())}
    for name in ("tokenizer.json", "tokenizer/tokenizer_config.json"):
        _edit_json(mix / name, lambda d: None, indent=3, ensure_ascii=True)
        d = reverse(json.loads((mix / name).read_text()))
        if name == "tokenizer.json":
            d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
        (mix / name).write_text(json.dumps(d, indent=3))
    load_mix_tokenizer(str(mix))
    res = CliRunner().invoke(data_cli, ["stream-at", str(mix), "--step", "1", "--decode"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("what", ["merge", "vocabulary"])
def test_tokenizer_json_edited_in_place_is_refused(mix, what):
    def edit(d):
        if what == "merge":
            d["model"]["merges"][7] = d["model"]["merges"][8]
        else:
            vocab = d["model"]["vocab"]
            a, b = sorted(vocab)[300:302]
            vocab[a], vocab[b] = vocab[b], vocab[a]
    _edit_json(mix / "tokenizer.json", edit, separators=(",", ":"))
    with pytest.raises(TokenizerError) as e:
        load_mix_tokenizer(str(mix))
    msg = str(e.value)
    assert msg.startswith(f"{mix}/tokenizer.json: not the tokenizer of mix ")
    assert ("merge #7: " if what == "merge" else "vocabulary entry ") in msg
    assert "tokenizer/tokenizer.json is intact" in msg and "restore it" in msg
    for args in (["stream-at", str(mix), "--step", "1", "--decode"],
                 ["provenance", str(mix), "--text", "the"]):
        res = CliRunner().invoke(data_cli, args)
        assert res.exit_code == 1 and "not the tokenizer of mix" in res.output, res.output
    res = CliRunner().invoke(data_cli, ["verify", str(mix)])
    assert res.exit_code == 1 and "tokenizer.json: content differs" in res.output


def test_a_tokenizer_folder_file_edited_is_refused(mix):
    _edit_json(mix / "tokenizer" / "tokenizer_config.json",
               lambda d: d.update(eos_token="<|im_end|>"), indent=2)
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json: not the tokenizer of "
                                             r"mix .*: its settings differ"):
        verified_tokenizer_files(str(mix))
    shutil.copy(Path(str(mix)) / "tokenizer.json", mix / "tokenizer" / "tokenizer.json")
    (mix / "tokenizer" / "tokenizer.json").write_text(
        (mix / "tokenizer.json").read_text().replace('"<|endoftext|>"', '"<|eot|>"', 1))
    with pytest.raises(TokenizerError, match=r"tokenizer/tokenizer\.json"):
        verified_tokenizer_files(str(mix))


def test_a_missing_tokenizer_file_is_named(mix):
    (mix / "tokenizer" / "special_tokens_map.json").unlink()
    with pytest.raises(TokenizerError, match="special_tokens_map.json: missing"):
        load_mix_tokenizer(str(mix))


# ------------------------------------------------------------------ the build's tokenizer

def _toml(built: str) -> Path:
    return Path(built).parent / "small.toml"


def test_the_published_tokenizer_taken_instead_of_training_gives_the_same_mix(built,
                                                                             tmp_path):
    want = load_manifest(built)
    for source in (built, f"{built}/tokenizer.json"):
        out = str(tmp_path / f"mix-{len(source)}")
        r = build_mix(load_mix(_toml(built)), out, BuildOptions(tokenizer_from=source,
                                                                progress=False))
        assert r.fingerprint == want.fingerprint
        assert r.tokenizer_content == want.tokenizer["content"]


def test_a_tokenizer_that_does_not_fit_the_definition_is_refused(built, tmp_path):
    raw = tomllib.loads(_toml(built).read_text())
    raw["tokenizer"]["vocab_size"] = 600
    other = tmp_path / "other.toml"
    other.write_text(dump_toml(raw).replace('"corpus/', f'"{_toml(built).parent}/corpus/'))
    with pytest.raises(BuildError, match="512 vocabulary entries, the definition's "
                                         "vocab_size is 600"):
        build_mix(load_mix(other), str(tmp_path / "m"), BuildOptions(tokenizer_from=built,
                                                                     progress=False))


def test_a_tokenizers_version_that_trains_other_merges_is_caught_by_name(built, tmp_path,
                                                                       monkeypatch):
    """Stands in for another ``tokenizers``: training that gives other merges."""
    import tokenizers

    from open1b_data.ingest.tokenizer import training

    want = load_manifest(built).tokenizer["content"]
    honest = training.train_tokenizer

    def other_merges(spec, texts):
        tok = honest(spec, texts)
        d = json.loads(tok.to_str())
        d["model"]["merges"][3], d["model"]["merges"][4] = (d["model"]["merges"][4],
                                                            d["model"]["merges"][3])
        return type(tok).from_str(json.dumps(d))
    monkeypatch.setattr(training, "train_tokenizer", other_merges)
    monkeypatch.setattr("open1b_data.ingest.tokenizer.train_tokenizer", other_merges)
    with pytest.raises(BuildError) as e:
        build_mix(load_mix(_toml(built)), str(tmp_path / "m"),
                  BuildOptions(expect_tokenizer=want, progress=False))
    msg = str(e.value)
    assert f"trained here by tokenizers {tokenizers.__version__} has content digest" in msg
    assert f"the definition expects {want}" in msg and "--tokenizer" in msg
    assert not list((tmp_path / "m").rglob("*.parquet"))          # before any shard
    # the definition's [tokenizer] expect does the same; and a disagreeing flag is refused
    raw = tomllib.loads(_toml(built).read_text())
    raw["tokenizer"]["expect"] = want
    pinned = _toml(built).parent / "pinned.toml"
    pinned.write_text(dump_toml(raw))
    try:
        with pytest.raises(BuildError, match="trains other merges"):
            build_mix(load_mix(pinned), str(tmp_path / "m2"), BuildOptions(progress=False))
        with pytest.raises(BuildError, match="differs from the definition's"):
            build_mix(load_mix(pinned), str(tmp_path / "m3"),
                      BuildOptions(expect_tokenizer="0" * 64, progress=False))
        monkeypatch.undo()
        r = build_mix(load_mix(pinned), str(tmp_path / "m4"), BuildOptions(progress=False))
        assert r.tokenizer_content == want
        # the expected digest is a check, not content: the fingerprint is the same
        assert r.fingerprint == load_manifest(built).fingerprint
    finally:
        pinned.unlink()
    assert (content_digest("tokenizer.json", (Path(built) / "tokenizer.json").read_bytes())
        == want)
