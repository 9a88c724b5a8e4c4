"""The stream commands through click: schedule, stream-at (human table, --json schema,
--decode, --plan-only, --rank with --window, far windows refused before any replay,
--build-index, --stats checked against a brute force over the listing, --steps A:B),
provenance and plot-mix."""
import json

import pytest
from click.testing import CliRunner

from open1b_data.cli.stream import plot_mix, provenance, schedule, stream_at
from open1b_data.stream.windows import window_sha256
from testkit.s2mix import text_mix, token_mix


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return text_mix(str(tmp_path_factory.mktemp("cli")))


def ok(cmd, args):
    res = CliRunner().invoke(cmd, args)
    assert res.exit_code == 0, res.output
    return res.stdout


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
    assert ([s["doc"] for s in plan_only["windows"][0]["segments"]] ==
           [s["doc"] for s in w9["segments"]])


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
                      (["--step", "1", "--world", "2", "--rank", "2"], "--rank must be"),
                      (["--window", "5", "--world", "0"], "world size must be"),
                      (["--window", "-1"], "window index must be")]:
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


def test_stream_at_window_honours_rank(mix):
    path, _ = mix
    res = CliRunner().invoke(stream_at, [path, "--window", "5", "--world", "2", "--rank", "0"])
    assert res.exit_code == 1 and "window 5 belongs to rank 1 of a 2-way job" in res.output
    assert "use --rank 1" in res.output and "Traceback" not in res.output
    rep = json.loads(ok(stream_at, [path, "--window", "5", "--world", "2", "--rank", "1",
                                    "--json"]))
    assert [(w["window"], w["rank"]) for w in rep["windows"]] == [(5, 1)]
    rep = json.loads(ok(stream_at, [path, "--window", "5", "--world", "4", "--rank", "1",
                                    "--json"]))
    assert rep["windows"][0]["rank"] == 1 and rep["windows"][0]["micro_batch"] == 0


def test_far_window_is_refused_before_any_replay(mix, monkeypatch):
    from open1b_data.stream.plan import StreamPlan

    path, _ = mix
    past = json.loads(ok(stream_at, [path, "--window", "1000", "--plan-only", "--json"]))
    assert past["step"] is None and past["windows"][0]["window"] == 1000

    def no_replay(*a, **k):
        raise AssertionError("stream-at replayed the stream for a refused window")

    monkeypatch.setattr(StreamPlan, "cursor_at", no_replay)
    monkeypatch.setattr(StreamPlan, "segments_range", no_replay)
    res = CliRunner().invoke(stream_at, [path, "--window", "99999999999"])
    assert res.exit_code == 1, res.output
    msg = res.output.strip()
    assert msg.count("\n") == 0 and "window 99,999,999,999 needs ~" in msg
    assert "so it answers windows 0.." in msg and "never trained on" in msg
    assert "the schedule ends with window 159, step 40" in msg


def test_build_index_serves_late_windows(tmp_path, monkeypatch):
    from open1b_data.explore import inspect
    from open1b_data.stream.plan import StreamPlan

    path, _ = text_mix(str(tmp_path / "mix"))
    # a budget of 100 windows: the schedule's 160 need the index (K = 64)
    per_window = inspect.cost_per_window(StreamPlan.open(path))
    monkeypatch.setattr(inspect, "REPLAY_BUDGET", int(100 * per_window))
    res = CliRunner().invoke(stream_at, [path, "--step", "40", "--plan-only"])
    assert res.exit_code == 1 and "this mix has no seek index" in res.output
    assert "rerun with --build-index" in res.output
    want = json.loads(ok(stream_at, [path, "--step", "40", "--plan-only", "--json",
                                     "--build-index"]))
    assert list((tmp_path / "mix" / "stream").glob("seek-7-*.npz"))
    again = json.loads(ok(stream_at, [path, "--step", "40", "--plan-only", "--json"]))
    assert again == want and want["window_range"] == [156, 160]


def own_stats(listing: dict, names: list[str]) -> dict:
    """--stats recomputed from the plain listing (tokens and segments) by brute force."""
    wins = listing["windows"]
    toks = [w["tokens"] for w in wins]
    segs = [s for w in wins for s in w["segments"]]
    draws = {}
    for s in segs:
        draws.setdefault(s["draw"], []).append(s)
    runs = []
    for w, t in zip(wins, toks):
        i = 0
        while i < len(t):
            j = i
            while j < len(t) and t[j] == t[i]:
                j += 1
            runs.append((-(j - i), w["window"], i))
            i = j
    per_doc = {}
    for d, ss in sorted(draws.items()):
        per_doc.setdefault((ss[0]["source"], ss[0]["shard"], ss[0]["doc"]), []).append(d)
    doc_tokens = {n: sum(s["doc_end"] - s["doc_start"] for s in segs if s["source"] == n)
                  for n in names}
    return {
        "windows": sorted((w["window"], len(set(t))) for w, t in zip(wins, toks)),
        "distinct": len({x for t in toks for x in t}),
        "separators": sum(s["separator"] for s in segs),
        "tokens": {n: doc_tokens[n] for n in names},
        "documents": {n: len({s["draw"] for s in segs if s["source"] == n}) for n in names},
        "spanning": sum(len(ss) > 1 for ss in draws.values()),
        "redrawn": sorted((k, v) for k, v in per_doc.items() if len(v) > 1),
        "run": -min(runs)[0]}


