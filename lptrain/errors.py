"""Exception types of lptrain: every user-facing failure carries the bad value.

Each type carries the exit status the command ends with (README "Exit status"):
REFUSED where the command or its inputs must change and no iteration ran, FAILED
where a run that started could not finish, 128 + the signal number where one stopped it.
"""

import os
import shlex
import shutil
import sys

FAILED = 1
REFUSED = 2
# the program's path as started, before a job may change directory (hydra.job.chdir)
_ARGV0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""


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
    return f"install lptrain's {extra} extra: `pip install 'lptrain[{extra}]'`"


class SolverError(LptrainError):
    """MGRIT was asked for something it cannot do (e.g. too many ranks)."""

    exit_code = REFUSED


class DivergedError(LptrainError):
    """Training produced a non-finite objective or one that grew past the divergence rule."""


class NonFiniteLogitsError(LptrainError, ArithmeticError):
    """A saved model's logits of some samples hold NaN or ±inf, so it names no class for
    them (argmax would pick one anyway); `samples` holds their indices."""

    def __init__(self, samples, total: int):
        self.samples = samples
        super().__init__(f"predict: {len(samples)} of {total} samples have non-finite "
                         f"logits (nan or inf), the first sample {int(samples[0])}: the "
                         f"parameters diverged or the input lies far outside the training "
                         f"data (model(features) gives the logits)")


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
    """The ranks agreed to stop after a signal (SIGINT, SIGHUP or SIGTERM).

    `exit_code` is 128 + the signal number, as a shell reports a process the
    signal ended; `iteration` is the last finished optimizer iteration.
    """

    def __init__(self, signum: int, iteration: int):
        import signal
        self.signum, self.iteration = signum, iteration
        self.exit_code = 128 + signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signal_name} after iteration {iteration}")


