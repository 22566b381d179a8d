"""MATLAB files: the v5 reader against scipy's on scipy- and MATLAB-written files, and every
damaged file ending in MatFileError (never a crash or another exception)."""
import struct
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io

from lptrain.data.matfile import HEADER_BYTES, MatFileError, read_variables

# MATLAB-written files of versions 5 to 7.4, little- and big-endian, that scipy ships
SCIPY_MAT_DIR = Path(scipy.io.__file__).parent / "matlab" / "tests" / "data"


def by_name(path):
    return {v.name: v for v in read_variables(path)}


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "int32", "int64", "float32",
                                   "float64", "bool"])
def test_v5_reader_gives_what_scipy_wrote(tmp_path, dtype, compress):
    rng = np.random.default_rng(0)
    cube = (rng.integers(-50, 3000, (5, 4, 3)) % (2 if dtype == "bool" else 3000)).astype(dtype)
    path = tmp_path / "x.mat"
    # a one-letter name is a small data element; a scalar's value is one too
    scipy.io.savemat(path, {"a_long_variable_name": cube, "g": cube[:, :, 0],
                            "s": np.array(7, dtype="uint8")}, do_compression=compress)
    got = by_name(path)
    assert set(got) == {"a_long_variable_name", "g", "s"}
    for name, want in (("a_long_variable_name", cube), ("g", cube[:, :, 0])):
        assert got[name].array.dtype == want.dtype
        np.testing.assert_array_equal(got[name].array, want)
    assert got["s"].array.tolist() == [[7]]


def _matlab_files():
    if not SCIPY_MAT_DIR.is_dir():
        return []
    # v4 files (the *_4.2c_* ones and a few others) have no v5 header; lptrain refuses them
    return sorted(p for p in SCIPY_MAT_DIR.glob("*_[67].*.mat") if "hdf5" not in p.name)


@pytest.mark.skipif(not _matlab_files(), reason="scipy's MATLAB test files are not installed")
def test_v5_reader_matches_scipy_on_matlab_written_files():
    compared = 0
    for path in _matlab_files():
        want = {k: v for k, v in scipy.io.loadmat(path).items() if not k.startswith("__")}
        got = by_name(path)
        assert set(got) == set(want), path.name
        for name, var in got.items():
            if var.array is None:        # cells, structs, text, sparse, complex: named only
                assert not (isinstance(want[name], np.ndarray)
                            and want[name].dtype.kind in "biuf"), (path.name, name)
                continue
            np.testing.assert_array_equal(var.array, want[name], err_msg=path.name)
            compared += 1
    assert compared >= 20


def _tag(mtype: int, payload: bytes, endian: str = "<", pad: bool = True) -> bytes:
    """A data element; inside a variable (`pad`) up to 4 bytes make a small element."""
    if pad and len(payload) <= 4:
        return struct.pack(endian + "I", mtype | len(payload) << 16) + payload.ljust(4, b"\0")
    body = payload + b"\0" * (-len(payload) % 8 if pad else 0)
    return struct.pack(endian + "II", mtype, len(payload)) + body


def _handmade(values: np.ndarray, endian: str, name=b"cube", dims_type=5) -> bytes:
    """A v5 file of one double variable, written element by element."""
    header = b"MATLAB 5.0 MAT-file, test".ljust(124) + (
        b"\x01\x00IM" if endian == "<" else b"\x01\x00MI")
    header = header[:124] + struct.pack(endian + "H", 0x0100) + header[126:]
    dims = np.array(values.shape, dtype=endian + ("i4" if dims_type == 5 else "u4"))
    parts = (_tag(6, struct.pack(endian + "II", 6, 0), endian)
             + _tag(dims_type, dims.tobytes(), endian) + _tag(1, name, endian)
             + _tag(9, values.astype(endian + "f8").ravel(order="F").tobytes(), endian))
    return header + _tag(14, parts, endian, pad=False)


@pytest.mark.parametrize("endian", ["<", ">"])
@pytest.mark.parametrize("dims_type", [5, 6])
def test_handmade_files_of_either_byte_order(tmp_path, endian, dims_type):
    values = np.arange(24, dtype=float).reshape(2, 3, 4) - 5.5
    path = tmp_path / "h.mat"
    path.write_bytes(_handmade(values, endian, dims_type=dims_type))
    np.testing.assert_array_equal(by_name(path)["cube"].array, values)


NAME_AT = HEADER_BYTES + 8 + 16 + 24     # after the flags and 3 dimensions
VALUES_AT = NAME_AT + 8                  # after a name of up to 4 bytes


