"""The command's check of a sweep before any job: a sampler's intervals, values read from
Hydra's runtime, and the layer split on the command's ranks."""
from __future__ import annotations

import re

import pytest

from lptrain.config.schema import register_configs
from lptrain.errors import ConfigError


@pytest.fixture(scope="module", autouse=True)
def _schema():
    register_configs()


def test_a_samplers_intervals_are_checked_before_any_job():
    """`optimizer.lr=interval(0.5,1.0)` under hydra/sweeper=optuna (lbfgs has no lr)
    passed the check: each job then failed in Hydra with four lines and exit 1 (an
    integer key sampled as a float too)."""
    from lptrain.config import check_command, sweep_samples
    assert sweep_samples(["a=interval(0.5,1)", "b=1,2"]) == [
        ["a=0.5", "b=1"], ["a=1.0", "b=1"], ["a=0.5", "b=2"]]
    with pytest.raises(ConfigError, match=r"^optimizer.lr: not an option of this optimizer "
                                          r"choice \(optimizer=lbfgs\)"):
        check_command(["optimizer.lr=interval(0.5,1.0)"])
    with pytest.raises(ConfigError, match=re.escape(        # optuna samples floats
            "train.iterations: Value '2.0' of type 'float' could not be converted to "
            "Integer; an interval samples floats: train.iterations=int(interval(2,4)) "
            "for an integer key")):
        check_command(["train.iterations=interval(2,4)"])
    check_command(["optimizer=adam", "optimizer.lr=tag(log, interval(0.001, 0.1))",
                   "train.iterations=int(interval(2, 4))"])


def test_a_value_read_from_hydras_runtime_is_checked_as_a_first_jobs():
    """`-m seed=${hydra:job.num} ...` (a seed per job) was refused: 'HydraConfig was not
    set'; the jobs then get 0, 1, ..."""
    from lptrain.config import check_command
    check_command(["-m", "seed=${hydra:job.num}", "optimizer.step0=0.5,1.0"])
    with pytest.raises(ConfigError, match=r"^seed: .*hydra:job.nam"):
        check_command(["-m", "seed=${hydra:job.nam}"])
    # a sweep however written (review: hydra.mode=MULTIRUN was checked as a single run)
    check_command(["hydra.mode=MULTIRUN", "seed=${hydra:job.num}", "optimizer.step0=0.5,1.0"])
    # a single run has no job number: refused before anything is made, in one line
    with pytest.raises(ConfigError, match=r"a single run has no job number \(a sweep's "
                       r"\$\{hydra:job.num\}: -m\)$"):
        check_command(["seed=${hydra:job.num}"])
    # a sweep's job resumed alone has its own (resume_args.resume_args)
    check_command(["seed=${hydra:job.num}", "hydra.job.num=1"])
    # but it has Hydra's runtime otherwise (review: was refused)
    check_command(["dataset=mnist", "dataset.path=${hydra:runtime.cwd}/nodata"])


@pytest.mark.parametrize("args, says", [
    (["train.batch_size=100,200"], "train.batch_size=100: optimizer=lbfgs is full batch"),
    (["optimizer=sgd", "train.batch_size=100,6000"],
     "train.batch_size=6000: larger than the 5000 training samples"),
    # only the combination is wrong: each value fits with the other key's first one
    (["optimizer=sgd", "train.batch_size=4,8", "dataset.n_train=10,5"],
     "train.batch_size=8: larger than the 5 training samples"),
    (["optimizer=lbfgs,sgd", "train.batch_size=50"], "optimizer=lbfgs is full batch")])
def test_a_sweeps_batches_are_checked_before_any_job(args, says):
    """Every job started and failed on its batch (held-out): the check was preflight's."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match=re.escape(says)):
        check_command(["-m", *args])


@pytest.mark.parametrize("override", ["mode=[serial,mgrit]", "optimizer=[sgd,adam]",
                                      "network=[dense,conv]", "+mode=[ serial, mgrit ]"])
def test_a_list_of_a_groups_options_is_refused_with_the_sweep_it_meant(override):
    """`mode=[serial,mgrit]` trained mgrit alone, unsaid; `optimizer=[sgd,adam]` failed
    in a merge of schemas (held-out): Hydra merges a list of a group's options."""
    from lptrain.config import check_command
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ConfigError, match=re.escape(
            f"{override}: {key} is a config group: a run takes one of its options; a "
            f"sweep over them needs -m {key}=")):
        check_command([override])


