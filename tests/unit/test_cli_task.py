"""The Hydra task of the lptrain command, called in process: it returns the final
objective, which is what sweeper plugins (e.g. Optuna) minimise."""
import copy
import re

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from helpers import composed
from lptrain import cli, job_run
from lptrain.errors import REFUSED, ConfigError
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

TINY = ["network.layers=4", "network.width=4", "dataset.n_train=100", "dataset.n_val=20",
        "train.iterations=3", "seed=2"]


def _job(tmp_path, overrides):
    cfg = composed(*overrides, hydra_node=True)
    OmegaConf.update(cfg, "hydra.runtime.output_dir", str(tmp_path), force_add=True)
    HydraConfig.instance().set_config(cfg)
    task = copy.deepcopy(cfg)
    with open_dict(task):
        del task["hydra"]
    return task


@pytest.mark.parametrize("mode", ["serial", "simultaneous"])
def test_task_returns_the_final_objective(mode, tmp_path):
    value = cli._task(_job(tmp_path, [*TINY, f"mode={mode}"]))
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert m.status == ms.COMPLETED
    assert isinstance(value, float)
    assert value == m.train[ms.OBJECTIVE][-1]


def test_task_returns_none_when_the_run_fails(tmp_path, capsys):
    failures = list(cli._failures)
    try:
        value = cli._task(_job(tmp_path, [*TINY, "dataset=indian_pines",
                                          "dataset.path=/nonexistent"]))
    finally:
        cli._failures[:] = failures
    assert value is None
    assert "lptrain: error: " in capsys.readouterr().err


def test_task_refuses_a_schema_node_a_sweeper_chose(tmp_path, capsys):
    """A job whose choices Hydra made without lptrain's pre-check (a sweeper plugin's)."""
    failures = list(cli._failures)
    try:
        value = cli._task(_job(tmp_path, [*TINY, "mode=mode_schema"]))
        refused = cli._failures[len(failures):]
    finally:
        cli._failures[:] = failures
    assert value is None and refused == [REFUSED]
    assert capsys.readouterr().err.startswith("lptrain: error: mode=mode_schema: the schema")
    assert not (tmp_path / ms.FILE_NAME).exists()


def test_a_sweeps_refused_job_counts_as_failed_in_its_closing_line(tmp_path, capsys):
    """`-m 'optimizer=glob(adam*)'` also launches adam_schema, which is refused; the
    sweep's closing line said '2 jobs: 2 finished, 0 failed' of the 3."""
    from hydra.types import RunMode
    failures, results = list(cli._failures), list(cli._results)
    task = _job(tmp_path, [*TINY, "optimizer=adam_schema"])
    hydra = copy.deepcopy(HydraConfig.get())
    OmegaConf.set_readonly(hydra, False)
    hydra.mode, hydra.job.num = RunMode.MULTIRUN, 2
    HydraConfig.instance().set_config(OmegaConf.create({"hydra": hydra}))
    try:
        assert cli._task(task) is None
        added = cli._results[len(results):]
    finally:
        cli._failures[:], cli._results[:] = failures, results
    assert [(r.number, r.objective) for r in added] == [(2, None)]
    assert "optimizer=adam_schema: the schema" in capsys.readouterr().err


def test_a_globbed_job_that_mixes_an_experiment_with_a_group_is_refused(tmp_path, capsys):
    """`-m experiment=peaks_paper 'network=glob(dense_w*)'` ran the mix that the command
    line and choice() are refused for: the check before the jobs cannot expand glob()."""
    failures = list(cli._failures)
    task = _job(tmp_path, ["experiment=peaks_paper", "network=dense_wide"])
    hydra = copy.deepcopy(HydraConfig.get())
    OmegaConf.set_readonly(hydra, False)
    hydra.overrides.task = ["experiment=peaks_paper", "network=dense_wide"]
    HydraConfig.instance().set_config(OmegaConf.create({"hydra": hydra}))
    try:
        assert cli._task(task) is None
        refused = cli._failures[len(failures):]
    finally:
        cli._failures[:] = failures
    assert refused == [REFUSED]
    assert capsys.readouterr().err.startswith("lptrain: error: network=dense_wide: "
                                              "experiment=peaks_paper sets network.width")
    assert not (tmp_path / ms.FILE_NAME).exists()


