"""Both committed mix definitions parse into the values they state (Mix 0626: its published
numbers), and an invalid field fails with a message naming the field and the bad value."""
from __future__ import annotations

import copy
import os
import tomllib

import pytest

from open1b_data.errors import MixSpecError
from open1b_data.formats.definition import LLAMA3_SPLIT, default_mix_path, load_mix, parse_mix

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIX_0626 = os.path.join(ROOT, "manifests", "mix-0626.toml")
DEMO = os.path.join(ROOT, "manifests", "demo.toml")


def test_mix_0626_values():
    m = load_mix(MIX_0626)
    assert (m.name, m.seed, m.window) == ("mix-0626", 42, 4097)
    assert [(s.name, s.format, s.share) for s in m.sources] == [
        ("dclm-baseline", "dclm", 0.667), ("fineweb-edu", "fineweb-edu", 0.133),
        ("the-stack-v2", "stack-v2", 0.120), ("proof-pile-2", "proof-pile-2", 0.080)]
    assert [s.upstream for s in m.sources] == [
        "mlfoundations/dclm-baseline-1.0", "HuggingFaceFW/fineweb-edu", "bigcode/the-stack-v2",
        "EleutherAI/proof-pile-2"]
    assert m.source("the-stack-v2").content_store == "s3://softwareheritage/content/{blob_id}"
    assert any(p.endswith("shard_*_processed.jsonl.zstd") for p in m.source("dclm-baseline").inputs)
    assert m.source("fineweb-edu").inputs == ("data/CC-MAIN-*/*.parquet",)
    assert {p.split("/")[0] for p in m.source("proof-pile-2").inputs} == {
        "arxiv", "open-web-math", "algebraic-stack"}
    t = m.tokenizer
    assert (t.vocab_size, t.eot, t.split_pattern) == (128_256, "<|endoftext|>", LLAMA3_SPLIT)
    s = m.schedule
    assert (s.seq_tokens, s.micro_batch, s.reference_world) == (4096, 4, 48)
    assert [(p.start_tokens, p.batch_sequences) for p in s.phases] == [
        (0, 768), (4_000_000_000, 1152), (360_000_000_000, 2304)]
    assert (s.stop_tokens, s.lr_peak, s.lr_final_ratio) == (400_000_000_000, 4.5e-4, 0.1)
    assert s.warmup_tokens == 667 * 3_145_728


def test_demo_values_and_layout():
    m = load_mix(DEMO)
    assert os.path.samefile(default_mix_path(), DEMO)
    assert [s.format for s in m.sources] == ["dclm", "fineweb-edu", "stack-v2", "proof-pile-2"]
    assert m.window == m.schedule.seq_tokens + 1 == 513
    assert len(m.schedule.phases) >= 2
    assert abs(sum(s.share for s in m.sources) - 1.0) < 1e-9
    for s in m.sources:
        assert os.path.isdir(s.root), s.root  # relative roots resolved against the file
    assert m.source("the-stack-v2").filters.max_bytes == 130_000
    assert m.to_dict()["sources"][0]["name"] == "dclm-baseline"


def _demo_data() -> dict:
    with open(DEMO, "rb") as f:
        return tomllib.load(f)


def _set(path, value):
    def edit(d):
        node = d
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return edit


_DELETE = object()

CASES = [
    (("mix", "seed"), _DELETE, ["mix.seed", "missing"]),
    (("mix", "seed"), "42", ["mix.seed", "'42'"]),
    (("mix", "window"), 4097, ["mix.window", "4097", "513"]),
    (("tokenizer", "vocab_size"), 100, ["tokenizer.vocab_size", "100"]),
    (("tokenizer", "vocab_size"), True, ["tokenizer.vocab_size", "True"]),
    (("shards", "tokens_per_shard"), 0, ["shards.tokens_per_shard", "0"]),
    (("sources", 0, "format"), "warc", ["sources[0].format", "'warc'"]),
    (("sources", 1, "share"), 1.5, ["sources[1].share", "1.5"]),
    (("sources", 0, "inputs"), [], ["sources[0].inputs", "[]"]),
    (("sources", 2, "content_store"), "s3://b/content", ["sources[2].content_store",
                                                       "'s3://b/content'"]),
    (("sources", 1, "filters", "min_score"), "three", ["sources[1].filters.min_score",
                                                      "'three'"]),
    (("sources", 2, "filters", "max_bytes"), -1, ["sources[2].filters.max_bytes", "-1"]),
    (("sources", 0, "filters", "min_len"), 5, ["sources[0].filters", "min_len"]),
    (("schedule", "lr_final_ratio"), 2.0, ["schedule.lr_final_ratio", "2.0"]),
    (("schedule", "phases", 1, "batch_sequences"), 12, ["schedule.phases[1].batch_sequences",
                                                        "12"]),
    (("schedule", "phases", 1, "start_tokens"), 0, ["schedule.phases", "[0, 0,"]),
    # Compiled by the tokenizer's own engine at load, not minutes into a build.
    (("tokenizer", "split_pattern"), "(", ["tokenizer.split_pattern", "'('",
                                           "not a valid regular expression"]),
    (("tokenizer", "split_pattern"), r"\p{NoSuchClass}+", ["tokenizer.split_pattern",
                                                            "NoSuchClass"]),
]


