"""What the stream needs of a built mix, and nothing more.

Contract: ``MixView.open(mix_url)`` reads ``manifest.json`` through
``open1b_data.formats.manifest.load_manifest`` (which checks the format and recomputes the
fingerprint) and keeps, per source in manifest order: its name, document and token counts,
per-shard document counts, the token shards' paths and Merkle roots with their tree files
(``shardreader.py`` checks every document it decodes against its shard's root), the
lengths-file paths with the digests of their content, its held-out fraction and rows, and
the exact integer source weight; and the separator id ``eot_id``. Lengths files are read
lazily, one shard at a time, their counts verified against the manifest's content digest
(SHA-256 of the lengths as uint32 LE: the ``.npy`` file's own bytes are not what is
checked) and document count, and kept in a small LRU cache. The view never opens a token
shard.

Held-out lists are consistent with the definition or the mix is refused on open
(STREAM.md section 10, "Recorded"): a source whose definition gives it a held-out fraction
lists held-out rows in every shard entry (possibly none), a source without one lists none.
Whether the listed rows are the rule's is checked where the ids are at hand: by every
shard reader, for every document it serves (``shardreader.py``).

Nothing derived is trusted: the view is rebuilt from the checked manifest on every open.
(Earlier versions cached it in ``<mix>/stream/mixview.json``, keyed by the manifest bytes;
but the cache's own content was not checked, so an edited seed in it changed the documents
served under an unchanged fingerprint. Checking it means deriving it again, which is all
the cache saved - about 0.1 s per open at Open-1B scale, 3,322 shards. That file is now
ignored.)

Source weights (STREAM.md "Source choice"): a source is drawn with probability proportional
to ``share_s / mean_tokens_per_doc_s = share_s * documents_s / tokens_s``, where ``share_s``
is the source's declared ``target_share`` when the manifest has one, else its natural token
share ``tokens_s / total``. Undeclared sources in a mix that declares some shares split the
remainder ``1 - sum(declared)`` in proportion to their tokens. Shares are read as exact
decimals (the shortest repr of the stored number, i.e. the value as written). The ratios
become integers exactly (common denominator, then divided by the gcd); if the total would
not fit below 2^62, each weight is instead ``floor(2^62 * r_s / sum(r))``, computed exactly.
With natural shares this reduces to weights proportional to document counts.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from open1b_data.errors import ManifestError, StreamError
from open1b_data.formats.heldout import fractions_of
from open1b_data.formats.shards import lengths_digest, parse_lengths
from open1b_data.storage import read_bytes

WEIGHT_LIMIT = 1 << 62
LENGTHS_CACHE = 64   # shards' lengths arrays kept in memory (~0.4 MB each at 1e5 docs)


@dataclass(frozen=True)
class SourceView:
    """One source as the stream sees it."""

    index: int
    name: str
    documents: int
    tokens: int
    shard_documents: tuple[int, ...]
    shard_paths: tuple[str, ...]          # token shard paths (relative to the mix root)
    shard_roots: tuple[str | None, ...]   # Merkle roots (hex) over the shards' documents
    tree_paths: tuple[str | None, ...]    # the stored trees (proofs for random access)
    lengths_paths: tuple[str, ...]        # lengths file paths (relative to the mix root)
    lengths_content: tuple[str, ...]      # sha256 of each shard's lengths as uint32 LE
    share: Fraction                        # the target token share used for the weight
    weight: int                            # exact integer source weight
    # rows of each shard held out of training (sorted int64), None: the source holds none
    shard_heldout: tuple[np.ndarray, ...] | None = None
    heldout_fraction: Fraction | None = None  # the definition's rule for this source

    @property
    def shards(self) -> int:
        return len(self.shard_documents)

    @property
    def heldout(self) -> bool:
        return self.shard_heldout is not None

    @property
    def shard_train(self) -> tuple[int, ...]:
        """Documents per shard the stream draws from: all but the held-out ones."""
        if self.shard_heldout is None:
            return self.shard_documents
        return tuple(n - h.size for n, h in zip(self.shard_documents, self.shard_heldout))

    @property
    def train_documents(self) -> int:
        """The source's documents the stream draws from (STREAM.md section 10)."""
        return sum(self.shard_train)

    def train_rows(self, shard: int, index: np.ndarray) -> np.ndarray:
        """Shard rows of training documents ``index`` (positions among the shard's
        training documents, in row order): the identity without a held-out set."""
        if self.shard_heldout is None:
            return index
        held = self.shard_heldout[shard]
        adj = held - np.arange(held.size, dtype=np.int64)   # non-decreasing
        return index + np.searchsorted(adj, index, side="right")

    def train_index(self, shard: int, row: int) -> int | None:
        """Inverse of ``train_rows``: the position of ``row`` among the shard's training
        documents, or None when the row is held out."""
        if self.shard_heldout is None:
            return row
        held = self.shard_heldout[shard]
        k = int(np.searchsorted(held, row))
        if k < held.size and int(held[k]) == row:
            return None
        return row - k