def test_hydra_raises_to_lptrain_unless_the_user_asked_for_its_traceback():
    from lptrain.command_args import FULL_ERROR, hydra_raising
    environ = {}
    with hydra_raising(environ) as ours:
        assert ours and environ[FULL_ERROR] == "1"
    assert environ == {}
    environ = {FULL_ERROR: "1"}
    with hydra_raising(environ) as ours:
        assert not ours
    assert environ == {FULL_ERROR: "1"}
    environ = {FULL_ERROR: "0"}                  # Hydra shows no traceback for that
    with hydra_raising(environ) as ours:
        assert ours and environ[FULL_ERROR] == "1"
    assert environ == {FULL_ERROR: "0"}


def test_a_sweeper_that_gives_up_is_one_line_with_the_jobs_statuses(tmp_path):
    """Optuna's sweeper names a best trial after its last job; where every job failed it
    raises, and Hydra printed that traceback (exit 1) after the jobs' own lines."""
    from lptrain.command_args import HYDRA_TRACE, hydra_failure
    try:
        raise ValueError("No trials are completed yet.")
    except ValueError as exc:
        line, status = hydra_failure(exc, str(tmp_path), [REFUSED, REFUSED], 2)
    assert line == ("the sweeper ended the sweep: ValueError: No trials are completed yet. "
                    f"(2 of its 2 jobs failed: their lines above); traceback in "
                    f"{tmp_path / HYDRA_TRACE}")
    assert status == REFUSED
    assert "raise ValueError" in (tmp_path / HYDRA_TRACE).read_text()
    line, status = hydra_failure(RuntimeError("plugin bug"), str(tmp_path / "gone"), [], 0)
    assert line == "the sweeper ended the sweep: RuntimeError: plugin bug" and status == 1
    line, _ = hydra_failure(OSError(5, "Input/output error"), str(tmp_path), [], 1, False)
    assert line.startswith("Hydra ended the run: OSError: [Errno 5] Input/output error")


def test_hydras_own_error_is_a_refusal_in_one_line(tmp_path):
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ConfigKeyError

    from lptrain.command_args import hydra_failure
    cause = ConfigKeyError("Key 'foo' not in 'BasicSweeperConf'")
    cause.full_key = "hydra.sweeper.foo"
    exc = ConfigCompositionException("Could not override 'hydra.sweeper.foo'.\nTo append")
    exc.__cause__ = cause
    assert hydra_failure(exc, str(tmp_path), [], 0) == (
        "hydra.sweeper.foo: Key 'foo' not in 'BasicSweeperConf'", REFUSED)


def test_a_full_disk_under_hydra_names_the_directory_and_logs_no_report(tmp_path, capsys):
    """A disk full while Hydra wrote the run's files: 'Hydra ended the run: OSError:
    [Errno 28] No space left on device' named no file; and lptrain.log's failing write
    printed logging's 65-line '--- Logging error ---' after the one line."""
    import errno
    import logging

    from lptrain.command_args import hydra_failure
    from lptrain.errors import FAILED
    full = OSError(errno.ENOSPC, "No space left on device")
    line, status = hydra_failure(full, str(tmp_path), [], 1, sweep=False)
    assert line.startswith("Hydra ended the run: OSError: [Errno 28] No space left on "
                           f"device (writing in {tmp_path}); traceback in ")
    assert status == FAILED

    class Full(logging.Handler):
        def emit(self, record):
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:
                self.handleError(record)
    log = logging.getLogger("lptrain.test.full")
    log.addHandler(Full())
    before = logging.raiseExceptions
    try:
        cli.quiet_logging_errors()
        log.error("a line")
    finally:
        logging.raiseExceptions = before
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("given", ["train.iterations=2,3", "train.iterations=range(3,5)",
                                   "eval_every=choice(1,2)"])
