"""What to do with an open HDF5 file whose writes fail (not for want of space: the
writer keeps a reserve for that).

HDF5 keeps a file it could not flush open, with its unwritten cache, and its clean-up
at the process's exit crashes on it (a segmentation fault after lptrain's own error
line). `discard` ends such a file without writing to it again; `write_failure` says why
the write failed in one line (HDF5's message spans lines and repeats its internals).
"""
from __future__ import annotations

import os
import re

import h5py

from lptrain.errors import one_line

_SYSTEM_REASON = re.compile(r"error message = '([^']*)'")


def write_failure(exc: BaseException) -> str:
    """The system's reason for a failed HDF5 write (e.g. `Operation not permitted`),
    else the error's text in one line."""
    strerror = getattr(exc, "strerror", None)
    if strerror:
        return strerror
    found = _SYSTEM_REASON.search(str(exc))
    return found.group(1) if found else one_line(exc)


def descriptor(file: h5py.File) -> int | None:
    """The file descriptor HDF5 writes `file` through, None where it has none (a
    driver other than the default)."""
    try:
        handle = file.id.get_vfd_handle()
    except (OSError, RuntimeError, ValueError, AttributeError):
        return None
    return handle if isinstance(handle, int) else None


def discard(file: h5py.File, fd: int | None) -> None:
    """Close `file` without writing to it: its descriptor `fd` (from `descriptor`) is
    pointed at the null device first, so that the close writes its cache there and
    leaves nothing for HDF5's exit (a close that fails on the file itself cannot be
    taken again: h5py crashes). The file on disk stays as it was last flushed."""
    if fd is not None:
        null = os.open(os.devnull, os.O_RDWR)
        try:
            os.dup2(null, fd)
        except OSError:
            pass
        finally:
            os.close(null)
    try:
        file.close()
    except (OSError, RuntimeError, ValueError):
        pass
