"""End-to-end build-mix on a small demo-shaped mix: round trip, counts, determinism across
workers and task splits, kill-and-resume with a real SIGKILL, verify, bad inputs."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from open1b_data.ingest.pipeline import BuildOptions, build_mix
from open1b_data.cli.build import build_mix as build_cmd, verify as verify_cmd
from open1b_data.ingest.document import BAD_INPUT_REASONS, Dropped
from open1b_data.errors import BuildError
from open1b_data.formats.manifest import load_manifest
from open1b_data.formats.definition import load_mix
from open1b_data.formats.shards import iter_documents
from open1b_data.ingest.sources import list_inputs, read_input
from open1b_data.ingest.tokenizer import load_tokenizer
from testkit.mixfixture import break_inputs, small_mix

QUIET = dict(progress=False)
# "<source>/shard-<input>-<k>.parquet row <r> (input <source>/<path> row <line>)"
SHARD_ROW = re.compile(r"([\w-]+/shard-\d{5}-\d{5}\.parquet) row \d+ \(input [\w-]+/\S+ row \d+\)")


def _files(out: Path, with_work: bool = False) -> dict[str, bytes]:
    """Every output file of the build (relative path -> bytes); ``_work`` only when asked.
    ``stream/`` (the stream's seek index, which the CLI adds after a build) is not the
    build's output."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out).parts[0] != "stream"
            and (with_work or not p.relative_to(out).parts[0] == "_work")}


@pytest.fixture(scope="module")
def mix_path(tmp_path_factory) -> Path:
    return small_mix(tmp_path_factory.mktemp("mix"))


@pytest.fixture(scope="module")
def reference(mix_path, tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("ref") / "mix"
    result = build_mix(load_mix(mix_path), str(out), BuildOptions(workers=1, **QUIET))
    return out, result


def test_round_trip_and_counts(mix_path, reference):
    out, result = reference
    mix = load_mix(mix_path)
    manifest = load_manifest(str(out))
    tok = load_tokenizer(str(out / "tokenizer.json"))
    assert result.merged and result.fingerprint == manifest.fingerprint
    for spec in mix.sources:
        # Independent recount straight from the readers.
        texts, dropped = {}, Counter()
        for inp in list_inputs(spec):
            for item in read_input(spec, inp):
                if isinstance(item, Dropped):
                    dropped[item.reason] += 1
                else:
                    texts[(item.input, item.row)] = (item.doc_id, item.text)
        entry = manifest.source(spec.name)
        assert entry.counts["kept"] == len(texts) == entry.documents > 0
        assert entry.counts["dropped"] == dict(dropped)
        assert entry.counts["read"] == len(texts) + sum(dropped.values())
        assert len(entry.shards) >= 2, "fixture should cut several shards per source"
        seen = 0
        for shard in entry.shards:
            for doc in iter_documents(str(out / shard.path)):
                doc_id, text = texts[(doc.input, doc.row)]
                assert doc.doc_id == doc_id
                assert tok.decode(doc.tokens.tolist()) == text
                seen += 1
        assert seen == len(texts)
        assert sum(s.tokens for s in entry.shards) == entry.tokens
    summary = {r.source: r for r in result.summary}
    assert {s.name for s in mix.sources} == set(summary)
    assert sum(r.share for r in result.summary) == pytest.approx(1.0)
    for s in manifest.sources:
        assert summary[s.name].kept == s.documents and summary[s.name].tokens == s.tokens


def test_manifest_is_portable(reference, mix_path):
    out, _ = reference
    text = (out / "manifest.json").read_text()
    assert str(out) not in text and str(mix_path.parent) not in text
    assert "workers" not in text


@pytest.mark.parametrize("how", ["threads3", "fork2", "fork3", "spawn2", "tasks2", "tasks3",
                                 "tiktoken1", "tokenizer-first2"])
def test_deterministic_across_workers_and_task_splits(mix_path, reference, tmp_path, how,
                                                      monkeypatch):
    from open1b_data.ingest import pool as build_pool
    from open1b_data.ingest import task as build_task

    ref_out, _ = reference
    mix = load_mix(mix_path)
    out = str(tmp_path / "mix")
    if how == "tiktoken1":  # the other encoder backend writes the same bytes
        monkeypatch.setenv("OPEN1B_ENCODER", "tiktoken")
        r = build_mix(mix, out, BuildOptions(workers=1, **QUIET))
        assert build_task.encoders(out, r.manifest.tokenizer["sha256"])[1].backend == "tiktoken"
    elif how.startswith(("threads", "fork", "spawn")):
        kind, n = how[:-1], int(how[-1])
        if kind != "threads":  # helper processes, started the way the test names
            if kind == "fork" and build_pool.start_method() != "fork":
                pytest.skip("fork is not the start method on this platform")
            monkeypatch.setattr(build_pool, "start_method", lambda: kind)
        executor = "threads" if kind == "threads" else "processes"
        build_mix(mix, out, BuildOptions(workers=n, executor=executor, **QUIET))
    else:
        n = int(how[-1])
        if how.startswith("tokenizer-first"):  # the staged scale-out: tokenizer job first
            r = build_mix(mix, out, BuildOptions(tokenizer_only=True, **QUIET))
            assert not r.merged and r.inputs_built == 0 and len(r.missing) == r.inputs_total
            assert sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*")
                          if p.is_file()) == ["_work/plan.json", "_work/tokenizer-content.json",
                                              "_work/tokenizer-sample.json", "tokenizer.json"]
        # Tasks run in reverse order; only the last one (seeing every marker) merges.
        for i in reversed(range(n)):
            r = build_mix(mix, out, BuildOptions(workers=1, task=i, tasks=n, **QUIET))
            assert r.merged == (i == 0), (i, r.missing)
        if n == 3:  # and --merge-only over a finished build rewrites the same bytes
            os.unlink(Path(out) / "manifest.json")
            assert build_mix(mix, out, BuildOptions(merge_only=True, **QUIET)).merged
    assert _files(Path(out)) == _files(ref_out)
    assert _files(Path(out), with_work=True) == _files(ref_out, with_work=True)


