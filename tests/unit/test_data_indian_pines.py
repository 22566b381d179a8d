"""Indian Pines loader: .mat v5 and v7.3 files, the tensorly copy, normalisation, errors."""
import h5py
import numpy as np
import pytest
import scipy.io
import torch

from helpers import as_default_path
from lptrain.data import indian_pines as ip
from lptrain.data import preprocessing
from lptrain.data.base import load_dataset, stratified_split
from lptrain.errors import ConfigError, DataError

ROWS, COLS = 12, 10  # not square, so a missed transposition cannot go unnoticed
PINES_COUNTS = [46, 1428, 830, 237, 483, 730, 28, 478, 20, 972, 2455, 593, 205, 1265, 386, 93]


def make_scene(bands, seed=0):
    """Cube whose band 0 is the pixel's row-major index, and a ground truth using 0..16."""
    rng = np.random.default_rng(seed)
    gt = np.arange(ROWS * COLS).reshape(ROWS, COLS) % 17  # every class 7 times, 0 = unlabelled
    gt = rng.permutation(gt.ravel()).reshape(ROWS, COLS).astype(np.uint8)
    cube = rng.integers(1000, 9000, size=(ROWS, COLS, bands)).astype(np.uint16)
    cube[:, :, 0] = np.arange(ROWS * COLS).reshape(ROWS, COLS)
    return cube, gt


def write_v5(path, name, array):
    scipy.io.savemat(path, {name: array})


def write_v73(path, name, array):
    """HDF5 laid out like MATLAB -v7.3: 512-byte user block, axes stored reversed."""
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset(name, data=np.ascontiguousarray(array.T))
        f[name].attrs["MATLAB_class"] = np.bytes_("double" if array.ndim == 3 else "uint8")
    with open(path, "r+b") as f:
        f.write(b"MATLAB 7.3 MAT-file, created by lptrain tests".ljust(116) + b"\0" * 8
                + b"\x00\x02IM")


def write_scene(directory, variant="corrected", writer=write_v5, seed=0):
    bands = ip.BANDS[variant]
    cube, gt = make_scene(bands, seed)
    stem = ip.CUBE_FILES[variant][:-4]
    writer(directory / ip.CUBE_FILES[variant], stem.lower(), cube)
    writer(directory / ip.GT_FILE, "indian_pines_gt", gt)
    return cube, gt


@pytest.fixture
def fallback(monkeypatch):
    """The test's directory stands for the default path (helpers.as_default_path)."""
    as_default_path(monkeypatch)


@pytest.fixture
def no_tensorly(monkeypatch):
    monkeypatch.setattr(ip, "package_dir", lambda name: None)


def options(path, **kw):
    return ip.IndianPinesOptions(path=str(path), **{"n_train": 40, "n_val": 30, **kw})


def stat(data, key):
    return torch.tensor(data.meta[key], dtype=torch.float64)


def raw_rows(data, x):
    """Undo the normalisation with the statistics stored in meta."""
    return x * stat(data, "band_std") + stat(data, "band_mean")


@pytest.mark.parametrize("writer", [write_v5, write_v73])
@pytest.mark.parametrize("variant", ["corrected", "full"])
def test_mat_files_give_labelled_spectra(tmp_path, no_tensorly, writer, variant):
    cube, gt = write_scene(tmp_path, variant, writer)
    data = load_dataset(options(tmp_path, variant=variant), seed=0)
    bands = ip.BANDS[variant]
    assert data.x_train.shape == (40, bands) and data.x_val.shape == (30, bands)
    assert data.x_train.dtype == torch.float64 and data.y_train.dtype == torch.int64
    assert data.n_classes == 16 and data.meta["bands"] == bands
    assert data.meta["variant"] == variant and data.meta["n_labelled"] == int((gt > 0).sum())
    assert data.source == f"{tmp_path / ip.CUBE_FILES[variant]}, {tmp_path / ip.GT_FILE}"
    flat_cube, flat_gt = cube.reshape(-1, bands), gt.ravel()
    for x, y in ((data.x_train, data.y_train), (data.x_val, data.y_val)):
        pixel = raw_rows(data, x)[:, 0].round().long().numpy()  # band 0 = pixel index
        assert (flat_gt[pixel] > 0).all()  # unlabelled pixels are excluded
        np.testing.assert_array_equal(flat_gt[pixel] - 1, y.numpy())
        np.testing.assert_allclose(raw_rows(data, x).numpy(), flat_cube[pixel], atol=1e-8)
    assert set(data.y_train.tolist()) == set(range(16))


