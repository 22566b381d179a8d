"""A vector of θ's size split over the ranks: each rank keeps one contiguous part.

L-BFGS keeps 2·memory vectors of θ's size and spends its time streaming them
(docs/method.md §5). Every rank holds the whole θ and gradient, so the recursion
can run on parts: each rank recurses over its part of the pairs, the dot products
are sums of the parts' dot products, and the direction's parts are joined at the
end. Each rank then streams 1/P of the memory instead of all of it.

A dot product is one allreduce of the ranks' partial dots, whose result every rank
shares (as it shares the objective's sums), so every rank takes the same step. On one
rank, and for θ of fewer than LEAST entries, each rank holds the whole vectors and
every operation is the plain one (`float(a @ b)`, `a.norm()`).
"""
from __future__ import annotations

import math

import torch

from lptrain.mgrit.exchange import SerialExchange
from lptrain.parallel.grid import shard

# θ entries below which every rank keeps L-BFGS's pairs whole. The split saves streaming
# (1 − 1/P)·4m·n values per iteration and costs 2m + 2 sums over the ranks: at m = 10
# about 0.3 ms of memory traffic per 10⁴ entries against 22 sums of 5–100 µs each
# (one host to many), so it pays from about 10⁵ entries (Indian Pines: 1.35·10⁶; the
# default network: 2.4·10³).
LEAST = 1 << 16


def splits(n: int, least: int | None = None) -> bool:
    """Whether θ of n entries is split over the ranks: from `least` (default LEAST) on."""
    return n >= (LEAST if least is None else least)


def split(exchange, n: int, least: int | None = None) -> "Shards":
    """The split of θ's n entries over `exchange`'s ranks, or the whole vectors on every
    rank where it does not split (`splits`)."""
    return Shards(exchange if splits(n, least) else SerialExchange(), n)


class Shards:
    """This rank's part [lo, hi) of vectors of length n over `exchange`'s ranks (the
    split of parallel.grid.shard), with the sums and gathers that span the parts."""

    def __init__(self, exchange, n: int):
        self.exchange, self.n = exchange, n
        self.bounds = [shard(n, exchange.size, r) for r in range(exchange.size)]
        self.counts = [hi - lo for lo, hi in self.bounds]
        self.lo, self.hi = self.bounds[exchange.rank]

    @property
    def whole(self) -> bool:
        return self.exchange.size == 1

    def part(self, v: torch.Tensor) -> torch.Tensor:
        """This rank's part of the whole vector v (a view)."""
        return v if self.whole else v[self.lo:self.hi]

    def dot(self, a: torch.Tensor, b: torch.Tensor) -> float:
        """aᵀb of two vectors given by their parts."""
        mine = float(a @ b)
        return mine if self.whole else self.exchange.allreduce_sum(mine)

    def norm(self, a: torch.Tensor) -> float:
        """‖a‖ of a vector given by its part."""
        return float(a.norm()) if self.whole else math.sqrt(self.dot(a, a))

    def join(self, a: torch.Tensor) -> torch.Tensor:
        """The whole vector from the parts (on every rank)."""
        return a if self.whole else self.exchange.allgather_tensor(a, self.counts)

    def gather(self, parts: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """Whole vectors from each rank's list of parts, on rank 0 only (None
        elsewhere), one vector at a time (each_whole)."""
        whole = list(self.each_whole(parts))
        return whole if self.whole or self.exchange.rank == 0 else None

    def each_whole(self, parts: list[torch.Tensor]):
        """Each whole vector from each rank's list of parts, one at a time: on rank 0,
        None on the others (collective: every rank runs it through).  Rank 0 needs
        room for one whole vector at a time, the other ranks none."""
        for p in parts:
            yield p if self.whole else self.exchange.gather_tensor(p, self.counts)
