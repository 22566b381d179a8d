"""A failure on one rank ends every rank: 2-rank runs whose rank-0-only file operations
fail (reopening a damaged metrics.h5, reading a damaged checkpoint, creating metrics.h5
on a disk without lptrain's reserve) end with one line and one exit status, within a timeout, instead of
leaving the other rank waiting in its first collective. A full disk at a checkpoint is
named as such, and a lean checkpoint keeps the finished iterations to resume."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

import numpy as np
import pytest

from launch import lptrain
from lptrain.errors import FAILED, REFUSED
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import load_model
from lptrain.train.checkpoint import CHECKPOINT_FILE, load_checkpoint

pytestmark = pytest.mark.cli

TIMEOUT = 60
OVERRIDES = ".hydra/overrides.yaml"
TINY = ["network.layers=4", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "eval_every=1000000", "optimizer=adam"]


def _one_line(proc, status, *needles):
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == status, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 2-rank run of 2 iterations and its intact files."""
    run_dir = tmp_path_factory.mktemp("faults") / "run"
    proc = lptrain([f"hydra.run.dir={run_dir}", *TINY, "train.iterations=2"], ranks=2,
                   timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    return run_dir, {name: (run_dir / name).read_bytes()
                     for name in (ms.FILE_NAME, CHECKPOINT_FILE, OVERRIDES)}


# Each file is read by its own code path on rank 0: its first damage is resumed on 2 ranks
# (every rank must end), its other damages on 1 rank (the message and the files kept; the
# way the other rank ends is that of the file's first case), as one rank is far cheaper.
@pytest.mark.parametrize("name, damage, needle, ranks", [
    (ms.FILE_NAME, "random", "cannot reopen metrics file", 2),
    (ms.FILE_NAME, "half", "cannot reopen metrics file", 1),
    # HDF5 took an empty file for a new one: the run resumed and lost the earlier rows
    (ms.FILE_NAME, "empty", "cannot reopen metrics file (not an HDF5 file, 0 bytes)", 1),
    (CHECKPOINT_FILE, "random", "unreadable checkpoint", 2),
    (CHECKPOINT_FILE, "empty", "unreadable checkpoint", 1),
    (OVERRIDES, "random", "unreadable", 2),      # was a UnicodeDecodeError traceback
    # cut inside an item: was Hydra's "Error parsing override 'dataset'", no file named
    (OVERRIDES, "cut", "'dataset' is not an override", 1),
])
def test_resume_from_a_damaged_file_ends_every_rank(finished, name, damage, needle, ranks):
    """... and leaves every file as it was: Hydra had rewritten .hydra/ with the refused
    resume's train.iterations=4, which the next plain resume then aimed at."""
    run_dir, intact = finished
    for other, data in intact.items():
        (run_dir / other).write_bytes(data)
    data = intact[name]
    (run_dir / name).write_bytes({"random": os.urandom(5000), "half": data[:len(data) // 2],
                                  "empty": b"", "cut": data[:data.index(b"dataset") + 7]
                                  }[damage])
    before = _files(run_dir)
    proc = lptrain([f"resume={run_dir}", "train.iterations=4"], ranks=ranks, timeout=TIMEOUT)
    _one_line(proc, REFUSED, str(run_dir / name), needle)
    assert _files(run_dir) == before


def _files(run_dir):
    """Every file of the run but its log (which records the refusal), with its bytes."""
    return {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*")
            if p.is_file() and p.name != "lptrain.log"}


@contextlib.contextmanager
def _tmpfs(tmp_path, size: str):
    """A tmpfs of `size` mounted for the block (skips where mounting needs root)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
            capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_no_room_for_the_metrics_file_ends_every_rank(tmp_path):
    with _tmpfs(tmp_path, "2m") as mnt:
        proc = lptrain([f"hydra.run.dir={mnt / 'run'}", *TINY, "train.iterations=2"],
                       ranks=2, timeout=TIMEOUT)
    _one_line(proc, FAILED, "cannot create metrics file", "bytes free")


def test_a_full_disk_at_the_first_checkpoint_keeps_a_lean_one_to_resume(tmp_path):
    # the warm starts of 5000 Peaks samples (width 16: 13 MB at the C-points) do not fit
    # (before: no checkpoint at all, so the finished iterations were lost)
    # an explicit split: the automatic one times kernels once per host (a line more)
    args = ["mode=simultaneous", "checkpoint_every=2", "network.width=16",
            "parallel.layer_ranks=2"]
    with _tmpfs(tmp_path, "8m") as mnt:
        run = mnt / "run"
        proc = lptrain([f"hydra.run.dir={run}", *args, "train.iterations=4"], ranks=2,
                       timeout=TIMEOUT)
        _one_line(proc, FAILED, f"{run / CHECKPOINT_FILE}: cannot write (No space left on "
                  f"device); wrote checkpoint.pt of iteration 2 without the warm starts "
                  f"instead (a resume's MGRIT solves start cold); once fixed, resume with: "
                  f"mpiexec -n 2 lptrain resume={run}")
        assert proc.stderr.count("resume=") == 1         # said twice in 400 characters
        record = load_checkpoint(run / CHECKPOINT_FILE, 0)
        assert (record["iteration"], record["warm_starts"]) == (2, False)
        assert record["oracle"]["cache"] == []            # nothing left of the warm starts
        assert load_model(run, "last").iteration == 2
        # the space is freed: the run continues from the lean checkpoint, cold
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        again = lptrain([f"resume={run}", "train.iterations=4"], ranks=2, timeout=TIMEOUT)
        assert again.returncode == 0, again.stderr
        m = read_metrics(run / ms.FILE_NAME)
    assert m.status == ms.COMPLETED
    np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, 5))
    assert np.all(np.isfinite(m.train[ms.OBJECTIVE]))


def test_a_rank_that_fails_before_mpi_starts_ends_the_job(tmp_path):
    """Rank 1 failing to import torch (a memory limit) left rank 0 in MPI_Init for ever,
    deaf to SIGTERM and Ctrl-C (held-out, stop 64): it now says so and aborts the job."""
    from launch import ENV, LPTRAIN, MPIEXEC
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("libtorch_cpu.so: failed to map '
                                      'segment from shared object")\n')
    wrapper = tmp_path / "rank1.sh"
    wrapper.write_text(f'#!/bin/sh\n[ "$PMI_RANK" = 1 ] && export PYTHONPATH='
                       f'{fake.parent}:"$PYTHONPATH"\nexec {LPTRAIN} "$@"\n')
    wrapper.chmod(0o755)
    proc = subprocess.run(["timeout", "150", MPIEXEC, "-n", "2", str(wrapper), *TINY,
                           f"hydra.run.dir={tmp_path / 'run'}"], env=ENV,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == FAILED, proc.stderr          # not 124: no hang
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("lptrain: ")]
    assert ours == ["lptrain: error: rank 1: ImportError: libtorch_cpu.so: failed to map "
                    "segment from shared object (while starting, before MPI)"], proc.stderr
