"""``open1b-audit fetch-step MIX_URL --step N``: one step's training data from a published
mix, fetched document by document and proved, without downloading the corpus.

1. ``manifest.json`` is read and parsed the way every reader parses it: its fingerprint is
   recomputed from the canonical JSON, so the roots it records are the ones a training run
   that logs that fingerprint was built on.
2. The step's windows are planned from the mix's schedule and the document lengths (pure
   index arithmetic, ``stream/plan.py``), from the start of the stream: no seek index is
   used, since it is derived data anyone who can write the mix can rewrite. Each lengths
   file the plan needs is fetched whole and checked against the manifest's sha256.
3. Only the documents the windows use are fetched: per shard its Parquet footer (two range
   requests at the end of the file), then the row groups that hold them
   (``docs_per_row_group`` keeps a row group small), and from the shard's
   stored Merkle tree the header and the log2(n) sibling hashes of each document (one
   batched range request).
4. Each document's leaf is computed from the tokens fetched and must lead to its shard's
   root in the manifest (``explore/proof.py``). One that does not stops everything with a
   ``ProofError`` naming it (source, shard path, row, doc_id): no window of the step is
   reported.
5. The windows are rebuilt from the proved documents (the stream's window definition),
   hashed (SHA-256 of the token ids as uint32 LE) and combined into the step's data digest
   exactly as a training run logs it (``open1b_train.statehash.data_digest``), to compare
   with that step's ``components.data`` in the run's ``steps.jsonl``.

Every byte read is counted by what it was for (manifest, lengths, footers, row groups,
proofs) and set against the mix's token shard bytes. The tree commits to each document's
tokens and provenance (doc_id, input, row), and each proved document's held-out status by
the definition's rule must be the manifest's (``explore/proof.py``).

A step's windows depend on the seed as well as the mix: the plan draws documents with the
run's seed, which need not be the mix's default. Against a run (``--run RUN``,
``run_step``), the seed and mix fingerprint are the ones the run's genesis records: the
step is planned with that seed, the manifest's recomputed fingerprint must be the
genesis's (else ``StateMismatchError`` before anything else is fetched), and the rebuilt
data digest is compared with the step's logged ``components.data`` (``StepData.matches``).
Without a run the mix's seed is used, which is only the run's if it trained with it.
"""
from __future__ import annotations

import io
import json
import struct
from collections import Counter
from dataclasses import dataclass

import numpy as np

from open1b_data.formats.manifest import ShardEntry, parse_manifest, read_manifest_bytes
from open1b_data.formats.mixpath import mix_root
from open1b_data.formats.shards import ShardRow
from open1b_data.errors import ShardFormatError, StateMismatchError
from open1b_data.storage import atomic_write_bytes, join, url_to_fs
from open1b_data.storage_errors import failures
from open1b_data.stream.mixview import MixView, summary_of
from open1b_data.explore.proof import ProvedDocument

PARQUET_TAIL = 8      # footer length (u32 LE) + b"PAR1"


class Fetcher:
    """Reads bytes of one mix and counts them, with the requests, by what they were for."""

    def __init__(self) -> None:
        self.bytes: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()

    def whole(self, url: str, what: str) -> bytes:
        from open1b_data.storage import read_bytes

        data = read_bytes(url)
        self.count(what, len(data), 1)
        return data

    def size(self, url: str) -> int:
        with failures(url, "read"):
            fs, path = url_to_fs(url)
            n = int(fs.size(path))
        self.requests["footers"] += 1
        return n

    def ranges(self, url: str, ranges: list[tuple[int, int]], what: str) -> list[bytes]:
        from open1b_data.storage import read_ranges

        blobs = read_ranges(url, ranges)
        self.count(what, sum(len(b) for b in blobs), len(ranges))
        return blobs

    def count(self, what: str, nbytes: int, requests: int) -> None:
        self.bytes[what] += nbytes
        self.requests[what] += requests


