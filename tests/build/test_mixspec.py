"""Both committed mix definitions parse into the values SPEC sections 2-3 state, and an
invalid field fails with a message naming the field and the bad value."""
from __future__ import annotations

import copy
import os
import tomllib

import pytest

from open1b_data.errors import MixSpecError
from open1b_data.build.definition import LLAMA3_SPLIT, default_mix_path, load_mix, parse_mix

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
