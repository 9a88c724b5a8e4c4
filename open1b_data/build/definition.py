"""The mix definition: a TOML file in ``manifests/`` parsed once into frozen dataclasses.

Contract: nothing downstream reads the raw TOML dict. ``load_mix(path)`` validates every
field and raises ``MixSpecError`` naming the field (dotted path) and the offending value.
Relative input locations resolve against the TOML file's directory; URLs (``s3://...``)
are kept as they are. ``MixSpec.to_dict()`` is the canonical, JSON-serializable form that
the built manifest embeds (so a built mix records exactly what definition produced it).
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from open1b_data.errors import MixSpecError

FORMATS = ("dclm", "fineweb-edu", "stack-v2", "proof-pile-2")
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class FilterSpec:
    """The ingest filters that apply to one source (SPEC section 2: exactly three).

    ``drop_empty`` applies to every source. ``score_field``/``min_score`` is FineWeb-Edu's
    educational-score filter; ``license_field``/``license_allowed`` and
    ``size_field``/``max_bytes`` are The Stack v2's license and size filters.
    """

    drop_empty: bool = True
    score_field: str | None = None
    min_score: float | None = None
    license_field: str | None = None
    license_allowed: tuple[str, ...] = ()
    size_field: str | None = None
    max_bytes: int | None = None


@dataclass(frozen=True)
class SourceSpec:
    """One upstream corpus: where its files are, their format, and its filters."""

    name: str
    format: str
    upstream: str
    root: str
    inputs: tuple[str, ...]
    filters: FilterSpec
    share: float | None = None
    content_store: str | None = None  # stack-v2 only: URL template with "{blob_id}"

    def input_root(self) -> str:
        return self.root


@dataclass(frozen=True)
class TokenizerSpec:
    """Byte-level BPE trained from scratch on a deterministic, mix-proportional sample."""

    vocab_size: int
    split_pattern: str = LLAMA3_SPLIT
    eot: str = "<|endoftext|>"
    sample_bytes: int = 100_000_000
    min_frequency: int = 2
    max_token_length: int = 32


@dataclass(frozen=True)
class ShardSpec:
    """How token shards are cut: a shard closes once it holds ``tokens_per_shard`` tokens."""

    tokens_per_shard: int
    docs_per_row_group: int = 1024
    zstd_level: int = 3


@dataclass(frozen=True)
class Phase:
    """A batch-size phase: applies to steps whose tokens-consumed-before is >= start_tokens."""

    start_tokens: int
    batch_sequences: int


@dataclass(frozen=True)
class ScheduleSpec:
    """Batch ramp and learning-rate schedule, both functions of consumed tokens (SPEC 3)."""

    seq_tokens: int
    micro_batch: int
    reference_world: int
    phases: tuple[Phase, ...]
    stop_tokens: int
    lr_peak: float
    lr_final_ratio: float
    warmup_tokens: int


@dataclass(frozen=True)
class MixSpec:
    """A whole mix definition."""

    name: str
    seed: int
    window: int
    sources: tuple[SourceSpec, ...]
    tokenizer: TokenizerSpec
    shards: ShardSpec
    schedule: ScheduleSpec
    path: str = field(default="", compare=False)

    def source(self, name: str) -> SourceSpec:
        for s in self.sources:
            if s.name == name:
                return s
        raise MixSpecError(f"mix {self.name!r} has no source {name!r}; sources: "
                           f"{[s.name for s in self.sources]}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("path")
        return d


# ---------------------------------------------------------------------------------------
# Parsing: one small typed getter per kind of field, each naming the dotted field on error.

def _get(table: dict, key: str, where: str, kind: type | tuple, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise MixSpecError(f"{where}.{key}: missing required field; add it to the mix file")
        return default
    value = table[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise MixSpecError(f"{where}.{key}: expected {kind}, got {value!r}")
    if not isinstance(value, kinds):
        if float in kinds and isinstance(value, int):
            return float(value)
        raise MixSpecError(f"{where}.{key}: expected {'/'.join(k.__name__ for k in kinds)}, "
                           f"got {value!r} ({type(value).__name__})")
    return value


def _positive(value: int | float, where: str) -> None:
    if value <= 0:
        raise MixSpecError(f"{where}: must be > 0, got {value!r}")


def _resolve(root: str, base_dir: str) -> str:
    if "://" in root or os.path.isabs(root):
        return root
    return os.path.normpath(os.path.join(base_dir, root))


def _parse_filters(t: dict, where: str) -> FilterSpec:
    unknown = set(t) - {f.name for f in dataclasses.fields(FilterSpec)}
    if unknown:
        raise MixSpecError(f"{where}: unknown filter field(s) {sorted(unknown)}")
    spec = FilterSpec(
        drop_empty=_get(t, "drop_empty", where, bool, True),
        score_field=_get(t, "score_field", where, str, None),
        min_score=_get(t, "min_score", where, float, None),
        license_field=_get(t, "license_field", where, str, None),
        license_allowed=tuple(_get(t, "license_allowed", where, list, [])),
        size_field=_get(t, "size_field", where, str, None),
        max_bytes=_get(t, "max_bytes", where, int, None),
    )
    if (spec.score_field is None) != (spec.min_score is None):
        raise MixSpecError(f"{where}: score_field and min_score go together, got "
                           f"{spec.score_field!r} and {spec.min_score!r}")
    if (spec.license_field is None) != (not spec.license_allowed):
        raise MixSpecError(f"{where}: license_field and license_allowed go together")
    if (spec.size_field is None) != (spec.max_bytes is None):
        raise MixSpecError(f"{where}: size_field and max_bytes go together")
    if spec.max_bytes is not None:
        _positive(spec.max_bytes, f"{where}.max_bytes")
    return spec


def _parse_source(t: dict, where: str, base_dir: str) -> SourceSpec:
    fmt = _get(t, "format", where, str)
    if fmt not in FORMATS:
        raise MixSpecError(f"{where}.format: unknown format {fmt!r}; expected one of {FORMATS}")
    inputs = _get(t, "inputs", where, list)
    if not inputs or not all(isinstance(i, str) and i for i in inputs):
        raise MixSpecError(f"{where}.inputs: expected a non-empty list of glob patterns, "
                           f"got {inputs!r}")
    share = _get(t, "share", where, float, None)
    if share is not None and not 0 < share <= 1:
        raise MixSpecError(f"{where}.share: must be in (0, 1], got {share!r}")
    store = _get(t, "content_store", where, str, None)
    if fmt == "stack-v2" and (store is None or "{blob_id}" not in store):
        raise MixSpecError(f"{where}.content_store: stack-v2 needs a URL template containing "
                           f"'{{blob_id}}', got {store!r}")
    name = _get(t, "name", where, str)
    if not name or "/" in name:
        raise MixSpecError(f"{where}.name: must be a non-empty name without '/', got {name!r}")
    return SourceSpec(
        name=name,
        format=fmt,
        upstream=_get(t, "upstream", where, str),
        root=_resolve(_get(t, "root", where, str), base_dir),
        inputs=tuple(inputs),
        filters=_parse_filters(_get(t, "filters", where, dict, {}), f"{where}.filters"),
        share=share,
        content_store=None if store is None else
        (store if "://" in store or os.path.isabs(store) else _resolve(store, base_dir)),
    )


def _parse_schedule(t: dict, where: str) -> ScheduleSpec:
    phases_raw = _get(t, "phases", where, list)
    phases = []
    for i, p in enumerate(phases_raw):
        pw = f"{where}.phases[{i}]"
        if not isinstance(p, dict):
            raise MixSpecError(f"{pw}: expected a table, got {p!r}")
        phase = Phase(_get(p, "start_tokens", pw, int), _get(p, "batch_sequences", pw, int))
        _positive(phase.batch_sequences, f"{pw}.batch_sequences")
        phases.append(phase)
    if not phases or phases[0].start_tokens != 0:
        raise MixSpecError(f"{where}.phases: the first phase must start at 0 tokens, got "
                           f"{phases_raw!r}")
    if any(b.start_tokens <= a.start_tokens for a, b in zip(phases, phases[1:])):
        raise MixSpecError(f"{where}.phases: start_tokens must increase strictly, got "
                           f"{[p.start_tokens for p in phases]}")
    spec = ScheduleSpec(
        seq_tokens=_get(t, "seq_tokens", where, int),
        micro_batch=_get(t, "micro_batch", where, int),
        reference_world=_get(t, "reference_world", where, int),
        phases=tuple(phases),
        stop_tokens=_get(t, "stop_tokens", where, int),
        lr_peak=_get(t, "lr_peak", where, float),
        lr_final_ratio=_get(t, "lr_final_ratio", where, float),
        warmup_tokens=_get(t, "warmup_tokens", where, int),
    )
    for name in ("seq_tokens", "micro_batch", "reference_world", "stop_tokens", "lr_peak"):
        _positive(getattr(spec, name), f"{where}.{name}")
    if not 0 <= spec.lr_final_ratio <= 1:
        raise MixSpecError(f"{where}.lr_final_ratio: must be in [0, 1], got "
                           f"{spec.lr_final_ratio!r}")
    if not 0 <= spec.warmup_tokens < spec.stop_tokens:
        raise MixSpecError(f"{where}.warmup_tokens: must be in [0, stop_tokens), got "
                           f"{spec.warmup_tokens!r}")
    for i, p in enumerate(spec.phases):
        if p.batch_sequences % (spec.micro_batch * spec.reference_world):
            raise MixSpecError(
                f"{where}.phases[{i}].batch_sequences: {p.batch_sequences} is not a multiple "
                f"of micro_batch*reference_world = {spec.micro_batch * spec.reference_world}")
    return spec


def parse_mix(data: dict, base_dir: str = ".", path: str = "") -> MixSpec:
    """Validate a parsed TOML document into a ``MixSpec``."""
    where = "mix"
    m = _get(data, "mix", "", dict)
    tok = _get(data, "tokenizer", "", dict)
    sh = _get(data, "shards", "", dict)
    sources_raw = _get(data, "sources", "", list)
    if not sources_raw:
        raise MixSpecError("sources: a mix needs at least one [[sources]] table")
    sources = tuple(_parse_source(s, f"sources[{i}]", base_dir) for i, s in enumerate(sources_raw))
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise MixSpecError(f"sources: source names must be unique, got {names}")
    tokenizer = TokenizerSpec(
        vocab_size=_get(tok, "vocab_size", "tokenizer", int),
        split_pattern=_get(tok, "split_pattern", "tokenizer", str, LLAMA3_SPLIT),
        eot=_get(tok, "eot", "tokenizer", str, "<|endoftext|>"),
        sample_bytes=_get(tok, "sample_bytes", "tokenizer", int, 100_000_000),
        min_frequency=_get(tok, "min_frequency", "tokenizer", int, 2),
        max_token_length=_get(tok, "max_token_length", "tokenizer", int, 32),
    )
    if not 257 <= tokenizer.vocab_size < 2**32:
        raise MixSpecError(f"tokenizer.vocab_size: must be in [257, 2^32), got "
                           f"{tokenizer.vocab_size!r}")
    _positive(tokenizer.sample_bytes, "tokenizer.sample_bytes")
    shards = ShardSpec(
        tokens_per_shard=_get(sh, "tokens_per_shard", "shards", int),
        docs_per_row_group=_get(sh, "docs_per_row_group", "shards", int, 1024),
        zstd_level=_get(sh, "zstd_level", "shards", int, 3),
    )
    _positive(shards.tokens_per_shard, "shards.tokens_per_shard")
    _positive(shards.docs_per_row_group, "shards.docs_per_row_group")
    spec = MixSpec(
        name=_get(m, "name", where, str),
        seed=_get(m, "seed", where, int),
        window=_get(m, "window", where, int),
        sources=sources,
        tokenizer=tokenizer,
        shards=shards,
        schedule=_parse_schedule(_get(data, "schedule", "", dict), "schedule"),
        path=path,
    )
    if not 0 <= spec.seed < 2**64:
        raise MixSpecError(f"mix.seed: must be in [0, 2^64), got {spec.seed!r}")
    if spec.window != spec.schedule.seq_tokens + 1:
        raise MixSpecError(f"mix.window: must be schedule.seq_tokens + 1 = "
                           f"{spec.schedule.seq_tokens + 1} (inputs + shifted labels), got "
                           f"{spec.window!r}")
    return spec


def load_mix(path: str | os.PathLike) -> MixSpec:
    """Read and validate a mix definition TOML file."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise MixSpecError(f"mix file {path!r} does not exist; pass --manifest with a path to "
                           f"a mix definition such as manifests/demo.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise MixSpecError(f"mix file {path!r} is not valid TOML: {e}") from None
    return parse_mix(data, base_dir=os.path.dirname(os.path.abspath(path)), path=path)


def default_mix_path() -> str:
    """The embedded demo mix definition (``manifests/demo.toml`` in the source tree)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # open1b_data/
    return os.path.join(os.path.dirname(package), "manifests", "demo.toml")
