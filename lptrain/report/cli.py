"""The `lptrain-report` command: find metrics files, label the runs, write plots and summary.md.

    lptrain-report PATH [PATH ...] [--out DIR]

PATH is a metrics.h5 file, a run directory, or any directory above run directories (a
Hydra multirun directory): directories are searched recursively for metrics.h5; a run
directory below without one (a job refused or stopped before its first iteration) is
named on stderr. A missing or unreadable input prints one line on stderr and exits
with status 2.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from lptrain.errors import reason
from lptrain.help_format import Parser, out_dir
from lptrain.metrics import schema as s
from lptrain.metrics.streams import say
from lptrain.metrics.reader import (RunMetrics, find_metrics, read_metrics,
                                    runs_without_metrics)
from lptrain.report.labels import hydra_choices, run_labels, typed_overrides
from lptrain.report.plots import write_plots
from lptrain.metrics.timing import markdown as timing_markdown
from lptrain.report.table import (NOTES, PER_RANK_NOTE, add_speedup, flat_config, rank_times,
                                  summarize, to_markdown)

EXIT_INPUT = 2


def report_context(runs: Sequence[RunMetrics]) -> str:
    """What the runs are, for the figures' titles: their datasets, the experiment they
    ran (Hydra's record of the choice, `<run dir>/.hydra/hydra.yaml`), the data
    overrides they were all given (a cut experiment is not the experiment) and their
    modes, e.g. 'peaks, experiment=peaks_paper: serial, mgrit, simultaneous'."""
    configs = [flat_config(run.attrs.get(s.CONFIG, "")) for run in runs]
    datasets = _distinct(str(c["dataset.name"]) for c in configs if "dataset.name" in c)
    chosen = [_experiment(run) for run in runs]
    experiments = [f"experiment={e}" + ("" if n == len(runs) else f" ({n} of {len(runs)} runs)")
                   for e in _distinct(e for e in chosen if e) for n in [chosen.count(e)]]
    text = ", ".join([*datasets, *experiments, *_shared_data_overrides(runs)])
    modes = ", ".join(_distinct(run.mode for run in runs))
    return f"{text}: {modes}" if text else modes


def build_report(runs: Sequence[RunMetrics], out: Path) -> list[Path]:
    """Write the plots and summary.md for `runs` into `out` (created); return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    labels = run_labels(runs)
    rows = add_speedup([summarize(label, run) for label, run in zip(labels, runs)])
    summary = out / "summary.md"
    ranks = time_per_rank(runs, labels)
    summary.write_text(to_markdown(rows) + "\n" + NOTES + (PER_RANK_NOTE if ranks else "")
                       + ranks)
    return [*write_plots(list(zip(labels, runs)), out, report_context), summary]


def time_per_rank(runs: Sequence[RunMetrics], labels: Sequence[str]) -> str:
    """summary.md's section on where each run's ranks spent their time (runs on more
    than one rank; '' when there are none)."""
    parts = []
    for label, run in zip(labels, runs):
        timing = rank_times(run)
        if timing is not None and timing.size > 1:
            parts.append(f"\n### {label}\n\n{timing_markdown(timing)}")
    if not parts:
        return ""
    return ("\n## Time per rank\n\nSeconds each rank spent computing, in communication "
            "calls (a collective counts whole, its wait for slower ranks included) and "
            "waiting for messages, summed over the iterations of the run's last grid "
            "(timing/ in metrics.h5).\n" + "".join(parts))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `lptrain-report`; returns the exit status."""
    parser = Parser(
        prog="lptrain-report",
        description="Plots and a summary table of one or more lptrain runs.")
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="metrics.h5 file, run directory or multirun directory")
    parser.add_argument("--out", type=out_dir, default=Path("report"), metavar="DIR",
                        help="directory for the PNG files and summary.md (default: report)")
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and not args.out.is_dir():
            raise OSError(f"--out {args.out}: a file; name a directory for the report")
        runs = [read_metrics(path) for path in find_metrics(args.paths)]
        for directory in runs_without_metrics(args.paths):
            say(f"lptrain-report: note: {directory}: no {s.FILE_NAME} (a run refused or "
                f"stopped before its first iteration, its lptrain.log says why); left out")
        written = build_report(runs, args.out)
    except OSError as exc:  # MetricsFileError included
        say(f"lptrain-report: error: {_message(exc)}")
        return EXIT_INPUT
    for path in written:
        print(path)
    return 0


def _message(exc: OSError) -> str:
    """One line for an OSError: the path and the system's reason, without errno."""
    if exc.errno is None:           # ours (and MetricsFileError): the message names the path
        return str(exc)
    return f"{exc.filename}: {reason(exc)}" if exc.filename else reason(exc)


def _shared_data_overrides(runs: Sequence[RunMetrics]) -> list[str]:
    """The `dataset.*` overrides every run was typed with, alike (e.g. QUICK=1's
    dataset.n_train=500), as typed."""
    typed = [typed_overrides(run) for run in runs]
    first = typed[0] if typed else {}
    return [f"{key}={value}" for key, value in first.items()
            if key.startswith("dataset.") and all(t.get(key) == value for t in typed[1:])]


def _experiment(run: RunMetrics) -> str | None:
    """The `experiment=` choice of the run, from Hydra's files next to its metrics.h5."""
    return hydra_choices(run).get("experiment")


def _distinct(values) -> list[str]:
    """`values` without repeats, in first-seen order."""
    return list(dict.fromkeys(values))


if __name__ == "__main__":
    from lptrain.errors import stops_on_signals
    sys.exit(stops_on_signals("lptrain-report", lambda: main))
