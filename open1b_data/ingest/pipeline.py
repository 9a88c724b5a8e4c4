"""build-mix orchestration: a mix definition -> tokenizer, token shards and manifest.json.

Contract (what makes the output byte-identical whatever the worker count, task split or
completion order, and resumable after a kill at any point):

* The unit of work is ONE INPUT FILE. Inputs are listed per source (``list_inputs``) and
  numbered in one fixed global order: sources in mix order, inputs in listing order.
  Input ``j`` of source ``s`` writes only ``<s>/shard-<j:05d>-<k:05d>.parquet`` (+ its
  ``.lengths.npy``) for k = 0, 1, ... and then, LAST, its completion marker
  ``_work/inputs/<s>/<j:05d>.json`` (counts by reason, shard entries, input checksum,
  tokenizer sha256). Its outputs depend on nothing but the input and the tokenizer.
* Stages: (a) list inputs, record them in ``_work/plan.json`` (a rerun or another task
  that sees a different plan refuses to mix two builds in one directory); (b) tokenizer
  (``tokenizer/stage.py``): when ``tokenizer.json`` is absent, select the sample, train -
  or take the published tokenizer (``--tokenizer FROM``) - write the sample record then
  the tokenizer (both deterministic, atomic: racing tasks write identical bytes), and check
  its content against the expected digest when the definition or ``--expect-tokenizer``
  names one;
  (c) build the inputs this process owns (``--task i --tasks N``: global index % N == i)
  with ``--workers`` threads, or processes for large builds (``--executor``, see
  ``pool.choose_executor``), skipping inputs whose marker
  matches the input's size/checksum and the tokenizer; (d) merge: once every input has a
  marker, assemble ``manifest.json`` from the markers alone. A build without ``--task``
  always merges; a ``--task`` run merges only if it finds every marker (the last task to
  finish does it; concurrent merges write identical bytes); ``--merge-only`` merges or
  names what is missing. ``--tokenizer-only`` runs stages (a) and (b) and stops: the first
  job of a scaled-out build, so that N tasks do not each train the tokenizer.
* Every shard is checked (``task.py``): a deterministic sample of its documents (1%,
  between 2 and 64) is encoded by the reference HF tokenizer and by the fast encoder, and
  the ids stored in the written shard are read back and compared; any difference is a
  ``BuildError`` (the fast encoder is only trusted because this check runs).
* The manifest records nothing run-dependent: no time, no worker count, no output path;
  inputs by path relative to the source root + size + checksum; local source roots in the
  embedded definition relative to the mix file's directory. Its fingerprint is its content
  (``formats/identity.py``): where the sources are kept, the files' bytes and the library
  versions that wrote them do not enter it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from open1b.canonical import readable_json
from open1b_data import __version__
from open1b_data.ingest.report import InputSummary, Progress, SourceSummary, summarize
from open1b_data.storage import (atomic_write_bytes, exists, join, list_tree,
                                 read_bytes, read_json, sweep_temporaries, write_json)
from open1b_data.ingest.pool import EXECUTORS, Workers, choose_executor, run_jobs
from open1b_data.ingest.task import TOKENIZER, Job, hf_tokenizer, input_record, valid_marker
from open1b_data.errors import BuildError, StorageError
from open1b_data.formats.definition import MixSpec
from open1b_data.formats.tokenizerfile import content_digest

log = logging.getLogger("open1b_data.ingest.pipeline")

PLAN = "_work/plan.json"
SAMPLE_RECORD = "_work/tokenizer-sample.json"     # as tokenizer/stage.py writes it


@dataclass(frozen=True)
class BuildOptions:
    """How to run a build (none of it changes the output bytes)."""

    workers: int = 1
    task: int | None = None
    tasks: int = 1
    merge_only: bool = False
    tokenizer_only: bool = False  # stages (a) and (b) only: the first job of a task array
    progress: bool = True
    executor: str = "auto"  # threads | processes | auto (pool.choose_executor)
    # take the published tokenizer (a tokenizer.json or a built mix) instead of training
    tokenizer_from: str | None = None
    # the content digest the tokenizer must have (with the definition's [tokenizer] expect)
    expect_tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise BuildError(f"--workers must be >= 1, got {self.workers}")
        if self.tasks < 1:
            raise BuildError(f"--tasks must be >= 1, got {self.tasks}")
        if self.task is not None and not 0 <= self.task < self.tasks:
            raise BuildError(f"--task must be in [0, --tasks={self.tasks}), got {self.task}")
        if self.executor not in EXECUTORS:
            raise BuildError(f"--executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.task is None and self.tasks != 1:
            raise BuildError("--tasks needs --task i (which of the N tasks this process is)")
        if self.tokenizer_only and (self.merge_only or self.task is not None):
            raise BuildError("--tokenizer-only runs alone, before the --task runs; drop "
                             "--task/--tasks/--merge-only from it")

    def owns(self, g: int) -> bool:
        """Whether this task builds input ``g`` (its index in the global input order)."""
        return self.task is None or g % self.tasks == self.task


@dataclass(frozen=True)
class BuildResult:
    """What a build-mix run did; ``manifest`` is None when this run did not merge."""

    out: str
    merged: bool
    inputs_total: int
    inputs_built: int
    inputs_skipped: int
    missing: tuple[str, ...]
    summary: tuple[SourceSummary, ...]
    seconds: float
    documents: int
    tokens: int
    text_bytes: int
    fingerprint: str | None = None
    # the tokenizer's content digest (what [tokenizer] expect / --expect-tokenizer pin)
    tokenizer_content: str | None = None
    # This run's inputs (every input once merged), in the global input order.
    inputs: tuple[InputSummary, ...] = ()
    manifest: Any = field(default=None, repr=False)

    @property
    def unreadable(self) -> tuple[InputSummary, ...]:
        """The inputs that were truncated or unreadable (``build-mix --strict`` fails on
        them)."""
        return tuple(i for i in self.inputs if i.unreadable)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("manifest")
        return d


# --------------------------------------------------------------------------------------
# Stage (a): inputs and the plan.

def list_all_inputs(mix: MixSpec) -> dict[str, list[Any]]:
    from open1b_data.ingest.sources import list_inputs

    inputs = {}
    for spec in mix.sources:
        found = list_inputs(spec)
        if not found:
            raise BuildError(f"source {spec.name!r}: no input matches {list(spec.inputs)} under "
                             f"{spec.root!r}; check the source's root and inputs globs")
        inputs[spec.name] = list(found)
    return inputs


def portable_definition(mix: MixSpec) -> dict[str, Any]:
    """``mix.to_dict()`` with local roots relative to the mix file's directory, so the same
    definition gives the same manifest wherever the repository is checked out."""
    d = mix.to_dict()
    base = os.path.dirname(os.path.abspath(mix.path)) if mix.path else None
    for src in d["sources"]:
        for key in ("root", "content_store"):
            value = src.get(key)
            if base and value and "://" not in value and os.path.isabs(value):
                rel = os.path.relpath(value, base)
                if not rel.startswith(".."):
                    src[key] = rel.replace(os.sep, "/")
    return d


def _check_plan(out: str, plan: dict[str, Any]) -> None:
    """Refuse to mix two different builds in one output directory."""
    if exists(join(out, PLAN)):
        old = read_json(join(out, PLAN))
        if old != plan:
            what = "definition" if old.get("definition") != plan["definition"] else "inputs"
            raise BuildError(f"{out!r} already holds a build of a different mix ({what} "
                             f"differ from {join(out, PLAN)}); pass another --out or delete it")
    else:
        write_json(join(out, PLAN), plan)


# --------------------------------------------------------------------------------------
# Stage (b): the tokenizer (``tokenizer/stage.py``: trained or taken, pinned by content).

def _sha256_of(url: str) -> str:
    return hashlib.sha256(read_bytes(url)).hexdigest()


# --------------------------------------------------------------------------------------
# Stage (d): merge the markers into manifest.json.

def merge(mix: MixSpec, out: str, jobs: list[Job], found: dict[Job, dict | None]) -> Any:
    """Assemble and write manifest.json from every input's marker; returns the manifest.
    Writes the transformers tokenizer directory first (deterministic bytes: concurrent
    merges write the same)."""
    from open1b_data.formats import manifest as mf
    from open1b_data.ingest.tokenizer.stage import recorded_content

    missing = [j for j in jobs if found.get(j) is None]
    if missing:
        raise BuildError(f"cannot merge {out!r}: {len(missing)} of {len(jobs)} inputs are not "
                         f"built, e.g. {missing[0].source}/{missing[0].input.path}; run the "
                         f"build (or the missing --task runs) first")
    markers: dict[str, list[dict[str, Any]]] = {s.name: [] for s in mix.sources}
    for job in sorted(jobs, key=lambda j: (_source_pos(mix, j.source), j.index)):
        markers[job.source].append(found[job])
    sha = jobs[0].tokenizer_sha256 if jobs else _sha256_of(join(out, TOKENIZER))
    tok = hf_tokenizer(out, sha)
    eot_id = tok.token_to_id(mix.tokenizer.eot)
    if eot_id is None:
        raise BuildError(f"{join(out, TOKENIZER)} has no {mix.tokenizer.eot!r} token; it was "
                         f"not trained for this mix (delete it and build again)")
    raw = read_bytes(join(out, TOKENIZER))
    content = recorded_content(out, raw, hashlib.sha256(raw).hexdigest())
    tokenizer = {"path": TOKENIZER, "sha256": hashlib.sha256(raw).hexdigest(),
                 "content": content, "vocab_size": tok.get_vocab_size(),
                 "eot_id": int(eot_id), "sample": read_json(join(out, SAMPLE_RECORD)),
                 "directory": _write_transformers_directory(mix, out, raw, content)}
    manifest = mf.assemble_manifest(mix.name, __version__, portable_definition(mix), tokenizer,
                                    _source_entries(mix, markers))
    mf.write_manifest(out, manifest)
    return manifest


def _write_transformers_directory(mix: MixSpec, out: str, raw: bytes, content: str
                                  ) -> dict[str, Any]:
    """``<out>/tokenizer/`` for ``transformers.AutoTokenizer.from_pretrained`` from
    ``tokenizer.json``'s bytes ``raw`` (content digest ``content``); returns its manifest
    record: the directory and each file's path, sha256 and content digest."""
    from open1b_data.ingest.tokenizer import HF_DIRECTORY, transformers_files

    files = transformers_files(raw, mix.tokenizer.eot, mix.schedule.seq_tokens)
    record = []
    for name, data in sorted(files.items()):
        rel = f"{HF_DIRECTORY}/{name}"
        atomic_write_bytes(join(out, rel), data)
        record.append({"path": rel, "sha256": hashlib.sha256(data).hexdigest(),
                       "content": content if data == raw else content_digest(rel, data)})
    return {"path": HF_DIRECTORY, "files": record}


