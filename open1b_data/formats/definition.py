"""The mix definition: a TOML file in ``manifests/`` parsed once into frozen dataclasses.

Contract: nothing downstream reads the raw TOML dict. ``load_mix(path)`` validates every
field and raises ``MixSpecError`` naming the field (dotted path, e.g. ``sources[1].share``)
and the offending value: a key no table defines is an error naming the nearest valid key
(a typo must not silently change the data), every number is range-checked (the ranges are
in docs/FORMATS.md), and declared source shares must sum to exactly 1 as written unless
``[mix] shares = "proportional"`` (``_check_shares``).
Relative input locations resolve against the TOML file's directory; URLs (``s3://...``)
are kept as they are. ``MixSpec.to_dict()`` is the canonical, JSON-serializable form that
the built manifest embeds (so a built mix records exactly what definition produced it).
"""
from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

from open1b_data.formats.heldout import parse_fraction
from open1b_data.formats.tomltable import Interval, TomlTable
from open1b_data.errors import MixSpecError

FORMATS = ("dclm", "fineweb-edu", "stack-v2", "proof-pile-2")
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class FilterSpec:
    """The ingest filters that apply to one source (Mix 0626 has exactly three).

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
    heldout: str | None = None        # this source's held-out fraction (overrides [heldout])

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
    # the content digest (formats/tokenizerfile.py) the trained tokenizer must have: a
    # ``tokenizers`` version that trains other merges is then caught at build time
    expect: str | None = None


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
    """Batch ramp and learning-rate schedule, both functions of consumed tokens."""

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
    shares: str = "fractions"  # or "proportional": declared shares are normalized weights
    heldout: str | None = None  # [heldout] fraction: every source's, unless it sets its own
    path: str = field(default="", compare=False)

    def heldout_fraction(self, name: str) -> Fraction | None:
        """Source ``name``'s held-out fraction (exact), or None: it holds nothing out.
        (``formats/heldout.py`` states the rule.)"""
        text = self.source(name).heldout
        text = self.heldout if text is None else text
        return None if text is None else Fraction(text)

    def target_shares(self) -> tuple[float | None, ...]:
        """Each source's target token share as the manifest records it (``target_share``):
        the declared share, or with ``shares = "proportional"`` the share divided by their
        sum (exact, then rounded once to the nearest float); None where none is declared
        (the stream then splits what is left in proportion to tokens)."""
        if self.shares != "proportional":
            return tuple(s.share for s in self.sources)
        total = sum(_exact(s.share) for s in self.sources)
        return tuple(float(_exact(s.share) / total) for s in self.sources)

    def source(self, name: str) -> SourceSpec:
        for s in self.sources:
            if s.name == name:
                return s
        raise MixSpecError(f"mix {self.name!r} has no source {name!r}; sources: "
                           f"{[s.name for s in self.sources]}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("path")
        # the held-out keys enter the definition (and so the fingerprint) only when set:
        # a mix without them keeps the definition, and the fingerprint, it always had
        if d["heldout"] is None:
            d.pop("heldout")
        else:                                   # as the TOML table writes it
            d["heldout"] = {"fraction": d["heldout"]}
        for src in d["sources"]:
            if src["heldout"] is None:
                src.pop("heldout")
        if d["tokenizer"]["expect"] is None:
            d["tokenizer"].pop("expect")
        return d


# ---------------------------------------------------------------------------------------
# Parsing: every table through a ``TomlTable`` (unknown keys refused, every value typed and
# range-checked, errors naming the dotted field). The valid keys of a table are the fields
# of the dataclass it becomes; [mix] and the top level list theirs.

def _keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


TOP_KEYS = ("mix", "tokenizer", "shards", "schedule", "sources", "heldout")
HELDOUT_KEYS = ("fraction",)
MIX_KEYS = ("name", "seed", "window", "shares")
SHARE_MODES = ("fractions", "proportional")

# Valid ranges (docs/FORMATS.md "Valid values" states each and why).
SEEDS = Interval(0, 2**64)
VOCAB = Interval(257, 2**32)              # 256 byte tokens + the separator; uint32 ids
AT_LEAST_1 = Interval(1)
MAX_TOKEN_LENGTH = Interval(1, 2**16, hi_open=False)
TOKENS_PER_SHARD = Interval(1, 2**30, hi_open=False)   # headroom below list<> int32 offsets
ROWS_PER_GROUP = Interval(1, 2**31)
ZSTD_LEVEL = Interval(1, 22, hi_open=False)
NON_NEGATIVE = Interval(0)
LR_PEAK = Interval(0, 1, lo_open=True, hi_open=False)
RATIO = Interval(0, 1, hi_open=False)
EDU_SCORE = Interval(0, 5, hi_open=False)  # FineWeb-Edu's score and int_score scale
SHARE = Interval(0, 1, lo_open=True, hi_open=False)
WEIGHT = Interval(0, lo_open=True)


def _resolve(root: str, base_dir: str) -> str:
    if "://" in root or os.path.isabs(root):
        return root
    return os.path.normpath(os.path.join(base_dir, root))


def _parse_filters(t: TomlTable) -> FilterSpec:
    spec = FilterSpec(
        drop_empty=t.boolean("drop_empty", True),
        score_field=t.string("score_field", None),
        min_score=t.number("min_score", EDU_SCORE, None),
        license_field=t.string("license_field", None),
        license_allowed=t.strings("license_allowed", ()),
        size_field=t.string("size_field", None),
        max_bytes=t.integer("max_bytes", AT_LEAST_1, None),
    )
    if (spec.score_field is None) != (spec.min_score is None):
        raise MixSpecError(f"{t.where}: score_field and min_score go together, got "
                           f"{spec.score_field!r} and {spec.min_score!r}")
    if (spec.license_field is None) != (not spec.license_allowed):
        raise MixSpecError(f"{t.where}: license_field and license_allowed go together, got "
                           f"{spec.license_field!r} and {list(spec.license_allowed)!r}")
    if (spec.size_field is None) != (spec.max_bytes is None):
        raise MixSpecError(f"{t.where}: size_field and max_bytes go together, got "
                           f"{spec.size_field!r} and {spec.max_bytes!r}")
    return spec


def _parse_source(t: TomlTable, base_dir: str, shares: str) -> SourceSpec:
    fmt = t.string("format")
    if fmt not in FORMATS:
        raise MixSpecError(f"{t.name('format')}: unknown format {fmt!r}; expected one of "
                           f"{FORMATS}")
    name = t.string("name")
    if "/" in name:
        raise MixSpecError(f"{t.name('name')}: must be a name without '/', got {name!r}")
    store = t.string("content_store", None)
    if fmt == "stack-v2" and (store is None or "{blob_id}" not in store):
        raise MixSpecError(f"{t.name('content_store')}: stack-v2 needs a URL template "
                           f"containing '{{blob_id}}', got {store!r}")
    if fmt != "stack-v2" and store is not None:
        raise MixSpecError(f"{t.name('content_store')}: only stack-v2 sources fetch content "
                           f"by blob_id; remove it from this {fmt} source")
    return SourceSpec(
        name=name,
        format=fmt,
        upstream=t.string("upstream"),
        root=_resolve(t.string("root"), base_dir),
        inputs=t.strings("inputs"),  # glob patterns under root
        filters=_parse_filters(t.table("filters", _keys(FilterSpec), required=False)),
        share=t.number("share", SHARE if shares == "fractions" else WEIGHT, None),
        content_store=None if store is None else _resolve(store, base_dir),
        heldout=_heldout(t, "heldout"),
    )


def _heldout(t: TomlTable, key: str, required: bool = False) -> str | None:
    """A held-out fraction, kept as the decimal string written (checked: [0, 1))."""
    if key in t.data and not isinstance(t.data[key], str):
        parse_fraction(t.data[key], t.name(key))      # raises, asking for a string
    text = t.string(key) if required else t.string(key, None)
    if text is not None:
        parse_fraction(text, t.name(key))
    return text


def _digest(t: TomlTable, key: str) -> str | None:
    """An optional content digest: 64 lowercase hex digits."""
    text = t.string(key, None)
    if text is not None and not re.fullmatch(r"[0-9a-f]{64}", text):
        raise MixSpecError(f"{t.name(key)}: expected a content digest of 64 lowercase hex "
                           f"digits (what `open1b-data build-mix --json` reports as "
                           f"tokenizer_content), got {text!r}")
    return text


def _exact(x: float) -> Fraction:
    """A declared share as the exact decimal written (the stream reads it the same way)."""
    return Fraction(repr(x))


def _decimal(x: Fraction) -> str:
    with localcontext() as ctx:
        ctx.prec = 60
        return str(Decimal(x.numerator) / Decimal(x.denominator))


def _check_shares(sources: tuple[SourceSpec, ...], mode: str) -> None:
    """The shares rule (docs/FORMATS.md "Source shares")."""
    declared = [s for s in sources if s.share is not None]
    total = sum((_exact(s.share) for s in declared), Fraction(0))
    listed = ", ".join(f"{s.name}={s.share!r}" for s in declared)
    undeclared = [s.name for s in sources if s.share is None]
    if mode == "proportional":
        if undeclared:
            raise MixSpecError(f"mix.shares = \"proportional\" needs a share on every source; "
                               f"{undeclared} declare none (add share = <weight> to each)")
    elif declared and not undeclared and total != 1:
        raise MixSpecError(f"sources[*].share: declared shares sum to {_decimal(total)}, not 1 "
                           f"({listed}); fix them so they sum to exactly 1, or set [mix] "
                           f"shares = \"proportional\" to have them normalized")
    elif declared and undeclared and total >= 1:
        raise MixSpecError(f"sources[*].share: declared shares sum to {_decimal(total)}, "
                           f"leaving nothing for {undeclared}, which declare none ({listed}); "
                           f"lower the shares below 1 in sum, or declare every source's share")


def _split_pattern(t: TomlTable) -> str:
    """``tokenizer.split_pattern``, compiled by the engine that will run it (Oniguruma,
    through HF tokenizers): a pattern that does not compile fails here, naming itself, not
    minutes into a build with the regex library's own exception."""
    pattern = t.string("split_pattern", LLAMA3_SPLIT)
    if pattern == LLAMA3_SPLIT:
        return pattern
    from tokenizers import Regex

    try:
        Regex(pattern)
    except Exception as e:  # tokenizers raises a plain Exception for a bad pattern
        raise MixSpecError(f"{t.name('split_pattern')}: {pattern!r} is not a valid regular "
                           f"expression ({e}); fix it, or remove the key to use the "
                           f"Llama-3 pattern") from None
    return pattern


