"""A published run's local cache: only what a step needs, every file checked against the
chain before anything uses it.

``RunCache(source, root, announce)`` keeps, under ``root``::

    run/steps.jsonl, run/config.json     the log and the config
    mix/                                 the mix's manifest.json, tokenizer and lengths files
    checkpoints/step-N/                  published checkpoints fetched so far
    data/step-N.npy                      a step's windows, rebuilt from proved documents
    legs/<a>-<b>/                        one run directory per leg (``leg_dir``)

and checks, in this order, before a file is used:

1. the log: one chain (``chain.check``) and, when the run hash was announced, ending in it
   (``chain.pin``); a cached log that fails is fetched again once;
2. the config: ``config.json`` only if its identity is the genesis's
   (``published.hashed_config``), and the announced preset and mix
   (``Announcement.refusal``);
3. the mix: ``manifest.json`` parsed with its fingerprint recomputed, which must be the
   genesis's; each tokenizer file (``published.verified_tokenizer``) and lengths file
   has the sha256 the manifest lists (and is checked again by every later read);
4. a checkpoint: its ``record.json`` must be the chain's step (``checkpoint.record_
   difference``: step hash, mix, seed, config identity), its files are only the plain names
   a checkpoint holds, each streamed with its sha256 compared with the record's; the
   replay that loads it compares its tensors with the log's digests (``run.
   checkpoint_state``).

Where the mix lies: ``--mix``, else the run's ``run.json`` - followed only when it names a
place of the same kind as the run URL (an s3:// run's mix on s3://, an http(s) run's on the
same host, or a path relative to the run): the run's files never choose which server an
auditor connects to. ``local_run`` is the helper every ``open1b-audit`` command calls first:
a local run directory is returned as it is; a URL becomes a verified cache directory.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from open1b.safeio import write_atomic
from open1b_audit.crowd.source import RunSource, SourceError, confined, is_url
from open1b_train.recipe import Announcement

CACHE_ENV = "OPEN1B_CACHE"


def default_root(url: str) -> str:
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                     "open1b")
    return os.path.join(base, "runs", hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16])


def _link_or_copy(src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.lexists(dst):
        os.unlink(dst)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


class RunCache:
    """The verified local copy of what a step of a published run needs (module
    docstring)."""

    def __init__(self, source: RunSource, root: str, announce: Announcement = Announcement(),
                 mix: str | None = None, check_log: bool = True) -> None:
        self.source = source
        self.root = os.path.abspath(root)
        self.announce = announce
        self.mix_override = mix
        self.check_log = check_log          # False: the caller checks the chain (``chain``)
        self.run_dir = os.path.join(self.root, "run")
        self.mirror = os.path.join(self.root, "mix")
        self._lines: list[dict] | None = None
        self._mix_url: str | None = None
        self.mix_source: RunSource | None = None
        self.cfg = None
        self._published: list[int] | None = None

    # ------------------------------------------------------------------ the log

    @property
    def lines(self) -> list[dict[str, Any]]:
        if self._lines is None:
            self._lines = self._log()
        return self._lines

    def _log(self) -> list[dict[str, Any]]:
        from open1b_train import chain, runlog

        path = runlog.path_of(self.run_dir)
        why = None
        for fresh in (False, True):
            if fresh or not os.path.exists(path):
                try:
                    self.source.download(runlog.NAME, path, "log")
                except FileNotFoundError:
                    raise SourceError(f"{self.source.url}: no steps.jsonl (not a published "
                                      f"run?)") from None
            log = runlog.read_log(self.run_dir)
            if not self.check_log:
                return log.lines
            why = chain.check(log.lines) if log.lines else "steps.jsonl has no complete line"
            if why is None and self.announce.run_hash is not None:
                why = chain.pin(log.lines, self.announce.run_hash, log.partial_bytes)
                if why is not None:
                    why = f"it is not the published run: {why}"
            if why is None:
                return log.lines
        raise SourceError(f"{self.source.url}: its log is not one chain ending in the "
                          f"announced run hash ({why}); nothing from it can be checked")

    @property
    def run_hash(self) -> str:
        return self.lines[-1]["hash"]

    # ------------------------------------------------------------------ the config

    def config(self):
        from open1b_train.published import hashed_config
        from open1b_train.run import CONFIG

        if self.cfg is None:
            path = os.path.join(self.run_dir, CONFIG)
            if not os.path.exists(path):
                self.source.download(CONFIG, path, "config")
            genesis = self.lines[0]["genesis"]
            cfg = hashed_config(self.run_dir, genesis)
            why = self.announce.refusal(genesis, cfg.preset)
            if why:
                raise SourceError(f"{self.source.url}: {why}")
            self.cfg = cfg
        return self.cfg

    # ------------------------------------------------------------------ the mix

    @property
    def mix_url(self) -> str:
        if self._mix_url is None:
            self._mix_url = self.mix_override or self._named_mix()
            self.mix_source = RunSource(self._mix_url)
        return self._mix_url

    def _named_mix(self) -> str:
        from open1b.safeio import parse_json
        from open1b_train.run import RUN_INFO

        try:
            info = parse_json(self.source.read(RUN_INFO, "config"), RUN_INFO, SourceError)
        except FileNotFoundError:
            raise SourceError(f"{self.source.url}: no {RUN_INFO} names the run's mix; pass "
                              f"--mix URL") from None
        mix = info.get("mix") if isinstance(info, dict) else None
        if not isinstance(mix, str) or not mix:
            raise SourceError(f"{self.source.url}/{RUN_INFO} names no mix; pass --mix URL")
        return named_mix(self.source.url, mix)

    def mirror_mix(self) -> str:
        """The verified local mirror of the mix's metadata (module docstring, 3)."""
        from open1b_data.errors import ShardFormatError
        from open1b_data.formats.manifest import parse_manifest, tokenizer_files
        from open1b_data.formats.shards import lengths_digest, parse_lengths
        from open1b_data.formats.tokenizerfile import verified_tokenizer_files

        done = os.path.join(self.mirror, ".complete")
        manifest_path = os.path.join(self.mirror, "manifest.json")
        genesis = self.lines[0]["genesis"]
        if os.path.exists(done):
            with open(manifest_path, "rb") as f:
                manifest = parse_manifest(f.read(), manifest_path)
            if manifest.fingerprint == genesis.get("mix_fingerprint"):
                return self.mirror
        raw = self.mix_source_().read("manifest.json", "mix")
        manifest = parse_manifest(raw, f"{self.mix_url}/manifest.json")
        if manifest.fingerprint != genesis.get("mix_fingerprint"):
            raise SourceError(f"mix {self.mix_url} has fingerprint {manifest.fingerprint[:16]}"
                              f"..., the run's genesis names {str(genesis.get('mix_fingerprint'))[:16]}"
                              f"...: it is not the run's mix (pass --mix with the right one)")
        os.makedirs(self.mirror, exist_ok=True)
        names = [f["path"] for f in tokenizer_files(manifest.tokenizer)]
        for rel, data in verified_tokenizer_files(self.mix_url, manifest).items():
            self.mix_source.count("mix", len(data))
            self._put(os.path.join(self.mirror, rel), data)
        for _, shard in manifest.shards():
            data = self.mix_source.read(shard.lengths_path, "mix")
            try:                        # by content, as the manifest records it (v2)
                same = (lengths_digest(parse_lengths(data, shard.lengths_path))
                        == shard.lengths_content)
            except ShardFormatError:
                same = False
            if not same:
                raise SourceError(f"{self.mix_url}/{shard.lengths_path}: its counts are not "
                                  f"the manifest's; the mix was altered - use the mix as built")
            self._put(os.path.join(self.mirror, shard.lengths_path), data)
        self._put(manifest_path, raw)
        self._put(done, json.dumps({"fingerprint": manifest.fingerprint,
                                    "tokenizer": names}).encode())
        return self.mirror

    @property
    def replay_mix(self) -> str:
        """The mix a replay of this run opens: the verified mirror (the step's windows come
        from proved documents, ``windows.py``) - or, for a run that logs validation losses
        (``eval_every``), the mix itself: its held-out windows are read from whole shards,
        which the mirror does not hold (those reads are not counted)."""
        return self.mix_url if self.config().eval_every else self.mirror_mix()

    def mix_source_(self) -> RunSource:
        """The mix's source (reading ``mix_url`` opens it)."""
        if self.mix_source is None:
            self.mix_source = RunSource(self.mix_url)
        return self.mix_source

    @staticmethod
    def _put(path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, data, fsync=False)

    # ------------------------------------------------------------------ checkpoints

    def published_steps(self) -> list[int]:
        """The steps 1..N with a published checkpoint."""
        if self._published is None:
            last = len(self.lines) - 1
            every = max(1, int(getattr(self.config(), "checkpoint_every", 0) or 1))
            candidates = sorted(set(range(every, last + 1, every)) | {last})
            self._published = [s for s in self.source.checkpoint_steps(candidates)
                               if 0 < s <= last]
        return self._published

    def checkpoint(self, step: int, what: str = "checkpoint", params_only: bool = False) -> str:
        """The published checkpoint of ``step`` in the cache (module docstring, 4);
        ``params_only``: its record and parameters alone (the released weights)."""
        from open1b_train import checkpoint
        from open1b_train.checkpoint import read_record

        whole = os.path.join(self.root, "checkpoints", f"step-{step:08d}")
        final = whole + ("-params" if params_only else "")
        for have in (whole, final):
            if os.path.exists(os.path.join(have, ".verified")):
                return have
        rel = f"checkpoints/step-{step:08d}"
        tmp = os.path.join(os.path.dirname(whole), f".tmp-{step}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        self.source.download(f"{rel}/record.json", os.path.join(tmp, "record.json"), what)
        rec = read_record(tmp)                       # format, version, counters
        if rec["step"] != step:
            raise SourceError(f"{self.source.url}/{rel}/record.json records step "
                              f"{rec['step']}; the checkpoint was moved or edited")
        why = checkpoint.record_difference(rec, self.lines, step)
        if why:
            raise SourceError(f"{self.source.url}/{rel}: {why}")
        files = rec.get("files")
        if not isinstance(files, dict) or "params.safetensors" not in files:
            raise SourceError(f"{self.source.url}/{rel}/record.json lists no parameters file; "
                              f"corrupt")
        for name, want in sorted(files.items()):
            confined(name)
            if params_only and name != "params.safetensors":
                continue
            got = self.source.download(f"{rel}/{name}", os.path.join(tmp, name), what)
            if got != want:
                raise SourceError(f"{self.source.url}/{rel}/{name}: sha256 {got[:16]}... is "
                                  f"not the {str(want)[:16]}... its record lists; the "
                                  f"checkpoint is corrupt or was edited")
        with open(os.path.join(tmp, ".verified"), "w") as f:
            f.write(self.lines[step]["hash"])
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        return final

    # ------------------------------------------------------------------ run directories

    def leg_dir(self, name: str, states: dict[int, str] | None = None) -> str:
        """A run directory for one piece of work: the log and config linked in, ``run.json``
        naming the mirrored mix, and the checkpoint directories ``states`` ({step: cached
        directory}) linked under ``checkpoints/``."""
        from open1b_train import runlog
        from open1b_train.run import CONFIG, RUN_INFO

        self.config()
        d = os.path.join(self.root, "legs", name)
        os.makedirs(d, exist_ok=True)
        _link_or_copy(runlog.path_of(self.run_dir), runlog.path_of(d))
        _link_or_copy(os.path.join(self.run_dir, CONFIG), os.path.join(d, CONFIG))
        self._put(os.path.join(d, RUN_INFO), json.dumps({"mix": self.mirror}).encode())
        for step, src in (states or {}).items():
            self.link_state(src, d, step)
        return d

    @staticmethod
    def link_state(src: str, run_dir: str, step: int) -> str:
        from open1b_train import checkpoint

        dst = checkpoint.step_dir(run_dir, step)
        if os.path.exists(dst):
            shutil.rmtree(dst)
        for name in os.listdir(src):
            if not name.startswith("."):
                _link_or_copy(os.path.join(src, name), os.path.join(dst, name))
        return dst


@dataclass
class LocalRun:
    """What ``local_run`` gives a command: the run directory to read, the mix to pass
    (None: the one it names) and the window source for ``replay`` (None: the loader)."""

    dir: str
    mix: str | None = None
    windows: Any = None
    cache: RunCache | None = None
    notes: list[str] = field(default_factory=list)

    def fetched(self) -> dict | None:
        if self.cache is None:
            return None
        out = self.cache.source.totals()
        if self.cache.mix_source is not None:
            out["mix"] = out.get("mix", 0) + self.cache.mix_source.totals()["total"]
            out["total"] += self.cache.mix_source.totals()["total"]
        if self.windows is not None:
            out["data"] = self.windows.bytes_total
            out["total"] += self.windows.bytes_total
        return out


def local_run(run: str, need: str = "log", step: int | None = None,
              from_step: int | None = None, mix: str | None = None,
              announce: Announcement = Announcement(), cache: str | None = None) -> LocalRun:
    """``run`` as a local run directory: itself when it is one; a URL's verified cache
    otherwise, holding what ``need`` asks for - ``log`` (the log), ``config`` (and the
    config), ``released`` (and the last step's checkpoint), ``replay`` (and the mix's
    metadata, the checkpoint before ``step`` or at ``from_step``, the published checkpoint
    of ``step`` if there is one, and the step's proved windows), ``model`` (the mix's
    metadata), ``all`` (every published checkpoint up to ``step``; the mix as named)."""
    if not is_url(run):
        return LocalRun(run, mix)
    from open1b_audit.crowd.windows import ProvedWindows

    url = run[len("file://"):] if run.startswith("file://") else run
    rc = RunCache(RunSource(url), cache or default_root(url), announce, mix,
                  check_log=need != "log")
    rc.lines                                                  # noqa: B018 (checks the log)
    if need == "log":
        return LocalRun(rc.run_dir, None, None, rc)
    rc.config()
    if need in ("config", "released"):
        states = {}
        last = len(rc.lines) - 1
        if need == "released" and last in rc.published_steps():
            states[last] = rc.checkpoint(last, params_only=True)
        return LocalRun(rc.leg_dir("view", states), rc.mix_url, None, rc)
    if need == "model":
        rc.mirror_mix()
        return LocalRun(rc.leg_dir("view"), rc.mirror, None, rc)
    if need == "all":
        states = {s: rc.checkpoint(s) for s in rc.published_steps()
                  if step is None or s <= step}
        return LocalRun(rc.leg_dir("all", states), rc.mix_url, None, rc)
    rc.mirror_mix()
    published = rc.published_steps()
    c = from_step if from_step is not None else max([0] + [s for s in published if s < step])
    states = {c: rc.checkpoint(c)} if c else {}
    if step in published:
        states[step] = rc.checkpoint(step)
    d = rc.leg_dir(f"replay-{c}-{step}", states)
    return LocalRun(d, rc.replay_mix, ProvedWindows(rc), rc)


def named_mix(run_url: str, mix: str) -> str:
    """Where the mix that a run's ``run.json`` names lies, or a ``SourceError`` when it is
    not a place of the run URL's kind (module docstring): a relative path is taken
    relative to the run URL."""
    run = urlsplit(run_url if "://" in run_url else "file://" + os.path.abspath(run_url))
    if "://" not in mix and not os.path.isabs(mix):
        path = posixpath.normpath(posixpath.join(run.path, mix))
        return path if run.scheme == "file" else f"{run.scheme}://{run.netloc}{path}"
    named = urlsplit(mix if "://" in mix else "file://" + mix)
    if named.scheme != run.scheme or (run.scheme not in ("s3", "file") and
                                      named.netloc != run.netloc):
        raise SourceError(f"{run_url}/run.json names the mix {mix!r}, not a place of the "
                          f"run URL's kind: the run's files do not choose where this auditor "
                          f"connects; pass --mix URL")
    return mix