def checked_lengths(raw: bytes, url: str, documents: int, content: str) -> np.ndarray:
    """A lengths file's counts, if they are the ones the manifest's digest names (the
    ``.npy`` header is checked before any allocation: a crafted 2^40-element header)."""
    arr = parse_lengths(raw, url, documents)
    digest = lengths_digest(arr)
    if digest != content:
        raise ManifestError(f"lengths file {url}: its document lengths have digest {digest}, "
                            f"the manifest says {content}; the mix changed since it was "
                            f"built - run `open1b-data verify` on it, then restore or rebuild "
                            f"it")
    return arr


def _exact(x: float | int) -> Fraction:
    return Fraction(repr(x)) if isinstance(x, float) else Fraction(x)


def target_shares(tokens: list[int], declared: list[float | None]) -> list[Fraction]:
    """The target token share of each source (exact), by the rule in the module docstring."""
    total = sum(tokens)
    if total <= 0:
        raise StreamError(f"the mix has no tokens (per-source tokens {tokens}); build it with "
                          f"at least one non-empty document")
    if all(d is None for d in declared):
        return [Fraction(t, total) for t in tokens]
    dec = [None if d is None else _exact(d) for d in declared]
    fixed = sum(d for d in dec if d is not None)
    rest_tokens = sum(t for t, d in zip(tokens, dec) if d is None)
    if any(d is None for d in dec):
        if fixed >= 1:
            raise StreamError(f"declared target shares sum to {float(fixed)} >= 1 but some "
                              f"sources declare none; declare all shares or lower them")
        if rest_tokens == 0:
            raise StreamError("the sources without a declared share have no tokens")
    return [d if d is not None else (1 - fixed) * Fraction(t, rest_tokens)
            for t, d in zip(tokens, dec)]


