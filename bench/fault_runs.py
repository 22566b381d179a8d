"""The fault matrix's faults during a run (bench/fault_matrix.py): signals, SIGKILL + resume,
a full disk, an unwritable run directory, two runs in one directory; and the list of all cases.

Each case checks the run's files afterwards (README "Reliability"): metrics rows 1..n with
no gap, the status, the models and the checkpoint at the iteration the run stopped at, and
after SIGKILL a resume that keeps the rows up to the checkpoint and continues from it.
"""
from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np

from fault_cases import (TINY, Fixtures, copy_of, data_cases, option_cases, run_file_cases)
from fault_matrix import Case, Launch, Outcome, command, run_once, shown
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.metrics.writer import RESERVE_BYTES, free_bytes
from lptrain.model.saved import load_model
from lptrain.rundir import LOCK_FILE
from lptrain.train.checkpoint import CHECKPOINT_FILE, load_checkpoint

INT, TERM, KILL = signal.SIGINT, signal.SIGTERM, signal.SIGKILL
LONG = [*TINY, "train.iterations=1000000"]
# 8 layers in two C-intervals: one per rank on 2 ranks, as tests/cli/test_signals.py
SIGNALLED = ["network.layers=8", "mgrit.levels=2", "mgrit.cfactor0=2"]
START_DELAY = 1.5       # seconds: a signal while Python and Hydra start


def rows(run_dir: Path) -> int:
    try:
        return read_metrics(run_dir / ms.FILE_NAME).n_iterations
    except (ms.MetricsFileError, OSError, KeyError):
        return 0


def wait_rows(launch: Launch, run_dir: Path, n: int) -> bool:
    while launch.alive() and time.monotonic() - launch.start < launch.timeout:
        if rows(run_dir) >= n:
            return True
        time.sleep(0.05)
    return False


def files_problems(run_dir: Path, status: str, model_at: int | None = None) -> str:
    """What the run's files miss: contiguous rows, `status`, model-last at `model_at`."""
    try:
        m = read_metrics(run_dir / ms.FILE_NAME)
    except Exception as exc:                # noqa: BLE001 (any unreadable file is a loss)
        return f"metrics.h5 unreadable: {exc}"
    n = m.n_iterations
    if not np.array_equal(m.train[ms.ITERATION], np.arange(1, n + 1)):
        return f"metrics rows {m.train[ms.ITERATION].tolist()} are not 1..{n}"
    if m.status != status:
        return f"status {m.status}, expected {status}"
    if model_at is not None:
        try:
            got = load_model(run_dir, "last").iteration
        except Exception as exc:            # noqa: BLE001
            return f"no model: {exc}"
        if got < model_at:
            return f"model-last.pt at iteration {got}, the run reached {model_at}"
    return ""


def checkpoint_iteration(run_dir: Path) -> int | None:
    try:
        return int(load_checkpoint(run_dir / CHECKPOINT_FILE)["iteration"])
    except Exception:                       # noqa: BLE001
        return None


# -- signals -----------------------------------------------------------------------------
def signal_case(who: str, sig: int, point: str, mode: str, ranks: int, quick=False) -> Case:
    def run(where, timeout):
        rd = where / "run"
        extra = ["checkpoint_every=1"] if point == "checkpoint" else []
        la = Launch(command([f"hydra.run.dir={rd}", f"mode={mode}", *LONG, *SIGNALLED,
                             *extra], ranks), where, timeout)
        if point == "start":
            time.sleep(START_DELAY)
        elif not wait_rows(la, rd, 3):
            return la.outcome(run_dir=rd)
        at = rows(rd)
        la.signal(who, sig)
        at = max(at, rows(rd))      # a row written while the signal was on its way
        out = la.outcome(run_dir=rd)
        if out.rc is not None and (rd / ms.FILE_NAME).exists():
            n = rows(rd)
            out.lost = files_problems(rd, ms.INTERRUPTED, n)
            ck = checkpoint_iteration(rd)
            if not out.lost and n and ck != n:
                out.lost = f"checkpoint at iteration {ck}, the run stopped after {n}"
            if n > at + 1:
                out.wrong = f"stopped {n - at} iterations after the signal (at most 1)"
        return out
    name = f"{signal.Signals(sig).name} to {who} at {point} ({mode})"
    return Case("signals", name, ranks, (128 + sig,), signal.Signals(sig).name, run, quick)


def signal_cases(quick: bool) -> list[Case]:
    cases = [signal_case("solo", INT, "rows", "serial", 1, True),
             signal_case("solo", TERM, "rows", "mgrit", 1, True),
             signal_case("solo", INT, "start", "serial", 1, True),
             signal_case("solo", TERM, "start", "serial", 1),
             signal_case("solo", INT, "checkpoint", "simultaneous", 1),
             signal_case("mpiexec", INT, "rows", "serial", 2),
             signal_case("mpiexec", TERM, "rows", "simultaneous", 2),
             signal_case("rank0", TERM, "rows", "mgrit", 2),
             signal_case("rank1", INT, "rows", "serial", 2),
             signal_case("rank1", TERM, "checkpoint", "mgrit", 2),
             signal_case("all", INT, "rows", "mgrit", 2),
             signal_case("mpiexec", INT, "start", "mgrit", 2),
             signal_case("rank1", TERM, "start", "serial", 2)]
    return [c for c in cases if c.quick or not quick]