def _retyped(data: bytes, pos: int, word: int) -> bytes:
    """`data` with the first word of the tag at `pos` replaced."""
    return data[:pos] + struct.pack("<I", word) + data[pos + 4:]


@pytest.mark.parametrize("damage, message", [
    ("overrun", "a small data element of 100 bytes"),
    ("unknown_type", "the values of 'cub' stored as data type 25609"),   # scipy: SIGBUS
    ("truncated", "truncated"),
    ("junk", "bytes after the last data element"),
    ("v4", "no MAT-file header"),
    ("short", "shorter than a MAT-file header"),
    ("hdf5_header", "a v7.3 header without HDF5 data"),
    ("values", "24 values for dimensions 2x3x5"),
    ("zlib", "does not decompress"),
])
def test_damage_is_named(tmp_path, damage, message):
    values = np.arange(24, dtype=float).reshape(2, 3, 4)
    data = _handmade(values, "<", name=b"cub")    # a 3-byte name: a small element
    data = {
        "overrun": lambda: _retyped(data, NAME_AT, 1 | 100 << 16),
        "unknown_type": lambda: _retyped(data, VALUES_AT, 0x6409),
        "truncated": lambda: data[:-9],
        "junk": lambda: data + b"\x07" * 5,
        "v4": lambda: b"\0" * 200,
        "short": lambda: data[:100],
        "hdf5_header": lambda: data[:124] + b"\x00\x02IM" + data[128:],
        "values": lambda: data.replace(struct.pack("<iii", 2, 3, 4), struct.pack("<iii", 2, 3, 5)),
        "zlib": lambda: data[:HEADER_BYTES] + _tag(15, zlib.compress(data[HEADER_BYTES:])[:-6],
                                                   pad=False),
    }[damage]()
    path = tmp_path / "d.mat"
    path.write_bytes(data)
    with pytest.raises(MatFileError, match=message):
        read_variables(path)


def test_variables_that_are_not_numbers_are_named(tmp_path):
    path = tmp_path / "m.mat"
    scipy.io.savemat(path, {"text": "abc", "cells": np.array([[1, "a"]], dtype=object),
                            "z": np.ones((2, 2)) * 1j, "n": np.ones((2, 3))})
    got = by_name(path)
    assert got["n"].array.shape == (2, 3)
    assert {k: v.kind for k, v in got.items() if v.array is None} == {
        "text": "text 1x3", "cells": "a cell array 1x2", "z": "complex float64 2x2"}


def test_v73_text_is_not_numbers(tmp_path):
    path = tmp_path / "t.mat"
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset("label", data=np.frombuffer(b"hello", np.uint8).astype(np.uint16))
        f["label"].attrs["MATLAB_class"] = np.bytes_("char")
        f.create_dataset("x", data=np.ones((3, 2)))
    got = by_name(path)
    assert got["label"].array is None and got["label"].kind == "char 5"
    assert got["x"].array.shape == (2, 3)       # column-major: axes reversed


def _sources(tmp_path) -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    cube = rng.integers(0, 9000, (6, 5, 4)).astype(np.uint16)
    found = {}
    for label, compress in (("v5", False), ("v5 compressed", True)):
        path = tmp_path / f"{label}.mat"
        scipy.io.savemat(path, {"cube": cube, "g": cube[:, :, 0] % 17},
                         do_compression=compress)
        found[label] = path.read_bytes()
    path = tmp_path / "v73.mat"
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset("cube", data=cube.T)
    found["v7.3"] = path.read_bytes()
    return found


@pytest.mark.parametrize("source", ["v5", "v5 compressed", "v7.3"])
def test_every_damaged_file_ends_in_a_mat_file_error(tmp_path, source):
    """Fixed-seed truncations and byte changes: each either reads (undetectable damage
    to values) or raises MatFileError; scipy's reader crashed the process on some."""
    data = _sources(tmp_path)[source]
    rng = np.random.default_rng(7)
    cases = [data[:int(n)] for n in rng.integers(0, len(data), 40)]
    for _ in range(160):
        damaged = bytearray(data)
        for _ in range(int(rng.integers(1, 6))):
            damaged[int(rng.integers(0, min(len(data), 1024)))] = int(rng.integers(0, 256))
        cases.append(bytes(damaged))
    path = tmp_path / "case.mat"
    outcomes = {"read": 0, "refused": 0}
    for case in cases:
        path.write_bytes(case)
        try:
            read_variables(path)
            outcomes["read"] += 1
        except MatFileError:
            outcomes["refused"] += 1
    assert outcomes["refused"] >= 40, outcomes
