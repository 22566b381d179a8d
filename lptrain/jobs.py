"""Jobs under MPI: rank 0 alone runs Hydra; the other ranks run the jobs it hands them.

Hydra and any sweeper plugin run on rank 0 only, so a sweeper that samples (Optuna)
decides each job once and sees each job's objective once. Rank 0 sends every other rank
the job's composed configuration, its interpolations resolved on rank 0, and all ranks
train it together; after the last job rank 0 sends the command's exit status. Messages go
point to point on a duplicate of the communicator, apart from those of the jobs, and a
rank waiting for rank 0 (while its sweeper samples or Hydra writes files) polls and sleeps
instead of spinning in a blocking receive.
"""
from __future__ import annotations

import copy
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

_TAG = 1
JOB, END = "job", "end"


@dataclass(frozen=True)
class Job:
    """What a rank needs to run one job as rank 0's Hydra runs it."""

    cfg: Any                   # the job's config (a DictConfig typed by the schema), resolved
    run_dir: str               # the job's output directory; only rank 0 writes there
    cwd: str = ""              # rank 0's working directory in the job (hydra.job.chdir)
    env: dict = field(default_factory=dict)   # variables the job sets (hydra.job.env_set)
    resume: bool = False       # continue the checkpoint in run_dir (resume=)
    sweep_dir: str = ""        # the multirun's directory ("" for a single run)
    typed: tuple = ()          # the job's command-line overrides (Hydra's overrides.task)

    @classmethod
    def of_hydra(cls, cfg, hydra_cfg, resume: bool = False) -> Job:
        """The job Hydra is running (rank 0, inside the task function)."""
        from hydra.types import RunMode
        from omegaconf import OmegaConf
        resolved = copy.deepcopy(cfg)      # ${now:}, ${oc.env:} ... take rank 0's values
        OmegaConf.resolve(resolved)
        _from_launch_dir(resolved, str(hydra_cfg.runtime.cwd))
        sweep = ""
        if hydra_cfg.mode == RunMode.MULTIRUN:     # as typed: relative to where it started
            sweep = os.path.join(str(hydra_cfg.runtime.cwd), str(hydra_cfg.sweep.dir))
        return cls(resolved, str(hydra_cfg.runtime.output_dir), os.getcwd(),
                   {str(k): str(v) for k, v in hydra_cfg.job.env_set.items()}, resume,
                   sweep, tuple(str(o) for o in hydra_cfg.overrides.task))

    @contextmanager
    def entered(self):
        """Rank 0's working directory and job variables for the job's duration (what
        Hydra sets up for rank 0; the other ranks run no Hydra). A rank on a node that
        does not see rank 0's directory stays in its own."""
        old_cwd, old_env = os.getcwd(), {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        if self.cwd and self.cwd != old_cwd:
            try:
                os.chdir(self.cwd)
            except OSError:
                pass
        try:
            yield self
        finally:
            os.chdir(old_cwd)
            for key, value in old_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def _from_launch_dir(cfg, launched: str) -> None:
    """A relative dataset.path read from the directory the command was started in where
    the job runs elsewhere (hydra.job.chdir=true) and finds it only there: it was
    looked for in the run directory and refused."""
    path = cfg.get("dataset", {}).get("path")
    if not path or os.path.isabs(path) or os.path.realpath(launched) == os.getcwd():
        return
    here = os.path.join(launched, path)
    if os.path.exists(here) and not os.path.exists(path):
        cfg.dataset.path = here


class JobChannel:
    """Rank 0 announces each job and, at the end, the exit status; the others receive.

    `busy` is true on rank 0 while a job runs: a job that ends the command (a signal
    every rank agreed on) ends it on every rank at once, and no end message follows.
    """

    def __init__(self, comm, poll: float = 0.05):
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.comm = comm.Dup() if self.size > 1 else None   # collective
        self.poll, self.busy = poll, False

    def announce(self, job: Job) -> None:
        """Rank 0: every other rank runs `job` next."""
        self._send((JOB, job))

    def finish(self, status: int) -> None:
        """Rank 0: no more jobs; the other ranks exit with `status`."""
        self._send((END, int(status)))

    def _send(self, message) -> None:
        if self.size == 1:
            return
        for request in [self.comm.isend(message, dest=r, tag=_TAG)
                        for r in range(1, self.size)]:
            request.wait()

    def receive(self) -> tuple[str, Any]:
        """Other ranks: rank 0's next message, (JOB, Job) or (END, status)."""
        wait = 0.001
        while not self.comm.Iprobe(source=0, tag=_TAG):
            time.sleep(wait)
            wait = min(2 * wait, self.poll)
        return self.comm.recv(source=0, tag=_TAG)
