"""What the MGRIT solver asks of its callers: a propagator, an exchange and an observer.

The solver (solver.py) and its level operations (levels.py, fused.py) call
nothing else of the network or the ranks.  Each contract is a `typing.Protocol`:
any object with these methods will do (tests pass counting wrappers, bench/
threads, model_perf a recording stand-in).  Points are fine-grid indices of
the solver's own direction; `level` is the grid level of a step or message
(0 = finest).
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class Propagator(Protocol):
    """The time stepper Φ of one solve (docs/method.md §3).

    `last`: the step belongs to the last sweep of a solve without a tolerance, whose
    states it returns (the closing F-relaxation and the residual of the returned
    states).  A propagator decides from (level, last) what to keep: the forward
    keeps level-0 activations for the adjoint, the adjoint its weight products.
    """

    def step(self, u: torch.Tensor, start: int, stop: int, out: torch.Tensor | None = None,
             plus: torch.Tensor | None = None, level: int = 0,
             last: bool = False) -> torch.Tensor:
        """Φ(u) [+ plus] for the step start → stop, into `out` if given."""
        ...

    def step_many(self, U: torch.Tensor, starts: Sequence[int], stops: Sequence[int],
                  out: torch.Tensor | None = None, plus: torch.Tensor | None = None,
                  level: int = 0, last: bool = False) -> torch.Tensor:
        """`step` for m states stacked on U's first dimension, step i: starts[i] → stops[i]."""
        ...


@runtime_checkable
class Exchange(Protocol):
    """The messages of one layer group: neighbour states and sums over its ranks.

    `send` does not block and sends a copy (the caller may overwrite the tensor at
    once); `recv` blocks; `wait` releases what has been sent and must not block on a
    neighbour, so that a rank never waits for its own messages.  Ranks
    are this exchange's numbering: `reversed()` is the same group with rank r
    addressed as size−1−r (the adjoint's view of the mirrored hierarchy).
    """

    rank: int
    size: int

    def send(self, tensor: torch.Tensor, dest: int) -> None: ...

    def recv(self, template: torch.Tensor, source: int) -> torch.Tensor: ...

    def wait(self) -> None:
        """Release the sends that have gone (a point where buffers may be freed)."""
        ...

    def allreduce_sum(self, value: float) -> float: ...

    def allreduce_sums(self, values: Sequence[float]) -> list[float]:
        """Several float sums in one message (elementwise)."""
        ...

    def allreduce_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of `tensor` over the ranks (may reuse `tensor`)."""
        ...

    def broadcast_tensor(self, tensor: torch.Tensor | None, root: int,
                         template: torch.Tensor) -> torch.Tensor:
        """`tensor` of rank `root` on every rank (`template`: its shape, dtype, device)."""
        ...

    def reversed(self) -> "Exchange": ...


@runtime_checkable
class Observer(Protocol):
    """Sees what a solve does, each with its level: propagator calls, messages and sums.

    Called after the propagator call or message it reports; it must not change
    anything the solve uses.
    """

    def step(self, level: int, states: int, last: bool) -> None:
        """A propagator call on `states` stacked states."""
        ...

    def message(self, level: int, peer: int, sent: bool) -> None:
        """One state sent to, or received from (sent=False), rank `peer`."""
        ...

    def sum(self, level: int, values: int) -> None:
        """An allreduce of `values` floats (the residual norm and ‖u_C‖)."""
        ...
