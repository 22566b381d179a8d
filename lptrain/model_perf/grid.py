"""Predicted time per optimizer iteration of a layer × data grid, and the grid to use: pure.

A grid L × D runs the mode's schedule on a layer group of L ranks whose
batch share is 1/D (every step costs o + (t − o)/D: the per-call part o
does not shrink with the shard), then sums the loss, the hits and the
gradient over the D groups (allreduces on the link).  Data parallelism
divides the work exactly, layer parallelism pays MGRIT's extra work, so
more layer ranks win where shards get so small that per-call overheads and
messages dominate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lptrain.model_perf.modes import SCALAR, Workload
from lptrain.model_perf.predict import Counts, Machine, parallel_time, serial_time
from lptrain.model_perf.schedule import ADJOINT, DERIVATIVE, FORWARD, LINEARIZE, WEIGHTS
from lptrain.model_perf.simulate import StepCosts
from lptrain.parallel.grid import Grid, candidates, choose

# Nominal machine for choosing a grid without measuring (one core per rank): the rate
# of the tanh-dominated steps and the fixed cost of one torch call (BENCHMARKS.md).
NOMINAL_FLOPS = 2.5e9      # flop/s
NOMINAL_OVERHEAD = 2e-5    # s per kernel call
TANH_FLOPS = 10            # flops per state element for σ and the update


@dataclass(frozen=True)
class Shape:
    """Sizes the grid choice needs: layers, batch, one sample's state and a layer's weights."""

    n_layers: int
    batch: int
    state_elements: int      # per sample
    layer_weights: int       # entries of one K_n
    channels: int            # rows of K_n's output (width or channels)
    item_bytes: int = 8

    def workload(self, n_params: int) -> Workload:
        return Workload(self.n_layers, self.batch,
                        self.batch * self.state_elements * self.item_bytes,
                        n_params * self.item_bytes)


def nominal_costs(shape: Shape) -> StepCosts:
    """Step costs of the full batch from a flop count (no measurement)."""
    per_sample = 2 * shape.layer_weights * shape.state_elements / shape.channels \
        + TANH_FLOPS * shape.state_elements
    t = NOMINAL_OVERHEAD + shape.batch * per_sample / NOMINAL_FLOPS
    return StepCosts(t, t, t, overhead=NOMINAL_OVERHEAD)


def shard_costs(costs: StepCosts, share: float) -> StepCosts:
    """The same costs for a batch share: the per-call part stays, the rest scales."""
    def scaled(kind: str) -> float:
        o = costs.call_overhead(kind)
        return o + share * (costs.per_step(kind) - o)
    return replace(costs, forward=scaled(FORWARD), adjoint=scaled(ADJOINT),
                   weights=scaled(WEIGHTS), derivative=scaled(DERIVATIVE),
                   linearize=scaled(LINEARIZE))


def grid_time(grid: Grid, mode: str, w: Workload, opts, m: Machine,
              counts: Counts = Counts()) -> float:
    """Seconds per optimizer iteration of `mode` on `grid` (serial: data parallel only)."""
    if mode == "serial":
        return serial_time(grid.size, w, m, counts.trials)
    share = math.ceil(w.batch / grid.data) / w.batch
    ws = replace(w, batch=math.ceil(w.batch / grid.data),
                 state_bytes=math.ceil(w.state_bytes * share))
    ms = Machine(shard_costs(m.costs, share), m.link)
    converged = mode == "mgrit"
    fwd, adj = ((counts.mgrit_fwd, counts.mgrit_adj) if converged
                else (opts.fwd_iters, opts.adj_iters))
    t = parallel_time(grid.layer, ws, opts, ms, fwd, adj, converged, counts.trials)
    sums = 2 * counts.trials * m.link.allreduce(SCALAR, grid.data)
    return t + sums + m.link.allreduce(w.grad_bytes, grid.data)


def recommend(size: int, mode: str, w: Workload, opts, m: Machine, max_layer: int,
              counts: Counts = Counts(), layer_ranks="auto",
              data_ranks: int | None = None) -> tuple[Grid, dict]:
    """(grid, {grid: predicted seconds}) among the grids the options allow on `size` ranks."""
    grids = candidates(size, layer_ranks, data_ranks, max_layer, mode != "serial")
    times: dict = {}

    def predict(g: Grid) -> float:
        times[g] = grid_time(g, mode, w, opts, m, counts)
        return times[g]
    chosen = choose(grids, predict)
    return chosen, times
