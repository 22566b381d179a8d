"""The `lptrain` command end to end, in subprocesses: runs, bad inputs, kills, MPI, sweeps.

Every run uses a tiny Peaks configuration and a temporary run directory; results are read
from metrics.h5, never parsed from the console.
"""
from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from launch import ENV, REPO, lptrain, start
from lptrain import config
from lptrain.errors import FAILED, REFUSED
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import MODEL_FILES, load_model
from lptrain.train.checkpoint import CHECKPOINT_FILE

pytestmark = pytest.mark.cli

TIMEOUT = 120  # seconds; a hanging run fails the test instead of the suite

SEED = 3
ITERATIONS = 3
TINY = ["network.layers=4", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        f"train.iterations={ITERATIONS}", f"seed={SEED}", "eval_every=2"]
ERROR_PREFIX = "lptrain: error: "


def _lptrain(args, cwd, ranks: int = 1) -> subprocess.CompletedProcess:
    return lptrain(args, cwd, ranks, TIMEOUT)


def _error_lines(proc) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory):
    """One rank, started from a directory other than the repository, relative run dir."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    proc = _lptrain(["hydra.run.dir=run", *TINY], cwd=cwd)
    return proc, cwd / "run"


def test_end_to_end_run_writes_completed_metrics(serial_run):
    proc, run_dir = serial_run
    assert proc.returncode == 0, proc.stderr
    m = read_metrics(run_dir / ms.FILE_NAME)
    assert m.status == ms.COMPLETED
    assert m.mode == "serial"
    assert m.attrs[ms.WORLD_SIZE] == 1
    assert m.attrs[ms.SEED] == SEED
    config = OmegaConf.create(m.attrs[ms.CONFIG])
    assert (config.network.layers, config.network.width, config.train.iterations,
            config.seed, config.dataset.n_train) == (4, 4, ITERATIONS, SEED, 200)
    np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, ITERATIONS + 1))
    assert np.all(np.isfinite(m.train[ms.OBJECTIVE]))
    assert np.all((m.train[ms.ACCURACY] >= 0) & (m.train[ms.ACCURACY] <= 1))
    # validation before training, every eval_every iterations, and after the last one
    np.testing.assert_array_equal(m.validation[ms.ITERATION], [0, 2, 3])
    assert np.all(np.isfinite(m.validation[ms.LOSS]))
    assert np.all((m.validation[ms.ACCURACY] >= 0) & (m.validation[ms.ACCURACY] <= 1))


def test_console_names_the_metrics_file(serial_run):
    proc, run_dir = serial_run
    assert proc.returncode == 0, proc.stderr
    assert str((run_dir / ms.FILE_NAME).resolve()) in proc.stdout


def test_run_log_holds_the_console_lines(serial_run):
    proc, run_dir = serial_run
    assert proc.returncode == 0, proc.stderr
    logged = [ln.split("] ", 1)[1] for ln in
              (run_dir / "lptrain.log").read_text().splitlines()]
    progress = re.compile(rf"\d+/{ITERATIONS}  ")
    shown = [ln for ln in proc.stdout.splitlines()
             if progress.match(ln) or ln.startswith(("metrics: ", "model: "))]
    assert len(shown) >= 4     # plain lines: the first and the last iteration at least
    assert [ln for ln in logged if ln in shown] == shown
    assert "objective: " in "\n".join(logged)   # the summary, as name: value lines


def test_run_from_another_directory_writes_there_only(serial_run):
    proc, run_dir = serial_run
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / ms.FILE_NAME).is_file()
    assert not (REPO / "run").exists()


def _options_of(group: str) -> set[str]:
    return {p.stem for p in (Path(config.CONF_DIR) / group).glob("*.yaml")}


PINES = ["dataset=indian_pines", "dataset.path={data}", "dataset.variant=corrected"]
MNIST = ["dataset=mnist", "dataset.path={data}", "recipe=default", "network.channels=2",
         "dataset.n_train=null", "dataset.n_val=null"]
# (arguments, fragments the one error line must contain)
BAD_INPUTS = {
    "unknown_option": (["dataset=nope"], ["dataset", "nope"]),
    # Hydra's own groups: was Hydra's 10-line report and exit 1
    "unknown_launcher": (["hydra/launcher=joblib"],
                         ["Could not find 'hydra/launcher/joblib'; available: basic"]),
    "wrong_type": (["network.width=abc"], ["network.width", "abc"]),
    "misspelled_key": (["network.widht=3"], ["network.widht"]),
    "key_added_past_schema": (["+network.widht=3"], ["network.widht", "not an lptrain option"]),
    "zero_layers": (["network.layers=0"], ["network.layers=0"]),
    "negative_width": (["network.width=-1"], ["network.width=-1"]),
    "zero_T": (["network.T=0"], ["network.T=0"]),
    "zero_iterations": (["train.iterations=0"], ["train.iterations=0"]),
    "width_below_features": (["network.opening=pad", "network.width=1"],
                             ["network.width=1"]),
    "batch_above_data": (["optimizer=sgd", "train.batch_size=100000"],
                         ["train.batch_size=100000"]),
    # refused inside the run, into folders this command makes: none is left
    "batch_above_data_nested": (["optimizer=sgd", "train.batch_size=100000",
                                 "hydra.run.dir={tmp}/run/a/b"], ["train.batch_size=100000"]),
    "unwritable_dir": (["hydra.run.dir=/proc/lptrain-test"],
                       ["hydra.run.dir", "/proc/lptrain-test"]),
    "missing_dataset_path": (["dataset=mnist", "dataset.path=/nonexistent/lptrain-data"],
                             ["dataset.path='/nonexistent/lptrain-data'", "no such directory"]),
    # every rank holds all parameters: the advice must not be "more ranks"
    "parameters_beyond_memory": (["network.width=1000000"],
                                 ["memory: ", "more ranks do not help", "network.width"]),
    # malformed data files (BAD_DATA writes them into {data})
    "mat_of_random_bytes": (PINES, ["Indian_pines_corrected.mat: unreadable MATLAB file"]),
    "mat_of_a_damaged_type": (PINES, ["Indian_pines_gt.mat: unreadable MATLAB file",
                                      "data type 25602"]),
    "ground_truth_not_the_cube": (PINES, ["corrected.mat is 20x20 pixels but",
                                          "Indian_pines_gt.mat is 20x19"]),
    "label_out_of_range": (PINES, ["Indian_pines_gt.mat: ground-truth value 17 outside"]),
    "idx_labels_of_random_bytes": (MNIST, ["train-labels-idx1-ubyte: wrong IDX magic"]),
    "idx_images_empty": (MNIST, ["t10k-images-idx3-ubyte: truncated IDX file, 0 bytes"]),
}


def _pines(directory: Path, cube=None, gt=None) -> None:
    """A 20x20-pixel, 200-band scene (every class 25 times), or these bytes in its place."""
    import scipy.io
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.arange(400) % 16 + 1).reshape(20, 20).astype(np.uint8)
    scipy.io.savemat(directory / "Indian_pines_corrected.mat",
                     {"x": rng.integers(1000, 9000, (20, 20, 200)).astype(np.uint16)})
    scipy.io.savemat(directory / "Indian_pines_gt.mat", {"g": labels if gt is None else gt})
    if cube is not None:
        (directory / "Indian_pines_corrected.mat").write_bytes(cube)


def _retype_values(path: Path) -> None:
    """The damage that crashed scipy's reader: the values' data type field (miUINT8 of
    400 bytes) overwritten."""
    data = path.read_bytes()
    at = data.index(b"\x02\x00\x00\x00\x90\x01\x00\x00") + 1
    path.write_bytes(data[:at] + b"\x64" + data[at + 1:])


def _mnist(directory: Path, damaged: str, content: bytes) -> None:
    """Four small IDX files, the one named `damaged` holding `content` instead."""
    rng = np.random.default_rng(0)
    for stem, n in (("train", 60), ("t10k", 20)):
        for kind, array in (("images-idx3", rng.integers(0, 256, (n, 28, 28))),
                            ("labels-idx1", np.arange(n) % 10)):
            name = f"{stem}-{kind}-ubyte"
            head = bytes([0, 0, 8, array.ndim]) + b"".join(
                int(d).to_bytes(4, "big") for d in array.shape)
            (directory / name).write_bytes(content if name == damaged else
                                           head + array.astype(np.uint8).tobytes())


BAD_DATA = {
    "mat_of_random_bytes": lambda d: _pines(d, cube=np.random.default_rng(1).bytes(5000)),
    "mat_of_a_damaged_type": lambda d: (_pines(d), _retype_values(d / "Indian_pines_gt.mat")),
    "ground_truth_not_the_cube": lambda d: _pines(d, gt=np.ones((20, 19), np.uint8)),
    "label_out_of_range": lambda d: _pines(d, gt=np.full((20, 20), 17, np.uint8)),
    # the labels' count sized the run before: a memory refusal named no file
    "idx_labels_of_random_bytes": lambda d: _mnist(d, "train-labels-idx1-ubyte",
                                                   np.random.default_rng(1).bytes(5000)),
    "idx_images_empty": lambda d: _mnist(d, "t10k-images-idx3-ubyte", b""),
}


def _bad_args(args, tmp_path, case=None) -> list[str]:
    run = [] if any(a.startswith("hydra.run.dir=") for a in args) else [
        f"hydra.run.dir={tmp_path / 'run'}"]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if case in BAD_DATA:
        (tmp_path / "data").mkdir()
        BAD_DATA[case](tmp_path / "data")
        args = [a.replace("{data}", str(tmp_path / "data")) for a in args]
    # the tiny config first, so that the case's own values win
    return [*run, *TINY, *args]


def _assert_one_error(proc, fragments, status=REFUSED):
    lines = _error_lines(proc)
    assert proc.returncode == status, proc.stderr   # README "Exit status"
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(ERROR_PREFIX), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gives_one_error_line(case, tmp_path):
    args, fragments = BAD_INPUTS[case]
    proc = _lptrain(_bad_args(args, tmp_path, case), cwd=tmp_path)
    _assert_one_error(proc, fragments)
    # nothing ran, nothing is left (a refusal inside the run had left .hydra/ and the log)
    assert not (tmp_path / "run").exists()
    if case == "unknown_option":
        line = _error_lines(proc)[0]
        listed = line.split("available: ", 1)[1].split(", ")
        assert set(listed) == _options_of("dataset"), line


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["zero_layers", "batch_above_data"])
def test_bad_input_under_mpi_is_reported_once(case, tmp_path):
    # zero_layers fails while the overrides are checked, batch_above_data inside the run
    args, fragments = BAD_INPUTS[case]
    proc = _lptrain(_bad_args(args, tmp_path), cwd=tmp_path, ranks=2)
    _assert_one_error(proc, fragments)


def test_killed_run_keeps_finished_iterations_and_a_model(tmp_path):
    run_dir = tmp_path / "run"
    path = run_dir / ms.FILE_NAME
    args = [f"hydra.run.dir={run_dir}", *TINY, "optimizer=adam", "train.iterations=1000000",
            "eval_every=100000", "checkpoint_every=2"]
    seen = 0
    proc = start(args, tmp_path, stderr=tmp_path / "stderr.txt")   # a forked run
    try:
        deadline = time.monotonic() + TIMEOUT
        while seen < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            if path.exists():
                try:
                    seen = read_metrics(path).n_iterations
                except ms.MetricsFileError:
                    pass  # caught the file between its creation and the first flush
        assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()
        assert seen >= 3
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    m = read_metrics(path)
    assert m.status == ms.RUNNING
    n = m.n_iterations
    assert n >= seen
    np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, n + 1))
    assert np.all(np.isfinite(m.train[ms.OBJECTIVE]))
    assert m.validation[ms.ITERATION][0] == 0
    # the models are written with every checkpoint: the killed run can be evaluated
    # (Adam: the parameters after the checkpoint's iteration wait for the next step's
    # objective, so model-last.pt holds the iteration before, README "Divergence")
    model = load_model(run_dir, "last")
    assert 1 <= model.iteration <= n - 1
    assert torch.isfinite(model.theta).all()
    best = load_model(run_dir)              # validated at iteration 0 only
    assert (best.which, best.iteration) == ("best", 0)


@pytest.mark.mpi
def test_serial_mode_on_two_ranks_matches_one_rank(serial_run, tmp_path):
    one_proc, one_dir = serial_run
    assert one_proc.returncode == 0, one_proc.stderr
    run_dir = tmp_path / "run"
    proc = _lptrain([f"hydra.run.dir={run_dir}", *TINY, "mode=serial"], cwd=tmp_path,
                    ranks=2)
    assert proc.returncode == 0, proc.stderr
    one, two = read_metrics(one_dir / ms.FILE_NAME), read_metrics(run_dir / ms.FILE_NAME)
    assert two.status == ms.COMPLETED
    assert (two.mode, two.attrs[ms.WORLD_SIZE]) == ("serial", 2)
    np.testing.assert_allclose(two.train[ms.OBJECTIVE], one.train[ms.OBJECTIVE],
                               rtol=1e-10, atol=0)
    np.testing.assert_allclose(two.train[ms.LOSS], one.train[ms.LOSS], rtol=1e-10, atol=0)
    np.testing.assert_array_equal(two.train[ms.ACCURACY], one.train[ms.ACCURACY])
    np.testing.assert_array_equal(two.validation[ms.ACCURACY], one.validation[ms.ACCURACY])
    assert two.timing[ms.COMPUTE].shape == (ITERATIONS, 2)   # one column per rank
    # only rank 0 wrote: its log and Hydra's record, no per-rank files or error logs
    assert {p.name for p in run_dir.iterdir()} == {".hydra", "lptrain.log", ms.FILE_NAME,
                                                   *MODEL_FILES.values(), CHECKPOINT_FILE}
    assert {p.name for p in (run_dir / ".hydra").iterdir()} == {
        "config.yaml", "hydra.yaml", "overrides.yaml"}
    hydra_record = OmegaConf.load(run_dir / ".hydra" / "hydra.yaml")
    assert hydra_record.hydra.output_subdir == ".hydra"   # rank 0's, not rank 1's
    assert _error_lines(proc) == []


def test_multirun_sweeps_seeds(tmp_path):
    """In its default directory, -m after an override (the README's command; a review
    of the overrides' reordering found the default directory's key put after the flag,
    which Hydra refused)."""
    unseeded = [a for a in TINY if not a.startswith("seed=")]
    proc = _lptrain(["seed=1,2", "-m", *unseeded], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep, = tmp_path.glob("multirun/*/*")
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["0", "1"]
    metrics = [read_metrics(p / ms.FILE_NAME) for p in runs]
    assert [m.status for m in metrics] == [ms.COMPLETED, ms.COMPLETED]
    assert [m.attrs[ms.SEED] for m in metrics] == [1, 2]
    assert [m.n_iterations for m in metrics] == [ITERATIONS, ITERATIONS]
    objectives = [m.train[ms.OBJECTIVE] for m in metrics]
    assert all(math.isfinite(x) for o in objectives for x in o)
    assert not np.allclose(objectives[0], objectives[1])   # the seeds were applied
    # Hydra's job lines without its tab; a closing line names the best job, how to report
    best = min((o[-1], k) for k, o in enumerate(objectives))
    lines, sweep = proc.stdout.splitlines(), sweep.relative_to(tmp_path)   # as Hydra named it
    assert [ln.split("[HYDRA] ")[1] for ln in lines if "[HYDRA] #" in ln] == \
        [f"#{k} : seed={k + 1} " + " ".join(unseeded) for k in range(2)]
    assert lines[-1] == (f"lptrain: sweep of 2 jobs in {sweep}: 2 finished, 0 failed; "
                         f"lowest final objective {best[0]:.6g} (#{best[1]} "
                         f"seed={best[1] + 1}); plots and a table of all: "
                         f"`lptrain-report {sweep}`")


@pytest.mark.mpi
def test_bad_value_in_a_sweep_is_one_line_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = _lptrain(["-m", f"hydra.sweep.dir={sweep}", *TINY, "network.layers=4,0"],
                    cwd=tmp_path, ranks=2)
    _assert_one_error(proc, ["network.layers=0", "must be positive"])
    assert not list(sweep.glob(f"*/{ms.FILE_NAME}"))


def test_diverging_sgd_ends_diverged_with_the_last_good_model(tmp_path):
    run_dir = tmp_path / "run"
    proc = _lptrain([f"hydra.run.dir={run_dir}", *TINY, "optimizer=sgd", "optimizer.lr=1e6",
                     "train.iterations=20"], cwd=tmp_path)
    # README "Exit status": 1, the run started and could not finish
    _assert_one_error(proc, ["diverged: objective", "exceeds 1000 x the first"], FAILED)
    m = read_metrics(run_dir / ms.FILE_NAME)
    assert m.status == ms.DIVERGED and m.attrs[ms.ERROR].startswith("diverged: ")
    model = load_model(run_dir, "last")
    # SGD's objective of iteration k is that of the parameters after k - 1: those
    # diverged, so the last good ones are after k - 2 (README "Divergence")
    assert model.iteration == m.n_iterations - 2
    assert torch.isfinite(model.theta).all()
    best = load_model(run_dir)
    assert best.iteration < m.n_iterations and torch.isfinite(best.theta).all()


def test_version_names_lptrain_and_what_it_runs_on(tmp_path):
    from lptrain import __version__
    proc = lptrain(["--version"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith(f"lptrain {__version__} (torch {torch.__version__}"), line
    assert "hydra-core" in line and "Hydra" not in line.split("(")[0]
    assert list(tmp_path.iterdir()) == []          # informational: no run directory


def test_a_finished_run_exits_without_collecting_its_heap(tmp_path):
    """After the summary the process only exits: the interpreter's teardown would run the
    cyclic collector over every object of the run (a few hundred thousand; seconds on a
    loaded machine), so lptrain freezes them in its last exit handler. Checked by an
    exit handler of the caller's, which runs after lptrain's."""
    run_dir = tmp_path / "run"
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr))\n"
            "from lptrain.cli import main\n"
            f"sys.argv = ['lptrain', {str(f'hydra.run.dir={run_dir}')!r}, *{TINY!r}]\n"
            "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert read_metrics(run_dir / ms.FILE_NAME).status == ms.COMPLETED
    frozen = re.findall(r"^frozen (\d+)$", proc.stderr, re.M)
    assert frozen and int(frozen[0]) > 10000, proc.stderr
