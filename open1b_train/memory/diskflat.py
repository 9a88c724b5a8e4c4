"""A flat float32 buffer kept in a file on disk, read and written in chunks.

The ``lean`` memory plan (``memplan.py``) keeps the Adam moments here instead of in RAM:
the optimizer update reads a chunk of m and v, runs the same per-element AdamW on it and
writes it back, so only a chunk of each is resident at a time. The file is read and
written with ``pread`` / ``pwrite`` into buffers the process owns, not ``mmap``: pages of a
mapped file count in the process's resident set (``VmRSS`` / ``VmHWM``) until unmapped,
while the page cache behind ``pread`` is the kernel's to evict - the plan's peak is then
what the process holds, and it is what is reported. The values are float32 little-endian
in model order (``params.Layout``), the same bytes a resident moment holds.

Files live in ``RUN/memplan/`` (``scratch_dir``), never elsewhere: the directory must be a
real directory inside the run directory (not a symlink), and a file is created with
``O_CREAT | O_EXCL | O_NOFOLLOW``. A leftover regular file of a process that is gone is
removed; anything else at a file's name (a FIFO, a device, a symlink, a directory) is
refused with a ``MemoryPlanError`` naming it. A ``DiskFlat`` is removed when closed.

Every write records the CRC-32 of the bytes it wrote, by range; a read of a range written
as a whole (the update, the streamed load and the digests all read the moments in the
pieces they were written in) compares the bytes it gets: a bit flipped on disk between
the two is a ``SpillError`` naming the file - a local fault, never moments with other bits
(which a replay would report as the run's mismatch). A range read otherwise (never written
as one piece) is not checked. A range no write has touched is
returned as zeros without a read (by blocks of TOUCH elements): it holds the zeros the file
was created with, whatever the file says now.
"""
from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator

import numpy as np
import torch

from open1b_train.errors import MemoryPlanError, SpillError

SCRATCH = "memplan"
CHUNK = 1 << 22         # elements per chunk (16 MiB of float32; a multiple of the 4,096 ALIGN)
# Elements per block of the record of what was written (``DiskFlat.read``): params.ALIGN,
# where every parameter - so every update's chunk - starts, so a write never marks the
# block where the next chunk's read begins
TOUCH = 4096


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def scratch_dir(run_dir: str) -> str:
    """``RUN/memplan``, created if missing; refused unless a real directory in ``run_dir``."""
    path = os.path.join(run_dir, SCRATCH)
    os.makedirs(run_dir, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise MemoryPlanError(f"{path} is {_kind(st.st_mode)}; the memory plan's files go in "
                              f"a real directory inside the run directory - remove it")
    if os.path.realpath(path) != os.path.join(os.path.realpath(run_dir), SCRATCH):
        raise MemoryPlanError(f"{path} resolves outside the run directory "
                              f"({os.path.realpath(path)}); remove it")
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_stale(directory: str) -> None:
    """Remove regular files ``*-<pid>-*`` of processes that are gone (a killed run's)."""
    for name in os.listdir(directory):
        parts = name.split("-")
        if len(parts) < 3 or not parts[1].isdigit() or _alive(int(parts[1])):
            continue
        path = os.path.join(directory, name)
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)


class DiskFlat:
    """``numel`` float32 values in ``directory/<tag>-<pid>-<n>.f32``, zero when created."""

    _count = 0

    def __init__(self, directory: str, tag: str, numel: int) -> None:
        DiskFlat._count += 1
        self.path = os.path.join(directory, f"{tag}-{os.getpid()}-{DiskFlat._count}.f32")
        self.numel = numel
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            st = os.lstat(self.path)
            raise MemoryPlanError(f"{self.path} already exists and is "
                                  f"{_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}"
                                  f"; refusing to use it - remove it") from None
        os.ftruncate(self.fd, numel * 4)          # a sparse file of zeros
        self._sums: dict[tuple[int, int], int] = {}   # (start, count) written -> its CRC-32
        # the TOUCH-element blocks any write has touched: a range in none of them still
        # holds the zeros the file was created with, and is returned as zeros unread
        self._touched = np.zeros(-(-numel // TOUCH), dtype=bool)

    def read(self, start: int, end: int) -> torch.Tensor:
        """Elements [start, end) as a new CPU tensor; zeros without reading the file where
        no write has touched the range (the first update's moments: at Open-1B's size 12.8
        GB not read back from a sparse file whose pages the kernel fills with zeros)."""
        if end > start and not self._touched[start // TOUCH:(end - 1) // TOUCH + 1].any():
            return torch.zeros(end - start, dtype=torch.float32)
        buf = np.empty(end - start, dtype="<f4")
        view, off = memoryview(buf).cast("B"), start * 4
        while len(view):
            n = os.preadv(self.fd, [view], off)
            if n <= 0:
                raise MemoryPlanError(f"{self.path}: short read at byte {off} (the file was "
                                      f"truncated while in use)")
            view, off = view[n:], off + n
        want = self._sums.get((start, end - start))
        if want is not None and zlib.crc32(memoryview(buf).cast("B")) != want:
            raise SpillError(f"{self.path}: elements {start}..{end} are not what this process "
                             f"wrote there (CRC-32 differs): the file changed on disk; run again")
        return torch.from_numpy(buf)

    def write(self, start: int, t: torch.Tensor) -> None:
        """Elements [start, start + t.numel()) = t (float32)."""
        data = memoryview(t.detach().to("cpu", torch.float32).contiguous().numpy()).cast("B")
        end = start + len(data) // 4
        if end > start:
            self._touched[start // TOUCH:(end - 1) // TOUCH + 1] = True
        for k in [k for k in self._sums if k[0] < end and start < k[0] + k[1]]:
            del self._sums[k]                     # overwritten, in part or whole
        self._sums[(start, end - start)] = zlib.crc32(data)
        off = start * 4
        while len(data):
            n = os.pwrite(self.fd, data, off)
            data, off = data[n:], off + n

    def chunks(self, start: int, end: int, chunk: int = CHUNK) -> Iterator[tuple[int, torch.Tensor]]:
        """(offset, elements) over [start, end) in chunks."""
        for a in range(start, end, chunk):
            yield a, self.read(a, min(a + chunk, end))

    def fill_from(self, start: int, parts) -> None:
        """Write consecutive 1-D ``parts`` from ``start``."""
        for t in parts:
            self.write(start, t)
            start += t.numel()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass
