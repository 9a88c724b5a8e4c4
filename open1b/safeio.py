"""Reading files a run's owner (or anyone else) wrote: regular files only, links never
followed, JSON as data; and writing where others may have planted names.

An auditor reads run directories, mixes, certificates and traces made by others. What a
plain ``open`` + ``json.loads`` does not refuse:

* a FIFO, socket or device file in place of a file: ``open`` of a FIFO blocks until a
  writer appears (a replay that hangs forever), ``/dev/zero`` never ends. ``open_regular``
  opens with ``O_NONBLOCK`` (a FIFO opens at once), checks ``fstat`` says regular file and
  only then reads;
* a symbolic link in place of a file: a certificate that is a link to a secret of the
  auditor's machine would be read (and, by a tool that republishes what it read, served).
  ``open_regular`` opens with ``O_NOFOLLOW``: a link as the file's last component is
  refused, naming the link (a directory the auditor named may itself be a link: the path
  they typed is theirs, the names inside it are the owner's);
* JSON nested deeply enough to exhaust Python's recursion (``RecursionError``, not a
  ``ValueError``);
* JSON of the wrong shape: ``read_json_object`` requires an object.

Writing into a folder others can write to (a shared certificate folder, a run directory):
``write_atomic`` creates its temporary file with ``mkstemp`` in the target's folder (a
fresh name, ``O_CREAT | O_EXCL``: a name planted there - a link to a file of the auditor's
- is never opened) and renames it over the target (a rename replaces a link, never writes
through it).

Every refusal is ``error(message)`` (the caller's error class: a ``CheckpointError`` for a
checkpoint, ...) naming the path and what to do; nothing here raises a bare ``OSError``.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from open1b.errors import Open1bError


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_fd(path: str, what: str = "file", error=Open1bError, follow: bool = False) -> int:
    """A read-only descriptor of ``path``, which must be a regular file (and, unless
    ``follow``, not a symbolic link); blocking reads (the ``O_NONBLOCK`` that kept a FIFO
    from hanging the open is cleared once the file is known to be regular)."""
    try:
        fd = os_open(path, what, error, follow)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except OSError as e:
        if isinstance(e, Open1bError):
            raise
        raise error(f"{path}: cannot open the {what} ({e.strerror})") from None
    return regular_fd(fd, path, what, error)


def os_open(path: str, what: str = "file", error=Open1bError, follow: bool = False) -> int:
    """``os.open`` for reading without blocking on a FIFO and, unless ``follow``, without
    following a link (refused as ``error``); other failures stay ``OSError`` (for callers
    that translate them themselves). Pass the descriptor to ``regular_fd``."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    except OSError as e:
        if not follow and e.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise error(f"{path}: the {what} is a symbolic link; refusing to follow it "
                        f"(replace it with the published file itself)") from None
        raise


def refuse_linked_dirs(root: str, path: str, what: str = "file", error=Open1bError) -> None:
    """Refuse ``path`` when a folder between ``root`` (the folder the user named: theirs,
    link or not) and ``path``'s own folder is a symbolic link: names inside a run or a mix
    are the owner's, and ``checkpoints -> /home/auditor`` would send every read below it
    onto the auditor's machine. The last component is ``os_open``'s (``O_NOFOLLOW``).
    A folder swapped for a link after this check is the time-of-check race every
    path-based reader has; the hashes then refuse what was read."""
    rel = os.path.relpath(os.path.dirname(path), root)
    if rel == "." or rel.startswith(".."):
        return
    here = root
    for part in rel.split(os.sep):
        here = os.path.join(here, part)
        if os.path.islink(here):
            raise error(f"{here}: a folder inside {root} is a symbolic link; refusing to read "
                        f"the {what} {path} through it (replace the link with the published "
                        f"folder itself)")


def regular_fd(fd: int, path: str, what: str = "file", error=Open1bError) -> int:
    """``fd`` once ``fstat`` says it is a regular file, in blocking mode; else it is closed
    and ``error`` names what it is."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: the {what} is {_kind(st.st_mode)}, not a regular file; "
                        f"refusing to read it (replace it with the published file)")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def open_regular(path: str, what: str = "file", error=Open1bError,
                 follow: bool = False) -> Iterator[IO[bytes]]:
    """``path`` open for binary reading once it is known to be a regular file (not a
    link unless ``follow``); ``OSError`` while reading becomes ``error``."""
    fd = open_fd(path, what, error, follow)
    try:
        with os.fdopen(fd, "rb") as f:
            yield f
    except OSError as e:
        if isinstance(e, Open1bError):      # an error class that is also an OSError
            raise
        raise error(f"{path}: cannot read the {what} ({e.strerror})") from None


def read_regular(path: str, what: str = "file", error=Open1bError) -> bytes:
    """The bytes of ``path``, which must be a regular file (see the module docstring)."""
    with open_regular(path, what, error) as f:
        return f.read()


def write_atomic(path: str, data: bytes, mode: int = 0o644, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` through an exclusively created temporary file in its
    folder, fsynced (unless ``fsync`` is off: a page that can be rewritten), then renamed
    over ``path`` (module docstring)."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
