"""The process's own output streams: no colour codes where stderr is no terminal, and
stdout and stderr that outlive a terminal that hung up."""
from __future__ import annotations

import codecs
import errno
import logging
import os
import re
import shutil
import sys
import textwrap

_COLOUR = {"ours": False}   # NO_COLOR set by no_color_in_pipes, not by the user


def no_color_in_pipes(stream, environ) -> None:
    """NO_COLOR where `stream` (stderr) is no terminal: Optuna's log lines (colorlog,
    which cannot tell) reached files and pipes with escape codes. The console keeps its
    own terminal's colours (`colour_off`), and a NO_COLOR the user set is theirs."""
    if not _terminal(stream) and "NO_COLOR" not in environ:
        environ["NO_COLOR"] = "1"
        _COLOUR["ours"] = True


def colour_off() -> bool | None:
    """rich's no_color for the console: None (its own rule, NO_COLOR included) unless
    NO_COLOR is only no_color_in_pipes'."""
    return False if _COLOUR["ours"] else None


class HungUpStream:
    """A text stream (stdout, stderr) that goes on into /dev/null once its terminal has
    hung up: a closed terminal sends SIGHUP, which stops the run cleanly, and then every
    write to it fails with EIO, which had failed the stop itself (status failed, no
    resume line). Everything else is the stream's own."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._hung_up(exc)
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._hung_up(exc)

    def _hung_up(self, exc: OSError) -> None:
        if exc.errno != errno.EIO:
            raise exc
        to_devnull(self._stream)


ESCAPES = "lptrain_escape"     # the error handler `encodable` gives a stream


def _escape(exc: UnicodeError):
    """A character the encoding lacks as an escape (×: \\xd7); the bytes of a path that
    were not UTF-8, which Python holds as lone surrogates, as those bytes again (what
    the stream's own 'surrogateescape' wrote in the C locale)."""
    if isinstance(exc, UnicodeEncodeError):
        part = exc.object[exc.start:exc.end]
        if all(0xDC80 <= ord(c) <= 0xDCFF for c in part):
            return bytes(ord(c) - 0xDC00 for c in part), exc.end
    return codecs.backslashreplace_errors(exc)


def encodable(*streams) -> None:
    """Each stream writes the characters its encoding lacks as escapes instead of
    raising (under LC_ALL=C with PYTHONUTF8=0, or PYTHONIOENCODING=ascii, the ×, α and ü
    lptrain prints would end a command, or a finished run, in an error). A path's
    undecodable bytes are written back as they were (`_escape`)."""
    try:
        codecs.lookup_error(ESCAPES)
    except LookupError:
        codecs.register_error(ESCAPES, _escape)
    for stream in streams:
        try:
            if codecs.lookup(stream.encoding).name != "utf-8":
                stream.reconfigure(errors=ESCAPES)
        except (AttributeError, LookupError, TypeError, ValueError):
            pass          # not a text stream of the io module (a test's), or closed


def to_devnull(stream) -> None:
    """Point `stream`'s descriptor at /dev/null: what it still holds and every later
    write go nowhere (its terminal hung up, its reader went away, its disk is full),
    instead of failing again at the next flush or at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    finally:
        os.close(devnull)


def output_lost(prog: str, exc: OSError, stream=None) -> None:
    """A command's one line where its output (`stream`, default stdout) could not be
    written: the stream is silenced first, so that nothing fails again at exit."""
    to_devnull(stream or sys.stdout)
    say(f"{prog}: error: {exc.strerror or exc} while writing its output")


class WatchedStream:
    """A stream that notes the first write or flush that fails (`error`) and raises it as
    before: a logging handler drops such errors (Hydra's --info logs to stdout), and
    what it printed is still said lost."""

    def __init__(self, stream):
        self.stream, self.error = stream, None

    def write(self, text):
        return self._noted(self.stream.write, text)

    def flush(self):
        return self._noted(self.stream.flush)

    def _noted(self, call, *args):
        try:
            return call(*args)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def __getattr__(self, name):
        return getattr(self.stream, name)


def survive_hangup(module) -> None:
    """`module`'s (sys's) stdout and stderr as HungUpStreams, where they are terminals."""
    for name in ("stdout", "stderr"):
        stream = getattr(module, name)
        if _terminal(stream) and not isinstance(stream, HungUpStream):
            setattr(module, name, HungUpStream(stream))


def _terminal(stream) -> bool:
    """Whether `stream` is a terminal (a closed or foreign stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


_COMMAND = re.compile(r"((?<=resume with: ).*$|`[^`]*`)")   # a command to copy: kept whole
# MPI launchers whose output streams a rank's are forwarded to, and how far up the
# process tree one is looked for (MPICH: rank <- hydra_pmi_proxy <- mpiexec)
LAUNCHERS = ("mpiexec", "mpiexec.hydra", "mpirun", "orterun", "prterun")
LAUNCHER_DEPTH = 4


def for_terminal(text: str, stream, columns: int | None = None) -> str:
    """`text` (one line) as `stream` should get it: a terminal's lines broken between
    words at its width (it broke them mid-word: the resume command split in two), a
    command to copy (after 'resume with: ', or in backticks) on one line where it fits;
    a pipe or file gets the line whole, unless it is the pipe of an MPI launcher that
    writes to a terminal (`launcher_columns`)."""
    if not _terminal(stream):
        width = launcher_columns(stream)
        if width is None:
            return text
    else:
        try:      # the stream's own terminal (stdout may go to a file)
            width = columns or os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            width = shutil.get_terminal_size().columns
    kept = _COMMAND.sub(lambda m: m.group(0).replace(" ", "\0"), text)
    kept = kept.replace("resume with: ", "resume\0with: ")
    lines = textwrap.wrap(kept, width, subsequent_indent="  ", break_long_words=False,
                          break_on_hyphens=False, expand_tabs=False)
    return "\n".join(line.replace("\0", " ") for line in lines) or text


def say(line: str, stream=None) -> None:
    """Print one message line on `stream` (default stderr) as `for_terminal` gives it."""
    stream = stream or sys.stderr
    print(for_terminal(line, stream), file=stream, flush=True)


def launcher_columns(stream) -> int | None:
    """The columns of the terminal that the MPI launcher above this process (one of
    LAUNCHERS, up to LAUNCHER_DEPTH ancestors) writes `stream`'s descriptor (stdout or
    stderr) to, where it writes to one; None where it does not (a pipe, a file), where
    no launcher is above, or where /proc cannot tell (not Linux)."""
    try:
        if stream.isatty():
            return None                     # its own terminal: rich measures it
        fd, pid = stream.fileno(), os.getppid()
        for _ in range(LAUNCHER_DEPTH):
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            # "pid (name) state ppid ...": the name may hold spaces and parentheses
            name, after = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")"):]
            if name in LAUNCHERS:
                return _terminal_columns(f"/proc/{pid}/fd/{fd}")
            pid = int(after.split()[2])
            if pid <= 1:
                return None
    except (AttributeError, OSError, ValueError, IndexError):
        return None
    return None


def _terminal_columns(path: str) -> int | None:
    """The width of the terminal `path` (a /proc/PID/fd entry) leads to, None if it leads
    to none."""
    if not os.readlink(path).startswith(("/dev/pts/", "/dev/tty")):
        return None
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    try:
        return os.get_terminal_size(fd).columns
    finally:
        os.close(fd)


class HydraLines(logging.Formatter):
    """Hydra's own log lines on the console (hydra/hydra_logging/lptrain.yaml): its tabs
    (`[HYDRA] \\t#0 : mode=serial`) and runs of spaces as one space, and the line broken
    between words at the terminal's width as lptrain's own lines are (`for_terminal`);
    a pipe or file gets it whole."""

    def format(self, record: logging.LogRecord) -> str:
        text = " ".join(super().format(record).split())
        return for_terminal(text, sys.stdout)
