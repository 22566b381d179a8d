"""lptrain-report: the summary table, run labels, file discovery, plots and error exits."""
import math
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from lptrain.metrics import schema as s
from lptrain.metrics.reader import read_metrics
from lptrain.metrics.timing import LISTED, TallyingWriter, TimingTally, text_lines
from lptrain.metrics.timing import summarize as summarize_timing
from lptrain.metrics.writer import MetricsWriter
from lptrain.report.cli import find_metrics, main
from lptrain.report.labels import run_labels
from lptrain.report.table import COLUMNS, add_speedup, rank_times, summarize, to_markdown

REPO = Path(__file__).resolve().parents[2]
CONFIG = "mode:\n  name: {mode}\noptimizer:\n  maxiter: 4\n  lr: {lr}\nrun_dir: /tmp/{mode}\n"


def fake_run(run_dir: Path, mode: str, step_time: float, n: int = 4, lr: float = 1.0,
             ranks: int = 1, close: bool = True, timing: bool = False) -> Path:
    """A run directory whose metrics.h5 holds n iterations of known numbers (with
    `timing`, iteration i's timing/ row gives rank r i·(r+1) s computing, 0.1·i s
    communicating, 0.2·r s waiting; MGRIT levels 16/4 outside serial mode)."""
    run_dir.mkdir(parents=True)
    path = run_dir / s.FILE_NAME
    w = MetricsWriter(path, {s.MODE: mode, s.WORLD_SIZE: ranks, s.SEED: 0,
                             s.CONFIG: CONFIG.format(mode=mode, lr=lr),
                             s.MGRIT_LEVELS: None if mode == s.MODE_SERIAL else "16/4"})
    for i in range(1, n + 1):
        w.log_train(iteration=i, objective=1.0 / i, loss=0.5 / i, accuracy=0.2 * i,
                    step_time=step_time, wall_time=step_time * i + 0.5)
        if i % 2 == 0:
            w.log_validation(i, 0.6 / i, 0.9 if i == 2 else 0.8)
        if mode != s.MODE_SERIAL:
            w.log_mgrit(iteration=i, fwd_history=[1.0, 0.1][: 1 + i % 2],
                        adj_history=[1.0, 0.1, 0.01])
        if timing:
            w.log_timing(i, [i * (r + 1.0) for r in range(ranks)], [0.1 * i] * ranks,
                         [0.2 * r for r in range(ranks)])
    if close:
        w.close()
    return path


@pytest.fixture
def two_runs(tmp_path):
    """A multirun directory: serial at 0.4 s/iteration, simultaneous at 0.1 s/iteration."""
    root = tmp_path / "multirun"
    fake_run(root / "0", s.MODE_SERIAL, 0.4)
    fake_run(root / "1", s.MODE_SIMULTANEOUS, 0.1, ranks=4)
    return root


def _rows(root):
    runs = [read_metrics(p) for p in find_metrics([root])]
    return add_speedup([summarize(label, run) for label, run in zip(run_labels(runs), runs)])


def test_summary_rows_hold_the_final_numbers(two_runs):
    serial, simultaneous = _rows(two_runs)
    assert serial["iterations"] == 4 and serial["ranks"] == 1
    assert serial["objective"] == 0.25 and serial["loss"] == 0.125
    assert serial["train_accuracy"] == pytest.approx(0.8)
    assert serial["val_accuracy"] == 0.8 and serial["best_val_accuracy"] == 0.9
    assert serial["wall_time"] == pytest.approx(2.1)
    assert serial["iteration_time"] == pytest.approx(0.4)
    assert serial["fwd_iterations"] is None and serial["status"] == s.COMPLETED
    assert serial["levels"] is None and simultaneous["levels"] == "16/4"
    # histories of length 2, 1, 2, 1 and 3, 3, 3, 3
    assert simultaneous["fwd_iterations"] == 1.5 and simultaneous["adj_iterations"] == 3


def test_speedup_against_the_serial_run(two_runs):
    serial, simultaneous = _rows(two_runs)
    assert serial["speedup"] == pytest.approx(1.0)
    assert simultaneous["speedup"] == pytest.approx(4.0)