def _parse_schedule(data: dict | TomlTable, where: str = "schedule") -> ScheduleSpec:
    """``[schedule]``; also reads a built manifest's ``definition["schedule"]``."""
    t = data if isinstance(data, TomlTable) else TomlTable(data, where, _keys(ScheduleSpec))
    stop = t.integer("stop_tokens", AT_LEAST_1)
    phases = tuple(Phase(p.integer("start_tokens", NON_NEGATIVE),
                         p.integer("batch_sequences", AT_LEAST_1))
                   for p in t.tables("phases", _keys(Phase)))
    if phases[0].start_tokens != 0:
        raise MixSpecError(f"{t.name('phases')}: the first phase must start at 0 tokens, got "
                           f"{t.data['phases']!r}")
    starts = [p.start_tokens for p in phases]
    if any(b <= a for a, b in zip(starts, starts[1:])):
        raise MixSpecError(f"{t.name('phases')}: start_tokens must increase strictly, got "
                           f"{starts}")
    if starts[-1] >= stop:
        raise MixSpecError(f"{t.name('phases')}[{len(starts) - 1}].start_tokens: {starts[-1]:,} "
                           f"is not below stop_tokens = {stop:,}; the phase would never run")
    spec = ScheduleSpec(
        seq_tokens=t.integer("seq_tokens", Interval(1, 2**31)),
        micro_batch=t.integer("micro_batch", AT_LEAST_1),
        reference_world=t.integer("reference_world", AT_LEAST_1),
        phases=phases,
        stop_tokens=stop,
        lr_peak=t.number("lr_peak", LR_PEAK),
        lr_final_ratio=t.number("lr_final_ratio", RATIO),
        warmup_tokens=t.integer("warmup_tokens", Interval(0, stop)),
    )
    for i, p in enumerate(spec.phases):
        if p.batch_sequences % (spec.micro_batch * spec.reference_world):
            raise MixSpecError(
                f"{t.name('phases')}[{i}].batch_sequences: {p.batch_sequences} is not a "
                f"multiple of micro_batch*reference_world = "
                f"{spec.micro_batch * spec.reference_world}")
    return spec


