"""Predicted seconds per optimizer iteration of each mode on a layer × data grid.

    time = trials · T(value) + T(gradient) + T(optimizer)

with T the simulated makespan (simulate.py) of the iteration recorded from the real
code (record.py) on one layer group of L ranks with the group's shard of ceil(batch / D)
samples: its kernels charged their measured costs (costs.py), the rest what the
recording timed (its glue).  Both parts end in
sums every rank waits for, so their times add; T(optimizer), the optimizer's own
arithmetic on the whole parameter vector, which every rank computes after the sums
(optimizer_cost.py), adds too.  On P ranks every cost is the one measured with
min(P, host ranks) ranks running it on one host (Machine.on_host).  mode=mgrit solves take
`Counts.mgrit_fwd / mgrit_adj` cycles, simultaneous `Counts.simultaneous` (measured
runs' means, else `mgrit.fwd_iters / adj_iters`);
fractional counts (means over a run) interpolate linearly between the records of the
neighbouring whole counts.  All solves are warm (every optimizer iteration but the first).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from lptrain.model_perf.costs import shared_weight
from lptrain.model_perf.record import Kernel, Record, record_iteration, solve_cycles
from lptrain.model_perf.simulate import Link, simulate
from lptrain.modes import MGRIT, SERIAL, SIMULTANEOUS
from lptrain.parallel.grid import Grid, c_intervals


@dataclass(frozen=True)
class Counts:
    """Run outcomes the record cannot know: evaluations and cycles per iteration."""

    trials: float = 1.0    # objective evaluations per optimizer iteration (line search)
    mgrit_fwd: float = 5   # mode=mgrit: forward cycles until the tolerance is met
    mgrit_adj: float = 5   # mode=mgrit: adjoint cycles until the tolerance is met
    simultaneous_fwd: float | None = None   # simultaneous cycles per solve (None: the
    simultaneous_adj: float | None = None   # options' fwd_iters / adj_iters)

    def simultaneous(self, opts) -> tuple[float, float]:
        """Forward and adjoint cycles per solve of mode=simultaneous: these counts' (a
        run's error-controlled plan, measured), else the options' fixed ones."""
        return (opts.fwd_iters if self.simultaneous_fwd is None else self.simultaneous_fwd,
                opts.adj_iters if self.simultaneous_adj is None else self.simultaneous_adj)


@dataclass(frozen=True)
class Machine:
    """The costs of kernels (costs.KernelCosts or Collecting) and of messages."""

    costs: object
    link: Link
    optimizer: float = 0.0    # seconds of the optimizer's own arithmetic per iteration
    optimizer_per_pair: float = 0.0   # ... less this per L-BFGS pair short of `memory`
    memory: int = 0
    optimizer_shared: float | None = None   # `optimizer` with costs.host_ranks at once
    theta_bytes: int = 0      # θ's size: the L-BFGS direction's parts joined on P ranks
    split_pairs: bool = False   # L-BFGS's pairs split over the ranks (train/shards.py)

    def optimizer_at(self, pairs: int | None = None, ranks: int = 1) -> float:
        """The optimizer's seconds in an iteration whose L-BFGS recursion runs over
        `pairs` pairs (None: the memory full, as in a long run) on `ranks` ranks: each
        recurses over its part of the pairs (train/shards.py), with a sum of the parts
        for each dot product and the direction's parts joined at the end."""
        used = self.memory if pairs is None else min(pairs, self.memory)
        seconds = self.optimizer - self.optimizer_per_pair * (self.memory - used)
        if ranks <= 1 or self.memory == 0 or not self.split_pairs:
            return seconds
        recursion = self.optimizer_per_pair * used
        sums = (2 * used + 2) * self.link.allreduce(8, ranks)
        join = self.link.allreduce(self.theta_bytes // ranks, ranks)
        return seconds - recursion + recursion / ranks + sums + join

    def on_host(self, ranks: int) -> "Machine":
        """The machine as each rank of a run on `ranks` ranks sees it: min(ranks, host
        ranks) of them share one host's caches and memory bandwidth (costs.py)."""
        host = getattr(self.costs, "host_ranks", 1)
        if host <= 1:
            return self
        optimizer, per_pair = self.optimizer, self.optimizer_per_pair
        if self.optimizer_shared is not None and ranks > 1 and self.optimizer > 0:
            w = shared_weight(ranks, host)
            optimizer += w * (self.optimizer_shared - self.optimizer)
            per_pair *= optimizer / self.optimizer
        return replace(self, costs=self.costs.on_host(ranks), optimizer=optimizer,
                       optimizer_per_pair=per_pair, optimizer_shared=None)


@dataclass(frozen=True)
class Prediction:
    """Seconds per optimizer iteration on `ranks` ranks (None: the solver refuses P)."""

    ranks: int
    serial: float
    mgrit: float | None = None
    simultaneous: float | None = None
    fwd_iteration: float | None = None   # one more forward MGRIT cycle (simultaneous)
    adj_iteration: float | None = None   # the same for the adjoint

    @property
    def possible(self) -> bool:
        return self.simultaneous is not None


class Collecting:
    """Costs of nothing that note every kernel asked for: a first pass over the
    predictions tells which kernels to measure."""

    def __init__(self):
        self.kernels: set = set()

    def seconds(self, b: float):
        def cost(op) -> float:
            if isinstance(op, Kernel):
                self.kernels.add((op.name, op.states))
            return 0.0
        return cost


class Model:
    """The recorded iterations of one configuration, kept per (mode, grid, cycles).

    net: the ResNet; mgrit: MGRITOptions; batch: samples per optimizer iteration;
    glue: a kept_glue.KeptGlue whose kept glue the records take (None: as timed now).
    """

    def __init__(self, net, mgrit, batch: int, mini_batches: bool = False,
                 dtype=torch.float64, glue=None):
        self.net, self.mgrit, self.batch = net, mgrit, batch
        self.mini_batches, self.dtype, self.glue = mini_batches, dtype, glue
        self._records: dict = {}
        self.item = torch.tensor([], dtype=dtype).element_size()

    @property
    def max_layer(self) -> int:
        """The most layer ranks: C-intervals of the finest level (steps with one level)."""
        o = self.mgrit
        return c_intervals(self.net.opts.layers, o.cfactor0, o.levels, o.min_coarse)

    def record(self, mode: str, layer: int, data: int, fwd: int = 1, adj: int = 1) -> Record:
        """The iteration whose solves run fwd / adj cycles, or as many as training runs
        when asked for them (record.solve_cycles: one record where a limit caps both)."""
        fwd, adj = (1, 1) if mode == SERIAL else solve_cycles(mode, self.mgrit, fwd, adj)
        key = (mode, layer, data, fwd, adj)
        if key not in self._records:
            rec = record_iteration(self.net, mode, self.mgrit, layer, data, fwd, adj,
                                   self.mini_batches, self.dtype, math.ceil(self.batch / data))
            self._records[key] = rec if self.glue is None else self.glue.settle(key, rec)
        return self._records[key]

    def parts(self, mode: str, grid: Grid, m: Machine, fwd: int = 1, adj: int = 1
              ) -> tuple[float, float]:
        """(T(value), T(gradient)) of the record with fwd / adj cycles on `grid`."""
        m = m.on_host(grid.size)
        rec = self.record(mode, grid.layer, grid.data, fwd, adj)
        shard = math.ceil(self.batch / grid.data)
        state = shard * math.prod(self.net.state_shape) * self.item
        seconds = m.costs.seconds(shard)
        return tuple(simulate(part, seconds, m.link, state, grid.data).makespan
                     for part in (rec.value, rec.gradient))

    def busy(self, mode: str, grid: Grid, m: Machine, fwd: int = 1, adj: int = 1,
             trials: float = 1.0) -> list[float]:
        """Each layer rank's computing time (kernels and glue, no waiting) per optimizer
        iteration with whole fwd / adj cycles."""
        m = m.on_host(grid.size)
        rec = self.record(mode, grid.layer, grid.data, fwd, adj)
        shard = math.ceil(self.batch / grid.data)
        state = shard * math.prod(self.net.state_shape) * self.item
        value, gradient = (simulate(part, m.costs.seconds(shard), m.link, state,
                                    grid.data).compute for part in (rec.value, rec.gradient))
        return [trials * v + g + m.optimizer_at(None, grid.size)
                for v, g in zip(value, gradient)]

    def grid_time(self, grid: Grid, mode: str, m: Machine, counts: Counts = Counts(),
                  cycles: tuple[float, float] | None = None, pairs: int | None = None
                  ) -> float:
        """Seconds per optimizer iteration of `mode` on `grid`: the evaluations, the
        gradient and the optimizer's arithmetic; cycles: (forward, adjoint) per solve
        (default: counts' for mgrit, the options' for simultaneous); pairs: L-BFGS
        memory pairs of the iteration (default: full)."""
        m = m.on_host(grid.size)
        return self._evaluations(grid, mode, m, counts, cycles) + \
            m.optimizer_at(pairs, grid.size)

    def _evaluations(self, grid: Grid, mode: str, m: Machine, counts: Counts,
                     cycles: tuple[float, float] | None) -> float:
        """grid_time less the optimizer's arithmetic: the objective evaluations and the
        gradient."""
        if mode == SERIAL:
            value, gradient = self.parts(mode, grid, m)
            return counts.trials * value + gradient
        if cycles is None:
            cycles = (counts.mgrit_fwd, counts.mgrit_adj) if mode == MGRIT \
                else counts.simultaneous(self.mgrit)
        fwd, adj = cycles
        lo = (math.floor(fwd), math.floor(adj))
        v0, g0 = self.parts(mode, grid, m, *lo)
        if (fwd, adj) == lo:
            return counts.trials * v0 + g0
        v1, g1 = self.parts(mode, grid, m, lo[0] + 1, lo[1] + 1)
        return counts.trials * (v0 + (fwd - lo[0]) * (v1 - v0)) + g0 + (adj - lo[1]) * (g1 - g0)

    def iteration_times(self, size: int, m: Machine) -> tuple[float, float] | tuple:
        """(one more forward cycle, one more adjoint cycle) of mode=simultaneous on
        `size` layer ranks ((None, None) with one level, which has no cycles)."""
        if self.mgrit.levels < 2 or self.max_layer == self.net.opts.layers:
            return None, None
        k, j = self.mgrit.fwd_iters, self.mgrit.adj_iters
        v0, g0 = self.parts(SIMULTANEOUS, Grid(size, 1), m, k, j)
        v1, g1 = self.parts(SIMULTANEOUS, Grid(size, 1), m, k + 1, j + 1)
        return v1 - v0, g1 - g0

    def predict_at(self, size: int, m: Machine, counts: Counts = Counts()) -> Prediction:
        """Every mode on `size` ranks: serial data parallel, the others layer parallel
        (None beyond max_layer)."""
        serial = self.grid_time(Grid(1, size), SERIAL, m, counts)
        if size > self.max_layer:
            return Prediction(size, serial)
        fwd_it, adj_it = self.iteration_times(size, m)
        return Prediction(size, serial,
                          mgrit=self.grid_time(Grid(size, 1), MGRIT, m, counts),
                          simultaneous=self.grid_time(Grid(size, 1), SIMULTANEOUS, m, counts),
                          fwd_iteration=fwd_it, adj_iteration=adj_it)

    def predict_all(self, ranks, m: Machine, counts: Counts = Counts()) -> list[Prediction]:
        return [self.predict_at(p, m, counts) for p in ranks]
