"""One build-mix task: a single input file -> its token shards and completion marker.

Contract: ``build_input(job)`` reads input ``job.index`` of ``job.source`` through the
source's reader (which applies the filters and turns every bad record into a ``Dropped``),
encodes the kept documents with the fast encoder in batches, writes
``<source>/shard-<index:05d>-<k:05d>.parquet`` (+ ``.lengths.npy``, ``.merkle``) through
``ShardWriter`` and, LAST, the marker ``_work/inputs/<source>/<index:05d>.json``. Its output
depends only on the input and the tokenizer - never on which process or machine runs it,
or when - which is what makes builds byte-identical across worker counts and task splits
and lets a rerun skip any input whose marker matches (``valid_marker``; a marker from
before content identity does not match, so that input is built again).

Before the marker is written, every shard is checked: a deterministic uniform sample of its
documents (``sample_size``: 1% of them, between 1 and 64) is encoded by the reference HF
tokenizer and compared with the ids the fast encoder gave (``check_equivalence``), and the
ids stored in the written shard are read back and compared with them; any difference
raises ``BuildError``.

The tasks run where ``pool.py`` puts them (threads of this process or helper processes);
the encoders are loaded once per process (``encoders``) and shared by its threads.
"""
from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from open1b_data.storage import join, read_json, write_json
from open1b_data.errors import BuildError
from open1b_data.formats.definition import MixSpec

log = logging.getLogger("open1b_data.ingest.pipeline")

EQUIVALENCE_SAMPLE = 64  # at most this many documents per shard encoded by both encoders
EQUIVALENCE_MIN = 1      # at least this many documents per shard
ENCODE_BATCH_DOCS = 256  # documents per fast-encoder call: amortizes per-call overhead
TOKENIZER = "tokenizer.json"


@dataclass(frozen=True)
class Job:
    """One input file to build: everything a worker process needs, picklable."""

    mix: MixSpec
    out: str
    source: str
    index: int  # index of the input within its source (names its shards and marker)
    input: Any  # sources.InputFile
    tokenizer_sha256: str

    @property
    def marker(self) -> str:
        return f"_work/inputs/{self.source}/{self.index:05d}.json"

    @property
    def prefix(self) -> str:
        return join(self.out, f"{self.source}/shard-{self.index:05d}")


def input_record(inp: Any) -> dict[str, Any]:
    """An input as the manifest lists it: relative path, size, sha256 or etag."""
    return inp.manifest_entry()


# --------------------------------------------------------------------------------------
# Stage (c): one input -> its shards and marker (runs in a worker thread or process).

_WORKER: dict[str, Any] = {}
_ENCODERS_LOCK = threading.Lock()


def encoders(out: str, sha: str) -> tuple[Any, Any]:
    """The HF tokenizer and the fast encoder, built once per process and shared by its
    threads (both are safe to call from several threads)."""
    key = (out, sha)
    with _ENCODERS_LOCK:
        if _WORKER.get("encoders_key") != key:
            from open1b_data.ingest import tokenizer as tk

            tok = tk.load_tokenizer(join(out, TOKENIZER))
            _WORKER["encoders"] = (tok, tk.FastEncoder.from_tokenizer(tok))
            _WORKER["encoders_key"] = key
        return _WORKER["encoders"]


def hf_tokenizer(out: str, sha: str) -> Any:
    """The HF tokenizer: the one this process's jobs loaded, else read now."""
    with _ENCODERS_LOCK:
        if _WORKER.get("encoders_key") == (out, sha):
            return _WORKER["encoders"][0]
    from open1b_data.ingest import tokenizer as tk

    return tk.load_tokenizer(join(out, TOKENIZER))


def forget_encoders() -> None:
    """Drop this process's cached encoders (the next job loads them again, as a fresh
    command does); benchmarks use it to time what a command pays."""
    with _ENCODERS_LOCK:
        _WORKER.pop("encoders", None)
        _WORKER.pop("encoders_key", None)


def valid_marker(job: Job, existing: set[str]) -> dict[str, Any] | None:
    """The input's marker if it matches this input and tokenizer and every file it names
    is in ``existing`` (one listing of the output, not one request per file); else None."""
    if job.marker not in existing:
        return None
    try:
        m = read_json(join(job.out, job.marker))
    except (ValueError, OSError):
        return None
    if (m.get("input") != input_record(job.input)
            or m.get("tokenizer_sha256") != job.tokenizer_sha256
            or "first_error" not in m):  # a marker from before per-input accounting
        return None
    # A marker from before content identity (no ``lengths.content``: its tree's leaves
    # covered the tokens alone) is stale: that input is built again, so a mix never mixes
    # the two kinds of roots.
    if not all(s["path"] in existing and s["lengths"]["path"] in existing
               and "content" in s["lengths"] and "merkle" in s
               and s["merkle"]["path"] in existing
               for s in m.get("shards", [])):
        return None
    return m


