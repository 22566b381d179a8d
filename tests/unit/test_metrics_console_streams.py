"""The console's streams: plain text through a pipe, no colour codes where no terminal reads,
a closed pipe or hung-up terminal that lets the run go on, and stderr lines that break
between words on a terminal only."""
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import CONSOLE_TITLE, TTY_VARS
from lptrain.metrics.console import Console

REPO = Path(__file__).resolve().parents[2]
_SCRIPT = """
from lptrain.metrics.console import Console
c = Console(True, 40, "peaks")
for i in range(1, 41):
    c.update(i, loss=1.0 / i, accuracy=i / 40, fwd_iterations=2, fwd_residual=1e-4 / i)
c.message("done")
c.summary({"final loss": 0.025, "wall time": (1.5, "s")})
c.error("boom")
c.close()
"""


def test_output_through_a_pipe_is_plain_text():
    env = {k: v for k, v in os.environ.items() if k not in TTY_VARS}
    env.update(PYTHONPATH=str(REPO), TERM="xterm-256color", COLUMNS="100")
    res = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert "\x1b" not in res.stdout and "\x1b" not in res.stderr and "\r" not in res.stdout
    lines = res.stdout.splitlines()
    assert lines[0] == "peaks"
    progress = [line for line in lines if line[:1].isdigit()]
    assert progress[0].startswith("1/40  0:00:00 elapsed  eta -:--:--  loss 1.000  ")
    assert progress[-1].startswith("40/40  ")
    assert "eta 0:00:00  loss 0.02500  acc 1.000  " in progress[-1]
    assert progress[-1].endswith("fwd 2 it 2.5e-06")
    assert "done" in lines
    assert any("final loss" in line and "0.025" in line for line in lines)
    assert any("wall time" in line and "1.500 s" in line for line in lines)
    assert res.stderr == "error: boom\n"