def source_weights(documents: list[int], tokens: list[int],
                   shares: list[Fraction]) -> list[int]:
    """Exact integer weights proportional to ``share * documents / tokens``."""
    ratios = [Fraction(0) if d == 0 or s == 0 else s * d / t
              for d, t, s in zip(documents, tokens, shares)]
    if sum(ratios) == 0:
        raise StreamError(f"no source can be drawn: documents {documents}, shares "
                          f"{[str(s) for s in shares]}")
    lcm = 1
    for r in ratios:
        lcm = lcm * r.denominator // math.gcd(lcm, r.denominator)
    ints = [int(r * lcm) for r in ratios]
    g = 0
    for v in ints:
        g = math.gcd(g, v)
    ints = [v // g for v in ints]
    if sum(ints) < WEIGHT_LIMIT:
        return ints
    total = sum(ratios)
    ints = [math.floor(WEIGHT_LIMIT * r / total) for r in ratios]
    for r, v in zip(ratios, ints):
        if r and not v:
            raise StreamError(f"a source's weight {float(r / total)!r} is below 2^-62 of the "
                              f"total; it would never be drawn")
    return ints


def summary_of(manifest) -> dict:
    """The plain-JSON part of a checked ``BuiltManifest`` that the stream uses."""
    fractions = fractions_of(manifest.definition)
    return {
        "fingerprint": manifest.fingerprint, "name": manifest.name,
        "definition": manifest.definition,
        "eot_id": int(manifest.tokenizer["eot_id"]),
        "sources": [{"name": s.name, "documents": s.documents, "tokens": s.tokens,
                     "target_share": s.target_share,
                     "shard_documents": [sh.documents for sh in s.shards],
                     "shard_paths": [sh.path for sh in s.shards],
                     "shard_roots": [sh.merkle and sh.merkle.root for sh in s.shards],
                     "tree_paths": [sh.merkle and sh.merkle.path for sh in s.shards],
                     "lengths_paths": [sh.lengths_path for sh in s.shards],
                     "lengths_content": [sh.lengths_content for sh in s.shards],
                     "shard_heldout": _heldout_of(s, fractions.get(s.name))}
                    for s in manifest.sources]}


def _heldout_of(source, fraction: Fraction | None) -> list[list[int]] | None:
    """A source's held-out rows per shard; None when it has no held-out fraction. Every
    shard lists its rows when the definition gives the source a fraction, none does when
    it does not (module docstring)."""
    listed = [sh.heldout is not None for sh in source.shards]
    if fraction is None and any(listed):
        raise ManifestError(f"source {source.name!r}: its shards list held-out rows but the "
                            f"definition gives it no held-out fraction; the manifest is "
                            f"inconsistent, rebuild the mix")
    if fraction is None:
        return None
    if not all(listed):
        sh = source.shards[listed.index(False)]
        raise ManifestError(f"source {source.name!r}: the definition holds out {fraction} of "
                            f"its documents but shard {sh.path} lists no held-out rows; the "
                            f"manifest is inconsistent, rebuild the mix")
    return [list(sh.heldout) for sh in source.shards]


def _root(mix_url: str) -> str:
    url = str(mix_url).rstrip("/")
    return url[: -len("/manifest.json")] if url.endswith("/manifest.json") else url


class MixView:
    """A built mix reduced to what planning needs (see module docstring)."""

    def __init__(self, mix_url: str, summary: dict) -> None:
        self.mix_url = _root(mix_url)
        self.summary = summary
        self.fingerprint: str = summary["fingerprint"]
        self.name: str = summary["name"]
        self.definition: dict = summary["definition"]
        self.seed: int = int(self.definition["seed"])
        self.window: int = int(self.definition["window"])
        self.eot_id: int = int(summary["eot_id"])
        fractions = fractions_of(self.definition)
        entries = summary["sources"]
        docs = [int(s["documents"]) for s in entries]
        toks = [int(s["tokens"]) for s in entries]
        shares = target_shares(toks, [s["target_share"] for s in entries])
        weights = source_weights(docs, toks, shares)
        views = []
        for i, (s, share, w) in enumerate(zip(entries, shares, weights)):
            sd = tuple(int(n) for n in s["shard_documents"])
            if sum(sd) != docs[i]:
                raise ManifestError(f"{mix_url}: source {s['name']!r} lists {docs[i]} "
                                    f"documents but its shards hold {sum(sd)}; rebuild it")
            held = s.get("shard_heldout")
            views.append(SourceView(
                index=i, name=s["name"], documents=docs[i], tokens=toks[i], shard_documents=sd,
                shard_paths=tuple(s["shard_paths"]), shard_roots=tuple(s["shard_roots"]),
                tree_paths=tuple(s["tree_paths"]), lengths_paths=tuple(s["lengths_paths"]),
                lengths_content=tuple(s["lengths_content"]), share=share, weight=w,
                shard_heldout=None if held is None else tuple(
                    np.array(h, dtype=np.int64) for h in held),
                heldout_fraction=None if held is None else fractions.get(s["name"])))
        self.sources: tuple[SourceView, ...] = tuple(views)
        self.weights: tuple[int, ...] = tuple(weights)
        self.total_weight: int = sum(weights)
        self._lengths: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, mix_url: str) -> "MixView":
        """The view of the mix at ``mix_url``, from its manifest as ``load_manifest`` checks
        it (format, fields, recomputed fingerprint)."""
        from open1b_data.formats.manifest import load_manifest

        root = _root(mix_url)
        return cls(root, summary_of(load_manifest(root)))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def source_index(self, name: str) -> int:
        for s in self.sources:
            if s.name == name:
                return s.index
        raise StreamError(f"mix {self.name!r} has no source {name!r}; sources: "
                          f"{list(self.names)}")

    def url(self, rel_path: str) -> str:
        from open1b_data.formats.mixpath import resolve

        return resolve(self.mix_url, rel_path)

    def lengths(self, source: int, shard: int) -> np.ndarray:
        """Document lengths (uint32, without separator) of one shard; verified, cached."""
        key = (source, shard)
        with self._lock:   # a loader may plan from a prefetch thread
            arr = self._lengths.get(key)
            if arr is not None:
                self._lengths.move_to_end(key)
                return arr
        sv = self.sources[source]
        url = self.url(sv.lengths_paths[shard])
        arr = checked_lengths(read_bytes(url), url, sv.shard_documents[shard],
                              sv.lengths_content[shard])
        with self._lock:
            self._lengths[key] = arr
            if len(self._lengths) > LENGTHS_CACHE:
                self._lengths.popitem(last=False)
        return arr
