"""Where the MGRIT oracles keep warm starts: the latest batch's (mode=mgrit) or a few batches'.

The solvers alternate between two buffers and never write into the warm start
they are given, so the latest states can be kept by reference; states of other
mini-batches need copies, and those are compact: only the C-point rows of the
rank's blocks, all a warm solve reads (mgrit/solver.py).  Each store writes its
own checkpoint state (`state_dict`), and reads it as train/protocol.py WarmStarts
on the class, without an instance (train/regrid.py).
"""
from __future__ import annotations

from collections import OrderedDict

from lptrain.parallel.blocks import ALL_ROWS, C_POINTS


class LatestWarm:
    """The latest batch's forward and adjoint states, by reference."""

    def __init__(self):
        self.key = self.fwd = self.adj = None

    def holds(self, key: int) -> bool:
        return key == self.key

    def get(self, key: int) -> tuple:
        """(forward, adjoint) warm starts of batch `key` (None where none)."""
        return (self.fwd, self.adj) if key == self.key else (None, None)

    def store(self, key: int, fwd=None, adj=None) -> None:
        """Keep batch `key`'s latest states (None: keep what it has); another batch's
        are dropped."""
        if self.key != key:
            self.key, self.fwd, self.adj = key, None, None
        if fwd is not None:
            self.fwd = fwd
        if adj is not None:
            self.adj = adj

    def state_dict(self) -> dict:
        return {"warm_fwd": self.fwd, "warm_adj": self.adj, "warm_key": self.key}

    def load_state_dict(self, state: dict) -> None:
        self.fwd, self.adj, self.key = state["warm_fwd"], state["warm_adj"], state["warm_key"]

    @staticmethod
    def warm_entries(state: dict) -> list:
        key = state["warm_key"]
        return [] if key is None else [[key, state["warm_fwd"], state["warm_adj"]]]

    @staticmethod
    def with_warm_entries(state: dict, entries: list) -> dict:
        key, fwd, adj = entries[-1] if entries else (None, None, None)
        return {**state, "warm_key": key, "warm_fwd": fwd, "warm_adj": adj}

    @staticmethod
    def warm_rows(state: dict) -> str:
        return ALL_ROWS


class WarmCache:
    """Warm starts of up to `capacity` batches, least recently used dropped.

    With `lp` (a LayerParallel: mini-batches, whose other batches' solves reuse the
    solver buffers) a batch's states are kept as compact copies of their C-point
    rows; without, the solver buffers themselves (a full-batch run: they stay valid
    until the next solve of the one batch).
    """

    def __init__(self, capacity: int, lp=None):
        self.capacity, self.lp = max(capacity, 1), lp
        self.cache: OrderedDict = OrderedDict()

    def holds(self, key: int) -> bool:
        return key in self.cache

    def get(self, key: int) -> tuple:
        return self.cache.get(key, (None, None))

    def store(self, key: int, fwd=None, adj=None) -> None:
        if self.lp is not None:
            fwd, adj = self._compact(self.lp.fwd, fwd), self._compact(self.lp.adj, adj)
        old = self.cache.pop(key, (None, None))
        self.cache[key] = (fwd if fwd is not None else old[0],
                           adj if adj is not None else old[1])
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)

    @staticmethod
    def _compact(solver, states):
        """The C-point rows of a block (None stays None)."""
        return None if states is None else solver.c_point_states(states)

    def state_dict(self) -> dict:
        return {"cache": [[key, fwd, adj] for key, (fwd, adj) in self.cache.items()],
                "warm_rows": ALL_ROWS if self.lp is None else C_POINTS}

    def load_state_dict(self, state: dict) -> None:
        """The warm starts of a checkpoint; with mini-batches, blocks of all rows (a
        checkpoint written before warm starts were compact) are cut to their C-points."""
        full = self.lp is not None and self.warm_rows(state) == ALL_ROWS
        self.cache = OrderedDict(
            (key, (self._compact(self.lp.fwd, fwd), self._compact(self.lp.adj, adj))
             if full else (fwd, adj)) for key, fwd, adj in state["cache"])

    @staticmethod
    def warm_entries(state: dict) -> list:
        return [list(entry) for entry in state["cache"]]

    @staticmethod
    def with_warm_entries(state: dict, entries: list) -> dict:
        return {**state, "cache": [list(entry) for entry in entries]}

    @staticmethod
    def warm_rows(state: dict) -> str:
        return state.get("warm_rows", ALL_ROWS)