def test_no_speedup_without_a_serial_baseline():
    rows = [{"mode": m, "iteration_time": 0.5, "ranks": 1} for m in ("mgrit", "simultaneous")]
    assert [r["speedup"] for r in add_speedup(rows)] == [None, None]


def test_a_repeated_baseline_gives_the_median_of_its_times():
    """Was '-' in every row, the serial runs' own too: a serial baseline run twice (a
    timing repeated into the same tree) left no single baseline."""
    rows = [{"mode": m, "iteration_time": t, "ranks": 1, "seed": 0}
            for m, t in (("serial", 0.4), ("serial", 0.8), ("serial", 0.6), ("mgrit", 0.2))]
    assert [r["speedup"] for r in add_speedup(rows)] == pytest.approx([1.5, 0.75, 1.0, 3.0])


def test_speedup_of_a_scaling_study_is_against_serial_on_the_fewest_ranks():
    rows = [{"mode": m, "ranks": p, "iteration_time": t}
            for m, p, t in (("serial", 4, 0.25), ("serial", 1, 1.0), ("simultaneous", 4, 0.5),
                            ("serial", 2, 0.5))]
    assert [r["speedup"] for r in add_speedup(rows)] == [4.0, 1.0, 2.0, 2.0]


def test_speedup_is_against_the_serial_run_of_the_same_problem(tmp_path):
    """A serial run of another problem (here another learning rate; in a report of
    several experiments, another network) is no baseline; a mode × seed sweep pairs each
    run with the serial run of its seed."""
    for name, mode, t, lr in (("a", "serial", 0.4, 1.0), ("b", "mgrit", 0.1, 1.0),
                              ("c", "mgrit", 0.1, 0.5)):
        fake_run(tmp_path / name, mode, t, lr=lr)
    assert [r["speedup"] for r in _rows(tmp_path)] == [pytest.approx(1.0),
                                                      pytest.approx(4.0), None]
    rows = [{"mode": m, "ranks": 1, "seed": seed, "iteration_time": t, "problem": ()}
            for m, seed, t in (("serial", 0, 1.0), ("serial", 1, 2.0),
                               ("simultaneous", 0, 0.5), ("simultaneous", 1, 0.5),
                               ("simultaneous", 2, 0.5))]
    assert [r["speedup"] for r in add_speedup(rows)] == [1.0, 1.0, 2.0, 4.0, None]


def test_markdown_table():
    row = {key: None for key in COLUMNS}
    row.update(label="a|b", mode="mgrit", levels="32/8/2", ranks=8, iterations=12,
               loss=0.0123456, val_accuracy=0.5, speedup=2.345, objective=math.nan)
    lines = to_markdown([row]).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("| run | mode | MGRIT levels | ranks | status | iterations |")
    assert lines[1].startswith("| :--- | :--- | :--- | ---: | :--- | ---: |")
    cells = [c.strip() for c in lines[2].strip("|").split(" | ")]
    assert len(cells) == len(COLUMNS)
    got = dict(zip(COLUMNS, cells))
    assert got["label"] == "a\\|b" and got["ranks"] == "8" and got["loss"] == "0.01235"
    assert got["levels"] == "32/8/2"
    assert got["val_accuracy"] == "0.5000" and got["speedup"] == "2.35"
    assert got["objective"] == "-" and got["wall_time"] == "-"


def test_labels_show_mode_ranks_and_differing_overrides(tmp_path):
    paths = [fake_run(tmp_path / "a", "serial", 0.4, lr=1.0),
             fake_run(tmp_path / "b", "mgrit", 0.1, lr=0.5, ranks=2),
             fake_run(tmp_path / "c", "mgrit", 0.1, lr=0.5, ranks=2)]
    labels = run_labels([read_metrics(p) for p in paths])
    # mode.* and the run_dir path are left out; optimizer.maxiter is equal everywhere
    assert labels == ["serial P=1 optimizer.lr=1.0", "mgrit P=2 optimizer.lr=0.5 #1",
                      "mgrit P=2 optimizer.lr=0.5 #2"]


def _typed(run_dir: Path, overrides: list[str], **choices: str) -> None:
    """The .hydra files the lptrain command writes: the overrides as typed and the
    groups Hydra chose."""
    hydra = run_dir / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (hydra / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices:\n" + "".join(
        f"      {k.replace('__', '/')}: {v}\n" for k, v in choices.items()))


