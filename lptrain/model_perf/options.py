"""`lptrain-model`'s command line: its options, their ranges, and the lists they take."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from lptrain.errors import ConfigError
from lptrain.help_format import out_dir

PROG = "lptrain-model"
DEFAULT_RANKS = ",".join(str(2 ** k) for k in range(11))


def parser() -> argparse.ArgumentParser:
    from lptrain.help_format import Parser, WordsFormatter
    p = Parser(prog=PROG, description="Predict time per optimizer "
                                "iteration and speedup over serial for P ranks.",
                                formatter_class=WordsFormatter)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="lptrain config overrides, e.g. experiment=peaks_paper")
    p.add_argument("--step-time", type=float, metavar="S",
                   help="forward step of the full batch [s] (with --adjoint-time: these "
                        "costs instead of measured ones)")
    p.add_argument("--adjoint-time", type=float, metavar="S",
                   help="adjoint step of the full batch [s]")
    p.add_argument("--weight-time", type=float, metavar="S",
                   help="weight-gradient product of one layer [s] (default: the adjoint "
                        "time)")
    p.add_argument("--overhead", type=float, metavar="S",
                   help="batch-independent part of one given kernel call [s] (default 0)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads while measuring kernels (default 1: one rank per core)")
    p.add_argument("--host-ranks", type=int, metavar="K",
                   help="ranks that share one host in the runs predicted: costs are also "
                        "measured with K copies at once, and P ranks pay those of min(P, K) "
                        "(default: this host's cores with --threads 1; 1: alone only)")
    p.add_argument("--fresh", action="store_true",
                   help="measure the kernels now even if this host has kept costs, and "
                        "forget the splits parallel.layer_ranks=auto kept")
    p.add_argument("--latency", type=float, metavar="S", help="message latency α [s]")
    p.add_argument("--bandwidth", type=float, metavar="B", help="bandwidth β [bytes/s]")
    p.add_argument("--ranks", default=DEFAULT_RANKS, help=f"P values (default {DEFAULT_RANKS})")
    p.add_argument("--trials", type=float,
                   help="objective evaluations per iteration (default: measured runs, else 1)")
    p.add_argument("--mgrit-iters", metavar="F,A",
                   help="mode=mgrit cycles per forward,adjoint solve (default: measured "
                        "mgrit runs, else 5,5)")
    p.add_argument("--measured", nargs="+", type=Path, default=[], metavar="PATH",
                   help="metrics.h5 files or run directories to compare with")
    p.add_argument("--paper", action="store_true", help="mark the paper's speedups")
    p.add_argument("--out", type=out_dir, default=Path("speedup_model"), metavar="DIR",
                   help="where speedup_model.md and .png go (default speedup_model/)")
    return p


# option: (least value, whether the least is allowed); every value must be finite
_BOUNDS = {"step_time": (0.0, False), "adjoint_time": (0.0, False),
           "weight_time": (0.0, True), "overhead": (0.0, True), "latency": (0.0, True),
           "bandwidth": (0.0, False), "trials": (1.0, True), "threads": (1, True),
           "host_ranks": (1, True)}


def check_args(args) -> None:
    """The numeric options in their ranges (ConfigError naming the option and value)."""
    for name, (least, allowed) in _BOUNDS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if not (math.isfinite(value) and (value >= least if allowed else value > least)):
            need = f"{'at least' if allowed else 'above'} {least:g}"
            raise ConfigError(f"--{name.replace('_', '-')} {value!r}: need a finite "
                              f"number {need}")
    if (args.latency is None) != (args.bandwidth is None):
        raise ConfigError("--latency and --bandwidth go together: give both or neither "
                          "(neither: measured by a ping-pong under mpiexec, else defaults)")
    # before the model records anything (minutes on a deep network), not after
    if (args.step_time is None) != (args.adjoint_time is None) or args.step_time is None \
            and (args.weight_time is not None or args.overhead is not None):
        raise ConfigError("--step-time and --adjoint-time go together (with --weight-time, "
                          "--overhead); give both or neither")
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out}: a file; name a directory for the model's "
                          f"report")


def parse(argv) -> argparse.Namespace:
    """The options of `argv`: overrides before, between and after them, also after
    `--measured DIR ...` (whose nargs="+" takes them for paths)."""
    args = parser().parse_intermixed_args(argv)
    given = [p for p in args.measured if "=" in p.name and not p.exists()]
    args.measured = [p for p in args.measured if p not in given]
    args.overrides += [str(p) for p in given]
    return args


def numbers(text: str, option: str, count: int | None = None) -> list[float]:
    """Comma-separated numbers of an option (ConfigError naming it otherwise)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or (count is not None and len(values) != count) or not all(
            math.isfinite(v) for v in values):
        want = f"{count} comma-separated numbers" if count else "comma-separated numbers"
        raise ConfigError(f"{option} {text!r}: need {want}")
    return values


def ranks_of(text: str) -> list[int]:
    values = numbers(text, "--ranks")
    if any(p < 1 or p != int(p) for p in values):
        raise ConfigError(f"--ranks {text!r}: need positive integers")
    return sorted({int(p) for p in values})
