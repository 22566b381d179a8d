"""The network's steps seen by the MGRIT solver: forward Φ and the adjoint Φᵀ.

Both map the solver's step (start, stop), given in fine indices of the
solver's own direction, to layer weights and a step size h·(stop − start).
Coarse steps use the weights of the layer where the step starts in forward
time (inject) or their mean over the covered layers (average).
"""
from __future__ import annotations

import torch


class ForwardPropagator:
    """Φ: u ← u + H·σ(K u + b) with the stepper's weights."""

    def __init__(self, stepper, h: float, coarse_weights: str = "inject"):
        self.st, self.h, self.average = stepper, h, coarse_weights == "average"

    def _weights(self, start: int, stop: int):
        if self.average and stop - start > 1:
            return self.st.mean_weights(start, stop)
        return self.st.weights(start)

    def step(self, u, start: int, stop: int):
        K, b = self._weights(start, stop)
        return self.st.apply(u, K, b, self.h * (stop - start))[0]

    def step_many(self, U, starts, stops):
        K, b = _stack_weights(self, starts, stops)
        return self.st.apply(U, K, b, _sizes(self.h, starts, stops, U))[0]


class AdjointPropagator:
    """Φᵀ in mirrored time: λ_n = λ_{n+1} + H Kᵀ[σ′(K u_n + b) ⊙ λ_{n+1}].

    The solver's step (a, b) in mirrored indices covers forward layers
    [N−b, N−a) and is linearised at the forward state u_{N−b}.
    `states` holds u_n for the forward layers first..first+len−1 that this
    rank's adjoint steps use (its own layers and, but on the last rank, the
    first layer of the next rank).
    """

    def __init__(self, stepper, h: float, n_steps: int, states: torch.Tensor, first: int,
                 coarse_weights: str = "inject"):
        self.st, self.h, self.N = stepper, h, n_steps
        self.states, self.first = states, first
        self.average = coarse_weights == "average"
        last = first + states.shape[0]
        K, b = stepper.K[first:last], stepper.b[first:last]
        self.dsig = stepper.linearize(states, K, b)  # σ′ of every local layer at once
        self._avg: dict[tuple[int, int], torch.Tensor] = {}

    def _layer(self, a: int, b: int):
        """(K, σ′) of the mirrored step a → b."""
        n = self.N - b
        if self.average and b - a > 1:
            K, bias = self.st.mean_weights(n, self.N - a)
            key = (n, b - a)
            if key not in self._avg:
                self._avg[key] = self.st.linearize(self.states[n - self.first], K, bias)
            return K, self._avg[key]
        return self.st.K[n], self.dsig[n - self.first]

    def step(self, lam, a: int, b: int):
        K, dsig = self._layer(a, b)
        return self.st.vjp_state(dsig, lam, K, self.h * (b - a))[0]

    def step_many(self, L, starts, stops):
        if self.average and any(b - a > 1 for a, b in zip(starts, stops)):
            pairs = [self._layer(a, b) for a, b in zip(starts, stops)]
            K = torch.stack([p[0] for p in pairs])
            dsig = torch.stack([p[1] for p in pairs])
        else:
            ns = torch.tensor([self.N - b for b in stops])
            K = self.st.K[ns]
            dsig = self.dsig[ns - self.first]
        return self.st.vjp_state(dsig, L, K, _sizes(self.h, starts, stops, L))[0]


def _stack_weights(prop: ForwardPropagator, starts, stops):
    if prop.average and any(b - a > 1 for a, b in zip(starts, stops)):
        pairs = [prop._weights(a, b) for a, b in zip(starts, stops)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    return prop.st.weights_many(torch.tensor(starts))


def _sizes(h: float, starts, stops, like: torch.Tensor):
    """h·(stop − start): a float when all equal, else an (m,) tensor."""
    lengths = [b - a for a, b in zip(starts, stops)]
    if all(n == lengths[0] for n in lengths):
        return h * lengths[0]
    return torch.tensor(lengths, dtype=like.dtype, device=like.device) * h
