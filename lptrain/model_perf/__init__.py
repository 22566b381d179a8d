"""Speedup model: predicted time per optimizer iteration and speedup over serial on P ranks.

`record` runs the real optimizer iteration of a mode on every rank of a layer group
(the training oracles on a zero-cost network, `zero_cost`, and scripted exchanges,
`scripted`) and keeps each rank's kernel calls, messages and sums as its observer
is told of them; `costs` holds what each recorded kernel costs on this
host (measured by `measure`, kept per configuration and host); `simulate` runs a
record as a discrete-event critical-path computation; `predict` combines them per
mode and grid; `grid` is the GridTimer behind `parallel.layer_ranks=auto`; `runs`
compares with measured runs, `report` and `cli` (`lptrain-model`) render.
"""
from lptrain.model_perf.costs import KernelCosts, given_costs
from lptrain.model_perf.predict import Counts, Machine, Model, Prediction
from lptrain.model_perf.record import Record, record_iteration
from lptrain.model_perf.simulate import Link, simulate

__all__ = ["Counts", "KernelCosts", "Link", "Machine", "Model", "Prediction", "Record",
           "given_costs", "record_iteration", "simulate"]
