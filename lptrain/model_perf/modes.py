"""The operations of one optimizer iteration in each training mode, as schedules: pure.

An optimizer iteration is `trials` objective evaluations (`value`, one per
line-search trial) and one gradient.  Both end in an allreduce on every rank,
so each is a separate schedule that starts and ends with the ranks in step:
time per iteration = trials · T(value) + T(gradient).

- serial (`SerialOracle`): the batch is split over the ranks; each rank
  steps its shard through all N layers, then the loss and hit count are
  summed; the gradient is the serial adjoint sweep (σ′ from the saved
  activations, then the state VJP, per layer), the weight products of all
  layers in one call, and an allreduce of the gradient vector.
- mgrit / simultaneous (`LayerParallel`): a forward MGRIT solve (finest
  steps save their activations) plus the two sums of `evaluate`; then the
  next rank's first state from the right (`_next_first_state`), σ′ of the
  rank's layers (`_dsig`: from the saved activations in one call, the last
  layer or two recomputed), the linear adjoint MGRIT solve on the mirrored
  hierarchy, the rank's weight products in one call and the gradient
  allreduce.
The opening layer, the classifier and the regulariser cost little next
to N steps and are left out.
"""
from __future__ import annotations

from dataclasses import dataclass

from lptrain.model_perf.schedule import (ADJOINT, DERIVATIVE, FORWARD, LINEARIZE, WEIGHTS,
                                         Allreduce, Recv, Schedule, Send, Step, append,
                                         hierarchy_for, mirrored, solve_schedule)

SCALAR = 8  # bytes of the float sums (loss, hits, residual norm)


@dataclass(frozen=True)
class Workload:
    """What one optimizer iteration moves and computes, independent of P.

    batch: samples per optimizer iteration; state_bytes: one state of the
    whole batch (a message); grad_bytes: the gradient vector θ.
    """

    n_layers: int
    batch: int
    state_bytes: int
    grad_bytes: int


def serial_value(size: int, w: Workload) -> Schedule:
    """Data-parallel forward sweep and the two sums, per rank."""
    ops = []
    for r in range(size):
        share = _shard(w.batch, size, r) / w.batch
        rank_ops: list = []
        append(rank_ops, Step(FORWARD, w.n_layers, w.n_layers, 0, share))
        rank_ops += [Allreduce(SCALAR), Allreduce(SCALAR)]
        ops.append(rank_ops)
    return ops


def serial_gradient(size: int, w: Workload) -> Schedule:
    """Data-parallel adjoint sweep, weight products and the gradient allreduce."""
    ops = []
    for r in range(size):
        share = _shard(w.batch, size, r) / w.batch
        rank_ops: list = []
        rank_ops.append(Step(DERIVATIVE, w.n_layers, w.n_layers, 0, share))
        rank_ops.append(Step(ADJOINT, w.n_layers, w.n_layers, 0, share))
        append(rank_ops, Step(WEIGHTS, w.n_layers, 1, 0, share))
        rank_ops.append(Allreduce(w.grad_bytes))
        ops.append(rank_ops)
    return ops


def parallel_value(size: int, w: Workload, opts, iterations: int,
                   converged: bool, cold: bool = False) -> Schedule:
    """Forward MGRIT solve of `iterations` cycles and the sums of `evaluate`."""
    hier = hierarchy_for(w.n_layers, opts, size)
    ops = solve_schedule(hier, opts, iterations, cold, converged, w.state_bytes, FORWARD)
    for rank_ops in ops:
        rank_ops += [Allreduce(SCALAR), Allreduce(SCALAR)]
    return ops


def parallel_gradient(size: int, w: Workload, opts, iterations: int,
                      converged: bool, cold: bool = False) -> Schedule:
    """Next rank's first state, σ′, linear adjoint MGRIT, weight products, allreduce."""
    hier = hierarchy_for(w.n_layers, opts, size)
    adjoint = mirrored(solve_schedule(hier.reversed(), opts, iterations, cold, converged,
                                      w.state_bytes, ADJOINT, linear=True))
    ops = []
    for r in range(size):
        lo, hi = hier.ranges[0][r]
        last = r == size - 1
        rank_ops: list = []
        if r > 0:
            rank_ops.append(Send(r - 1, w.state_bytes))
        if not last:
            rank_ops.append(Recv(r + 1, w.state_bytes))
        saved, recomputed = _dsig_layers(lo, hi, w.n_layers, last)
        append(rank_ops, Step(DERIVATIVE, saved, 1))
        append(rank_ops, Step(LINEARIZE, recomputed, recomputed))
        for op in adjoint[r]:
            append(rank_ops, op)
        append(rank_ops, Step(WEIGHTS, min(hi, w.n_layers) - lo, 1))
        rank_ops.append(Allreduce(w.grad_bytes))
        ops.append(rank_ops)
    return ops


def _dsig_layers(lo: int, hi: int, n_layers: int, last: bool) -> tuple[int, int]:
    """(layers whose σ′ comes from saved activations, layers recomputed) in `_dsig`."""
    top = min(hi, n_layers - 1)
    have = min(n_layers - 1 if last else hi - 2, top)
    return max(have - lo + 1, 0), max(top - max(have + 1, lo) + 1, 0)


def _shard(n: int, size: int, r: int) -> int:
    """Samples of rank r in SerialOracle._shard."""
    return (r + 1) * n // size - r * n // size
