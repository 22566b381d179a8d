"""lptrain-report's runs: which metrics files it finds, in which order, and the
labels that tell the runs apart."""
from pathlib import Path

import h5py
import pytest

from helpers import fake_run
from lptrain.metrics import schema as s
from lptrain.metrics.reader import read_metrics
from lptrain.report.cli import find_metrics
from lptrain.report.labels import run_labels


def test_labels_show_mode_ranks_and_differing_overrides(tmp_path):
    paths = [fake_run(tmp_path / "a", "serial", 0.4, lr=1.0),
             fake_run(tmp_path / "b", "mgrit", 0.1, lr=0.5, ranks=2),
             fake_run(tmp_path / "c", "mgrit", 0.1, lr=0.5, ranks=2)]
    labels = run_labels([read_metrics(p) for p in paths])
    # mode.* and the run_dir path are left out; optimizer.maxiter is equal everywhere
    assert labels == ["serial P=1 optimizer.lr=1.0", "mgrit P=2 optimizer.lr=0.5 (b)",
                      "mgrit P=2 optimizer.lr=0.5 (c)"]


def _typed(run_dir: Path, overrides: list[str], **choices: str) -> None:
    """The .hydra files the lptrain command writes: the overrides as typed and the
    groups Hydra chose."""
    hydra = run_dir / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (hydra / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices:\n" + "".join(
        f"      {k.replace('__', '/')}: {v}\n" for k, v in choices.items()))


def test_labels_shorten_a_sweepers_long_numbers_as_far_as_they_stay_apart(tmp_path):
    """An Optuna trial was labelled `optimizer.step0=0.501030153150023` (held-out
    check)."""
    typed = {"a": "0.501030153150023", "b": "0.501040153150023", "c": "0.7", "d": "2"}
    for name, value in typed.items():
        fake_run(tmp_path / name, "serial", 0.4)
        _typed(tmp_path / name, [f"optimizer.step0={value}", "train.iterations=100000"])
    labels = run_labels([read_metrics(tmp_path / n / s.FILE_NAME) for n in typed])
    assert labels == ["serial optimizer.step0=0.50103", "serial optimizer.step0=0.50104",
                      "serial optimizer.step0=0.7", "serial optimizer.step0=2"]


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
        path = fake_run(tmp_path / "sweep" / str(job), "mgrit", 0.1)
        with h5py.File(path, "a", locking=False) as f:     # the hierarchies they built
            f.attrs[s.MGRIT_LEVELS] = ("16/8", "16/4/1")[job]
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


def test_labels_leave_out_what_a_run_did_not_read(tmp_path):
    """Were `mgrit mgrit.grad_tol=0.01` and `... 0.1` for two mode=mgrit runs whose
    consoles said grad_tol was not used; Peaks runs labelled by network.channels; and
    `optimizer.lr_min=0` beside `optimizer.lr_min=0.0`, one value in two texts."""
    config = ("mode:\n  name: {mode}\nnetwork:\n  opening: dense\n  channels: {c}\n"
              "optimizer:\n  schedule: cosine\n  lr_min: {lr_min}\nmgrit:\n"
              "  grad_tol: {tol}\n  control: error\n  adaptive: false\ntrain:\n"
              "  batch_size: null\n")
    jobs = {"a": ("mgrit", 0.01, 4, "0"), "b": ("mgrit", 0.1, 8, "0.0"),
            "c": ("simultaneous", 0.1, 8, "0.001")}
    for name, (mode, tol, c, lr_min) in jobs.items():
        path = fake_run(tmp_path / name, mode, 0.1)
        with h5py.File(path, "a", locking=False) as f:
            f.attrs[s.CONFIG] = config.format(mode=mode, c=c, tol=tol, lr_min=lr_min)
        _typed(tmp_path / name, [f"mgrit.grad_tol={tol}", f"network.channels={c}",
                                 f"optimizer.lr_min={lr_min}"])
    runs = [read_metrics(tmp_path / n / s.FILE_NAME) for n in "abc"]
    assert run_labels(runs) == ["mgrit optimizer.lr_min=0 (a)", "mgrit optimizer.lr_min=0 (b)",
                                "simultaneous mgrit.grad_tol=0.1 optimizer.lr_min=0.001"]


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