def test_labels_name_what_the_user_chose_before_what_it_implies(tmp_path):
    """Were the first four config keys that differ: runs of the lptrain command with
    another network were labelled by `network.init_hidden=...` and the like."""
    config = ("mode:\n  name: serial\nnetwork:\n  name: {net}\n  init_hidden: {h}\n"
              "  channels: 8\noptimizer:\n  lr: {lr}\nseed: 0\n")
    runs = {"a": ("conv", 0.1, 1.0, ["mode=serial", "seed=0"]),
            "b": ("custom", 0.5, 1.0, ["network=custom", "+network.step._target_=my.Step",
                                       "hydra/launcher=basic"]),
            "c": ("conv", 0.1, 0.5, ["optimizer.lr=0.5"])}
    for name, (net, h, lr, typed) in runs.items():
        path = fake_run(tmp_path / name, "serial", 0.4)
        with h5py.File(path, "a", locking=False) as f:
            f.attrs[s.CONFIG] = config.format(net=net, h=h, lr=lr)
        _typed(tmp_path / name, typed, network=net, mode="serial", hydra__launcher="basic")
    labels = run_labels([read_metrics(tmp_path / n / s.FILE_NAME) for n in "abc"])
    # every typed difference, each run's value where it typed none; seed=0 typed in one
    # run only is no difference; network.name/init_hidden are what network=custom sets
    # (the step typed after network=custom: it was hidden as something the group sets)
    assert labels == ["serial network=conv optimizer.lr=1.0",
                      "serial network=custom network.step._target_=my.Step optimizer.lr=1.0",
                      "serial network=conv optimizer.lr=0.5"]


def test_labels_show_every_typed_difference_then_what_tells_runs_apart(tmp_path):
    """Were the first four differing keys: a fifth swept key (the seed) became '#1'/'#2',
    and in a folder of unrelated runs the keys that differ in one run only took the
    places of the one that differs in all."""
    jobs = [["mgrit.cfactor0=2", "mgrit.levels=2", "network.width=4",
             "network.activation=tanh", "seed=0"],
            ["mgrit.cfactor0=4", "mgrit.levels=3", "network.width=8",
             "network.activation=relu", "seed=1"]]
    for job, typed in enumerate(jobs):
        fake_run(tmp_path / "sweep" / str(job), "mgrit", 0.1)
        _typed(tmp_path / "sweep" / str(job), typed)
    runs = [read_metrics(p) for p in find_metrics([tmp_path / "sweep"])]
    assert run_labels(runs) == [f"mgrit {' '.join(typed)}" for typed in jobs]
    for i, layers in enumerate((4, 3, 2, 33)):     # config only: not the lptrain command's
        path = fake_run(tmp_path / "mixed" / f"r{i}", "mgrit", 0.1)
        with h5py.File(path, "a", locking=False) as f:
            f.attrs[s.CONFIG] = "".join(f"{k}: {1 if i == 0 else 2}\n" for k in "abcde") + \
                f"layers: {layers}\n"
    labels = run_labels([read_metrics(p) for p in find_metrics([tmp_path / "mixed"])])
    assert labels[1] == "mgrit layers=3 a=2 b=2 c=2"
    for mode, levels in (("serial", 3), ("mgrit", 2)):
        fake_run(tmp_path / "modes" / mode, mode, 0.1)
        _typed(tmp_path / "modes" / mode, [f"mgrit.levels={levels}", "seed=4"])
    runs = [read_metrics(p) for p in find_metrics([tmp_path / "modes"])]
    assert run_labels(runs) == ["mgrit mgrit.levels=2", "serial"]   # serial runs no MGRIT


def test_labels_show_each_jobs_value_of_an_interpolated_override(tmp_path):
    """Were '#1'/'#2': `seed=${hydra:job.num}` is the same typed text in every job (a
    sweep's job stores it escaped), which hid the seed each job ran with."""
    for job, typed in enumerate((r"seed=$\{hydra\:job.num\}", "seed=${oc.env:S}")):
        for num in (0, 1):
            path = fake_run(tmp_path / str(job) / str(num), "serial", 0.1)
            with h5py.File(path, "a", locking=False) as f:
                f.attrs[s.CONFIG] = f"seed: {num}\noptimizer:\n  lr: 1.0\n"
            _typed(tmp_path / str(job) / str(num), [typed, "optimizer.lr=1.0"])
        runs = [read_metrics(p) for p in find_metrics([tmp_path / str(job)])]
        assert run_labels(runs) == ["serial seed=0", "serial seed=1"]


