"""Residual steps that no lptrain code knows, for the tests of `network=custom`
(`network.step._target_=custom_step_pkg.MyStep`, tests/ on the path)."""
from __future__ import annotations

import sys

import torch
from torch import nn


class MyStep(nn.Module):
    """f(u) = conv₂(tanh(GroupNorm(conv₁(u)))) on states (B, channels, H, W)."""

    def __init__(self, channels: int = 4, hidden: int = 4, groups: int = 2):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, hidden, 3, padding=1)
        self.norm = nn.GroupNorm(groups, hidden)
        self.conv2 = nn.Conv2d(hidden, channels, 3, padding=1)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.tanh(self.norm(self.conv1(u))))


class DenseStep(nn.Module):
    """f(u) = B tanh(A u + a) + b on states (B, width)."""

    def __init__(self, width: int = 8, hidden: int = 6):
        super().__init__()
        self.inner = nn.Linear(width, hidden)
        self.outer = nn.Linear(hidden, width)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.outer(torch.tanh(self.inner(u)))


class Checkpointed(DenseStep):
    """DenseStep under activation checkpointing: its backward recomputes f."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(super().forward, u, use_reentrant=False)


class FrozenBias(DenseStep):
    """DenseStep with its inner bias frozen (requires_grad False): refused."""

    def __init__(self, width: int = 8):
        super().__init__(width)
        self.inner.bias.requires_grad_(False)


class Widening(nn.Module):
    """A step that does not keep the state's shape (refused)."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width + 1)

    def forward(self, u):
        return self.lin(u)


def not_a_module(width: int = 8):
    return width


class RandomMixing(DenseStep):
    """DenseStep whose output is mixed by a fixed random matrix, a buffer (README: "keep a
    fixed tensor as a buffer"), drawn by the constructor."""

    def __init__(self, width: int = 8, hidden: int = 6):
        super().__init__(width, hidden)
        self.register_buffer("mix", torch.randn(width, width))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return super().forward(u) @ self.mix


class Single(DenseStep):
    """DenseStep that returns float32 whatever the state's dtype."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return super().forward(u).float()


class Doubling(DenseStep):
    """DenseStep that returns float64 whatever the state's dtype."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return super().forward(u).double()


class Batchwise(DenseStep):
    """DenseStep that changes the state's dtype on batches of more than 2 samples only:
    past the try at build (2 samples)."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        y = super().forward(u)
        if u.shape[0] <= 2:
            return y
        return y.to(torch.float32 if u.dtype == torch.float64 else torch.float64)


class Regularised(DenseStep):
    """DenseStep with dropout and batch normalisation, modules that a step run in eval
    mode keeps inert."""

    def __init__(self, width: int = 8, hidden: int = 6):
        super().__init__(width, hidden)
        self.drop, self.norm = nn.Dropout(0.2), nn.BatchNorm1d(hidden)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.outer(self.drop(torch.tanh(self.norm(self.inner(u)))))


class FailsLater(DenseStep):
    """Raises on its `after`-th call in this process and later: every rank of a data
    split alike, past the checks at build."""

    calls = 0

    def __init__(self, width: int, hidden: int = 3, after: int = 30):
        super().__init__(width, hidden)
        self.after = after

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        FailsLater.calls += 1
        if FailsLater.calls >= self.after:
            raise RuntimeError(f"fails at call {FailsLater.calls}")
        return super().forward(u)


class FailsOnRankOne(MyStep):
    """MyStep that raises on rank 1 of MPI's world only: the trial of a step on each
    rank's device may fail on some ranks alone."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == 1:
            raise RuntimeError("this step fails on rank 1")
        return super().forward(u)


class UnbuiltOnRankOne(MyStep):
    """MyStep whose constructor raises on rank 1 of MPI's world only."""

    def __init__(self, **kwargs):
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == 1:
            raise RuntimeError("this step cannot be built on rank 1")
        super().__init__(**kwargs)


class ExitsOnRankOne(DenseStep):
    """DenseStep whose `after`-th call on rank 1 of MPI's world calls sys.exit(3) (a
    user's step that ends the process its own way), or raises KeyboardInterrupt where
    `how` says so; rank 0 goes on into the next message."""

    calls = 0

    def __init__(self, width: int, hidden: int = 3, after: int = 30, how: str = "exit"):
        super().__init__(width, hidden)
        self.after, self.how = after, how

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        from mpi4py import MPI
        ExitsOnRankOne.calls += 1
        if MPI.COMM_WORLD.Get_rank() == 1 and ExitsOnRankOne.calls >= self.after:
            if self.how == "interrupt":
                raise KeyboardInterrupt
            sys.exit(3)
        return super().forward(u)


class NotFinite(DenseStep):
    """DenseStep whose output is NaN on batches of more than 2 samples (past the try at
    build): a network whose objective is not finite at θ₀."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return super().forward(u) * (float("nan") if u.shape[0] > 2 else 1.0)


class AlwaysNaN(DenseStep):
    """DenseStep whose output is NaN for every state."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return super().forward(u) * float("nan")


class Noisy(DenseStep):
    """DenseStep plus noise: not a function of the state."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return super().forward(u) + 0.1 * torch.randn_like(u)


class Log1p(DenseStep):
    """DenseStep of log1p(u): defined for u > -1 (the states of a relu opening)."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.log1p(u))


class TinyNoise(DenseStep):
    """An update of about 1e-3 with noise of 1e-5: not a function of the state."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return 1e-3 * super().forward(u) + 1e-5 * torch.randn_like(u)


class BelowCheckNoise(DenseStep):
    """DenseStep with relative noise of 1e-6: below the build check's 1e-4, so built;
    MGRIT's residuals stop falling at the noise."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        out = super().forward(u)
        return out * (1 + 1e-6 * torch.randn_like(out))


class ClampsInPlace(DenseStep):
    """Clips its inner weight in place at every call (the same each time): writes θ."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.inner.weight.clamp_(-0.2, 0.2)
        return super().forward(u)


class CountsCalls(DenseStep):
    """Counts its calls in a buffer: writes a buffer every layer shares."""

    def __init__(self, width: int = 8, hidden: int = 6):
        super().__init__(width, hidden)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(u)


class LazyBuffer(DenseStep):
    """Registers a constant buffer at its first call (legitimate: it is the same after)."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "scale"):
            self.register_buffer("scale", torch.full((), 0.5, dtype=u.dtype))
        return self.scale * super().forward(u)


class Hamiltonian(DenseStep):
    """f(u) = J ∇H(u), H(u) = Σ tanh(A u + a), J the antisymmetric shift: an update taken
    by autograd.grad inside the step, with the graph kept for the adjoint."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            x = u if u.requires_grad else u.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(torch.tanh(self.inner(x)).sum(), x,
                                       create_graph=True)
        return torch.roll(g, 1, dims=-1) - torch.roll(g, -1, dims=-1)


class HamiltonianNoGraph(DenseStep):
    """Hamiltonian without create_graph: its update carries no graph to its parameters."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            x = u.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(torch.tanh(self.inner(x)).sum(), x)
        return torch.roll(g, 1, dims=-1) - torch.roll(g, -1, dims=-1)


class DetachedWeights(DenseStep):
    """DenseStep with its weights detached: the update depends on the state only."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(u @ self.inner.weight.detach().T + self.inner.bias.detach())
        return h @ self.outer.weight.detach().T + self.outer.bias.detach()


class Centred(DenseStep):
    """DenseStep centred over the batch: a sample's update depends on the others."""

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        y = super().forward(u)
        return y - y.mean(0, keepdim=True)