def test_a_sweeps_split_is_checked_on_the_commands_ranks_before_any_job():
    """`mpiexec -n 2 lptrain -m mode=mgrit parallel.layer_ranks=1,3`: job 0 trained,
    then job 1 was refused (README: a bad value of a sweep is found before any job)."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match=re.escape(
            "parallel.layer_ranks=3: must divide the job's 2 ranks (choose one of 1, 2)")):
        check_command(["-m", "mode=mgrit", "parallel.layer_ranks=1,3"], ranks=2)
    with pytest.raises(ConfigError, match=r"parallel.layer_ranks=4: only 2 C-intervals"):
        check_command(["-m", "mode=mgrit", "network.layers=64,8", "parallel.layer_ranks=4"],
                      ranks=4)
    check_command(["-m", "mode=mgrit", "parallel.layer_ranks=1,2"], ranks=2)
    # a split only one combination cannot take (value by value, each was fine): every
    # combination of the keys a split depends on is tried
    with pytest.raises(ConfigError, match=r"parallel.layer_ranks=2: only 1 layer step "
                                          r"\(MGRIT has one level\)"):
        check_command(["-m", "mode=mgrit", "network.layers=64,1", "parallel.layer_ranks=1,2"],
                      ranks=2)
    # a group that sets cfactor0 and levels joins them (review)
    with pytest.raises(ConfigError, match=r"parallel.layer_ranks=4: only 2 C-intervals"):
        check_command(["-m", "mode=mgrit", "network.layers=8", "mgrit=paper,default",
                       "parallel.layer_ranks=1,4"], ranks=4)
    from lptrain.config import sweep_samples
    assert sweep_samples(["network.layers=64,1", "parallel.layer_ranks=1,2", "seed=1,2"]) == [
        ["network.layers=64", "parallel.layer_ranks=1", "seed=1"],
        ["network.layers=1", "parallel.layer_ranks=1", "seed=1"],
        ["network.layers=64", "parallel.layer_ranks=2", "seed=1"],
        ["network.layers=64", "parallel.layer_ranks=1", "seed=2"],
        ["network.layers=1", "parallel.layer_ranks=2", "seed=1"]]


def test_a_sweep_closes_with_its_jobs_its_best_and_the_report_command():
    from lptrain.sweeps import JobResult, sweep_summary
    jobs = [JobResult(0, ("optimizer=sgd", "optimizer.lr=0.1"), 1.3455),
            JobResult(1, ("optimizer=sgd", "optimizer.lr=1e9"), None),        # diverged
            JobResult(2, ("optimizer=sgd", "optimizer.lr=0.01"), float("nan")),  # ran
            JobResult(3, ("optimizer=sgd", "optimizer.lr=0.05"), 0.91234567)]
    assert sweep_summary("multirun/x", jobs, "lptrain-report multirun/x") == (
        "sweep of 4 jobs in multirun/x: 3 finished, 1 failed; lowest final objective "
        "0.912346 (#3 optimizer.lr=0.05); plots and a table of all: "
        "`lptrain-report multirun/x`")
    assert sweep_summary("s", jobs[1:2], "lptrain-report s") == (
        "sweep of 1 job in s: 0 finished, 1 failed; plots and a table of all: "
        "`lptrain-report s`")
    assert "(#0)" in sweep_summary("s", jobs[:1], "r")   # one job: nothing tells it apart
    # Peaks' objective is no measure of MNIST's (held-out, stop 64)
    mixed = [JobResult(0, ("dataset=peaks", "seed=1"), 0.3),
             JobResult(1, ("dataset=mnist", "seed=1"), 0.1)]
    assert sweep_summary("s", mixed, "r") == (
        "sweep of 2 jobs in s: 2 finished, 0 failed; no lowest named: the jobs train other "
        "datasets; plots and a table of all: `r`")


def test_the_closing_line_names_only_the_settings_the_best_job_read():
    """`-m mode=serial,simultaneous mgrit.cfactor0=2,4` named the serial job by
    `mode=serial mgrit.cfactor0=2`, a setting it did not read (held-out, stop 64)."""
    from helpers import composed
    from lptrain.sweeps import JobResult, sweep_summary, unread
    serial = ("mode=serial", "mgrit.cfactor0=2")
    cfg = composed(*serial)
    assert unread(cfg, serial) == ("mgrit.cfactor0=2",)
    assert unread(None, serial) == ()
    jobs = [JobResult(0, serial, 0.2, unread(cfg, serial)),
            JobResult(1, ("mode=simultaneous", "mgrit.cfactor0=4"), 0.3)]
    assert "(#0 mode=serial);" in sweep_summary("s", jobs, "r")


def test_the_report_command_can_be_pasted(monkeypatch, tmp_path):
    """The closing line said `lptrain-report /tmp/sw 1` (a space, unquoted) and the bare
    name where the environment's bin is not on PATH (held-out)."""
    import sys
    from lptrain.errors import report_command
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "lptrain-report").write_text("#!/bin/sh\n")
    (bin_dir / "lptrain-report").chmod(0o755)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setenv("PATH", "/usr/bin")
    assert report_command("/tmp/sw 1") == f"{bin_dir / 'lptrain-report'} '/tmp/sw 1'"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin")
    assert report_command("multirun/x") == "lptrain-report multirun/x"
    assert report_command("-dash") == "lptrain-report ./-dash"     # not an option