def parse_mix(data: dict, base_dir: str = ".", path: str = "") -> MixSpec:
    """Validate a parsed TOML document into a ``MixSpec``."""
    top = TomlTable(data, "", TOP_KEYS)
    m = top.table("mix", MIX_KEYS)
    shares = m.string("shares", "fractions")
    if shares not in SHARE_MODES:
        raise MixSpecError(f"mix.shares: must be one of {SHARE_MODES}, got {shares!r}")
    sources = tuple(_parse_source(t, base_dir, shares)
                    for t in top.tables("sources", _keys(SourceSpec)))
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise MixSpecError(f"sources: source names must be unique, got {names}")
    _check_shares(sources, shares)
    tok = top.table("tokenizer", _keys(TokenizerSpec))
    sh = top.table("shards", _keys(ShardSpec))
    spec = MixSpec(
        name=m.string("name"),
        seed=m.integer("seed", SEEDS),
        window=m.integer("window", AT_LEAST_1),
        sources=sources,
        tokenizer=TokenizerSpec(
            vocab_size=tok.integer("vocab_size", VOCAB),
            split_pattern=_split_pattern(tok),
            eot=tok.string("eot", "<|endoftext|>"),
            sample_bytes=tok.integer("sample_bytes", AT_LEAST_1, 100_000_000),
            min_frequency=tok.integer("min_frequency", AT_LEAST_1, 2),
            max_token_length=tok.integer("max_token_length", MAX_TOKEN_LENGTH, 32),
            expect=_digest(tok, "expect"),
        ),
        shards=ShardSpec(
            tokens_per_shard=sh.integer("tokens_per_shard", TOKENS_PER_SHARD),
            docs_per_row_group=sh.integer("docs_per_row_group", ROWS_PER_GROUP, 1024),
            zstd_level=sh.integer("zstd_level", ZSTD_LEVEL, 3),
        ),
        schedule=_parse_schedule(top.table("schedule", _keys(ScheduleSpec))),
        shares=shares,
        heldout=_heldout(top.table("heldout", HELDOUT_KEYS), "fraction", required=True)
        if "heldout" in data else None,
        path=path,
    )
    if spec.window != spec.schedule.seq_tokens + 1:
        raise MixSpecError(f"mix.window: must be schedule.seq_tokens + 1 = "
                           f"{spec.schedule.seq_tokens + 1} (inputs + shifted labels), got "
                           f"{spec.window!r}")
    return spec


