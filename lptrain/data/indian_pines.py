"""Indian Pines: per-pixel spectral classification of the AVIRIS scene (docs/method.md §8)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lptrain.data.base import (Dataset, Sizes, check_split, chosen, data_dirs, package_dir,
                               packaged_remedy, register, register_sizes, stratified_split)
from lptrain.data.matfile import MatFileError, read_variables
from lptrain.data.preprocessing import recorded, standardise, standardise_stats
from lptrain.errors import DataError, one_of, require

N_CLASSES = 16
VARIANTS = ("auto", "corrected", "full")
BANDS = {"full": 220, "corrected": 200}
CUBE_FILES = {"full": "Indian_pines.mat", "corrected": "Indian_pines_corrected.mat"}
GT_FILE = "Indian_pines_gt.mat"
TENSORLY_FILES = (Path("datasets", "data", "Indian_pines_corrected.npy"),
                  Path("datasets", "data", "Indian_pines_gt.npy"))
CITATION = "Purdue University Research Repository, doi:10.4231/R7RX991C"


@dataclass
class IndianPinesOptions:
    name: str = "indian_pines"
    n_train: int = 4000
    n_val: int = 2000
    path: str = "data/indian_pines"
    variant: str = "auto"  # auto: the 220-band file if present, else the 200-band one

    def __post_init__(self):
        require(self.n_train >= 1, "dataset.n_train", self.n_train, "must be positive")
        require(self.n_val >= 1, "dataset.n_val", self.n_val, "must be positive")
        require(self.variant in VARIANTS, "dataset.variant", self.variant,
                one_of(VARIANTS))


def read_mat(path: Path, ndim: int) -> np.ndarray:
    """The one numeric `ndim`-dimensional variable of a MATLAB file (v5, v7 or v7.3); where
    there are several, the one named like the file."""
    try:
        variables = read_variables(path)
    except (OSError, MatFileError) as err:
        raise DataError(f"{path}: unreadable MATLAB file ({err})") from None
    arrays = {v.name: v.array for v in variables
              if v.array is not None and v.array.ndim == ndim}
    if len(arrays) > 1 and path.stem.lower() in arrays:
        return arrays[path.stem.lower()]
    if len(arrays) != 1:
        held = ", ".join(v.describe() for v in variables) or "no variables"
        found = sorted(arrays) if arrays else "none"
        raise DataError(f"{path}: expected one numeric {ndim}-dimensional variable, "
                        f"found {found} (it holds {held})")
    return next(iter(arrays.values()))


def read_npy(path: Path, ndim: int) -> np.ndarray:
    """The numeric `ndim`-dimensional array of a .npy file."""
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise DataError(f"{path}: unreadable .npy file ({err})") from None
    if array.ndim != ndim or array.dtype.kind not in "biuf":
        raise DataError(f"{path}: a {array.dtype} array of shape {array.shape}, expected "
                        f"numbers in {ndim} dimensions")
    return array


def tensorly_files() -> tuple[Path, Path] | None:
    """The 200-band cube and ground truth shipped in the tensorly wheel, if installed."""
    root = package_dir("tensorly")
    if root is None:
        return None
    cube, gt = (root / p for p in TENSORLY_FILES)
    return (cube, gt) if cube.is_file() and gt.is_file() else None


def find_scene(dirs: list[Path], variant: str, fallback: bool = True
               ) -> tuple[list[Path], str]:
    """Files to read (cube, ground truth) and the variant they hold.

    Directories are tried in order; within one, `auto` prefers the 220-band
    file. Only the 200-band variant falls back to the tensorly copy, and only with
    `fallback` (dataset.path left at its default).
    """
    wanted = ["full", "corrected"] if variant == "auto" else [variant]
    for directory in dirs:
        for v in wanted:
            cube = directory / CUBE_FILES[v]
            if cube.is_file():
                gt = directory / GT_FILE
                if not gt.is_file():
                    raise DataError(f"{cube} found but its ground truth {gt} is missing")
                return [cube, gt], v
    if "corrected" not in wanted:
        raise DataError(missing_message(dirs, wanted, "the 220-band cube is not packaged "
                                                      "anywhere, only the user can supply it"))
    if not fallback:
        raise DataError(missing_message(dirs, wanted, "the packaged 200-band copy is used "
                                                      "only when dataset.path is left at "
                                                      "its default"))
    packaged = tensorly_files()
    if packaged:
        return list(packaged), "corrected"
    root = package_dir("tensorly")
    absent = [p for p in TENSORLY_FILES if root is None or not (root / p).is_file()]
    remedy = packaged_remedy("tensorly", root, absent[0])
    raise DataError(missing_message(dirs, wanted, f"for the 200-band copy offline {remedy}"))


def missing_message(dirs: list[Path], wanted: list[str], remedy: str) -> str:
    cubes = " or ".join(CUBE_FILES[v] for v in wanted)
    return (f"indian_pines: expected {cubes} together with {GT_FILE} in "
            f"{' or '.join(map(str, dirs))}, found none. Download them ({CITATION}) into "
            f"that directory or set dataset.path; {remedy}")


def read_scene(files: list[Path], variant: str) -> tuple[np.ndarray, np.ndarray]:
    """Cube (rows, cols, bands) and ground truth (rows, cols), checked against each other."""
    if files[0].suffix == ".npy":
        cube, gt = read_npy(files[0], 3), read_npy(files[1], 2)
    else:
        cube, gt = read_mat(files[0], 3), read_mat(files[1], 2)
    if cube.shape[:2] != gt.shape:
        raise DataError(f"{files[0]} is {cube.shape[0]}x{cube.shape[1]} pixels but "
                        f"{files[1]} is {gt.shape[0]}x{gt.shape[1]}")
    if cube.shape[2] != BANDS[variant]:
        raise DataError(f"{files[0]}: {cube.shape[2]} bands, expected {BANDS[variant]} "
                        f"for variant {variant}")
    bad = gt[(gt < 0) | (gt > N_CLASSES) | (gt != np.round(gt))]
    if bad.size:
        raise DataError(f"{files[1]}: ground-truth value {bad[0]} outside 0..{N_CLASSES}")
    if not (gt > 0).any():
        raise DataError(f"{files[1]}: no labelled pixel (every ground-truth value is 0)")
    spectra = cube[gt > 0].astype(np.float64)
    if not np.isfinite(spectra).all():
        raise DataError(f"{files[0]}: {int((~np.isfinite(spectra)).sum())} values of "
                        f"labelled pixels are nan or infinite")
    with np.errstate(over="ignore", invalid="ignore"):    # the band statistics must exist
        if not np.isfinite(spectra.std(axis=0)).all():
            raise DataError(f"{files[0]}: values up to {np.abs(spectra).max():.3g}, too "
                            f"large to standardise")
    return cube, gt


def normalise(x_train: torch.Tensor, x_val: torch.Tensor, spec: dict | None = None):
    """Standardise every band with the mean and std of the training pixels only, or with
    those of `spec` (a recorded `standardise`) where it has one of each per band."""
    spec = recorded(spec, "standardise")
    if spec is not None and len(spec["mean"]) == x_train.shape[1]:
        mean, std = standardise_stats(spec)
    else:
        mean = x_train.mean(dim=0)
        std = x_train.std(dim=0, correction=0)
        std = torch.where(std > 0, std, torch.ones_like(std))  # a constant band stays finite
    return standardise(x_train, mean, std), standardise(x_val, mean, std), mean, std


@register_sizes("indian_pines")
def indian_pines_sizes(options: IndianPinesOptions) -> Sizes:
    """The bands of the variant found (the network's checks use them: `network.opening=pad`
    with width 200 was refused on the 200-band scene as if it had 220), and the labelled
    pixels of the scene's ground truth (only that small file is read): sizes they
    cannot hold are refused here, before the memory check suggests one."""
    files, variant = find_scene(data_dirs(options), options.variant, not chosen(options))
    gt = read_npy(files[1], 2) if files[1].suffix == ".npy" else read_mat(files[1], 2)
    labelled = int((gt > 0).sum())
    check_split(options.n_train, options.n_val, labelled)
    return Sizes(options.n_train, options.n_val, (BANDS[variant],), N_CLASSES, labelled)


@register("indian_pines")
def load_indian_pines(options: IndianPinesOptions, seed: int,
                      preprocessing: dict | None = None) -> Dataset:
    """Labelled pixels (gt > 0) as spectra, labels gt − 1, seeded stratified split;
    standardised by the training pixels' statistics or `preprocessing`'s (normalise)."""
    files, variant = find_scene(data_dirs(options), options.variant, not chosen(options))
    cube, gt = read_scene(files, variant)
    mask = gt > 0
    x = torch.from_numpy(cube[mask].astype(np.float64))
    y = torch.from_numpy(gt[mask].astype(np.int64) - 1)
    gen = torch.Generator().manual_seed(seed)
    train, val = stratified_split(y, options.n_train, options.n_val, gen)
    x_train, x_val, mean, std = normalise(x[train], x[val], preprocessing)
    meta = {"bands": cube.shape[2], "variant": variant, "scene": list(gt.shape),
            "n_labelled": int(mask.sum()), "band_mean": mean.tolist(), "band_std": std.tolist(),
            "preprocessing": {"kind": "standardise", "mean": mean.tolist(),
                              "std": std.tolist()}}
    return Dataset("indian_pines", x_train, y[train], x_val, y[val], N_CLASSES,
                   ", ".join(map(str, files)), meta)
