"""The network's steps seen by the MGRIT solver: forward Φ and the adjoint Φᵀ.

Both map the solver's step (start, stop), given in fine indices of the
solver's own direction, to layer weights and a step size h·(stop − start).
Coarse steps use the weights of the layer where the step starts in forward
time (inject) or their mean over the covered layers (average).  Both are
`mgrit.protocols.Propagator`s: a level-0 step of a sweep that may be the
solve's last (`last`) keeps what the adjoint or the gradient needs.
"""
from __future__ import annotations

import torch

from lptrain.mgrit.indexing import index_of


class ForwardPropagator:
    """Φ: u ← u + H·σ(K u + b) with the stepper's weights.

    With a `saved` buffer, level-0 steps of a sweep that may be the last leave
    what the adjoint needs of layer n in saved[n − first], so the adjoint can
    reuse the forward's activations instead of recomputing them.
    """

    def __init__(self, stepper, h: float, coarse_weights: str = "inject",
                 saved: torch.Tensor | None = None, first: int = 0):
        self.stepper, self.h, self.average = stepper, h, coarse_weights == "average"
        self.saved, self.first = saved, first
        self.means = MeanWeights(stepper)

    def _weights(self, start: int, stop: int):
        if self.average and stop - start > 1:
            return self.means(start, stop)
        return self.stepper.weights(start)

    def step(self, u, start: int, stop: int, out=None, plus=None, level: int = 0,
             last: bool = False):
        """Φ(u) [+ plus] for the step start → stop."""
        K, b = self._weights(start, stop)
        save = last and level == 0 and self.saved is not None
        slot = self.saved[start - self.first] if save else None
        return self.stepper.apply(u, K, b, self.h * (stop - start), slot, out, plus)

    def step_many(self, U, starts, stops, out=None, plus=None, level: int = 0,
                  last: bool = False):
        K, b = _stack_weights(self, starts, stops)
        h = _sizes(self.h, starts, stops, U)
        if not (last and level == 0 and self.saved is not None):
            return self.stepper.apply(U, K, b, h, None, out, plus)
        idx = _slots(starts, self.first)
        if isinstance(idx, slice):
            return self.stepper.apply(U, K, b, h, self.saved[idx], out, plus)
        tmp = torch.empty_like(U)
        res = self.stepper.apply(U, K, b, h, tmp, out, plus)
        self.saved[idx] = tmp
        return res


class AdjointPropagator:
    """Φᵀ in mirrored time: λ_n = λ_{n+1} + H Kᵀ[σ′(K u_n + b) ⊙ λ_{n+1}].

    The solver's step (a, b) in mirrored indices covers forward layers
    [N−b, N−a) and is linearised at the forward state u_{N−b}.  `lin` gives
    the activation data of the forward layers this rank's steps use (mostly
    the forward solve's own saved activations); `state(n)` returns u_n, used
    only to linearise the averaged weights of coarse steps.
    """

    def __init__(self, stepper, h: float, n_steps: int, lin: "Linearisation", state=None,
                 coarse_weights: str = "inject", weights=None):
        self.stepper, self.h, self.N = stepper, h, n_steps
        self.lin, self.state = lin, state
        self.average = coarse_weights == "average"
        self.means = MeanWeights(stepper)
        self._avg: dict[tuple[int, int], torch.Tensor] = {}
        # (gK, gb) of all N layers: level-0 steps of the last sweep write g uᵀ and Σ g
        # of their layer there (g = f′ ⊙ λ; the caller scales by act.weight_factor)
        self.weights = weights

    def _layer(self, a: int, b: int):
        """(K, activation data) of the mirrored step a → b."""
        n = self.N - b
        if self.average and b - a > 1:
            K, bias = self.means(n, self.N - a)
            key = (n, b - a)
            if key not in self._avg:
                self._avg[key] = self.stepper.linearize(self.state(n), K, bias)
            return K, self._avg[key]
        return self.stepper.K[n], self.lin.one(n)

    def step(self, lam, a: int, b: int, out=None, plus=None, level: int = 0,
             last: bool = False):
        """Φᵀ(λ) [+ plus] for the mirrored step a → b."""
        K, saved = self._layer(a, b)
        if not (last and level == 0 and self.weights is not None):
            y = self.stepper.vjp_saved(saved, lam, K, self.h * (b - a), out)
            return y if plus is None else y.add_(plus)
        n = self.N - b
        lam_n, g = self.stepper.vjp_and_g(saved, lam, K, self.h * (b - a), out)
        self.weights[0][n], self.weights[1][n] = self.stepper.vjp_weights(self.state(n), g)
        return lam_n if plus is None else lam_n.add_(plus)

    def step_many(self, L, starts, stops, out=None, plus=None, level: int = 0,
                  last: bool = False):
        if self.average and any(b - a > 1 for a, b in zip(starts, stops)):
            K, saved = self.means.stacked(starts, stops, self._layer)   # once per solve
        else:
            ns = [self.N - b for b in stops]
            keep = last and level == 0 and self.weights is not None
            if not self.lin.contiguous(ns) or keep:
                # mirrored layers run backwards through the saved buffer: a gather would
                # copy them, one state at a time reads them where they are
                out = torch.empty_like(L) if out is None else out
                for i, (a, b) in enumerate(zip(starts, stops)):
                    self.step(L[i], a, b, out=out[i], plus=None if plus is None else plus[i],
                              level=level, last=last)
                return out
            K = self.stepper.K[torch.tensor(ns)]
            saved = self.lin.many(ns)
        y = self.stepper.vjp_saved(saved, L, K, _sizes(self.h, starts, stops, L), out)
        return y if plus is None else y.add_(plus)


