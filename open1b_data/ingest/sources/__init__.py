"""Source readers: list the input files of a source and stream each one's records.

Contracts:
- ``list_inputs(spec)`` returns every file under ``spec.root`` matching any of
  ``spec.inputs`` (glob patterns), sorted by '/'-separated relative path, each with its
  size and checksum (``storage.list_files``). No match at all is a configuration error
  (``BuildError`` naming the source, root and patterns), never an empty source.
- ``read_input(spec, inp)`` streams one input in bounded memory as ``Document`` /
  ``Dropped`` records in file order. It never raises for bad data: every bad record is a
  ``Dropped`` with its row; a truncated zstd stream ends with one
  ``Dropped("truncated_zstd")`` at the row that was cut; an input that cannot be opened, or
  fails mid-way (I/O error, corrupt Parquet or compressed data), ends with one
  ``Dropped("unreadable_file")`` (row ``None`` when nothing could be read, else the next
  row). The source's filters are applied inside the reader, at the earliest point the
  fields allow (Stack v2 license/size before any content fetch). A ``Dropped`` detail names
  the input by its path under the source root (and a Stack v2 blob by its id), never by
  the URL it was read from, so it can go into the manifest. No credentials or no network
  is not bad data: it raises ``StorageError`` and the build stops (rerun it once the
  storage is reachable), so a passing outage never becomes an "unreadable" input recorded
  in a deterministic manifest.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from open1b_data import storage
from open1b_data.ingest.document import Document, Dropped
from open1b_data.errors import BuildError, FileAccessError, StorageError
from open1b_data.formats.definition import SourceSpec


@dataclass(frozen=True)
class InputFile:
    """One input file of a source.

    ``checksum`` is the hex SHA-256 of the file's bytes, or ``"etag:<ETag>"`` where an
    object store publishes an ETag (see ``storage.checksum_of``).
    """

    path: str  # relative to the source root, '/'-separated
    url: str   # absolute URL or local path to open
    size: int
    checksum: str

    def manifest_entry(self) -> dict[str, Any]:
        """The ``inputs`` entry of the built manifest (docs/FORMATS.md)."""
        if self.checksum.startswith("etag:"):
            return {"path": self.path, "size": self.size, "etag": self.checksum[5:]}
        return {"path": self.path, "size": self.size, "sha256": self.checksum}


def _reader(fmt: str):
    from open1b_data.ingest.sources import dclm, fineweb_edu, proof_pile_2, stack_v2

    readers = {"dclm": dclm.read, "fineweb-edu": fineweb_edu.read,
               "stack-v2": stack_v2.read, "proof-pile-2": proof_pile_2.read}
    if fmt not in readers:
        raise BuildError(f"no reader for format {fmt!r}; known formats: {sorted(readers)}")
    return readers[fmt]


def list_inputs(spec: SourceSpec, checksums: bool = True) -> list[InputFile]:
    """The input files of ``spec``, sorted by relative path (module contract)."""
    try:
        files = storage.list_files(spec.root, spec.inputs, checksums=checksums,
                                   follow=True)
    except FileNotFoundError:
        raise BuildError(f"source {spec.name!r}: root {spec.root!r} does not exist; fix "
                         f"sources.root in the mix file or mount/point it at the data") from None
    except StorageError as e:
        raise BuildError(f"source {spec.name!r}: {e}; or point sources.root in the mix "
                         f"file at a copy you can read") from e
    if not files:
        raise BuildError(f"source {spec.name!r}: no file under {spec.root!r} matches "
                         f"{list(spec.inputs)}; check sources.root and sources.inputs")
    return [InputFile(f.path, f.url, f.size, f.checksum) for f in files]


# Errors that mean "this input cannot be read (any further)". Anything else is a bug in
# the pipeline and must surface, not be counted as bad data.
def _input_errors() -> tuple[type[BaseException], ...]:
    import pyarrow as pa

    return (OSError, EOFError, pa.ArrowException, storage.CorruptInputError)


def read_input(spec: SourceSpec, inp: InputFile) -> Iterator[Document | Dropped]:
    """Every record of ``inp`` as a ``Document`` or ``Dropped`` (module contract)."""
    read = _reader(spec.format)
    next_row = 0
    started = False
    try:
        for rec in read(spec, inp.path, inp.url):
            started = True
            if rec.row is not None:
                next_row = rec.row + 1
            yield rec
    except storage.TruncatedInputError as e:
        reason = ("truncated_zstd" if storage.compression_of(inp.url) == "zstd" else
            "unreadable_file")
        yield Dropped(reason, inp.path, next_row, _portable(str(e), inp))
    except _input_errors() as e:
        # The backend's own exception where storage wrapped it: the detail goes into the
        # manifest, and it reads the same as in builds before storage named its failures.
        cause = e.__cause__ if isinstance(e, FileAccessError) and e.__cause__ else e
        yield Dropped("unreadable_file", inp.path, next_row if started else None,
                      _portable(f"{type(cause).__name__}: {cause}", inp))


def _portable(detail: str, inp: InputFile) -> str:
    """``detail`` naming the input by its path under the source root, never by where it
    was read from: details go into the manifest, which must not depend on the mount point
    or bucket (a local and an S3 build of one corpus record the same)."""
    _, fs_path = storage.url_to_fs(inp.url)
    return detail.replace(inp.url, inp.path).replace(fs_path, inp.path)


__all__ = ["InputFile", "list_inputs", "read_input", "Document", "Dropped"]
