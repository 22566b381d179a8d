"""Reader for IDX files (the MNIST container format), raw or gzipped."""
from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from lptrain.errors import DataError, reason

# IDX type code (third magic byte) -> big-endian element type
IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: Path) -> bytes:
    """Whole content of `path`, decompressed when it starts with the gzip magic."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"{path}: cannot read ({reason(err)})") from err
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as err:
        raise DataError(f"{path}: corrupt or truncated gzip stream ({err})") from err


def idx_header(path: Path, ndim: int) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and element type of the IDX file `path`, read from its header and checked
    against the file's size (a gzipped file's size is in its trailer), without reading
    the data: a damaged file is named before its sizes are used."""
    try:
        with path.open("rb") as raw:
            zipped = raw.read(2) == GZIP_MAGIC
            if zipped:        # ISIZE: the uncompressed size modulo 2**32
                raw.seek(-4, 2)
                content_size = int.from_bytes(raw.read(4), "little")
            else:
                content_size = raw.seek(0, 2)
        with (gzip.open if zipped else open)(path, "rb") as f:
            head = f.read(4 + 4 * ndim)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{path}: cannot read ({err})") from None
    shape, dtype, header = _header(head, ndim, path)
    if not zipped:
        _check_size(content_size - header, shape, dtype, path)
        return shape, dtype
    needed = header + math.prod(shape) * dtype.itemsize
    if (needed - content_size) % 2 ** 32:
        raise DataError(f"{path}: its gzip trailer records {content_size} bytes, the IDX "
                        f"header of shape {shape} needs {needed} (a truncated or damaged "
                        f"file)")
    return shape, dtype


def _header(content: bytes, ndim: int, origin) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, element type, header bytes) of the IDX bytes `content` (DataError)."""
    expected = 0x0800 + ndim
    if len(content) < 4:
        raise DataError(f"{origin}: truncated IDX file, {len(content)} bytes is no header")
    magic = int.from_bytes(content[:4], "big")
    if content[:2] != b"\0\0" or content[2] not in IDX_TYPES or content[3] != ndim:
        raise DataError(f"{origin}: wrong IDX magic number 0x{magic:08x}, expected "
                        f"0x{expected:08x} or another type code with {ndim} dimension(s)")
    header = 4 + 4 * ndim
    if len(content) < header:
        raise DataError(f"{origin}: truncated IDX header, {len(content)} of {header} bytes")
    shape = tuple(int.from_bytes(content[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return shape, IDX_TYPES[content[2]], header


def _check_size(found: int, shape, dtype: np.dtype, origin) -> None:
    """DataError unless `found` data bytes hold `shape`."""
    size = math.prod(shape) * dtype.itemsize
    if found == size:
        return
    what = "truncated IDX data" if found < size else "trailing bytes after IDX data"
    raise DataError(f"{origin}: {what}: shape {shape} needs {size} bytes, found {found}")


def parse_idx(content: bytes, ndim: int, origin: Path | str) -> np.ndarray:
    """Array stored in the IDX bytes `content`, which must have `ndim` dimensions.

    Layout: two zero bytes, a type code, the number of dimensions, then one
    big-endian uint32 per dimension and the elements in C order.
    """
    shape, dtype, header = _header(content, ndim, origin)
    _check_size(len(content) - header, shape, dtype, origin)
    data = np.frombuffer(content, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Array in the IDX file `path` (raw or gzipped) with `ndim` dimensions."""
    return parse_idx(read_bytes(path), ndim, path)
