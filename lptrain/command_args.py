"""The `lptrain` command's arguments as rank 0 reads them before Hydra does: which kind
of command it is, its run (or sweep) directory, Hydra's own keys checked, the directory
tried for writing."""
from __future__ import annotations

import os
import traceback
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from lptrain.config import multirun  # noqa: F401 (the command's arguments: here too)
from lptrain.errors import FAILED, REFUSED, LptrainError, one_line, reason
from lptrain.rundir import claim_new, dir_override, dir_value

# Hydra's flags that print and exit without running the task: they get no run directory
INFO_FLAGS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc",
              "--shell-completion", "--version")


# where the launchers (MPICH's, Open MPI's, PMIx) put a process's rank
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def launched_rank(environ=os.environ, alone: int | None = 0) -> int | None:
    """This process's rank as its launcher says before MPI starts (`alone` without one):
    the flags answered without MPI (--help, --version) print on rank 0 only."""
    for name in RANK_VARIABLES:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return alone


def value(args: list[str], key: str) -> str | None:
    """The value of the first `key=value` argument (None where absent)."""
    for a in args:
        if a.startswith(key + "="):
            return a.split("=", 1)[1]
    return None


def overrides_first(args: list[str]) -> list[str]:
    """The `key=value` overrides ahead of Hydra's flags, each group in its order: Hydra's
    parser takes the overrides as one positional list, so those after a flag
    (`lptrain seed=3 --cfg job dataset=mnist`) were 'unrecognized arguments'. A flag's
    own value (`--cfg job`) has no '=' and stays behind its flag."""
    given = [a for a in args if _override(a)]
    return given + [a for a in args if not _override(a)]


def _override(arg: str) -> bool:
    """`key=value`, or a deletion `~key` (Hydra's flags start with '-')."""
    return not arg.startswith("-") and ("=" in arg or arg.startswith("~"))


# what Hydra's --shell-completion does (install=bash, ...): it takes exactly one
COMPLETION_ACTIONS = ("install", "uninstall", "query")


def check_flags(args: list[str]) -> None:
    """ConfigError in one line unless Hydra's parser takes the flags (it printed its
    usage, 7 lines, and exited after lptrain had made the run directory)."""
    from hydra._internal.utils import get_args_parser

    from lptrain.errors import ConfigError
    parser = get_args_parser()

    def refuse(message: str):
        raise ConfigError(f"{message} (lptrain --help lists the options)")
    parser.error = refuse
    args = overrides_first(args)      # as the command goes to Hydra (cli._hydra)
    for a in args:      # `-mc job`: argparse takes it, lptrain's own reading does not
        flag = a.split("=", 1)[0]
        if a.startswith("-") and not a.startswith("--") and len(flag) > 2 and \
                flag not in parser._option_string_actions:
            refuse(f"{a}: give Hydra's flags one by one, as written there")
    ns = parser.parse_args(args)
    if ns.resolve and not (ns.cfg or ns.help):
        refuse("--resolve: it goes with --cfg (--cfg job --resolve)")
    if ns.shell_completion and not any(o.split("=", 1)[0] in COMPLETION_ACTIONS
                                       for o in ns.overrides):
        refuse("--shell-completion: add one of "
               + ", ".join(f"{a}=SHELL" for a in COMPLETION_ACTIONS) + " (e.g. install=bash)")


def _parsed(args: list[str]):
    """Hydra's parser's reading of a command that check_flags took."""
    from hydra._internal.utils import get_args_parser
    return get_args_parser().parse_args(overrides_first(args))


def config_source(args: list[str]):
    """Where the command's configuration comes from (--config-name, --config-path,
    --config-dir: the user's own; else lptrain's)."""
    from lptrain.config.source import ConfigSource
    ns = _parsed(args)
    return ConfigSource(ns.config_name or "config", ns.config_path, ns.config_dir)


