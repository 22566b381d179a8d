"""The two convolution products of a conv step's adjoint, in a reference and a fast form.

For a 3×3 same-size convolution z = K ⋆ u (stride 1, zero padding 1) the adjoint
needs h·Kᵀg (the state's VJP) and g ⋆ u (the weight gradient).
`ReferenceConvOps` writes them as their definitions: a transposed convolution, and
one convolution with batch and channels swapped.  `FastConvOps` computes the same
numbers (to rounding) the way oneDNN runs fastest on the CPU: Kᵀg as a plain
convolution with the kernel flipped in space and its channels swapped, with h folded
into that small kernel; the weight gradient by torch's convolution backward
(BENCHMARKS.md, issue 22).  Both work on every dtype and device torch has; the tests
compare them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class ReferenceConvOps:
    """Kᵀg and g ⋆ u as their definitions."""

    @staticmethod
    def input_vjp(g: torch.Tensor, K: torch.Tensor, h: float) -> torch.Tensor:
        """h·Kᵀg for g (B, c, H, W) and K (c, c, 3, 3)."""
        return F.conv_transpose2d(g * h, K, padding=1)

    @staticmethod
    def weight_vjp(u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """∂⟨g, K ⋆ u⟩/∂K, shape (c, c, 3, 3)."""
        return F.conv2d(u.transpose(0, 1), g.transpose(0, 1), padding=1).transpose(0, 1)


class FastConvOps:
    """The same products as ReferenceConvOps with the kernels oneDNN runs fastest."""

    @staticmethod
    def input_vjp(g: torch.Tensor, K: torch.Tensor, h: float) -> torch.Tensor:
        return F.conv2d(g, (K * h).flip(-1, -2).transpose(0, 1), padding=1)

    @staticmethod
    def weight_vjp(u: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        c = u.shape[1]
        return torch.nn.grad.conv2d_weight(u, (g.shape[1], c, 3, 3), g, padding=1)


CONV_OPS = {"reference": ReferenceConvOps, "fast": FastConvOps}
