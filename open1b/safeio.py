"""Reading files a run's owner (or anyone else) wrote: regular files only, JSON as data.

An auditor reads run directories, certificates and traces made by others. Three things a
plain ``open`` + ``json.loads`` does not refuse:

* a FIFO, socket or device file in place of a file: ``open`` of a FIFO blocks until a
  writer appears (a replay that hangs forever), ``/dev/zero`` never ends. ``read_regular``
  opens with ``O_NONBLOCK`` (a FIFO opens at once), checks ``fstat`` says regular file and
  only then reads;
* JSON nested deeply enough to exhaust Python's recursion (``RecursionError``, not a
  ``ValueError``);
* JSON of the wrong shape: ``read_json_object`` requires an object.

Every refusal is ``error(message)`` (the caller's error class: a ``CheckpointError`` for a
checkpoint, ...) naming the path and what to do; nothing here raises a bare ``OSError``.
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any

from open1b.errors import Open1bError


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: str, what: str = "file", error=Open1bError) -> bytes:
    """The bytes of ``path``, which must be a regular file (see the module docstring)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot open the {what} ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: the {what} is {_kind(st.st_mode)}, not a regular file; "
                        f"refusing to read it (replace it with the published file)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror})") from None
    finally:
        os.close(fd)


def parse_json(data: bytes | str, where: str, error=Open1bError) -> Any:
    """``json.loads`` that turns every failure (bad syntax, bad UTF-8, nesting too deep for
    the parser) into ``error`` naming ``where``."""
    try:
        return json.loads(data)
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to be a record of this tool; the file "
                    f"was crafted or damaged") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise error(f"{where}: not valid JSON ({e})") from None


def read_json_object(path: str, what: str = "file", error=Open1bError) -> dict[str, Any]:
    """A regular file holding one JSON object."""
    obj = parse_json(read_regular(path, what, error), path, error)
    if not isinstance(obj, dict):
        raise error(f"{path}: the {what} must hold a JSON object, it holds "
                    f"{type(obj).__name__}")
    return obj
