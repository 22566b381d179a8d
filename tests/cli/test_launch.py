"""How lptrain starts: fail-fast errors before data loading, foreign MPI launchers, threads.

Every error must be one line `lptrain: error: ...`, the same on any number of ranks,
with no traceback and no MPI abort message.
"""
from __future__ import annotations

import subprocess

import pytest

from launch import ENV, LPTRAIN, lptrain

pytestmark = pytest.mark.cli
TIMEOUT = 120
PREFIX = "lptrain: error: "


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(PREFIX), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "Abort" not in proc.stderr + proc.stdout
    return lines[0][len(PREFIX):]


@pytest.mark.parametrize("ranks", [1, 2])
def test_cuda_without_cuda_is_a_one_line_config_error(ranks, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = lptrain(["device=cuda", "hydra.run.dir=run"], tmp_path, ranks, TIMEOUT)
    assert _one_line_error(proc).startswith("device='cuda': no CUDA device")
    assert not (tmp_path / "run" / "metrics.h5").exists()


def test_an_impossible_run_names_its_memory_estimate_and_the_limit(tmp_path):
    proc = lptrain(["network.layers=10000000", "hydra.run.dir=run"], tmp_path, 1, TIMEOUT)
    msg = _one_line_error(proc)
    assert msg.startswith("memory: 1 rank(s) as 1 layer x 1 data ranks need about ")
    assert " GB (states " in msg and "GB available to each" in msg


def test_a_split_that_does_not_divide_the_ranks_fails_on_every_rank_alike(tmp_path):
    # `mpiexec -n 2 lptrain` itself (the other 2-rank runs share the ranks of one launch)
    proc = lptrain(["mode=simultaneous", "parallel.layer_ranks=3", "hydra.run.dir=run"],
                   tmp_path, 2, TIMEOUT, fresh=True)
    assert _one_line_error(proc) == ("parallel.layer_ranks=3: must divide the job's 2 "
                                     "ranks (choose one of 1, 2)")


@pytest.mark.parametrize("variable", ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK"])
def test_a_foreign_launcher_is_named_before_mpi_starts(variable, tmp_path):
    env = {**ENV, variable: "0"}
    proc = subprocess.run([LPTRAIN, "hydra.run.dir=run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    msg = _one_line_error(proc)
    assert msg.startswith(f"started by Open MPI's launcher ({variable} is set), but "
                          f"lptrain's mpi4py is built for MPICH")
    assert "/mpirun -n P " in msg and "/mpiexec" in msg
    assert not (tmp_path / "run").exists()


def test_rank_pids_survives_a_rank_that_exits_while_it_looks(monkeypatch):
    """The signal tests poll a launch's ranks while they exit: a process that goes away
    between the existence check and the directory read has no children (this raised
    FileNotFoundError in CI)."""
    import os
    from launch import rank_pids
    proc = subprocess.Popen(["sleep", "30"])
    try:
        gone = f"/proc/{proc.pid}/task"

        def vanish(real):
            def read(path=".", *a):
                if str(path).startswith(gone):
                    raise FileNotFoundError(2, "No such file or directory", str(path))
                return real(path, *a)
            return read
        monkeypatch.setattr(os, "scandir", vanish(os.scandir))
        monkeypatch.setattr(os, "listdir", vanish(os.listdir))
        assert rank_pids(proc.pid) == {}
    finally:
        proc.kill()
        proc.wait()