def stats_view(st: dict) -> dict:
    return {"windows": [(w["window"], w["distinct"]) for w in st["windows"]],
            "distinct": st["distinct"], "separators": st["separators"],
            "tokens": {s["source"]: s["tokens"] for s in st["sources"]},
            "documents": {s["source"]: s["documents"] for s in st["sources"]},
            "spanning": st["spanning_draws"],
            "redrawn": sorted(((r["source"], r["shard"], r["doc"]), r["draws"])
                              for r in st["redrawn"]),
            "run": st["longest_run"]["length"]}


@pytest.fixture(scope="module")
def tokmix(tmp_path_factory):
    return token_mix(str(tmp_path_factory.mktemp("tok")))


@pytest.mark.parametrize("which,step,args", [("text", 3, []), ("text", 7, ["--rank", "1"]),
                                              ("tok", 4, []), ("tok", 5, ["--world", "4"])])
def test_stats_match_the_listing(mix, tokmix, which, step, args):
    path = mix[0] if which == "text" else tokmix
    names = ["web", "code"] if which == "text" else ["a", "b", "c"]
    common = [path, "--step", str(step), "--json", *args]
    listing = json.loads(ok(stream_at, common))
    rep = json.loads(ok(stream_at, common + ["--stats"]))
    assert "windows" not in rep and rep["step"] == step
    st = rep["stats"]
    assert stats_view(st) == own_stats(listing, names)
    assert st["tokens"] == len(listing["windows"]) * listing["window_tokens"]
    assert st["unique_ratio"] == st["distinct"] / st["tokens"]
    assert sum(s["tokens"] for s in st["sources"]) + st["separators"] == st["tokens"]
    if which == "tok" and step == 4:
        assert len(st["redrawn"]) == 2      # source b rolls over into its next epoch


def test_stats_human_and_step_ranges(mix):
    path, _ = mix
    human = ok(stream_at, [path, "--step", "3", "--stats"])
    assert "unique-token ratio" in human and "longest repeat" in human and "web" in human
    rng = json.loads(ok(stream_at, [path, "--steps", "2:4", "--stats", "--json"]))
    assert rng["steps"] == [2, 4] and [e["step"] for e in rng["per_step"]] == [2, 3, 4]
    for e in rng["per_step"]:
        one = json.loads(ok(stream_at, [path, "--step", str(e["step"]), "--stats", "--json"]))
        assert e["stats"] == one["stats"] and e["window_range"] == one["window_range"]
    lines = ok(stream_at, [path, "--steps", "2:4", "--stats"]).splitlines()
    rows = [ln.split() for ln in lines if ln.split() and ln.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["2", "3", "4"]
    assert [float(r[2]) for r in rows] == [round(e["stats"]["unique_ratio"], 3)
                                           for e in rng["per_step"]]
    for args, msg in [(["--steps", "2:4"], "add --stats"),
                      (["--steps", "1:65", "--stats"], "at most 64"),
                      (["--steps", "2:4", "--step", "2", "--stats"], "exactly one of"),
                      (["--step", "2", "--stats", "--plan-only"], "drop --plan-only"),
                      (["--step", "2", "--stats", "--decode"], "give one of them"),
                      (["--steps", "39:41", "--stats"], "past the end of the schedule")]:
        res = CliRunner().invoke(stream_at, [path, *args])
        assert res.exit_code != 0 and msg in res.output, (args, res.output)
        assert "Traceback" not in res.output


def _manifest_paths(path: str) -> dict[tuple[str, int], str]:
    m = json.loads(open(f"{path}/manifest.json").read())
    return {(s["name"], i): sh["path"] for s in m["sources"] for i, sh in enumerate(s["shards"])}


def test_shards_named_by_their_file(mix, tokmix):
    """stream-at, provenance and --stats name each shard by its file (relative to the mix
    root, as the manifest lists it), beside the manifest index, and the human output shows
    "<file> row <doc>"."""
    import os
    import re

    path, _ = mix
    files = _manifest_paths(path)
    rep = json.loads(ok(stream_at, [path, "--step", "2", "--json"]))
    human = ok(stream_at, [path, "--step", "2"])
    segs = [s for w in rep["windows"] for s in w["segments"]]
    assert segs
    for s in segs:
        assert s["shard_path"] == files[(s["source"], s["shard"])]
        assert os.path.isfile(os.path.join(path, s["shard_path"]))
        assert re.search(rf"{re.escape(s['shard_path'])}\s+{s['doc']}\s", human), s
    prov = json.loads(ok(provenance, [path, "--doc-id", "web-7", "--json"]))
    (doc,) = prov["documents"]
    assert doc["shard_path"] == files[(doc["source"], doc["shard"])]
    assert f"{doc['shard_path']} row {doc['doc']}  doc_id web-7" in ok(
        provenance, [path, "--doc-id", "web-7"])
    tok_files = _manifest_paths(tokmix)
    st = json.loads(ok(stream_at, [tokmix, "--step", "4", "--stats", "--json"]))["stats"]
    assert st["redrawn"]
    tok_human = ok(stream_at, [tokmix, "--step", "4", "--stats"])
    for r in st["redrawn"]:
        assert r["shard_path"] == tok_files[(r["source"], r["shard"])]
        assert f"{r['shard_path']} row {r['doc']}: draws" in tok_human
