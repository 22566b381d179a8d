"""The contract of metrics.h5: every attribute, group and dataset name, with its meaning.

Writer, reader, console, report and tests import these names; none of them spells a
field name as a literal. `FIELDS` documents each entry (meaning, unit, shape, dtype) and
`markdown()` renders it: `python -m lptrain.metrics.schema > docs/metrics.md`.
"""
from __future__ import annotations

from dataclasses import dataclass

from lptrain import modes
from lptrain.errors import REFUSED, LptrainError

FILE_NAME = "metrics.h5"
UNITS = "units"    # the attribute of a dataset that has a unit (the table's unit column)

# -- root attributes ----------------------------------------------------------------------
ROOT = "/"
VERSION = "lptrain_version"
MODE = "mode"
WORLD_SIZE = "world_size"
LAYER_RANKS = "layer_ranks"
DATA_RANKS = "data_ranks"
SEED = "seed"
CONFIG = "config"
STATUS = "status"
DATASET_SOURCE = "dataset_source"
VALIDATION_SET = "validation_set"
MGRIT_LEVELS = "mgrit_levels"
ERROR = "error"
EPOCH_OBJECTIVE = "epoch_objective"
STARTED_AT = "started_at"
THREADS = "threads"

REQUIRED_ATTRS = (MODE, WORLD_SIZE, SEED, CONFIG)

# values of the `status` attribute
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
DIVERGED = "diverged"
INTERRUPTED = "interrupted"
STALLED = "stalled"
STATUSES = (RUNNING, COMPLETED, FAILED, DIVERGED, INTERRUPTED, STALLED)
FINAL_STATUSES = (COMPLETED, FAILED, DIVERGED, INTERRUPTED, STALLED)

# values of the `mode` attribute (the writer stores whatever it is given)
MODE_SERIAL, MODE_MGRIT, MODE_SIMULTANEOUS = modes.MODES
MODES = modes.MODES

# -- groups and the dataset names code refers to ------------------------------------------
TRAIN = "train"
VALIDATION = "validation"
MGRIT = "mgrit"
TIMING = "timing"
GROUPS = (TRAIN, VALIDATION, MGRIT, TIMING)

ITERATION = "iteration"
OBJECTIVE = "objective"
LOSS = "loss"
ACCURACY = "accuracy"
STEP_TIME = "step_time"
WALL_TIME = "wall_time"
FWD_ITERATIONS = "fwd_iterations"
FWD_RESIDUAL = "fwd_residual"
FWD_FACTOR = "fwd_factor"
FWD_HISTORY = "fwd_history"
ADJ_ITERATIONS = "adj_iterations"
ADJ_RESIDUAL = "adj_residual"
ADJ_FACTOR = "adj_factor"
ADJ_HISTORY = "adj_history"
COMPUTE = "compute"
COMMUNICATION = "communication"
WAITING = "waiting"

HISTORIES = (FWD_HISTORY, ADJ_HISTORY)   # 2-D, NaN-padded, columns grow
PER_RANK = (COMPUTE, COMMUNICATION, WAITING)  # 2-D, one column per rank, columns grow
GRID_COLUMNS = (WORLD_SIZE, LAYER_RANKS, DATA_RANKS)   # timing/: the grid of each row
START_ATTRS = (*GRID_COLUMNS, THREADS, CONFIG)   # root attributes of the latest start

INT = "int64"
FLOAT = "float64"
STR = "str"
# stored for a field that a log call leaves out (or passes as None)
FILL = {INT: -1, FLOAT: float("nan")}


class MetricsFileError(LptrainError, OSError):
    """A metrics file cannot be created, opened or understood; the message names the path."""


class MetricsInputError(MetricsFileError):
    """A metrics file to read or to continue is missing, damaged or not lptrain's."""

    exit_code = REFUSED


@dataclass(frozen=True)
class Field:
    """Documentation of one attribute or dataset."""

    dtype: str    # INT, FLOAT or STR
    shape: str    # "scalar", "(n,)", "(n, k)", "(n, P)" or "(v,)"
    unit: str     # "" when dimensionless
    meaning: str

    @property
    def ndim(self) -> int:
        """0 for attributes, else the number of axes of the dataset."""
        if not self.shape.startswith("("):
            return 0
        return len([d for d in self.shape.strip("()").split(",") if d.strip()])


_ROWS = "(n,)"  # n = optimizer iterations logged so far

