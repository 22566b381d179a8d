"""The lptrain-report command: the files it writes, live and killed runs, and the
one-line error exits for bad paths and files."""
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch

from helpers import fake_run
from lptrain.metrics import schema as s
from lptrain.report.cli import main
from lptrain.report.table import COLUMNS

REPO = Path(__file__).resolve().parents[2]


def test_report_writes_plots_and_summary(two_runs, tmp_path, capsys):
    out = tmp_path / "report"
    assert main([str(two_runs), "--out", str(out)]) == 0
    names = {"loss_vs_iteration.png", "loss_vs_wall_time.png", "accuracy_vs_iteration.png",
             "accuracy_vs_wall_time.png", "mgrit_residuals.png", "mgrit_factors.png"}
    for name in names:
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size > 10_000, name
    summary = (out / "summary.md").read_text().splitlines()
    assert len(summary) == 6 and summary[4] == ""
    assert summary[5].startswith("final objective, loss and train acc: the last train/ "
                                 "row's (with mini-batches the last batch's")
    assert "iteration time: the median duration of an optimizer" in summary[5]
    # no run has per-rank times here: the notes promised a section that never came
    assert "per rank" not in summary[5] and "follows below" not in summary[5]
    assert summary[3].startswith("| simultaneous P=4 | simultaneous | 16/4 | 4 | 4 x 1 "
                                 "| completed | 4 |")
    assert summary[3].endswith("| 1.50 | 3.00 | 4.00 | +0.0e+00 | - |")
    assert str(out / "summary.md") in capsys.readouterr().out
    # the same --out for serial runs only: the MGRIT figures of the report before went
    # on beside a summary of runs that solve nothing; other files there stay
    (out / "notes.png").write_bytes(b"mine")
    fake_run(tmp_path / "serial_only", "serial", 0.1)
    assert main([str(tmp_path / "serial_only"), "--out", str(out)]) == 0
    assert not (out / "mgrit_residuals.png").exists()
    assert not (out / "mgrit_factors.png").exists()
    assert (out / "loss_vs_iteration.png").exists() and (out / "notes.png").exists()


def test_report_on_a_partial_file(tmp_path, monkeypatch):
    """A live run's file, and the same file once no process holds the run: a job killed,
    or ended by an error on a rank other than 0 before rank 0 closed its file, read as
    `running` for ever."""
    from lptrain import rundir
    path = fake_run(tmp_path / "live", s.MODE_MGRIT, 0.2, n=3, close=False)
    with h5py.File(path, "a", locking=False) as f:  # a row cut off after one dataset
        ds = f[s.TRAIN][s.ITERATION]
        ds.resize((4,))
        ds[3] = 4
    (path.parent / rundir.LOCK_FILE).write_text("thishost 12345 token\n")
    for alive, status in ((True, s.RUNNING), (False, "killed")):
        monkeypatch.setattr(rundir, "_owner_alive", lambda host, pid: alive)
        out = tmp_path / f"report-{alive}"
        assert main([str(path), "--out", str(out)]) == 0
        row = (out / "summary.md").read_text().splitlines()[2]
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        got = dict(zip(COLUMNS, cells))
        assert got["status"] == status and got["iterations"] == "3"
        assert got["loss"] == f"{0.5 / 3:.4g}" and got["speedup"] == "-"
        assert (out / "mgrit_residuals.png").stat().st_size > 10_000
    (path.parent / rundir.LOCK_FILE).unlink()          # no lock at all: no process
    assert not rundir.run_alive(path.parent)
    # a sweep's job: the lock is its sweep's, also for a job nested deeper (review: a
    # subdir of s/${hydra.job.num} showed a live job as killed)
    (tmp_path / rundir.LOCK_FILE).write_text("thishost 12345 token\n")
    monkeypatch.setattr(rundir, "_owner_alive", lambda host, pid: True)
    assert rundir.run_alive(path.parent)
    nested = tmp_path / "sweep" / "s" / "0"
    nested.mkdir(parents=True)
    (tmp_path / "sweep" / rundir.SWEEP_FILE).write_text("hydra: {}\n")
    assert not rundir.run_alive(nested)
    (tmp_path / "sweep" / rundir.LOCK_FILE).write_text("thishost 12345 token\n")
    assert rundir.run_alive(nested)


def test_missing_path_exits_2_with_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nowhere" in err and err.startswith("lptrain-report:")
    assert not (tmp_path / "r").exists()


def test_an_out_that_is_a_file_exits_2_with_one_line(two_runs, tmp_path, capsys):
    """Was '[Errno 17] File exists: ...'."""
    (tmp_path / "notes.txt").write_text("mine")
    assert main([str(two_runs), "--out", str(tmp_path / "notes.txt")]) == 2
    assert capsys.readouterr().err == (f"lptrain-report: error: --out {tmp_path}/notes.txt: "
                                       f"a file; name a directory for the report\n")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_corrupt_file_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "run" / s.FILE_NAME
    bad.parent.mkdir()
    bad.write_bytes(b"\x00garbage" * 100)
    res = subprocess.run([sys.executable, "-m", "lptrain.report.cli", str(tmp_path),
                          "--out", str(tmp_path / "r")], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert str(bad) in res.stderr


def test_a_model_file_given_as_metrics_is_named_for_what_it_is(two_runs, tmp_path, capsys):
    """Was 'unreadable metrics file (Unable to synchronously open file (file signature
    not found))'."""
    model = tmp_path / "model.pt"
    torch.save({"x": 1}, model)
    assert main([str(model), "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (f"lptrain-report: error: {model}: not a metrics file "
                                       f"(not HDF5); give a run's directory or its "
                                       f"metrics.h5\n")


def test_a_metrics_file_cut_short_says_so_in_words(tmp_path, capsys):
    """Was HDF5's own text: 'truncated file: eof = 100000, sblock->base_addr = 0,
    stored_eof = 299296' (held-out, stop 64)."""
    whole = fake_run(tmp_path / "run", "serial", 0.1)
    data = whole.read_bytes()
    cut = tmp_path / "cut" / s.FILE_NAME
    cut.parent.mkdir()
    cut.write_bytes(data[:1000])
    assert main([str(cut), "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (f"lptrain-report: error: {cut}: unreadable metrics "
                                       f"file (not whole: 1000 of its {len(data)} bytes; a "
                                       f"copy cut short, or a disk that filled)\n")


@pytest.mark.parametrize("prog", ["report", "model"])
def test_an_empty_out_directory_is_refused_not_taken_for_the_current_one(prog, tmp_path,
                                                                         capsys):
    """`lptrain-report RUN --out=` wrote its five files into the current directory
    (held-out), as `hydra.run.dir=` is refused by lptrain."""
    from lptrain.model_perf.cli import main as model
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path), "--out="]) if prog == "report" else model(["--out="])
    assert exc.value.code == 2
    assert "argument --out: an empty directory is the current one" in capsys.readouterr().err
