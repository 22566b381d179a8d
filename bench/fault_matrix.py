"""The fault matrix: lptrain under hostile input, signals, kills and disk faults, classified.

    .venv/bin/python bench/fault_matrix.py [--quick] [--jobs 3] [--timeout 120] [-k WORD]

Runs every case of bench/fault_cases.py (bad options, malformed data and run files,
signals at mpiexec and at one rank, SIGKILL + resume, disk full, an unwritable run
directory, two runs in one directory) on 1 and 2 ranks (`--quick`: 1 rank, a
representative subset) and sorts each outcome into one kind:

- clean: the exit status the README's "Exit status" table gives the case (2 refused,
  1 failed, 128 + the signal stopped, 0 for what must work) and exactly one line on
  stderr (none after a success) that names the cause;
- hang: the launch outlived its timeout (killed by `timeout`, then by process group);
- traceback: a Python traceback on stderr, or an error-rank<r>.log left in the run directory
  (the "unexpected exception" path);
- data lost: the run's files miss what they must keep (metrics rows, a model after a
  checkpoint, a resume that does not continue from the checkpoint's iteration);
- other: a wrong exit status, not one line, or a line that does not name the cause.

It prints per class tried / clean / hangs / tracebacks / data lost / other and then every
case that is not clean with its command and its output; it exits 1 if any case is not clean.
Every launch runs under `timeout`, with MPIR_CVAR_ENABLE_HEAVY_YIELD=1 and OMP_NUM_THREADS=1.
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from launch import ENV as TEST_ENV  # noqa: E402  (tests/launch.py: the installed commands)
from launch import LPTRAIN, MPIEXEC, rank_pids  # noqa: E402

ENV = {**TEST_ENV, "OMP_NUM_THREADS": "1", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
KILL_AFTER = 5          # seconds between `timeout`'s SIGTERM and its SIGKILL
TIMED_OUT = (124, 137)  # `timeout`'s statuses for a command that outlived it

CLEAN, HANG, TRACEBACK, LOST, OTHER = "clean", "hang", "traceback", "data lost", "other"
KINDS = (CLEAN, HANG, TRACEBACK, LOST, OTHER)


@dataclass
class Outcome:
    """What one case observed: the judged command, its status (None: it hung), its stderr,
    what the checks of the run's files found missing, and error logs left behind."""
    command: str
    rc: int | None
    stderr: str
    lost: str = ""
    wrong: str = ""             # any other broken promise (a late stop, a lock left behind)
    error_logs: list[str] = field(default_factory=list)


@dataclass
class Case:
    """One fault: `run(work_dir, timeout)` does it and returns the Outcome to judge."""
    group: str
    name: str
    ranks: int
    expect: tuple[int, ...]
    needle: str                       # the cause the one line must name ("" after success)
    run: Callable[[Path, float], Outcome]
    quick: bool = False
    prog: str = "lptrain"             # the command whose "<prog>: " starts the line


def message_lines(stderr: str) -> list[str]:
    """The lines of stderr that lptrain (not mpiexec's own notices) printed."""
    return [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("[mpiexec@")]


def classify(out: Outcome, expect: tuple[int, ...], needle: str,
             prog: str = "lptrain") -> tuple[str, str]:
    """The kind of an outcome and why (pure: the unit test feeds it canned outcomes)."""
    if out.rc is None or out.rc in TIMED_OUT:
        return HANG, "still running at the timeout"
    if "Traceback" in out.stderr or out.error_logs:
        return TRACEBACK, ", ".join(out.error_logs) or "a traceback on stderr"
    if out.lost:
        return LOST, out.lost
    if out.rc not in expect:
        return OTHER, f"exit {out.rc}, expected {' or '.join(map(str, expect))}"
    lines = message_lines(out.stderr)
    if expect == (0,) and lines:
        return OTHER, f"{len(lines)} lines on stderr after a success"
    if expect == (0,):
        return (OTHER, out.wrong) if out.wrong else (CLEAN, "")
    if len(lines) != 1:
        return OTHER, f"{len(lines)} lines on stderr, expected 1"
    if not lines[0].startswith(f"{prog}: "):
        return OTHER, f"the line does not start with '{prog}: '"
    if needle not in lines[0]:
        return OTHER, f"the line does not name {needle!r}"
    return (OTHER, out.wrong) if out.wrong else (CLEAN, "")


# -- launching ---------------------------------------------------------------------------
def command(args: list[str], ranks: int, prog: str = LPTRAIN) -> list[str]:
    return [MPIEXEC, "-n", str(ranks), prog, *args] if ranks > 1 else [prog, *args]


def shown(cmd: list[str], cwd: Path | None = None) -> str:
    """A reproducer to paste: the command with the venv's paths shortened."""
    text = shlex.join(cmd).replace(str(Path(LPTRAIN).parent) + "/", ".venv/bin/")
    return f"(cd {cwd} && {text})" if cwd else text


