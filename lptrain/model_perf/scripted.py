"""An exchange for one rank of a group recorded alone in this process: its messages and
sums are supplied, not sent (an `mgrit.protocols.Exchange`).

A receive gives zeros and a sum returns this rank's own value: the recorded control
flow depends on neither (record.py).  The exception is the solvers' residual norm:
`script(k)` makes the next solve's sums report convergence at the check after k
cycles, so that a solve to a tolerance stops where asked (None: never, a fixed
solve's case); `checks` counts the residual measurements.  It reports nothing:
whoever sends or sums tells the observer (the solver, the layer-parallel solver,
the oracles).
"""
from __future__ import annotations

import torch


class ScriptedExchange:
    """Rank `rank` of a group of `size`; `mirror`: the adjoint's view (rank r is
    addressed as size−1−r), which `reversed()` gives."""

    def __init__(self, rank: int, size: int, mirror: bool = False):
        self.size, self.mirror = size, mirror
        self.rank = self._map(rank)
        self._twin = None
        self.script(None)

    def _map(self, r: int) -> int:
        return self.size - 1 - r if self.mirror else r

    def reversed(self) -> "ScriptedExchange":
        if self._twin is None:
            self._twin = ScriptedExchange(self._map(self.rank), self.size, not self.mirror)
            self._twin._twin = self
        return self._twin

    def script(self, cycles: int | None) -> None:
        self.cycles, self.checks = cycles, 0

    def send(self, tensor: torch.Tensor, dest: int) -> None:
        pass

    def recv(self, template: torch.Tensor, source: int) -> torch.Tensor:
        return torch.zeros_like(template)

    def wait(self) -> None:
        pass

    def allreduce_sum(self, value: float) -> float:
        return float(value)

    def allreduce_sums(self, values) -> list[float]:
        """The residual norm's sums (the solver's only use): 1 until the scripted stop."""
        self.checks += 1
        stop = self.cycles is not None and self.checks > self.cycles
        return [0.0 if stop else 1.0] + [1.0] * (len(values) - 1)

    def allreduce_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_tensor(self, tensor: torch.Tensor | None, root: int,
                         template: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(template) if tensor is None else tensor