class _ClosedPipe(io.StringIO):
    """A reader that has gone: every write raises, as `| head` leaves stdout."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_lets_the_run_go_on(plain_env, caplog):
    """rich raised SystemExit(1) there: `lptrain | head -2` failed the run at iteration
    1, status failed, no checkpoint."""
    c = Console(True, 10, CONSOLE_TITLE, file=_ClosedPipe())
    with caplog.at_level(logging.WARNING, logger="lptrain"):
        for k in range(1, 4):
            c.update(k, objective=1.0 / k, step_time=0.1)
        c.summary({"iterations": 3})
        c.message("still here")
    assert c._out.quiet
    assert "the console's output was closed; the run goes on" in caplog.text


@pytest.mark.parametrize("columns", ["0", "5"])
def test_a_console_asked_for_almost_no_columns_still_shows_the_run(plain_env, monkeypatch,
                                                                    columns):
    """COLUMNS=0 had printed nothing at all (no title, progress, summary or paths)."""
    from lptrain.metrics.console import MIN_COLUMNS
    monkeypatch.setenv("COLUMNS", columns)
    out, err = io.StringIO(), io.StringIO()
    c = Console(True, 2, CONSOLE_TITLE, file=out, err_file=err)
    c.update(1, objective=0.5, step_time=0.1)
    c.summary({"iterations": 1})
    c.error("boom")
    assert c.width == MIN_COLUMNS
    assert CONSOLE_TITLE in out.getvalue() and "J 0.5000" in out.getvalue()
    assert "iterations" in out.getvalue() and "boom" in err.getvalue()


def test_characters_the_output_cannot_encode_are_escaped_not_raised():
    """Under LC_ALL=C with PYTHONUTF8=0 `lptrain --help` ended in a traceback on its ×,
    and a finished run failed on the ü of its directory."""
    from lptrain.metrics.streams import encodable
    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii")
    encodable(ascii_out, io.StringIO())          # a stream of no encoding: left alone
    ascii_out.write("28×28 in /ü\n")
    ascii_out.write("/t/\udcc3\udcbc_X\n")        # a path's bytes Python could not decode
    ascii_out.flush()
    assert raw.getvalue() == b"28\\xd728 in /\\xfc\n/t/\xc3\xbc_X\n"   # its bytes again
    utf8 = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    encodable(utf8)
    assert utf8.errors == "strict"


class _FullDisk(io.StringIO):
    """stdout to /dev/full or a file on a full disk: every write raises ENOSPC."""

    def write(self, text):
        raise OSError(28, "No space left on device")


def test_an_output_that_cannot_be_written_lets_the_run_go_on(plain_env, caplog):
    """`lptrain > /dev/full` failed the run before its first iteration (rich raises any
    error but a broken pipe)."""
    c = Console(True, 10, CONSOLE_TITLE, file=_FullDisk())
    with caplog.at_level(logging.WARNING, logger="lptrain"):
        for k in range(1, 4):
            c.update(k, objective=1.0 / k, step_time=0.1)
        c.summary({"iterations": 3})
    assert c._out.quiet
    assert caplog.text.count("the console's output cannot be written (No space left on "
                             "device); the run goes on") == 1


@pytest.mark.parametrize("error, expect", [
    (OSError(28, "No space left on device"),
     "lptrain-report: error: No space left on device while writing its output\n"),
    (BrokenPipeError(32, "Broken pipe"),
     "lptrain-report: error: Broken pipe while writing its output\n")])
def test_a_tool_whose_output_cannot_be_written_ends_in_one_line(error, expect, capfd,
                                                                monkeypatch):
    from lptrain import commands
    monkeypatch.setattr(os, "dup2", lambda *a: None)    # keep pytest's captured stdout

    def run():
        raise error
    assert commands._written("lptrain-report", run) == 1
    assert capfd.readouterr().err == expect


def test_a_watched_stream_notes_a_failed_write_that_a_handler_drops():
    """Hydra's --info logs to stdout through a handler that drops a write's error: the
    command exited 0 with its output lost."""
    from lptrain.metrics.streams import WatchedStream
    watched = WatchedStream(_FullDisk())
    log = logging.getLogger("lptrain.test.watched")
    handler = logging.StreamHandler(watched)
    log.addHandler(handler)
    raising = logging.raiseExceptions
    logging.raiseExceptions = False               # as the lptrain command sets it
    try:
        log.warning("the info")                   # dropped by the handler
    finally:
        logging.raiseExceptions = raising
        log.removeHandler(handler)
    assert isinstance(watched.error, OSError) and watched.error.errno == 28
    fine = WatchedStream(io.StringIO())
    fine.write("x")
    fine.flush()
    assert fine.error is None and fine.getvalue() == "x"      # the rest passes through


def _tool_mains():
    from lptrain.evaluate import main as evaluate
    from lptrain.model_perf.cli import main as model
    from lptrain.report.cli import main as report
    return {"lptrain-eval": evaluate, "lptrain-report": report, "lptrain-model": model}


@pytest.mark.parametrize("prog", ["lptrain-eval", "lptrain-report", "lptrain-model"])
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_a_tools_help_that_cannot_be_written_ends_in_one_line(prog, flag, capfd,
                                                              monkeypatch):
    """`lptrain-report --help > /dev/full` exited 0: argparse drops its write errors."""
    from lptrain import commands
    monkeypatch.setattr(os, "dup2", lambda *a: None)    # keep pytest's captured stdout
    main = _tool_mains()[prog]
    monkeypatch.setattr(sys, "stdout", _FullDisk())
    assert commands._written(prog, lambda: main([flag])) == 1
    assert capfd.readouterr().err == \
        f"{prog}: error: No space left on device while writing its output\n"


@pytest.mark.parametrize("prog", ["lptrain-eval", "lptrain-report", "lptrain-model"])
def test_every_tool_says_its_version_as_lptrain_does(prog, capsys):
    from lptrain.help_format import version_line
    with pytest.raises(SystemExit) as stop:
        _tool_mains()[prog](["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out == version_line() + "\n" and out.startswith("lptrain 0.")   # one line


def test_a_tools_error_naming_a_file_is_not_taken_for_its_output():
    from lptrain import commands

    def run():
        raise FileNotFoundError(2, "No such file or directory", "runs/x")
    with pytest.raises(FileNotFoundError):
        commands._written("lptrain-report", run)


def test_no_colour_codes_where_the_output_is_no_terminal(monkeypatch):
    """Optuna's log lines (colorlog cannot tell a pipe from its formatter) reached files
    and pipes with escape codes."""
    from lptrain.metrics import streams
    from lptrain.metrics.streams import no_color_in_pipes
    monkeypatch.setitem(streams._COLOUR, "ours", False)     # restored after the test
    env = {}
    no_color_in_pipes(io.StringIO(), env)
    assert env == {"NO_COLOR": "1"}

    class Tty(io.StringIO):
        def isatty(self):
            return True
    env = {}
    no_color_in_pipes(Tty(), env)
    assert env == {}
    env = {"NO_COLOR": ""}                     # the user's own setting stays
    no_color_in_pipes(io.StringIO(), env)
    assert env == {"NO_COLOR": ""}


def test_lptrain_s_own_no_color_leaves_the_console_its_terminal_colours(monkeypatch):
    """`lptrain 2>err.log` on a terminal lost the console's colours to the NO_COLOR set
    for Optuna's lines; a user's NO_COLOR still holds."""
    from lptrain.metrics import streams
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setitem(streams._COLOUR, "ours", True)
    assert Console(True, 3, "run", file=io.StringIO())._out.no_color is False
    monkeypatch.setitem(streams._COLOUR, "ours", False)
    assert Console(True, 3, "run", file=io.StringIO())._out.no_color is True


class _HungUp(io.StringIO):
    """A terminal stream after its terminal closed: writes fail with `code`."""

    def __init__(self, fd: int, code: int):
        super().__init__()
        self.fd, self.code = fd, code

    def fileno(self):
        return self.fd

    def isatty(self):
        return True

    def write(self, text):
        if os.path.samestat(os.fstat(self.fd), os.stat(os.devnull)):
            return len(text)
        raise OSError(self.code, os.strerror(self.code))


def test_a_hung_up_terminal_is_written_to_nowhere_not_raised(tmp_path):
    """A closed terminal sends SIGHUP (a clean stop) and then fails every write with EIO:
    the stop's own lines had failed the run (status failed, no resume line)."""
    import errno
    import types

    from lptrain.metrics.streams import HungUpStream, survive_hangup
    fd = os.open(tmp_path / "tty", os.O_WRONLY | os.O_CREAT)
    try:
        module = types.SimpleNamespace(stdout=_HungUp(fd, errno.EIO), stderr=io.StringIO())
        survive_hangup(module)
        assert isinstance(module.stdout, HungUpStream)
        assert not isinstance(module.stderr, HungUpStream)          # no terminal
        assert module.stdout.write("interrupted by SIGHUP") == 21    # no OSError
        assert os.path.samestat(os.fstat(fd), os.stat(os.devnull))
        assert module.stdout.write("resume with: ...") == 16         # /dev/null now
        module.stdout.writelines(["a\n", "b\n"])
        other = HungUpStream(_HungUp(fd, errno.ENOSPC))
        os.dup2(os.open(tmp_path / "disk", os.O_WRONLY | os.O_CREAT), fd)
        with pytest.raises(OSError, match="No space"):               # not a hang-up
            other.write("x")
    finally:
        os.close(fd)


