"""Files from others are never followed, waited on or written through, and the explorer
says no more than the CLI (docs/AUDIT.md, "Files from others" and "The explorer's
claims"). The tamper table's cases (testkit/hostile.py) run through the CLI in
tests/audit/test_tamper.py; here are the forgeries that need a server, a memory
measurement or a unit's view."""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from open1b.errors import Open1bError
from open1b.safeio import read_regular, write_atomic
from open1b_audit import certificate
from open1b_audit.coverage import spans
from open1b_data import storage
from open1b_data.errors import FileAccessError
from open1b_train import checkpoint, runinfo, runlog
from open1b_train.errors import CheckpointError, Open1bTrainError
from testkit import fakelog, hostile
from testkit.auditors import on_recipe
from testkit.forger import rewrite_in_record
from testkit.runs import REF_STEPS, cli_env
from testkit.sitefixture import CERTIFIED_STEPS, STEPS

TIMEOUT = 300


def _audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "open1b_audit.cli", *args], env=cli_env(),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)


# ----------------------------------------------------------------- files, read and written

def test_links_and_special_files_are_refused_and_writes_never_go_through_a_link(tmp_path):
    target = tmp_path / "mine.txt"
    target.write_bytes(b"mine")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(Open1bError, match="symbolic link; refusing to follow"):
        read_regular(str(link))
    with pytest.raises(Open1bError, match="character device"):
        read_regular("/dev/zero")
    write_atomic(str(link), b"new")                  # the link is replaced, not written through
    assert target.read_bytes() == b"mine" and not link.is_symlink()
    assert link.read_bytes() == b"new"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_mix_reads_refuse_links_and_only_a_builds_inputs_follow_them(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_bytes(b'{"text": "a"}\n')
    link = tmp_path / "input.jsonl"
    link.symlink_to(real)
    with pytest.raises(FileAccessError, match="symbolic link"):
        storage.read_bytes(str(link))
    with pytest.raises(FileAccessError, match="symbolic link"):
        list(storage.iter_lines(str(link)))
    assert list(storage.iter_lines(str(link), follow=True)) == [b'{"text": "a"}']
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileAccessError, match="FIFO"):       # never waited on
        list(storage.iter_lines(str(fifo), follow=True))
    with pytest.raises(FileAccessError, match="FIFO"):
        storage.read_ranges(str(fifo), [(0, 4)])


def test_run_json_names_a_url_only_for_its_own_trainer(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"mix": "s3://owner-bucket/mix"}))
    with pytest.raises(Open1bTrainError, match="refusing to fetch it - pass --mix"):
        runinfo.named_mix(str(tmp_path))
    assert runinfo.named_mix(str(tmp_path), own=True) == "s3://owner-bucket/mix"
    (tmp_path / "run.json").write_text(json.dumps({"mix": "simplecache::/tmp/mix"}))
    with pytest.raises(Open1bTrainError, match="refusing to fetch"):
        runinfo.named_mix(str(tmp_path))


def _peak_rss_kib(args: list[str]) -> tuple[int, int, str]:
    """(exit status, peak RSS in KiB, stderr) of ``open1b-audit ARGS`` in a fresh process."""
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.stderr.write(r.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "open1b_audit.cli",
                        *args], env=cli_env(), capture_output=True, text=True, timeout=TIMEOUT)
    rc, kib = r.stdout.split()
    return int(rc), int(kib), r.stderr


@pytest.mark.slow
def test_a_giant_log_line_costs_the_bound_not_its_size(ref_run, tmp_path):
    """A 64 MiB line (an unhashed field: the chain would hold) is refused naming its line,
    after at most the bound was held: the reader streams (the whole-file read and split
    cost several times the line)."""
    run = str(tmp_path / "run")
    shutil.copytree(ref_run, run, ignore=shutil.ignore_patterns("checkpoints"))
    rc, honest, _ = _peak_rss_kib(["chain", run])
    assert rc == 0
    lines = runlog.read(run)
    lines[3]["pad"] = "x" * (64 << 20)
    runlog.rewrite(run, lines)
    rc, peak, err = _peak_rss_kib(["chain", run])
    assert rc == 1 and "line 4 is longer than 1,048,576 bytes" in err, err
    assert peak - honest < 24 << 10, (honest, peak)        # KiB: well under the 64 MiB line
    with open(runlog.path_of(run), "ab") as f:             # a giant cut-off last line too
        f.write(b'{"step": 9, "pad": "' + b"y" * (3 << 20))
    lines[3].pop("pad")
    runlog.rewrite(run, lines)
    with open(runlog.path_of(run), "ab") as f:
        f.write(b'{"step": 9, "pad": "' + b"y" * (3 << 20))
    r = _audit("chain", run)
    assert r.returncode == 1 and "line 10 is longer than" in r.stderr, r.stderr