class MeanWeights:
    """The mean weights of layers [start, stop), computed once per propagator (one
    solve: the same coarse steps recur in every cycle and on the stacked calls).

    All blocks of one length and alignment come from one reduction (`table`), so a
    level's coarse steps cost one call, not one per step, and a stack of evenly
    spaced ones is a view of it; the values are those of `stepper.mean_weights`.
    """

    def __init__(self, stepper):
        self.stepper = stepper
        self._tables: dict[tuple[int, int], tuple] = {}
        self._stacks: dict[tuple, tuple] = {}

    def table(self, length: int, phase: int):
        """(K, b) means of the blocks [phase + k·length, phase + (k+1)·length), k ≥ 0."""
        key = (length, phase)
        if key not in self._tables:
            count = (self.stepper.n_layers - phase) // length
            self._tables[key] = self.stepper.block_mean_weights(phase, length, count)
        return self._tables[key]

    def __call__(self, start: int, stop: int):
        length = stop - start
        K, b = self.table(length, start % length)
        return K[start // length], b[start // length]

    def many(self, starts, stops):
        """(K, b) of steps start → stop stacked: a view of one table where the steps have
        one length and alignment and are evenly spaced, else stacked copies."""
        length = stops[0] - starts[0]
        if all(b - a == length for a, b in zip(starts, stops)) and \
                len({a % length for a in starts}) == 1:
            idx = index_of([a // length for a in starts])
            if isinstance(idx, slice):
                K, b = self.table(length, starts[0] % length)
                return K[idx], b[idx]
        return self.stacked(starts, stops, self)

    def stacked(self, starts, stops, one):
        """(K, b) of many steps stacked, `one(start, stop)` giving each step's."""
        key = (tuple(starts), tuple(stops))
        if key not in self._stacks:
            pairs = [one(a, b) for a, b in zip(starts, stops)]
            self._stacks[key] = (torch.stack([p[0] for p in pairs]),
                                 torch.stack([p[1] for p in pairs]))
        return self._stacks[key]


class Linearisation:
    """Activation data of forward layers: a view of the forward's saved buffer for
    layers first..first+len−1, plus a few layers computed separately (`tail`)."""

    def __init__(self, main: torch.Tensor, first: int, tail: dict[int, torch.Tensor]):
        self.main, self.first, self.tail = main, first, tail

    def one(self, n: int) -> torch.Tensor:
        return self.tail[n] if n in self.tail else self.main[n - self.first]

    def contiguous(self, ns: list[int]) -> bool:
        """Whether many(ns) is a view (no copy)."""
        return not any(n in self.tail for n in ns) and \
            isinstance(_slots(ns, self.first), slice)

    def many(self, ns: list[int]) -> torch.Tensor:
        if any(n in self.tail for n in ns):
            return torch.stack([self.one(n) for n in ns])
        return self.main[_slots(ns, self.first)]


def _slots(layers, first: int):
    """Positions of `layers` in a buffer starting at layer `first` (a slice if evenly spaced)."""
    return index_of([n - first for n in layers])


def _stack_weights(prop: ForwardPropagator, starts, stops):
    if prop.average and all(b - a > 1 for a, b in zip(starts, stops)):
        return prop.means.many(starts, stops)
    if prop.average and any(b - a > 1 for a, b in zip(starts, stops)):
        return prop.means.stacked(starts, stops, prop._weights)
    idx = index_of(starts)          # evenly spaced layers: views, not gathered copies
    return prop.stepper.weights_many(idx if isinstance(idx, slice) else torch.tensor(starts))


def _sizes(h: float, starts, stops, like: torch.Tensor):
    """h·(stop − start): a float when all equal, else an (m,) tensor of the products taken
    in double, as one step takes its h (a product in float32 rounds h first)."""
    lengths = [b - a for a, b in zip(starts, stops)]
    if all(n == lengths[0] for n in lengths):
        return h * lengths[0]
    return torch.tensor([h * n for n in lengths], dtype=like.dtype, device=like.device)
