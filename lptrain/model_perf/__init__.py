"""Speedup model: predicted time per optimizer iteration and speedup over serial on P ranks.

`schedule` records what the MGRIT solver does on every rank (steps, messages,
allreduces, in solver order) by running it without computing, `modes` assembles one optimizer iteration of
each training mode from it, `simulate` runs a schedule as a discrete-event
critical-path computation with measured costs, `predict` combines them per
mode and P, `measure` times steps and messages on this machine, `runs`
compares with measured runs, `report` and `cli` (`lptrain-model`) render.
"""
from lptrain.model_perf.modes import Workload
from lptrain.model_perf.predict import (Counts, Machine, Prediction, iteration_time,
                                        parallel_time, predict_all, predict_at, serial_time)
from lptrain.model_perf.schedule import (hierarchy_for, iteration_schedule, max_ranks,
                                         mirrored, solve_schedule)
from lptrain.model_perf.simulate import Link, StepCosts, critical_steps, simulate

__all__ = ["Counts", "Link", "Machine", "Prediction", "StepCosts", "Workload",
           "critical_steps", "hierarchy_for", "iteration_schedule", "iteration_time",
           "max_ranks", "mirrored", "parallel_time", "predict_all", "predict_at",
           "serial_time", "simulate", "solve_schedule"]