@pytest.mark.parametrize("path,value,expected", CASES, ids=[".".join(map(str, c[0])) for c in CASES])
def test_invalid_field_names_field_and_value(path, value, expected):
    data = copy.deepcopy(_demo_data())
    _set(path, value)(data)
    with pytest.raises(MixSpecError) as e:
        parse_mix(data, base_dir=os.path.dirname(DEMO))
    for piece in expected:
        assert piece in str(e.value), (piece, str(e.value))


def test_both_files_are_valid_toml_and_unknown_file_is_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[mix\nname=")
    with pytest.raises(MixSpecError, match="bad.toml"):
        load_mix(bad)
    with pytest.raises(MixSpecError, match="does not exist"):
        load_mix(tmp_path / "nope.toml")
    bad.write_bytes(b"\x00\xff binary")
    with pytest.raises(MixSpecError, match="bad.toml.*not UTF-8 text"):
        load_mix(bad)
    bad.write_bytes(b"")
    with pytest.raises(MixSpecError, match="bad.toml' is empty"):
        load_mix(bad)
    with pytest.raises(MixSpecError, match="cannot be read"):
        load_mix(tmp_path)                                  # a directory


# ---------------------------------------------------------------------------------------
# Typos and out-of-range values: each of these used to be accepted, changing the data.

def _demo_text() -> str:
    with open(DEMO) as f:
        return f.read()


def _load_text(tmp_path, text: str):
    path = tmp_path / "mix.toml"
    path.write_text(text)
    return load_mix(path)


def _second(text: str, old: str, new: str) -> str:
    """``text`` with the SECOND occurrence of ``old`` replaced (sources[1] = fineweb-edu)."""
    first = text.index(old)
    second = text.index(old, first + len(old))
    return text[:second] + new + text[second + len(old):]


@pytest.mark.parametrize("old,new,where,near", [
    # [sources.filter] silently dropped FineWeb-Edu's edu-score filter.
    ("[sources.filters]", "[sources.filter]", "sources[1].filter", "filters"),
    ("share = 0.218", "shaer = 0.218", "sources[1].shaer", "share"),
    ("share = 0.218", "share = 0.218\nweigth = 2", "sources[1].weigth", None),
    ("min_score = 3", "min_scor = 3", "sources[1].filters.min_scor", "min_score"),
    ("zstd_level = 3", "zstd_levle = 3", "shards.zstd_levle", "zstd_level"),
    ("[[schedule.phases]]\nstart_tokens = 262_144",
     "[[schedule.phases]]\nstart_token = 262_144\nstart_tokens = 262_144",
     "schedule.phases[1].start_token", "start_tokens"),
], ids=["filter", "shaer", "weigth", "min_scor", "zstd_levle", "start_token"])
def test_unknown_keys_are_named_with_the_nearest_valid_one(tmp_path, old, new, where, near):
    text = _demo_text()
    edited = _second(text, old, new) if text.count(old) > 1 else text.replace(old, new)
    assert edited != text
    with pytest.raises(MixSpecError) as e:
        _load_text(tmp_path, edited)
    msg = str(e.value)
    assert msg.startswith(where + ":"), msg
    assert "\n" not in msg
    if near:
        assert f"did you mean {near!r}" in msg, msg
    else:
        assert "valid keys:" in msg and "share" in msg, msg


@pytest.mark.parametrize("table", ["mix", "tokenizer", "shards", "schedule", "top"])
def test_every_table_refuses_unknown_keys(table):
    data = copy.deepcopy(_demo_data())
    (data if table == "top" else data[table])["bogus_key"] = 1
    with pytest.raises(MixSpecError, match=r"bogus_key: unknown key"):
        parse_mix(data, base_dir=os.path.dirname(DEMO))


def test_shares_must_sum_to_one_exactly(tmp_path):
    text = _demo_text()
    with pytest.raises(MixSpecError) as e:   # 0.9 + 0.218 + 0.125 + 0.184 = 1.427
        _load_text(tmp_path, text.replace("share = 0.473", "share = 0.9"))
    assert "sum to 1.427, not 1" in str(e.value) and "proportional" in str(e.value)
    # Exact as written: 0.7 + 0.1 + 0.1 + 0.1 is 1 although its float sum is not.
    for old, new in [("0.473", "0.7"), ("0.218", "0.1"), ("0.125", "0.1"), ("0.184", "0.1")]:
        text = text.replace(f"share = {old}", f"share = {new}")
    assert 0.7 + 0.1 + 0.1 + 0.1 != 1.0
    assert [s.share for s in _load_text(tmp_path, text).sources] == [0.7, 0.1, 0.1, 0.1]
    with pytest.raises(MixSpecError, match="sum to 1.0000001, not 1"):
        _load_text(tmp_path, text.replace("share = 0.7", "share = 0.7000001"))


def test_proportional_shares_are_normalized(tmp_path):
    text = _demo_text().replace('seed = 42', 'seed = 42\nshares = "proportional"')
    for old, new in [("0.473", "300.5"), ("0.218", "59.8"), ("0.125", "54.2"), ("0.184", "36")]:
        text = text.replace(f"share = {old}", f"share = {new}")
    m = _load_text(tmp_path, text)
    assert m.shares == "proportional"
    assert [s.share for s in m.sources] == [300.5, 59.8, 54.2, 36.0]
    total = 300.5 + 59.8 + 54.2 + 36
    assert m.target_shares() == pytest.approx((300.5 / total, 59.8 / total, 54.2 / total,
                                               36 / total), rel=1e-15)
    assert m.to_dict()["shares"] == "proportional"
    with pytest.raises(MixSpecError, match=r"needs a share on every source.*proof-pile-2"):
        _load_text(tmp_path, text.replace("share = 36", ""))
    with pytest.raises(MixSpecError, match="mix.shares: must be one of"):
        _load_text(tmp_path, text.replace('"proportional"', '"relative"'))


def test_undeclared_sources_split_the_remainder(tmp_path):
    text = _demo_text().replace("share = 0.218\n", "")
    m = _load_text(tmp_path, text)   # 0.473 + 0.125 + 0.184 = 0.782 < 1: kept
    assert m.source("fineweb-edu").share is None
    assert m.target_shares()[1] is None
    with pytest.raises(MixSpecError, match=r"sum to 1.027, leaving nothing for \['fineweb-edu'\]"):
        _load_text(tmp_path, text.replace("share = 0.473", "share = 0.718"))


RANGES = [
    (("mix", "seed"), 2**64, "mix.seed: must be in [0, 2^64)"),
    (("mix", "seed"), -1, "mix.seed: must be in [0, 2^64)"),
    (("tokenizer", "vocab_size"), 2**32, "tokenizer.vocab_size: must be in [257, 2^32)"),
    (("tokenizer", "sample_bytes"), 0, "tokenizer.sample_bytes: must be >= 1"),
    (("tokenizer", "min_frequency"), 0, "tokenizer.min_frequency: must be >= 1"),
    (("tokenizer", "max_token_length"), 0, "tokenizer.max_token_length: must be in [1, 2^16]"),
    (("shards", "tokens_per_shard"), 2**31, "shards.tokens_per_shard: must be in [1, 2^30]"),
    (("shards", "docs_per_row_group"), 0, "shards.docs_per_row_group: must be in [1, 2^31)"),
    (("shards", "zstd_level"), 0, "shards.zstd_level: must be in [1, 22]"),
    (("shards", "zstd_level"), 23, "shards.zstd_level: must be in [1, 22]"),
    (("schedule", "seq_tokens"), 0, "schedule.seq_tokens: must be in [1,"),
    (("schedule", "micro_batch"), 0, "schedule.micro_batch: must be >= 1"),
    (("schedule", "reference_world"), 0, "schedule.reference_world: must be >= 1"),
    (("schedule", "stop_tokens"), 0, "schedule.stop_tokens: must be >= 1"),
    (("schedule", "lr_peak"), 0.0, "schedule.lr_peak: must be in (0, 1]"),
    (("schedule", "lr_peak"), 4.5, "schedule.lr_peak: must be in (0, 1]"),
    (("schedule", "lr_peak"), float("nan"), "schedule.lr_peak: must be in (0, 1], got nan"),
    (("schedule", "lr_final_ratio"), -0.1, "schedule.lr_final_ratio: must be in [0, 1]"),
    (("schedule", "warmup_tokens"), 1_200_000, "schedule.warmup_tokens: must be in [0, 1,200,000)"),
    (("schedule", "phases", 2, "start_tokens"), 1_200_000, "schedule.phases[2].start_tokens"),
    (("schedule", "phases", 0, "batch_sequences"), 0,
     "schedule.phases[0].batch_sequences: must be >= 1"),
    (("sources", 1, "filters", "min_score"), 30, "sources[1].filters.min_score: must be in [0, 5]"),
    (("sources", 2, "filters", "max_bytes"), 0, "sources[2].filters.max_bytes: must be >= 1"),
    (("sources", 2, "filters", "license_allowed"), [""],
     "sources[2].filters.license_allowed: expected a non-empty list"),
    (("sources", 0, "share"), float("inf"), "sources[0].share: must be in (0, 1]"),
    (("sources", 0, "content_store"), "x/{blob_id}", "sources[0].content_store: only stack-v2"),
]


@pytest.mark.parametrize("path,value,expected", RANGES,
                         ids=[".".join(map(str, r[0])) + f"={r[1]}" for r in RANGES])
def test_numbers_are_range_checked(path, value, expected):
    data = copy.deepcopy(_demo_data())
    _set(path, value)(data)
    with pytest.raises(MixSpecError) as e:
        parse_mix(data, base_dir=os.path.dirname(DEMO))
    assert expected in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