def test_executor_choice():
    from open1b_data.ingest.pool import PROCESS_MIN_BYTES, choose_executor

    # Forked helpers start in milliseconds: processes whenever there are 2+ workers.
    assert choose_executor("auto", 1, 2, method="fork") == "processes"
    assert choose_executor("auto", 1, 1, method="fork") == "threads"
    # Spawned helpers cost an interpreter start: only large builds on 3+ workers.
    assert choose_executor("auto", 10 << 20, 8, method="spawn") == "threads"
    assert choose_executor("auto", PROCESS_MIN_BYTES, 8, method="spawn") == "processes"
    assert choose_executor("auto", PROCESS_MIN_BYTES, 2, method="spawn") == "threads"
    assert choose_executor("processes", 1, 2, method="spawn") == "processes"
    assert choose_executor("threads", PROCESS_MIN_BYTES, 8, method="fork") == "threads"
    with pytest.raises(BuildError, match="--executor must be one of"):
        BuildOptions(executor="fork")


def test_task_does_not_merge_until_all_built(mix_path, tmp_path):
    mix = load_mix(mix_path)
    out = str(tmp_path / "mix")
    r = build_mix(mix, out, BuildOptions(task=0, tasks=2, **QUIET))
    assert not r.merged and r.missing and not (tmp_path / "mix" / "manifest.json").exists()
    with pytest.raises(BuildError, match="not built"):
        build_mix(mix, out, BuildOptions(merge_only=True, **QUIET))


def test_refuses_a_different_mix_in_the_same_out(mix_path, reference, tmp_path):
    out, _ = reference
    other = Path(str(mix_path).replace("small.toml", "other.toml"))
    other.write_text(mix_path.read_text().replace("vocab_size = 1024", "vocab_size = 1000"))
    with pytest.raises(BuildError, match="different mix"):
        build_mix(load_mix(other), str(out), BuildOptions(**QUIET))