FIELDS: dict[str, dict[str, Field]] = {
    ROOT: {
        VERSION: Field(STR, "scalar", "", "lptrain version that wrote the file"),
        MODE: Field(STR, "scalar", "", "training mode: " + ", ".join(MODES)),
        WORLD_SIZE: Field(INT, "scalar", "", "number of MPI ranks of the latest start (a "
                          "run resumed on another rank count: per iteration in timing/)"),
        LAYER_RANKS: Field(INT, "scalar", "", "optional: ranks per layer group (MGRIT over "
                           "the layers; world_size = layer_ranks × data_ranks)"),
        DATA_RANKS: Field(INT, "scalar", "", "optional: layer groups, each training on its "
                          "shard of every batch (gradients summed over them)"),
        SEED: Field(INT, "scalar", "", "random seed of the run"),
        CONFIG: Field(STR, "scalar", "", "resolved configuration as YAML text, the "
                      "latest start's (a resume's train.iterations, grid ...)"),
        STATUS: Field(STR, "scalar", "", "run state: " + ", ".join(STATUSES)
                      + "; `running` in a file whose writer was killed"),
        DATASET_SOURCE: Field(STR, "scalar", "",
                              "optional: file(s) the data came from, or `generated`"),
        VALIDATION_SET: Field(STR, "scalar", "",
                              "optional: what `validation/` scored, `test` (the dataset's "
                              "official test set: MNIST and Fashion-MNIST from IDX files, "
                              "the t10k-* images) or `val` (held out from the training "
                              "data, or drawn apart from it)"),
        MGRIT_LEVELS: Field(STR, "scalar", "",
                            "optional (mgrit and simultaneous): steps on each level of the "
                            "MGRIT hierarchy, finest first, e.g. `32/8/2`"),
        ERROR: Field(STR, "scalar", "",
                     "optional: error message of a `failed` or `diverged` run, or why "
                     "a run `stalled` (no progress for train.patience iterations, with "
                     "mini-batches rounded up to whole epochs, or no "
                     "step found with exact solves along steepest descent), or what "
                     "stopped an `interrupted` one (e.g. `interrupted by SIGINT after "
                     "iteration 85`); a resume that carries on removes it"),
        EPOCH_OBJECTIVE: Field(FLOAT, "scalar", "", "optional, mini-batches: the mean "
                               "objective of the run's last whole epoch, each batch "
                               "weighed by its samples, written when it ends; what a "
                               "sweep ranks it by (one batch's objective is too noisy)"),
        STARTED_AT: Field(STR, "scalar", "", "ISO 8601 local time the file was created"),
        THREADS: Field(INT, "scalar", "", "optional: torch's intra-op threads per rank at "
                       "the latest start (rank 0's: `OMP_NUM_THREADS`, else the node's "
                       "cores shared by its ranks)"),
    },
    TRAIN: {
        ITERATION: Field(INT, _ROWS, "", "optimizer iteration number"),
        OBJECTIVE: Field(FLOAT, _ROWS, "", "objective J: loss plus regularisation, at the "
                         "parameters after this iteration (L-BFGS) or, with SGD and Adam, "
                         "at those it started from, where its gradient was taken (on its "
                         "mini-batch); so are `loss` and `accuracy`; in mode=simultaneous "
                         "the run's own, from its inexact forward solve (1e-7 to 1e-5 "
                         "relative from the exact value at the median of held-out runs, "
                         "up to 1e-3 on a ReLU network)"),
        LOSS: Field(FLOAT, _ROWS, "", "training cross-entropy loss"),
        ACCURACY: Field(FLOAT, _ROWS, "fraction", "training accuracy, 0..1"),
        "grad_norm": Field(FLOAT, _ROWS, "", "norm of the gradient of J"),
        "step_size": Field(FLOAT, _ROWS, "", "step length accepted by the optimizer"),
        STEP_TIME: Field(FLOAT, _ROWS, "s", "duration of this iteration"),
        WALL_TIME: Field(FLOAT, _ROWS, "s", "time from the start of training to the end "
                         "of the iteration, its validation included"),
        "ls_trials": Field(INT, _ROWS, "", "line-search trials of this iteration"),
        "lbfgs_skipped": Field(INT, _ROWS, "0/1",
                               "1 when the L-BFGS curvature update was skipped"),
        "lbfgs_reset": Field(INT, _ROWS, "0/1",
                             "1 when the L-BFGS memory was reset after a failed line search"),
        "ls_failed": Field(INT, _ROWS, "",
                           "failed line searches of this iteration; each made the "
                           "gradient more accurate (see mgrit/rung) or searched again "
                           "along −g"),
    },
    VALIDATION: {
        ITERATION: Field(INT, "(v,)", "", "optimizer iteration of the evaluation"),
        LOSS: Field(FLOAT, "(v,)", "", "validation cross-entropy loss"),
        ACCURACY: Field(FLOAT, "(v,)", "fraction", "validation accuracy, 0..1"),
    },
    MGRIT: {
        ITERATION: Field(INT, _ROWS, "", "optimizer iteration (layer-parallel modes only)"),
        FWD_ITERATIONS: Field(INT, _ROWS, "", "MGRIT iterations (cycles) of the forward "
                              "solve; 0 where the relaxation before its first residual "
                              "met the tolerance (a warm start, or mgrit.nrelax0 CF sweeps "
                              "as many as the C-intervals: a serial solve; step_time "
                              "shows their cost)"),
        FWD_RESIDUAL: Field(FLOAT, _ROWS, "", "final residual norm of the forward solve: "
                            "absolute, the 2-norm over the C-points' states of the batch "
                            "(it grows with the batch and the state's size: compare runs "
                            "of one problem)"),
        ADJ_ITERATIONS: Field(INT, _ROWS, "", "MGRIT iterations (cycles) of the adjoint "
                              "solve; 0 as fwd_iterations"),
        ADJ_RESIDUAL: Field(FLOAT, _ROWS, "", "final residual norm of the adjoint solve: "
                            "absolute, as fwd_residual"),
        FWD_FACTOR: Field(FLOAT, _ROWS, "",
                          "forward convergence factor: geometric mean of successive "
                          "residual ratios, NaN with fewer than 2 residuals"),
        ADJ_FACTOR: Field(FLOAT, _ROWS, "", "adjoint convergence factor, as fwd_factor"),
        "unconverged": Field(INT, _ROWS, "",
                             "mode=mgrit: solves of the accepted point (forward, adjoint) "
                             "that stopped at mgrit.max_iter above their tolerance, so its "
                             "gradient is not exact (the console says so at the first); 0 "
                             "in the other modes"),
        "adaptive_extra": Field(INT, _ROWS, "",
                                "extra MGRIT iterations added by the adaptive guard"),
        "refined": Field(INT, _ROWS, "",
                         "simultaneous: evaluations of this optimizer iteration taken again "
                         "at their θ with the controller's grown plan, their estimated "
                         "gradient error being 10x mgrit.grad_tol or more (a cold first "
                         "evaluation; docs/method.md §6); 0 in the other modes"),
        "rung": Field(INT, _ROWS, "",
                      "simultaneous: solve accuracy of the accepted point, 0 = the "
                      "controller's plan (mgrit.fwd_iters/adj_iters with "
                      "mgrit.control=fixed), each rung 4x the iterations (at most "
                      "mgrit.max_iter), the top rung solved to mgrit.tol; raised "
                      "after a failed line search"),
        "fwd_total": Field(INT, _ROWS, "",
                           "forward MGRIT iterations of every solve of this optimizer "
                           "iteration (line-search trials and re-evaluations included; "
                           "iteration 1's also the evaluation at the initial θ)"),
        "adj_total": Field(INT, _ROWS, "", "adjoint MGRIT iterations, as fwd_total"),
        "grad_error": Field(FLOAT, _ROWS, "",
                            "estimated error of the gradient relative to its norm at the "
                            "accepted point, fwd_error + adj_error (docs/method.md §6), "
                            "times error_scale; unscaled it measured 2-7x the true "
                            "error at the median on dense networks (below it in 7-23 % "
                            "of evaluations), ~100x on the pooled conv network"),
        "fwd_error": Field(FLOAT, _ROWS, "", "the forward solve's share of grad_error: "
                           "error_scale · T · r_u · ‖λ_C‖ / (n_C ‖g‖)"),
        "adj_error": Field(FLOAT, _ROWS, "", "the adjoint solve's share of grad_error: "
                           "error_scale · T · r_λ · ‖u_C‖ / (n_C ‖g‖)"),
        "fwd_plan": Field(INT, _ROWS, "",
                          "simultaneous: forward iterations the controller plans for the "
                          "batch's next evaluation (mgrit.control=error keeps grad_error "
                          "below mgrit.grad_tol)"),
        "adj_plan": Field(INT, _ROWS, "", "adjoint iterations planned, as fwd_plan"),
        "error_scale": Field(FLOAT, _ROWS, "",
                             "simultaneous: the calibration factor in grad_error (the "
                             "median true/estimated ratio of the last 4 calibrations; 1 "
                             "before the first or with mgrit.calibrate_every=0; with "
                             "L-BFGS the first is at the initial θ, which has no row, so "
                             "row 1 is scaled already)"),
        "true_error": Field(FLOAT, _ROWS, "",
                            "simultaneous: the true relative error of the gradient, "
                            "measured against an exact layer-serial gradient every "
                            "mgrit.calibrate_every evaluations; NaN in between (with "
                            "L-BFGS the first, at the initial θ, is in no row)"),
        FWD_HISTORY: Field(FLOAT, "(n, k)", "",
                           "forward residual before each MGRIT iteration and after the "
                           "last (iterations + 1 values; a cold solve, without a warm "
                           "start, is not measured before its first: iterations values); "
                           "NaN-padded to the longest solve so far (k grows)"),
        ADJ_HISTORY: Field(FLOAT, "(n, k)", "", "adjoint residual history, as fwd_history"),
    },
    TIMING: {
        ITERATION: Field(INT, _ROWS, "", "optimizer iteration"),
        WORLD_SIZE: Field(INT, _ROWS, "", "ranks that computed this iteration (a run "
                          "resumed on another rank count changes it); its row's first "
                          "world_size columns below are theirs, the rest NaN"),
        LAYER_RANKS: Field(INT, _ROWS, "", "ranks per layer group of this iteration's grid"),
        DATA_RANKS: Field(INT, _ROWS, "", "data groups of this iteration's grid"),
        COMPUTE: Field(FLOAT, "(n, P)", "s", "time each rank spent computing: the "
                       "iteration's duration less communication and waiting"),
        COMMUNICATION: Field(FLOAT, "(n, P)", "s",
                             "time each rank spent in sends and collectives (sums, "
                             "broadcasts; a collective counts whole, its wait for slower "
                             "ranks included)"),
        WAITING: Field(FLOAT, "(n, P)", "s", "time each rank spent blocked on a "
                       "neighbour: receiving its message, or until its own sends "
                       "completed"),
    },
}

