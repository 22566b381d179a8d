"""Peaks: five classes from binning MATLAB's peaks function (docs/method.md §8)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lptrain.data.base import Dataset, Sizes, register, register_sizes
from lptrain.errors import require

N_CLASSES = 5
DOMAIN = (-3.0, 3.0)    # the grid covers DOMAIN² (both coordinates)


@dataclass
class PeaksOptions:
    name: str = "peaks"
    n_train: int = 5000
    n_val: int = 200
    grid: int = 256

    def __post_init__(self):
        require(self.n_train >= N_CLASSES and self.n_train % N_CLASSES == 0,
                "dataset.n_train", self.n_train, f"must be a positive multiple of {N_CLASSES}")
        require(self.n_val >= N_CLASSES and self.n_val % N_CLASSES == 0,
                "dataset.n_val", self.n_val, f"must be a positive multiple of {N_CLASSES}")
        require(self.grid >= 8, "dataset.grid", self.grid, "must be at least 8")


def peaks(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """MATLAB's peaks surface z(x, y)."""
    return (3 * (1 - x) ** 2 * torch.exp(-x ** 2 - (y + 1) ** 2)
            - 10 * (x / 5 - x ** 3 - y ** 5) * torch.exp(-x ** 2 - y ** 2)
            - torch.exp(-(x + 1) ** 2 - y ** 2) / 3)


def grid_labels(grid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grid points (grid², 2), their labels, and the N_CLASSES+1 bin edges.

    Bins are equal-width between min and max of z, lower-exclusive and
    upper-inclusive; the minimum itself belongs to class 0.
    """
    axis = torch.linspace(*DOMAIN, grid, dtype=torch.float64)
    xx, yy = torch.meshgrid(axis, axis, indexing="xy")
    z = peaks(xx, yy).reshape(-1)
    edges = torch.linspace(float(z.min()), float(z.max()), N_CLASSES + 1, dtype=torch.float64)
    # bucketize(right=False) gives i with edges[i-1] < z <= edges[i]
    labels = (torch.bucketize(z, edges[1:-1], right=False)).clamp(0, N_CLASSES - 1)
    points = torch.stack([xx.reshape(-1), yy.reshape(-1)], dim=1)
    return points, labels, edges


def _draw(labels: torch.Tensor, per_class: int, gen: torch.Generator) -> torch.Tensor:
    """Balanced draw with replacement: per_class indices of each class."""
    picks = []
    for c in range(N_CLASSES):
        members = torch.nonzero(labels == c).squeeze(1)
        picks.append(members[torch.randint(members.numel(), (per_class,), generator=gen)])
    return torch.cat(picks)


@register_sizes("peaks")
def peaks_sizes(options: PeaksOptions) -> Sizes:
    return Sizes(options.n_train, options.n_val, (2,), N_CLASSES)


@register("peaks")
def load_peaks(options: PeaksOptions, seed: int, preprocessing: dict | None = None
               ) -> Dataset:
    """Draw the training and validation sets independently from the grid (the points as
    they are: there is no `preprocessing` to fit or apply)."""
    points, labels, edges = grid_labels(options.grid)
    gen = torch.Generator().manual_seed(seed)
    train = _draw(labels, options.n_train // N_CLASSES, gen)
    val = _draw(labels, options.n_val // N_CLASSES, gen)
    return Dataset("peaks", points[train], labels[train], points[val], labels[val],
                   N_CLASSES, "generated",
                   {"bin_edges": edges.tolist(),
                    "preprocessing": {"kind": "identity", "domain": [list(DOMAIN)] * 2}})
