"""The stream commands through click: schedule, stream-at (human table, --json schema,
--decode, --plan-only, errors), provenance and plot-mix."""
import json

import pytest
from click.testing import CliRunner

from open1b_data.cli.stream import plot_mix, provenance, schedule, stream_at
from open1b_data.stream.windows import window_sha256
from tests.stream.s2mix import text_mix


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return text_mix(str(tmp_path_factory.mktemp("cli")))


def ok(cmd, args):
    res = CliRunner().invoke(cmd, args)
    assert res.exit_code == 0, res.output
    return res.output


def test_schedule_command():
    rep = json.loads(ok(schedule, ["--step", "80957", "--json"]))
    assert rep["step"] == 80957 and rep["batch_sequences"] == 2304
    assert rep["accumulation"] == 12 and rep["tokens_after"] >= 400_000_000_000
    assert rep["tokens_before"] < 400_000_000_000 and rep["lr"] == pytest.approx(4.5e-5)
    t = json.loads(ok(schedule, ["--tokens", "4000000000", "--json"]))
    assert t["tokens_before"] <= 4_000_000_000 < t["tokens_after"] and t["step"] == 1272
    human = ok(schedule, ["--step", "1"])
    assert "3,145,728 tokens" in human and "accumulation   4" in human
    res = CliRunner().invoke(schedule, ["--step", "80958"])
    assert res.exit_code != 0 and "past the end of the schedule" in res.output
    res = CliRunner().invoke(schedule, ["--step", "1", "--world", "5"])
    assert res.exit_code != 0 and "world size 5" in res.output
    assert CliRunner().invoke(schedule, []).exit_code != 0


def test_stream_at_json_schema(mix):
    path, corpus = mix
    rep = json.loads(ok(stream_at, [path, "--step", "3", "--world", "2", "--json"]))
    assert rep["step"] == 3 and rep["window_range"] == [8, 12] and rep["accumulation"] == 2
    assert [w["window"] for w in rep["windows"]] == [8, 10, 9, 11]
    for w in rep["windows"]:
        assert set(w) >= {"window", "sha256", "rank", "micro_batch", "tokens", "segments"}
        assert w["sha256"] == window_sha256(__import__("numpy").array(w["tokens"]))
        assert sum(s["length"] for s in w["segments"]) == len(w["tokens"]) == 65
        for s in w["segments"]:
            assert s["doc_id"].split("-")[0] == s["source"]
    one = json.loads(ok(stream_at, [path, "--window", "9", "--world", "2", "--json"]))
    (w9,) = one["windows"]
    assert (one["step"], w9["rank"], w9["micro_batch"]) == (3, 1, 0)
    assert w9 == next(w for w in rep["windows"] if w["window"] == 9)
    plan_only = json.loads(ok(stream_at, [path, "--window", "9", "--plan-only", "--json"]))
    assert plan_only["windows"][0]["sha256"] is None
    assert [s["doc"] for s in plan_only["windows"][0]["segments"]] == \
           [s["doc"] for s in w9["segments"]]


def test_stream_at_human_decode(mix):
    path, corpus = mix
    out = ok(stream_at, [path, "--step", "1", "--world", "2", "--rank", "0", "--decode"])
    assert "step 1: windows 0..3" in out and "rank 0, micro-batch 0" in out
    assert "rank 1" not in out and "sha256 " in out
    rep = json.loads(ok(stream_at, [path, "--step", "1", "--world", "2", "--rank", "0",
                                    "--decode", "--json"]))
    for w in rep["windows"]:
        for s in w["segments"]:
            text = corpus[s["source"]][int(s["doc_id"].split("-")[1])]
            if s["doc_start"] == 0 and s["separator"]:
                assert s["text"] == text               # a whole document decodes exactly
            assert s["text"][:40].replace("\n", "\u23ce ") in out


def test_stream_at_errors(mix):
    path, _ = mix
    for args, msg in [(["--step", "1", "--world", "3"], "world size 3"),
                      (["--step", "1", "--window", "2"], "exactly one of"),
                      (["--step", "0"], "numbered from 1"),
                      (["--step", "1", "--world", "2", "--rank", "2"], "--rank must be")]:
        res = CliRunner().invoke(stream_at, [path, *args])
        assert res.exit_code != 0 and msg in res.output, res.output
    res = CliRunner().invoke(stream_at, [path + "/missing", "--step", "1"])
    assert res.exit_code != 0 and "does not exist" in res.output


def test_provenance_and_plot_commands(mix, tmp_path):
    path, _ = mix
    rep = json.loads(ok(provenance, [path, "--doc-id", "web-7", "--steps", "1:40",
                                     "--world", "4", "--json"]))
    assert rep["documents"][0]["doc_id"] == "web-7" and rep["world"] == 4
    assert "web-7" in ok(provenance, [path, "--text", "zq-42"])
    res = CliRunner().invoke(provenance, [path, "--doc-id", "x", "--steps", "5"])
    assert res.exit_code != 0 and "A:B" in res.output
    png = tmp_path / "mix.png"
    out = ok(plot_mix, [path, "--steps", "1:40", "--out", str(png), "--bins", "8"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "web" in out and "target" in out