def _source_pos(mix: MixSpec, name: str) -> int:
    return [s.name for s in mix.sources].index(name)


def _counts(markers: list[dict[str, Any]]) -> dict[str, Any]:
    dropped: Counter[str] = Counter()
    for m in markers:
        dropped.update(m["counts"]["dropped"])
    return {"read": sum(m["counts"]["read"] for m in markers),
            "kept": sum(m["counts"]["kept"] for m in markers),
            "dropped": dict(sorted(dropped.items())),
            "tokens": sum(m["tokens"] for m in markers)}


def _input_entry(marker: dict[str, Any]) -> dict[str, Any]:
    """A source's ``inputs[]`` entry: the file (path, size, checksum), its counts by reason,
    its first bad record and the shards it wrote (docs/FORMATS.md)."""
    return {**marker["input"], "counts": _counts([marker]),
            "first_error": marker.get("first_error"),
            "shards": [s["path"] for s in marker["shards"]]}


def _source_entries(mix: MixSpec, markers: dict[str, list[dict[str, Any]]]) -> list[dict]:
    return [{"spec": spec, "target_share": target, "counts": _counts(markers[spec.name]),
             "shards": [s for m in markers[spec.name] for s in m["shards"]],
             "inputs": [_input_entry(m) for m in markers[spec.name]]}
            for spec, target in zip(mix.sources, mix.target_shares())]