def test_a_multiruns_jobs_are_found_in_job_order(tmp_path):
    """Were 0, 1, 10, 11, 2, ...: the report's rows and legend out of job order."""
    for job in (0, 1, 2, 10, 11):
        fake_run(tmp_path / "multirun" / str(job), "serial", 0.1)
    assert [p.parent.name for p in find_metrics([tmp_path / "multirun"])] == \
        ["0", "1", "2", "10", "11"]


def test_jobs_named_by_their_overrides_come_in_job_order(tmp_path):
    """hydra.sweep.subdir=${hydra.job.override_dirname}: lr=0.05,0.1,0.2 came as 0.1,
    0.2, 0.05 (the digits of 0.05 read as 0 and 5); numbers are values, and a job's
    own number (.hydra/hydra.yaml) orders it within its sweep."""
    sweep = tmp_path / "multirun"
    (sweep / "multirun.yaml").parent.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for num, name in enumerate(["lr=0.05", "lr=0.1", "lr=0.2", "lr=1e-3"]):
        fake_run(sweep / name, "serial", 0.1)
        (sweep / name / ".hydra").mkdir()
        (sweep / name / ".hydra" / "hydra.yaml").write_text(
            f"hydra:\n  job:\n    num: {num}\n")
    assert [p.parent.name for p in find_metrics([sweep])] == \
        ["lr=0.05", "lr=0.1", "lr=0.2", "lr=1e-3"]
    for num in (0, 1, 2):                     # jobs named by number, one resumed alone
        fake_run(tmp_path / "by_num" / str(num), "serial", 0.1)
        (tmp_path / "by_num" / str(num) / ".hydra").mkdir()
        (tmp_path / "by_num" / str(num) / ".hydra" / "hydra.yaml").write_text(
            f"hydra:\n  job:\n    num: {'???' if num == 1 else num}\n")
    (tmp_path / "by_num" / "multirun.yaml").write_text("hydra: {}\n")
    assert [p.parent.name for p in find_metrics([tmp_path / "by_num"])] == ["0", "1", "2"]
    for name in ("lr=0.05", "lr=0.1", "lr=0.2", "lr=1e-3"):      # no records: by value
        (sweep / name / ".hydra" / "hydra.yaml").unlink()
    assert [p.parent.name for p in find_metrics([sweep])] == \
        ["lr=1e-3", "lr=0.05", "lr=0.1", "lr=0.2"]


def test_find_metrics_accepts_files_run_dirs_and_multirun_dirs(two_runs, tmp_path):
    file0 = two_runs / "0" / s.FILE_NAME
    found = find_metrics([file0, two_runs / "1", two_runs])
    assert found == [file0, two_runs / "1" / s.FILE_NAME]
    (tmp_path / "empty").mkdir()
    with pytest.raises(s.MetricsFileError, match="no metrics.h5"):
        find_metrics([tmp_path / "empty"])
    # runs gathered as links for a comparison were not found; a link cycle ends
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "a").symlink_to(two_runs / "1")
    (tmp_path / "links" / "loop").symlink_to(tmp_path / "links")
    assert find_metrics([tmp_path / "links"]) == [tmp_path / "links" / "a" / s.FILE_NAME]
    # a run reachable as itself and through a link is named by its real path
    (two_runs / "alias").symlink_to(two_runs / "1")
    try:
        assert find_metrics([two_runs]) == [two_runs / j / s.FILE_NAME for j in ("0", "1")]
    finally:
        (two_runs / "alias").unlink()


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
    assert summary[3].startswith("| simultaneous P=4 | simultaneous | 16/4 | 4 | completed | 4 |")
    assert summary[3].endswith("| 1.50 | 3.00 | 4.00 | - |")
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


