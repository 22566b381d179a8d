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


ROWS = 64               # grid rows a chunk of z computes (bounds peaks' temporaries)


def _axis(grid: int) -> torch.Tensor:
    return torch.linspace(*DOMAIN, grid, dtype=torch.float64)


def grid_labels(grid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels of the grid² points, row-major (`grid_points` maps an index to its point),
    and the N_CLASSES+1 bin edges.

    Bins are equal-width between min and max of z, lower-exclusive and
    upper-inclusive; the minimum itself belongs to class 0. z is computed a few rows
    at a time and no grid² array of points is built, so the peak is z and the labels
    (16 bytes a point), within the source the memory preflight counts (peaks_sizes).
    """
    axis = _axis(grid)
    z = torch.empty(grid * grid, dtype=torch.float64)
    for lo in range(0, grid, ROWS):
        rows = axis[lo:lo + ROWS]       # y of these rows; x runs along each row
        z[lo * grid:(lo + rows.numel()) * grid] = \
            peaks(axis.unsqueeze(0), rows.unsqueeze(1)).reshape(-1)
    edges = torch.linspace(float(z.min()), float(z.max()), N_CLASSES + 1, dtype=torch.float64)
    # bucketize(right=False) gives i with edges[i-1] < z <= edges[i]
    labels = torch.bucketize(z, edges[1:-1], right=False).clamp_(0, N_CLASSES - 1)
    return labels, edges


def grid_points(index: torch.Tensor, grid: int) -> torch.Tensor:
    """The (len(index), 2) points (x, y) of row-major grid indices."""
    axis = _axis(grid)
    return torch.stack([axis[index % grid], axis[index // grid]], dim=1)


def _draw(labels: torch.Tensor, per_class: int, gen: torch.Generator) -> torch.Tensor:
    """Balanced draw with replacement: per_class indices of each class."""
    picks = []
    for c in range(N_CLASSES):
        members = torch.nonzero(labels == c).squeeze(1)
        picks.append(members[torch.randint(members.numel(), (per_class,), generator=gen)])
    return torch.cat(picks)


@register_sizes("peaks")
def peaks_sizes(options: PeaksOptions) -> Sizes:
    """The drawn sets, and the grid² points the loader labels before it draws them."""
    return Sizes(options.n_train, options.n_val, (2,), N_CLASSES, options.grid ** 2)


@register("peaks")
def load_peaks(options: PeaksOptions, seed: int, preprocessing: dict | None = None
               ) -> Dataset:
    """Draw the training and validation sets independently from the grid (the points as
    they are: there is no `preprocessing` to fit or apply)."""
    labels, edges = grid_labels(options.grid)
    gen = torch.Generator().manual_seed(seed)
    train = _draw(labels, options.n_train // N_CLASSES, gen)
    val = _draw(labels, options.n_val // N_CLASSES, gen)
    g = options.grid
    return Dataset("peaks", grid_points(train, g), labels[train], grid_points(val, g),
                   labels[val],
                   N_CLASSES, "generated",
                   {"bin_edges": edges.tolist(),
                    "preprocessing": {"kind": "identity", "domain": [list(DOMAIN)] * 2}})
