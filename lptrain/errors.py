"""Exception types of lptrain: every user-facing failure carries the bad value.

Each type carries the exit status the command ends with (README "Exit status"):
REFUSED where the command or its inputs must change and no iteration ran, FAILED
where a run that started could not finish, 128 + the signal number where one stopped it.
"""

FAILED = 1
REFUSED = 2


class LptrainError(Exception):
    """Base class: the CLI prints these as one line and exits with `exit_code` (the
    type's, or the one given where the same type can mean either)."""

    exit_code = FAILED

    def __init__(self, *args, exit_code: int | None = None):
        super().__init__(*args)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(LptrainError, ValueError):
    """A configuration value is out of range or inconsistent with another, or the run
    cannot fit (memory, device, layout)."""

    exit_code = REFUSED


class DataError(LptrainError):
    """A dataset file is missing, unreadable or inconsistent."""

    exit_code = REFUSED


class MissingPackageError(LptrainError):
    """An optional package that a feature needs is not installed; the message names the
    extra of lptrain that brings it (`install_hint`)."""

    exit_code = REFUSED


def install_hint(extra: str) -> str:
    """How to get lptrain's optional `extra` (one of pyproject.toml's optional
    dependencies): the end of every message about a missing optional package."""
    return f"install lptrain's {extra} extra: pip install 'lptrain[{extra}]'"


class SolverError(LptrainError):
    """MGRIT was asked for something it cannot do (e.g. too many ranks)."""

    exit_code = REFUSED


class DivergedError(LptrainError):
    """Training produced a non-finite objective or one that grew past the divergence rule."""


class RunFileError(LptrainError):
    """A file of the run directory cannot be written or read; the message names it."""


class InputFileError(RunFileError):
    """A file the command points at (resume=, a model, a checkpoint) is missing, damaged
    or not lptrain's."""

    exit_code = REFUSED


class RunDirectoryBusy(LptrainError):
    """Another live run holds the run directory (its lock file names the owner)."""

    exit_code = REFUSED


class Interrupted(LptrainError):
    """The ranks agreed to stop after a signal (SIGINT or SIGTERM).

    `exit_code` is 128 + the signal number, as a shell reports a process the
    signal ended; `iteration` is the last finished optimizer iteration.
    """

    def __init__(self, signum: int, iteration: int):
        import signal
        self.signum, self.iteration = signum, iteration
        self.exit_code = 128 + signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signal_name} after iteration {iteration}")


class StalledError(LptrainError):
    """Training stopped making progress and the user asked for a non-zero exit."""


def reason(exc: OSError) -> str:
    """The system's reason for an OSError, without errno and file name."""
    return exc.strerror or str(exc)


def require(ok: bool, key: str, value, what: str) -> None:
    """Raise ConfigError naming `key` and `value` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {what}")
