"""Exception types of lptrain: every user-facing failure carries the bad value."""


class LptrainError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero."""


class ConfigError(LptrainError, ValueError):
    """A configuration value is out of range or inconsistent with another."""


class DataError(LptrainError):
    """A dataset file is missing, unreadable or inconsistent."""


class SolverError(LptrainError):
    """MGRIT was asked for something it cannot do (e.g. too many ranks)."""


class DivergedError(LptrainError):
    """Training produced a non-finite objective or one that grew past the divergence rule."""


class RunFileError(LptrainError):
    """A file of the run directory cannot be written or read; the message names it."""


class RunDirectoryBusy(LptrainError):
    """Another live run holds the run directory (its lock file names the owner)."""


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


def require(ok: bool, key: str, value, what: str) -> None:
    """Raise ConfigError naming `key` and `value` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {what}")
