"""Which coarse MGRIT steps a user's coarse modules replace: pure index arithmetic.

Every step of a level ℓ ≥ 1, from its point i to i + 1, is the coarse step
CoarseStep(ℓ, i, the fine layers it covers, its step size); level 0's are the fine
layers' own.  The adjoint solve's levels are the same points mirrored, so a step is
found by its level and where it starts in forward time.
"""
from __future__ import annotations

from lptrain.mgrit.hierarchy import Hierarchy
from lptrain.model.coarse_steps import CoarseStep, CoarseSteps


def coarse_steps_of(hier: Hierarchy, h: float) -> dict[tuple[int, int], CoarseStep]:
    """{(level, start): CoarseStep} of every step of `hier`'s coarse levels (fine step
    size h; start in fine indices)."""
    out: dict[tuple[int, int], CoarseStep] = {}
    for level, grid in enumerate(hier.levels[1:], start=1):
        pts = grid.points
        for i, (a, b) in enumerate(zip(pts[:-1], pts[1:])):
            out[(level, a)] = CoarseStep(level, i, range(a, b), h * (b - a))
    return out


class UserCoarse:
    """The user's coarse modules (`steps`) and the steps they replace."""

    def __init__(self, steps: CoarseSteps, hier: Hierarchy, h: float):
        self.steps, self.by_start = steps, coarse_steps_of(hier, h)

    def of(self, level: int, start: int, stop: int) -> CoarseStep | None:
        """The step start → stop (forward time) of `level`: None on the finest level."""
        if level == 0:
            return None
        c = self.by_start[(level, start)]
        if c.layers.stop != stop:
            raise IndexError(f"no step {start} → {stop} on level {level} (it has "
                             f"{start} → {c.layers.stop})")
        return c