def test_a_glob_over_a_group_is_checked_as_the_choices_it_takes():
    """`optimizer=glob(sgd) optimizer.momentum=0.5,0.9` was refused against the default
    lbfgs (the glob was left out of the check), and `mode=glob(*)` ran its schema node
    as a job that failed (held-out, stop 64)."""
    from lptrain.config import check_command
    check_command(["-m", "optimizer=glob(sgd)", "optimizer.momentum=0.5,0.9"])
    with pytest.raises(ConfigError, match=r"^optimizer.momentum=1.5: must be in \[0, 1\)$"):
        check_command(["-m", "optimizer=glob(sg*,exclude=*_schema)",
                       "optimizer.momentum=0.5,1.5"])
    with pytest.raises(ConfigError) as err:
        check_command(["-m", "mode=glob(*)"])
    assert str(err.value) == ("mode=glob(*): takes mode_schema, the schema the mode "
                              "configs extend, not a choice; leave it out with exclude, "
                              "e.g. mode='glob(*,exclude=*_schema)'")
    check_command(["-m", "mode=glob(*,exclude=*_schema)"])


@pytest.mark.parametrize("typed, shown", [
    ("1e0", "1e0"), ("2.5", "2.5"), ("1e0,2", "1e0"), ("choice(3,2.0)", "2.0")])
def test_an_integer_key_given_a_float_names_what_was_typed(typed, shown):
    """train.iterations=1e0 said "Value '1.0' of type 'float' could not be converted to
    Integer": a value the user had not typed. The message names the typed one (in a
    sweep, the element that reads as a float)."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError) as err:
        check_command([f"train.iterations={typed}"])
    assert str(err.value) == (f"train.iterations={typed}: {shown} is read as a float, and "
                              f"train.iterations takes an integer (digits only, e.g. 300)")


def test_an_integer_key_given_twice_names_the_value_hydra_refused():
    """Hydra converts a key's overrides in order and refuses the first bad one: the hint
    named the key's first override ('network.width=4 network.width=abc': '4 is read as
    a float'), then its last ('train.iterations=2.5 train.iterations=3': Hydra's raw
    message). It names the override holding the refused value; a non-number or a list
    keeps Hydra's message."""
    from lptrain.config import check_command
    for args, want in (
            (["network.width=4", "network.width=abc"], "Value 'abc'"),
            (["network.width=abc", "network.width=2.5"], "Value 'abc'"),
            (["train.iterations=2.5", "train.iterations=3"],
             "train.iterations=2.5: 2.5 is read as a float"),
            (["train.iterations=2.5", "train.iterations=2.7"],
             "train.iterations=2.5: 2.5 is read as a float"),
            (["train.iterations=[2.5]"], "type 'list'")):
        with pytest.raises(ConfigError) as err:
            check_command(args)
        assert want in str(err.value), (args, str(err.value))