# ----------------------------------------------------------------- checkpoints by name

def _tiny_checkpoint(root: str, n_shards: int = 2) -> str:
    params = {"a": torch.ones(3), "b": torch.zeros(2)}
    shards = {0: ({"a": torch.ones(3)}, {"a": torch.ones(3)}),
              1: ({"b": torch.zeros(2)}, {"b": torch.zeros(2)})}
    return checkpoint.save(root, 2, params, shards, n_shards, {"adam_step": 2, "skip_left": 0})


def test_a_moment_in_two_optim_files_or_a_stray_tensor_is_refused_by_name(tmp_path):
    ck = _tiny_checkpoint(str(tmp_path))
    loaded = checkpoint.load(ck)
    checkpoint.check_names(loaded, ["a", "b"])
    with pytest.raises(CheckpointError, match=r"'hidden'\] that this run's model does not"):
        checkpoint.check_names(checkpoint.Checkpoint(2, ck, loaded.record,
                                                     {**loaded.params, "hidden": torch.ones(1)},
                                                     loaded.m, loaded.v), ["a", "b"])
    name = "optim-00001-of-00002.safetensors"
    t = st_load(open(os.path.join(ck, name), "rb").read())
    rewrite_in_record(ck, name, st_save({**t, "m.a": torch.ones(3)}))     # m.a twice
    with pytest.raises(CheckpointError, match="'m.a' is also in another optim file"):
        checkpoint.load(ck)
    rewrite_in_record(ck, name, st_save({**t, "z.b": torch.ones(2)}))     # not a moment
    with pytest.raises(CheckpointError, match="'z.b' is not an Adam moment"):
        checkpoint.load(ck)


def test_a_name_twice_in_a_header_is_refused_by_both_loaders(ref_run, tmp_path):
    from open1b_train.params import Layout, param_specs
    from open1b_train.run import read_run

    run = hostile.duplicate_name(ref_run, str(tmp_path))
    ck = checkpoint.step_dir(run, 6)
    with pytest.raises(CheckpointError, match="names '.*' twice"):
        checkpoint.load(ck)
    lay = Layout(param_specs(read_run(run, "unused")[0].model))
    with pytest.raises(CheckpointError, match="names '.*' twice"):      # the lean plan's
        checkpoint.load_streamed(ck, lay, _Flat(lay.zeros()), _Flat(lay.zeros()))


