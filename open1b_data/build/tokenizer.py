"""The mix's tokenizer: byte-level BPE trained from scratch, and an exact fast encoder.

Contracts:
- ``select_sample(mix, inputs)`` picks the training documents deterministically (the rule
  is in its docstring) and records exactly which (source, input, rows) they are.
- ``train_tokenizer(spec, texts)``: HF ``tokenizers`` BPE; pre-tokenizer = Split on
  ``spec.split_pattern`` ("isolated") then ByteLevel(add_prefix_space=False,
  use_regex=False); ByteLevel decoder; ``spec.eot`` is the only special token (id 0); no
  normalizer, no post-processor (the stream appends the separator itself). The model has
  ``ignore_merges=True`` (as Llama-3): a pre-token that is itself in the vocabulary is
  one token, which is also what tiktoken does.
- ``save_tokenizer`` writes the compact ``tokenizer.json`` atomically; identical inputs give
  byte-identical files (tested). It loads with ``tokenizers.Tokenizer.from_file`` and
  ``transformers.PreTrainedTokenizerFast(tokenizer_file=...)``; ``transformers_files`` gives
  the directory ``AutoTokenizer.from_pretrained`` opens with the separator as eos_token.
- Document text is encoded as text: a literal ``<|endoftext|>`` inside a document is *not*
  the separator. Tokenizers returned by ``train_tokenizer``/``load_tokenizer`` have
  ``encode_special_tokens = True`` (not stored in the file), and ``FastEncoder`` never
  matches special tokens in text.
- ``FastEncoder`` encodes with tiktoken's algorithm: mergeable ranks = the trained vocab
  (ByteLevel characters mapped back to bytes; rank = token id, so merged tokens rank in
  merge order) and the same split pattern. Backend ``native`` (the default where it
  applies): ``open1b_data.build._bpe``, a compiled state machine for the Llama-3 split plus
  tiktoken's BPE with a per-piece cache, 3-4x faster than tiktoken (built by ``pip install``
  where a C compiler exists; its split equals HF's on every code point, tested). Backend
  ``tiktoken``: a tiktoken ``Encoding`` with the pattern spelled by ``delegated_pattern``
  (faster in tiktoken's engine, the same pieces, tested); used for other split patterns,
  without a compiler, or with ``OPEN1B_ENCODER=tiktoken``. Neither is assumed equal to HF:
  ``check_equivalence`` compares ids and round trips on given texts and raises
  ``BuildError`` naming the first differing document and position.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from open1b_data.errors import BuildError
from open1b_data.build.definition import LLAMA3_SPLIT, MixSpec, TokenizerSpec
from open1b_data.storage import atomic_write_bytes, read_bytes

log = logging.getLogger("open1b_data.build.tokenizer")

SAMPLE_OPEN_INPUTS = 16  # inputs of one source read side by side when sampling


# ---------------------------------------------------------------------------------------
# The training sample

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
    from open1b_data.build.document import Document
    from open1b_data.build.sources import read_input

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


# ---------------------------------------------------------------------------------------
# Training, saving, loading

def train_tokenizer(spec: TokenizerSpec, texts: Iterable[str]) -> Any:
    """Train the byte-level BPE of ``spec`` from scratch on ``texts``."""
    # Explicit: HF warns and silently goes serial if a process forks after using its pool.
    # Training in the main process may use the pool unless the caller decided otherwise.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer(spec.split_pattern)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, min_frequency=spec.min_frequency,
        special_tokens=[spec.eot], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=spec.max_token_length, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.model.ignore_merges = True
    tok.encode_special_tokens = True
    return tok


def _pre_tokenizer(pattern: str) -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def save_tokenizer(tok: Any, path_or_url: str) -> None:
    """Write ``tokenizer.json`` (compact JSON, deterministic) atomically."""
    atomic_write_bytes(str(path_or_url), tok.to_str(pretty=False).encode("utf-8"))


def load_tokenizer(path_or_url: str) -> Any:
    """Read a ``tokenizer.json`` (local path or URL) into a ``tokenizers.Tokenizer``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(read_bytes(str(path_or_url)).decode("utf-8"))
    except FileNotFoundError:
        raise BuildError(f"tokenizer file {path_or_url!r} does not exist; build the mix "
                         f"(it trains the tokenizer) or pass the right path") from None
    except Exception as e:  # tokenizers raises plain Exception on a malformed file
        raise BuildError(f"tokenizer file {path_or_url!r} cannot be loaded: {e}") from None
    tok.encode_special_tokens = True
    return tok


