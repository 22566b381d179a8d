"""The layer × data grid of P ranks and each data group's batch shard: pure arithmetic.

P ranks form `data` layer groups of `layer` ranks each (P = layer · data).
A layer group runs MGRIT over the layers on its shard of the batch; the
groups' losses, hits and gradients are summed.  World rank r sits at layer
rank r mod layer of data group r // layer, so the ranks of one layer group
(which exchange states every relaxation) are neighbours in the world
communicator, i.e. usually on the same node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from lptrain.errors import ConfigError, counted, one_of

AUTO = "auto"
TIE = 0.05      # auto: a grid within 5 % of the fastest counts as fast, the most layer ranks win


@dataclass(frozen=True)
class Grid:
    """`layer` ranks per layer group × `data` groups."""

    layer: int
    data: int

    @property
    def size(self) -> int:
        return self.layer * self.data

    def coords(self, rank: int) -> tuple[int, int]:
        """(layer rank, data group) of world rank `rank`."""
        return rank % self.layer, rank // self.layer

    def __str__(self) -> str:
        return f"{self.layer}x{self.data}"


def hierarchy_steps(n_layers: int, cf0: int, cf: int, levels: int,
                    min_coarse: int) -> list[int]:
    """Steps on each level of the hierarchy mgrit.hierarchy.build_levels makes for N
    layers, finest first: its arithmetic, without building the levels (N may be huge
    before the memory check refuses it)."""
    steps = [n_layers]
    while len(steps) < levels:
        coarse = math.ceil(steps[-1] / (cf0 if len(steps) == 1 else cf))
        if coarse < max(min_coarse, 1) or coarse >= steps[-1]:
            break
        steps.append(coarse)
    return steps


def c_intervals(n_layers: int, cf0: int, levels: int, min_coarse: int) -> int:
    """Intervals of the finest level that ranks can own (steps if MGRIT has one level)."""
    return hierarchy_steps(n_layers, cf0, cf0, min(levels, 2), min_coarse)[-1]


def coarse_steps(n_layers: int, cf0: int, cf: int, levels: int, min_coarse: int) -> int:
    """Steps on all coarse levels of the hierarchy (0 with one level)."""
    return sum(hierarchy_steps(n_layers, cf0, cf, levels, min_coarse)[1:])


def divisors(p: int) -> list[int]:
    return [d for d in range(1, p + 1) if p % d == 0]


def parse_layer_ranks(value) -> int | str:
    """`auto` or a positive int from the config string."""
    text = str(value).strip().lower()
    if text == AUTO:
        return AUTO
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise ConfigError(f"parallel.layer_ranks={value!r}: choose auto or a positive integer")
    return number


def more_intervals(n_layers: int, cf0: int, max_layer: int) -> str:
    """How to give the finest level more C-intervals than `max_layer`: more layers, and a
    smaller mgrit.cfactor0 where it is above 2 and coarsens at all."""
    if max_layer >= n_layers:       # one level: each rank owns steps, not intervals
        return f"more layers (network.layers={n_layers})"
    if cf0 <= 2:
        return f"more layers (network.layers={n_layers}; mgrit.cfactor0 is 2 already)"
    return "more layers or a smaller mgrit.cfactor0 (2 at least)"


def candidates(size: int, layer_ranks, data_ranks: int | None, max_layer: int,
               layered: bool, more: str = "more layers or a smaller mgrit.cfactor0 "
                                           "(2 at least)", one_level: bool = False
               ) -> list[Grid]:
    """The grids a run on `size` ranks may use (several only for layer_ranks=auto).

    layered: whether the mode distributes layers at all (serial does not); `more`: how
    to give the finest level more C-intervals (more_intervals); one_level: MGRIT has one
    level (max_layer counts layer steps, which the ranks own, not C-intervals).
    Raises ConfigError, naming the value, for a split that cannot work.
    """
    layer = parse_layer_ranks(layer_ranks)
    given = None        # where the layer ranks follow from data_ranks: the key given
    if data_ranks is not None:
        if data_ranks < 1 or size % data_ranks:
            raise ConfigError(_not_a_divisor("parallel.data_ranks", data_ranks, size))
        if layer == AUTO:
            layer = size // data_ranks
            given = f"parallel.data_ranks={data_ranks} (so {layer} layer ranks)"
        elif layer * data_ranks != size:
            raise ConfigError(f"parallel.layer_ranks={layer}: times parallel.data_ranks="
                              f"{data_ranks} must equal the job's {counted(size, 'rank')}")
    if layer == AUTO:
        if not layered:
            return [Grid(1, size)]
        return [Grid(d, size // d) for d in divisors(size) if d <= max_layer]
    if size % layer:
        raise ConfigError(_not_a_divisor("parallel.layer_ranks", layer, size))
    given = given or f"parallel.layer_ranks={layer}"
    if layer > 1 and not layered:
        raise ConfigError(f"{given}: mode=serial distributes only the batch; use 1 layer "
                          f"rank (or auto) or a layer-parallel mode")
    if layer > max_layer:
        what = f"{counted(max_layer, 'layer step')} (MGRIT has one level)" if one_level \
            else f"{counted(max_layer, 'C-interval')} on the finest level"
        raise ConfigError(f"{given}: only {what}; use at most "
                          f"{counted(max_layer, 'layer rank')}, or {more}")
    return [Grid(layer, size // layer)]


def _not_a_divisor(key: str, value: int, size: int) -> str:
    """The refusal of `key`=value ranks that do not divide the job's `size`; a job of one
    rank (started without mpiexec, likely) is told how to start more."""
    if size == 1:
        return f"{key}={value}: the job has 1 rank; start it with mpiexec -n P for P ranks"
    return f"{key}={value}: must divide the job's {size} ranks ({one_of(divisors(size))})"


def run_grids(opts, size: int, layered: bool) -> list[Grid]:
    """candidates() of a configuration (its parallel, network and mgrit nodes) on `size`
    ranks: what preflight takes, and what a sweep's check tries before any job."""
    mo, po = opts.mgrit, opts.parallel
    n = opts.network.layers
    most = c_intervals(n, mo.cfactor0, mo.levels, mo.min_coarse)
    return candidates(size, po.layer_ranks, po.data_ranks, most, layered,
                      more_intervals(n, mo.cfactor0, most), one_level=most >= n)


def choose(grids: list[Grid], predict: Callable[[Grid], float]) -> Grid:
    """The grid with the shortest predicted time; within TIE of it, the most layer ranks."""
    if len(grids) == 1:
        return grids[0]
    times = {g: predict(g) for g in grids}
    best = min(times.values())
    return max((g for g in grids if times[g] <= best * (1 + TIE)), key=lambda g: g.layer)


def shard(n: int, parts: int, index: int) -> tuple[int, int]:
    """[lo, hi) of part `index` of n samples in `parts` contiguous parts.

    The first n mod parts parts hold one sample more, so with fewer samples
    than parts the empty parts are the last ones (never data group 0).
    """
    base, extra = divmod(n, parts)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)
