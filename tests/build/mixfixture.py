"""Small four-source mixes for build tests, cut from the committed demo corpus.

``small_mix(dst, ...)`` copies the first ``inputs_per_source`` inputs of every demo source,
each cut to its first ``docs`` records in the SAME upstream format (jsonl.zstd / jsonl.zst
re-compressed, parquet re-written), plus the Stack v2 content blobs, and writes a mix TOML
beside them with a small vocabulary and small shards (so one input spans several shards).
``break_inputs`` then damages a copy in the ways the readers must survive.
"""
from __future__ import annotations

import io
import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import zstandard

from open1b_data.build.definition import default_mix_path, load_mix
from open1b_data.build.sources import list_inputs


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def dump_toml(data: dict[str, Any]) -> str:
    """Enough TOML for a mix file: tables, arrays of tables, one level of sub-tables."""
    out: list[str] = []

    def table(name: str, t: dict[str, Any], array: bool = False) -> None:
        out.append(f"[[{name}]]" if array else f"[{name}]")
        subs = []
        for k, v in t.items():
            if isinstance(v, dict):
                subs.append((k, v, False))
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                subs.append((k, v, True))
            else:
                out.append(f"{k} = {_toml_value(v)}")
        out.append("")
        for k, v, arr in subs:
            if arr:
                for item in v:
                    table(f"{name}.{k}", item, array=True)
            else:
                table(f"{name}.{k}", v)

    for key, value in data.items():
        if isinstance(value, list):
            for item in value:
                table(key, item, array=True)
        else:
            table(key, value)
    return "\n".join(out)


def _cut(src: str, dst: Path, docs: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.endswith(".parquet"):
        table = pq.read_table(src).slice(0, docs)
        pq.write_table(table, dst, compression="zstd")
    elif src.endswith((".zst", ".zstd")):
        with open(src, "rb") as f:
            raw = zstandard.ZstdDecompressor().stream_reader(f).read()
        lines = raw.rstrip(b"\n").split(b"\n")[:docs]
        dst.write_bytes(zstandard.ZstdCompressor(level=3).compress(b"\n".join(lines) + b"\n"))
    else:
        with open(src, "rb") as f:
            dst.write_bytes(b"\n".join(f.read().rstrip(b"\n").split(b"\n")[:docs]) + b"\n")


def small_mix(dst: Path, docs: int = 40, inputs_per_source: int = 2, vocab: int = 1024,
              tokens_per_shard: int = 20_000) -> Path:
    """Write a small demo-shaped mix under ``dst``; returns the TOML path."""
    demo_path = default_mix_path()
    demo = load_mix(demo_path)
    with open(demo_path, "rb") as f:
        raw = tomllib.load(f)
    for spec, table in zip(demo.sources, raw["sources"]):
        root = dst / "corpus" / spec.name
        for inp in list_inputs(spec)[:inputs_per_source]:
            _cut(inp.url, root / inp.path, docs)
        table["root"] = f"corpus/{spec.name}"
        if spec.content_store is not None:
            store_dir = spec.content_store.split("{blob_id}")[0].rstrip("/")
            shutil.copytree(store_dir, dst / "corpus" / f"{spec.name}-content")
            suffix = spec.content_store.split("{blob_id}")[1]
            table["content_store"] = f"corpus/{spec.name}-content/{{blob_id}}{suffix}"
    raw["mix"]["name"] = "small"
    raw["tokenizer"]["vocab_size"] = vocab
    raw["tokenizer"]["sample_bytes"] = min(raw["tokenizer"].get("sample_bytes", 10**9), 400_000)
    raw["shards"]["tokens_per_shard"] = tokens_per_shard
    raw["shards"]["docs_per_row_group"] = 8
    path = dst / "small.toml"
    path.write_text(dump_toml(raw))
    load_mix(path)  # fail here, not in the test, if the fixture is invalid
    return path


def break_inputs(mix_path: Path) -> dict[str, int]:
    """Damage the small mix in place: a malformed JSON line, a truncated zstd input, a
    missing Stack v2 blob. Returns the reasons expected to appear (at least once each)."""
    mix = load_mix(mix_path)
    expected = {}
    for spec in mix.sources:
        inputs = list_inputs(spec)
        if spec.format == "dclm":
            # Malformed JSON line in the middle of the first input.
            url = inputs[0].url
            with open(url, "rb") as f:
                lines = zstandard.ZstdDecompressor().stream_reader(f).read().split(b"\n")
            lines.insert(3, b'{"text": "unterminated')
            Path(url).write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines)))
            expected["malformed_json"] = 1
        elif spec.format == "proof-pile-2":
            # Truncated zstd frame: the tail of the compressed file is gone.
            url = inputs[-1].url
            data = Path(url).read_bytes()
            Path(url).write_bytes(data[: len(data) * 2 // 3])
            expected["truncated_zstd"] = 1
        elif spec.format == "stack-v2":
            # A blob that the metadata names but the content store lacks.
            table = pq.read_table(inputs[0].url)
            allowed = set(spec.filters.license_allowed)
            for row in table.to_pylist():
                if (row[spec.filters.license_field] in allowed
                        and row[spec.filters.size_field] <= spec.filters.max_bytes):
                    os.unlink(spec.content_store.format(blob_id=row["blob_id"]))
                    break
            expected["missing_blob"] = 1
    return expected


def read_parquet_bytes(data: bytes) -> Any:
    return pq.read_table(io.BytesIO(data))
