"""What the MGRIT solver asks of its callers: a propagator, an exchange and an observer;
and what the layer-parallel solvers (parallel/) ask of a network's steps: a step family.

The solver (solver.py) and its level operations (levels.py, fused.py) call
nothing else of the network or the ranks.  Each contract is a `typing.Protocol`:
any object with these methods will do (tests pass counting wrappers, bench/
threads, model_perf/record.py a recording observer).  Points are fine-grid indices of
the solver's own direction; `level` is the grid level of a step or message
(0 = finest).
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence, runtime_checkable

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
    """Sees what a solve, or a whole optimizer iteration, does, each with its level.

    The solver reports its propagator calls, messages and residual sums; the
    layer-parallel solver (parallel/layer_parallel.py) and the training oracles
    (train/) that take an observer report the messages and sums they make around it
    (level 0); a network that reports its calls (model_perf/zero_cost.py) its
    kernels.  Ranks are numbered as the layer group numbers them (the adjoint's
    mirrored view is mapped back).  Called after the call it reports; it must not
    change anything the solve uses.
    """

    def step(self, level: int, states: int, last: bool) -> None:
        """A propagator call on `states` stacked states."""
        ...

    def message(self, level: int, peer: int, sent: bool) -> None:
        """One state sent to, or received from (sent=False), rank `peer`."""
        ...

    def sum(self, level: int, values: int, itemsize: int = 8) -> None:
        """An allreduce of `values` numbers of `itemsize` bytes each (floats: the
        residual norm and ‖u_C‖, a loss; a tensor: a gradient)."""
        ...

    def kernel(self, name: str, states: int, seconds: float) -> None:
        """A network function `name` (a stepper's kernel, the opening, the classifier,
        the regulariser) computed on `states` stacked states in `seconds`."""
        ...


@runtime_checkable
class StepFamily(Protocol):
    """N residual steps u_{n+1} = u_n + h·f_n(u_n) as a layer-parallel solver asks for
    them: the propagators of one forward solve over a rank's level-0 points `span`
    (range(lo, hi)) and of the adjoint about its states, and the rank's gradients.

    States are in the family's layout; `to_state` / `from_state` convert from / to
    the caller's batch-major tensors.  `keep` is a dict the forward fills with what
    its adjoint needs (the family decides what: saved activations, autograd graphs;
    None: no adjoint follows) and `kept` the same dict given back, so several
    forwards may precede their adjoints.  `fixed`: the solve has no tolerance, so its
    last sweep is known.  `average`: coarse steps take the covered layers' mean
    parameters (else the first layer's).  A family brings its own fast paths: the
    built-in dense and conv steps their stacked forward, hand-written VJPs and
    batched weight products (parallel/stepper_family.py); a user's modules autograd's,
    one layer at a time (parallel/module_propagators.py: AutogradFamily, the fallback).
    """

    n_layers: int

    def to_state(self, u: torch.Tensor) -> torch.Tensor: ...

    def from_state(self, u: torch.Tensor) -> torch.Tensor: ...

    def forward_propagator(self, h: float, average: bool, span: range,
                           template: torch.Tensor, keep: dict | None,
                           fixed: bool = False) -> Propagator:
        """Φ of one forward solve (template: a state of the solve's shape)."""
        ...

    def adjoint_propagator(self, h: float, average: bool, span: range,
                           state: Callable[[int], torch.Tensor | None], kept: dict | None,
                           fixed: bool = False) -> Propagator:
        """Φᵀ about the forward that filled `kept`; state(n) = u_n for n in lo..hi."""
        ...

    def param_grads(self, adjoint: Propagator, layers: range,
                    lam: Callable[[int], torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
        """h·(∂f_n/∂θ_n)ᵀ λ_{n+1} by parameter name for each of `layers` after the adjoint
        solve (lam(n) = λ_n)."""
        ...