class Launch:
    """One command under `timeout` in its own session (so a hang is ended with every rank),
    stderr to a file."""

    def __init__(self, cmd: list[str], cwd: Path, timeout: float, tag: str = "run"):
        self.cmd, self.cwd, self.timeout = cmd, cwd, timeout
        self.err_path = cwd / f"{tag}.stderr"
        self.start = time.monotonic()
        with open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                ["timeout", "-k", str(KILL_AFTER), str(int(timeout)), *cmd], cwd=cwd,
                env=ENV, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def target(self, who: str) -> int:
        """The pid of `who`: mpiexec (or the single process) or rank<r> under mpiexec."""
        top = _child(self.proc.pid) or self.proc.pid     # below `timeout`
        return top if who in ("mpiexec", "solo") else rank_pids(top).get(int(who[4:]), top)

    def signal(self, who: str, sig: int) -> None:
        try:
            if who == "all":        # a terminal's Ctrl-C, less the `timeout` wrapper (which
                for pid in _group(self.proc.pid):     # would pass it on a second time)
                    os.kill(pid, sig)
            else:
                os.kill(self.target(who), sig)
        except ProcessLookupError:
            pass

    def wait(self) -> int | None:
        """The exit status, None if it had to be killed (a hang)."""
        try:
            rc = self.proc.wait(timeout=max(1.0, self.timeout + 3 * KILL_AFTER
                                            - (time.monotonic() - self.start)))
        except subprocess.TimeoutExpired:
            rc = None
        self.kill()
        return None if rc is None or rc in TIMED_OUT else rc

    def kill(self) -> None:
        """End whatever is left of the session (ranks that outlived a killed mpiexec)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def outcome(self, lost: str = "", run_dir: Path | None = None) -> Outcome:
        rc = self.wait()
        logs = sorted(str(p) for p in run_dir.glob("error-rank*.log")) if run_dir and \
            run_dir.is_dir() else []
        return Outcome(shown(self.cmd, self.cwd), rc, self.stderr(), lost, logs)


def _group(pgid: int) -> list[int]:
    """The processes of process group `pgid` but its leader."""
    found = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split() if int(p) != pgid]


def _child(pid: int) -> int | None:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def run_once(args: list[str], ranks: int, cwd: Path, timeout: float, run_dir: Path | None = None,
             prog: str = LPTRAIN, tag: str = "run") -> Outcome:
    """Launch, wait, and collect the outcome (no checks of the run's files)."""
    return Launch(command(args, ranks, prog), cwd, timeout, tag).outcome(run_dir=run_dir)


# -- the matrix --------------------------------------------------------------------------
@dataclass
class Result:
    case: Case
    outcome: Outcome
    kind: str
    why: str
    seconds: float


def judge(case: Case, work: Path, timeout: float) -> Result:
    # a plain name: Hydra's override grammar takes no spaces, parentheses or '=' in paths
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{case.group}-{case.name}-{case.ranks}")
    where = work / slug
    for i in itertools.count(1):
        if not where.exists():
            break
        where = work / f"{slug}-{i}"
    where.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        out = case.run(where, timeout)
    except Exception as exc:                  # the matrix's own failure is a finding too
        out = Outcome(case.name, -1, f"fault_matrix: {type(exc).__name__}: {exc}")
        return Result(case, out, OTHER, f"the case itself failed: {exc}", 0.0)
    kind, why = classify(out, case.expect, case.needle, case.prog)
    return Result(case, out, kind, why, time.monotonic() - t0)


def table(results: list[Result]) -> str:
    """Markdown: one row per class of fault, a column per kind of outcome."""
    groups = sorted({r.case.group for r in results}, key=[r.case.group for r in results].index)
    rows = ["| class | tried | clean | hangs | tracebacks | data lost | other |",
            "|---|---|---|---|---|---|---|"]
    for g in [*groups, None]:
        mine = [r for r in results if g is None or r.case.group == g]
        counts = [sum(r.kind == k for r in mine) for k in KINDS]
        label = g or "**all**"
        rows.append(f"| {label} | {len(mine)} | " + " | ".join(map(str, counts)) + " |")
    return "\n".join(rows)


def failures(results: list[Result]) -> str:
    parts = []
    for r in results:
        if r.kind == CLEAN:
            continue
        c, o = r.case, r.outcome
        parts.append(f"[{r.kind}] {c.group}/{c.name} on {c.ranks} rank(s): {r.why}\n"
                     f"  $ {o.command}\n  exit {o.rc}; stderr:\n"
                     + "".join(f"    {ln}\n" for ln in o.stderr.splitlines()[-15:]))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    from fault_runs import all_cases      # bench/ is on sys.path when run as a script
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 rank, a representative subset")
    p.add_argument("--jobs", type=int, default=3, help="cases run at once")
    p.add_argument("--timeout", type=float, default=120, help="seconds per launch")
    p.add_argument("-k", dest="select", action="append", default=[],
                   help="only cases whose class/name has this text (repeatable: any)")
    p.add_argument("--work", type=Path, default=None, help="keep the run directories here")
    args = p.parse_args(argv)
    import tempfile
    work = args.work or Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    cases = [c for c in all_cases(work / "fixtures", quick=args.quick)
             if not args.select or any(k in f"{c.group}/{c.name}" for k in args.select)]
    print(f"{len(cases)} cases, {args.jobs} at a time, work directory {work}", flush=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(judge, c, work, args.timeout) for c in cases]
        results = []
        for f in futures:
            r = f.result()
            results.append(r)
            print(f"  {r.kind:9} {r.seconds:5.1f} s  {r.case.group}/{r.case.name} "
                  f"({r.case.ranks} rank{'s' if r.case.ranks > 1 else ''}) {r.why}", flush=True)
    print(f"\n{table(results)}\n\n{time.monotonic() - t0:.0f} s in all")
    bad = failures(results)
    if bad:
        print(f"\nNot clean:\n{bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