def test_v73_and_v5_give_the_same_dataset(tmp_path, no_tensorly):
    (tmp_path / "v5").mkdir()
    (tmp_path / "v73").mkdir()
    write_scene(tmp_path / "v5", writer=write_v5)
    write_scene(tmp_path / "v73", writer=write_v73)
    a = load_dataset(options(tmp_path / "v5"), seed=4)
    b = load_dataset(options(tmp_path / "v73"), seed=4)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_val, b.y_val)


def test_normalisation_uses_training_pixels_only(tmp_path, no_tensorly):
    write_scene(tmp_path)
    data = load_dataset(options(tmp_path, n_train=30, n_val=60), seed=1)
    zeros = torch.zeros(200, dtype=torch.float64)
    assert torch.allclose(data.x_train.mean(0), zeros, atol=1e-12)
    assert torch.allclose(data.x_train.std(0, correction=0), zeros + 1, atol=1e-12)
    train_raw = raw_rows(data, data.x_train)
    both_raw = torch.cat([train_raw, raw_rows(data, data.x_val)])
    assert torch.allclose(stat(data, "band_mean"), train_raw.mean(0), atol=1e-9)
    # had validation pixels been used, the statistics would differ by far more
    assert (stat(data, "band_mean") - both_raw.mean(0)).abs().max() > 1
    assert data.x_val.mean(0).abs().max() > 1e-3


def test_recorded_preprocessing_maps_raw_spectra_to_the_features_exactly(tmp_path,
                                                                         no_tensorly):
    """What a saved model applies to new spectra (data/preprocessing.py) is what the loader
    computed, bitwise."""
    cube, gt = write_scene(tmp_path)
    data = load_dataset(options(tmp_path), seed=3)
    labelled = torch.from_numpy(cube[gt > 0].astype(np.float64))
    labels = torch.from_numpy(gt[gt > 0].astype(np.int64) - 1)
    train, val = stratified_split(labels, 40, 30, torch.Generator().manual_seed(3))
    spec = data.meta["preprocessing"]
    assert spec["kind"] == "standardise" and spec["mean"] == data.meta["band_mean"]
    assert torch.equal(preprocessing.apply(spec, labelled[val]), data.x_val)
    assert torch.equal(preprocessing.apply(spec, labelled[train]), data.x_train)


def test_split_is_seeded_and_stratified(tmp_path, no_tensorly):
    write_scene(tmp_path)
    a = load_dataset(options(tmp_path, n_train=64, n_val=32), seed=2)
    b = load_dataset(options(tmp_path, n_train=64, n_val=32), seed=2)
    c = load_dataset(options(tmp_path, n_train=64, n_val=32), seed=3)
    assert torch.equal(a.x_train, b.x_train) and not torch.equal(a.x_train, c.x_train)
    assert torch.bincount(a.y_train, minlength=16).tolist() == [4] * 16
    assert torch.bincount(a.y_val, minlength=16).tolist() == [2] * 16


def test_auto_prefers_220_bands_and_corrected_can_be_forced(tmp_path, no_tensorly):
    write_scene(tmp_path, "corrected")
    write_scene(tmp_path, "full")
    assert load_dataset(options(tmp_path), seed=0).meta["bands"] == 220
    assert load_dataset(options(tmp_path, variant="corrected"), seed=0).meta["bands"] == 200