def checked_args(args: list[str]) -> list[str] | None:
    """The command's overrides (and -m) as check_command takes them, flags and their
    values left out; None for a rerun of a saved job (--experimental-rerun), which
    Hydra composes from its pickle, and for shell completion (-sc install=bash: its
    words are commands to it, not overrides)."""
    ns = _parsed(args)
    if ns.experimental_rerun is not None or ns.shell_completion:
        return None
    return [*(["-m"] if ns.multirun else []), *ns.overrides]


def configured_args(args: list[str], checked: list[str] | None, source) -> list[str]:
    """The command with what its configuration decides before Hydra runs: -m where the
    user's config sets hydra.mode: MULTIRUN, and the run (or sweep) directory resolved
    where the command line gives it with an interpolation (`${now:%Y}`) or the user's
    config names it: lptrain locks, checks and refuses the directory the run writes, not
    its literal name (nor a default one the run would not use). `checked` and `source`:
    the command's checked_args and config_source."""
    from lptrain.config.source import ConfigSource, configured_hydra
    dirs = [value(args, k) or "" for k in ("hydra.run.dir", "hydra.sweep.dir")]
    if checked is None or (source == ConfigSource() and "${" not in "".join(dirs)):
        return args
    sweep, configured = configured_hydra([a for a in checked if a != "-m"], source,
                                         multirun(args))
    if sweep and not multirun(args):
        args = ["-m", *args]
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    given = value(args, key)
    if configured is None or (given is not None and "${" not in given):
        return args
    return [*(a for a in args if not a.startswith(key + "=")), dir_override(key, configured)]


def informational(args: list[str]) -> bool:
    return any(a.split("=", 1)[0] in INFO_FLAGS for a in args)


def check_launcher(args: list[str], ranks: int) -> None:
    """Under mpiexec jobs run in rank 0's process, which the other ranks follow."""
    chosen = value(args, "hydra/launcher")
    if ranks > 1 and chosen not in (None, "basic"):
        from lptrain.errors import ConfigError
        raise ConfigError(f"hydra/launcher={chosen}: under mpiexec each job runs in the "
                          f"ranks' own processes; keep the basic launcher")


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


# a key's default directory where the key is left out (resume= has none)
DIR_KEYS = {"hydra.run.dir": "a new outputs/<date>/<time>",
            "hydra.sweep.dir": "a new multirun/<date>/<time>", "resume": None}


def check_dir_values(args: list[str]) -> None:
    """An empty directory (`hydra.run.dir=`, `resume=''`) is the current one to Hydra and
    to Path(""): a run was written, or looked for, there without a word (ConfigError)."""
    from lptrain.errors import ConfigError
    for arg in args:
        key, given, rest = arg.partition("=")
        if given and key.lstrip("+") in DIR_KEYS and dir_value(rest) == "":
            default = DIR_KEYS[key.lstrip("+")]
            raise ConfigError(f"{arg}: no directory given (an empty one is the current "
                              f"directory); name one" + (f", or leave {key} out for "
                                                         f"{default}" if default else ""))
        if given and key.lstrip("+") in DIR_KEYS and dir_value(rest).startswith("~"):
            raise ConfigError(f"{arg}: a leading ~ is not your home directory here (it "
                              f"names a directory '~' in the current one); give "
                              f"{key}={os.path.expanduser(dir_value(rest))}")


