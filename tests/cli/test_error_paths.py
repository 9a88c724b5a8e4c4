"""Every error path of ``open1b-data`` ends in one line on standard error, never a traceback.

``CASES`` is the table: argv -> exit status (1 error, 2 usage) and the substrings the one
line must hold - the bad value and the specific reason, so that the last-resort guard
("internal error: ...", exit 3) never passes for a listed case. Every command of the group
must have rows here (``test_every_command_has_error_cases``): a new command comes with its
bad inputs. Runs in-process through click's runner with ``catch_exceptions=False`` (a
traceback would fail the test as an exception), plus a few through the real console script
in a subprocess (``test_console_script``).

No test reaches a network: S3 credentials are removed and the endpoint points at a closed
loopback port (``offline`` fixture), so "no credentials" is decided before any request;
the Hub runs in offline mode.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from open1b_data.formats.manifest import fingerprint
from open1b_data.cli import main

REPO = Path(__file__).resolve().parents[2]
DEMO_TOML = str(REPO / "manifests" / "demo.toml")
MIX_0626 = str(REPO / "manifests" / "mix-0626.toml")
HUGE = 1 << 40     # elements a crafted lengths header declares: 4 TiB if allocated


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No AWS credentials anywhere, S3 at a closed loopback port, the Hub offline."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    env = {"AWS_EC2_METADATA_DISABLED": "true", "FSSPEC_S3_ENDPOINT_URL": "http://127.0.0.1:9",
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
           "AWS_CONFIG_FILE": str(tmp_path / "no-config"), "HF_HUB_OFFLINE": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import fsspec.config

    # fsspec read FSSPEC_* when it was imported; this process needs the same setting.
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]})
    s3fs = pytest.importorskip("s3fs")
    s3fs.S3FileSystem.clear_instance_cache()   # no client that found credentials earlier
    yield env
    s3fs.S3FileSystem.clear_instance_cache()


def _vouch(mix: Path, edit) -> None:
    """Apply ``edit(manifest_dict, mix)`` and re-fingerprint, so the manifest vouches for
    the edited files; drop the seek index, which belonged to the old fingerprint."""
    m = json.loads((mix / "manifest.json").read_text())
    edit(m, mix)
    m["fingerprint"] = fingerprint(m)
    (mix / "manifest.json").write_text(json.dumps(m, indent=1))
    shutil.rmtree(mix / "stream", ignore_errors=True)


def _huge_lengths(m: dict, mix: Path) -> None:
    """Every lengths file: a valid .npy header declaring 2^40 <u4 elements, 16 bytes of
    body, its sha256 in the manifest."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "<u4", "fortran_order": False, "shape": (HUGE,)})
    raw = head.getvalue() + bytes(16)
    for s in m["sources"]:
        for sh in s["shards"]:
            (mix / sh["lengths"]["path"]).write_bytes(raw)
            sh["lengths"]["sha256"] = hashlib.sha256(raw).hexdigest()


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    """Every bad input the table refers to, by placeholder name."""
    from testkit.s2mix import text_mix

    root = tmp_path_factory.mktemp("errors")
    mix, _ = text_mix(str(root / "mix"))
    p = {"mix": mix, "toml": DEMO_TOML, "tmp": str(root), "missing": str(root / "absent")}
    (root / "file").write_text("not a mix\n")
    p["file"] = str(root / "file")
    (root / "empty-dir").mkdir()
    p["dir"] = str(root / "empty-dir")
    for name, content in (("notobj", b"[1, 2]"), ("garbage", b"\x00\xffgarbage\x93"),
                          ("empty", b"")):
        (root / name).mkdir()
        (root / name / "manifest.json").write_bytes(content)
        p[name] = str(root / name)
    (root / "empty.toml").write_bytes(b"")
    p["empty_toml"] = str(root / "empty.toml")
    (root / "binary.toml").write_bytes(b"\x00\xff\xfe binary")
    p["binary_toml"] = str(root / "binary.toml")
    demo = Path(DEMO_TOML).read_text()
    assert "\n[tokenizer]\n" in demo and "split_pattern =" not in demo.replace("# split", "")
    (root / "badsplit.toml").write_text(
        demo.replace("\n[tokenizer]\n", '\n[tokenizer]\nsplit_pattern = "("\n'))
    p["badsplit"] = str(root / "badsplit.toml")
    flipped = root / "flipped"
    shutil.copytree(mix, flipped)
    for shard in flipped.rglob("*.parquet"):
        blob = bytearray(shard.read_bytes())
        blob[len(blob) // 2] ^= 0xFF        # one byte: undecodable, or other content
        shard.write_bytes(bytes(blob))
    p["flipped"] = str(flipped)
    huge = root / "huge"
    shutil.copytree(mix, huge)
    _vouch(huge, _huge_lengths)
    p["huge"] = str(huge)
    shard_dirs = root / "shard-dirs"
    shutil.copytree(mix, shard_dirs)
    for shard in list(shard_dirs.rglob("*.parquet")):
        shard.unlink()
        shard.mkdir()                       # a directory where the manifest names a file
    p["shard_dirs"] = str(shard_dirs)
    for name, edit in (("nosched", lambda m, _: m["definition"].pop("schedule")),
                       ("longwin", lambda m, _: m["definition"].update(window=999))):
        shutil.copytree(mix, root / name)
        _vouch(root / name, edit)
        p[name] = str(root / name)
    return p


# ----------------------------------------------------------------------------- the table

def case(*argv: str, code: int = 1, want: tuple[str, ...] = (), stdout: str | None = None,
         marks=()):
    """One row: ``argv`` (placeholders ``{name}`` from ``paths``), the exit status, the
    substrings of the one stderr line, and optionally one of standard output."""
    return pytest.param(argv, code, want, stdout, marks=marks,
                        id=" ".join(argv).replace("/", "|")[:70])


CASES = [
    # build-mix: the inputs, the definition, the output
    case("build-mix", "--quiet", "--manifest", MIX_0626, "--out", "{tmp}/o0626",
         want=("source 'dclm-baseline'", "s3://commoncrawl/contrib/datacomp/DCLM-baseline",
               "no credentials", "AWS_ACCESS_KEY_ID", "FSSPEC_S3_ENDPOINT_URL")),
    case("build-mix", "--quiet", "--manifest", "{badsplit}", "--out", "{tmp}/osplit",
         want=("tokenizer.split_pattern", "'('", "not a valid regular expression")),
    case("build-mix", "--quiet", "--out", "s3://open1b-test-bucket/mix",
         want=("s3://open1b-test-bucket/mix", "no credentials", "AWS_ACCESS_KEY_ID")),
    case("build-mix", "--quiet", "--out", "{file}/sub",
         want=("--out", "{file}", "is a file, not a directory")),
    case("build-mix", "--quiet", "--out", "{file}",
         want=("--out", "{file} is a file, a directory is needed")),
    case("build-mix", "--quiet", "--manifest", "{missing}.toml",
         want=("{missing}.toml", "does not exist")),
    case("build-mix", "--quiet", "--manifest", "{empty_toml}", want=("{empty_toml}", "empty")),
    case("build-mix", "--quiet", "--manifest", "{binary_toml}",
         want=("{binary_toml}", "not UTF-8")),
    case("build-mix", "--quiet", "--manifest", "{dir}", code=2, want=("--manifest", "{dir}")),
    case("build-mix", "--quiet", "--workers", "0", code=2, want=("--workers", "0")),
    case("build-mix", "--quiet", "--workers", "many", code=2, want=("--workers", "'many'")),
    case("build-mix", "--quiet", "--task", "5", "--tasks", "2", want=("--task", "got 5")),
    case("build-mix", "--quiet", "--executor", "gpu", code=2, want=("--executor", "'gpu'")),
    # verify
    case("verify", "{missing}", want=("{missing}/manifest.json does not exist",)),
    case("verify", "{toml}", want=("{toml} is a mix definition, not a built mix",)),
    case("verify", "{file}", want=("{file} is a file, not a built mix",)),
    case("verify", "s3://open1b-test-bucket/mix",
         want=("s3://open1b-test-bucket/mix/manifest.json", "no credentials")),
    case("verify", "{flipped}", want=("{flipped}", "mismatch"), stdout=".parquet: "),
    case("verify", "{huge}", want=("{huge}", "mismatch"),
         stdout=f"its header declares {HUGE:,} lengths"),
    case("verify", "{notobj}", want=("{notobj}", "mismatch"),
         stdout="expected a JSON object, got list"),
    # stream-at: the mix
    case("stream-at", "{toml}", "--step", "1",
         want=("{toml} is a mix definition, not a built mix", "build-mix --manifest")),
    case("stream-at", "{dir}", "--step", "1", want=("{dir}/manifest.json does not exist",)),
    case("stream-at", "{missing}", "--step", "1", want=("{missing}/manifest.json",)),
    case("stream-at", "{file}", "--step", "1", want=("{file} is a file, not a built mix",)),
    case("stream-at", "s3://open1b-test-bucket/mix", "--step", "1",
         want=("s3://open1b-test-bucket/mix/manifest.json", "no credentials",
               "AWS_ACCESS_KEY_ID")),
    case("stream-at", "{notobj}", "--step", "1", want=("{notobj}/manifest.json",
                                                       "expected a JSON object, got list")),
    case("stream-at", "{garbage}", "--step", "1", want=("{garbage}/manifest.json",
                                                        "not valid JSON")),
    case("stream-at", "{empty}", "--step", "1", want=("{empty}/manifest.json",
                                                      "not valid JSON")),
    case("stream-at", "{flipped}", "--step", "1",
         want=("{flipped}/", ".parquet", "open1b-data verify")),
    case("stream-at", "{huge}", "--step", "1", want=("{huge}/", f"{HUGE:,}")),
    case("stream-at", "{nosched}", "--step", "1", want=("definition.schedule", "None")),
    case("stream-at", "{longwin}", "--step", "1",
         want=("definition.window: 999", "seq_tokens + 1 = 65")),
    case("schedule", "--step", "1", "--mix", "{nosched}", want=("definition.schedule",)),
    case("stream-at", "{shard_dirs}", "--step", "1", want=("{shard_dirs}/", "is a directory")),
    case("verify", "{shard_dirs}", want=("{shard_dirs}/", "is a directory")),
    case("build-mix", "--quiet", "--nosuch", code=2,
         want=("--nosuch", "Did you mean", "see 'open1b-data build-mix --help'")),
    case("nosuchcommand", code=2, want=("'nosuchcommand'", "see 'open1b-data --help'")),
    # stream-at: the numbers
    case("stream-at", "{mix}", "--step", "0", want=("step", "got 0")),
    case("stream-at", "{mix}", "--step", "-3", want=("step", "got -3")),
    case("stream-at", "{mix}", "--step", str(10**30), want=(f"step {10**30}", "past the end")),
    case("stream-at", "{mix}", "--window", "-1", want=("window", "got -1")),
    case("stream-at", "{mix}", "--window", str(10**30), want=("window", "0..")),
    case("stream-at", "{mix}", "--step", "1", "--world", "0", want=("world size", "got 0")),
    case("stream-at", "{mix}", "--step", "1", "--world", "-2", want=("world size", "got -2")),
    case("stream-at", "{mix}", "--step", "1", "--world", "7", want=("world size 7",)),
    case("stream-at", "{mix}", "--step", "1", "--rank", "9", want=("--rank", "got 9")),
    case("stream-at", "{mix}", "--step", "two", code=2, want=("--step", "'two'")),
    case("stream-at", "{mix}", "--steps", "5:1", "--stats", code=2, want=("--steps", "'5:1'")),
    case("stream-at", "{mix}", "--steps", "x", "--stats", code=2, want=("--steps", "'x'")),
    case("stream-at", "{mix}", "--steps", "1:1000", "--stats", want=("--steps 1:1000",)),
    case("stream-at", "{mix}", code=2, want=("--window", "--step")),
    # schedule
    case("schedule", "--step", "0", want=("step", "got 0")),
    case("schedule", "--step", "80958", want=("step 80958", "past the end")),
    case("schedule", "--tokens", "-1", want=("token", "got -1")),
    case("schedule", "--step", "1", "--world", "0", want=("world size", "got 0")),
    case("schedule", "--step", "1", "--world", "5", want=("world size 5", "use one of")),
    case("schedule", "--step", "1", "--tokens", "1", code=2, want=("--step", "--tokens")),
    case("schedule", "--step", "1", "--mix", "{missing}.toml",
         want=("{missing}.toml", "does not exist")),
    case("schedule", "--step", "1", "--mix", "{binary_toml}", want=("{binary_toml}",)),
    case("schedule", "--step", "1", "--mix", "{badsplit}", want=("split_pattern", "'('")),
    case("schedule", "--step", "1", "--mix", "{file}", want=("{file} is a file",)),
    case("schedule", "--step", "1", "--mix", "s3://open1b-test-bucket/mix",
         want=("s3://open1b-test-bucket/mix/manifest.json", "no credentials")),
    # provenance
    case("provenance", "{toml}", "--doc-id", "x", want=("{toml} is a mix definition",)),
    case("provenance", "{flipped}", "--doc-id", "web-0",
         want=("{flipped}/", ".parquet", "open1b-data verify")),
    case("provenance", "{mix}", "--doc-id", "no-such-doc", want=("'no-such-doc'",)),
    case("provenance", "{mix}", "--text", "", want=("phrase is empty",)),
    case("provenance", "{mix}", "--text", "x", "--steps", "9:1", code=2, want=("'9:1'",)),
    case("provenance", "{mix}", "--text", "x", "--steps", "1:100000",
         want=("--steps 1:100000",)),
    case("provenance", "{mix}", "--text", "x", "--world", "0", want=("world size", "got 0")),
    case("provenance", "{mix}", "--doc-id", "x", "--text", "y", code=2,
         want=("--doc-id", "--text")),
    case("provenance", "{huge}", "--doc-id", "web-0", want=("{huge}/", f"{HUGE:,}")),
    # rebuild-check
    case("rebuild-check", "{missing}", want=("{missing}/manifest.json does not exist",)),
    case("rebuild-check", "{toml}", want=("{toml} is a mix definition, not a built mix",)),
    case("rebuild-check", "{mix}", "--sources", "nosuch=/x", code=2,
         want=("--sources", "no source 'nosuch'", "'web'")),
    case("rebuild-check", "{mix}", "--sources", "{missing}",
         want=("{missing}/web", "does not exist")),
    case("rebuild-check", "{mix}", "--sample", "0", code=2, want=("--sample", "0")),
    case("rebuild-check", "{mix}", "--definition", "{missing}.toml",
         want=("{missing}.toml", "does not exist")),
    # plot-mix
    case("plot-mix", "{mix}", "--steps", "1:2", "--out", "{file}/plot.png",
         want=("{file}/plot.png", "{file} is a file")),
    case("plot-mix", "{mix}", "--steps", "1:2", "--out", "{dir}",
         want=("{dir}", "is a directory")),
    case("plot-mix", "{mix}", "--steps", "1:2", "--bins", "0", want=("bins", "got 0")),
    case("plot-mix", "{mix}", "--steps", "1:1000000", want=("1:1000000",)),
    case("plot-mix", "{mix}", "--steps", "x", code=2, want=("--steps", "'x'")),
    case("plot-mix", "{toml}", "--steps", "1:2", want=("{toml} is a mix definition",)),
    case("plot-mix", "{huge}", "--steps", "1:2", "--out", "{tmp}/huge.png",
         want=("{huge}/", f"{HUGE:,}")),
]


def _fill(text: str, paths: dict[str, str]) -> str:
    return text.format(**paths) if "{" in text else text


def run(argv: list[str]):
    return CliRunner().invoke(main, argv, prog_name="open1b-data", catch_exceptions=False)


def check(res_code: int, stderr: str, code: int, want: tuple[str, ...]) -> str:
    """The common claim: exit ``code``, one line on stderr, holding every ``want``."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    (line,) = lines
    assert res_code == code, f"exit {res_code}, expected {code}: {line}"
    assert not line.startswith("internal error"), line
    for w in want:
        assert w in line, f"{w!r} not in {line!r}"
    return line


@pytest.mark.parametrize("argv, code, want, stdout", CASES)
def test_error_is_one_line(argv, code, want, stdout, paths, offline, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)      # build-mix's default --out, plot-mix's default PNG
    res = run([_fill(a, paths) for a in argv])
    check(res.exit_code, res.stderr, code, tuple(_fill(w, paths) for w in want))
    if stdout is not None:
        assert _fill(stdout, paths) in res.stdout, res.stdout


def test_every_command_has_error_cases():
    covered = {p.values[0][0] for p in CASES}
    missing = sorted(set(main.commands) - covered)
    assert not missing, f"commands without error cases: {missing}"


# ----------------------------------------------------------------------------- more cases

@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs Linux sysfs")
def test_unwritable_out_outside_permissions(offline, tmp_path, monkeypatch):
    """sysfs refuses new entries even to root, so this case runs wherever tests run."""
    monkeypatch.chdir(tmp_path)
    res = run(["build-mix", "--quiet", "--out", "/sys/open1b-test-out"])
    check(res.exit_code, res.stderr, 1, ("--out", "/sys/open1b-test-out", "check its permissions"))


def _permissions_enforced(tmp_path: Path) -> bool:
    """Whether chmod denies this process (not for root, unless it runs without
    CAP_DAC_OVERRIDE, e.g. under ``setpriv --bounding-set=-dac_override,-dac_read_search``)."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0)
    try:
        probe.read_text()
        return False
    except PermissionError:
        return True
    finally:
        probe.chmod(0o644)


def test_permission_denied(paths, offline, tmp_path):
    if os.name != "posix" or not _permissions_enforced(tmp_path):
        pytest.skip("chmod 000 / 555 does not deny this process (root)")
    ro = tmp_path / "read-only"
    ro.mkdir()
    ro.chmod(0o555)
    locked = tmp_path / "locked"
    shutil.copytree(paths["mix"], locked)
    (locked / "manifest.json").chmod(0)
    secret = tmp_path / "secret.toml"
    shutil.copy(DEMO_TOML, secret)
    secret.chmod(0)
    try:
        res = run(["build-mix", "--quiet", "--out", str(ro / "mix")])
        check(res.exit_code, res.stderr, 1, (str(ro / "mix"), "ermission denied"))
        res = run(["stream-at", str(locked), "--step", "1"])
        check(res.exit_code, res.stderr, 1, (f"{locked}/manifest.json", "ermission denied"))
        res = run(["build-mix", "--quiet", "--manifest", str(secret)])   # click checks it
        check(res.exit_code, res.stderr, 2, (str(secret), "is not readable"))
        res = run(["schedule", "--step", "1", "--mix", str(secret)])     # we do
        check(res.exit_code, res.stderr, 1, (str(secret), "cannot be read", "ermission"))
    finally:
        ro.chmod(0o755)
        (locked / "manifest.json").chmod(0o644)


def test_crafted_lengths_header_fails_before_allocating(paths):
    """The parser's own size check, with a manifest that vouches for the file: the declared
    2^40 elements are compared with the document count and the file size first."""
    from open1b_data.formats.shards import parse_lengths
    from open1b_data.errors import ShardFormatError

    m = json.loads(Path(paths["huge"], "manifest.json").read_text())
    sh = m["sources"][0]["shards"][0]
    raw = Path(paths["huge"], sh["lengths"]["path"]).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == sh["lengths"]["sha256"]    # vouched for
    with pytest.raises(ShardFormatError, match=f"{sh['documents']:,}"):
        parse_lengths(raw, "x.npy", sh["documents"])
    with pytest.raises(ShardFormatError, match=f"declares {HUGE:,} lengths .* 16 bytes"):
        parse_lengths(raw, "x.npy")
    good = io.BytesIO()
    np.save(good, np.arange(5, dtype="<u4"))
    assert parse_lengths(good.getvalue(), "x.npy", 5).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ShardFormatError, match=r"declares 5 lengths \(20 bytes\) but 16"):
        parse_lengths(good.getvalue()[:-4], "x.npy")     # one length cut off: the size


