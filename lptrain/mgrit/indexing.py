"""Positions in the solver's state buffers: pure index arithmetic, no MPI, no solver.

A list of positions that is an arithmetic progression becomes a slice, so
reading or writing those states is a view instead of a copy.
"""
from __future__ import annotations

from functools import lru_cache

import torch


def arithmetic_runs(positions: list[int]) -> list[list[int]]:
    """Split sorted positions into maximal arithmetic progressions."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and (len(runs[-1]) == 1 or p - runs[-1][-1] == runs[-1][1] - runs[-1][0]):
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def index_of(positions: list[int]):
    """A slice when positions are an arithmetic progression, else an index tensor
    (remembered per positions: a solver asks for the same ones every iteration; the
    tensor is only ever used to index)."""
    return _index_of(tuple(positions))


@lru_cache(maxsize=1 << 14)
def _index_of(positions: tuple[int, ...]):
    if len(positions) == 1:
        return slice(positions[0], positions[0] + 1)
    step = positions[1] - positions[0]
    if step > 0 and all(b - a == step for a, b in zip(positions, positions[1:])):
        return slice(positions[0], positions[-1] + 1, step)
    return torch.tensor(positions)


def destination(dest, positions: list[int], clash: bool = False):
    """(out view or None, put) for values meant for dest(positions).

    clash: the values are computed from points among `positions` (write after).
    """
    if dest is None:
        return None, _nothing
    X, where = dest(positions)
    idx = index_of(where)
    if isinstance(idx, slice) and not clash:
        return X[idx], _nothing

    def put(values):
        X[idx] = values
    return None, put


def _nothing(values):
    pass


def gather(X: torch.Tensor, positions: list[int]) -> torch.Tensor:
    return X[index_of(positions)]


def scatter(X: torch.Tensor, positions: list[int], values: torch.Tensor) -> None:
    X[index_of(positions)] = values


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b are the same elements of the same storage (copying is a no-op)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