@pytest.mark.parametrize("when,workers", [("plan", 1), ("plan", 2), ("markers", 2)])
def test_kill_and_resume_is_byte_identical(tmp_path, reference, mix_path, when, workers):
    """SIGKILL the real CLI (its whole process group) early (while the tokenizer trains) or
    mid-way (after some inputs' markers), rerun the same command: identical bytes."""
    ref_out, _ = reference
    out = tmp_path / "mix"
    cmd = [sys.executable, "-c", "from open1b_data.cli.build import build_mix; build_mix()",
           "--manifest", str(mix_path), "--out", str(out), "--workers", str(workers), "--quiet"]
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    markers = out / "_work" / "inputs"

    def ready() -> bool:
        if when == "plan":
            return (out / "_work" / "plan.json").exists()
        return markers.exists() and sum(1 for _ in markers.rglob("*.json")) >= 2

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None and not ready():
        time.sleep(0.002)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists(), "killed too late to test resume"
    done_before = sum(1 for _ in markers.rglob("*.json")) if markers.exists() else 0
    if when == "markers":
        assert done_before >= 2
    rerun = subprocess.run(cmd + ["--json"], env=env, capture_output=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    # Helpers forked after tokenizer training: HF must not warn about the fork.
    assert b"huggingface/tokenizers" not in rerun.stderr, rerun.stderr.decode()[-2000:]
    result = json.loads(rerun.stdout)
    assert result["merged"] and result["inputs_skipped"] >= done_before
    assert _files(out) == _files(ref_out)


def _live_children(pid: int) -> set[int]:
    """Running (not zombie) processes whose parent is ``pid``, from /proc."""
    found = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rsplit(")", 1)[1].split()[:2]
            if int(ppid) == pid and state != "Z":
                found.add(int(d))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_helpers_leave_when_the_build_process_dies(tmp_path, mix_path):
    """SIGKILL only the build process: its forked helpers must not wait for jobs forever."""
    cmd = [sys.executable, "-c", "from open1b_data.cli.build import build_mix; build_mix()",
           "--manifest", str(mix_path), "--out", str(tmp_path / "mix"), "--workers", "2",
           "--executor", "processes", "--quiet"]
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        helpers: set[int] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not helpers:
            helpers = _live_children(proc.pid)
            time.sleep(0.002)
        assert helpers, f"no helper seen: {proc.stderr.read().decode()[-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(h) for h in helpers):
            time.sleep(0.05)
        assert not any(_alive(h) for h in helpers), "helpers outlived their build process"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_encoder_disagreement_fails_the_build(mix_path, tmp_path, monkeypatch):
    from open1b_data.ingest import tokenizer as tk

    real = tk.FastEncoder.encode_batch

    def off_by_one(self, texts):  # a fast encoder that is wrong on the last token
        out = [a.copy() for a in real(self, texts)]
        for a in out:
            if a.size:
                a[-1] = (int(a[-1]) + 1) % 1000 + 1
        return out

    monkeypatch.setattr(tk.FastEncoder, "encode_batch", off_by_one)
    with pytest.raises(BuildError, match="encoders disagree") as e:
        build_mix(load_mix(mix_path), str(tmp_path / "mix"), BuildOptions(**QUIET))
    # Named by what a user can open: the shard's path in the mix, its row, the input line.
    assert SHARD_ROW.search(str(e.value)), str(e.value)
    assert str(tmp_path) not in str(e.value)
    assert not (tmp_path / "mix" / "manifest.json").exists()
    assert not list((tmp_path / "mix").glob("_work/inputs/*/*.json"))


def test_shard_that_differs_from_its_encoding_fails_the_build(mix_path, tmp_path, monkeypatch):
    from open1b_data.formats import shards

    real = shards.ShardWriter.add

    def corrupting_add(self, tokens, doc_id, input, row):
        tokens = tokens.copy()
        if tokens.size:
            tokens[0] ^= 1
        return real(self, tokens, doc_id, input, row)

    monkeypatch.setattr(shards.ShardWriter, "add", corrupting_add)
    with pytest.raises(BuildError, match="differ from the ids encoded") as e:
        build_mix(load_mix(mix_path), str(tmp_path / "mix"), BuildOptions(**QUIET))
    assert SHARD_ROW.match(str(e.value)), str(e.value)
    path = SHARD_ROW.match(str(e.value)).group(1)
    assert (tmp_path / "mix" / path).is_file()  # the named file exists where it says


def test_verify_names_a_flipped_byte(reference, tmp_path):
    import shutil

    out = tmp_path / "mix"
    shutil.copytree(reference[0], out)
    runner = CliRunner()
    ok = runner.invoke(verify_cmd, [str(out)])
    assert ok.exit_code == 0, ok.output
    manifest = load_manifest(str(out))
    # an OK says what it read: every shard, document and token, by the manifest's counts
    docs = sum(sh.documents for s in manifest.sources for sh in s.shards)
    toks = sum(sh.tokens for s in manifest.sources for sh in s.shards)
    shards = sum(len(s.shards) for s in manifest.sources)
    assert (f"OK - content fingerprint {manifest.fingerprint}: {shards} shard(s) read whole "
            f"({docs:,} documents, {toks:,} tokens;") in ok.output, ok.output
    victim = manifest.sources[1].shards[0].path
    data = bytearray((out / victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    (out / victim).write_bytes(bytes(data))
    bad = runner.invoke(verify_cmd, [str(out)])
    assert bad.exit_code != 0
    assert victim in bad.output


def test_bad_inputs_are_counted_and_the_build_finishes(tmp_path):
    mix_path = small_mix(tmp_path / "src", docs=20)
    expected = break_inputs(mix_path)
    out = tmp_path / "mix"
    runner = CliRunner()
    args = ["--manifest", str(mix_path), "--out", str(out), "--workers", "1"]
    res = runner.invoke(build_cmd, args + ["--json"])
    assert res.exit_code == 0, res.output
    assert "docs (" in res.stderr and "tokens (" in res.stderr and "MB/s" in res.stderr
    result = json.loads(res.stdout)
    summary = {r["source"]: r for r in result["summary"]}
    manifest = load_manifest(str(out))
    dropped = Counter()
    for s in manifest.sources:
        dropped.update(s.counts["dropped"])
        assert s.counts["read"] == s.documents + sum(s.counts["dropped"].values())
        assert summary[s.name]["dropped"] == s.counts["dropped"]
    for reason, at_least in expected.items():
        assert dropped[reason] >= at_least, (reason, dict(dropped))

    # Per input: counts by reason and the first bad record, in the manifest and in --json.
    mix = load_mix(mix_path)
    by_path = {}
    for spec in mix.sources:
        entry = manifest.source(spec.name)
        assert [i["path"] for i in entry.inputs] == [i.path for i in list_inputs(spec)]
        for key in ("read", "kept", "tokens"):
            assert sum(i["counts"][key] for i in entry.inputs) == entry.counts[key]
        assert [p for i in entry.inputs for p in i["shards"]] == [sh.path for sh in entry.shards]
        for inp in list_inputs(spec):
            items = list(read_input(spec, inp))   # an independent recount from the reader
            bad = [d for d in items if isinstance(d, Dropped) and d.reason in BAD_INPUT_REASONS]
            by_path[(spec.name, inp.path)] = (items, bad)
    for spec in manifest.sources:
        for i in spec.inputs:
            items, bad = by_path[(spec.name, i["path"])]
            assert i["counts"]["read"] == len(items)
            assert i["counts"]["dropped"] == dict(sorted(Counter(
                d.reason for d in items if isinstance(d, Dropped)).items()))
            want = None if not bad else {"reason": bad[0].reason, "row": bad[0].row,
                                         "detail": bad[0].detail}
            assert i["first_error"] == want, (spec.name, i["path"])
    firsts = {(s.name, i["path"]): i["first_error"] for s in manifest.sources
              for i in s.inputs if i["first_error"]}
    reasons = {e["reason"] for e in firsts.values()}
    assert {"malformed_json", "truncated_zstd", "missing_blob"} <= reasons
    dclm = next(e for (src, _), e in firsts.items() if src == "dclm-baseline")
    assert (dclm["reason"], dclm["row"]) == ("malformed_json", 3)  # the line break_inputs broke
    assert str(tmp_path) not in (out / "manifest.json").read_text()  # details stay portable
    json_inputs = {(i["source"], i["path"]): i for i in result["inputs"]}
    assert len(json_inputs) == sum(len(s.inputs) for s in manifest.sources)
    for (src, path), e in firsts.items():
        assert json_inputs[(src, path)]["first_error"] == e
    truncated = [k for k, e in firsts.items() if e["reason"] == "truncated_zstd"]
    assert [(i["source"], i["path"]) for i in result["inputs"]
            if set(i["dropped"]) & {"truncated_zstd", "unreadable_file"}] == truncated

    # The human report lists the inputs with bad records; --strict fails naming the
    # truncated file (once the build is done: the rerun skips every input and merges).
    res = runner.invoke(build_cmd, args + ["--quiet"])
    assert res.exit_code == 0 and "inputs with bad records (3;" in res.stdout, res.output
    assert "/".join(truncated[0]) + " row " in res.stdout
    res = runner.invoke(build_cmd, args + ["--quiet", "--strict"])
    assert res.exit_code == 1, res.output
    error = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and error[0].startswith("Error: --strict: 1 input file(s)"), error
    assert "Traceback" not in res.stderr
    assert f"{truncated[0][0]}/{truncated[0][1]} (truncated_zstd)" in error[0]
    assert "dclm" not in error[0]  # a malformed line is a bad record, not a bad file
    assert load_manifest(str(out)).fingerprint == manifest.fingerprint


def test_build_mix_without_arguments_builds_the_demo(tmp_path, monkeypatch):
    """The README's main job: no options -> the demo mix into ./build/demo-mix, verified."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(build_cmd, ["--quiet"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "build" / "demo-mix"
    manifest = load_manifest(str(out))
    assert manifest.name == "demo" and len(manifest.sources) == 4
    assert all(s.documents > 0 for s in manifest.sources)
    assert "fingerprint" in res.stdout and "total" in res.stdout
    assert CliRunner().invoke(verify_cmd, [str(out)]).exit_code == 0


@pytest.mark.slow  # importing transformers, and torch through AutoTokenizer, takes 5-15 s
def test_tokenizer_directory_opens_in_transformers(reference, mix_path, tmp_path):
    """<mix>/tokenizer/ loads with AutoTokenizer with the separator as eos_token, and encodes
    a real document to exactly the ids its shard stores (and decodes it back)."""
    import shutil

    transformers = pytest.importorskip("transformers")
    out, _ = reference
    manifest = load_manifest(str(out))
    record = manifest.tokenizer["directory"]
    assert record["path"] == "tokenizer"
    assert [f["path"] for f in record["files"]] == [
        "tokenizer/special_tokens_map.json", "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json"]
    assert sorted(p.name for p in (out / "tokenizer").iterdir()) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert ((out / "tokenizer" / "tokenizer.json").read_bytes() ==
        (out / "tokenizer.json").read_bytes())  # the top-level file stays, the same bytes
    tok = transformers.AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    assert tok.eos_token == "<|endoftext|>"
    assert tok.eos_token_id == manifest.tokenizer["eot_id"]
    assert tok.bos_token is None and tok.pad_token is None
    assert tok.model_max_length == load_mix(mix_path).schedule.seq_tokens

    spec = load_mix(mix_path).source("dclm-baseline")
    shard = manifest.source(spec.name).shards[0]
    doc = next(iter_documents(str(out / shard.path)))
    text = next(d.text for inp in list_inputs(spec) for d in read_input(spec, inp)
                if not isinstance(d, Dropped) and (d.input, d.row) == (doc.input, doc.row))
    ids = tok(text)["input_ids"]   # default add_special_tokens: nothing is added
    assert ids == doc.tokens.tolist()
    assert tok.decode(ids) == text
    # A literal separator inside a document is text, as in the shards.
    literal = text[:50] + "<|endoftext|>" + text[50:100]
    assert tok.eos_token_id not in tok(literal)["input_ids"]
    assert tok(literal)["input_ids"] == load_tokenizer(str(out / "tokenizer.json")).encode(
        literal, add_special_tokens=False).ids

    # verify checks the content of the directory's files.
    copy = tmp_path / "mix"
    shutil.copytree(out, copy)
    config = copy / "tokenizer" / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"split_special_tokens": true',
                                                 '"split_special_tokens": false'))
    bad = CliRunner().invoke(verify_cmd, [str(copy)])
    assert bad.exit_code == 1 and "tokenizer/tokenizer_config.json: content differs" in bad.output


def test_manifest_errors_name_the_shard_path(reference, tmp_path):
    import shutil

    from open1b_data.formats.manifest import fingerprint
    from open1b_data.errors import ManifestError

    copy = tmp_path / "mix"
    shutil.copytree(reference[0], copy)
    d = json.loads((copy / "manifest.json").read_text())
    victim = d["sources"][1]["shards"][2]
    victim["sha256"] = "not-a-sha"
    d["fingerprint"] = fingerprint(d)
    (copy / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError) as e:
        load_manifest(str(copy))
    assert repr(victim["path"]) in str(e.value), str(e.value)


def test_a_marker_without_per_input_accounting_is_rebuilt(reference, mix_path, tmp_path):
    """Markers written before first_error existed would leave an input's bad records out of
    the manifest: such an input is built again, to the same bytes."""
    import shutil

    out = tmp_path / "mix"
    shutil.copytree(reference[0], out)
    marker = sorted((out / "_work" / "inputs").rglob("*.json"))[0]
    old = json.loads(marker.read_text())
    del old["first_error"]
    marker.write_text(json.dumps(old))
    r = build_mix(load_mix(mix_path), str(out), BuildOptions(workers=1, **QUIET))
    assert (r.inputs_built, r.merged) == (1, True)
    assert _files(out, with_work=True) == _files(reference[0], with_work=True)
