"""Jobs under MPI without MPI: what rank 0 hands out, how the others take it, and the
check that every rank runs the same configuration."""
from __future__ import annotations

import hashlib
import os
from collections import defaultdict

import pytest
from omegaconf import OmegaConf

from lptrain import config
from lptrain.app import check_same_everywhere
from lptrain.errors import ConfigError
from lptrain.jobs import END, JOB, Job, JobChannel


def _hydra_cfg(output_dir="out/0", env_set=None, task=(), mode=None, sweep="sweep"):
    return OmegaConf.create({"runtime": {"output_dir": output_dir, "cwd": "/started/here"},
                             "job": {"env_set": env_set or {}}, "mode": mode,
                             "sweep": {"dir": sweep}, "overrides": {"task": list(task)}})


@pytest.mark.parametrize("typed, kept", [("sub/sweep", "/started/here/sub/sweep"),
                                         ("/abs/sweep", "/abs/sweep")])
def test_a_sweeps_job_keeps_its_sweep_directory_where_it_started(typed, kept):
    """hydra.sweep.dir=sub/relsw3: the stop line said 'resume with: lptrain
    resume=sub/relsw3', which works only from the directory the sweep started in."""
    from hydra.types import RunMode
    job = Job.of_hydra(OmegaConf.create({}), _hydra_cfg("/o/0", mode=RunMode.MULTIRUN,
                                                        sweep=typed))
    assert job.sweep_dir == kept


def test_a_job_carries_rank_0s_resolved_values(monkeypatch, tmp_path):
    monkeypatch.setenv("LPTRAIN_TEST_WIDTH", "6")
    cfg = OmegaConf.create({"network": {"width": "${oc.env:LPTRAIN_TEST_WIDTH}"}})
    job = Job.of_hydra(cfg, _hydra_cfg(str(tmp_path), {"A": 1}, ["mode=serial", "+x.y=2"]),
                       resume=True)
    monkeypatch.setenv("LPTRAIN_TEST_WIDTH", "9")     # another rank's environment
    assert job.cfg.network.width == "6"
    assert cfg.network.width == "9"                    # the original is left as it was
    assert (job.run_dir, job.cwd, job.env, job.resume) == (str(tmp_path), os.getcwd(),
                                                           {"A": "1"}, True)
    assert job.typed == ("mode=serial", "+x.y=2")     # what the run's notes are made of


def test_a_relative_data_path_is_read_where_the_command_started(monkeypatch, tmp_path):
    """hydra.job.chdir=true dataset.path=mydata/fm was refused: the path was looked for
    in the run directory, where the job had moved."""
    (tmp_path / "mydata").mkdir()
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")            # Hydra's chdir into the run directory
    hydra = _hydra_cfg(str(tmp_path / "run"))
    hydra.runtime.cwd = str(tmp_path)
    job = Job.of_hydra(OmegaConf.create({"dataset": {"path": "mydata"}}), hydra)
    assert job.cfg.dataset.path == str(tmp_path / "mydata")
    for kept in ("nowhere", str(tmp_path / "mydata")):     # not there; absolute already
        assert Job.of_hydra(OmegaConf.create({"dataset": {"path": kept}}),
                            hydra).cfg.dataset.path == kept
    monkeypatch.chdir(tmp_path)                    # no chdir: the path stays as typed
    hydra.runtime.cwd = str(tmp_path)
    assert Job.of_hydra(OmegaConf.create({"dataset": {"path": "mydata"}}),
                        hydra).cfg.dataset.path == "mydata"


def test_entering_a_job_sets_and_restores_cwd_and_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("LPTRAIN_TEST_KEPT", "before")
    monkeypatch.delenv("LPTRAIN_TEST_NEW", raising=False)
    start = os.getcwd()
    job = Job(None, "run", str(tmp_path), {"LPTRAIN_TEST_KEPT": "in", "LPTRAIN_TEST_NEW": "x"})
    with job.entered():
        assert os.getcwd() == str(tmp_path)
        assert (os.environ["LPTRAIN_TEST_KEPT"], os.environ["LPTRAIN_TEST_NEW"]) == ("in", "x")
    assert os.getcwd() == start
    assert os.environ["LPTRAIN_TEST_KEPT"] == "before" and "LPTRAIN_TEST_NEW" not in os.environ


class _Comm:
    """In-process stand-in for a communicator: point-to-point messages in queues."""

    def __init__(self, rank, size, queues):
        self.rank, self.size, self.queues = rank, size, queues

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Dup(self):
        return self

    def isend(self, message, dest, tag):
        self.queues[(dest, tag)].append(message)
        return type("Done", (), {"wait": lambda self: None})()

    def Iprobe(self, source, tag):
        return bool(self.queues[(self.rank, tag)])

    def recv(self, source, tag):
        return self.queues[(self.rank, tag)].pop(0)


def test_every_other_rank_receives_the_jobs_then_the_status_in_order():
    queues = defaultdict(list)
    lead = JobChannel(_Comm(0, 3, queues))
    jobs = [Job({"seed": s}, f"sweep/{s}") for s in range(2)]
    for job in jobs:
        lead.announce(job)
    lead.finish(2)
    for rank in (1, 2):
        follower = JobChannel(_Comm(rank, 3, queues))
        got = [follower.receive() for _ in range(3)]
        assert got == [(JOB, jobs[0]), (JOB, jobs[1]), (END, 2)]
    assert not any(queues.values())


def test_one_rank_sends_nothing():
    queues = defaultdict(list)
    one = JobChannel(_Comm(0, 1, queues))
    one.announce(Job({}, "run"))
    one.finish(0)
    assert not queues


class _Gather:
    """The ranks' configurations as allgather returns them: digests first, then texts."""

    def __init__(self, texts):
        self.answers = [[hashlib.sha256(t.encode()).hexdigest() for t in texts], list(texts)]

    def allgather(self, obj):
        return self.answers.pop(0)


def _yaml(**overrides):
    _, plain = config.compose([f"{k}={v}" for k, v in overrides.items()])
    return OmegaConf.to_yaml(plain)


def test_ranks_with_the_same_configuration_pass():
    text = _yaml(**{"network.width": 4})
    check_same_everywhere(_Gather([text, text, text]), text)


def test_a_rank_with_another_configuration_is_named_with_the_key():
    a, b = _yaml(**{"network.width": 4}), _yaml(**{"network.width": 6})
    with pytest.raises(ConfigError, match=r"at network\.width: 4 on rank 0, 6 on rank 2"):
        check_same_everywhere(_Gather([a, a, b]), a)


@pytest.mark.parametrize("args, ranks, refused", [
    (["-m", "seed=1,2"], 2, False),
    (["-m", "hydra/launcher=basic", "seed=1,2"], 2, False),
    (["-m", "hydra/launcher=joblib", "seed=1,2"], 1, False),
    (["-m", "hydra/launcher=joblib", "seed=1,2"], 2, True),
])
def test_under_mpiexec_jobs_stay_in_the_ranks_processes(args, ranks, refused):
    from lptrain.command_args import check_launcher
    if refused:
        with pytest.raises(ConfigError, match="hydra/launcher=joblib: under mpiexec"):
            check_launcher(args, ranks)
    else:
        check_launcher(args, ranks)


def test_a_rank_that_cannot_enter_rank_0s_directory_stays_in_its_own(tmp_path):
    start = os.getcwd()
    with Job(None, "run", str(tmp_path / "not-on-this-node")).entered():
        assert os.getcwd() == start
