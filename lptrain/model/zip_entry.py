"""One stored entry of a zip file read in place, as a file of its own.

A checkpoint's record entry holds several parameter-sized vectors (θ, its gradient, the
best θ; in format 3 also L-BFGS's 2m pairs).  Read with `ZipFile.read` it is in memory
twice while torch builds its tensors (the entry's bytes, then the tensors); read through
`EntryFile`, torch reads each tensor's bytes from the file into its storage, so a
resuming rank holds the tensors only; the entry's CRC-32 is checked first (`check_crc`),
as zipfile's own reads do.  Only entries stored without compression (model/saved.py AtomicArchive writes
those) lie in the file as they are; others are read whole.
"""
from __future__ import annotations

import io
import struct
import zipfile
import zlib

BLOCK = 1 << 20     # bytes per CRC-32 of a vector in a raw entry (crc_blocks)
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")    # the local file header before each entry
_LOCAL_MAGIC = b"PK\x03\x04"


def entry_span(z: zipfile.ZipFile, name: str) -> tuple[int, int] | None:
    """(offset of the entry's data in the file, its length) for an entry stored without
    compression; None for a compressed one.  KeyError for a name not in the zip,
    zipfile.BadZipFile for a damaged local header."""
    info = z.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    z.fp.seek(info.header_offset)
    header = z.fp.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        raise zipfile.BadZipFile(f"entry {name}: truncated header")
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != _LOCAL_MAGIC:
        raise zipfile.BadZipFile(f"entry {name}: bad header")
    name_len, extra_len = fields[-2], fields[-1]
    return info.header_offset + _LOCAL_HEADER.size + name_len + extra_len, info.file_size


def check_crc(raw, start: int, size: int, crc: int, name: str) -> None:
    """zipfile.BadZipFile unless the `size` bytes at `start` of the open file `raw` have
    the CRC-32 `crc` (what zipfile's own reads check; torch's reader does not)."""
    raw.seek(start)
    value, left = 0, size
    while left:
        chunk = raw.read(min(left, BLOCK))
        if not chunk:
            raise zipfile.BadZipFile(f"entry {name} ends {left} bytes early")
        value, left = zlib.crc32(chunk, value), left - len(chunk)
    if value != crc:
        raise zipfile.BadZipFile(f"Bad CRC-32 for file {name!r}")


def crc_blocks(data, block: int = BLOCK) -> list[int]:
    """The CRC-32 of each `block` bytes of the bytes-like `data` (the last one shorter):
    a reader of part of the data checks the blocks it reads."""
    view = memoryview(data).cast("B")
    return [zlib.crc32(view[i:i + block]) for i in range(0, len(view), block)]


class EntryFile(io.RawIOBase):
    """The bytes [start, start + size) of the open binary file `raw`, readable and
    seekable as a file of that length (positions relative to `start`)."""

    def __init__(self, raw, start: int, size: int):
        super().__init__()
        self.raw, self.start, self.size, self.pos = raw, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer) -> int:
        want = min(len(buffer), max(self.size - self.pos, 0))
        if want == 0:
            return 0
        self.raw.seek(self.start + self.pos)
        view = memoryview(buffer).cast("B")[:want]
        got = self.raw.readinto(view)
        if not got:
            raise EOFError(f"the entry ends at {self.pos} of its {self.size} bytes")
        self.pos += got
        return got
