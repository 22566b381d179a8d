"""The variables of a MATLAB file: v5/v7 parsed here, every type and length checked; v7.3
by h5py.

scipy's reader trusts the types a v5 file declares (a damaged type field crashes the
process), so v5 files are parsed here. The file is a 128-byte header, then data elements:
an 8-byte tag (type, byte count) and the bytes, or a "small" element whose 1–4 bytes sit
inside the tag. A variable is a miMATRIX element (possibly zlib-compressed in a
miCOMPRESSED one) holding its flags and class, dimensions, name and real part, in
column-major order. Only numeric arrays are returned as arrays; other variables (cells,
structs, text, sparse or complex matrices) by what they are, so that a message can name
them. Any flaw raises MatFileError.
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

HEADER_BYTES = 128
V5, V73 = 0x0100, 0x0200
MI_NUMBERS = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8",
              12: "i8", 13: "u8"}   # data element type -> element dtype
MI_MATRIX, MI_COMPRESSED, MI_UTF8 = 14, 15, 16
FLAG_TYPES, DIMENSION_TYPES = {6}, {5, 6}     # uint32; int32 (some writers: uint32)
NAME_TYPES = {1, 2, MI_UTF8}                  # int8 (MATLAB), uint8, UTF-8
NUMERIC_CLASSES = {6: "f8", 7: "f4", 8: "i1", 9: "u1", 10: "i2", 11: "u2", 12: "i4",
                   13: "u4", 14: "i8", 15: "u8"}   # mxClass -> array dtype
OTHER_CLASSES = {1: "a cell array", 2: "a struct", 3: "an object", 4: "text",
                 5: "a sparse matrix"}
COMPLEX, LOGICAL = 0x08, 0x02     # array flag bits
# MATLAB_class attributes of v7.3 datasets that hold numbers
HDF5_NUMERIC = {"double", "single", "logical", "int8", "uint8", "int16", "uint16", "int32",
                "uint32", "int64", "uint64"}


class MatFileError(ValueError):
    """The bytes are not a readable MATLAB file; the message says where they fail."""


@dataclass(frozen=True)
class Variable:
    """One variable: `array` for numbers (None otherwise), `kind` in words."""

    name: str
    array: np.ndarray | None
    kind: str

    def describe(self) -> str:
        return f"{self.name} ({self.kind})"


def read_variables(path: Path) -> list[Variable]:
    """Every variable of the MATLAB file at `path` (OSError, MatFileError)."""
    if h5py.is_hdf5(path):
        return _hdf5_variables(path)
    data = Path(path).read_bytes()
    if len(data) < HEADER_BYTES:
        raise MatFileError(f"{len(data)} bytes, shorter than a MAT-file header")
    endian = {b"IM": "<", b"MI": ">"}.get(data[126:128])
    if endian is None:
        raise MatFileError("no MAT-file header of v5, v7 or v7.3 (v4 files are not read: "
                           "save with -v7)")
    version = struct.unpack_from(endian + "H", data, 124)[0]
    if version == V73:
        raise MatFileError("a v7.3 header without HDF5 data after it")
    if version != V5:
        raise MatFileError(f"MAT-file version 0x{version:04x}, expected v5, v7 or v7.3")
    return [_matrix(payload, endian) for payload in _variables(data[HEADER_BYTES:], endian)]


def _elements(buf: bytes, endian: str, padded: bool):
    """(type, bytes) of the data elements in `buf`; `padded`: each one is followed by
    zeros to a multiple of 8 bytes (inside a variable)."""
    pos = 0
    while pos + 8 <= len(buf):
        mtype, size = struct.unpack_from(endian + "II", buf, pos)
        if mtype >> 16:                      # small element: the size is the upper half
            mtype, size = mtype & 0xFFFF, mtype >> 16
            if size > 4:
                raise MatFileError(f"a small data element of {size} bytes (at most 4)")
            yield mtype, buf[pos + 4:pos + 4 + size]
            pos += 8
            continue
        end = pos + 8 + size
        if end > len(buf):
            raise MatFileError(f"a data element of {size} bytes with {len(buf) - pos - 8} "
                               f"left (truncated)")
        yield mtype, buf[pos + 8:end]
        pos = end + (-size % 8 if padded else 0)
    if pos < len(buf) and any(buf[pos:]):
        raise MatFileError(f"{len(buf) - pos} bytes after the last data element")


def _variables(buf: bytes, endian: str):
    """The miMATRIX payload of every variable, decompressed where compressed."""
    for mtype, payload in _elements(buf, endian, padded=False):
        if mtype == MI_COMPRESSED:
            try:
                inner = zlib.decompress(payload)
            except zlib.error as exc:
                raise MatFileError(f"a compressed variable that does not decompress "
                                   f"({exc})") from None
            found = list(_elements(inner, endian, padded=False))
            if len(found) != 1:
                raise MatFileError(f"a compressed element holding {len(found)} elements")
            mtype, payload = found[0]
        if mtype != MI_MATRIX:
            raise MatFileError(f"a data element of type {mtype} where a variable belongs")
        if payload:                          # an empty miMATRIX: MATLAB's empty cell
            yield payload


def _numbers(element, types, endian: str, what: str) -> np.ndarray:
    """The values of a data element whose type is one of `types` (any number: None)."""
    mtype, payload = element
    if mtype not in (types or MI_NUMBERS):
        raise MatFileError(f"{what} stored as data type {mtype}")
    if mtype == MI_UTF8:
        return np.frombuffer(payload, np.uint8)
    dtype = np.dtype(endian + MI_NUMBERS[mtype])
    if len(payload) % dtype.itemsize:
        raise MatFileError(f"{what} of {len(payload)} bytes, not whole {dtype.name} values")
    return np.frombuffer(payload, dtype)


def _matrix(payload: bytes, endian: str) -> Variable:
    parts = list(_elements(payload, endian, padded=True))
    if len(parts) < 3:
        raise MatFileError("a variable without its flags, dimensions and name")
    flags = _numbers(parts[0], FLAG_TYPES, endian, "array flags")
    shape = tuple(int(d) for d in _numbers(parts[1], DIMENSION_TYPES, endian, "dimensions"))
    name = _numbers(parts[2], NAME_TYPES, endian, "a variable name").tobytes().decode(
        "utf-8", errors="replace")
    if flags.size < 1 or not shape or min(shape) < 0:
        raise MatFileError(f"variable {name!r}: flags {flags.tolist()}, "
                           f"dimensions {list(shape)}")
    klass, bits = int(flags[0]) & 0xFF, (int(flags[0]) >> 8) & 0xFF
    dims = "x".join(map(str, shape))
    if klass not in NUMERIC_CLASSES:
        return Variable(name, None, f"{OTHER_CLASSES.get(klass, f'class {klass}')} {dims}")
    dtype = np.dtype(bool) if bits & LOGICAL else np.dtype(NUMERIC_CLASSES[klass])
    if bits & COMPLEX:
        return Variable(name, None, f"complex {dtype.name} {dims}")
    if len(parts) < 4:
        raise MatFileError(f"variable {name!r} without its values")
    values = _numbers(parts[3], None, endian, f"the values of {name!r}")
    if values.size != math.prod(shape):
        raise MatFileError(f"variable {name!r}: {values.size} values for dimensions {dims}")
    return Variable(name, values.astype(dtype).reshape(shape, order="F"), f"{dtype.name} {dims}")


def _hdf5_variables(path: Path) -> list[Variable]:
    """The top-level datasets of a v7.3 file; MATLAB wrote them column-major, so h5py
    sees every axis reversed."""
    try:
        with h5py.File(path, "r") as f:
            found = []
            for name, item in f.items():
                if not isinstance(item, h5py.Dataset):
                    found.append(Variable(name, None, "a struct or group"))
                    continue
                klass = item.attrs.get("MATLAB_class", b"double")
                klass = klass.decode("latin-1") if isinstance(klass, bytes) else str(klass)
                dims = "x".join(map(str, item.shape[::-1]))
                if klass not in HDF5_NUMERIC or item.dtype.kind not in "biuf":
                    found.append(Variable(name, None, f"{klass} {dims}"))
                    continue
                array = item[()].T
                found.append(Variable(name, array.astype(bool) if klass == "logical"
                                      else array, f"{klass} {dims}"))
            return found
    # h5py answers a damaged file with OSError, RuntimeError, KeyError, ValueError or
    # TypeError, depending on where the damage is: each means the same here
    except Exception as exc:  # noqa: BLE001 - re-raised as this file's error
        raise MatFileError(f"damaged HDF5 data ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