def _toml_shaped(d: Any) -> Any:
    """A ``to_dict`` value as TOML would hold it: no nulls, no empty lists (both mean
    "absent" to the parser)."""
    if isinstance(d, dict):
        return {k: _toml_shaped(v) for k, v in d.items()
                if v is not None and not (isinstance(v, (list, tuple)) and not v)}
    if isinstance(d, (list, tuple)):
        return [_toml_shaped(v) for v in d]
    return d


def spec_from_definition(definition: dict[str, Any], roots: dict[str, str] | None = None,
                         content_stores: dict[str, str] | None = None,
                         base_dir: str = ".") -> MixSpec:
    """The ``MixSpec`` a built manifest's embedded definition (``to_dict`` form) describes,
    validated as a TOML file would be, with the sources kept elsewhere: ``roots`` and
    ``content_stores`` replace those of the named sources (a content store under the old
    root moves with it); relative locations resolve against ``base_dir``."""
    d = _toml_shaped(definition)
    data: dict[str, Any] = {
        "mix": {k: d[k] for k in ("name", "seed", "window", "shares") if k in d},
        "tokenizer": d.get("tokenizer", {}), "shards": d.get("shards", {}),
        "schedule": d.get("schedule", {}), "sources": []}
    if "heldout" in d:
        data["heldout"] = d["heldout"]
    for src in d.get("sources", []):
        src = dict(src)
        new = (roots or {}).get(src.get("name"))
        if new is not None:
            old = src.get("root", "")
            store = src.get("content_store")
            if store and old and store.startswith(old.rstrip("/") + "/"):
                src["content_store"] = new.rstrip("/") + store[len(old.rstrip("/")):]
            src["root"] = new
        store = (content_stores or {}).get(src.get("name"))
        if store is not None:
            src["content_store"] = store
        data["sources"].append(src)
    return parse_mix(data, base_dir=base_dir)


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
    except UnicodeDecodeError as e:
        raise MixSpecError(f"mix file {path!r} is not valid TOML: not UTF-8 text (byte "
                           f"{e.start}); pass a mix definition such as manifests/demo.toml"
                           ) from None
    except OSError as e:
        raise MixSpecError(f"mix file {path!r} cannot be read: {e.strerror or e}; pass a "
                           f"readable mix definition such as manifests/demo.toml") from None
    if not data:
        raise MixSpecError(f"mix file {path!r} is empty; a mix definition has [mix], "
                           f"[[sources]], [tokenizer], [shards] and [schedule] tables (see "
                           f"manifests/demo.toml)")
    return parse_mix(data, base_dir=os.path.dirname(os.path.abspath(path)), path=path)


def default_mix_path() -> str:
    """The embedded demo mix definition (``manifests/demo.toml`` in the source tree)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # open1b_data/
    return os.path.join(os.path.dirname(package), "manifests", "demo.toml")