def test_the_sizes_have_the_bands_of_the_variant_found(tmp_path, no_tensorly):
    """The sizes said 220 bands for the 200-band scene: `network.opening=pad` then refused
    network.width=200 (held-out). They are the loaded data's, whichever variant."""
    from lptrain.data.base import dataset_sizes
    write_scene(tmp_path, "corrected")
    assert dataset_sizes(options(tmp_path)).feature_shape == (200,) == \
        load_dataset(options(tmp_path), seed=0).feature_shape
    write_scene(tmp_path, "full")
    assert dataset_sizes(options(tmp_path)).feature_shape == (220,)
    assert dataset_sizes(options(tmp_path, variant="corrected")).feature_shape == (200,)


def test_full_variant_without_file_names_it(tmp_path, no_tensorly):
    write_scene(tmp_path, "corrected")
    with pytest.raises(DataError, match="Indian_pines.mat together with Indian_pines_gt.mat"
                       ) as err:
        load_dataset(options(tmp_path, variant="full"), seed=0)
    assert str(tmp_path) in str(err.value) and "only the user" in str(err.value)


def test_nothing_found_names_files_directory_and_remedy(tmp_path, no_tensorly, monkeypatch, fallback):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nowhere").mkdir()
    with pytest.raises(DataError) as err:
        load_dataset(options("nowhere"), seed=0)
    text = str(err.value)
    for part in ("Indian_pines.mat", "Indian_pines_corrected.mat", "Indian_pines_gt.mat",
                 str(tmp_path / "nowhere"), "10.4231/R7RX991C", "pip install 'lptrain[data]'",
                 "pip install --no-deps tensorly"):
        assert part in text


def test_a_chosen_path_that_does_not_exist_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="dataset.path='typo': no such directory"):
        load_dataset(options("typo"), seed=0)


def test_relative_path_found_from_cwd(tmp_path, no_tensorly, monkeypatch):
    (tmp_path / "scene").mkdir()
    write_scene(tmp_path / "scene")
    monkeypatch.chdir(tmp_path)
    data = load_dataset(options("scene"), seed=0)
    assert str(tmp_path / "scene" / ip.GT_FILE) in data.source