def test_a_resume_refuses_a_sweep_of_new_values(given, tmp_path):
    """`resume=SWEEP train.iterations=2,3` renumbered the sweep's jobs: a job kept from
    before then stood for another job (its objective went to the sweeper)."""
    from lptrain.errors import ConfigError
    with pytest.raises(ConfigError, match=r"with resume= each key takes one value"):
        cli._resume_args([f"resume={tmp_path}", given])
    assert not cli._sweep and not cli._resuming


def test_a_sweeps_job_resumed_alone_keeps_its_job_number(monkeypatch, tmp_path):
    """`lptrain resume=SWEEP/1`: Hydra rewrote the job's record without its number (the
    sweep's job directories then missed it; its `seed=${hydra:job.num}` was refused)."""
    from lptrain.train.checkpoint import CHECKPOINT_FILE
    monkeypatch.setattr(cli, "_resuming", [])
    job = tmp_path / "1"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- seed=${hydra:job.num}\n"
                                                   "- train.iterations=3\n")
    (job / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    num: 1\n")
    (job / CHECKPOINT_FILE).write_bytes(b"")
    args = cli._resume_args([f"resume={job}", "train.iterations=6"])
    assert args[:3] == ["seed=${hydra:job.num}", "train.iterations=6", "hydra.job.num=1"]
    (job / ".hydra" / "hydra.yaml").write_text("hydra:\n  job:\n    num: ???\n")
    assert not any(a.startswith("hydra.job.num") for a in
                   cli._resume_args([f"resume={job}"]))      # a single run: none


def test_a_signal_before_a_sweeps_job_stops_the_sweep_there(tmp_path, capsys):
    """Ctrl-C while Hydra set a sweep up, or while a resumed sweep passed over its
    finished jobs, started the next job (interrupted after its first iteration)."""
    import signal

    from lptrain import stops
    from lptrain.rundir import SWEEP_FILE
    from lptrain.train.stop import StopSignals
    stop = StopSignals()
    stops.stop_before_job(stop, tmp_path, 1, 0)          # no signal: the sweep goes on
    stop.received = signal.SIGINT
    with pytest.raises(SystemExit) as exc:
        stops.stop_before_job(stop, tmp_path, 2, 0)
    assert exc.value.code == 130
    assert capsys.readouterr().err == ("lptrain: interrupted by SIGINT before job 0; its "
                                       "sweeper saved nothing to carry it on: sweep again\n")
    (tmp_path / SWEEP_FILE).write_text("hydra: {}\n")
    stop.received = signal.SIGTERM
    with pytest.raises(SystemExit) as exc:
        stops.stop_before_job(stop, tmp_path, 2, 3)
    assert exc.value.code == 143
    assert capsys.readouterr().err == (f"lptrain: interrupted by SIGTERM before job 3; "
                                       f"resume with: mpiexec -n 2 lptrain resume={tmp_path}\n")


def test_the_task_of_a_sweeps_job_checks_for_a_signal_first(tmp_path, capsys, monkeypatch):
    import signal

    from hydra.types import RunMode

    from lptrain.train.stop import StopSignals
    task = _job(tmp_path / "0", TINY)
    hydra = copy.deepcopy(HydraConfig.get())
    OmegaConf.set_readonly(hydra, False)
    hydra.mode, hydra.job.num, hydra.sweep.dir = RunMode.MULTIRUN, 0, str(tmp_path)
    HydraConfig.instance().set_config(OmegaConf.create({"hydra": hydra}))
    stop = StopSignals()
    stop.received = signal.SIGINT
    monkeypatch.setattr(cli, "_stop", [stop])
    monkeypatch.setattr(cli, "_jobs", [0])
    with pytest.raises(SystemExit) as exc:
        cli._task(task)
    assert exc.value.code == 130
    assert "interrupted by SIGINT before job 0" in capsys.readouterr().err
    assert not (tmp_path / "0").exists()


def test_a_resumed_runs_own_split_these_ranks_cannot_take_says_how_to_give_another(
        monkeypatch, tmp_path):
    """`lptrain resume=DIR` on 1 rank of a run split 2 x 1: the refusal named a key the
    user never typed and no way out."""
    message = "parallel.layer_ranks=2: the job has 1 rank; start it with mpiexec -n P for P ranks"
    monkeypatch.setattr(cli, "_resuming", [tmp_path])
    monkeypatch.setattr(cli, "_typed", [f"resume={tmp_path}", "train.iterations=4"])
    assert cli._split_hint(message, 1) == (" (the run's own split: give parallel.layer_ranks="
                                        "... with resume= for these ranks)")
    monkeypatch.setattr(cli, "_typed", [f"resume={tmp_path}", "parallel.layer_ranks=2"])
    assert cli._split_hint(message, 1) == ""           # typed: the message says it all
    monkeypatch.setattr(cli, "_resuming", [])
    assert cli._split_hint(message, 1) == ""           # not a resume
    # one job of a sweep whose seeds are its job numbers: resumed alone it has none
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    monkeypatch.setattr(cli, "_resuming", [tmp_path / "1"])
    assert cli._split_hint("seed: ...: a single run has no job number (a sweep's "
                           "${hydra:job.num}: -m)", 2) == f"; resume its sweep: mpiexec " \
        f"-n 2 lptrain resume={tmp_path}"


def test_overrides_after_a_flag_are_taken_and_a_bad_flag_is_one_line(monkeypatch, tmp_path,
                                                                     capsys):
    """`lptrain seed=3 --cfg job dataset=mnist` and `lptrain seed=3 -m seed=4,5` were
    'unrecognized arguments' (Hydra's parser takes the overrides as one list); a bad flag
    (`--foo`, `--cfg bogus`) printed Hydra's 7-line usage after a directory was made."""
    from lptrain.command_args import check_flags, overrides_first
    assert overrides_first(["seed=3", "--cfg", "job", "dataset=mnist", "-m", "a=1,2"]) == \
        ["seed=3", "dataset=mnist", "a=1,2", "--cfg", "job", "-m"]
    check_flags(overrides_first(["seed=3", "--cfg", "job", "dataset=mnist"]))
    assert overrides_first(["seed=3", "--cfg", "job", "~train.patience"]) == \
        ["seed=3", "~train.patience", "--cfg", "job"]          # a deletion too (review)
    check_flags(["seed=3", "-m", "--info", "config"])
    with pytest.raises(ConfigError, match=r"^unrecognized arguments: --foo \(lptrain "
                                           r"--help lists the options\)$"):
        check_flags(["seed=3", "--foo"])
    with pytest.raises(ConfigError, match=r"argument --cfg/-c: invalid choice: 'bogus'"):
        check_flags(["--cfg", "bogus"])
    monkeypatch.chdir(tmp_path)
    assert cli._lead(["seed=3", "--foo"], 1) == REFUSED
    assert capsys.readouterr().err == ("lptrain: error: unrecognized arguments: --foo "
                                       "(lptrain --help lists the options)\n")
    assert list(tmp_path.iterdir()) == []        # no run directory made


def test_a_resume_of_a_folder_of_runs_or_of_two_directories_is_refused_as_such(
        monkeypatch, tmp_path):
    """`resume=outputs/DATE` (Hydra's default layout) was called 'a sweep whose sweeper
    saved no multirun.yaml', naming a job 0 that did not exist; a second resume= was
    dropped without a word."""
    from lptrain.errors import InputFileError
    monkeypatch.setattr(cli, "_resuming", [])
    for name in ("10-00-00", "09-00-00"):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    with pytest.raises(InputFileError, match=re.escape(
            f"resume={tmp_path}: not a run's directory; it holds runs: resume one of them "
            f"(resume={tmp_path / '09-00-00'} and 1 more)")):
        cli._resume_args([f"resume={tmp_path}"])
    # a sampler's sweep: its jobs have numbers, the first named
    for num, name in ((3, "10-00-00"), (2, "09-00-00")):
        (tmp_path / name / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {num}\n")
    with pytest.raises(InputFileError, match=re.escape(
            f"resume its jobs one by one (resume={tmp_path / '09-00-00'} ...)")):
        cli._resume_args([f"resume={tmp_path}"])
    with pytest.raises(ConfigError, match=re.escape(
            f"resume={tmp_path} resume=/x: resume= takes one run or sweep directory")):
        cli._resume_args([f"resume={tmp_path}", "resume=/x"])


def test_combined_flags_a_comma_under_cfg_and_a_refused_sweep_leave_nothing(
        monkeypatch, tmp_path, capsys):
    """`-mc job` passed Hydra's parser but not lptrain's reading of -m and --cfg (a run
    directory, then Hydra's usage); `--cfg job network.width=4,8` gave Hydra's 6 lines
    and exit 1; a sweep Hydra refused (a bad --config-name) left its directory."""
    from lptrain.command_args import check_flags
    with pytest.raises(ConfigError, match=r"^-mc: give Hydra's flags one by one"):
        check_flags(["-mc", "job"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "_failures", [])
    assert cli._lead(["--cfg", "job", "network.width=4,8"], 1) == REFUSED
    err = capsys.readouterr().err.splitlines()
    assert err == ["lptrain: error: Ambiguous value for argument 'network.width=4,8'; a ',' "
                   "gives several values: a sweep over them needs -m; quote the value for a "
                   "string or bracket it for a list ([a,b])"]
    assert cli._lead(["-m", "--config-name=nonexist", "hydra.sweep.dir=g3"], 1) == REFUSED
    assert capsys.readouterr().err.startswith("lptrain: error: Cannot find primary config "
                                              "'nonexist'")
    assert list(tmp_path.iterdir()) == []


def test_a_failure_before_training_on_one_rank_ends_every_rank(monkeypatch, tmp_path,
                                                                capsys):
    """An import that failed on rank 1 alone, before its run began, escaped the job's
    handler: rank 0 waited in its first collective until the job was killed."""
    from lptrain.jobs import Job
    from lptrain.mgrit import exchange
    from lptrain.parallel import auto, context

    class RankOneOfTwo:
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

    def broken(timer):
        raise ImportError("cannot import name 'x' from 'lptrain.config'")
    aborted = []
    monkeypatch.setattr(context, "world", RankOneOfTwo)
    monkeypatch.setattr(auto, "install", broken)
    monkeypatch.setattr(exchange, "abort", lambda comm, code: aborted.append(code))
    monkeypatch.setattr(job_run, "RANK0_FIRST", 0.0)
    with pytest.raises(SystemExit) as end:
        cli._run_job(Job(cfg=None, run_dir=str(tmp_path)))
    assert end.value.code == 1 and aborted == [1]
    out = capsys.readouterr()
    assert "rank 1: ImportError: cannot import name 'x'" in out.out + out.err
    assert (tmp_path / "error-rank1.log").is_file()


def test_an_mpi_call_that_failed_says_another_rank_ended(tmp_path):
    """A rank killed during a collective leaves the others with an mpi4py error: the
    line says what most likely happened and, where a checkpoint is on disk, how to carry
    on from it; any other exception keeps its type and message."""
    from lptrain.jobs import Job
    from lptrain.stops import unexpected
    from lptrain.train.checkpoint import CHECKPOINT_FILE
    MPIError = type("Exception", (RuntimeError,), {"__module__": "mpi4py.MPI"})
    job, trace = Job(cfg=None, run_dir=str(tmp_path)), tmp_path / "error-rank0.log"
    lost = unexpected(MPIError("See the MPI_ERROR field"), 0, trace, job, 2)
    assert lost.startswith("rank 0: an MPI call failed, most likely because another rank "
                           "ended") and "MPI says: See the MPI_ERROR field" in lost
    assert str(trace) in lost and "resume" not in lost
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"")
    lost = unexpected(MPIError("x"), 0, None, job, 2)
    assert lost.endswith(f"its last checkpoint is whole: resume with: "
                         f"mpiexec -n 2 lptrain resume={tmp_path}"), lost
    other = unexpected(ValueError("bad\nvalue"), 1, None, job, 2)
    assert other == "rank 1: ValueError: bad ... value"