def test_validation_rows_are_placed_at_their_wall_time(two_runs):
    from lptrain.report.plots import _x
    run = read_metrics(two_runs / "1" / s.FILE_NAME)
    np.testing.assert_allclose(_x(run, s.VALIDATION, s.WALL_TIME), [0.7, 0.9])
    np.testing.assert_array_equal(_x(run, s.VALIDATION, s.ITERATION), [2, 4])
    before = fake_run(two_runs / "2", s.MODE_SERIAL, 0.4)
    with h5py.File(before, "a", locking=False) as f:      # a validation before training
        f[s.VALIDATION][s.ITERATION][0] = 0
    np.testing.assert_allclose(_x(read_metrics(before), s.VALIDATION, s.WALL_TIME), [0, 2.1])


def test_iteration_time_is_the_median_after_the_first(tmp_path):
    path = fake_run(tmp_path / "run", s.MODE_SERIAL, 0.4)
    with h5py.File(path, "a", locking=False) as f:
        f[s.TRAIN][s.STEP_TIME][:] = [5.0, 0.3, 0.9, 0.4]   # a cold first iteration
    assert summarize("x", read_metrics(path))["iteration_time"] == pytest.approx(0.4)


@pytest.fixture
def figures_of(two_runs, tmp_path):
    """The report's figures of two runs of the lptrain command with experiment=peaks_paper."""
    from lptrain.report.cli import report_context
    from lptrain.report.plots import figures
    for job in ("0", "1"):
        _hydra_record(two_runs / job, "peaks_paper")
    runs = [read_metrics(p) for p in find_metrics([two_runs])]
    return report_context(runs), figures(list(zip(run_labels(runs), runs)), report_context)


def test_figures_are_titled_with_dataset_experiment_and_modes(figures_of):
    context, figs = figures_of
    # the fake runs' config names no dataset
    assert context == "experiment=peaks_paper: serial, simultaneous"
    titles = {name: fig.get_suptitle() for name, fig in figs.items()}
    assert titles["loss_vs_iteration"] == f"Loss against optimizer iteration\n{context}"
    assert titles["accuracy_vs_wall_time"] == f"Accuracy against wall time\n{context}"
    # the MGRIT figures show only the runs with solves, and name only those
    assert titles["mgrit_residuals"] == ("MGRIT final residual per solve\n"
                                         "experiment=peaks_paper: simultaneous")


def test_a_long_context_wraps_inside_the_figure(two_runs):
    from lptrain.report.plots import figures
    from helpers import title_inside
    runs = [read_metrics(p) for p in find_metrics([two_runs])]
    context = ", ".join(f"experiment=my_own_experiment_{i}" for i in range(8)) + ": serial"
    figs = figures(list(zip(run_labels(runs), runs)), lambda _: context)
    assert figs and all(title_inside(fig) for fig in figs.values())
    assert all(fig.get_suptitle().replace("\n", " ").endswith(context) for fig in figs.values())


def _hydra_record(run_dir: Path, experiment: str) -> None:
    """The choices part of the .hydra/hydra.yaml the lptrain command writes."""
    hydra = run_dir / ".hydra"
    hydra.mkdir()
    (hydra / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices:\n"
                                      f"      experiment: {experiment}\n      mode: mgrit\n")


def test_report_context_names_datasets_and_a_partial_experiment(tmp_path):
    from lptrain.report.cli import report_context
    paths = [fake_run(tmp_path / "a", s.MODE_MGRIT, 0.1), fake_run(tmp_path / "b", "serial", 1)]
    for path in paths:
        with h5py.File(path, "a", locking=False) as f:
            f.attrs[s.CONFIG] = "dataset:\n  name: indian_pines\nmode:\n  name: mgrit\n"
    _hydra_record(tmp_path / "b", "indian_pines_paper")
    assert report_context([read_metrics(p) for p in paths]) == \
        "indian_pines, experiment=indian_pines_paper (1 of 2 runs): mgrit, serial"


