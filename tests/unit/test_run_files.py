"""Faults around the run's files: a full disk or failing writes of metrics.h5, the run
directory lock, unique default directories, and never writing over an earlier run."""
import errno
import os
import socket
import subprocess
import sys

import numpy as np
import h5py
import pytest

from lptrain.errors import FAILED, REFUSED, RunDirectoryBusy, RunFileError, launch_words
from lptrain.metrics import schema as s
from lptrain.metrics import writer as w
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import write_atomically
from lptrain.rundir import (LOCK_FILE, RunLock, claim_new, dir_override, dir_value,
                            refuse_earlier_run, refuse_inside_live_run)

ATTRS = {s.MODE: "serial", s.WORLD_SIZE: 1, s.SEED: 0, s.CONFIG: "x: 1\n"}


def _rows(writer, first, last):
    for i in range(first, last + 1):
        writer.log_train(iteration=i, objective=1.0 / i, loss=0.5)


def test_nearly_full_disk_stops_writing_with_status_failed(tmp_path, monkeypatch):
    path = tmp_path / s.FILE_NAME
    writer = w.MetricsWriter(path, ATTRS)
    _rows(writer, 1, 3)
    monkeypatch.setattr(w, "free_bytes", lambda d: w.RESERVE_BYTES - 1)
    # iteration 4 finds the reserve reached: its rows still go in, from the reserve (so
    # that the checkpoint of iteration 4 and the file agree); iteration 5 is refused
    writer.log_train(iteration=4, objective=0.25, loss=0.5)
    writer.log_validation(iteration=4, loss=0.5, accuracy=0.75)
    assert isinstance(writer.failure, s.MetricsFileError)
    assert str(path) in str(writer.failure) and "bytes left free" in str(writer.failure)
    _rows(writer, 5, 5)                       # refused before HDF5 sees a full disk
    writer.set_attr(s.DATASET_SOURCE, "x")        # later calls do nothing, close keeps `failed`
    writer.close(s.COMPLETED)
    m = read_metrics(path)
    assert m.status == s.FAILED and m.attrs[s.ERROR] == str(writer.failure)
    np.testing.assert_array_equal(m.train[s.ITERATION], [1, 2, 3, 4])
    np.testing.assert_array_equal(m.validation[s.ITERATION], [4])


def test_the_reserve_iteration_closes_failed_however_the_run_ends(tmp_path, monkeypatch):
    path = tmp_path / s.FILE_NAME
    writer = w.MetricsWriter(path, ATTRS)
    _rows(writer, 1, 2)
    monkeypatch.setattr(w, "free_bytes", lambda d: 10)
    _rows(writer, 3, 3)
    writer.close(s.COMPLETED)         # the loop's error, or none: the file says `failed`
    m = read_metrics(path)
    assert m.status == s.FAILED and "only 10 bytes left free" in m.attrs[s.ERROR]
    np.testing.assert_array_equal(m.train[s.ITERATION], [1, 2, 3])


def test_a_failing_write_is_recorded_not_raised(tmp_path, monkeypatch):
    path = tmp_path / s.FILE_NAME
    writer = w.MetricsWriter(path, ATTRS)
    _rows(writer, 1, 2)

    def broken(*args):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(w, "_append_scalar", broken)
    _rows(writer, 3, 3)
    assert "Input/output error" in str(writer.failure) and str(path) in str(writer.failure)
    monkeypatch.undo()
    m = read_metrics(path)
    assert m.status == s.FAILED
    np.testing.assert_array_equal(m.train[s.ITERATION], [1, 2])


_UNWRITABLE = r"""
import os, sys
from lptrain.metrics import schema as s
from lptrain.metrics import writer as w
from lptrain.metrics.h5_faults import descriptor
writer = w.MetricsWriter(sys.argv[1], {s.MODE: "serial", s.WORLD_SIZE: 1, s.SEED: 0,
                                       s.CONFIG: "x: 1\n"})
for i in (1, 2):
    writer.log_train(iteration=i, objective=1.0 / i, loss=0.5)
# every later write of HDF5's fails, as on a file made immutable during the run
os.dup2(os.open(sys.argv[1], os.O_RDONLY), descriptor(writer._file))
writer.log_train(iteration=3, objective=0.3, loss=0.5)
writer.close(s.COMPLETED)
print(writer.rows_lost, writer.failure, sep="\n")
"""