class Signalled(BaseException):
    """SIGINT or SIGTERM while a short command runs (`stops_on_signals`); a BaseException,
    as KeyboardInterrupt is, so that no `except Exception` takes it for a failure."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def stops_on_signals(prog: str, load) -> int:
    """The exit status of the command `load()` imports and returns (a function of no
    arguments); when SIGINT or SIGTERM arrives meanwhile, one line on stderr and 128 + the
    signal, as `lptrain` gives, instead of a KeyboardInterrupt traceback (SIGINT) or a
    silent end (SIGTERM). For the commands that keep no state to resume (lptrain-eval,
    -report, -model): they stop where they are. A signal during the imports is only
    noted, and acted on once they are done: raised inside an import, it can come out as
    another exception (e.g. a RuntimeError from a class body)."""
    import signal
    import sys
    received: list[int] = []

    def note(signum, frame):
        received.append(signum)

    def stop(signum, frame):
        received.append(signum)     # where Python swallows the raise (an at-fork hook)
        raise Signalled(signum)

    def handle(handler):
        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def unraisable(hook_args, report=sys.unraisablehook):
        if not isinstance(hook_args.exc_value, Signalled):   # noted: acted on later
            report(hook_args)
    before, unraisable_before = handle(note), sys.unraisablehook
    sys.unraisablehook = unraisable
    try:
        main = load()
        handle(stop)
        if received:
            raise Signalled(received[0])
        status = main()
        if received:                # raised where Python only reported it: stop now
            raise Signalled(received[0])
        return status
    except Signalled as exc:
        print(f"{prog}: interrupted by {signal.Signals(exc.signum).name}", file=sys.stderr,
              flush=True)
        return 128 + exc.signum
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)
        sys.unraisablehook = unraisable_before


# what a diverged run is told to try (its files keep the parameters from before)
DIVERGED_REMEDY = "lower the step size (optimizer.lr; L-BFGS: optimizer.step0) or check " \
                  "the data scaling"


# ... and one at the initial parameters, where no step size is to blame
DIVERGED_AT_START = "at the initial parameters, before any step: check network.T, " \
                    "network.init_* and the data scaling; in mode=mgrit or simultaneous " \
                    "the MGRIT solve may not converge at this layer step T/N (more layers " \
                    "or mode=serial)"


class StalledError(LptrainError):
    """Training stopped making progress and the user asked for a non-zero exit."""


def launch_words(argv0: str, search_path: str | None, prefix: str,
                 executable: str) -> tuple[str, str]:
    """(launcher, program): the words that start lptrain again as this process was
    started, for a command pasted into the same shell. A word stays bare where the
    shell's PATH finds that very file, else it is the file's absolute path: a system
    `mpiexec` of another MPI cannot launch the ranks of the environment's own (`prefix`/bin),
    and an `lptrain` not on PATH is not found. `python -m lptrain` stays so."""
    def word(name: str, file: str, resolve: bool = True) -> str:
        found = shutil.which(name, path=search_path)
        where = os.path.realpath if resolve else os.path.abspath
        same = found is not None and where(found) == where(file)
        return name if same else shlex.quote(os.path.abspath(file))

    mpiexec = os.path.join(prefix, "bin", "mpiexec")
    launcher = word("mpiexec", mpiexec) if os.path.isfile(mpiexec) else "mpiexec"
    base = os.path.basename(argv0)
    if base == "lptrain" and os.path.isfile(argv0):
        return launcher, word("lptrain", argv0)
    if base == "__main__.py":
        # an environment's python links to its base one, which has no lptrain: the very path
        return launcher, f"{word('python', executable, resolve=False)} -m lptrain"
    return launcher, "lptrain"


def resume_command(path, ranks: int = 1) -> str:
    """The command that carries on the run or sweep in `path` on `ranks` ranks (as it
    ran: an explicit split holds only there), started as this process was
    (`launch_words`) and quoted for a shell where the path needs it (a space, a quote),
    so that it can be pasted as printed."""
    argv0 = _ARGV0 if os.path.isfile(_ARGV0) else sys.argv[0]   # `python -m`: "-m" then
    launcher, program = launch_words(argv0, os.environ.get("PATH"), sys.prefix,
                                     sys.executable)
    launch = f"{launcher} -n {ranks} " if ranks > 1 else ""
    return f"{launch}{program} " + shlex.quote(f"resume={path}")


def report_command(path) -> str:
    """`lptrain-report PATH` to paste into the same shell: the environment's script, bare
    where PATH finds that very file (as `launch_words`), PATH quoted where it needs it."""
    script = os.path.join(sys.prefix, "bin", "lptrain-report")
    found = shutil.which("lptrain-report", path=os.environ.get("PATH"))
    bare = not os.path.isfile(script) or (
        found is not None and os.path.realpath(found) == os.path.realpath(script))
    where = str(path)
    if where.startswith("-"):              # not an option to the command
        where = f"./{where}"
    return f"{'lptrain-report' if bare else shlex.quote(script)} {shlex.quote(where)}"


def text_lines(exc: BaseException) -> list[str]:
    """The non-blank lines of an exception's text, stripped."""
    return [line.strip() for line in str(exc).splitlines() if line.strip()]


def first_line(exc: BaseException) -> str:
    """An exception's first line (libraries' errors run to lines of advice), its type's
    name where it has no text."""
    lines = text_lines(exc)
    return lines[0] if lines else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """An exception's text in one line: its first line and, where it has more (an MPI
    error stack), its last, which says what failed."""
    lines = text_lines(exc)
    if len(lines) < 2:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1]}"


def reason(exc: OSError) -> str:
    """The system's reason for an OSError, without errno and file name."""
    return exc.strerror or str(exc)


def require(ok: bool, key: str, value, what: str) -> None:
    """Raise ConfigError naming `key` and `value` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r}: {what}")


def one_of(names) -> str:
    """'choose one of a, b, c': the choices a refusal offers, worded alike everywhere."""
    return "choose one of " + ", ".join(map(str, names))


def counted(n: int, noun: str) -> str:
    """'1 C-interval', '4 C-intervals': a count and its noun, for messages."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
