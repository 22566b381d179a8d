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
    """Training produced a non-finite objective."""


class StalledError(LptrainError):
    """Training stopped making progress and the user asked for a non-zero exit."""


def require(ok: bool, key: str, value, what: str) -> None:
    """Raise ConfigError naming `key` and `value` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {what}")
