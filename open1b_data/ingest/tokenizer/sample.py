"""The tokenizer's training sample: ``select_sample(mix, inputs)`` picks the training
documents deterministically (the rule is in its docstring) and records exactly which
(source, input, rows) they are - BPE training on the whole corpus is infeasible."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


from open1b_data.formats.definition import MixSpec

SAMPLE_OPEN_INPUTS = 16  # inputs of one source read side by side when sampling


@dataclass(frozen=True)
class TrainingSample:
    """The documents the tokenizer is trained on, and the JSON record of which they are."""

    record: dict
    _texts: tuple[str, ...] = field(repr=False, compare=False, default=())

    def texts(self) -> Iterator[str]:
        return iter(self._texts)

    def to_dict(self) -> dict[str, Any]:
        return self.record


def source_quotas(mix: MixSpec, input_bytes: dict[str, int]) -> dict[str, int]:
    """Byte quota per source: ``sample_bytes`` split by weight. A source's weight is its
    ``share``; sources without one split what the shares leave (``1 - sum(shares)``, or all
    of it when no source has a share) in proportion to their input bytes."""
    shared = sum(s.share for s in mix.sources if s.share is not None)
    unshared_bytes = sum(input_bytes[s.name] for s in mix.sources if s.share is None)
    rest = max(0.0, 1.0 - shared) if shared else 1.0
    weights = {s.name: (s.share if s.share is not None else
                        rest * input_bytes[s.name] / unshared_bytes if unshared_bytes else 0.0)
               for s in mix.sources}
    total = sum(weights.values()) or 1.0
    return {name: int(mix.tokenizer.sample_bytes * w / total) for name, w in weights.items()}


def _input_order(seed: int, source: str, inputs: Sequence[Any]) -> list[Any]:
    # A seeded shuffle keyed by path: independent of listing order, stable across machines.
    return sorted(inputs, key=lambda i: hashlib.sha256(f"{seed}/{source}/{i.path}".encode())
                  .hexdigest())


def _ranges(rows: list[int]) -> list[list[int]]:
    """Sorted row numbers -> ``[[start, stop), ...]`` runs (a compact exact record)."""
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        else:
            out.append([r, r + 1])
    return out


def select_sample(mix: MixSpec, inputs: dict[str, list[Any]]) -> TrainingSample:
    """Choose the tokenizer's training documents.

    Rule (deterministic, mix-proportional): each source gets a byte quota
    (``source_quotas``, over UTF-8 bytes of kept documents). Its inputs are visited in a
    seeded order (sha256 of ``"<seed>/<source>/<path>"``); up to ``SAMPLE_OPEN_INPUTS`` of
    them are read side by side, taking one kept document from each in turn (row order
    within an input); an exhausted input is replaced by the next one in that order. A source
    stops once its quota is reached (the last document may overshoot it) or its inputs run
    out. Only documents the reader keeps (after the source's filters) are taken.
    """
    from open1b_data.ingest.document import Document
    from open1b_data.ingest.sources import read_input

    quotas = source_quotas(mix, {s.name: sum(int(i.size) for i in inputs[s.name])
                                 for s in mix.sources})
    texts: list[str] = []
    sources = []
    for spec in mix.sources:
        quota, taken = quotas[spec.name], 0
        order = _input_order(mix.seed, spec.name, inputs[spec.name])
        rows: dict[str, list[int]] = {}
        pending = list(reversed(order))
        open_: list[tuple[Any, Iterator[Any]]] = []
        n_docs = 0
        while taken < quota and (open_ or pending):
            while len(open_) < SAMPLE_OPEN_INPUTS and pending:
                inp = pending.pop()
                open_.append((inp, iter(read_input(spec, inp))))
            still = []
            for inp, it in open_:
                if taken >= quota:
                    still.append((inp, it))
                    continue
                doc = next((r for r in it if isinstance(r, Document)), None)
                if doc is None:
                    continue  # exhausted: leaves the rotation, the next input takes its place
                texts.append(doc.text)
                rows.setdefault(inp.path, []).append(doc.row)
                taken += len(doc.text.encode("utf-8"))
                n_docs += 1
                still.append((inp, it))
            open_ = still
        for _, it in open_:
            close = getattr(it, "close", None)
            if close:
                close()
        by_path = {i.path: i for i in order}
        sources.append({
            "name": spec.name, "quota_bytes": quota, "bytes": taken, "documents": n_docs,
            "inputs": [{"path": p, "checksum": str(by_path[p].checksum),
                        "rows": _ranges(sorted(r))} for p, r in sorted(rows.items())]})
    record = {"rule": "per-source byte quota by share (else input bytes); inputs in "
                      "sha256(seed/source/path) order, round-robin over "
                      f"{SAMPLE_OPEN_INPUTS} open inputs, kept documents in row order",
              "seed": mix.seed, "sample_bytes": mix.tokenizer.sample_bytes,
              "documents": len(texts), "bytes": sum(s["bytes"] for s in sources),
              "sources": sources}
    return TrainingSample(record, tuple(texts))