# --------------------------------------------------------------------------------------
# The entry point.

def build_mix(mix: MixSpec, out: str, options: BuildOptions = BuildOptions()) -> BuildResult:
    """Build (a task's share of) ``mix`` into ``out``; merge when every input is built."""
    t0 = time.perf_counter()
    _check_out(out)
    inputs = list_all_inputs(mix)
    owned = [i for g, i in enumerate(i for s in mix.sources for i in inputs[s.name])
             if options.owns(g)]
    kind = choose_executor(options.executor, sum(int(i.size) for i in owned), options.workers)
    # Workers start before the tokenizer stage: spawned helpers' interpreter start
    # overlaps tokenizer training.
    building = not (options.merge_only or options.tokenizer_only)
    with Workers(options.workers if building else 0, kind).start() as workers:
        return _build(mix, out, options, inputs, workers, t0)


def _check_out(out: str) -> None:
    """An output that cannot be written fails first, before inputs are listed and the
    tokenizer trained."""
    from open1b_data.storage import ensure_writable_dir

    try:
        ensure_writable_dir(out)
    except StorageError as e:
        raise BuildError(f"--out: {e}") from e


def _build(mix: MixSpec, out: str, options: BuildOptions, inputs: dict[str, list[Any]],
           workers: Workers, t0: float) -> BuildResult:
    progress = Progress(0, enabled=options.progress)
    plan = json.loads(readable_json({  # through JSON: compared with the plan file as read back
        "definition": portable_definition(mix),
        "inputs": {name: [input_record(i) for i in lst] for name, lst in inputs.items()}}))
    _check_plan(out, plan)
    if options.task is None and not (options.merge_only or options.tokenizer_only):
        # A whole build owns its directory: debris of a killed run's writers can go.
        swept = sweep_temporaries(out)
        if swept:
            log.info("removed %d temporary file(s) left by an interrupted build", swept)
    if options.merge_only and not exists(join(out, TOKENIZER)):
        raise BuildError(f"--merge-only: {join(out, TOKENIZER)} does not exist; build first")
    from open1b_data.ingest.tokenizer.stage import ensure_tokenizer

    sha = (_sha256_of(join(out, TOKENIZER)) if options.merge_only
           else ensure_tokenizer(mix, out, inputs, options.tokenizer_from,
                                 options.expect_tokenizer))
    jobs, g = [], 0
    for spec in mix.sources:
        for index, inp in enumerate(inputs[spec.name]):
            jobs.append((g, Job(mix, out, spec.name, index, inp, sha)))
            g += 1
    all_jobs = [j for _, j in jobs]
    mine = [] if options.merge_only or options.tokenizer_only else [
        j for g, j in jobs if options.owns(g)]
    existing = set(list_tree(out))
    todo = [j for j in mine if valid_marker(j, existing) is None]
    progress.total_inputs = len(mine)
    progress.inputs_done = len(mine) - len(todo)
    progress.restart()  # rates count the input stage only, not listing and training
    if todo:
        log.info("building %d inputs (%d already done) with %d worker %s", len(todo),
                 len(mine) - len(todo), options.workers, workers.kind)
        run_jobs(todo, workers, progress)
    progress.maybe_print(force=bool(todo))
    existing = set(list_tree(out))
    found = {j: valid_marker(j, existing) for j in all_jobs}
    missing = tuple(f"{j.source}/{j.input.path}" for j in all_jobs if found[j] is None)
    manifest = None
    if options.tokenizer_only:
        pass
    elif not missing or options.merge_only:
        manifest = merge(mix, out, all_jobs, found)  # names what is missing (--merge-only)
    elif options.task is None:
        raise BuildError(f"inputs still missing after the build: {list(missing[:5])}")
    per_source = _per_source(mix, found)
    reported = all_jobs if manifest is not None else mine
    return BuildResult(
        out=out, merged=manifest is not None, inputs_total=len(all_jobs),
        inputs_built=len(todo), inputs_skipped=len(mine) - len(todo), missing=missing,
        summary=summarize(per_source), seconds=time.perf_counter() - t0,
        documents=progress.documents, tokens=progress.tokens, text_bytes=progress.text_bytes,
        fingerprint=None if manifest is None else manifest.fingerprint,
        tokenizer_content=(manifest.tokenizer["content"] if manifest is not None else
                           _tokenizer_content(out)),
        inputs=tuple(InputSummary.from_marker(found[j]) for j in reported
                     if found[j] is not None),
        manifest=manifest)


def _tokenizer_content(out: str) -> str:
    from open1b_data.ingest.tokenizer.stage import recorded_content

    raw = read_bytes(join(out, TOKENIZER))
    return recorded_content(out, raw, hashlib.sha256(raw).hexdigest())


def _per_source(mix: MixSpec, found: dict[Job, dict | None]) -> dict[str, dict[str, Any]]:
    """Counts over the inputs built so far (all of them once merged)."""
    markers: dict[str, list[dict[str, Any]]] = {s.name: [] for s in mix.sources}
    for job, m in found.items():
        if m is not None:
            markers[job.source].append(m)
    return {name: _counts(ms) for name, ms in markers.items()}