def test_a_line_on_stderr_breaks_between_words_on_a_terminal_only():
    """The terminal broke `lptrain: ...` lines mid-word at 80 columns, the resume
    command among them ('resume w' / 'ith: lptrain resume=...')."""
    from lptrain.metrics.streams import for_terminal

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    stop = ("lptrain: interrupted by SIGINT after iteration 57 (status interrupted); resume "
            "with: /venv/bin/mpiexec -n 2 /venv/bin/lptrain resume=/tmp/a/long/run/directory")
    assert for_terminal(stop, Terminal(), 80).splitlines() == [
        "lptrain: interrupted by SIGINT after iteration 57 (status interrupted);",
        "  resume with:",
        "  /venv/bin/mpiexec -n 2 /venv/bin/lptrain resume=/tmp/a/long/run/directory"]
    refused = "lptrain: error: foo: not an lptrain option (added with '+'?); " \
              "`lptrain --cfg job` lists the options"
    assert for_terminal(refused, Terminal(), 80).splitlines() == [
        "lptrain: error: foo: not an lptrain option (added with '+'?);",
        "  `lptrain --cfg job` lists the options"]
    assert for_terminal(stop, io.StringIO(), 80) == stop          # a pipe: one line
    # the sweep's command and an install hint stay whole (review: split over lines)
    sweep = ("lptrain: SIGINT in the run's last iteration: /tmp/s/0 ended as metrics.h5 "
             "says; the sweep stops here (`mpiexec -n 2 lptrain resume=/tmp/s` carries on "
             "the jobs left)")
    assert "`mpiexec -n 2 lptrain resume=/tmp/s`" in for_terminal(sweep, Terminal(), 60)
    hint = "lptrain: error: no tensorboard: install lptrain's tensorboard extra: " \
           "`pip install 'lptrain[tensorboard]'`"
    assert "`pip install 'lptrain[tensorboard]'`" in for_terminal(hint, Terminal(), 80)


LAUNCHED = """import io, sys
from lptrain.metrics.console import Console
from lptrain.metrics.streams import for_terminal, launcher_columns
with open(sys.argv[2], "w") as out:
    console = Console(True, 3, "t", file=sys.stdout, notes=[sys.argv[1][9:]])
    print(launcher_columns(sys.stderr), console.width, file=out)
    print(for_terminal(sys.argv[1], sys.stderr), file=out)
    console.message("  " + sys.argv[1][9:80])
"""


