"""build-mix against a real S3-compatible server on loopback (moto's server mode).

The test starts its own server on a free 127.0.0.1 port, uploads a small four-source
corpus (with the Stack v2 content store as objects addressed by blob_id), runs the real
CLI in a subprocess configured the way a user would point it at a custom endpoint
(``FSSPEC_S3_ENDPOINT_URL`` + ``AWS_*`` credentials), reads s3:// inputs and writes the mix
to s3://, verifies it, loads its manifest, and checks that every shard is byte-identical to
a local build of the same corpus. The server is stopped at the end."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tomllib

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.s3

moto_server = pytest.importorskip("moto.server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_endpoint(monkeypatch):
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "FSSPEC_S3_ENDPOINT_URL": endpoint}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import fsspec.config

    # fsspec read its environment at import; this process needs the same setting.
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
    try:
        yield endpoint
    finally:
        server.stop()


def test_build_mix_reads_and_writes_s3(s3_endpoint, tmp_path):
    import s3fs

    from open1b_data.ingest.pipeline import BuildOptions, build_mix
    from open1b_data.cli.build import verify as verify_cmd
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.formats.definition import load_mix
    from testkit.mixfixture import dump_toml, small_mix

    local_toml = small_mix(tmp_path / "src", docs=25, inputs_per_source=1)
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    fs.mkdir("corpus")
    fs.mkdir("mixes")
    fs.put(str(tmp_path / "src" / "corpus") + "/", "corpus/", recursive=True)

    raw = tomllib.loads(local_toml.read_text())
    for src in raw["sources"]:
        src["root"] = "s3://" + src["root"]  # "corpus/<name>" -> s3://corpus/<name>
        if "content_store" in src:
            src["content_store"] = "s3://" + src["content_store"]
    s3_toml = tmp_path / "src" / "s3.toml"
    s3_toml.write_text(dump_toml(raw))
    stack = next(s for s in load_mix(s3_toml).sources if s.format == "stack-v2")
    assert stack.content_store.startswith("s3://corpus/")

    out = "s3://mixes/small"
    proc = subprocess.run(
        [sys.executable, "-c", "from open1b_data.cli.build import build_mix; build_mix()",
         # 2 workers: helpers forked from a process whose s3fs client is live.
         "--manifest", str(s3_toml), "--out", out, "--workers", "2", "--json", "--quiet"],
        env=dict(os.environ, PYTHONPATH=os.getcwd()), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    result = json.loads(proc.stdout)
    assert result["merged"] and result["documents"] > 0

    res = CliRunner().invoke(verify_cmd, [out])
    assert res.exit_code == 0, res.output
    manifest = load_manifest(out)
    assert fs.exists("mixes/small/tokenizer.json")
    assert all(i.get("path") and i.get("size") for s in manifest.sources for i in s.inputs)
    assert manifest.source(stack.name).documents > 0  # content fetched by blob_id from S3

    # The same corpus built locally gives byte-identical shards and tokenizer.
    local = build_mix(load_mix(local_toml), str(tmp_path / "local"),
                      BuildOptions(workers=1, progress=False))
    local_manifest = local.manifest
    for s3_src, local_src in zip(manifest.sources, local_manifest.sources):
        assert ([(e.path, e.sha256, e.lengths_content) for e in s3_src.shards] ==
               [(e.path, e.sha256, e.lengths_content) for e in local_src.shards])
        assert s3_src.counts == local_src.counts
    assert manifest.tokenizer["sha256"] == local_manifest.tokenizer["sha256"]

    # verify notices a damaged object in the bucket too.
    victim = manifest.sources[0].shards[0].path
    data = bytearray(fs.cat_file(f"mixes/small/{victim}"))
    data[-100] ^= 0xFF
    fs.pipe_file(f"mixes/small/{victim}", bytes(data))
    res = CliRunner().invoke(verify_cmd, [out])
    assert res.exit_code != 0 and victim in res.output


def test_listing_forgets_stale_subdirectory_listings(s3_endpoint):
    """Another process writes into a directory this process listed before: after
    storage.list_tree the new file is listed AND readable (s3fs kept the subdirectory's old
    listing and answered 'does not exist' from it, without asking the server: the task
    array below failed that way, now and then, when it read the lengths files it merged)."""
    import s3fs

    from open1b_data import storage

    writer = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    writer.mkdir("stale")
    writer.pipe_file("stale/mix/src/a.npy", b"a")
    assert storage.list_tree("s3://stale/mix") == ["src/a.npy"]   # caches src/'s listing
    writer.pipe_file("stale/mix/src/b.npy", b"b")                # another process
    assert storage.list_tree("s3://stale/mix") == ["src/a.npy", "src/b.npy"]
    assert storage.read_bytes("s3://stale/mix/src/b.npy") == b"b"
    writer.pipe_file("stale/mix/src/c.npy", b"c")
    assert storage.exists("s3://stale/mix/src/c.npy")
    assert storage.read_bytes("s3://stale/mix/src/c.npy") == b"c"


@pytest.mark.slow  # four build processes in sequence and three at once: 20-40 s
def test_task_array_on_s3_is_byte_identical_to_a_local_build(s3_endpoint, tmp_path):
    """docs/SCALE-OUT.md in small: the tokenizer job, then N = 3 tasks of the real CLI at
    once as separate OS processes writing one s3:// prefix, then the merge; every object
    equals the file of a local single-process build of the same definition (manifest.json
    and _work included)."""
    import s3fs

    from open1b_data.ingest.pipeline import BuildOptions, build_mix
    from open1b_data.formats.definition import load_mix
    from testkit.mixfixture import small_mix

    mix_toml = small_mix(tmp_path / "src", docs=25, inputs_per_source=2)
    local = tmp_path / "local"
    build_mix(load_mix(mix_toml), str(local), BuildOptions(workers=1, progress=False))

    out, tasks = "s3://arrays/mix", 3
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    fs.mkdir("arrays")  # moto keeps buckets across its servers in one process
    cmd = [sys.executable, "-c", "from open1b_data.cli import main; main()", "build-mix",
           "--manifest", str(mix_toml), "--out", out, "--workers", "1", "--quiet", "--json"]
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    first = subprocess.run(cmd + ["--tokenizer-only"], env=env, capture_output=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    assert fs.exists("arrays/mix/tokenizer.json") and not fs.exists("arrays/mix/_work/inputs")
    procs = [subprocess.Popen(cmd + ["--task", str(i), "--tasks", str(tasks)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(tasks)]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr.decode()[-3000:]
        results.append(json.loads(stdout))
    n_inputs = results[0]["inputs_total"]
    assert sum(r["inputs_built"] for r in results) == n_inputs  # each input built once
    merge = subprocess.run(cmd + ["--merge-only"], env=env, capture_output=True, timeout=300)
    assert merge.returncode == 0, merge.stderr.decode()[-3000:]
    assert json.loads(merge.stdout)["merged"]

    want = {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*")
            if p.is_file()}
    keys = [k for k in fs.find("arrays/mix") if not k.startswith("arrays/mix/stream/")]
    got = {k[len("arrays/mix/"):]: fs.cat_file(k) for k in keys}
    assert sorted(got) == sorted(want)
    assert [k for k in got if got[k] != want[k]] == []