def test_log_axes_where_values_span_decades_and_zeros_left_out(tmp_path):
    """A loss from 1.4 to 0.8 on a log axis showed three tick labels, none above 1; an
    exact adjoint residual of 0 pulled the log axis down to 1e-32."""
    from lptrain.report.plots import figures
    path = fake_run(tmp_path / "run", s.MODE_MGRIT, 0.1)        # losses 0.5 .. 0.125
    with h5py.File(path, "a", locking=False) as f:
        f[s.MGRIT][s.ADJ_RESIDUAL][:] = [1e-3, 0.0, 1e-9, 1e-10]
    run = read_metrics(path)
    figs = figures([("a", run)])
    assert figs["loss_vs_iteration"].axes[0].get_yscale() == "linear"   # within a decade
    residuals = figs["mgrit_residuals"].axes[1]
    assert residuals.get_yscale() == "log" and residuals.get_ylim()[0] > 1e-12
    # the residual left out is said (the forward panel's are all positive)
    labels = [t.get_text() for t in figs["mgrit_residuals"].legends[0].get_texts()]
    assert labels == ["a (1 value of 0 not drawn on the log axis)"]


def test_a_run_no_panel_can_draw_says_so_in_the_legend(tmp_path):
    """mode=mgrit with one layer: its residuals are exactly 0 (not on a log axis) and its
    factors NaN, and the legend listed it beside no line at all."""
    from lptrain.report.plots import figures
    exact, other = (fake_run(tmp_path / name, s.MODE_MGRIT, 0.1) for name in "ab")
    with h5py.File(exact, "a", locking=False) as f:
        for name in (s.FWD_RESIDUAL, s.ADJ_RESIDUAL):
            f[s.MGRIT][name][:] = 0.0
        for name in (s.FWD_FACTOR, s.ADJ_FACTOR):
            f[s.MGRIT][name][:] = np.nan
    with h5py.File(other, "a", locking=False) as f:   # decades apart: log axes
        f[s.MGRIT][s.ADJ_RESIDUAL][:] = [1e-3, 1e-5, 1e-7, 1e-9]
    figs = figures([("exact", read_metrics(exact)), ("other", read_metrics(other))])
    for name in ("mgrit_residuals", "mgrit_factors"):
        labels = [t.get_text() for t in figs[name].legends[0].get_texts()]
        assert labels == ["exact (none drawn: 0 or NaN)", "other"], (name, labels)
    alone = figures([("exact", read_metrics(exact))])["mgrit_factors"]
    for ax in alone.axes:     # not matplotlib's -0.04..0.04 square: the run's iterations
        assert [t.get_text() for t in ax.texts] == ["nothing to draw: every value is 0 or NaN"]
        assert ax.get_xlim() == (1.0, 4.0) and not len(ax.get_yticks())


def test_a_run_stopped_before_its_first_iteration_says_so(tmp_path):
    """A run interrupted after iteration 0 drew empty axes and a legend entry with
    nothing to match it."""
    from lptrain.report.plots import figures
    empty = fake_run(tmp_path / "a", s.MODE_SERIAL, 0.1, n=0)
    figs = figures([("stopped", read_metrics(empty))])
    for name in ("loss_vs_iteration", "accuracy_vs_wall_time"):
        labels = [t.get_text() for t in figs[name].legends[0].get_texts()]
        assert labels == ["stopped (no iterations yet)"], (name, labels)
        assert [t.get_text() for t in figs[name].axes[0].texts] == ["no iterations yet"]


def test_a_run_of_one_iteration_shows_its_training_value(tmp_path):
    """A one-point line draws nothing: the training value of a 1-iteration run was
    invisible."""
    from lptrain.report.plots import figures
    one = fake_run(tmp_path / "a", s.MODE_SERIAL, 0.1, n=1)
    for name in ("loss_vs_iteration", "accuracy_vs_wall_time"):
        training = figures([("one", read_metrics(one))])[name].axes[0].lines[0]
        assert len(training.get_xdata()) == 1 and training.get_marker() not in ("None", None)