# ----------------------------------------------------------------------------- the guard

def test_unexpected_exception_is_one_line_exit_3(monkeypatch):
    from open1b_data.stream.schedule import Schedule

    def boom(self, step):
        raise ZeroDivisionError("boom\nsecond line")

    monkeypatch.setattr(Schedule, "step", boom)
    monkeypatch.delenv("OPEN1B_DEBUG", raising=False)
    res = run(["schedule", "--step", "1"])
    assert res.exit_code == 3
    assert res.stderr == ("internal error: ZeroDivisionError: boom second line (set "
                          "OPEN1B_DEBUG=1 for the traceback)\n")
    monkeypatch.setenv("OPEN1B_DEBUG", "1")
    with pytest.raises(ZeroDivisionError, match="boom"):
        run(["schedule", "--step", "1"])


def test_success_and_help_still_exit_0():
    assert run(["schedule", "--step", "1", "--json"]).exit_code == 0
    res = run(["--help"])
    assert res.exit_code == 0 and "stream-at" in res.stdout
    assert run(["stream-at", "--help"]).exit_code == 0
    assert run(["--version"]).exit_code == 0


# ----------------------------------------------------------------------------- the script

SCRIPT = Path(sys.executable).parent / "open1b-data"
SMOKE = [
    (["stream-at", DEMO_TOML, "--step", "1"], 1, ("is a mix definition, not a built mix",)),
    (["schedule", "--step", "abc"], 2, ("--step", "'abc'")),
    # The Hub in offline mode: the root cannot be listed, and the line says why.
    (["build-mix", "--quiet", "--manifest", "{hf_toml}", "--out", "{tmp}/hf"], 1,
     ("hf://datasets/open1b/absent", "offline mode is on", "HF_HUB_OFFLINE")),
]


@pytest.mark.skipif(not SCRIPT.exists(), reason="the console script is not installed")
@pytest.mark.parametrize("argv, code, want", SMOKE, ids=lambda v: str(v)[:40])
def test_console_script(argv, code, want, offline, tmp_path):
    demo = Path(DEMO_TOML).read_text()
    first_root = demo.index('root = "', demo.index("[[sources]]"))
    end = demo.index("\n", first_root)
    (tmp_path / "hf.toml").write_text(
        demo[:first_root] + 'root = "hf://datasets/open1b/absent"' + demo[end:])
    fill = {"hf_toml": str(tmp_path / "hf.toml"), "tmp": str(tmp_path)}
    proc = subprocess.run([str(SCRIPT), *(a.format(**fill) for a in argv)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, **offline))
    check(proc.returncode, proc.stderr, code, want)