# -- SIGKILL, then resume ----------------------------------------------------------------
def orphans_left(launch: Launch, grace: float = 30) -> bool:
    """Whether processes of the launch's session outlive it by `grace` seconds."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            subprocess.run(["pgrep", "-s", str(launch.proc.pid)], check=True,
                           capture_output=True)
        except subprocess.CalledProcessError:
            return False
        time.sleep(0.2)
    return True


def kill_case(who: str, ranks: int, resume_ranks: int, mode: str, quick=False) -> Case:
    def run(where, timeout):
        rd = where / "run"
        la = Launch(command([f"hydra.run.dir={rd}", f"mode={mode}", *LONG, *SIGNALLED,
                             "checkpoint_every=2"], ranks), where, timeout)
        if not wait_rows(la, rd, 5):
            return la.outcome(run_dir=rd)
        at = rows(rd)
        la.signal(who, KILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            la.proc.wait(timeout=30)
        if la.alive() or orphans_left(la):
            la.kill()
            return Outcome(shown(la.cmd, where), None, "processes outlived SIGKILL to " + who)
        la.kill()
        ck = checkpoint_iteration(rd)
        before = read_metrics(rd / ms.FILE_NAME).train[ms.OBJECTIVE]
        lost = "" if ck is not None and ck >= 2 * (at // 2) - 2 else \
            f"checkpoint at iteration {ck} after {at} rows with checkpoint_every=2"
        lost = lost or files_problems(rd, ms.RUNNING, ck)
        target = (ck or 0) + 3
        out = run_once([f"resume={rd}", f"train.iterations={target}"], resume_ranks, where,
                       timeout, rd, tag="resume")
        out.command = f"{shown(la.cmd, where)}; kill -KILL <{who}>; {out.command}"
        if lost or out.rc != 0:
            out.lost = lost
            return out
        out.lost = files_problems(rd, ms.COMPLETED, target)
        after = read_metrics(rd / ms.FILE_NAME).train[ms.OBJECTIVE]
        if not out.lost and not np.array_equal(after[:ck], before[:ck]):
            out.lost = f"the resume changed rows 1..{ck} of metrics.h5"
        shared = min(len(before), len(after))
        if not out.lost and mode == "serial" and resume_ranks == ranks and \
                not np.allclose(after[:shared], before[:shared], rtol=1e-12, atol=0):
            out.lost = "the resumed rows differ from the killed run's (serial: bitwise)"
        return out
    name = f"SIGKILL to {who} ({mode}), resume on {resume_ranks}"
    return Case("kill + resume", name, ranks, (0,), "", run, quick)


def kill_cases(quick: bool) -> list[Case]:
    cases = [kill_case("all", 1, 1, "serial", True), kill_case("solo", 1, 1, "mgrit"),
             kill_case("all", 2, 2, "simultaneous"), kill_case("mpiexec", 2, 2, "serial"),
             kill_case("rank1", 2, 2, "mgrit"), kill_case("all", 2, 1, "serial")]
    return [c for c in cases if c.quick or not quick]


# -- disk full, unwritable directories ---------------------------------------------------
@contextlib.contextmanager
def tmpfs(path: Path, size: str, ro: bool = False):
    path.mkdir()
    opts = f"size={size}" + (",ro" if ro else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], check=True,
                   capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def can_mount(where: Path) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    try:
        with tmpfs(where / "probe", "1m"):
            return True
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False


def disk_case(name: str, ranks: int, quick=False) -> Case:
    def run(where, timeout):
        size = {"no room for metrics.h5": "2m", "full at a checkpoint": "8m"}.get(name, "16m")
        with tmpfs(where / "disk", size) as disk:
            rd = disk / "run"
            if name == "no room for metrics.h5":
                return run_once([f"hydra.run.dir={rd}", *TINY, "train.iterations=2"], ranks,
                                where, timeout, rd)
            if name == "full at a checkpoint":   # simultaneous warm starts outgrow the room
                out = run_once([f"hydra.run.dir={rd}", "mode=simultaneous",
                                "checkpoint_every=2", "train.iterations=4"], ranks, where,
                               timeout, rd)
                ran = rows(rd)
                out.lost = files_problems(rd, ms.FAILED, ran - 1 if ran else None)
                if not out.lost and checkpoint_iteration(rd) is None and ran >= 2:
                    out.lost = f"{ran} iterations ran, no checkpoint kept to resume from"
                return out
            la = Launch(command([f"hydra.run.dir={rd}", *LONG], ranks), where, timeout)
            if not wait_rows(la, rd, 3):
                return la.outcome(run_dir=rd)
            with open(disk / "filler", "wb") as f:     # another program takes the room
                f.write(b"\0" * (free_bytes(disk) - RESERVE_BYTES + 65536))
            out = la.outcome(run_dir=rd)
            out.lost = files_problems(rd, ms.FAILED, max(rows(rd) - 1, 0))
            if (rd / LOCK_FILE).exists():
                out.wrong = "the run lock was left behind"
            return out
    needle = {"no room for metrics.h5": "cannot create metrics file",
              "full at a checkpoint": "No space left on device"}.get(name, "free")
    return Case("disk full", name, ranks, (1,), needle, run, quick)


def unwritable_case(name: str, ranks: int, fx: Fixtures, quick=False) -> Case:
    def run(where, timeout):
        if name == "a file as run dir":
            (where / "file").write_text("x")
            rd = where / "file"
            return run_once([f"hydra.run.dir={rd}", *TINY], ranks, where, timeout)
        if name == "read-only new run dir":
            with tmpfs(where / "ro", "1m", ro=True) as ro:
                return run_once([f"hydra.run.dir={ro / 'run'}", *TINY], ranks, where, timeout)
        with tmpfs(where / "ro", "16m") as ro:        # resume in a read-only directory
            rd = copy_of(fx.get("run") / "run", ro, "run")
            subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
            return run_once([f"resume={rd}", "train.iterations=4"], ranks, where, timeout)
    needle = "resume" if name.startswith("resume") else "hydra.run.dir"
    return Case("unwritable", name, ranks, (2,), needle, run, quick)


# -- one run per directory ---------------------------------------------------------------
def lock_case(name: str, ranks: int, fx: Fixtures, quick=False) -> Case:
    def run(where, timeout):
        if name in ("second run while one lives", "second resume while one lives"):
            return concurrent(where, timeout, ranks, fx, resume=name.startswith("second resume"))
        rd = copy_of(fx.get("run") / "run", where, "run")
        if name == "earlier run's metrics.h5":
            return run_once([f"hydra.run.dir={rd}", *TINY], ranks, where, timeout, rd)
        if name == "stale lock":
            gone = subprocess.Popen(["true"])
            gone.wait()
            (rd / LOCK_FILE).write_text(f"{socket.gethostname()} {gone.pid} x\n")
        else:
            (rd / LOCK_FILE).write_text("another-host.example 12345 x\n")
        out = run_once([f"resume={rd}", "train.iterations=3"], ranks, where, timeout, rd)
        if out.rc == 0:
            out.lost = files_problems(rd, ms.COMPLETED, 3)
        return out
    expect, needle = {"stale lock": ((0,), ""), "earlier run's metrics.h5": ((2,), "metrics")
                      }.get(name, ((2,), "in use by the lptrain process"))
    return Case("one run per dir", name, ranks, expect, needle, run, quick)


def concurrent(where: Path, timeout: float, ranks: int, fx: Fixtures,
               resume: bool) -> Outcome:
    rd = where / "run"
    args = [f"hydra.run.dir={rd}", *LONG]
    if resume:
        rd = copy_of(fx.get("run") / "run", where, "run")
        args = [f"resume={rd}", "train.iterations=1000000"]
    first = Launch(command(args, 1), where, timeout, tag="first")
    if not wait_rows(first, rd, 4):
        return first.outcome(run_dir=rd)
    second = [f"resume={rd}", "train.iterations=3"] if resume else \
        [f"hydra.run.dir={rd}", *TINY, "train.iterations=2"]
    out = run_once(second, ranks, where, timeout, tag="second")
    first.signal("solo", TERM)
    rc = first.wait()
    if rc != 128 + TERM:
        out.wrong = f"the first run ended with {rc}, expected {128 + TERM}"
    out.lost = files_problems(rd, ms.INTERRUPTED, rows(rd))
    return out


def all_cases(fixtures_dir: Path, quick: bool = False) -> list[Case]:
    fx = Fixtures(fixtures_dir)
    cases = [*option_cases(quick), *data_cases(fx, quick), *run_file_cases(fx, quick),
             *signal_cases(quick), *kill_cases(quick)]
    more = [unwritable_case("a file as run dir", 1, fx, True),
            lock_case("second run while one lives", 1, fx, True),
            lock_case("second run while one lives", 2, fx),
            lock_case("second resume while one lives", 1, fx),
            lock_case("stale lock", 1, fx), lock_case("lock of another host", 2, fx),
            lock_case("earlier run's metrics.h5", 1, fx, True)]
    if can_mount(fixtures_dir):
        more += [disk_case("no room for metrics.h5", 1, True),
                 disk_case("no room for metrics.h5", 2), disk_case("full at a checkpoint", 1),
                 disk_case("full at a checkpoint", 2), disk_case("filling up while running", 1),
                 disk_case("filling up while running", 2, True),
                 unwritable_case("read-only new run dir", 1, fx, True),
                 unwritable_case("read-only new run dir", 2, fx),
                 unwritable_case("resume in a read-only dir", 1, fx)]
    else:
        print("no tmpfs can be mounted here: the disk-full and read-only cases are left out")
    return cases + [c for c in more if c.quick or not quick]
