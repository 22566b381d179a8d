"""Run directories: unique default names, a lock held by the live run, no overwriting.

A run (or a sweep) holds `<dir>/.lptrain.lock`, created exclusively and holding the
owner's host name and process id; it is removed when the owner exits. A lock whose
owner is on this host but no longer running lptrain is stale and taken over; a lock
from another host is honoured (its owner cannot be checked from here).
"""
from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path

from lptrain.errors import (REFUSED, InputFileError, RunDirectoryBusy, RunFileError, reason,
                            resume_command)
from lptrain.metrics.schema import FILE_NAME

LOCK_FILE = ".lptrain.lock"
SWEEP_FILE = "multirun.yaml"   # what Hydra writes into a multirun's directory


def claim_new(base: str | Path) -> Path:
    """Create and return `base`, or `base-1`, `base-2`, ... if taken (atomic: mkdir)."""
    base = Path(base)
    base.parent.mkdir(parents=True, exist_ok=True)
    for i in range(10000):
        path = base if i == 0 else base.with_name(f"{base.name}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RunFileError(f"{base}: no free directory name (tried {base.name}-1 to -9999)")


def refuse_earlier_run(directory: str | Path, key: str, ranks: int = 1) -> None:
    """RunFileError (exit status REFUSED) if `directory` (or a sweep job below it) holds
    a metrics file."""
    directory = Path(directory)
    found = [p for p in (directory / FILE_NAME, *directory.glob(f"*/{FILE_NAME}"))
             if p.is_file()]
    if found:
        sweep = key == "hydra.sweep.dir" and is_sweep(directory)
        if key == "hydra.sweep.dir" and not sweep and found[0].parent != directory:
            raise RunFileError(_jobs_there(directory, key, found, ranks), exit_code=REFUSED)
        earlier, what = (directory, "sweep") if sweep else (found[0].parent, "run")
        from lptrain.train.checkpoint import CHECKPOINT_FILE
        if not sweep and not (earlier / CHECKPOINT_FILE).is_file():
            raise RunFileError(f"{key}={directory}: holds an earlier run ({found[0]}) that "
                               f"cannot be resumed ({not_resumable(earlier)}); choose "
                               f"another directory, or move its {FILE_NAME} away to run "
                               f"there again", exit_code=REFUSED)
        raise RunFileError(f"{key}={directory}: holds an earlier run ({found[0]}); choose "
                           f"another directory, or continue that {what} with "
                           f"`{resume_command(earlier, ranks)}`", exit_code=REFUSED)


def _jobs_there(directory: Path, key: str, found: list[Path], ranks: int) -> str:
    """The refusal of a sweep into the directory of a sweeper's jobs that wrote no
    multirun.yaml (Optuna's): no resume= of the sweep, one of a stopped job."""
    from lptrain.metrics import schema as ms
    from lptrain.metrics.reader import run_status
    from lptrain.train.checkpoint import CHECKPOINT_FILE
    stopped = [p.parent for p in found if (p.parent / CHECKPOINT_FILE).is_file()
               and run_status(p)[0] in (ms.INTERRUPTED, ms.RUNNING, ms.FAILED)]
    resume = f", or resume its stopped job {stopped[0].name} alone with " \
             f"`{resume_command(stopped[0], ranks)}`" if stopped else ""
    return (f"{key}={directory}: holds an earlier sweep's jobs ({found[0]}); choose "
            f"another directory (a study kept in the sweeper's storage carries on in the "
            f"new one){resume}")


# what a refused run (or sweep: its multirun.yaml) writes
REFUSED_LEAVES = (".hydra", "lptrain.log", SWEEP_FILE, LOCK_FILE)


def remove_refused(directory: str | Path, empty_parents: int = 0) -> bool:
    """Remove a run directory this command made for a run that was refused before its
    first iteration, where it holds only what such a run leaves (REFUSED_LEAVES), and
    up to `empty_parents` of its parents left empty (a default directory's date and
    outputs/ folders); whether it did."""
    directory = Path(directory)
    try:
        if not directory.is_dir() or any(p.name not in REFUSED_LEAVES
                                         for p in directory.iterdir()):
            return False
        hydra = directory / ".hydra"
        if hydra.is_dir():
            if any(p.is_dir() for p in hydra.iterdir()):
                return False
            for p in hydra.iterdir():
                p.unlink()
            hydra.rmdir()
        for name in REFUSED_LEAVES[1:]:
            (directory / name).unlink(missing_ok=True)
        directory.rmdir()
    except OSError:
        return False
    for parent in directory.parents[:empty_parents]:
        try:
            parent.rmdir()
        except OSError:
            break
    return True


def dir_override(key: str, path: str | Path) -> str:
    """`key=path` as a Hydra override: the path in quotes where the override grammar does
    not take it bare (a space, a non-ASCII letter, '=', ',', a quote ...)."""
    text = str(path)
    if re.fullmatch(r"[A-Za-z0-9_./+@%:-]+", text):
        return f"{key}={text}"
    # inside quotes only a quote, and backslashes before one or at the end, are escaped
    quoted = re.sub(r"(\\*)('|$)", lambda m: m[1] * 2 + ("\\'" if m[2] else ""), text)
    return f"{key}='{quoted}'"


def dir_value(value: str) -> str:
    """A directory given on the command line as `key=value`, Hydra's quotes removed
    (`resume='/my runs/a'` names /my runs/a, as `hydra.run.dir='/my runs/a'` does)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        from hydra.core.override_parser.overrides_parser import OverridesParser
        try:
            return str(OverridesParser.create().parse_override(f"k={value}").value())
        except Exception:       # not a quoted value Hydra reads: the text as given
            return value
    return value


def is_sweep(directory: str | Path) -> bool:
    """True for a multirun's directory (its SWEEP_FILE), not one job's."""
    return (Path(directory) / SWEEP_FILE).is_file()


def saved_overrides(path: Path, text: str | None = None) -> list[str]:
    """The command-line overrides Hydra saved for a run (`.hydra/overrides.yaml`), as
    typed: an interpolation such as `+network.step.channels=${network.channels}` stays
    text (read as plain YAML, not as an OmegaConf list that would resolve it against
    itself); InputFileError naming the file unless it is a list of strings. `text`: the
    file as it was, where Hydra has rewritten it since (a resumed sweep's job)."""
    import yaml
    try:
        saved = yaml.safe_load(path.read_text() if text is None else text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()
        raise InputFileError(f"{path}: unreadable ({first[0] if first else type(exc).__name__})"
                             f"; only runs of this lptrain version can be resumed") from None
    if not isinstance(saved, list) or not all(isinstance(a, str) for a in saved):
        raise InputFileError(f"{path}: not a list of overrides; only runs of this lptrain "
                             f"version can be resumed")
    check_overrides(path, saved)
    return saved


# Hydra's own overrides a resume gives anew (the directory, the mode, a job's number) or
# that belong to a sweep, not to the run of one of its jobs
NOT_CARRIED = ("hydra.run.", "hydra.sweep.", "hydra.sweeper.", "hydra.launcher.",
               "hydra/sweeper=", "hydra/launcher=", "hydra.mode=", "hydra.job.num=",
               "hydra.job.id=")


def saved_hydra(run_dir: Path) -> dict:
    """The `hydra` node Hydra saved for a run (.hydra/hydra.yaml; {} where it is missing
    or unreadable: the run's defaults are then lptrain's)."""
    import yaml
    try:
        saved = yaml.safe_load((Path(run_dir) / ".hydra" / "hydra.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return saved.get("hydra") or {} if isinstance(saved, dict) else {}


def carried_hydra(hydra: dict) -> list[str]:
    """What of a run's saved `hydra` node its resume gives again: source_flags, and
    Hydra's overrides it ran with (hydra.searchpath, hydra.job.chdir, ...) but
    NOT_CARRIED."""
    typed = ((hydra.get("overrides") or {}).get("hydra")) or []
    return source_flags(hydra) + [a for a in typed if isinstance(a, str)
                                  and not a.lstrip("+").startswith(NOT_CARRIED)]


def source_flags(hydra: dict) -> list[str]:
    """The flags that chose a run's (or sweep's) configuration, from its saved `hydra`
    node: --config-name where not lptrain's, --config-path, --config-dir."""
    name = (hydra.get("job") or {}).get("config_name")
    flags = [] if name in (None, "config") else ["--config-name", str(name)]
    for src in (hydra.get("runtime") or {}).get("config_sources") or []:
        where = str(src.get("path"))
        if src.get("provider") == "command-line" and src.get("schema") == "file":
            flags += ["--config-dir", where]
        elif src.get("provider") == "main" and (src.get("schema"), where) != ("pkg",
                                                                               "lptrain.conf"):
            flags += ["--config-path", where if src.get("schema") == "file"
                      else f"{src.get('schema')}://{where}"]
    return flags


# how a run ends that writes its checkpoint as it stops (train/loop.py)
WRITES_AT_THE_END = ("completed", "stalled", "interrupted")


def checkpoint_gone(status: str, iterations: int) -> str:
    """Why a run that ended with `status` (one of WRITES_AT_THE_END) cannot be resumed."""
    from lptrain.train.checkpoint import CHECKPOINT_FILE
    return (f"no {CHECKPOINT_FILE} there, though its run stopped ({status}) after "
            f"{iterations} iterations and wrote one then (moved or deleted?)")


def stopped_how(status: str) -> str:
    """How a run that neither ended nor wrote a checkpoint stopped, from its `status`:
    a killed run's metrics.h5 still says running."""
    from lptrain.metrics import schema as ms
    return ("was killed (its status is still running)" if status == ms.RUNNING
            else f"stopped ({status})")


def not_resumable(run_dir: Path) -> str:
    """Why `run_dir` cannot be resumed, for a directory without a checkpoint or saved
    overrides: a run that stopped before its first checkpoint says how it ended."""
    from lptrain.metrics import schema as ms
    from lptrain.metrics.reader import read_metrics
    from lptrain.train.checkpoint import CHECKPOINT_FILE
    if run_dir.is_file():
        return f"a file, not a run's directory; did you mean `{resume_command(run_dir.parent)}`?"
    if not run_dir.exists():
        return "no such directory; give the run directory lptrain printed when it stopped"
    if (run_dir / ".hydra" / "overrides.yaml").is_file() and (run_dir / ms.FILE_NAME).is_file():
        try:
            m = read_metrics(run_dir / ms.FILE_NAME)
        except ms.MetricsFileError:
            pass
        else:
            if m.status in WRITES_AT_THE_END:
                return f"{checkpoint_gone(m.status, m.n_iterations)}: nothing to resume"
            return (f"its run {stopped_how(m.status)} after {m.n_iterations} "
                    f"iterations, before its first "
                    f"checkpoint: nothing to resume; run it again in another directory")
    there = {p.name for p in run_dir.iterdir()}
    if there and there <= set(REFUSED_LEAVES):     # what a run leaves before training
        return (f"its run ended before its first iteration (no {ms.FILE_NAME} there; its "
                f"lptrain.log, if any, says why): nothing to resume; start the run again "
                f"without resume=")
    if (run_dir / CHECKPOINT_FILE).is_file():       # the overrides it was run with: gone
        return (f"its {CHECKPOINT_FILE} is there but not .hydra/overrides.yaml, the "
                f"overrides the run was started with, which a resume runs again; put the "
                f"file back (a copy of the run's .hydra/)")
    return (f"no {CHECKPOINT_FILE} (or .hydra/overrides.yaml) there; only runs of this "
            f"lptrain version can be resumed")


class SavedFiles:
    """The files under a directory as they are now, to put back: Hydra rewrites a run's
    `.hydra/` before lptrain can check that the run can be resumed, and a refused resume
    must leave the run as it was (its next resume reads those files)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.files = {p: p.read_bytes() for p in self._present()}

    def _present(self) -> list[Path]:
        return [p for p in self.directory.rglob("*") if p.is_file()]

    def restore(self) -> None:
        """Rewrite each file that changed, remove each new one (RunFileError if it cannot)."""
        try:
            for p in self._present():
                if p not in self.files:
                    p.unlink()
            for p, data in self.files.items():
                if not p.is_file() or p.read_bytes() != data:
                    p.write_bytes(data)
        except OSError as exc:
            raise RunFileError(f"{exc.filename or self.directory}: cannot put back the run's "
                               f"saved configuration ({reason(exc)})") from None


def remove_new_files(directory: Path) -> None:
    """Remove `directory`, a run's `.hydra/` that Hydra made where the run had none, as
    SavedFiles.restore removes a new file (RunFileError if it cannot)."""
    import shutil
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise RunFileError(f"{exc.filename or directory}: cannot remove the configuration "
                           f"Hydra saved there ({reason(exc)})") from None


def check_overrides(path: Path, overrides: list[str]) -> None:
    """InputFileError naming `path` and the item unless Hydra parses each override (a
    file cut inside an item leaves one such as `dataset`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    parser = OverridesParser.create()
    for item in overrides:
        try:
            parser.parse_override(item)
        except HydraException:
            raise InputFileError(f"{path}: {item!r} is not an override (a damaged or cut "
                                 f"file?); only runs of this lptrain version can be "
                                 f"resumed") from None


def _owner(lock: Path) -> tuple[str, int] | None:
    """(host, pid) a lock file names; None where it is absent or unreadable."""
    try:
        host, pid = lock.read_text().split()[:2]
        return host, int(pid)
    except (OSError, ValueError):
        return None


def _owner_alive(host: str, pid: int) -> bool:
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:      # a reused pid: alive, but not an lptrain process
        return b"lptrain" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def run_alive(run_dir: str | Path) -> bool:
    """Whether an lptrain process may still be running the run in `run_dir`: the lock of
    the run, or of the sweep it is a job of, has an owner alive (another host's: taken as
    alive). Without one, a metrics.h5 still saying `running` was left by a killed job
    (SIGKILL, or an error on another rank that aborted the job before rank 0 closed it)."""
    run_dir = Path(run_dir).resolve()
    sweep = next((p for p in run_dir.parents if (p / SWEEP_FILE).is_file()), None)
    # its sweep's lock: the nearest folder above with the sweep's record (a subdir such as
    # s/${hydra.job.num} nests a job deeper), or the parent where there is none (Optuna)
    locks = (run_dir / LOCK_FILE, (sweep or run_dir.parent) / LOCK_FILE)
    return any(owner is not None and _owner_alive(*owner) for owner in map(_owner, locks))


def refuse_inside_live_run(directory: str | Path, key: str) -> None:
    """RunDirectoryBusy where a folder above `directory` is the directory of a run or
    sweep another lptrain process is running (its lock's owner alive): a sweep's later
    job could take the folder, and Hydra rewrites a job folder's `.hydra/` before lptrain
    can refuse it there."""
    for parent in Path(directory).resolve().parents:
        owner = _owner(parent / LOCK_FILE)
        if owner is None:
            continue
        host, pid = owner
        mine = host == socket.gethostname() and pid == os.getpid()
        if not mine and _owner_alive(host, pid):
            what = "sweep" if (parent / SWEEP_FILE).is_file() else "run"
            then = f"stop that {what} first" if key == "resume" else \
                "choose a folder outside it"
            raise RunDirectoryBusy(f"{key}={directory}: inside {parent}, the directory of "
                                   f"a {what} the lptrain process {pid} on {host} is "
                                   f"running; {then} (lock file {parent / LOCK_FILE}; "
                                   f"delete it if that {what} is gone)")


class RunLock:
    """The lock of one run directory, taken by `acquire` and dropped by `release`."""

    def __init__(self, directory: str | Path, key: str = "hydra.run.dir"):
        self.path = Path(directory) / LOCK_FILE
        self.key, self.held = key, False
        # host, pid, and a token telling this lock from another of the same process
        self.mark = f"{socket.gethostname()} {os.getpid()} {uuid.uuid4().hex[:12]}\n"

    def acquire(self) -> RunLock:
        # the lock appears complete or not at all: written under another name, then
        # hard-linked to its own (link fails if the name exists)
        tmp = self.path.with_name(f"{LOCK_FILE}.{os.getpid()}")
        try:
            tmp.write_text(self.mark)
        except OSError as exc:
            raise RunFileError(f"{self.path}: cannot create the run lock "
                               f"({reason(exc)})") from None
        try:
            for _ in range(2):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    self._take_over_if_stale()
                    continue
                self.held = True
                return self
        finally:
            tmp.unlink(missing_ok=True)
        raise RunDirectoryBusy(f"{self.key}={self.path.parent}: another run took it "
                               f"at the same moment")

    def _take_over_if_stale(self) -> None:
        host, pid = _owner(self.path) or ("?", -1)
        if pid > 0 and _owner_alive(host, pid):
            raise RunDirectoryBusy(f"{self.key}={self.path.parent}: in use by the lptrain "
                                   f"process {pid} on {host} (lock file {self.path}; delete "
                                   f"it if that run is gone)")
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise RunFileError(f"{self.path}: stale run lock, cannot remove it "
                               f"({reason(exc)})") from None

    def release(self) -> None:
        """Remove the lock file if it is still this process's."""
        if not self.held:
            return
        self.held = False
        try:
            if self.path.read_text() == self.mark:
                self.path.unlink()
        except OSError:
            pass
