"""Which layers' parameters each rank needs beyond its own, and their exchange.

Rank r owns the layers of its level-0 points [lo, hi) (layer n steps from
point n).  Its forward MGRIT steps into its own points, so the step into
point lo uses layer lo−1 and coarse steps reach further left; its adjoint
steps use layers lo+1..hi, linearised at states it holds (docs/method.md
§4).  The index arithmetic here is pure; `share_params` sends the needed
parameters and buffers from their owners once per solve (one vector per layer).
"""
from __future__ import annotations

import torch

from lptrain.mgrit.hierarchy import Hierarchy


def owned_layers(hier: Hierarchy, rank: int) -> range:
    """Layers whose parameters (and gradients) live on `rank`."""
    lo, hi = hier.ranges[0][rank]
    return range(lo, min(hi, hier.n_steps))


def layer_owner(hier: Hierarchy, n: int) -> int:
    return hier.owner(0, n)


def _step_layers(start: int, stop: int, average: bool) -> range:
    """Layers whose parameters a step start → stop (forward time) uses."""
    return range(start, stop) if average and stop - start > 1 else range(start, start + 1)


def forward_layers(hier: Hierarchy, rank: int, average: bool) -> set[int]:
    """Layers of the forward steps `rank` takes on any level."""
    out: set[int] = set()
    for level, ranges in zip(hier.levels, hier.ranges):
        lo, hi = ranges[rank]
        for i in range(max(lo, 1), hi):
            out.update(_step_layers(level.points[i - 1], level.points[i], average))
    return out


def adjoint_layers(hier: Hierarchy, rank: int, average: bool) -> set[int]:
    """Layers of the adjoint steps `rank` takes (mirrored step a → b covers forward
    layers [N−b, N−a))."""
    rev, N, out = hier.reversed(), hier.n_steps, set()
    for level, ranges in zip(rev.levels, rev.ranges):
        lo, hi = ranges[hier.size - 1 - rank]
        for i in range(max(lo, 1), hi):
            out.update(_step_layers(N - level.points[i], N - level.points[i - 1], average))
    return out


def needed_layers(hier: Hierarchy, rank: int, average: bool) -> list[int]:
    """Layers `rank` steps with but does not own (sorted)."""
    need = forward_layers(hier, rank, average) | adjoint_layers(hier, rank, average)
    return sorted(need - set(owned_layers(hier, rank)))


def transfers(hier: Hierarchy, average: bool) -> list[tuple[int, int, int]]:
    """(layer, owner, receiver) of every parameter message, in one order all ranks share."""
    out = []
    for r in range(hier.size):
        out += [(n, layer_owner(hier, n), r) for n in needed_layers(hier, r, average)]
    return out


def share_params(steps, plan: list[tuple[int, int, int]], exchange) -> None:
    """Owners send, receivers load, the parameters and buffers of the layers in `plan`
    (every rank calls this with the same plan; receivers' `steps` build those layers as
    halo)."""
    rank = exchange.rank
    for n, owner, dest in plan:
        if owner == rank:
            exchange.send(steps.flat(n), dest)
    ref = next(iter(steps.modules.parameters()), None)
    for n, owner, dest in plan:
        if dest == rank:
            module = steps.ensure(n, halo=True)
            if ref is not None:     # a factory builds in the default dtype, on the CPU
                module.to(device=ref.device, dtype=ref.dtype)
            # the owner's dtype for this layer: one without parameters (nn.Tanh()) sends
            # its training flags in the default dtype, whatever the others' is
            template = torch.empty(steps.numel(n), dtype=steps.flat_dtype(n))
            steps.load_flat(n, exchange.recv(template, owner))
    exchange.wait()