def check_hydra_keys(args: list[str]) -> None:
    """Hydra's own keys (hydra.run.dir=...) parse as overrides: Hydra would report a bad
    one after lptrain made the directory, in three lines (ConfigError)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from lptrain.errors import ConfigError
    parser = OverridesParser.create()
    for arg in args:
        key, given, rest = arg.partition("=")
        hint = (f"; a value with '=', ',', quotes, brackets or non-ASCII letters goes "
                f"in quotes: {dir_override(key, rest)}" if given and rest else "")
        if key.lstrip("+") == "hydra.output_subdir" and dir_value(rest) != ".hydra":
            raise ConfigError(f"{arg}: a run without its .hydra/ files cannot be resumed "
                              f"(lptrain reads its overrides there); keep the default")
        try:
            swept = parser.parse_override(arg).is_sweep_override()
        except HydraException as exc:
            raise ConfigError(f"{arg}: {str(exc).splitlines()[0]}{hint}") from None
        if swept and key.lstrip("+") in DIR_KEYS:    # a ',': Hydra's list of values
            raise ConfigError(f"{arg}: a ',' makes it several directories{hint}")
        if key.lstrip("+") in SWEEPER_COUNTS and not _at_least_one(rest):
            raise ConfigError(f"{arg}: must be a whole number >= 1 "
                              f"({SWEEPER_COUNTS[key.lstrip('+')]})")


# a sampling sweeper's counts (Optuna's): 0 trials ended the sweep in the plugin's error
# 'No trials are completed yet', exit 1
SWEEPER_COUNTS = {"hydra.sweeper.n_trials": "the trials the sweeper runs",
                  "hydra.sweeper.n_jobs": "the trials it runs at a time"}


def _at_least_one(text: str) -> bool:
    try:
        return int(text) >= 1
    except ValueError:
        return False


def one_value_each(args: list[str]) -> None:
    """The new values a resume gives: one per key. A sweep's (`2,3`, `range(...)`) would
    renumber a resumed sweep's jobs, and a job kept from before would stand for another
    (ConfigError)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from lptrain.errors import ConfigError
    parser = OverridesParser.create()
    for arg in args:
        try:
            swept = parser.parse_override(arg).is_sweep_override()
        except HydraException:
            continue                # check_command reports it
        if swept:
            raise ConfigError(f"{arg}: with resume= each key takes one value (a run, or "
                              f"a sweep, keeps its jobs)")


def check_writable(directory: str, key: str = "hydra.run.dir") -> str | None:
    """Why `directory`, the value of `key`, cannot be written (None: it can), tried with
    a probe file."""
    try:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".lptrain-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return f"{key}={directory!r}: cannot write there ({reason(exc)})"
    return None


FULL_ERROR = "HYDRA_FULL_ERROR"
HYDRA_TRACE = "error-hydra.log"


@contextmanager
def hydra_raising(environ=os.environ):
    """Hydra raises its errors to the caller instead of reporting them (a sweeper
    plugin's error as a traceback); yields whether the caller is to say them, i.e.
    unless the user set HYDRA_FULL_ERROR to see the traceback."""
    if environ.get(FULL_ERROR) == "1":       # Hydra's own test
        yield False
        return
    before = environ.get(FULL_ERROR)
    environ[FULL_ERROR] = "1"
    try:
        yield True
    finally:
        if before is None:
            environ.pop(FULL_ERROR, None)
        else:
            environ[FULL_ERROR] = before


def hydra_failure(exc: Exception, directory: str | None, failures: list[int], jobs: int,
                  sweep: bool = True) -> tuple[str, int]:
    """(one line, exit status) for an error that ended Hydra: its own (a bad override,
    a configuration it could not compose: refused) or another, a sweeper plugin's say,
    whose traceback goes to the (sweep) directory (None: a command that writes nothing,
    --cfg); `failures` are the exit statuses of the failed jobs."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lptrain.config import one_line_error
    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        return str(one_line_error(exc)), REFUSED
    ended = "the sweeper ended the sweep" if sweep else "Hydra ended the run"
    line = f"{ended}: {type(exc).__name__}: {one_line(exc)}"
    if isinstance(exc, OSError) and not exc.filename and directory:   # Hydra's writes
        line += f" (writing in {directory})"                          # name no file
    if failures:
        line += f" ({len(failures)} of its {jobs} jobs failed: their lines above)"
    if directory is None:
        return line, max([*failures, FAILED])
    trace = Path(directory) / HYDRA_TRACE
    try:
        trace.write_text("".join(traceback.format_exception(exc)))
        line += f"; traceback in {trace}"
    except OSError:
        pass
    return line, max([*failures, FAILED])
