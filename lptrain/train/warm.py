"""Where the MGRIT oracles keep warm starts: the latest batch's (mode=mgrit) or a few batches'.

The solvers alternate between two buffers and never write into the warm start
they are given, so the latest states can be kept by reference; states of other
mini-batches need copies, and those are compact: only the C-point rows of the
rank's blocks, all a warm solve reads (mgrit/solver.py).  Each store writes its
own checkpoint state (`state_dict`), and reads it as train/protocol.py WarmStarts
on the class, without an instance (train/regrid.py).  Checkpoints hold compact
blocks whatever the store keeps in memory (1 / c of the rows: c = mgrit.cfactor0),
and either form loads: the solver takes both.
"""
from __future__ import annotations

from collections import OrderedDict

from lptrain.parallel.blocks import ALL_ROWS, C_POINTS


def compact(solver, states, into=None):
    """The C-point rows of a block (None stays None), written into the block `into`
    where it has their form."""
    return None if states is None else solver.c_point_states(states, into)


def _saved(solvers, fwd, adj) -> tuple:
    """(forward, adjoint) as a checkpoint holds them: compact where `solvers` (the
    LayerParallel whose .fwd and .adj solved them) are known and the blocks are not
    compact already."""
    if solvers is None:
        return fwd, adj
    return tuple(t if t is None or t.shape[0] == len(s.c_rows) else compact(s, t)
                 for s, t in ((solvers.fwd, fwd), (solvers.adj, adj)))


class LatestWarm:
    """The latest batch's forward and adjoint states, by reference; saved compact (the
    C-point rows of the solvers `lp`, the LayerParallel that solved them)."""

    def __init__(self, lp):
        self.key = self.fwd = self.adj = None
        self.lp = lp

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
        fwd, adj = _saved(self.lp, self.fwd, self.adj)
        return {"warm_fwd": fwd, "warm_adj": adj, "warm_key": self.key,
                "warm_rows": C_POINTS}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's warm starts, compact or all rows (older checkpoints)."""
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
        return state.get("warm_rows", ALL_ROWS)


class WarmCache:
    """Warm starts of up to `capacity` batches, least recently used dropped.

    With `keep_compact` (mini-batches, whose other batches' solves reuse the solver
    buffers of `lp`, the LayerParallel) a batch's states are kept as compact copies of
    their C-point rows; without, the solver buffers themselves (a full-batch run: they
    stay valid until the next solve of the one batch), saved compact where `lp` is
    given.  A compact copy is written into the blocks the batch held, or those of a
    dropped batch: a new block at every store fragments the heap, which keeps freed
    memory (BENCHMARKS.md "Kept blocks rewritten in place").  Nothing else holds a kept
    block (the solvers copy a warm start in and never write it).
    """

    def __init__(self, capacity: int, lp=None, keep_compact: bool = False):
        if keep_compact and lp is None:
            raise ValueError("WarmCache: keep_compact needs the solvers (lp)")
        self.capacity, self.lp, self.keep_compact = max(capacity, 1), lp, keep_compact
        self.cache: OrderedDict = OrderedDict()
        self.spare: list = []     # blocks of dropped batches, for the next copies

    def holds(self, key: int) -> bool:
        return key in self.cache

    def get(self, key: int) -> tuple:
        return self.cache.get(key, (None, None))

    def store(self, key: int, fwd=None, adj=None) -> None:
        old = self.cache.pop(key, (None, None))
        if self.keep_compact:
            fwd = compact(self.lp.fwd, fwd, self._block(old[0]) if fwd is not None else None)
            adj = compact(self.lp.adj, adj, self._block(old[1]) if adj is not None else None)
        self.cache[key] = (fwd if fwd is not None else old[0],
                           adj if adj is not None else old[1])
        while len(self.cache) > self.capacity:
            dropped = self.cache.popitem(last=False)[1]
            if self.keep_compact:
                self.spare = [t for t in dropped if t is not None]

    def _block(self, kept):
        """A block to write a new compact copy into: the batch's own, else a spare one
        (compact() checks its form)."""
        return kept if kept is not None else self.spare.pop() if self.spare else None

    def state_dict(self) -> dict:
        return {"cache": [[key, *_saved(self.lp, fwd, adj)]
                          for key, (fwd, adj) in self.cache.items()],
                "warm_rows": ALL_ROWS if self.lp is None else C_POINTS}

    def load_state_dict(self, state: dict) -> None:
        """The warm starts of a checkpoint; with mini-batches, blocks of all rows (a
        checkpoint written before warm starts were compact) are cut to their C-points."""
        full = self.keep_compact and self.warm_rows(state) == ALL_ROWS
        self.cache = OrderedDict(
            (key, (compact(self.lp.fwd, fwd), compact(self.lp.adj, adj))
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
