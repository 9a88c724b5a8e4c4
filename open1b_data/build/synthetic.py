"""Synthetic built mixes for tests and benchmarks: ``manifest.json`` plus per-shard
``.lengths.npy`` files (docs/FORMATS.md), optionally with small real token shards.

Contract: ``write_synthetic_mix(out, sources, ...)`` is a pure function of its arguments.
Document lengths follow a per-source log-normal (realistic: web pages ~1.2k tokens, code
~2k, math/papers ~6.7k with a long tail), drawn from the stream's own counter-based
generator (``rng.py``, keyed by "synthetic-lengths", seed, source and shard) so the files do
not depend on numpy's distribution code. The manifest follows FORMATS.md, its definition is
a validated ``MixSpec`` (so ``seed``/``window``/``schedule`` are real), and its fingerprint is
computed by D2's ``manifest.fingerprint``. With ``token_shards=True`` each shard also gets a
Parquet token shard written by D2's ``ShardWriter`` (random token ids; doc ids
``"<source>/<shard>/<row>"``) - keep such mixes small.

``open1b_sources(scale)`` gives the four Mix-0626 sources with the Table-5 document counts
(scaled) and means; shards hold ~1e5 documents as per-input-file shards do.
"""
from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass

import numpy as np

from open1b_data.stream import rng
from open1b_data.build.definition import parse_mix
from open1b_data.storage import atomic_write_bytes, join

MAX_TOKENS = 1_000_000


@dataclass(frozen=True)
class SyntheticSource:
    name: str
    documents: int
    mean_tokens: float
    sigma: float = 1.0                  # log-normal shape
    docs_per_shard: int = 100_000
    target_share: float | None = None
    format: str = "dclm"


def open1b_sources(scale: float = 1.0, docs_per_shard: int = 100_000
                   ) -> list[SyntheticSource]:
    """The four Mix-0626 sources (their published document counts and mean lengths), document
    counts times ``scale``."""
    table = [("dclm-baseline", 240.0e6, 1252, 1.0, "dclm"),
             ("fineweb-edu", 59.5e6, 1005, 0.9, "fineweb-edu"),
             ("the-stack-v2", 27.4e6, 1978, 1.3, "stack-v2"),
             ("proof-pile-2", 5.3e6, 6743, 1.4, "proof-pile-2")]
    return [SyntheticSource(n, max(1, round(d * scale)), m, sg, docs_per_shard, format=f)
            for n, d, m, sg, f in table]


def synthetic_lengths(seed: int, source: str, shard: int, n: int, mean: float, sigma: float
                      ) -> np.ndarray:
    """n log-normal document lengths (uint32, >= 1) with the given mean."""
    key = rng.derive_key("synthetic-lengths", seed, source, 0, shard)
    bits = rng.rand64_range(key, 0, 2 * n)
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))
    z = np.sqrt(-2.0 * np.log(u[:n])) * np.cos(2.0 * math.pi * u[n:])
    mu = math.log(mean) - sigma * sigma / 2
    x = np.rint(np.exp(mu + sigma * z))
    return np.clip(x, 1, MAX_TOKENS).astype(np.uint32)


def _definition(name: str, seed: int, sources: list[SyntheticSource], window: int,
                schedule: dict | None) -> dict:
    seq = window - 1
    sched = schedule or {
        "seq_tokens": seq, "micro_batch": 2, "reference_world": 2,
        "phases": [{"start_tokens": 0, "batch_sequences": 8},
                   {"start_tokens": 64 * seq, "batch_sequences": 16}],
        "stop_tokens": 1024 * seq, "lr_peak": 1e-3, "lr_final_ratio": 0.1,
        "warmup_tokens": 32 * seq}
    srcs = []
    for s in sources:
        t = {"name": s.name, "format": s.format, "upstream": "synthetic", "root": "/synthetic",
             "inputs": ["*"]}
        if s.format == "stack-v2":
            t["content_store"] = "/synthetic/{blob_id}"
        if s.target_share is not None:
            t["share"] = s.target_share
        srcs.append(t)
    data = {"mix": {"name": name, "seed": seed, "window": window},
            "tokenizer": {"vocab_size": 1024}, "shards": {"tokens_per_shard": 1 << 30},
            "schedule": sched, "sources": srcs}
    return parse_mix(data, base_dir="/").to_dict()


