"""Activation functions with the derivative data the adjoint needs, by name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

SMOOTH_RELU_ETA = 0.1


@dataclass(frozen=True)
class Activation:
    """σ and σ′.

    `forward(z)` returns (σ(z), saved) and `derivative(saved)` returns σ′(z);
    `saved` is whatever is cheapest to keep (tanh keeps σ(z) itself).
    """

    name: str
    forward: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    derivative: Callable[[torch.Tensor], torch.Tensor]
    # σ(z) computed in place in z (z is scratch); the saved data also into `save`
    forward_: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
    # σ′ ⊙ λ from the saved data, written into `out` (one fused kernel where torch has one)
    backward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor] = None

    def vjp(self, saved, lam, out=None):
        if self.backward is not None:
            return self.backward(saved, lam, out)
        return torch.mul(self.derivative(saved), lam, out=out)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        return self.forward(z)[0]


def tanh(z: torch.Tensor) -> torch.Tensor:
    """tanh(z) as 2·sigmoid(2z) − 1.

    torch's CPU sigmoid is vectorised and its tanh is not: this costs 30 µs
    instead of 150 µs on 40 000 float64 values (9 µs instead of 80 µs in
    float32).  The absolute difference from torch.tanh stays within a few
    ulp of 1 (tested), which is all the state update u + h·tanh(z) sees.
    """
    if z.requires_grad:                 # autograd path: no in-place ops
        return torch.sigmoid(z * 2.0) * 2.0 - 1.0
    return torch.sigmoid(z * 2.0).mul_(2.0).sub_(1.0)


def _tanh_into(z, out):
    """tanh(z) into out (out may be z); z is scratch and is overwritten."""
    if z.requires_grad:
        a = tanh(z)
        if out is not z:
            out.copy_(a.detach())
        return a
    return torch.sigmoid(z.mul_(2.0), out=out).mul_(2.0).sub_(1.0)


def _tanh_forward(z):
    a = tanh(z)
    return a, a


def _tanh_derivative(a):
    # σ′ = 1 − tanh²; computed as −(a² − 1) in one fused op
    return torch.addcmul(torch.ones_like(a), a, a, value=-1.0)


def _tanh_backward(a, lam, out):
    if out is None:
        return torch.ops.aten.tanh_backward(lam, a)
    return torch.ops.aten.tanh_backward.grad_input(lam, a, grad_input=out)


def _tanh_forward_(z, save):
    return _tanh_into(z, save if save is not None else z)


def _keep_z(fn):
    def forward_(z, save):
        if save is not None:
            save.copy_(z)
        return fn(z)
    return forward_


def _relu_forward(z):
    return torch.relu(z), z


def _relu_derivative(z):
    return (z > 0).to(z.dtype)


def smooth_relu(z: torch.Tensor, eta: float = SMOOTH_RELU_ETA) -> torch.Tensor:
    """x²/(4η) + x/2 + η/4 for |x| < η, else max(0, x)."""
    quad = z * z / (4 * eta) + z / 2 + eta / 4
    return torch.where(z.abs() < eta, quad, torch.relu(z))


def _smooth_relu_forward(z):
    return smooth_relu(z), z


def _smooth_relu_derivative(z, eta: float = SMOOTH_RELU_ETA):
    inner = z / (2 * eta) + 0.5
    return torch.where(z.abs() < eta, inner, (z > 0).to(z.dtype))


ACTIVATIONS: dict[str, Activation] = {
    "tanh": Activation("tanh", _tanh_forward, _tanh_derivative, _tanh_forward_,
                       _tanh_backward),
    "relu": Activation("relu", _relu_forward, _relu_derivative,
                       _keep_z(lambda z: z.relu_())),
    "smoothrelu": Activation("smoothrelu", _smooth_relu_forward, _smooth_relu_derivative,
                             _keep_z(smooth_relu)),
}
