"""Which part of a one-shot evaluation moves the L-BFGS path away from serial's: the
objective values the line search compares, or the gradients?

    .venv/bin/python bench/oneshot_parts.py [--exact values|gradients] [KEY=VALUE ...]

Trains mode=simultaneous like bench/simultaneous_quality.py (same overrides, the final
parameters evaluated exactly).  With --exact values every evaluation's objective, loss
and accuracy are replaced by the layer-serial ones at its θ (the one-shot solves still
run and warm-start the next); with --exact gradients every gradient is.  Prints the
exact final objective, the median and largest one-shot error of the objective values,
and the median relative error of the gradients, both against the layer-serial ones.
"""
from __future__ import annotations

import argparse
import statistics

import simultaneous_quality as q
from lptrain.train.objective import Objective
from lptrain.train.oracles import SerialOracle


class ExactPart:
    """The one-shot oracle `inner` with its values or its gradients (`part`) replaced
    by the layer-serial ones; records the one-shot errors of both."""

    def __init__(self, inner, net, exchange, part: str | None):
        self.inner, self.part = inner, part
        self.exact = Objective(SerialOracle(net, exchange), net)
        self.value_errors, self.gradient_errors = [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _exact_value(self, ev):
        self.exact.begin(ev.batch)
        return self.exact.value(ev.theta)

    def value(self, theta):
        ev = self.inner.value(theta)
        point = self._exact_value(ev).point
        self.value_errors.append(abs(ev.point.objective - point.objective))
        if self.part == "values":
            ev.point = point
        return ev

    def gradient(self, ev):
        g = self.inner.gradient(ev)         # may take ev again at its θ (a repeat)
        exact = self._exact_value(ev)
        true = self.exact.gradient(exact)
        self.gradient_errors.append(float((g - true).norm() / true.norm()))
        if self.part == "values":
            ev.point = exact.point
        return true if self.part == "gradients" else g


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--exact", choices=["values", "gradients"])
    p.add_argument("overrides", nargs="*")
    a = p.parse_intermixed_args()
    parts = []

    def wrap(oracle, net, exchange):
        parts.append(ExactPart(oracle, net, exchange, a.exact))
        return parts[0]
    r = q.run("simultaneous", a.overrides, wrap=wrap)
    w = parts[0]
    print(f"exact={a.exact} J={r['objective']:.10g} val={r['val']:.3f} "
          f"value_error_median={statistics.median(w.value_errors):.2e} "
          f"value_error_max={max(w.value_errors):.2e} "
          f"gradient_error_median={statistics.median(w.gradient_errors):.2e}")


if __name__ == "__main__":
    main()
