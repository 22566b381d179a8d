"""L-BFGS's pairs in a checkpoint entry of their own, read by each rank where it needs them.

A record that holds the (s, y) pairs as tensors is read whole by every resuming rank,
which keeps only its part of each vector (train/shards.py): 2m vectors of θ's size,
about 4 GB for `experiment=indian_pines_deep` at m = 20, on every rank of a node at
once; and rank 0 gathers them all before writing.  From checkpoint format 4 the pairs'
bytes lie one after another in the archive entry PAIRS_ENTRY (stored, not compressed),
written as rank 0 receives each whole vector, and the record says where each vector
lies (`with_places`), with the CRC-32 of each 1 MiB block of it.  Reading the record
turns those places into `StoredVector`s (`stored_in`), which read a slice from the file
when the optimizer takes its part and check the blocks it lies in: between them the
ranks check every byte.
Records of format 3 and older hold the tensors themselves and load as before.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from lptrain.errors import InputFileError
from lptrain.model.zip_entry import BLOCK, crc_blocks, entry_span

PAIRS_ENTRY = "pairs.bin"


def has_pairs(record: dict | None) -> bool:
    """Whether `record`'s optimizer state has L-BFGS pairs."""
    opt = (record or {}).get("optimizer")
    return bool(opt.get("mem")) if isinstance(opt, dict) else False


def with_places(record: dict, places: list) -> dict:
    """`record`, whose optimizer's pairs hold None for their vectors (LBFGS.
    state_and_vectors), with where the vectors lie in PAIRS_ENTRY: `places`, the
    (offset, numel, dtype, block CRCs) of s₁, y₁, s₂, … as AtomicArchive.add_raw wrote
    them."""
    if not has_pairs(record):
        return record
    opt = record["optimizer"]
    if len(places) != 2 * len(opt["mem"]):
        raise ValueError(f"{len(places)} vectors written for {len(opt['mem'])} pairs")
    at = [{"offset": o, "numel": n, "dtype": str(d).removeprefix("torch."), "crc": crc,
           "block": BLOCK} for o, n, d, crc in places]
    mem = [[at[2 * i], at[2 * i + 1], rho] for i, (_, _, rho) in enumerate(opt["mem"])]
    return {**record, "optimizer": {**opt, "mem": mem}}


def stored_in(path: Path, record: dict) -> dict:
    """`record` with the places of with_places as StoredVectors of the checkpoint at
    `path`; InputFileError when PAIRS_ENTRY is missing or shorter than they say."""
    if not has_pairs(record) or not isinstance(record["optimizer"]["mem"][0][0], dict):
        return record                         # no pairs, or tensors (format ≤ 3)
    opt = record["optimizer"]
    try:
        with zipfile.ZipFile(path) as z:
            span = entry_span(z, PAIRS_ENTRY)
    except KeyError:
        raise InputFileError(f"{path}: checkpoint has no entry {PAIRS_ENTRY}") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise InputFileError(f"{path}: unreadable checkpoint ({exc})") from None
    if span is None:
        raise InputFileError(f"{path}: checkpoint's {PAIRS_ENTRY} is compressed")
    start, size = span
    pairs = [[*(_vector(path, start, size, place) for place in (s, y)), rho]
             for s, y, rho in opt["mem"]]
    return {**record, "optimizer": {**opt, "mem": pairs}}


def _vector(path: Path, start: int, size: int, place: dict) -> "StoredVector":
    dtype = getattr(torch, str(place.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise InputFileError(f"{path}: checkpoint's pairs have dtype {place.get('dtype')!r}")
    item = dtype.itemsize
    nbytes = place["numel"] * item
    if place["offset"] + nbytes > size:
        raise InputFileError(f"{path}: checkpoint's {PAIRS_ENTRY} holds {size} bytes, "
                             f"its record places a vector up to byte "
                             f"{place['offset'] + nbytes}")
    block, crc = int(place["block"]), list(place["crc"])
    if block % item or len(crc) != -(-nbytes // block):
        raise InputFileError(f"{path}: checkpoint's pairs have {len(crc)} checksums of "
                             f"{block} bytes for a vector of {nbytes} bytes")
    return StoredVector(path, start + place["offset"], place["numel"], dtype, crc, block)


class StoredVector:
    """A vector of `numel` values of `dtype` at byte `start` of the file `path`, read
    when sliced (what LBFGS.load_state_dict and train/shards.py take of a pair); `crc`
    holds the CRC-32 of each `block` bytes of it, which a slice checks for the blocks
    it reads."""

    def __init__(self, path: Path, start: int, numel: int, dtype: torch.dtype,
                 crc: list[int], block: int, device="cpu"):
        self.path, self.start, self.numel, self.dtype = Path(path), start, numel, dtype
        self.crc, self.block = crc, block
        self.device = device              # where a slice goes once read
        self.item = dtype.itemsize

    def to(self, device) -> "StoredVector":
        """This vector, its slices sent to `device` once read."""
        return StoredVector(self.path, self.start, self.numel, self.dtype, self.crc,
                            self.block, device)

    def __len__(self) -> int:
        return self.numel

    def __getitem__(self, index: slice) -> torch.Tensor:
        lo, hi, step = index.indices(self.numel)
        if step != 1:
            raise ValueError(f"a stored vector is read in contiguous slices, not step {step}")
        if hi <= lo:
            return torch.empty(0, dtype=self.dtype).to(self.device)
        first, last = lo * self.item // self.block, -(-hi * self.item // self.block)
        begin = first * self.block
        end = min(last * self.block, self.numel * self.item)
        data = bytearray(end - begin)
        self._read(begin, memoryview(data))
        found = crc_blocks(data, self.block)       # of blocks first .. last - 1
        bad = [first + i for i, (got, kept) in enumerate(zip(found, self.crc[first:last]))
               if got != kept]
        if bad:
            raise InputFileError(f"{self.path}: damaged checkpoint ({PAIRS_ENTRY}: the "
                                 f"bytes of a pair's block {bad[0]} do not match its "
                                 f"CRC-32)")
        values = torch.frombuffer(data, dtype=torch.uint8)
        part = values[lo * self.item - begin:hi * self.item - begin]
        return part.view(self.dtype).clone().to(self.device)

    def _read(self, begin: int, view: memoryview) -> None:
        """The vector's bytes from `begin` on into `view`."""
        with open(self.path, "rb") as f:
            f.seek(self.start + begin)
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise InputFileError(f"{self.path}: checkpoint's {PAIRS_ENTRY} ends "
                                         f"early")
                done += got

    def clone(self) -> torch.Tensor:
        """The whole vector (one rank keeps all of it)."""
        return self[:]