def test_validation_is_markers_training_is_lines(figures_of):
    _, figs = figures_of
    ax = figs["loss_vs_iteration"].axes[0]
    # each run: its training line, its validation markers' white outline, the markers
    train, outline, val = ax.lines[0], ax.lines[1], ax.lines[2]
    assert train.get_linestyle() == "-" and train.get_marker() in ("None", None, "")
    assert val.get_linestyle() == "None" and val.get_marker() == "o"
    # above every training line, their outlines below every marker: the markers hid in
    # a noisy mini-batch line of their own colour
    assert val.get_zorder() > outline.get_zorder() > train.get_zorder()
    assert outline.get_marker() == "o" and outline.get_color() == "white"
    assert ax.lines[5].get_marker() == "s"              # the other run's shape
    # and its own dashes: a run that follows another exactly hid behind it
    assert ax.lines[3].get_linestyle() == "--"
    from lptrain.report.plots import dashes
    styles = [dashes(i) for i in range(80)]      # runs i and i + 4 were alike
    assert styles[0] == "-" and all(offset == 0 for offset, _ in styles[1:])
    assert len({pattern for _, pattern in styles[1:]}) == 79     # no two drawn alike
    np.testing.assert_array_equal(val.get_xdata(), [2, 4])
    np.testing.assert_array_equal(train.get_xdata(), [1, 2, 3, 4])


def test_iteration_axes_tick_whole_iterations(figures_of):
    """A 4-iteration run's axis was ticked 0.5, 1.0, 1.5, ... (reproduce-mnist QUICK=1)."""
    _, figs = figures_of
    for name in ("loss_vs_iteration", "mgrit_residuals", "mgrit_factors"):
        for ax in figs[name].axes:
            ticks = ax.get_xticks()
            assert len(ticks) >= 2 and np.all(ticks == np.round(ticks)), (name, ticks)


def test_legends_sit_below_the_axes_covering_no_curve(figures_of):
    _, figs = figures_of
    for name, fig in figs.items():
        fig.canvas.draw()
        assert all(ax.get_legend() is None for ax in fig.axes), name
        (legend,) = fig.legends
        box = legend.get_window_extent()
        for ax in fig.axes:
            assert box.y1 <= ax.get_window_extent().y0, name    # wholly below every panel
        labels = [t.get_text() for t in legend.get_texts()]
        runs = ["simultaneous P=4"] if name.startswith("mgrit") else ["serial P=1",
                                                                     "simultaneous P=4"]
        assert labels[:len(runs)] == runs, name
    key = figs["loss_vs_iteration"].legends[0].get_title().get_text()
    assert "lines: training" in key and "markers: validation" in key


# -- time per rank (metrics/timing.py) ---------------------------------------------------
def test_time_per_rank_sums_the_rows_of_the_last_grid():
    nan = math.nan
    # two iterations on 3 ranks, then (resumed) two on 2: the 2-rank rows count
    compute = np.array([[9.0, 9.0, 9.0], [9.0, 9.0, 9.0], [1.0, 3.0, nan], [2.0, 4.0, nan]])
    comm = np.array([[5.0] * 3, [5.0] * 3, [0.5, 0.25, nan], [0.5, 0.75, nan]])
    wait = np.array([[5.0] * 3, [5.0] * 3, [1.5, 0.0, nan], [0.5, 0.0, nan]])
    t = summarize_timing(compute, comm, wait, np.array([3, 3, 2, 2]))
    assert t.iterations == 2 and t.size == 2
    assert [(r.compute, r.communication, r.waiting) for r in t.ranks] == \
        [(3.0, 1.0, 2.0), (7.0, 1.0, 0.0)]
    assert t.ranks[0].share(t.ranks[0].waiting) == pytest.approx(100 * 2 / 6)
    assert t.compute_share == pytest.approx(100 * 10 / 14)
    assert t.imbalance == pytest.approx(7 / 5)
    assert summarize_timing(np.empty((0, 2)), np.empty((0, 2)), np.empty((0, 2))) is None