def write_synthetic_mix(out: str, sources: list[SyntheticSource], *, seed: int = 42,
                        window: int = 4097, name: str = "synthetic",
                        schedule: dict | None = None, token_shards: bool = False,
                        vocab: int = 1024, progress=None) -> str:
    """Write a synthetic built mix under ``out``; returns its fingerprint."""
    from open1b_data.build import manifest as mf

    entries = []
    for s in sources:
        shards = []
        n_shards = max(1, -(-s.documents // s.docs_per_shard))
        for h in range(n_shards):
            n = min(s.docs_per_shard, s.documents - h * s.docs_per_shard)
            lengths = synthetic_lengths(seed, s.name, h, n, s.mean_tokens, s.sigma)
            if token_shards:
                shards.append(_token_shard(out, s, h, lengths, seed, vocab))
            else:
                shards.append(_lengths_only(out, s, h, lengths))
            if progress:
                progress(s.name, h, n_shards)
        entries.append(mf.SourceEntry(
            name=s.name, format=s.format, documents=s.documents, tokens=0,
            mean_tokens_per_doc=0.0, target_share=s.target_share, token_share=0.0,
            shards=tuple(shards), counts={"read": s.documents, "kept": s.documents,
                                          "dropped": {}}, inputs=()))
    # No tokenizer is written: its sha256 names the synthetic parameters instead.
    tag = hashlib.sha256(f"synthetic tokenizer vocab={vocab}".encode()).hexdigest()
    manifest = mf.assemble_manifest(
        name, "synthetic", _definition(name, seed, sources, window, schedule),
        {"path": "tokenizer.json", "sha256": tag, "vocab_size": vocab, "eot_id": 0,
         "sample": {}}, entries)
    mf.write_manifest(out, manifest)
    return manifest.fingerprint


def _lengths_only(out: str, s: SyntheticSource, h: int, lengths: np.ndarray):
    """A shard entry whose token shard is absent (plan-only mixes): the shard's sha256 is
    that of its lengths file with a prefix, so it is well-formed but never matches a file."""
    from open1b_data.build.manifest import ShardEntry

    buf = io.BytesIO()
    np.save(buf, lengths.astype("<u4"), allow_pickle=False)
    raw = buf.getvalue()
    base = f"{s.name}/shard-{h:05d}-00000"
    atomic_write_bytes(join(out, base + ".lengths.npy"), raw)
    digest = hashlib.sha256(raw).hexdigest()
    return ShardEntry(path=base + ".parquet",
                      sha256=hashlib.sha256(b"absent:" + raw).hexdigest(), bytes=0,
                      documents=int(lengths.shape[0]),
                      tokens=int(lengths.sum(dtype=np.int64)), lengths_path=base + ".lengths.npy",
                      lengths_sha256=digest)


def _token_shard(out: str, s: SyntheticSource, h: int, lengths: np.ndarray, seed: int,
                 vocab: int) -> dict:
    """Write a real Parquet token shard for one synthetic shard (random ids in [1, vocab))."""
    from open1b_data.build.definition import ShardSpec
    from open1b_data.build.shards import ShardWriter

    key = rng.derive_key("synthetic-tokens", seed, s.name, 0, h)
    writer = ShardWriter(join(out, f"{s.name}/shard-{h:05d}"), s.name,
                         ShardSpec(tokens_per_shard=1 << 40))
    total = int(lengths.sum(dtype=np.int64))
    # ids in [1, vocab): 0 is the separator (eot_id) of a synthetic mix
    flat = (rng.bounded_range(key, 0, total, vocab - 1) + np.uint64(1)).astype(np.uint32)
    for row, toks in enumerate(np.split(flat, np.cumsum(lengths.astype(np.int64))[:-1])):
        writer.add(toks, f"{s.name}/{h}/{row}", f"synthetic-{h}", row)
    entries = writer.close()
    if len(entries) != 1:
        raise AssertionError(f"synthetic shard split into {len(entries)} files")
    return entries[0]
