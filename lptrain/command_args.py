"""The `lptrain` command's arguments as rank 0 reads them before Hydra does: which kind
of command it is, its run (or sweep) directory, Hydra's own keys checked, the directory
tried for writing."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path

from lptrain.errors import LptrainError, reason
from lptrain.rundir import claim_new, dir_override, dir_value

# Hydra's flags that print and exit without running the task: they get no run directory
INFO_FLAGS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc",
              "--shell-completion", "--version")


def value(args: list[str], key: str) -> str | None:
    """The value of the first `key=value` argument (None where absent)."""
    for a in args:
        if a.startswith(key + "="):
            return a.split("=", 1)[1]
    return None


def informational(args: list[str]) -> bool:
    return any(a.split("=", 1)[0] in INFO_FLAGS for a in args)


def multirun(args: list[str]) -> bool:
    return any(a in ("-m", "--multirun") or a.replace(" ", "") == "hydra.mode=MULTIRUN"
               for a in args)


def directory_args(args: list[str]) -> tuple[list[str], str]:
    """Rank 0: add a fresh hydra.run.dir (or hydra.sweep.dir) unless one is given."""
    key = "hydra.sweep.dir" if multirun(args) else "hydra.run.dir"
    chosen = value(args, key)
    if chosen is not None:          # as Hydra reads it: '/my runs/a' names /my runs/a
        return args, dir_value(chosen)
    base = datetime.now().strftime(f"{'multirun' if multirun(args) else 'outputs'}"
                                   f"/%Y-%m-%d/%H-%M-%S")
    try:      # a directory of its own even for runs started in the same second
        chosen = str(claim_new(base))
    except (OSError, LptrainError):
        chosen = base     # check_writable reports it
    return [*args, dir_override(key, chosen)], chosen


def check_hydra_keys(args: list[str]) -> None:
    """Hydra's own keys (hydra.run.dir=...) parse as overrides: Hydra would report a bad
    one after lptrain made the directory, in three lines (ConfigError)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from lptrain.errors import ConfigError
    parser = OverridesParser.create()
    for arg in args:
        try:
            parser.parse_override(arg)
        except HydraException as exc:
            key, given, rest = arg.partition("=")
            hint = (f"; a value with '=', ',', quotes, brackets or non-ASCII letters goes "
                    f"in quotes: {dir_override(key, rest)}" if given and rest else "")
            raise ConfigError(f"{arg}: {str(exc).splitlines()[0]}{hint}") from None


def check_writable(directory: str) -> str | None:
    """Why `directory` cannot be written (None: it can), tried with a probe file."""
    try:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".lptrain-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return f"hydra.run.dir={directory!r}: cannot write there ({reason(exc)})"
    return None