def test_a_chosen_path_without_the_scene_is_an_error_not_a_fallback(tmp_path):
    """Was a silent run on tensorly's packaged copy."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="the packaged 200-band copy is used only when "
                                        "dataset.path is left at its default"):
        load_dataset(options(tmp_path / "empty"), seed=0)


def test_falls_back_to_tensorly_copy(tmp_path, monkeypatch, fallback):
    pkg = tmp_path / "tensorly"
    (pkg / "datasets" / "data").mkdir(parents=True)
    cube, gt = make_scene(200)
    np.save(pkg / ip.TENSORLY_FILES[0], cube)
    np.save(pkg / ip.TENSORLY_FILES[1], gt)
    monkeypatch.setattr(ip, "package_dir", lambda name: pkg if name == "tensorly" else None)
    (tmp_path / "empty").mkdir()
    data = load_dataset(options(tmp_path / "empty"), seed=0)
    assert data.meta["variant"] == "corrected" and data.x_train.shape == (40, 200)
    assert data.source == f"{pkg / ip.TENSORLY_FILES[0]}, {pkg / ip.TENSORLY_FILES[1]}"


def test_cube_without_ground_truth(tmp_path, no_tensorly):
    write_scene(tmp_path)
    (tmp_path / ip.GT_FILE).unlink()
    with pytest.raises(DataError, match="ground truth .*Indian_pines_gt.mat is missing"):
        load_dataset(options(tmp_path), seed=0)


def test_wrong_band_count_names_file(tmp_path, no_tensorly):
    cube, gt = make_scene(204)
    write_v5(tmp_path / ip.CUBE_FILES["corrected"], "x", cube)
    write_v5(tmp_path / ip.GT_FILE, "g", gt)
    with pytest.raises(DataError, match=r"Indian_pines_corrected.mat: 204 bands, expected 200"):
        load_dataset(options(tmp_path), seed=0)


def test_shape_mismatch_names_both_files(tmp_path, no_tensorly):
    cube, gt = make_scene(200)
    write_v5(tmp_path / ip.CUBE_FILES["corrected"], "x", cube)
    write_v5(tmp_path / ip.GT_FILE, "g", gt[:, :-1])
    with pytest.raises(DataError, match=r"corrected.mat is 12x10 pixels but .*gt.mat is 12x9"):
        load_dataset(options(tmp_path), seed=0)


def test_bad_ground_truth_value_names_file(tmp_path, no_tensorly):
    cube, gt = make_scene(200)
    gt[0, 0] = 17
    write_v5(tmp_path / ip.CUBE_FILES["corrected"], "x", cube)
    write_v5(tmp_path / ip.GT_FILE, "g", gt)
    with pytest.raises(DataError, match=r"Indian_pines_gt.mat: ground-truth value 17"):
        load_dataset(options(tmp_path), seed=0)


@pytest.mark.parametrize("content", [b"", b"not a MATLAB file" * 20, "truncate"])
def test_corrupt_mat_names_file(tmp_path, no_tensorly, content):
    write_scene(tmp_path)
    target = tmp_path / ip.CUBE_FILES["corrected"]
    data = target.read_bytes()
    target.write_bytes(data[:len(data) // 2] if content == "truncate" else content)
    with pytest.raises(DataError, match=f"{target}: unreadable MATLAB file"):
        load_dataset(options(tmp_path), seed=0)


def test_ambiguous_mat_names_variables(tmp_path, no_tensorly):
    cube, gt = make_scene(200)
    scipy.io.savemat(tmp_path / ip.CUBE_FILES["corrected"], {"a": cube, "b": cube})
    write_v5(tmp_path / ip.GT_FILE, "g", gt)
    with pytest.raises(DataError, match=r"corrected.mat: expected one numeric 3-dimensional "
                                        r"variable, found \['a', 'b'\]"):
        load_dataset(options(tmp_path), seed=0)


# what the cube and ground-truth files hold instead -> the one error line's end
WRONG_CONTENT = {
    "cube_of_cells": (lambda c, g: ({"x": np.array([[c, "a"]], dtype=object)}, {"g": g}),
                      r"corrected.mat: expected one numeric 3-dimensional variable, found none "
                      r"\(it holds x \(a cell array 1x2\)\)"),
    "complex_cube": (lambda c, g: ({"x": c * 1j}, {"g": g}),
                     r"found none \(it holds x \(complex float64 12x10x200\)\)"),
    "ground_truth_in_3d": (lambda c, g: ({"x": c}, {"g": np.stack([g, g], axis=2)}),
                           r"gt.mat: expected one numeric 2-dimensional variable, found none "
                           r"\(it holds g \(uint8 12x10x2\)\)"),
    "text_for_ground_truth": (lambda c, g: ({"x": c}, {"g": "indian pines"}),
                              r"gt.mat: .* found none \(it holds g \(text 1x12\)\)"),
    "nothing_labelled": (lambda c, g: ({"x": c}, {"g": g * 0}),
                         r"gt.mat: no labelled pixel"),
    "nan_in_a_labelled_pixel": (lambda c, g: ({"x": np.where(g[..., None] == 3, np.nan, c)},
                                              {"g": g}),
                                r"corrected.mat: 1400 values of labelled pixels are nan"),
    "values_beyond_float64_statistics": (lambda c, g: ({"x": c * 1e300}, {"g": g}),
                                         r"corrected.mat: values up to .*e\+303, too large"),
    "negative_label": (lambda c, g: ({"x": c}, {"g": g.astype(np.int16) - 1}),
                       r"gt.mat: ground-truth value -1 outside 0..16"),
    "fractional_label": (lambda c, g: ({"x": c}, {"g": np.where(g == 3, 2.5, g)}),
                         r"gt.mat: ground-truth value 2.5 outside 0..16"),
}


@pytest.mark.parametrize("case", list(WRONG_CONTENT))
def test_wrong_content_names_file_and_what_it_holds(tmp_path, no_tensorly, case):
    make, message = WRONG_CONTENT[case]
    cube_vars, gt_vars = make(*make_scene(200))
    scipy.io.savemat(tmp_path / ip.CUBE_FILES["corrected"], cube_vars)
    scipy.io.savemat(tmp_path / ip.GT_FILE, gt_vars)
    with pytest.raises(DataError, match=message):
        load_dataset(options(tmp_path), seed=0)


def test_a_file_that_crashed_the_reader_is_named(tmp_path, no_tensorly):
    # the values' data type damaged: scipy's reader died of SIGBUS/SIGSEGV on such a file
    write_scene(tmp_path)
    gt = tmp_path / ip.GT_FILE
    data = gt.read_bytes()
    pos = data.index(b"\x02\x00\x00\x00\x78\x00\x00\x00")     # miUINT8, 120 values
    gt.write_bytes(data[:pos + 1] + b"\x64" + data[pos + 2:])
    with pytest.raises(DataError, match=f"{gt}: unreadable MATLAB file .*data type 25602"):
        load_dataset(options(tmp_path), seed=0)


def test_a_packaged_npy_of_the_wrong_shape_is_named(tmp_path, monkeypatch, fallback):
    cube, gt = make_scene(200)
    files = (tmp_path / "cube.npy", tmp_path / "gt.npy")
    np.save(files[0], cube[:, :, 0])
    np.save(files[1], gt)
    monkeypatch.setattr(ip, "tensorly_files", lambda: files)
    with pytest.raises(DataError, match=r"cube.npy: a uint16 array of shape \(12, 10\), "
                                        r"expected numbers in 3 dimensions"):
        load_dataset(options(tmp_path), seed=0)     # no .mat files there


@pytest.mark.parametrize("key, value", [("variant", "raw"), ("n_train", 0), ("n_val", -1)])
def test_options_are_validated(key, value):
    with pytest.raises(ConfigError, match=f"dataset.{key}={value!r}"):
        ip.IndianPinesOptions(**{key: value})


@pytest.mark.skipif(ip.tensorly_files() is None, reason="tensorly is not installed")
def test_tensorly_copy_has_the_published_class_counts(monkeypatch, tmp_path, fallback):
    monkeypatch.chdir(tmp_path)  # make sure no local .mat file is picked up
    gt = np.load(ip.tensorly_files()[1])
    assert gt.shape == (145, 145)
    assert np.bincount(gt.ravel(), minlength=17)[1:].tolist() == PINES_COUNTS
    data = load_dataset(ip.IndianPinesOptions(path=str(tmp_path)), seed=0)
    assert data.meta["n_labelled"] == 10249 and data.meta["scene"] == [145, 145]
    assert data.x_train.shape == (4000, 200) and data.x_val.shape == (2000, 200)
    got = torch.bincount(data.y_train, minlength=16).double()
    assert (got - torch.tensor(PINES_COUNTS) * 4000 / 10249).abs().max() < 1


def test_sizes_count_the_labelled_pixels_and_refuse_more(tmp_path, no_tensorly):
    """n_train=100000 got a memory refusal suggesting dataset.n_train=75414, of a scene of
    10249 labelled pixels: the sizes the scene cannot hold are refused first."""
    from lptrain.data.base import dataset_sizes
    _, gt = write_scene(tmp_path)
    labelled = int((gt > 0).sum())
    sizes = dataset_sizes(options(tmp_path, n_train=40, n_val=20))
    assert sizes.n_source == labelled == 112
    with pytest.raises(ConfigError, match=rf"^dataset.n_train\+n_val=100000\+20: need "
                                          rf"non-negative sizes summing to at most the "
                                          rf"{labelled} samples$"):
        dataset_sizes(options(tmp_path, n_train=100000, n_val=20))
