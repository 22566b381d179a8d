"""MetricsWriter and read_metrics: round trips, padding, status, errors, killed writers."""
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from lptrain.errors import DivergedError
from lptrain.metrics import schema as s
from lptrain.metrics.reader import read_metrics
from lptrain.metrics.writer import MetricsWriter, NullWriter, open_writer

REPO = Path(__file__).resolve().parents[2]
ATTRS = {s.MODE: "simultaneous", s.WORLD_SIZE: 3, s.SEED: 7, s.CONFIG: "lr: 0.5\n"}


def _train_row(i):
    return dict(iteration=i, objective=1.0 / i, loss=0.5 / i, accuracy=0.1 * i,
                grad_norm=2.0 ** -i, step_size=0.25, step_time=0.01 * i, wall_time=0.5 * i,
                ls_trials=i % 3, lbfgs_skipped=i % 2, lbfgs_reset=int(i == 2),
                ls_failed=int(i == 2))


def test_round_trip_of_every_field(tmp_path):
    path = tmp_path / s.FILE_NAME
    with MetricsWriter(path, {**ATTRS, s.DATASET_SOURCE: "generated"}) as w:
        for i in (1, 2, 3):
            w.log_train(**_train_row(i))
            w.log_mgrit(iteration=i, fwd_iterations=2, fwd_residual=1e-3 * i,
                        adj_iterations=3, adj_residual=1e-4 * i, fwd_factor=0.1,
                        adj_factor=0.2, adaptive_extra=i - 1, rung=i % 2,
                        fwd_total=2 * i, adj_total=3 * i, fwd_history=[1.0, 1e-3 * i], adj_history=[1.0, 0.1, 1e-4 * i])
            w.log_timing(i, [1.0 * i, 2.0, 3.0], [0.1, 0.2, 0.3], [0.0, 0.5, 1.5 * i])
        w.log_validation(3, 0.4, 0.85)
    m = read_metrics(path)
    assert m.attrs[s.MODE] == "simultaneous" and m.attrs[s.WORLD_SIZE] == 3
    assert m.attrs[s.SEED] == 7 and m.attrs[s.CONFIG] == "lr: 0.5\n"
    assert m.attrs[s.DATASET_SOURCE] == "generated" and m.status == s.COMPLETED
    assert m.attrs[s.VERSION] == "0.1.0" and s.STARTED_AT in m.attrs
    for name in s.fields_of(s.TRAIN):
        expected = [_train_row(i)[name] for i in (1, 2, 3)]
        np.testing.assert_allclose(m.train[name], expected, rtol=0, err_msg=name)
    assert m.train[s.ITERATION].dtype == np.int64
    np.testing.assert_array_equal(m.validation[s.ACCURACY], [0.85])
    np.testing.assert_array_equal(m.validation[s.LOSS], [0.4])
    np.testing.assert_array_equal(m.mgrit["adaptive_extra"], [0, 1, 2])
    np.testing.assert_array_equal(m.mgrit["rung"], [1, 0, 1])
    np.testing.assert_array_equal(m.mgrit["fwd_total"], [2, 4, 6])
    np.testing.assert_allclose(m.mgrit[s.ADJ_RESIDUAL], [1e-4, 2e-4, 3e-4])
    np.testing.assert_allclose(m.mgrit[s.ADJ_HISTORY][2], [1.0, 0.1, 3e-4])
    assert m.timing[s.COMPUTE].shape == (3, 3)
    np.testing.assert_array_equal(m.timing[s.COMPUTE][:, 0], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(m.timing[s.WAITING][2], [0.0, 0.5, 4.5])
    # print(m) filled screens with every array (held-out, stop 64)
    assert repr(m) == (f"RunMetrics({str(path)!r}, simultaneous, completed, train 3 rows, "
                       f"validation 1 row, mgrit 3 rows, timing 3 rows)")


def test_every_dataset_with_a_unit_carries_it(tmp_path):
    """The units were only in docs/metrics.md: h5dump and xarray showed bare numbers."""
    path = tmp_path / s.FILE_NAME
    with MetricsWriter(path, ATTRS) as w:
        for i in (1, 2):
            w.log_train(**_train_row(i))
            w.log_timing(i, [1.0, 2.0, 3.0], [0.1, 0.2, 0.3], [0.0, 0.5, 1.5])
        w.log_validation(2, 0.4, 0.85)
    with h5py.File(path, "r") as f:
        seen = {(g, n): f[g][n].attrs.get(s.UNITS) for g in (s.TRAIN, s.VALIDATION, s.TIMING)
                for n in f[g]}
    expected = {(g, n): s.FIELDS[g][n].unit or None for g, n in seen}
    assert seen == expected
    assert seen[(s.TRAIN, "step_time")] == "s" and seen[(s.VALIDATION, s.ACCURACY)] == "fraction"


def test_left_out_fields_are_filled(tmp_path):
    with MetricsWriter(tmp_path / "m.h5", ATTRS) as w:
        w.log_train(iteration=1, loss=0.3, step_size=None)
    train = read_metrics(tmp_path / "m.h5").train
    assert train[s.LOSS][0] == 0.3
    assert math.isnan(train["step_size"][0]) and math.isnan(train[s.OBJECTIVE][0])
    assert train["ls_trials"][0] == -1 and train["lbfgs_reset"][0] == -1


def test_histories_are_nan_padded_and_grow(tmp_path):
    with MetricsWriter(tmp_path / "m.h5", ATTRS) as w:
        w.log_mgrit(iteration=1, fwd_history=[1.0, 0.5])
        w.log_mgrit(iteration=2, fwd_history=[1.0])
        w.log_mgrit(iteration=3, fwd_history=[8.0, 4.0, 2.0, 1.0])
        w.log_mgrit(iteration=4, fwd_history=[])
    h = read_metrics(tmp_path / "m.h5").mgrit[s.FWD_HISTORY]
    nan = np.nan
    np.testing.assert_array_equal(h, [[1.0, 0.5, nan, nan], [1.0, nan, nan, nan],
                                      [8.0, 4.0, 2.0, 1.0], [nan, nan, nan, nan]])


def test_history_defaults_iterations_residual_and_factor(tmp_path):
    with MetricsWriter(tmp_path / "m.h5", ATTRS) as w:
        w.log_mgrit(iteration=1, fwd_history=[1.0, 0.1, 0.01], adj_history=[5.0])
        w.log_mgrit(iteration=2, fwd_history=[1.0, 0.5], fwd_iterations=9)
    m = read_metrics(tmp_path / "m.h5").mgrit
    np.testing.assert_array_equal(m[s.FWD_ITERATIONS], [3, 9])  # given value wins
    np.testing.assert_allclose(m[s.FWD_RESIDUAL], [0.01, 0.5])
    np.testing.assert_allclose(m[s.FWD_FACTOR], [0.1, 0.5])
    assert m[s.ADJ_ITERATIONS][0] == 1 and math.isnan(m[s.ADJ_FACTOR][0])
    assert m[s.ADJ_ITERATIONS][1] == -1  # no adjoint solve recorded


def test_unknown_field_raises_key_error_naming_it(tmp_path):
    w = MetricsWriter(tmp_path / "m.h5", ATTRS)
    with pytest.raises(KeyError, match="lossy"):
        w.log_train(iteration=1, lossy=0.1)
    with pytest.raises(KeyError, match="fwd_hist"):
        w.log_mgrit(iteration=1, fwd_hist=[1.0])
    with pytest.raises(KeyError, match="colour"):
        w.set_attr("colour", "red")
    with pytest.raises(KeyError, match="iteration"):
        w.log_train(loss=0.1)
    w.close()
    assert read_metrics(tmp_path / "m.h5").train == {}  # nothing half-written


def test_missing_required_attribute(tmp_path):
    with pytest.raises(KeyError, match="world_size"):
        MetricsWriter(tmp_path / "m.h5", {s.MODE: "serial", s.SEED: 0, s.CONFIG: ""})
    with pytest.raises(KeyError, match="seed"):
        MetricsWriter(tmp_path / "m.h5", {**ATTRS, s.SEED: None})
    with pytest.raises(ValueError):
        MetricsWriter(tmp_path / "m.h5", {**ATTRS, s.WORLD_SIZE: "four"})
    assert not (tmp_path / "m.h5").exists()
    with MetricsWriter(tmp_path / "m.h5", {**ATTRS, s.DATASET_SOURCE: None}):
        pass
    assert s.DATASET_SOURCE not in read_metrics(tmp_path / "m.h5").attrs


def test_timing_lists_must_agree(tmp_path):
    with MetricsWriter(tmp_path / "m.h5", ATTRS) as w:
        with pytest.raises(ValueError, match="equal length"):
            w.log_timing(1, [1.0, 2.0], [1.0], [1.0, 2.0])
        w.log_timing(1, [1.0] * 3, [1.0] * 3, [1.0] * 3)
        with pytest.raises(ValueError, match="got 2 ranks, the run has 3"):
            w.log_timing(2, [1.0, 2.0], [1.0, 1.0], [1.0, 2.0])


def test_unwritable_path_names_the_path(tmp_path):
    path = tmp_path / "no_such_dir" / "metrics.h5"
    with pytest.raises(OSError, match="no_such_dir") as info:
        MetricsWriter(path, ATTRS)
    assert isinstance(info.value, s.MetricsFileError)
    with pytest.raises(s.MetricsFileError, match="cannot create"):
        MetricsWriter(tmp_path, ATTRS)  # a directory, not a file


def _status_after(tmp_path, exc):
    path = tmp_path / "m.h5"
    with pytest.raises(type(exc)):
        with MetricsWriter(path, ATTRS) as w:
            w.log_train(iteration=1, loss=1.0)
            raise exc
    return read_metrics(path)


def test_context_manager_records_failed_with_error(tmp_path):
    m = _status_after(tmp_path, ValueError("bad lr 5"))
    assert m.status == s.FAILED and m.attrs[s.ERROR] == "ValueError: bad lr 5"
    assert m.train[s.LOSS].tolist() == [1.0]


def test_context_manager_records_interrupted(tmp_path):
    from lptrain.errors import Interrupted
    m = _status_after(tmp_path, Interrupted(2, 1))          # SIGINT after iteration 1
    assert m.status == s.INTERRUPTED and "SIGINT" in m.attrs[s.ERROR]


def test_a_keyboard_interrupt_of_a_users_code_is_a_failure(tmp_path):
    """lptrain's own signal handling never raises KeyboardInterrupt: one from a user's
    step was recorded as 'interrupted', and its resume blamed a checkpoint 'moved or
    deleted' that was never written (held-out)."""
    m = _status_after(tmp_path, KeyboardInterrupt())
    assert m.status == s.FAILED and m.attrs[s.ERROR] == "KeyboardInterrupt"
    (tmp_path / "b").mkdir()
    m = _status_after(tmp_path / "b", RuntimeError("path /tmp/x y:  "))   # kept as raised
    assert m.attrs[s.ERROR] == "RuntimeError: path /tmp/x y:  "


def test_context_manager_records_diverged(tmp_path):
    m = _status_after(tmp_path, DivergedError("objective=nan at iteration 4"))
    assert m.status == s.DIVERGED and "iteration 4" in m.attrs[s.ERROR]


def test_status_is_running_until_closed(tmp_path):
    path = tmp_path / "m.h5"
    w = MetricsWriter(path, ATTRS)
    w.log_train(iteration=1, loss=1.0)
    assert read_metrics(path).status == s.RUNNING  # readable while the writer is open
    w.close(s.DIVERGED, error="nan")
    w.close(s.COMPLETED)  # second close does nothing
    m = read_metrics(path)
    assert m.status == s.DIVERGED and m.attrs[s.ERROR] == "nan"
    with pytest.raises(RuntimeError, match="closed"):
        w.log_train(iteration=2)


def test_invalid_final_status(tmp_path):
    w = MetricsWriter(tmp_path / "m.h5", ATTRS)
    with pytest.raises(ValueError, match="running"):
        w.close(s.RUNNING)
    w.set_attr(s.DATASET_SOURCE, "peaks")
    w.close()
    assert read_metrics(tmp_path / "m.h5").attrs[s.DATASET_SOURCE] == "peaks"


def test_null_writer_accepts_every_call(tmp_path):
    w = open_writer(tmp_path / "m.h5", ATTRS, enabled=False)
    assert isinstance(w, NullWriter)
    with w:
        w.log_train(iteration=1, loss=0.1)
        w.log_validation(1, 0.1, 0.5)
        w.log_mgrit(iteration=1, fwd_history=[1.0])
        w.log_timing(1, [1.0], [1.0], [1.0])
        w.set_attr(s.ERROR, "x")
    assert not (tmp_path / "m.h5").exists()
    assert isinstance(open_writer(tmp_path / "m.h5", ATTRS, enabled=True), MetricsWriter)


_LOOP = """
import sys
from lptrain.metrics.writer import MetricsWriter
w = MetricsWriter(sys.argv[1], {"mode": "serial", "world_size": 1, "seed": 0, "config": ""})
i = 0
while True:
    i += 1
    w.log_train(iteration=i, loss=1.0 / i)
    w.log_mgrit(iteration=i, fwd_history=[1.0] * (1 + i % 5))
    print(i, flush=True)
"""


def test_rows_survive_sigkill(tmp_path):
    path = tmp_path / "m.h5"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _LOOP, str(path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        done = 0
        while done < 30:
            line = proc.stdout.readline()
            assert line, "writer subprocess exited early"
            done = int(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    m = read_metrics(path)
    assert m.status == s.RUNNING
    n = m.n_iterations
    assert n >= 30
    np.testing.assert_array_equal(m.train[s.ITERATION], np.arange(1, n + 1))
    np.testing.assert_allclose(m.train[s.LOSS], 1.0 / np.arange(1, n + 1))
    assert len(m.mgrit[s.FWD_HISTORY]) >= 30


def test_reader_truncates_a_half_written_row(tmp_path):
    path = tmp_path / "m.h5"
    with MetricsWriter(path, ATTRS) as w:
        for i in (1, 2):
            w.log_train(iteration=i, loss=0.1 * i)
    with h5py.File(path, "a") as f:  # mimic a writer killed in the middle of row 3
        f[s.TRAIN][s.ITERATION].resize((3,))
        f[s.TRAIN][s.ITERATION][2] = 3
    m = read_metrics(path)
    assert {len(a) for a in m.train.values()} == {2}
    np.testing.assert_array_equal(m.train[s.ITERATION], [1, 2])
    with h5py.File(path, "a") as f:  # every dataset resized, `iteration` not yet written
        for ds in f[s.TRAIN].values():
            ds.resize((3,))
        f[s.TRAIN][s.ITERATION][2] = -1
        f[s.TRAIN][s.LOSS][2] = 0.3
    assert read_metrics(path).train[s.LOSS].tolist() == [0.1, 0.2]


def test_reader_errors_name_the_path(tmp_path):
    with pytest.raises(s.MetricsFileError, match="absent.h5"):
        read_metrics(tmp_path / "absent.h5")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not an hdf5 file at all" * 10)
    with pytest.raises(s.MetricsFileError, match="junk.h5"):
        read_metrics(junk)
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = [1, 2]
    with pytest.raises(s.MetricsFileError, match="not an lptrain metrics file"):
        read_metrics(foreign)


def test_unused_groups_read_as_empty(tmp_path):
    with MetricsWriter(tmp_path / "m.h5", {**ATTRS, s.MODE: "serial"}) as w:
        w.log_train(iteration=1, loss=1.0)
    m = read_metrics(tmp_path / "m.h5")
    assert m.mgrit == {} and m.timing == {} and m.validation == {}
    assert m.group(s.TRAIN) is m.train and m.mode == "serial"
    with pytest.raises(KeyError, match="tran"):
        m.group("tran")


def _timing(w, iterations, ranks):
    for i in iterations:
        w.log_train(iteration=i, objective=1.0 / i)
        w.log_timing(i, [float(i)] * ranks, [0.1] * ranks, [0.0] * ranks)


def test_a_resume_on_another_grid_keeps_each_rows_grid(tmp_path):
    """2 ranks (2x1), resumed on 3 (1x3) after iteration 2, then on 1 after iteration 3:
    every timing row says who computed it; the root attributes are the latest start's
    (the configuration was the first start's: its train.iterations, its grid)."""
    path = tmp_path / s.FILE_NAME
    first = {**ATTRS, s.WORLD_SIZE: 2, s.LAYER_RANKS: 2, s.DATA_RANKS: 1,
             s.CONFIG: "train:\n  iterations: 3\n"}
    with MetricsWriter(path, first) as w:
        _timing(w, [1, 2, 3], 2)                # row 3 is dropped by the resume after 2
    with open_writer(path, {**first, s.WORLD_SIZE: 3, s.LAYER_RANKS: 1, s.DATA_RANKS: 3},
                     True, 2) as w:
        _timing(w, [3], 3)
    with open_writer(path, {**first, s.WORLD_SIZE: 1, s.LAYER_RANKS: 1, s.DATA_RANKS: 1,
                            s.CONFIG: "train:\n  iterations: 4\n"}, True, 3) as w:
        _timing(w, [4], 1)
    m = read_metrics(path)
    assert (m.attrs[s.WORLD_SIZE], m.attrs[s.LAYER_RANKS], m.attrs[s.DATA_RANKS]) == (1, 1, 1)
    assert m.attrs[s.CONFIG] == "train:\n  iterations: 4\n"
    np.testing.assert_array_equal(m.timing[s.ITERATION], [1, 2, 3, 4])
    np.testing.assert_array_equal(m.timing[s.WORLD_SIZE], [2, 2, 3, 1])
    np.testing.assert_array_equal(m.timing[s.LAYER_RANKS], [2, 2, 1, 1])
    np.testing.assert_array_equal(m.timing[s.DATA_RANKS], [1, 1, 3, 1])
    nan = np.nan
    np.testing.assert_array_equal(m.timing[s.COMPUTE],
                                  [[1, 1, nan], [2, 2, nan], [3, 3, 3], [4, nan, nan]])
    np.testing.assert_array_equal(m.train[s.ITERATION], [1, 2, 3, 4])


def test_a_file_without_grid_columns_gets_them_from_its_root_attributes(tmp_path):
    """A file written before timing/ had grid columns (fixed width): its rows get the
    root's grid; rows on fewer ranks are NaN-padded, rows on more are left out."""
    path = tmp_path / s.FILE_NAME
    with h5py.File(path, "w") as f:
        for name, value in {**ATTRS, s.WORLD_SIZE: 2, s.STATUS: s.INTERRUPTED}.items():
            f.attrs[name] = value
        g = f.create_group(s.TIMING)
        g.create_dataset(s.ITERATION, data=[1, 2], maxshape=(None,))
        for name in s.PER_RANK:
            g.create_dataset(name, data=np.ones((2, 2)), maxshape=(None, 2))
    with open_writer(path, {**ATTRS, s.WORLD_SIZE: 1}, True, 2) as w:
        _timing(w, [3], 1)
    with open_writer(path, {**ATTRS, s.WORLD_SIZE: 3}, True, 3) as w:
        _timing(w, [4], 3)
    m = read_metrics(path)
    np.testing.assert_array_equal(m.timing[s.WORLD_SIZE], [2, 2, 1])
    np.testing.assert_array_equal(m.timing[s.LAYER_RANKS], [-1, -1, -1])
    np.testing.assert_array_equal(m.timing[s.COMPUTE], [[1, 1], [1, 1], [3, np.nan]])
    assert m.attrs[s.WORLD_SIZE] == 3 and m.n_iterations == 2    # train/: iterations 3, 4


def test_a_file_of_an_earlier_version_gets_its_missing_columns_on_resume(tmp_path):
    """mgrit/unconverged is newer than some runs' files: reopened, the column was made
    empty and took this start's rows, so the reader (every column cut to the shortest)
    dropped this start's mgrit rows and paired the earlier ones with its values."""
    path = tmp_path / s.FILE_NAME
    with open_writer(path, ATTRS, True) as w:
        for k in (1, 2, 3):
            w.log_mgrit(iteration=k, fwd_iterations=2, unconverged=0)
    with h5py.File(path, "a") as f:
        del f[s.MGRIT]["unconverged"]                     # as an older version wrote it
    with open_writer(path, ATTRS, True, resume_after=2) as w:
        for k in (3, 4):
            w.log_mgrit(iteration=k, fwd_iterations=3, unconverged=1)
    m = read_metrics(path).mgrit
    np.testing.assert_array_equal(m[s.ITERATION], [1, 2, 3, 4])
    np.testing.assert_array_equal(m["unconverged"], [-1, -1, 1, 1])    # -1: not recorded
    np.testing.assert_array_equal(m[s.FWD_ITERATIONS], [2, 2, 3, 3])


def test_a_file_removed_during_the_run_is_said_in_words_on_resume(tmp_path):
    """Was `cannot reopen metrics file ([Errno 2] Unable to synchronously open file
    (unable to open file: name = ..., flags = 1, o_flags = 2))`: HDF5's text, no next step."""
    with pytest.raises(s.MetricsInputError, match=re.escape(
            f"{tmp_path / s.FILE_NAME}: gone (removed after the run began?), so the run's "
            f"record is lost and it cannot be resumed; move the directory away")) as err:
        MetricsWriter.reopen(tmp_path / s.FILE_NAME, 3, ATTRS)
    assert err.value.exit_code == 2


def test_a_file_damaged_inside_is_refused_in_one_line_on_resume(tmp_path):
    """Random bytes inside a metrics file that still reads as HDF5: its resume ended in
    h5py's RuntimeError (or KeyError, AttributeError on a damaged link) with a traceback
    and exit 1; README "Malformed inputs": one line naming the file, exit 2."""
    import shutil
    src = tmp_path / "src.h5"
    with open_writer(src, ATTRS, True) as w:
        for k in range(1, 6):
            w.log_train(iteration=k, objective=1.0 / k, loss=0.5)
            w.log_mgrit(iteration=k, fwd_iterations=2)
    rng, damaged = np.random.default_rng(0), 0
    for offset in range(0, src.stat().st_size, 512):
        path = tmp_path / s.FILE_NAME
        shutil.copy(src, path)
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(rng.integers(0, 256, 64, dtype=np.uint8).tobytes())
        try:
            MetricsWriter.reopen(path, 3, ATTRS).close()
        except s.MetricsInputError as exc:
            assert str(exc).startswith(f"{path}: ") and "\n" not in str(exc)
            assert exc.exit_code == 2
            damaged += "(damaged: " in str(exc)
    assert damaged >= 5


def test_a_file_this_process_has_open_in_h5py_is_read(tmp_path):
    """A notebook's `h5py.File(path)` (locked, h5py's default) made read_metrics call the
    file 'unreadable' (HDF5: 'file locking flag values don't match'; held-out)."""
    import h5py
    from helpers import fake_run
    path = fake_run(tmp_path / "run", "serial", 0.4)
    for locking in (None, True):       # h5py's default; its option given (another text)
        with h5py.File(path, "r", locking=locking):
            assert read_metrics(path).n_iterations > 0


def test_a_run_directory_reads_as_its_file(tmp_path):
    """read_metrics(run_dir) said 'no such metrics file', while its own message for a
    file that is not HDF5 says to give a run's directory (held-out)."""
    from helpers import fake_run
    path = fake_run(tmp_path / "run", "serial", 0.4)
    assert read_metrics(tmp_path / "run").n_iterations == read_metrics(path).n_iterations
    with pytest.raises(s.MetricsInputError, match="empty/metrics.h5: no such metrics file"):
        (tmp_path / "empty").mkdir()
        read_metrics(tmp_path / "empty")


def test_a_checkpoint_beyond_the_files_rows_is_refused_on_resume(tmp_path):
    """A checkpoint of iteration 120 copied into a run whose metrics.h5 ends at 18 was
    resumed with exit 0, leaving iterations 19-120 out of the file; each row is flushed
    before its iteration's checkpoint, so the file never ends before its own checkpoint."""
    path = tmp_path / s.FILE_NAME
    with open_writer(path, ATTRS, True) as w:
        for k in range(1, 4):
            w.log_train(iteration=k, objective=1.0 / k, loss=0.5)
    before = path.read_bytes()
    with pytest.raises(s.MetricsInputError, match=re.escape(
            f"{path}: its rows end at iteration 3, the checkpoint is of iteration 5: not "
            f"this file's checkpoint (copied in from another start?)")) as err:
        MetricsWriter.reopen(path, 5, ATTRS)
    assert err.value.exit_code == 2 and path.read_bytes() == before
    MetricsWriter.reopen(path, 3, ATTRS).close()
