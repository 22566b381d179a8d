"""Cheaper cycle schedules for one-shot training: quality against work.

    .venv/bin/python bench/schedule_quality.py [--only ROW ...] [--variants NAME ...]

For each row of bench/simultaneous_quality.py's MATRIX and each schedule variant: a
simultaneous run (the default error-controlled plan), both final iterates evaluated
exactly against serial's, as in that matrix, and the steps the solvers took over the
whole run (every solve: line-search trials and refinements included) per optimizer
iteration, in N.  A schedule that saves steps per iteration but makes the controller
plan more iterations shows it here.
"""
from __future__ import annotations

import argparse
import sys

import common  # noqa: F401  (one thread, the allocator setting)
from common import Counting
from simultaneous_quality import MATRIX, passes, run

VARIANTS = {
    "default": [],
    "F on level 1": ["mgrit.nrelax=0"],
    "no warm down": ["mgrit.warm_down=false"],
    "both": ["mgrit.nrelax=0", "mgrit.warm_down=false"],
}


class StepTally:
    """Wraps the one-shot oracle's two solvers; counts every step of every solve."""

    def __init__(self):
        self.forward = self.adjoint = 0

    def __call__(self, oracle, net, ex):
        lp = oracle.terms.lp
        self.layers = net.opts.layers
        for which, solver in (("forward", lp.fwd), ("adjoint", lp.adj)):
            solve = solver.solve

            def counted(prop, *args, _solve=solve, _which=which, **kw):
                c = Counting(prop)
                try:
                    return _solve(c, *args, **kw)
                finally:
                    setattr(self, _which, getattr(self, _which) + c.total())
            solver.solve = counted
        return oracle


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="*")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    a = p.parse_args()
    print("| row | variant | J ratio | Δval | MGRIT it/iter (acc. / all) | "
          "steps/iter fwd + adj (N) | pass |\n|---|---|---|---|---|---|---|", flush=True)
    for name in a.only or list(MATRIX):
        over = MATRIX[name]
        ser = run("serial", over)
        for v in a.variants:
            tally = StepTally()
            sim = run("simultaneous", over + VARIANTS[v], wrap=tally)
            its = max(sim["iterations"], 1)
            # the run stops at serial's count (longer=1): the tally holds only those iterations
            ratio = sim["objective"] / ser["objective"]
            dval = sim["val"] - ser["val"]
            f, g = tally.forward / tally.layers / its, tally.adjoint / tally.layers / its
            print(f"| {name} | {v} | {ratio:.3f} | {dval:+.3f} | {sim['accepted']:.2f} / "
                  f"{sim['total']:.2f} | {f:.2f} + {g:.2f} = {f + g:.2f} | "
                  f"{'yes' if passes(ratio, dval, False) else 'NO'} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
