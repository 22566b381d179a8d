"""Layer-serial propagation: forward Euler through the layers and its exact adjoint."""
from __future__ import annotations

import torch


class Buffers:
    """Tensors kept from one sweep to the next of the same shape.

    A sweep's states and saved activations are the largest tensors of a serial
    step; allocated afresh each evaluation they would be fresh pages, with a
    page fault per page, every time (the allocator maps blocks that large, see
    parallel.context).  Whoever passes them owns the results only until the
    next sweep.
    """

    def __init__(self):
        self._kept: dict[str, torch.Tensor] = {}

    def get(self, key: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        t = self._kept.get(key)
        if t is None or t.shape != shape or t.dtype != like.dtype or t.device != like.device:
            t = self._kept[key] = like.new_empty(shape)
        return t


def propagate(stepper, u0: torch.Tensor, h: float, save: bool = True,
              buffers: Buffers | None = None):
    """States u_0..u_N as one (N+1, *u0.shape) tensor, and the saved activations.

    `saved[n]` is what the adjoint of step n needs (None when save=False);
    with `buffers` both live in tensors reused by the next sweep.
    """
    N = stepper.n_layers
    keep = buffers or Buffers()
    states = keep.get("states", (N + 1, *u0.shape), u0)
    states[0] = u0
    saved = keep.get("saved", (N, *u0.shape), u0) if save else None
    sweep = getattr(stepper, "sweep", None)
    if sweep is not None:          # the stepper's own loop (fewer calls per layer)
        sweep(states, saved, h)
        return states, saved
    for n in range(N):
        stepper.step(states[n], n, h, save=saved[n] if save else None, out=states[n + 1])
    return states, saved


def weight_args(stepper, n: int) -> tuple:
    """(K_n,) for steppers whose weight products depend on the layer's weights (their
    WEIGHTS_NEED_K: model/custom_steps.py), else ()."""
    return (stepper.K[n],) if getattr(stepper, "WEIGHTS_NEED_K", False) else ()


def adjoint(stepper, states: torch.Tensor, saved: torch.Tensor, lamN: torch.Tensor, h: float):
    """Backward sweep λ_N → λ_0 and the hidden weight gradients.

    Returns (λ_0, gK (N, ...), gb (N, nb)).  A stepper with WEIGHTS_AFTER_SWEEP takes
    the weight products of all layers in one batched call after the sweep, from
    f′ ⊙ λ_{n+1} written over `saved` (which the sweep consumes): the sweep's per-layer
    work is then two kernels, whose fixed cost per call does not shrink with a shard
    of the batch.  A stepper with its own loop (`adjoint_sweep`) runs that instead.
    """
    own = getattr(stepper, "adjoint_sweep", None)
    if own is not None:
        return own(states, saved, lamN, h)
    if getattr(stepper, "WEIGHTS_AFTER_SWEEP", False):
        return _adjoint_then_weights(stepper, states, saved, lamN, h)
    N = stepper.n_layers
    gK = stepper.K.new_empty(stepper.K.shape)
    gb = stepper.b.new_empty(stepper.b.shape)
    lam, act, g = lamN, stepper.act, None
    for n in range(N - 1, -1, -1):
        g = act.vjp(saved[n], lam, out=g)                   # σ′ ⊙ λ_{n+1} / slope
        gK[n], gb[n] = stepper.vjp_weights(states[n], g, *weight_args(stepper, n))
        lam = stepper.vjp_from_g(g, lam, stepper.K[n], h * act.scale_out)  # K scaled
    scale = act.weight_factor(h)
    return lam, gK.mul_(scale), gb.mul_(scale)


def _adjoint_then_weights(stepper, states, saved, lamN, h):
    """`adjoint` with f′ ⊙ λ_{n+1} kept in saved[n] and every layer's weight products
    from one call on the stacks (N, ...) of states and of those."""
    N, act = stepper.n_layers, stepper.act
    lam, hs, K, g = lamN, h * act.scale_out, stepper.K.unbind(0), saved.unbind(0)
    for n in range(N - 1, -1, -1):
        act.vjp(g[n], lam, out=g[n])                        # σ′ ⊙ λ_{n+1} / slope
        lam = stepper.vjp_from_g(g[n], lam, K[n], hs)        # K scaled
    gK, gb = stepper.vjp_weights(states[:N], saved)
    scale = act.weight_factor(h)
    return lam, gK.mul_(scale), gb.mul_(scale)
