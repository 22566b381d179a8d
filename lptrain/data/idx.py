"""Reader for IDX files (the MNIST container format), raw or gzipped."""
from __future__ import annotations

import gzip
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


def idx_count(path: Path) -> int:
    """Items in an IDX file (its first dimension), from the header alone."""
    try:
        with path.open("rb") as raw:
            head = raw.read(2)
        opener = gzip.open if head == GZIP_MAGIC else open
        with opener(path, "rb") as f:
            header = f.read(8)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{path}: cannot read ({err})") from err
    if len(header) < 8:
        raise DataError(f"{path}: shorter than an IDX header")
    return int.from_bytes(header[4:8], "big")


def parse_idx(content: bytes, ndim: int, origin: Path | str) -> np.ndarray:
    """Array stored in the IDX bytes `content`, which must have `ndim` dimensions.

    Layout: two zero bytes, a type code, the number of dimensions, then one
    big-endian uint32 per dimension and the elements in C order.
    """
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
    dtype = IDX_TYPES[content[2]]
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    found = len(content) - header
    if found != size:
        what = "truncated IDX data" if found < size else "trailing bytes after IDX data"
        raise DataError(f"{origin}: {what}: shape {shape} needs {size} bytes, found {found}")
    data = np.frombuffer(content, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Array in the IDX file `path` (raw or gzipped) with `ndim` dimensions."""
    return parse_idx(read_bytes(path), ndim, path)