@pytest.mark.parametrize("ranks", [2, LISTED, 64])
def test_time_per_rank_fits_80_columns_and_names_the_extremes(ranks):
    tally = TimingTally()
    for i in range(3):      # rank r computes (r * 37 mod ranks) + 1 s, seconds up to 1e5
        tally.add([1e4 * ((r * 37) % ranks + 1) for r in range(ranks)], [1.5] * ranks,
                  [123.25] * ranks)
    t = tally.summary()
    lines = text_lines(t)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert lines[0].startswith(f"time per rank over 3 iterations: {t.compute_share:.1f} %")
    # a resumed run's tally is its last start's (beside the whole run's wall time)
    assert text_lines(t, 3)[0] == lines[0]
    assert text_lines(t, 300)[0].startswith("time per rank over iterations 298-300: ")
    # each heading ends where its column's cells do (was centred: 'compute [s]' ended
    # 4 columns before its numbers' cells)
    heads = ("compute [s]", "communication [s]", "waiting [s]", "total [s]")
    assert [lines[1].index(h) + len(h) for h in heads] == \
        [m.end() for m in re.finditer(r"%\)|\S+$", lines[2])]
    rows = [line.split()[0] for line in lines[2:]]
    if ranks <= LISTED:
        assert rows == [str(r) for r in range(ranks)]
        return
    least = min(range(ranks), key=lambda r: (r * 37) % ranks)
    most = max(range(ranks), key=lambda r: (r * 37) % ranks)
    assert rows[0] == str(least) and rows[2] == str(most) and "(median)" in lines[3]


@pytest.mark.parametrize("ranks", [2, 64])
def test_time_per_rank_narrower_than_80_columns_shows_the_seconds(ranks):
    """A console of 60 columns folded each 80-column row into two (rich wraps at its
    width); narrower than 80 the table drops the shares and keeps one row per rank."""
    tally = TimingTally()
    tally.add([1e4 * (r + 1) for r in range(ranks)], [1.5] * ranks, [123.25] * ranks)
    t = tally.summary()
    wide, narrow = text_lines(t), text_lines(t, width=60)
    assert narrow[0] == wide[0] and len(narrow) == len(wide)
    assert all(len(line) <= 57 for line in narrow[1:]), max(narrow[1:], key=len)
    heads = ("compute", "comm.", "waiting", "total")
    assert narrow[1].startswith("rank, seconds ")
    for line, (label, r) in zip(narrow[2:], t.shown()):   # labels: '12 (least)'
        assert line.startswith(label)
        assert [13 + m.end() for m in re.finditer(r"\S+", line[13:])] == \
            [narrow[1].index(h) + len(h) for h in heads]
        assert [float(v) for v in line[13:].split()] == pytest.approx(
            [r.compute, r.communication, r.waiting, r.total], rel=1e-3)


def test_tallying_writer_keeps_what_the_file_holds(tmp_path):
    path = tmp_path / s.FILE_NAME
    inner = MetricsWriter(path, {s.MODE: s.MODE_MGRIT, s.WORLD_SIZE: 2, s.SEED: 0,
                                 s.CONFIG: ""})
    w = TallyingWriter(inner)
    for i in range(1, 4):
        w.log_train(iteration=i, objective=1.0)
        w.log_timing(i, [0.5 * i, 0.25], [0.125, 0.0], [0.0, 0.375 * i])
    w.close()
    assert inner._closed      # calls other than log_timing reach the writer
    kept, filed = w.tally.summary(), rank_times(read_metrics(path))
    assert kept == filed and kept.ranks[1].waiting == pytest.approx(2.25)
    assert text_lines(kept) == text_lines(filed)


def test_report_shows_time_per_rank_of_runs_on_several_ranks(tmp_path):
    fake_run(tmp_path / "runs" / "0", s.MODE_SERIAL, 0.4, timing=True)
    fake_run(tmp_path / "runs" / "1", s.MODE_MGRIT, 0.2, ranks=3, timing=True)
    out = tmp_path / "report"
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    text = (out / "summary.md").read_text()
    table, _, per_rank = text.partition("## Time per rank")
    assert table.rstrip().endswith("Each run's time per rank, where it ran on several, "
                                   "follows below.")
    # 4 iterations: rank r computes 10 (r + 1) s, communicates 1 s, waits 0.8 r s
    share = 100 * 60 / (60 + 3 + 2.4)
    assert table.splitlines()[3].endswith(f"| {share:.1f} |")      # the mgrit run
    assert table.splitlines()[2].endswith(f"| {100 * 10 / 11:.1f} |")   # serial, 1 rank
    assert "### serial" not in per_rank and "### mgrit P=3" in per_rank
    assert "| 2 | 30.000 (92.0 %) | 1.000 (3.1 %) | 1.600 (4.9 %) | 32.600 |" in per_rank
    assert sum(line.startswith("|") for line in per_rank.splitlines()) == 5   # 3 ranks