def build_input(job: Job, report: Callable[[tuple[int, int, int]], None] | None = None
                ) -> dict[str, Any]:
    """Read, filter, encode and shard one input; check the encoders; write the marker.
    ``report`` receives (documents, tokens, text bytes) after every encoded batch."""
    from open1b_data.ingest.document import BAD_INPUT_REASONS, Dropped
    from open1b_data.formats.shards import ShardWriter, read_rows
    from open1b_data.ingest.sources import read_input
    from open1b_data.ingest import tokenizer as tk

    spec = job.mix.source(job.source)
    tok, fast = encoders(job.out, job.tokenizer_sha256)
    writer = ShardWriter(job.prefix, job.source, job.mix.shards,
                         heldout=job.mix.heldout_fraction(job.source))
    dropped: Counter[str] = Counter()
    # A reservoir of documents per shard for the encoder check; the RNG is seeded by the
    # input path so the sample, like the output, is the same on every run.
    rng = random.Random(hashlib.sha256(f"{job.source}/{job.input.path}".encode()).digest())
    # shard -> [(document index, text, ids, input row)]
    reservoirs: dict[int, list[tuple[int, str, Any, int]]] = {}
    seen_in_shard: Counter[int] = Counter()
    kept = tokens = text_bytes = 0
    batch: list[Any] = []

    def flush() -> None:
        nonlocal kept, tokens, text_bytes
        if not batch:
            return
        texts = [d.text for d in batch]
        ids = fast.encode_batch(texts)
        nbytes = 0
        for doc, arr, text in zip(batch, ids, texts):
            # The document lands in the shard after the ones closed so far.
            _reservoir_add(reservoirs, seen_in_shard, rng, len(writer.entries),
                           (kept, text, arr, doc.row))
            writer.add(arr, doc.doc_id, doc.input, doc.row)
            kept += 1
            tokens += len(arr)
            nbytes += len(text.encode("utf-8"))
        text_bytes += nbytes
        if report is not None:
            report((len(batch), sum(len(a) for a in ids), nbytes))
        batch.clear()

    first_error: dict[str, Any] | None = None
    for item in read_input(spec, job.input):
        if isinstance(item, Dropped):
            dropped[item.reason] += 1
            _log_dropped(job, item)
            if first_error is None and item.reason in BAD_INPUT_REASONS:
                first_error = {"reason": item.reason, "row": item.row, "detail": item.detail}
            continue
        batch.append(item)
        if len(batch) >= ENCODE_BATCH_DOCS:
            flush()
    flush()
    entries = list(writer.close())
    _check_shards(job, tok, fast, entries, reservoirs, rng, tk.check_equivalence, read_rows)
    marker = {
        "source": job.source,
        "index": job.index,
        "input": input_record(job.input),
        "tokenizer_sha256": job.tokenizer_sha256,
        "counts": {"read": kept + sum(dropped.values()), "kept": kept,
                   "dropped": dict(sorted(dropped.items()))},
        "first_error": first_error,  # the first bad-input drop (not a filter's): where, why
        "tokens": tokens,
        "text_bytes": text_bytes,
        "shards": [_entry_dict(e) for e in entries],
    }
    write_json(join(job.out, job.marker), marker)  # last: the completion marker
    return marker


def _reservoir_add(reservoirs: dict, seen: Counter, rng: random.Random, shard: int,
                   item: tuple[int, str, Any, int]) -> None:
    """Algorithm R: ``reservoirs[shard]`` stays a uniform sample of that shard's documents."""
    res = reservoirs.setdefault(shard, [])
    seen[shard] += 1
    if len(res) < EQUIVALENCE_SAMPLE:
        res.append(item)
    else:
        j = rng.randrange(seen[shard])
        if j < EQUIVALENCE_SAMPLE:
            res[j] = item


def sample_size(documents: int) -> int:
    """Documents of one shard encoded by both encoders: 1% of them (rounded down), at least
    ``EQUIVALENCE_MIN`` and at most ``EQUIVALENCE_SAMPLE``. The HF reference encoder is
    ~6x slower than the fast one, so the check costs about 6% of the encoding on small
    shards and far less on Mix 0626's (tens of thousands of documents, 64 checked)."""
    return min(documents, EQUIVALENCE_SAMPLE, max(EQUIVALENCE_MIN, documents // 100))


def _check_shards(job: Job, tok: Any, fast: Any, entries: list[Any], reservoirs: dict,
                  rng: random.Random, check_equivalence: Any, read_rows: Any) -> None:
    """Both encoders agree on a sample of every shard, and the shard holds those ids."""
    start = 0
    for n, e in enumerate(entries):
        res = sorted(reservoirs.get(n, []), key=lambda item: item[0])
        k = sample_size(int(e.documents))
        if k > len(res) or (res and not start <= res[0][0] < start + int(e.documents)):
            raise BuildError(f"{e.path}: the encoder-check sample does not match the shard "
                             f"written (a bug in ingest/task.py); the build stops rather than "
                             f"trust an unchecked shard")
        picked = sorted(rng.sample(res, k), key=lambda item: item[0])
        # The fast side is the ids this build encoded and stored, not a fresh encoding.
        labels = [f"{e.path} row {i - start} (input {job.source}/{job.input.path} row {row})"
                  for i, _, _, row in picked]
        check_equivalence(tok, fast, [text for _, text, _, _ in picked],
                          [ids for _, _, ids, _ in picked], labels)
        stored = read_rows(join(job.out, e.path), [i - start for i, _, _, _ in picked])
        for label, (_, _, want, _), got in zip(labels, picked, stored):
            if not np.array_equal(got, want):
                raise BuildError(f"{label}: the shard holds tokens that differ from the ids "
                                 f"encoded for it; the shard writer is inconsistent")
        start += int(e.documents)


def _entry_dict(e: Any) -> dict[str, Any]:
    if hasattr(e, "to_dict"):
        return e.to_dict()
    return {"path": e.path, "sha256": e.sha256, "bytes": e.bytes, "documents": e.documents,
            "tokens": e.tokens, "lengths": {"path": e.lengths_path,
                                            "content": e.lengths_content}}


def _log_dropped(job: Job, item: Any) -> None:
    from open1b_data.ingest.document import FILTER_REASONS

    # Filter drops are the expected outcome of the three ingest filters; bad input is not.
    level = logging.DEBUG if item.reason in FILTER_REASONS else logging.WARNING
    log.log(level, "dropped %s: %s/%s row %s: %s", item.reason, job.source, item.input,
            item.row, item.detail)