class _RangeFile(io.RawIOBase):
    """A remote file as Parquet reads it: every read is one counted range request."""

    def __init__(self, fetcher: Fetcher, url: str, size: int) -> None:
        self.fetcher, self.url, self.length, self.pos = fetcher, url, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else (self.pos + offset if whence == 1
                                               else self.length + offset)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.length if n is None or n < 0 else min(self.length, self.pos + n)
        if end <= self.pos:
            return b""
        data = self.fetcher.ranges(self.url, [(self.pos, end)], "row_groups")[0]
        self.pos += len(data)
        return data

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)


def read_rows_remote(fetcher: Fetcher, url: str, entry: ShardEntry, source: str,
                     rows: list[int]) -> list[ShardRow]:
    """Documents ``rows`` of one shard (tokens and provenance): its footer, then only the
    row groups that hold them. Checked as every shard reader checks (magic, version,
    schema, counts) - the proofs decide whether the documents are the mix's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from open1b_data.formats.shards import check_footer, list_parts

    size = fetcher.size(url)
    tail = (fetcher.ranges(url, [(size - PARQUET_TAIL, size)], "footers")[0]
        if size >= 12 else b"")
    if len(tail) != PARQUET_TAIL or tail[4:] != b"PAR1":
        raise ShardFormatError(f"{url}: not a Parquet file (no footer magic at its end); the "
                               f"shard was replaced - run `open1b-data verify` on the mix")
    n = struct.unpack("<I", tail[:4])[0]
    if n + PARQUET_TAIL + 4 > size:
        raise ShardFormatError(f"{url}: its footer claims {n} bytes of a {size}-byte file")
    footer = fetcher.ranges(url, [(size - PARQUET_TAIL - n, size - PARQUET_TAIL)],
                            "footers")[0]
    try:
        # The footer alone, framed as a file: Parquet then reads only the column chunks
        # asked for, never its usual 64 KiB speculative tail.
        meta = pq.read_metadata(io.BytesIO(b"PAR1" + footer + tail))
        pf = pq.ParquetFile(_RangeFile(fetcher, url, size), metadata=meta, pre_buffer=False)
    except (pa.ArrowException, OSError) as e:
        raise ShardFormatError(f"{url}: unreadable Parquet footer ({e})") from None
    info = check_footer(url, pf)
    if (info.documents, info.source) != (entry.documents, source):
        raise ShardFormatError(f"{url}: its footer says {info.source!r}, {info.documents} "
                               f"documents; the manifest says {source!r}, {entry.documents}")
    starts = np.concatenate([[0], np.cumsum(info.row_group_rows)]).astype(np.int64)
    groups: dict[int, list[int]] = {}
    for r in rows:
        groups.setdefault(int(np.searchsorted(starts, r, side="right")) - 1, []).append(r)
    got: dict[int, ShardRow] = {}
    for g, members in groups.items():
        try:
            # one small row group: Arrow's threads cost more than they save (and see
            # shardreader.py on Arrow threads releasing Python-owned buffers at exit)
            t = pf.read_row_group(g, columns=["tokens", "doc_id", "input", "row"],
                                  use_threads=False)
        except (pa.ArrowException, OSError) as e:
            raise ShardFormatError(f"{url}: row group {g} is unreadable ({e})") from None
        values, offsets = list_parts(t.column("tokens"), url)
        doc_ids, inputs = t.column("doc_id").to_pylist(), t.column("input").to_pylist()
        input_rows = t.column("row").to_pylist()
        for r in members:
            i = r - int(starts[g])
            got[r] = ShardRow(values[offsets[i]:offsets[i + 1]].copy(), doc_ids[i],
                              inputs[i], input_rows[i])
    return [got[r] for r in rows]


class _CountedView(MixView):
    """The stream's view of the mix, reading lengths files through the fetcher (whole,
    checked against the manifest's content digest and document count, kept for the
    process)."""

    def __init__(self, mix_url: str, summary: dict, fetcher: Fetcher) -> None:
        super().__init__(mix_url, summary)
        self.fetcher = fetcher
        self.loaded: dict[tuple[int, int], np.ndarray] = {}

    def lengths(self, source: int, shard: int) -> np.ndarray:
        from open1b_data.stream.mixview import checked_lengths

        key = (source, shard)
        if key not in self.loaded:
            sv = self.sources[source]
            url = self.url(sv.lengths_paths[shard])
            raw = self.fetcher.whole(url, "lengths")
            self.loaded[key] = checked_lengths(raw, url, sv.shard_documents[shard],
                                               sv.lengths_content[shard])
        return self.loaded[key]


@dataclass(frozen=True)
class RunStep:
    """What a run logged about one step's data: the seed and mix fingerprint of its genesis
    and the step's ``components.data``."""

    run: str
    step: int
    seed: int
    fingerprint: str
    data_digest: str

    def to_dict(self) -> dict:
        return {"dir": self.run, "step": self.step, "seed": self.seed,
                "mix_fingerprint": self.fingerprint, "logged_data_digest": self.data_digest}