class _Flat:
    """A moment vector with the ``DiskFlat`` write interface ``load_streamed`` uses."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def write(self, offset: int, data: torch.Tensor) -> None:
        self.t[offset:offset + data.numel()] = data


# ----------------------------------------------------------------- assign, coverage gaps

def test_gaps_are_every_step_as_ranges(tmp_path):
    assert spans([1, 2, 3, 5, 9, 10]) == "1-3, 5, 9-10" and spans([]) == ""
    lines = fakelog.lines_of(50)
    run = fakelog.write_run(str(tmp_path / "run"), lines)
    certs = tmp_path / "certs"
    certs.mkdir()
    key = str(tmp_path / "k.pem")
    certificate.keygen(key)
    for s in (10, 11, 12, 30):
        c = certificate.build(lines, s, {"components": lines[s]["components"]}, None, "k",
                              "cpu", {}, s - 1, on_recipe(lines))
        certificate.write(certificate.sign(c, key), str(certs / f"step-{s:08d}.json"))
    r = _audit("coverage", run, str(certs))
    assert r.returncode == 0, r.stderr
    assert "gaps (46 steps): 1-9, 13-29, 31-50\n" in r.stdout, r.stdout


def test_assign_splits_only_a_chained_pinned_log(ref_run):
    published = runlog.read(ref_run)[-1]["hash"]
    r = _audit("assign", ref_run, "--auditors", "3", "--seed", "5", "--expect-run-hash",
               published, "--json")
    assert r.returncode == 0 and not r.stderr, r.stderr
    rep = json.loads(r.stdout)
    assert rep["run_hash"] == published
    assert sorted(s for v in rep["assignment"].values() for s in v) == list(range(1, REF_STEPS + 1))
    r = _audit("assign", ref_run, "--auditors", "3", "--seed", "5")
    assert r.returncode == 0 and "no --expect-run-hash" in r.stderr


# ----------------------------------------------------------------- the explorer's claims

@pytest.fixture(scope="module")
def crowded(site_run, tmp_path_factory):
    """site_run's certificate folder plus three throwaway keys certifying every step and a
    link to a secret; the trusted-keys file names only the real auditor."""
    root = tmp_path_factory.mktemp("crowded")
    certs = root / "certs"
    shutil.copytree(site_run.certs, certs)
    lines = runlog.read(site_run.run)
    for name in ("m1", "m2", "m3"):
        key = str(root / f"{name}.pem")
        certificate.keygen(key)
        for s in range(1, len(lines)):
            c = certificate.build(lines, s, {"components": lines[s]["components"]}, None,
                                  name, "cpu", {}, s - 1, on_recipe(lines))
            certificate.write(certificate.sign(c, key), str(certs / f"step-{s:08d}-{name}.json"))
    (root / "secret.json").write_text(json.dumps({"token": hostile.SECRET}))
    (certs / "step-00000004.json").symlink_to(root / "secret.json")
    trusted = root / "committee.keys"
    shutil.copy(os.path.join(os.path.dirname(site_run.certs), "auditor.pem.pub"), trusted)
    return str(certs), str(trusted)


def _covered(run: str, certs: str, *extra: str) -> int:
    r = _audit("coverage", run, certs, "--json", *extra)
    return json.loads(r.stdout)["covered"]


@pytest.mark.slow
def test_the_site_counts_what_coverage_counts_and_says_what_it_was_not_given(
        site_run, crowded, tmp_path):
    certs, trusted = crowded
    published = runlog.read(site_run.run)[-1]["hash"]
    for extra, banner in (((), ('id="unpinned"', 'id="anykey"')),
                          (("--trusted-keys", trusted, "--expect-run-hash", published),
                           ('id="pinned"', 'id="trusted"'))):
        out = tmp_path / f"site{len(extra)}"
        r = _audit("site", site_run.run, "--mix", site_run.mix, "--certs", certs, "--out",
                   str(out), "--steps", "1:1", *extra)
        assert r.returncode == 0, r.stderr
        assert ("warning: no --trusted-keys" in r.stderr) == (not extra)
        keys = extra[:2]
        n = _covered(site_run.run, certs, *keys)
        assert n == (len(CERTIFIED_STEPS) if keys else STEPS)
        cov = (out / "coverage.html").read_text()
        assert f"{n} of {STEPS} steps certified" in cov
        for page in ("index.html", "coverage.html", "step-1.html"):
            text = (out / page).read_text()
            assert all(b in text for b in banner), (page, banner)
        assert "step-00000004.json" in cov and "symbolic link" in cov
        published_files = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs]
        assert not any(hostile.SECRET in open(p, errors="replace").read()
                       for p in published_files)
        assert not (out / "certs" / "step-00000004.json").exists()


def _get(port: int, path: str, host: str) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.putrequest("GET", path, skip_host=True)
        c.putheader("Host", host)
        c.endheaders()
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


@pytest.mark.slow
def test_serve_answers_loopback_names_only_and_never_serves_a_link(site_run, crowded):
    certs, trusted = crowded
    published = runlog.read(site_run.run)[-1]["hash"]
    p = subprocess.Popen([sys.executable, "-m", "open1b_audit.cli", "serve", site_run.run,
                          "--mix", site_run.mix, "--certs", certs, "--port", "0",
                          "--trusted-keys", trusted, "--expect-run-hash", published],
                         env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, stdin=subprocess.DEVNULL)
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line + p.stderr.read() if p.poll() is not None else line
        port = int(m.group(1))
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "LOCALHOST"):
            assert _get(port, "/", host)[0] == 200, host
        for host in ("rebind.attacker.example", f"rebind.attacker.example:{port}",
                     "127.0.0.1.attacker.example", ""):
            code, body = _get(port, "/", host)
            assert code == 421 and "answers only requests for" in body, host
        code, body = _get(port, "/certs/step-00000004.json", f"127.0.0.1:{port}")
        assert code == 404 and hostile.SECRET not in body
        code, body = _get(port, "/certs/step-00000001-m1.json", f"127.0.0.1:{port}")
        assert code == 200 and certificate.verify(json.loads(body))       # as parsed, signed
        code, cov = _get(port, "/coverage.html", f"127.0.0.1:{port}")
        n = _covered(site_run.run, certs, "--trusted-keys", trusted)
        assert code == 200 and f"{n} of {STEPS} steps certified" in cov and 'id="pinned"' in cov
    finally:
        p.terminate()
        p.wait(timeout=60)


def test_a_folder_inside_a_run_that_is_a_link_is_refused_where_the_run_itself_may_be_one(
        ref_run, tmp_path):
    """The forgery: a run whose ``checkpoints/step-N`` (or ``checkpoints``, or ``traces``) is
    a link out of the run - to the auditor's own files - read through as if published."""
    from open1b_audit.crowd.source import RunSource, SourceError
    from open1b_train import trace

    run = tmp_path / "run"
    shutil.copytree(ref_run, run, symlinks=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ck = checkpoint.step_dir(str(run), 6)
    shutil.move(ck, elsewhere / "step-6")
    os.symlink(elsewhere / "step-6", ck)
    with pytest.raises(CheckpointError, match=r"step-00000006: a folder inside .* symbolic link"):
        checkpoint.load(ck)
    source = RunSource(str(run))
    rel = "checkpoints/step-00000006/record.json"
    with pytest.raises(SourceError, match="symbolic link"):
        source.read(rel, "record")
    with pytest.raises(SourceError, match="symbolic link"):
        source.download(rel, str(tmp_path / "dl" / "record.json"), "record")
    assert not (tmp_path / "dl" / "record.json").exists()
    os.unlink(ck)                                      # the step back; `checkpoints` a link
    shutil.move(elsewhere / "step-6", ck)
    shutil.move(run / "checkpoints", elsewhere / "checkpoints")
    os.symlink(elsewhere / "checkpoints", run / "checkpoints")
    with pytest.raises(CheckpointError, match=r"checkpoints: a folder inside"):
        checkpoint.load(ck)
    with pytest.raises(SourceError, match="symbolic link"):
        source.read(rel, "record")
    os.unlink(run / "checkpoints")
    shutil.move(elsewhere / "checkpoints", run / "checkpoints")
    record = os.path.join(ck, "record.json")          # a link as the file itself, downloaded
    os.rename(record, str(tmp_path / "record.json"))
    os.symlink(tmp_path / "record.json", record)
    with pytest.raises(SourceError, match="symbolic link"):
        source.download(rel, str(tmp_path / "dl" / "record.json"), "record")
    os.unlink(record)
    os.rename(str(tmp_path / "record.json"), record)
    linked_run = tmp_path / "linked-run"               # the folder the user named: theirs
    os.symlink(run, linked_run)
    assert checkpoint.load(checkpoint.step_dir(str(linked_run), 6), params_only=True).step == 6
    assert RunSource(str(linked_run)).read(rel, "record") == open(record, "rb").read()
    tracer = trace.Tracer(3)
    tracer("embed", torch.zeros(2))
    tracer.write(trace.path_of(str(run), 3))
    assert trace.read(trace.path_of(str(run), 3))[0] == 3
    shutil.move(run / "traces", elsewhere / "traces")
    os.symlink(elsewhere / "traces", run / "traces")
    with pytest.raises(Open1bTrainError, match="traces: a folder inside"):
        trace.read(trace.path_of(str(run), 3))


def test_a_link_planted_at_a_writers_temporary_name_is_never_written_through(tmp_path):
    """The forgery: a run or cache folder shared with its owner, holding a link at the name a
    writer used as its temporary (``<file>.tmp-<pid>``, predictable) that points at a file
    of the auditor's. Writers create a fresh temporary exclusively (``write_atomic``)."""
    from open1b_audit.crowd.cache import RunCache
    from open1b_train.config import TrainConfig
    from open1b_train.run import _check_config

    mine = tmp_path / "mine.txt"
    mine.write_bytes(b"mine")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("config.json", "steps.jsonl"):
        os.symlink(mine, run_dir / f"{name}.tmp-{os.getpid()}")
    _check_config(str(run_dir), TrainConfig())
    RunCache._put(str(run_dir / "steps.jsonl"), b"{}\n")          # the crowd's cache
    assert mine.read_bytes() == b"mine"
    assert (run_dir / "steps.jsonl").read_bytes() == b"{}\n"
    assert json.loads((run_dir / "config.json").read_bytes()) == TrainConfig().to_dict()


def test_a_folder_inside_a_mix_that_is_a_link_is_refused(tmp_path):
    """The forgery: a published mix whose source folder is a link out of the mix (to the
    auditor's files); every path a manifest names goes through ``mixpath.resolve``."""
    from open1b_data.errors import ManifestError
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.formats.mixpath import resolve
    from open1b_data.stream.loader import StreamLoader
    from testkit.s2mix import text_mix

    mix, _ = text_mix(str(tmp_path / "mix"))
    shard = load_manifest(mix).sources[0].shards[0]
    assert resolve(mix, shard.path) == f"{mix}/{shard.path}"
    first = shard.path.split("/")[0]
    shutil.move(os.path.join(mix, first), tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", os.path.join(mix, first))
    with pytest.raises(ManifestError, match=rf"{first}: a folder inside .* symbolic link"):
        resolve(mix, shard.path)
    with pytest.raises(ManifestError, match="symbolic link"):      # the same mix as a URL
        resolve(f"file://{mix}", shard.path)
    with pytest.raises(ManifestError, match="symbolic link"):
        next(iter(StreamLoader(mix, rank=0, world=1)))
