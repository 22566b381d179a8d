"""Layer-serial propagation: forward Euler through the layers and its exact adjoint."""
from __future__ import annotations

import torch


def propagate(stepper, u0: torch.Tensor, h: float, save: bool = True):
    """States u_0..u_N as one (N+1, *u0.shape) tensor, and the saved activations.

    `saved[n]` is what the adjoint of step n needs (None when save=False).
    """
    N = stepper.n_layers
    states = u0.new_empty((N + 1, *u0.shape))
    states[0] = u0
    saved = u0.new_empty((N, *u0.shape)) if save else None
    for n in range(N):
        stepper.step(states[n], n, h, save=saved[n] if save else None, out=states[n + 1])
    return states, saved


def adjoint(stepper, states: torch.Tensor, saved: torch.Tensor, lamN: torch.Tensor, h: float):
    """Backward sweep λ_N → λ_0 and the hidden weight gradients.

    Returns (λ_0, gK (N, ...), gb (N, nb)).
    """
    N = stepper.n_layers
    gK = stepper.K.new_empty(stepper.K.shape)
    gb = stepper.b.new_empty(stepper.b.shape)
    lam, act, g = lamN, stepper.act, None
    for n in range(N - 1, -1, -1):
        g = act.vjp(saved[n], lam, out=g)                   # σ′ ⊙ λ_{n+1} / slope
        gK[n], gb[n] = stepper.vjp_weights(states[n], g)     # while g is in cache
        lam = stepper.vjp_from_g(g, lam, stepper.K[n], h * act.scale_out)  # K scaled
    return lam, gK.mul_(h * act.slope), gb.mul_(h * act.slope)