ROOT_ATTRS = tuple(FIELDS[ROOT])


def fields_of(group: str) -> tuple[str, ...]:
    """Dataset names of `group`, in documentation order."""
    return tuple(FIELDS[group])


_INTRO = """\
# metrics.h5

Rank 0 writes one HDF5 file per run, `metrics.h5` in the run directory. Every dataset is
resizable and the file is flushed after each logged row, so a killed run keeps every
finished iteration (its `status` then stays `running`). A field that a log call leaves out
is stored as NaN (floats) or -1 (integers). Groups that a mode does not use are absent.
A dataset with a unit in the tables below carries it as its `units` attribute.

Shapes: n = optimizer iterations logged, v = validation evaluations, k = one more than
the most MGRIT iterations of any solve of that history recorded so far (the accepted
points'; `fwd_history` and `adj_history` each have their own), P = the most ranks any iteration ran on
(`world_size`, unless the run was resumed on another rank count).

On a layer × data grid each data group solves its shard of the batch; `mgrit/` is the
whole batch's: iterations the most of any group (they solve side by side), residuals
√Σ r² over the groups at each iteration (the adjoint's weighted by each shard's share of
the batch; a group that stopped keeps its last), so a run on a 1 × D grid records what
the same run on one rank does where the groups take the same iterations (fixed and
one-shot solves, and solves to a tolerance near round-off).

Read a file with `lptrain.metrics.reader.read_metrics(path)` (path: the file or its run
directory; also while the run is still writing it); compare runs with
`lptrain-report PATH ... --out DIR`. This page is generated by
`python -m lptrain.metrics.schema`.
"""


def markdown() -> str:
    """The schema as markdown: one table for the root attributes and one per group."""
    parts = [_INTRO]
    for location, fields in FIELDS.items():
        title = "Root attributes" if location == ROOT else f"Group `{location}/`"
        parts.append(f"\n## {title}\n\n| name | dtype | shape | unit | meaning |\n"
                     "|---|---|---|---|---|\n")
        for name, f in fields.items():
            parts.append(f"| `{name}` | {f.dtype} | {f.shape} | {f.unit or '-'} "
                         f"| {f.meaning} |\n")
    return "".join(parts)


if __name__ == "__main__":
    print(markdown(), end="")