# ---------------------------------------------------------------------------------------
# The tokenizer as a transformers directory

HF_DIRECTORY = "tokenizer"  # beside tokenizer.json in the mix root


def transformers_files(tokenizer_json: bytes, eot: str, model_max_length: int
                       ) -> dict[str, bytes]:
    """The files of a directory ``transformers.AutoTokenizer.from_pretrained`` opens with the
    mix's special tokens set, by name; deterministic bytes (sorted keys, no timestamps).

    ``eos_token`` is the separator ``eot`` (what the stream puts after every document).
    ``bos_token``, ``pad_token`` and ``unk_token`` are unset: training windows have no BOS,
    are packed (never padded), and byte-level BPE has no unknown token; a user who pads
    sets ``pad_token = eos_token`` and relies on the attention mask. ``split_special_tokens``
    makes transformers encode a literal ``<|endoftext|>`` inside text as text, as the shards
    do; ``clean_up_tokenization_spaces`` is off so decoding returns the text exactly.
    ``model_max_length`` is the training sequence length (``schedule.seq_tokens``)."""
    d = json.loads(tokenizer_json)
    special = {t["content"]: t for t in d.get("added_tokens", [])}
    if eot not in special:
        raise BuildError(f"tokenizer.json has no {eot!r} special token; it was not trained "
                         f"for this mix (delete it and build again)")
    t = special[eot]
    config = {
        "added_tokens_decoder": {str(t["id"]): {
            "content": eot, "lstrip": t["lstrip"], "normalized": t["normalized"],
            "rstrip": t["rstrip"], "single_word": t["single_word"], "special": True}},
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": eot,
        "model_max_length": model_max_length,
        "pad_token": None,
        "split_special_tokens": True,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }

    def dumps(obj: Any) -> bytes:
        return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode()

    return {"special_tokens_map.json": dumps({"eos_token": eot}),
            "tokenizer.json": tokenizer_json,
            "tokenizer_config.json": dumps(config)}


# ---------------------------------------------------------------------------------------
# The fast exact encoder