def run_step(run: str, lines: list[dict], step: int) -> RunStep:
    """Step ``step`` of the run whose (chain-checked) log is ``lines``; a field of the
    wrong type or a step the log does not hold is a ``StateMismatchError``."""
    g = lines[0].get("genesis") if lines else None
    g = g if isinstance(g, dict) else {}
    seed, fp = g.get("seed"), g.get("mix_fingerprint")
    if type(seed) is not int or not isinstance(fp, str):
        raise StateMismatchError(f"{run}: its genesis records no integer seed and mix "
                                 f"fingerprint (seed {seed!r}, mix_fingerprint {fp!r})")
    if not 1 <= step < len(lines):
        raise StateMismatchError(f"{run} logs steps 1..{len(lines) - 1}; it has no step "
                                 f"{step} to compare with")
    comps = lines[step].get("components")
    data = comps.get("data") if isinstance(comps, dict) else None
    if not isinstance(data, str):
        raise StateMismatchError(f"{run}: step {step} logs no components.data digest")
    return RunStep(run, step, seed, fp, data)


@dataclass(frozen=True)
class StepData:
    """One step's windows, rebuilt from proved documents, and what it cost to get them."""

    mix: str
    name: str
    fingerprint: str
    step: int
    windows: tuple[int, ...]
    window_sha256: tuple[str, ...]
    tokens: np.ndarray                  # uint32 [windows, window tokens]
    data_digest: str
    documents: tuple[ProvedDocument, ...]   # in order of first use
    shards: int
    bytes_fetched: dict
    requests: int
    mix_bytes: int
    seed: int = 0                       # the seed the step was planned with
    run: RunStep | None = None          # the run it is compared with (None: not compared)

    @property
    def matches(self) -> bool | None:
        """Whether the rebuilt data digest is the run's logged one (None: no run)."""
        return None if self.run is None else self.data_digest == self.run.data_digest

    def to_dict(self, with_documents: bool = False) -> dict:
        total = self.bytes_fetched["total"]
        out = {"mix": self.mix, "name": self.name, "fingerprint": self.fingerprint,
               "seed": self.seed, "step": self.step,
               "run": None if self.run is None else {**self.run.to_dict(),
                                                     "matches": self.matches},
               "window_tokens": int(self.tokens.shape[1]),
               "windows": [{"window": m, "sha256": h}
                           for m, h in zip(self.windows, self.window_sha256)],
               "data_digest": self.data_digest, "documents": len(self.documents),
               "shards": self.shards, "verified": True,
               "bytes_fetched": dict(self.bytes_fetched), "requests": self.requests,
               "mix_bytes": self.mix_bytes,
               "fraction": total / self.mix_bytes if self.mix_bytes else None}
        if with_documents:
            out["proved_documents"] = [d.to_dict() for d in self.documents]
        return out


