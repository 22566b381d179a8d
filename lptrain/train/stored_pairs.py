"""L-BFGS's pairs in a checkpoint entry of their own, read by each rank where it needs them.

A record that holds the (s, y) pairs as tensors is read whole by every resuming rank,
which keeps only its part of each vector (train/shards.py): 2m vectors of θ's size,
about 4 GB for `experiment=indian_pines_deep` at m = 20, on every rank of a node at
once.  From checkpoint format 4 the pairs' bytes lie one after another in the archive
entry PAIRS_ENTRY (stored, not compressed), and the record says where each vector lies
(`pairs_apart`).  Reading the record turns those places into `StoredVector`s
(`stored_in`), which read a slice from the file when the optimizer takes its part.
Records of format 3 and older hold the tensors themselves and load as before.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from lptrain.errors import InputFileError
from lptrain.model.zip_entry import entry_span

PAIRS_ENTRY = "pairs.bin"


def pairs_apart(record: dict) -> tuple[dict, list[torch.Tensor]]:
    """(the record with each vector of its optimizer's pairs replaced by where it lies in
    PAIRS_ENTRY, the vectors in that order); a record without pairs as it is."""
    opt = record.get("optimizer")
    mem = opt.get("mem") if isinstance(opt, dict) else None
    if not mem:
        return record, []
    vectors, offset, places = [], 0, []
    for s, y, rho in mem:
        pair = []
        for v in (s, y):
            pair.append({"offset": offset, "numel": v.numel(),
                         "dtype": str(v.dtype).removeprefix("torch.")})
            offset += v.numel() * v.element_size()
            vectors.append(v)
        places.append([*pair, rho])
    return {**record, "optimizer": {**opt, "mem": places}}, vectors


def stored_in(path: Path, record: dict) -> dict:
    """`record` with the places of pairs_apart as StoredVectors of the checkpoint at
    `path`; InputFileError when PAIRS_ENTRY is missing or shorter than they say."""
    opt = record.get("optimizer")
    mem = opt.get("mem") if isinstance(opt, dict) else None
    if not mem or not isinstance(mem[0][0], dict):
        return record                         # no pairs, or tensors (format ≤ 3)
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
             for s, y, rho in mem]
    return {**record, "optimizer": {**opt, "mem": pairs}}


def _vector(path: Path, start: int, size: int, place: dict) -> "StoredVector":
    dtype = getattr(torch, str(place.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise InputFileError(f"{path}: checkpoint's pairs have dtype {place.get('dtype')!r}")
    item = torch.tensor([], dtype=dtype).element_size()
    end = place["offset"] + place["numel"] * item
    if end > size:
        raise InputFileError(f"{path}: checkpoint's {PAIRS_ENTRY} holds {size} bytes, "
                             f"its record places a vector up to byte {end}")
    return StoredVector(path, start + place["offset"], place["numel"], dtype)


class StoredVector:
    """A vector of `numel` values of `dtype` at byte `start` of the file `path`, read
    when sliced (what LBFGS.load_state_dict and train/shards.py take of a pair)."""

    def __init__(self, path: Path, start: int, numel: int, dtype: torch.dtype):
        self.path, self.start, self.numel, self.dtype = Path(path), start, numel, dtype
        self.item = torch.tensor([], dtype=dtype).element_size()

    def __len__(self) -> int:
        return self.numel

    def __getitem__(self, index: slice) -> torch.Tensor:
        lo, hi, step = index.indices(self.numel)
        if step != 1:
            raise ValueError(f"a stored vector is read in contiguous slices, not step {step}")
        out = torch.empty(max(hi - lo, 0), dtype=self.dtype)
        view = memoryview(out.view(torch.uint8).numpy())
        with open(self.path, "rb") as f:
            f.seek(self.start + lo * self.item)
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise InputFileError(f"{self.path}: checkpoint's {PAIRS_ENTRY} ends "
                                         f"early")
                done += got
        return out

    def clone(self) -> torch.Tensor:
        """The whole vector (one rank keeps all of it)."""
        return self[:]
