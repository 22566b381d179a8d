"""Activation functions with the derivative data the adjoint needs, by name.

Each σ is written as σ(z) = scale_out · f(scale_in · z) + shift so that a
stepper can fold scale_in into its affine map (GEMM alpha/beta) and
scale_out, shift into its Euler update: a step then costs f alone.  tanh is
2·sigmoid(2z) − 1 this way, because torch's CPU sigmoid is vectorised and its
tanh is not (BENCHMARKS.md, "Implementation choices").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

SMOOTH_RELU_ETA = 0.1


@dataclass(frozen=True)
class Activation:
    """σ(z) = scale_out · f(scale_in · z) + shift, and what its adjoint needs.

    "saved" is what the adjoint keeps of a step: f's value (keeps_input
    False) or its input z' = scale_in · z (keeps_input True).
    """

    name: str
    f: Callable[[torch.Tensor], torch.Tensor]        # out of place, differentiable
    # f(z') in place in z' (scratch); the saved data also into `save` when given
    f_: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
    f_derivative: Callable[[torch.Tensor], torch.Tensor]   # f′(z') from the saved data
    keeps_input: bool
    # f′ ⊙ λ from the saved data into `out`, one fused kernel (None: f_derivative · λ)
    f_vjp: Callable | None = None
    scale_in: float = 1.0
    scale_out: float = 1.0
    shift: float = 0.0

    @property
    def slope(self) -> float:
        """σ′(z) = slope · f′(scale_in · z)."""
        return self.scale_in * self.scale_out

    def saved_of(self, zs: torch.Tensor) -> torch.Tensor:
        """The saved data of a step from its scaled pre-activation z'."""
        return zs if self.keeps_input else self.f(zs)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(σ(z), saved) for an unscaled z."""
        zs = z * self.scale_in if self.scale_in != 1.0 else z
        a = self.f(zs)
        value = a * self.scale_out + self.shift if self.slope != 1.0 or self.shift else a
        return value, (zs if self.keeps_input else a)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        return self.forward(z)[0]

    def derivative(self, saved: torch.Tensor) -> torch.Tensor:
        """σ′(z) from the saved data."""
        d = self.f_derivative(saved)
        return d.mul_(self.slope) if self.slope != 1.0 else d

    def weight_factor(self, h: float) -> float:
        """h·slope: turns products of `vjp`'s f′ ⊙ λ into those of the step's h·σ′ ⊙ λ.

        The one place the convention lives: `vjp` leaves σ′'s slope out, so the weight
        gradients of a sweep are accumulated from f′ ⊙ λ and scaled by this once."""
        return h * self.slope

    def __reduce__(self):
        """Pickled (torch.save of a model, deepcopy) by name: its functions are closures."""
        return by_name, (self.name,)

    def vjp(self, saved, lam, out=None):
        """f′ ⊙ λ = σ′ ⊙ λ / slope (weight products: scale by `weight_factor(h)`)."""
        if self.f_vjp is not None:
            return self.f_vjp(saved, lam, out)
        return torch.mul(self.f_derivative(saved), lam, out=out)


def by_name(name: str) -> Activation:
    """The registered activation `name` (ACTIVATIONS)."""
    return ACTIVATIONS[name]


def tanh(z: torch.Tensor) -> torch.Tensor:
    """tanh(z) as the steppers compute it, 2·sigmoid(2z) − 1 (within 2 ulp of torch.tanh)."""
    return ACTIVATIONS["tanh"](z)


def _sigmoid_(z, save):
    return z.sigmoid_() if save is None else torch.sigmoid(z, out=save)


def _sigmoid_derivative(s):
    return s * (1.0 - s)


def _sigmoid_vjp(s, lam, out):
    if out is None:
        return torch.ops.aten.sigmoid_backward(lam, s)
    return torch.ops.aten.sigmoid_backward.grad_input(lam, s, grad_input=out)


def _keep_z(fn):
    def f_(z, save):
        if save is not None:
            save.copy_(z)
        return fn(z)
    return f_


def _relu_derivative(z):
    return (z > 0).to(z.dtype)


def smooth_relu(z: torch.Tensor, eta: float = SMOOTH_RELU_ETA) -> torch.Tensor:
    """x²/(4η) + x/2 + η/4 for |x| < η, else max(0, x)."""
    quad = z * z / (4 * eta) + z / 2 + eta / 4
    return torch.where(z.abs() < eta, quad, torch.relu(z))


def _smooth_relu_derivative(z, eta: float = SMOOTH_RELU_ETA):
    inner = z / (2 * eta) + 0.5
    return torch.where(z.abs() < eta, inner, (z > 0).to(z.dtype))


ACTIVATIONS: dict[str, Activation] = {
    "tanh": Activation("tanh", torch.sigmoid, _sigmoid_, _sigmoid_derivative,
                       keeps_input=False, f_vjp=_sigmoid_vjp, scale_in=2.0, scale_out=2.0,
                       shift=-1.0),
    "relu": Activation("relu", torch.relu, _keep_z(lambda z: z.relu_()), _relu_derivative,
                       keeps_input=True),
    "smoothrelu": Activation("smoothrelu", smooth_relu, _keep_z(smooth_relu),
                             _smooth_relu_derivative, keeps_input=True),
}