def _under_launcher(tmp_path, name: str, terminal: bool) -> list[str]:
    """What LAUNCHED writes when started by a script called `name` whose stdout and
    stderr are a terminal of 63 columns (or a file), its own a pipe to it, as a rank's
    are."""
    import fcntl
    import pty
    import struct
    import subprocess
    import sys
    import termios
    from pathlib import Path
    launcher = tmp_path / name
    launcher.write_text('#!/bin/sh\n"$PY" "$CHILD" "$LINE" "$RESULT" 2>&1 | tee "$SHOWN"\n')
    launcher.chmod(0o755)
    (tmp_path / "child.py").write_text(LAUNCHED)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 63, 0, 0))
    stop = ("lptrain: interrupted by SIGINT after iteration 26 (status interrupted); "
            "resume with: /venv/bin/mpiexec -n 2 /venv/bin/lptrain resume=/tmp/a/run")
    repo = str(Path(__file__).resolve().parents[2])
    result = tmp_path / "result"
    with open(tmp_path / "file", "w") as file:
        out = slave if terminal else file
        try:
            subprocess.run([str(launcher)], stdout=out, stderr=out, timeout=60, check=True,
                           env={"PY": sys.executable, "LINE": stop, "RESULT": str(result),
                                "SHOWN": str(tmp_path / "shown"),
                                "CHILD": str(tmp_path / "child.py"), "PYTHONPATH": repo,
                                "PATH": "/usr/bin:/bin"})
        finally:
            os.close(master)
            os.close(slave)
    return result.read_text().splitlines() + (tmp_path / "shown").read_text().splitlines()


def test_a_line_under_an_mpi_launcher_in_a_terminal_is_broken_at_its_width(tmp_path):
    """Under mpiexec a rank's stderr is the launcher's pipe, so the stop line came whole
    and the terminal broke the resume command mid-path at 80 columns (held-out check):
    the launcher's own terminal gives the width, the console's too."""
    lines = _under_launcher(tmp_path, "mpiexec", terminal=True)
    assert lines[:4] == ["63 63", "lptrain: interrupted by SIGINT after iteration 26 (status",
                         "  interrupted); resume with:",
                         "  /venv/bin/mpiexec -n 2 /venv/bin/lptrain resume=/tmp/a/run"]
    # the console's title notes and messages too (they ran past the edge, mid-word):
    # at 63 columns, an indent kept
    assert lines[4:] == ["t", "interrupted by SIGINT after iteration 26 (status interrupted);",
                         "  resume with: /venv/bin/mpiexec -n 2 /venv/bin/lptrain",
                         "  resume=/tmp/a/run",
                         "  interrupted by SIGINT after iteration 26 (status",
                         "    interrupted); resume w"]
    # a launcher writing to a file, and a parent that is no launcher: the lines whole
    lines = _under_launcher(tmp_path, "mpiexec", terminal=False)
    assert lines[0] == "None 80" and len(lines) == 5
    assert len(_under_launcher(tmp_path, "other", terminal=True)) == 5


def test_hydra_s_job_lines_lose_their_tab(capsys):
    """`[HYDRA] \t#0 : mode=serial`: the tab jumped to column 24 or 32 and the line ran
    past 80 columns mid-word on a terminal (held-out)."""
    import logging
    from lptrain.metrics.streams import HydraLines
    record = logging.LogRecord("hydra", logging.INFO, "x", 1, "\t#2 : mode=simultaneous  a=1",
                               None, None)
    assert HydraLines("[HYDRA] %(message)s").format(record) == \
        "[HYDRA] #2 : mode=simultaneous a=1"


def test_lptrain_models_unwritable_output_is_said_as_the_other_tools_say_it(monkeypatch,
                                                                           capfd):
    """It said "[Errno 28] No space left on device" and exited 2, the other tools one
    line and 1 (held-out re-check)."""
    from lptrain import commands
    from lptrain.model_perf import cli

    def full(args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cli, "run", full)
    monkeypatch.setattr(os, "dup2", lambda *a: None)
    assert commands._written("lptrain-model", lambda: cli.main(["--step-time", "1e-3",
                                                                 "--adjoint-time", "1e-3"])) == 1
    assert capfd.readouterr().err == ("lptrain-model: error: No space left on device while "
                                      "writing its output\n")

    def missing(args):
        raise FileNotFoundError(2, "No such file or directory", "costs.json")
    monkeypatch.setattr(cli, "run", missing)
    assert cli.main(["--step-time", "1e-3", "--adjoint-time", "1e-3"]) == cli.EXIT_ERROR