def fetch_step(mix_url: str, step: int, run: RunStep | None = None,
               lengths_from: str | None = None) -> StepData:
    """Fetch, prove and rebuild the windows of ``step`` (module docstring), planned with
    ``run``'s seed and checked against its mix fingerprint when a run is given.
    ``lengths_from``: a local copy of the mix's ``manifest.json`` and lengths files (the
    crowd's verified mirror, ``open1b_audit.crowd.cache``): the step is planned from it,
    each lengths file still checked against the manifest, and only the documents and their
    proofs are fetched (and counted) from ``mix_url``."""
    from open1b_data.stream.plan import StreamPlan
    from open1b_data.explore.proof import Placement, prove_documents, rebuild_windows
    from open1b_data.stream.schedule import Schedule
    from open1b_data.stream.windows import window_sha256
    from open1b_train.statehash import data_digest

    fetcher = Fetcher()
    url, raw = read_manifest_bytes(lengths_from or mix_url)
    if lengths_from is None:
        fetcher.count("manifest", len(raw), 1)
    manifest = parse_manifest(raw, url)     # recomputes the fingerprint
    if run is not None and manifest.fingerprint != run.fingerprint:
        raise StateMismatchError(
            f"step {step}: the run {run.run} trained on mix fingerprint {run.fingerprint[:16]}"
            f"..., the mix at {mix_url} is {manifest.fingerprint[:16]}...; not the run's mix")
    root = mix_root(mix_url)
    if lengths_from is None:
        view = _CountedView(root, summary_of(manifest), fetcher)
    else:
        view = MixView(mix_root(lengths_from), summary_of(manifest))
    info = Schedule.from_definition(view.definition).step(step)
    a, b = info.first_window, info.first_window + info.batch_sequences
    plan = StreamPlan(view, seed=None if run is None else run.seed)
    segs = plan.segments_range(a, b)
    names = view.names
    keys = [(names[s], h, d) for s, h, d in zip(segs.source.tolist(), segs.shard.tolist(),
                                                 segs.doc.tolist())]

    def rows(source: str, shard: int, shard_url: str, entry: ShardEntry, docs: list[int]):
        return read_rows_remote(fetcher, shard_url, entry, source, docs)

    def ranges(tree_url: str, spans: list[tuple[int, int]]) -> list[bytes]:
        return fetcher.ranges(tree_url, spans, "proofs")

    proved = prove_documents(root, manifest, keys, rows, ranges)
    docs = {d.key: d.tokens for d in proved}
    placements = [Placement(m - a, o, k, s0, n) for m, o, k, s0, n in zip(
        segs.window.tolist(), segs.window_offset.tolist(), keys, segs.doc_start.tolist(),
        segs.length.tolist())]
    tokens = rebuild_windows(placements, docs, b - a, view.window, view.eot_id)
    shas = tuple(window_sha256(t) for t in tokens)
    windows = tuple(range(a, b))
    fetched = dict(sorted(fetcher.bytes.items()))
    fetched["total"] = sum(fetcher.bytes.values())
    return StepData(
        mix=root, name=manifest.name, fingerprint=manifest.fingerprint, step=step,
        windows=windows, window_sha256=shas, tokens=tokens,
        data_digest=data_digest(windows, [bytes.fromhex(h) for h in shas]),
        documents=tuple(proved), shards=len({(d.source, d.shard) for d in proved}),
        bytes_fetched=fetched, requests=sum(fetcher.requests.values()),
        mix_bytes=sum(sh.bytes for _, sh in manifest.shards()), seed=plan.seed, run=run)


def write_step(data: StepData, out: str) -> list[str]:
    """``<out>/windows.npy`` (uint32 [windows, window tokens]) and ``<out>/step.json`` (the
    report with every proved document, its tokens and proof), each written atomically."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(data.tokens, dtype="<u4"), allow_pickle=False)
    npy, rep = join(out, "windows.npy"), join(out, "step.json")
    atomic_write_bytes(npy, buf.getvalue())
    atomic_write_bytes(rep, (json.dumps(data.to_dict(with_documents=True), indent=1)
                             + "\n").encode())
    return [npy, rep]
