"""The stream's resumable state: a small, versioned, JSON-able record, rank-independent.

A ``StreamState`` describes the stream standing just before window ``window``:

* ``next_draw``: the mix RNG's exact state. The generator is counter-based (``rng.py``), so
  its whole state is the counter of the next source draw (the key is derived from the seed).
* ``consumed[s]``: documents drawn so far from source s, over all epochs (the document in the
  packing buffer included). ``epoch = consumed // documents`` and ``position = consumed %
  documents`` are written beside it for readers and checked on load.
* ``buffer``: the partial window left in the packing buffer - the last drawn document when
  only ``offset`` of its ``length + 1`` tokens (document then separator) went into earlier
  windows; ``None`` when window ``window`` starts exactly at a document boundary.

Canonical JSON (``to_json``) has ``format = "open1b-stream-state"``, ``version = 1`` and the
mix fingerprint and seed; ``check_mix`` refuses a state of another mix or seed with
``StateMismatchError``. Consistency with the mix's actual draws (that the buffer document
is what draw ``next_draw - 1`` gives) is checked by ``StreamPlan.from_state``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from open1b.canonical import canonical_json
from open1b_data.errors import StateMismatchError, StreamError

FORMAT = "open1b-stream-state"
VERSION = 1
RNG_ALGORITHM = "splitmix64-counter/v1"


@dataclass(frozen=True)
class BufferDoc:
    """The document partly emitted into earlier windows."""

    source: str
    shard: int
    doc: int
    epoch: int
    length: int      # tokens of the document, without the separator
    offset: int      # tokens of (document + separator) already emitted, 0 < offset <= length

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "shard": self.shard, "doc": self.doc,
                "epoch": self.epoch, "length": self.length, "offset": self.offset}


@dataclass(frozen=True)
class StreamState:
    fingerprint: str
    seed: int
    window_tokens: int
    window: int
    next_draw: int
    sources: tuple[str, ...]
    documents: tuple[int, ...]   # documents per source (one epoch), to derive epochs
    consumed: tuple[int, ...]
    buffer: BufferDoc | None

    def __post_init__(self) -> None:
        if self.window < 0 or self.next_draw < 0:
            raise StreamError(f"stream state: window {self.window} and next_draw "
                              f"{self.next_draw} must be >= 0")
        if not (len(self.sources) == len(self.documents) == len(self.consumed)):
            raise StreamError("stream state: sources, documents and consumed differ in length")
        if any(c < 0 for c in self.consumed):
            raise StreamError(f"stream state: negative consumed counts {self.consumed}")
        if sum(self.consumed) != self.next_draw:
            raise StreamError(f"stream state: consumed counts {self.consumed} sum to "
                              f"{sum(self.consumed)}, but next_draw is {self.next_draw}; "
                              f"the record is corrupt")
        b = self.buffer
        if b is not None:
            if b.source not in self.sources:
                raise StreamError(f"stream state: buffer source {b.source!r} is not one of "
                                  f"{self.sources}")
            if not 0 < b.offset <= b.length:
                raise StreamError(f"stream state: buffer offset {b.offset} must be in "
                                  f"(0, length={b.length}]")

    def epoch(self, source: int) -> int:
        d = self.documents[source]
        return self.consumed[source] // d if d else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION,
            "mix": {"fingerprint": self.fingerprint, "seed": self.seed,
                    "window_tokens": self.window_tokens},
            "window": self.window,
            "mix_rng": {"algorithm": RNG_ALGORITHM, "next_draw": self.next_draw},
            "sources": [{"name": n, "documents": d, "consumed": c,
                         "epoch": c // d if d else 0, "position": c % d if d else 0}
                        for n, d, c in zip(self.sources, self.documents, self.consumed)],
            "buffer": None if self.buffer is None else self.buffer.to_dict(),
        }

    def to_json(self) -> str:
        return canonical_json(self.to_dict()).decode("ascii")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StreamState":
        try:
            if d.get("format") != FORMAT:
                raise StreamError(f"not a stream state: format {d.get('format')!r}, expected "
                                  f"{FORMAT!r}")
            if d.get("version") != VERSION:
                raise StreamError(f"stream state version {d.get('version')!r} is not "
                                  f"supported (this build reads version {VERSION})")
            if d["mix_rng"]["algorithm"] != RNG_ALGORITHM:
                raise StreamError(f"stream state RNG {d['mix_rng']['algorithm']!r} is not "
                                  f"{RNG_ALGORITHM!r}")
            srcs = d["sources"]
            for s in srcs:
                dd, c = int(s["documents"]), int(s["consumed"])
                if dd and (s["epoch"], s["position"]) != (c // dd, c % dd):
                    raise StreamError(f"stream state: source {s['name']!r} epoch/position "
                                      f"{s['epoch']}/{s['position']} disagree with consumed "
                                      f"{c} of {dd} documents")
            b = d["buffer"]
            return cls(
                fingerprint=str(d["mix"]["fingerprint"]), seed=int(d["mix"]["seed"]),
                window_tokens=int(d["mix"]["window_tokens"]), window=int(d["window"]),
                next_draw=int(d["mix_rng"]["next_draw"]),
                sources=tuple(str(s["name"]) for s in srcs),
                documents=tuple(int(s["documents"]) for s in srcs),
                consumed=tuple(int(s["consumed"]) for s in srcs),
                buffer=None if b is None else BufferDoc(
                    source=str(b["source"]), shard=int(b["shard"]), doc=int(b["doc"]),
                    epoch=int(b["epoch"]), length=int(b["length"]), offset=int(b["offset"])))
        except (KeyError, TypeError, ValueError) as e:
            raise StreamError(f"malformed stream state record ({type(e).__name__}: {e}); "
                              f"expected the JSON written by StreamState.to_json") from None

    @classmethod
    def from_json(cls, text: str) -> "StreamState":
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise StreamError(f"stream state is not valid JSON: {e}") from None

    def check_mix(self, fingerprint: str, seed: int, sources: tuple[str, ...] | None = None
                  ) -> None:
        """Refuse a state that belongs to another mix or seed."""
        if self.fingerprint != fingerprint:
            raise StateMismatchError(
                f"this stream state belongs to mix fingerprint {self.fingerprint[:16]}..., "
                f"not {fingerprint[:16]}...; resume on the mix it was saved from, or start a "
                f"new run (the data order differs)")
        if self.seed != seed:
            raise StateMismatchError(f"this stream state was saved with seed {self.seed}, not "
                                     f"{seed}; resume with --seed {self.seed}")
        if sources is not None and tuple(sources) != self.sources:
            raise StateMismatchError(f"stream state sources {self.sources} differ from the "
                                     f"mix's {tuple(sources)}")


def differing_fields(got: Any, want: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf where two JSON-like records differ, as (dotted path, got, want), in key
    order - so a refusal can name the exact field that was edited."""
    if isinstance(got, dict) and isinstance(want, dict):
        out = []
        for k in sorted(set(got) | set(want), key=str):
            out += differing_fields(got.get(k), want.get(k), f"{prefix}{k}.")
        return out
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        out = []
        for i, (a, b) in enumerate(zip(got, want)):
            out += differing_fields(a, b, f"{prefix}{i}.")
        return out
    return [] if got == want and type(got) is type(want) else [(prefix.rstrip("."), got, want)]