def test_a_file_that_cannot_be_written_ends_in_one_line_without_a_crash(tmp_path):
    """A metrics.h5 whose writes fail (not for space): the error was HDF5's text of
    several lines, and the process crashed at its exit (status 139, HDF5 closing a file
    it could not flush) after lptrain's own error line."""
    path = tmp_path / s.FILE_NAME
    env = {**os.environ, "PYTHONPATH": str(w.Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", _UNWRITABLE, str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lost, failure = done.stdout.splitlines()
    assert lost == "True"
    assert failure == f"{path}: cannot write (Bad file descriptor)"
    m = read_metrics(path)             # as last flushed: status running, rows 1 and 2
    assert m.status == s.RUNNING
    np.testing.assert_array_equal(m.train[s.ITERATION], [1, 2])


def test_a_final_status_that_cannot_be_written_is_one_error(tmp_path):
    """close() wrote the final status unguarded: HDF5's text of several lines reached
    the console as an unexpected RuntimeError. Now it is the writer's one-line failure
    (and a run's own error, in flight at the close, stays the one raised)."""
    from lptrain.metrics.h5_faults import descriptor
    for raised in (None, ValueError("the run's own")):
        path = tmp_path / f"{raised is None}.h5"
        writer = w.MetricsWriter(path, ATTRS)
        _rows(writer, 1, 2)
        os.dup2(os.open(path, os.O_RDONLY), descriptor(writer._file))
        with pytest.raises(type(raised) if raised else s.MetricsFileError) as err:
            with writer:
                if raised:
                    raise raised
        assert str(err.value) == (str(raised) if raised else
                                  f"{path}: cannot write (Bad file descriptor)")
        m = read_metrics(path)           # as last flushed
        assert m.status == s.RUNNING
        np.testing.assert_array_equal(m.train[s.ITERATION], [1, 2])


def test_an_hdf5_write_error_is_said_by_its_system_reason():
    from lptrain.metrics.h5_faults import write_failure
    hdf5 = RuntimeError("Can't flush cache (file write failed: time = Sun Dec  6 2026\n, "
                        "filename = 'm.h5', errno = 1, error message = 'Operation not "
                        "permitted', buf = 0x55)")
    assert write_failure(hdf5) == "Operation not permitted"
    assert write_failure(OSError(errno.EIO, "Input/output error")) == "Input/output error"
    assert write_failure(RuntimeError("first\nlast")) == "first ... last"


def test_no_space_at_creation_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setattr(w, "free_bytes", lambda d: 10)
    with pytest.raises(s.MetricsFileError, match="only 10 bytes free"):
        w.MetricsWriter(tmp_path / s.FILE_NAME, ATTRS)


def test_an_earlier_metrics_file_is_never_truncated(tmp_path):
    path = tmp_path / s.FILE_NAME
    with w.MetricsWriter(path, ATTRS) as first:
        _rows(first, 1, 4)
    with pytest.raises(s.MetricsFileError, match="exists"):
        w.MetricsWriter(path, ATTRS)
    assert read_metrics(path).n_iterations == 4
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(RunFileError, match=r"`lptrain resume="):
        refuse_earlier_run(tmp_path, "hydra.run.dir")
    with pytest.raises(RunFileError, match=r"`mpiexec -n 2 lptrain resume="):   # as launched
        refuse_earlier_run(tmp_path, "hydra.run.dir", 2)
    refuse_earlier_run(tmp_path / "empty", "hydra.run.dir")   # nothing there: fine


def _executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_resume_line_names_the_commands_this_run_was_started_with(tmp_path):
    """A system `mpiexec` of another MPI ahead on PATH cannot launch the environment's
    ranks, and an `lptrain` off PATH is not found: the printed resume names their files
    then; where PATH finds those very files, the bare words."""
    env = tmp_path / "env"
    ours = _executable(env / "bin" / "mpiexec")
    prog = _executable(env / "bin" / "lptrain")
    other = _executable(tmp_path / "usr" / "bin" / "mpiexec")
    python = _executable(env / "bin" / "python")
    on_path = str(env / "bin")
    assert launch_words(str(prog), on_path, str(env), str(python)) == ("mpiexec", "lptrain")
    elsewhere = os.pathsep.join([str(other.parent), on_path])
    assert launch_words(str(prog), elsewhere, str(env), str(python)) == (str(ours), "lptrain")
    assert launch_words(str(prog), "", str(env), str(python)) == (str(ours), str(prog))
    assert launch_words(str(tmp_path / "lptrain" / "__main__.py"), "", str(env),
                        str(python)) == (str(ours), f"{python} -m lptrain")
    assert launch_words(str(tmp_path / "lptrain" / "__main__.py"), on_path, str(env),
                        str(python)) == ("mpiexec", "python -m lptrain")
    # no MPI of its own in the environment: the launcher the user has
    assert launch_words(str(prog), "", str(tmp_path / "none"), str(python))[0] == "mpiexec"
    # a base python on PATH that the environment's links to has no lptrain (review)
    base = _executable(tmp_path / "base" / "python3")
    python.unlink()
    python.symlink_to(base)
    (tmp_path / "usr" / "bin" / "python").symlink_to(base)
    assert launch_words(str(tmp_path / "lptrain" / "__main__.py"), str(other.parent),
                        str(env), str(python))[1] == f"{python} -m lptrain"
    spaced = _executable(tmp_path / "my env" / "bin" / "lptrain")
    assert launch_words(str(spaced), "", str(env), str(python))[1] == f"'{spaced}'"


def test_an_earlier_run_without_a_checkpoint_is_not_offered_a_resume(tmp_path):
    """A run killed before its first checkpoint: its resume says there is nothing to
    resume, and a fresh run in its directory said to resume it instead."""
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("[]\n")
    with w.MetricsWriter(tmp_path / s.FILE_NAME, ATTRS) as first:
        _rows(first, 1, 4)
    with pytest.raises(RunFileError) as err:
        refuse_earlier_run(tmp_path, "hydra.run.dir")
    text = str(err.value)
    assert "resume=" not in text and "cannot be resumed" in text, text
    assert "move its metrics.h5 away to run there again" in text


def test_sweep_with_an_earlier_job_is_refused(tmp_path):
    """An Optuna sweep (no multirun.yaml) run again into its directory was told to
    `resume=` one completed job, which continues nothing (held-out check)."""
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / s.FILE_NAME).write_bytes(b"")
    (tmp_path / "3" / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(RunFileError, match="hydra.sweep.dir") as err:
        refuse_earlier_run(tmp_path, "hydra.sweep.dir")
    assert str(err.value) == (
        f"hydra.sweep.dir={tmp_path}: holds an earlier sweep's jobs ({tmp_path}/3/"
        f"metrics.h5); choose another directory (a study kept in the sweeper's storage "
        f"carries on in the new one)")
    (tmp_path / "4").mkdir()
    with w.MetricsWriter(tmp_path / "4" / s.FILE_NAME, ATTRS) as stopped:
        _rows(stopped, 1, 2)
    with h5py.File(tmp_path / "4" / s.FILE_NAME, "a") as f:     # stopped by Ctrl-C
        f.attrs[s.STATUS] = s.INTERRUPTED
    (tmp_path / "4" / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(RunFileError) as err:
        refuse_earlier_run(tmp_path, "hydra.sweep.dir")
    assert str(err.value).endswith(
        f"carries on in the new one), or resume its stopped job 4 alone with `lptrain "
        f"resume={tmp_path}/4`")
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")    # Hydra's basic sweeper
    with pytest.raises(RunFileError, match=r"continue that sweep with `lptrain resume="):
        refuse_earlier_run(tmp_path, "hydra.sweep.dir")


def test_default_directories_never_collide(tmp_path):
    base = tmp_path / "outputs" / "12-00-00"
    made = [claim_new(base) for _ in range(3)]
    assert [p.name for p in made] == ["12-00-00", "12-00-00-1", "12-00-00-2"]
    assert all(p.is_dir() for p in made)


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_lock_names_its_owner_and_takes_over_a_stale_one(tmp_path):
    lock = RunLock(tmp_path).acquire()
    assert (tmp_path / LOCK_FILE).read_text().split()[:2] == [socket.gethostname(),
                                                               str(os.getpid())]
    (tmp_path / LOCK_FILE).write_text("elsewhere.example 12345\n")   # cannot be checked
    with pytest.raises(RunDirectoryBusy, match=r"process 12345 on elsewhere.example"):
        RunLock(tmp_path).acquire()
    (tmp_path / LOCK_FILE).write_text(f"{socket.gethostname()} {_dead_pid()}\n")
    second = RunLock(tmp_path).acquire()       # stale: its owner is gone
    lock.release()                             # no longer the owner: leaves it
    assert (tmp_path / LOCK_FILE).exists()
    second.release()
    assert not (tmp_path / LOCK_FILE).exists()
    assert not list(tmp_path.glob(f"{LOCK_FILE}.*"))       # no temporary left behind


def test_lock_of_a_live_lptrain_process_on_this_host_is_honoured(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "print(1, flush=True); input()",
                             "lptrain"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()                 # running, its command line names lptrain
        (tmp_path / LOCK_FILE).write_text(f"{socket.gethostname()} {proc.pid}\n")
        with pytest.raises(RunDirectoryBusy, match=str(proc.pid)):
            RunLock(tmp_path).acquire()
    finally:
        proc.kill()
        proc.wait()
    RunLock(tmp_path).acquire().release()     # gone now: stale


@pytest.mark.parametrize("key, then", [("hydra.run.dir", "choose a folder outside it"),
                                       ("resume", "stop that sweep first")])
def test_a_run_inside_the_folder_of_a_live_sweep_is_refused(tmp_path, capsys, monkeypatch,
                                                            key, then):
    """A run started into a running sweep's folder went ahead: the sweep's later job
    there rewrote its .hydra/ and failed, and a resume of a job the sweep was running
    wrote one metrics.h5 from two processes."""
    from lptrain import cli
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("{}\n")
    (sweep / LOCK_FILE).write_text("elsewhere.example 12345\n")   # taken as alive
    with pytest.raises(RunDirectoryBusy) as refused:
        refuse_inside_live_run(sweep / "0", key)
    assert str(refused.value) == (
        f"{key}={sweep / '0'}: inside {sweep.resolve()}, the directory of a sweep the "
        f"lptrain process 12345 on elsewhere.example is running; {then} (lock file "
        f"{sweep.resolve() / LOCK_FILE}; delete it if that sweep is gone)")
    if key == "hydra.run.dir":
        assert cli._lead([f"hydra.run.dir={sweep / '0'}", "train.iterations=1"], 1) == \
            REFUSED
        assert "the lptrain process 12345" in capsys.readouterr().err
        assert sorted(p.name for p in sweep.iterdir()) == [LOCK_FILE, "multirun.yaml"]
        # a default folder below it, made for the run, is not left behind
        monkeypatch.chdir(sweep)
        assert cli._lead(["train.iterations=1"], 1) == REFUSED
        assert sorted(p.name for p in sweep.iterdir()) == [LOCK_FILE, "multirun.yaml"]
    (sweep / LOCK_FILE).write_text(f"{socket.gethostname()} {os.getpid()}\n")
    refuse_inside_live_run(sweep / "0", key)          # this process's own sweep's job
    from lptrain import rundir
    (sweep / LOCK_FILE).write_text(f"{socket.gethostname()} 12345\n")
    monkeypatch.setattr(rundir, "_owner_alive", lambda host, pid: False)
    refuse_inside_live_run(sweep / "0", key)          # its owner is gone: allowed


def test_atomic_write_failure_names_the_path_and_leaves_nothing(tmp_path):
    target = tmp_path / "missing_dir" / "model.pt"
    with pytest.raises(RunFileError, match="missing_dir/model.pt: cannot write"):
        write_atomically(target, b"data")
    target = tmp_path / "model.pt"
    write_atomically(target, b"old")
    write_atomically(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def _earlier_run(run):
    run.mkdir()
    (run / s.FILE_NAME).write_bytes(b"")


def _lock_cannot_be_written(run):
    run.mkdir()
    (run / f"{LOCK_FILE}.{os.getpid()}").mkdir()      # where the lock is written first


@pytest.mark.parametrize("prepare, status, message", [
    (_earlier_run, REFUSED, "holds an earlier run"),
    (_lock_cannot_be_written, FAILED, "cannot create the run lock (Is a directory)"),
])
def test_before_hydra_starts_each_error_exits_with_its_status(tmp_path, capsys, prepare,
                                                               status, message):
    """README "Exit status": a refusal exits 2, a fault of the machine 1 (each error
    type's status; before Hydra started every error exited 2)."""
    from lptrain import cli
    run = tmp_path / "run"
    prepare(run)
    assert cli._lead([f"hydra.run.dir={run}", "train.iterations=1"], 1) == status
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: ") and message in lines[0]


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_a_directory_hydra_cannot_parse_is_refused_before_it_is_made(tmp_path, capsys, key):
    """hydra.run.dir=.../a=b: lptrain made the directory, then Hydra printed its three
    lines and exited 1; now one line with the quoted form, exit 2, nothing made."""
    from lptrain import cli
    run = tmp_path / "a=b'c"
    args = [f"{key}={run}", "train.iterations=1", *(["-m"] if "sweep" in key else [])]
    assert cli._lead(args, 1) == REFUSED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"lptrain: error: {key}={run}: ")
    quoted = lines[0].rsplit("goes in quotes: ", 1)[1]
    assert quoted == dir_override(key, run) and not run.exists()


@pytest.mark.parametrize("args", [["dataset=mnist", "optimizer.gtol=1e-9", "--cfg", "job"],
                                  ["--cfg", "job", "optimizer.lr=0.1"]])
def test_a_bad_override_beside_an_informational_flag_is_refused_in_one_line(capsys, args):
    """`lptrain ... --cfg job` with a key the optimizer lacks printed Hydra's five lines
    (ending in HYDRA_FULL_ERROR) and exited 1; a run's command says it in one, exit 2."""
    from lptrain import cli
    assert cli._lead(args, 1) == REFUSED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: optimizer."), lines


@pytest.mark.parametrize("args", [["--cfg", "job", "-m", "seed=1,2"], ["--info", "-m"],
                                  ["--cfg", "job", "hydra.mode=MULTIRUN"]])
def test_an_informational_flag_with_a_sweep_is_refused_in_one_line(capsys, args):
    """`lptrain --cfg job -m seed=1,2` ended in Hydra's 20-line traceback (only one of
    --run, --multirun, --cfg, --info ...), exit 1; hydra.mode=MULTIRUN was named -m."""
    from lptrain import cli
    assert cli._lead(args, 1) == REFUSED
    word = "-m" if "-m" in args else "hydra.mode=MULTIRUN"
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"lptrain: error: {word}: --cfg, --info and --hydra-help show one "
                     f"configuration, not a sweep's; drop {word} (and give one value "
                     f"per key)"]


@pytest.mark.parametrize("word", ["-m", "--multirun", "hydra.mode=MULTIRUN"])
def test_a_sweep_switch_beside_resume_says_resume_carries_on_sweeps(capsys, tmp_path, word):
    """`lptrain -m resume=SWEEP` said "-m: with resume= only train.iterations, ... can
    be given", as if -m were a key of the run's configuration."""
    from lptrain import cli
    assert cli._lead([word, f"resume={tmp_path}"], 1) == REFUSED
    assert capsys.readouterr().err.strip().splitlines() == [
        f"lptrain: error: {word}: resume= carries on a sweep by itself when given the "
        f"sweep's directory; drop {word}"]


@pytest.mark.parametrize("path", ["/tmp/plain/run-1", "/tmp/my runs/ü 1", "/tmp/it's",
                                  "/tmp/a\\b", "/tmp/end\\", "/tmp/a,b=c", "/tmp/q\"x",
                                  "/tmp/x\\'y"])
def test_a_directory_override_reads_back_as_the_path(path):
    """The hydra.run.dir / hydra.sweep.dir a resume hands Hydra: quoted where the grammar
    needs it (was bare: a space made Hydra's lexer fail), and a quoted value given on the
    command line names the path inside the quotes."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    override = dir_override("hydra.run.dir", path)
    assert OverridesParser.create().parse_override(override).value() == path
    assert dir_value(override.split("=", 1)[1]) == path
    assert (override == f"hydra.run.dir={path}") == (path == "/tmp/plain/run-1")


def test_a_failed_file_names_what_became_of_the_checkpoint():
    """A full disk ended the run with metrics.h5's line only; the checkpoint that failed
    after it (larger than the reserve) was not mentioned, and the resume then found
    nothing to resume."""
    from lptrain.train.loop import _checked

    class Full:
        def check(self, exchange, k, writer, signals=True):
            raise RunFileError("metrics.h5: cannot write (only 3 MB left free)")

    def save(k, force=False):
        raise RunFileError("checkpoint.pt: cannot write (No space left on device); no "
                           "checkpoint was written")
    with pytest.raises(RunFileError) as err:
        _checked(Full(), None, 8, None, save)
    assert str(err.value) == ("metrics.h5: cannot write (only 3 MB left free); "
                              "checkpoint.pt: cannot write (No space left on device); no "
                              "checkpoint was written")
    with pytest.raises(RunFileError, match=r"free\)$"):
        _checked(Full(), None, 8, None, lambda k, force=False: None)


def test_rows_a_failed_write_lost_keep_the_last_checkpoint():
    """A write that failed lost iteration k's rows, and the loop still wrote the
    checkpoint of k: its resume left a gap in metrics.h5 (k's rows never written).
    Now no checkpoint of k is written, and a resume from the last one writes k's rows
    again (the line does not claim one: the failure may come before the first)."""
    from lptrain.train.loop import _checked

    class Lost:
        def check(self, exchange, k, writer, signals=True):
            error = RunFileError("metrics.h5: cannot write (Operation not permitted)")
            error.rows_lost = True
            raise error
    saved = []
    with pytest.raises(RunFileError) as err:
        _checked(Lost(), None, 8, None, lambda k, force=False: saved.append(k))
    assert saved == []
    assert str(err.value) == ("metrics.h5: cannot write (Operation not permitted); "
                              "iteration 8's rows are not in the metrics file, so no "
                              "checkpoint of it is written")


def test_an_unexpected_error_of_many_lines_is_said_in_one():
    """An MPI error stack (a neighbour rank killed) printed six lines after 'error:'."""
    from lptrain.errors import one_line
    stack = ("Other MPI error, error stack:\ninternal_Recv_c(339)........: fail\n"
             "MPIR_Wait(745)..............: \nprocess_vm_readv failed (errno 3)\n")
    assert one_line(RuntimeError(stack)) == ("Other MPI error, error stack: ... "
                                             "process_vm_readv failed (errno 3)")
    assert one_line(ValueError("bad")) == "bad" and one_line(KeyError()) == ""


def test_a_machine_fault_with_a_checkpoint_says_how_to_resume(tmp_path):
    """A full disk or an unwritable file ended a run (status failed, resumable) with no
    word of the resume the other stops print."""
    from lptrain import stops
    from lptrain.errors import DivergedError
    from lptrain.jobs import Job
    job = Job(cfg=None, run_dir=str(tmp_path))
    full = s.MetricsFileError(f"{tmp_path}/metrics.h5: cannot write (only 3 MB left free)")
    assert stops.resume_hint(full, job, 2) == ""                 # no checkpoint yet
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    assert stops.resume_hint(full, job, 2) == (
        f"; once fixed, resume with: mpiexec -n 2 lptrain resume={tmp_path}")
    assert stops.resume_hint(DivergedError("objective became inf"), job, 1) == ""
    assert stops.resume_hint(RunFileError("busy", exit_code=REFUSED), job, 1) == ""


def test_a_refused_runs_directory_goes_only_where_it_holds_what_the_refusal_wrote(tmp_path):
    """A refusal inside the run (too little memory, a batch larger than the data) left
    an empty run directory behind (.hydra/, lptrain.log) under outputs/."""
    from lptrain.rundir import LOCK_FILE, remove_refused
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run / ".hydra" / name).write_text("x: 1\n")
    (run / "lptrain.log").write_text("refused\n")
    (run / LOCK_FILE).write_text("host 1\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "lptrain.log").write_text("")
    (kept / "notes.txt").write_text("mine")           # the user's: the run is left
    assert remove_refused(run, empty_parents=1) and not run.exists()
    assert tmp_path.exists()                        # not empty: kept
    assert not remove_refused(kept) and (kept / "notes.txt").exists()
    assert not remove_refused(tmp_path / "absent")
    sweep = tmp_path / "sweep"            # a sweep refused in its sweeper's parameters
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    assert remove_refused(sweep) and not sweep.exists()


def test_a_file_damaged_inside_is_refused_before_a_resume_writes_on(tmp_path):
    """800 bytes overwritten in the global heap of the string attributes: the resume
    trained on (exit 0) and left a file no reader opens (held-out)."""
    from helpers import fake_run
    path = fake_run(tmp_path / "run", "serial", 0.4)
    data = bytearray(path.read_bytes())
    data[2048:2848] = b"\xde\xad\xbe\xef" * 200
    path.write_bytes(bytes(data))
    with pytest.raises(s.MetricsInputError, match="cannot reopen metrics file .damaged: "
                                                   ".*bad global heap"):
        w.MetricsWriter.reopen(path, 1, {})


def test_a_file_another_process_writes_is_refused(tmp_path):
    """Held open with h5py's "a" elsewhere, the file took the resumed run's rows and lost
    them all at the other writer's close (held-out)."""
    from helpers import fake_run
    path = fake_run(tmp_path / "run", "serial", 0.4)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, h5py; f = h5py.File(sys.argv[1], 'a'); "
         "print('open', flush=True); sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"
        with pytest.raises(s.MetricsInputError, match="open for writing in another process"):
            w.MetricsWriter.reopen(path, 1, {})
    finally:
        holder.communicate("", timeout=60)
    w.MetricsWriter.reopen(path, 1, {}).close()          # closed there: carried on
    assert read_metrics(path).n_iterations == 1
