"""What a loader does to raw samples, recorded so that a saved model can do it again.

Every loader puts a spec `{"kind": NAME, ...parameters}` into its dataset's
`meta["preprocessing"]` and computes its features with the transform registered under
NAME, so `apply(spec, raw)` on the raw samples gives exactly (bitwise) the features the
network was trained and validated on:

- `identity` (Peaks): the points (x, y) as they are; `domain` is the square the points
  were drawn from, [−3, 3]², where the classes are defined by the data.
- `standardise` (Indian Pines): (x − mean) / std per band, with the training pixels'
  `mean` and (population) `std`.
- `pixels` (MNIST, Fashion-MNIST): grey levels y in 0..255 mapped by `scaling`:
  `authors` tanh(6·y/255 − 3) + 1, `unit` y/255, `standard` (y/255 − pixel_mean) /
  pixel_std.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from lptrain.errors import one_of

# kind -> transform(x, spec): raw float64 samples (n, *feature_shape) -> features
TRANSFORMS: dict[str, Callable[[torch.Tensor, dict], torch.Tensor]] = {}


def register(kind: str):
    def wrap(fn):
        TRANSFORMS[kind] = fn
        return fn
    return wrap


def recorded(spec: dict | None, kind: str) -> dict | None:
    """`spec` where it is a recorded preprocessing of `kind`, else None: what a loader
    given a spec (base.load_dataset) applies instead of fitting its own."""
    return spec if spec is not None and spec.get("kind") == kind else None


def apply(spec: dict, raw: torch.Tensor) -> torch.Tensor:
    """The features of raw float64 samples (n, *feature_shape) under `spec` (ValueError
    for a kind this lptrain does not know or values the transform cannot take)."""
    try:
        transform = TRANSFORMS[spec["kind"]]
    except KeyError:
        raise ValueError(f"preprocessing {spec.get('kind')!r}: unknown, this lptrain knows "
                         f"{sorted(TRANSFORMS)}") from None
    return transform(raw, spec)


@register("identity")
def identity(x: torch.Tensor, spec: dict) -> torch.Tensor:
    return x


def standardise(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(x − mean) / std over the last axis: what the Indian Pines loader computes."""
    return (x - mean) / std


def standardise_stats(spec: dict, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) of a recorded `standardise` spec, float64 tensors."""
    return tuple(torch.tensor(spec[k], dtype=torch.float64, device=device)
                 for k in ("mean", "std"))


@register("standardise")
def _standardise(x: torch.Tensor, spec: dict) -> torch.Tensor:
    return standardise(x, *standardise_stats(spec, x.device))


PIXEL_SCALINGS = ("authors", "unit", "standard")
GREY_LEVELS = 255


def pixel_values(unit: np.ndarray, scaling: str, mean: float, std: float) -> np.ndarray:
    """Scaled pixels from grey levels divided by 255 (float64, any shape); the MNIST
    loader builds its lookup table of the 256 levels with this very function."""
    if scaling == "authors":
        return np.tanh(6 * unit - 3) + 1
    if scaling == "unit":
        return unit
    if scaling == "standard":
        return (unit - mean) / std
    raise ValueError(f"pixel scaling {scaling!r}: {one_of(PIXEL_SCALINGS)}")


def recorded_pixel_values(unit: np.ndarray, spec: dict) -> np.ndarray:
    """pixel_values with the scaling and statistics of a recorded `pixels` spec."""
    return pixel_values(unit, spec["scaling"], spec.get("pixel_mean", math.nan),
                        spec.get("pixel_std", math.nan))


@register("pixels")
def _pixels(x: torch.Tensor, spec: dict) -> torch.Tensor:
    low, high = (float(x.min()), float(x.max())) if x.numel() else (0.0, 0.0)
    if low < 0 or high > GREY_LEVELS:
        raise ValueError(f"pixels from {low:g} to {high:g}: expected grey levels in "
                         f"0..{GREY_LEVELS}")
    unit = x.detach().cpu().numpy() / GREY_LEVELS
    return torch.from_numpy(recorded_pixel_values(unit, spec)).to(x.device)