def _byte_decoder() -> dict[str, int]:
    """GPT-2 / HF ByteLevel's printable character for each byte, inverted."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _split_pattern(d: dict[str, Any]) -> str:
    """The Split pattern of a tokenizer.json built by ``train_tokenizer`` (checked)."""
    pre = d.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    ok = (isinstance(parts, list) and len(parts) == 2 and parts[0].get("type") == "Split"
          and parts[0].get("behavior") == "Isolated" and not parts[0].get("invert")
          and "Regex" in (parts[0].get("pattern") or {}) and parts[1].get("type") == "ByteLevel"
          and not parts[1].get("add_prefix_space") and not parts[1].get("use_regex"))
    model = d.get("model") or {}
    if not ok or model.get("type") != "BPE" or not model.get("ignore_merges") \
            or d.get("normalizer") is not None:
        raise BuildError("FastEncoder needs a tokenizer made by train_tokenizer (BPE with "
                         "ignore_merges, Split(isolated) + ByteLevel(no prefix, no regex), no "
                         f"normalizer); got pre_tokenizer {pre!r}")
    return parts[0]["pattern"]["Regex"]


LOOKAHEAD_TAIL = r"|\s+(?!\S)|\s+"


def delegated_pattern(pattern: str) -> str:
    """The same split as ``pattern``, spelled so tiktoken's regex engine runs faster.

    tiktoken compiles with fancy-regex, which runs a pattern holding a look-around on its
    backtracking VM and hands each look-around-free alternative to the ``regex`` crate as
    a separate call. Grouping every alternative before the look-around tail into one
    ``(?:...)`` makes them one call. Alternation is ordered (leftmost-first) in both
    engines, so ``(?:A|B)|C`` and ``A|B|C`` match the same text at every position: the
    pieces, and so the ids, are identical (``check_equivalence`` still proves it on every
    build). On the demo corpus this encodes 1.4x faster. A pattern without the Llama-3
    tail is returned unchanged.
    """
    head = pattern[: -len(LOOKAHEAD_TAIL)]
    escaped_bar = (len(head) - len(head.rstrip("\\"))) % 2 == 1  # head ends in "\": "\|"
    if not pattern.endswith(LOOKAHEAD_TAIL) or not head or escaped_bar \
            or any(a in head for a in ("(?=", "(?!", "(?<")):
        return pattern
    return f"(?:{head}){LOOKAHEAD_TAIL}"


ENCODER_ENV = "OPEN1B_ENCODER"  # "tiktoken" forces the tiktoken backend (comparisons)


def native_encoder(pattern: str, ranks: dict[bytes, int]) -> Any | None:
    """The compiled encoder (``open1b_data.build._bpe``, 3-4x faster than tiktoken on the demo
    corpus) when it is built and implements ``pattern`` (the Llama-3 split, the only one it
    knows), else None."""
    if pattern != LLAMA3_SPLIT:
        return None
    try:
        from open1b_data.build import _bpe
    except ImportError as e:  # built without a C compiler: tiktoken does the work
        log.info("compiled encoder unavailable (%s); using tiktoken", e)
        return None
    return _bpe.Encoder(ranks)


class FastEncoder:
    """The same BPE as the HF tokenizer, fast (see module contract): the compiled encoder
    (``backend == "native"``) where it applies, else tiktoken. ``encode_batch`` returns
    uint32 arrays; ``decode`` is strict UTF-8 (a bad id sequence raises, never replaces).
    Text with a lone surrogate (not UTF-8 encodable) raises ``UnicodeEncodeError`` on the
    native backend (tiktoken would replace it; readers drop such documents first)."""

    def __init__(self, encoding: Any, eot_id: int, threads: int = 1,
                 native: Any | None = None) -> None:
        self.encoding = encoding  # tiktoken: decoding, and encoding without `native`
        self.eot_id = int(eot_id)
        self.threads = threads
        self.native = native
        self.backend = "tiktoken" if native is None else "native"

    @classmethod
    def from_tokenizer(cls, tok: Any, threads: int = 1, backend: str | None = None
                       ) -> FastEncoder:
        """``backend``: "native", "tiktoken", or None for native where it applies (unless
        the environment variable ``OPEN1B_ENCODER=tiktoken``)."""
        import tiktoken

        backend = backend or os.environ.get(ENCODER_ENV) or None
        if backend not in (None, "native", "tiktoken"):
            raise BuildError(f"encoder backend {backend!r} (argument or {ENCODER_ENV}) must be "
                             f"'native' or 'tiktoken'")
        d = json.loads(tok.to_str())
        pattern = _split_pattern(d)
        special = {t["content"]: int(t["id"]) for t in d.get("added_tokens", [])}
        vocab = {t: int(i) for t, i in d["model"]["vocab"].items() if t not in special}
        # ByteLevel characters -> bytes in one C-level pass per token: each character
        # maps to the latin-1 character of its byte, then encodes to that byte.
        dec = _byte_decoder()
        stray = set("".join(vocab)) - dec.keys()
        if stray:
            token = next(t for t in vocab if not set(t) <= dec.keys())
            raise BuildError(f"token {token!r} (id {vocab[token]}) is not byte-level; cannot "
                             f"build the fast encoder from this tokenizer")
        table = str.maketrans({c: chr(b) for c, b in dec.items()})
        ranks = {t.translate(table).encode("latin-1"): i for t, i in vocab.items()}
        if len(special) != 1:
            raise BuildError(f"expected exactly one special token (the separator), got "
                             f"{sorted(special)}")
        (eot_id,) = special.values()
        enc = tiktoken.Encoding(name="open1b-bpe", pat_str=delegated_pattern(pattern),
                                mergeable_ranks=ranks,
                                special_tokens=special)
        native = None if backend == "tiktoken" else native_encoder(pattern, ranks)
        if backend == "native" and native is None:
            raise BuildError("the native encoder was asked for but is not available (it is "
                             "built by `pip install -e .` with a C compiler, and knows only the "
                             "Llama-3 split pattern)")
        return cls(enc, eot_id, threads, native)

    def encode(self, text: str) -> np.ndarray:
        if self.native is not None:
            return np.frombuffer(self.native.encode(text), dtype=np.uint32)
        # allowed_special=set(): a literal "<|endoftext|>" in a document is text.
        return self.encoding.encode_to_numpy(text, allowed_special=set(),
                                             disallowed_special=())

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        if self.threads <= 1 or len(texts) < 2:
            return [self.encode(t) for t in texts]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.threads) as pool:
            return list(pool.map(self.encode, texts))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        return self.encoding.decode_bytes(ids).decode("utf-8")


def check_equivalence(tok: Any, fast: FastEncoder, texts: Sequence[str],
                      ids: Sequence[np.ndarray] | None = None,
                      labels: Sequence[str] | None = None) -> None:
    """HF ``encode_batch`` and the fast encoder give identical ids on every text, and they
    decode back to the text exactly; else ``BuildError`` naming the first difference.
    ``ids``: the fast encoder's ids for ``texts`` when the caller already has them (a build
    checks the very ids it stores); encoded here otherwise. ``labels`` name the texts in
    the error (a build passes the shard path and row); default ``document <n>``."""
    if not tok.encode_special_tokens:  # a setter: skip it when set (threads share ``tok``)
        tok.encode_special_tokens = True
    # encode_batch_fast: the same ids without offsets (~20% faster); offsets are only
    # needed to name a difference, and then that one document is encoded again.
    ref = tok.encode_batch_fast(list(texts), add_special_tokens=False)
    got = fast.encode_batch(list(texts)) if ids is None else list(ids)
    if len(got) != len(ref):
        raise BuildError(f"check_equivalence: {len(texts)} texts but {len(got)} id arrays")
    for n, (text, r, g) in enumerate(zip(texts, ref, got)):
        label = labels[n] if labels is not None else f"document {n}"
        a = np.asarray(r.ids, dtype=np.int64)
        b = np.asarray(g, dtype=np.int64)
        if a.shape != b.shape or not np.array_equal(a, b):
            m = min(len(a), len(b))
            pos = int(np.argmax(a[:m] != b[:m])) if np.any(a[:m] != b[:m]) else m
            offsets = tok.encode(text, add_special_tokens=False).offsets
            off = offsets[pos][0] if pos < len(offsets) else len(text)
            raise BuildError(
                f"encoders disagree on {label} at token {pos} (text offset {off}, "
                f"{text[max(0, off - 20):off + 20]!r}): HF {a[pos:pos + 5].tolist()}, fast "
                f"{b[pos:pos + 5].tolist()}; do not use the fast encoder for this tokenizer")
        back = fast.decode(g)
        if back != text:
            raise BuildError(f"{label} does not round trip: decode(encode(text)) differs "
                             f"at char {_first_diff(back, text)}")


def _first_diff(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
