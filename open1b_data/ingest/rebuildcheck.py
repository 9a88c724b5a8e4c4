"""Checking a published mix against the upstream sources: rebuild, compare content.

Contract (docs/FORMATS.md, "Checking a published mix against its sources"):
``rebuild_check(mix_url, roots, sample=K)`` reads the published manifest (its fingerprint
recomputed, as every reader does) and its tokenizer (checked by content), rebuilds inputs
from the upstream files - where the sources are kept here: ``roots`` maps source names to
local paths or URLs (the manifest's own roots otherwise) - with the published tokenizer,
exactly as ``build-mix`` builds them, and compares what they give with what the manifest
records, by content:

* which inputs: all of them, or with ``sample=K`` the inputs that wrote K shards drawn
  uniformly from the mix's shards with a seeded SHA-256 order (``seed``), so a check of K
  shards costs about K shards' work whatever the size of the mix. An input's shards are
  built together, so each drawn shard brings its input's other shards (usually none);
* per input: its listing is the published one (same relative path), its counts by reason,
  its first bad record (reason and row), and the documents of each of its shards - the
  Merkle root, document lengths and held-out rows the manifest records. A shard whose
  rebuild differs is read from the published mix (any fsspec URL, e.g. ``s3://``) and
  compared document by document to name the first differing document and field (tokens
  and the first differing position, doc_id, input, row), or to say that the published
  shard matches the rebuild and the manifest's record of it does not;
* a full check (no ``sample``) also assembles the rebuilt manifest and compares its
  fingerprint with the published one: that equality is the whole claim "these sources
  give this mix". With ``retrain_tokenizer`` the tokenizer is trained again from the
  sources (its sample record is the published one's rule) and its content compared too.

The result is a ``RebuildReport``: ``differences`` (one line each, empty when everything
matches) and what was compared. Nothing of the published mix is trusted before it is
compared: the manifest is the claim under test.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from open1b_data.errors import BuildError, Open1bDataError
from open1b_data.formats.definition import MixSpec, spec_from_definition
from open1b_data.formats.manifest import BuiltManifest, load_manifest
from open1b_data.formats.mixpath import mix_root, resolve
from open1b_data.storage import atomic_write_bytes, join, write_json

DEFAULT_SEED = 0


@dataclass
class RebuildReport:
    """What a rebuild check compared and what differed (module docstring)."""

    mix: str
    name: str
    fingerprint: str
    sample: int | None
    inputs_checked: int = 0
    inputs_total: int = 0
    shards_checked: int = 0
    shards_total: int = 0
    documents: int = 0
    tokens: int = 0
    rebuilt_fingerprint: str | None = None     # full checks only
    differences: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {"mix": self.mix, "name": self.name, "fingerprint": self.fingerprint,
                "sample": self.sample, "inputs_checked": self.inputs_checked,
                "inputs_total": self.inputs_total, "shards_checked": self.shards_checked,
                "shards_total": self.shards_total, "documents": self.documents,
                "tokens": self.tokens, "rebuilt_fingerprint": self.rebuilt_fingerprint,
                "verdict": "MATCH" if self.matches else "DIFFER",
                "differences": list(self.differences)}


def sample_shards(manifest: BuiltManifest, k: int, seed: int = DEFAULT_SEED) -> list[str]:
    """K shard paths drawn without replacement, in the order of SHA-256 over
    ``"<seed>/<shard path>"`` (any K of a mix are as likely; another seed, another slice)."""
    paths = [sh.path for _, sh in manifest.shards()]
    key = lambda p: hashlib.sha256(f"{seed}/{p}".encode()).digest()      # noqa: E731
    return sorted(paths, key=key)[:max(0, k)]


def _spec(manifest: BuiltManifest, roots: dict[str, str],
          content_stores: dict[str, str]) -> MixSpec:
    unknown = sorted(set(roots) - {s.name for s in manifest.sources})
    if unknown:
        raise BuildError(f"--sources names {unknown}, which mix {manifest.name!r} does not "
                         f"have; its sources: {[s.name for s in manifest.sources]}")
    return spec_from_definition(manifest.definition, roots, content_stores,
                                base_dir=os.getcwd())


def rebuild_check(mix_url: str, roots: dict[str, str] | None = None,
                  content_stores: dict[str, str] | None = None, sample: int | None = None,
                  seed: int = DEFAULT_SEED, workers: int = 1, work: str | None = None,
                  retrain_tokenizer: bool = False, progress: bool = False) -> RebuildReport:
    """Rebuild all (or a sample of) the inputs of the mix at ``mix_url`` from the sources
    and compare them with it (module docstring)."""
    from open1b_data.formats.tokenizerfile import verified_tokenizer_files
    from open1b_data.ingest.sources import list_inputs

    root = mix_root(mix_url)
    manifest = load_manifest(root)
    spec = _spec(manifest, roots or {}, content_stores or {})
    report = RebuildReport(root, manifest.name, manifest.fingerprint, sample,
                           shards_total=len(manifest.shards()),
                           inputs_total=sum(len(s.inputs) for s in manifest.sources))
    wanted = None if sample is None else set(sample_shards(manifest, sample, seed))
    tmp = work or tempfile.mkdtemp(prefix="open1b-rebuild-check-")
    try:
        tokenizer_files = verified_tokenizer_files(root, manifest)
        atomic_write_bytes(join(tmp, "tokenizer.json"),
                           tokenizer_files[manifest.tokenizer["path"]])
        write_json(join(tmp, "_work/tokenizer-sample.json"),
                   manifest.tokenizer.get("sample") or {})
        jobs, published = [], {}
        for src in manifest.sources:
            listed = {i.path: i for i in list_inputs(spec.source(src.name), checksums=False)}
            names = [i["path"] for i in src.inputs]
            report.differences.extend(_listing(src.name, names, listed))
            for index, entry in enumerate(src.inputs):
                if entry["path"] not in listed:
                    continue
                mine = [s for s in src.shards if s.path in set(entry.get("shards", []))]
                if wanted is not None and not wanted & {s.path for s in mine}:
                    continue
                jobs.append(_job(spec, tmp, src.name, index, listed[entry["path"]]))
                published[(src.name, index)] = (entry, mine)
        _build(jobs, workers, progress)
        for job in jobs:
            entry, mine = published[(job.source, job.index)]
            _compare_input(report, root, job, entry, mine)
        if sample is None and not report.differences:
            report.rebuilt_fingerprint = _full(spec, tmp, jobs, manifest)
            if report.rebuilt_fingerprint != manifest.fingerprint:
                report.differences.append(
                    f"the rebuilt mix has fingerprint {report.rebuilt_fingerprint}, the "
                    f"published one {manifest.fingerprint}; every shard matched, so the "
                    f"manifest's other content differs (definition, tokenizer record, "
                    f"counts, shares)")
        if retrain_tokenizer:
            report.differences.extend(_retrain(spec, tmp, manifest))
    finally:
        if work is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return report


def _listing(source: str, names: list[str], listed: dict[str, Any]) -> list[str]:
    out = [f"{source}: input {p} of the published mix is not in the sources" for p in names
           if p not in listed]
    extra = sorted(set(listed) - set(names))
    if extra:
        out.append(f"{source}: {len(extra)} input(s) in the sources that the published mix "
                   f"does not list, e.g. {extra[0]}")
    return out


def _job(spec: MixSpec, out: str, source: str, index: int, inp: Any):
    """The build job of one input, its checksum taken now (only the inputs checked)."""
    from open1b_data.ingest.sources import InputFile
    from open1b_data.ingest.task import Job
    from open1b_data.storage import checksum_of, url_to_fs

    fs, path = url_to_fs(inp.url)
    checksum = checksum_of(fs, path, fs.info(path))
    sha = hashlib.sha256(open(os.path.join(out, "tokenizer.json"), "rb").read()).hexdigest()
    return Job(spec, out, source, index, InputFile(inp.path, inp.url, inp.size, checksum), sha)


def _build(jobs: list, workers: int, progress: bool) -> None:
    from open1b_data.ingest.report import Progress
    from open1b_data.ingest.pool import Workers, choose_executor, run_jobs

    if not jobs:
        return
    kind = choose_executor("auto", sum(int(j.input.size) for j in jobs), workers)
    with Workers(workers, kind).start() as pool:
        run_jobs(jobs, pool, Progress(len(jobs), enabled=progress))


def _read_marker(job) -> dict:
    from open1b_data.storage import read_json

    return read_json(join(job.out, job.marker))


def _compare_input(report: RebuildReport, root: str, job, entry: dict, mine: list) -> None:
    from open1b_data.formats.manifest import ShardEntry

    marker = _read_marker(job)
    report.inputs_checked += 1
    where = f"{job.source} input {entry['path']}"
    counts = entry.get("counts") or {}
    got = {"read": marker["counts"]["read"], "kept": marker["counts"]["kept"],
           "dropped": marker["counts"]["dropped"], "tokens": marker["tokens"]}
    for key in ("read", "kept", "dropped", "tokens"):
        if key in counts and counts[key] != got[key]:
            report.differences.append(f"{where}: {key} {got[key]} rebuilt, {counts[key]} "
                                      f"published")
    first, want = marker.get("first_error"), entry.get("first_error")
    if want is not None or first is not None:
        pick = lambda e: None if e is None else (e.get("reason"), e.get("row"))  # noqa: E731
        if pick(first) != pick(want):
            report.differences.append(f"{where}: first bad record {pick(first)} rebuilt, "
                                      f"{pick(want)} published")
    rebuilt = [ShardEntry.from_dict(s) for s in marker["shards"]]
    if len(rebuilt) != len(mine):
        report.differences.append(f"{where}: {len(rebuilt)} shard(s) rebuilt, {len(mine)} "
                                  f"published")
    for new, old in zip(rebuilt, mine):
        report.shards_checked += 1
        report.documents += new.documents
        report.tokens += new.tokens
        same = (new.merkle.root, new.lengths_content, new.heldout, new.documents,
                new.tokens) == (old.merkle and old.merkle.root, old.lengths_content,
                                old.heldout, old.documents, old.tokens)
        if not same:
            report.differences.append(_first_difference(root, job.out, new, old))


def _first_difference(root: str, out: str, new: Any, old: Any) -> str:
    """The first document and field where a rebuilt shard and the published one differ."""
    from open1b_data.formats.shards import iter_documents

    label = f"shard {old.path}"
    try:
        theirs = iter_documents(resolve(root, old.path))
        for i, (a, b) in enumerate(zip(iter_documents(join(out, new.path)), theirs)):
            if a.tokens.size != b.tokens.size or (a.tokens != b.tokens).any():
                n = min(a.tokens.size, b.tokens.size)
                k = next((j for j in range(n) if a.tokens[j] != b.tokens[j]), n)
                show = lambda t: int(t[k]) if k < t.size else "end"   # noqa: E731
                return (f"{label} row {i} (doc_id {b.doc_id!r}): tokens differ at position "
                        f"{k}: rebuilt {show(a.tokens)}, published {show(b.tokens)} "
                        f"({a.tokens.size} vs {b.tokens.size} tokens)")
            for name in ("doc_id", "input", "row"):
                if getattr(a, name) != getattr(b, name):
                    return (f"{label} row {i}: {name} differs: rebuilt {getattr(a, name)!r}, "
                            f"published {getattr(b, name)!r}")
    except Open1bDataError as e:
        return f"{label}: the published shard cannot be read ({e})"
    if new.documents != old.documents:
        return (f"{label}: {new.documents} documents rebuilt, {old.documents} published "
                f"(the first {min(new.documents, old.documents)} agree)")
    if new.heldout != old.heldout:
        return f"{label}: held-out rows differ: rebuilt {new.heldout}, published {old.heldout}"
    return (f"{label}: the published shard's documents are the rebuilt ones, but the "
            f"manifest's record of them (Merkle root, lengths) is not: the manifest was "
            f"edited")


def _full(spec: MixSpec, out: str, jobs: list, published: BuiltManifest) -> str:
    """The fingerprint of the manifest assembled from the rebuilt inputs."""
    from open1b_data.ingest.pipeline import merge

    found = {j: _read_marker(j) for j in jobs}
    return merge(spec, out, jobs, found).fingerprint


def _retrain(spec: MixSpec, out: str, published: BuiltManifest) -> list[str]:
    """The tokenizer trained again from the sources, compared by content."""
    from open1b_data.formats.tokenizerfile import TOKENIZER_JSON, content_digest
    from open1b_data.ingest.pipeline import list_all_inputs
    from open1b_data.ingest.tokenizer.stage import _trained, tokenizers_version

    raw, _ = _trained(spec, list_all_inputs(spec))
    got = content_digest(TOKENIZER_JSON, raw)
    if got == published.tokenizer["content"]:
        return []
    return [f"tokenizer: trained again here (tokenizers {tokenizers_version()}) it has content "
            f"{got}, the published one {published.tokenizer['content']}"]