def test_a_sweeps_jobs_without_metrics_are_named(tmp_path, capsys):
    """A job refused by the memory check (only .hydra and lptrain.log in its directory)
    was left out of the report without a word (held-out check)."""
    from lptrain.report.cli import main
    from lptrain.metrics.reader import runs_without_metrics
    sweep = tmp_path / "sweep"
    for job in (0, 2, 10):
        fake_run(sweep / str(job), "serial", 0.1)
    for job in (1, 11):                         # refused: Hydra's files only
        (sweep / str(job) / ".hydra").mkdir(parents=True)
    (sweep / "0" / ".hydra").mkdir()            # a run with its metrics: not named
    assert runs_without_metrics([sweep, sweep / "1", tmp_path / "none"]) == \
        [sweep / "1", sweep / "11"]
    assert main([str(sweep), "--out", str(tmp_path / "report")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"lptrain-report: note: {sweep / job}: no metrics.h5 (a run refused or "
                   "stopped before its first iteration, its lptrain.log says why); left out"
                   for job in ("1", "11")]


def test_a_levels_bound_shows_the_hierarchy_a_run_built(tmp_path):
    """`mgrit.levels=10` labelled a run whose hierarchy was 30/15 (held-out): the setting
    is an upper bound."""
    for name, (levels, built) in {"a": (10, "30/15"), "b": (3, "32/8/2")}.items():
        path = fake_run(tmp_path / name, "simultaneous", 0.4)
        with h5py.File(path, "a", locking=False) as f:
            f.attrs[s.CONFIG] = f"mode:\n  name: simultaneous\nmgrit:\n  levels: {levels}\n"
            f.attrs[s.MGRIT_LEVELS] = built
    runs = [read_metrics(tmp_path / n / s.FILE_NAME) for n in "ab"]
    assert run_labels(runs) == ["simultaneous mgrit.levels=10 (built 30/15)",
                                "simultaneous mgrit.levels=3"]


def test_one_run_is_labelled_with_the_overrides_its_command_typed(tmp_path):
    """A one-job report was labelled with the mode alone: the value swept for that job,
    say, did not show (stop 61's note)."""
    fake_run(tmp_path / "a", "serial", 0.4)
    _typed(tmp_path / "a", ["optimizer.step0=0.5", "hydra.run.dir=/x/y", "seed=3",
                            "mgrit.levels=2", "dataset.path=/data/x"])
    # mgrit.levels: not read by a serial run (its console said so); paths left out
    assert run_labels([read_metrics(tmp_path / "a" / s.FILE_NAME)]) == \
        ["serial optimizer.step0=0.5 seed=3"]


def test_runs_of_one_label_are_told_apart_where_they_are(tmp_path):
    """`lptrain-report B_ref B_int C_ref C_int` labelled two runs of one command '#1' and
    '#2' (which directory is which?), and a sweep's jobs #0 and #1 as '#1' and '#2'."""
    from lptrain.report.labels import _tails
    paths = [fake_run(tmp_path / "s" / str(j), "serial", 0.4) for j in (0, 1)]
    paths += [fake_run(tmp_path / x / "run", "serial", 0.4) for x in ("x", "y")]
    labels = run_labels([read_metrics(p) for p in paths])
    assert [label.split(" ", 1)[1] for label in labels] == ["#0", "#1", "(x/run)", "(y/run)"]
    assert _tails([Path("/a/b"), Path("/a/b")]) == ["run 1", "run 2"]
    assert _tails([Path("a/b"), Path("/x/a/b")]) == ["a/b", "x/a/b"]
