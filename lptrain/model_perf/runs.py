"""Measured runs next to the model: read metrics.h5 files and predict each run's iteration.

A run's own structure (layers, batch, MGRIT options) and outcomes (line-search
trials, MGRIT cycles per solve) go into its prediction; its step costs are
the model's, so a run whose state shape, batch, dtype or device differs from
the modelled configuration is flagged.

The measured iteration time is the median over the run's iterations (the first left
out).  Iterations differ in work: a line search's extra trial, or the error controller
planning 2 cycles in one iteration and 3 in the next, or L-BFGS recursing over fewer
pairs before its memory fills.  So each iteration is predicted from its own trials,
cycles and pairs, and the prediction compared is the median of those: the same
statistic over the same iterations.  A prediction from the run's mean counts
would be the mean iteration's, which the median misses when the work is spread.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import yaml

from lptrain.metrics import schema as s
from lptrain.metrics.quantities import iteration_time
from lptrain.metrics.reader import read_metrics
from lptrain.mgrit.options import MGRITOptions
from lptrain.model_perf.predict import Counts, Machine, Model
from lptrain.parallel.grid import Grid

# config keys that change the cost of one step (the model's costs assume the CLI's values)
COST_KEYS = ("network.name", "network.width", "network.channels", "network.activation",
             "network.bias", "network.opening", "network.pool", "network.step._target_",
             "train.batch_size", "dataset.name", "dataset.n_train", "dtype", "device")


@dataclass(frozen=True)
class Work:
    """One iteration's work: objective evaluations, forward / adjoint MGRIT cycles
    per solve (None: not logged), and the L-BFGS pairs its recursion ran over (None:
    another optimizer, or the memory full)."""

    trials: float
    fwd: float | None
    adj: float | None
    pairs: int | None = None


@dataclass(frozen=True)
class MeasuredRun:
    """Per-iteration figures of one run; the first iteration (cold start) is left out."""

    path: Path
    mode: str
    ranks: int
    iteration_time: float  # seconds (metrics/quantities.py: median, the first left out)
    trials: float          # mean objective evaluations per iteration (repeats included)
    fwd: float | None      # mean forward MGRIT cycles per solve (None: not logged)
    adj: float | None      # mean adjoint MGRIT cycles per iteration (repeats included)
    config: dict           # the run's resolved config (nested)
    layer: int | None = None   # ranks per layer group (None: not logged)
    work: tuple[Work, ...] = ()  # per iteration whose time the median takes, in order
    threads: int | None = None   # torch threads per rank (None: not logged)


def load_run(path: Path) -> MeasuredRun | None:
    """The run in metrics file `path`; None when it logged fewer than two iterations."""
    m = read_metrics(path)
    mine = _on_its_ranks(m)
    times = m.train.get(s.STEP_TIME, np.array([]))[mine]
    if len(times) < 2:
        return None
    trials = m.train.get("ls_trials", np.array([]))[mine][1:]
    trials = trials[trials > 0]
    cfg = yaml.safe_load(m.attrs.get(s.CONFIG, "")) or {}
    work = _work(m, mine, _memory(cfg))
    means = _means(work) or (float(trials.mean()) if len(trials) else 1.0,
                             _mean(m.mgrit.get(s.FWD_ITERATIONS)),
                             _mean(m.mgrit.get(s.ADJ_ITERATIONS)))
    return MeasuredRun(Path(path), m.mode, int(m.attrs.get(s.WORLD_SIZE, 1)),
                       iteration_time(times), *means, cfg,
                       _int(m.attrs.get(s.LAYER_RANKS)), work,
                       _int(m.attrs.get(s.THREADS)))


def _means(work: tuple[Work, ...]) -> tuple[float, float, float] | None:
    """The run's mean evaluations per iteration, forward cycles per solve and adjoint
    cycles per gradient over the iterations `work` holds, repeats included as `_work`
    charges them; None where no iteration logged its solves (serial, older files)."""
    solved = [w for w in work if w.fwd is not None]
    if not solved:
        return None
    trials = sum(w.trials for w in solved)
    return (trials / len(solved), sum(w.trials * w.fwd for w in solved) / trials,
            sum(w.adj for w in solved) / len(solved))


def _memory(cfg: dict) -> int | None:
    """The run's L-BFGS memory (None for another optimizer)."""
    node = cfg.get("optimizer") or {}
    return int(node.get("memory", 0)) if node.get("name") == "lbfgs" else None


def lbfgs_pairs(train: dict, memory: int) -> np.ndarray:
    """The pairs L-BFGS's recursion ran over in each train/ row, replayed from the rows
    in order (train/optimizers.py): none at the first; after an iteration, one more
    unless skipped (sᵀy too small), at most `memory`; a reset (failed line search)
    forgets the older ones, and an iteration without a step (step 0) all."""
    n = len(train.get(s.ITERATION, []))
    zeros = np.zeros(n, dtype=np.int64)
    reset, skipped = (np.asarray(train.get(k, zeros)) for k in ("lbfgs_reset",
                                                                "lbfgs_skipped"))
    steps = np.asarray(train.get("step_size", np.ones(n)))
    out, held = np.zeros(n, dtype=np.int64), 0
    for i in range(n):
        out[i] = held
        stepped = steps[i] != 0
        if reset[i] or not stepped:
            held = 0
        if stepped and not skipped[i]:
            held = min(held + 1, memory)
    return out


def _work(m, mine: np.ndarray, memory: int | None) -> tuple[Work, ...]:
    """The Work of each iteration that iteration_time counts (finite times, the first
    left out): trials from train/, cycles per solve from mgrit/ (all of the
    iteration's forward cycles over its trials; the accepted point's adjoint), L-BFGS
    pairs replayed from train/ (lbfgs_pairs). An evaluation taken again (mgrit/refined:
    the one-shot controller's repeats) is one more trial, and its adjoint cycles are
    charged with the accepted one's (adj_total)."""
    iterations = m.train.get(s.ITERATION, np.array([], dtype=np.int64))[mine][1:]
    times = m.train[s.STEP_TIME][mine][1:]
    trials = m.train.get("ls_trials", np.ones(len(mine), dtype=np.int64))[mine][1:]
    pairs = [None] * len(times) if memory is None else \
        [int(p) for p in lbfgs_pairs(m.train, memory)[mine][1:]]
    rows = {int(k): i for i, k in enumerate(m.mgrit.get(s.ITERATION, []))}
    fwd, adj = m.mgrit.get("fwd_total"), m.mgrit.get(s.ADJ_ITERATIONS)
    repeats, adj_all = m.mgrit.get("refined"), m.mgrit.get("adj_total")   # None: older
    out = []
    for k, t, n, held in zip(iterations, times, trials, pairs):
        if not np.isfinite(t):
            continue
        n, row = float(max(n, 1)), rows.get(int(k))
        solved = row is not None and fwd is not None and adj is not None \
            and fwd[row] >= 0 and adj[row] >= 0
        again = int(repeats[row]) if solved and repeats is not None and \
            repeats[row] > 0 and adj_all is not None else 0
        n += again
        out.append(Work(n, float(fwd[row]) / n if solved else None,
                        float(adj_all[row] if again else adj[row]) if solved else None,
                        held))
    return tuple(out)


def _int(value) -> int | None:
    return None if value is None else int(value)


def _on_its_ranks(m) -> np.ndarray:
    """Mask of the train/ rows computed on the run's last grid: its `world_size` ranks
    split as its `layer_ranks` (a run resumed on another grid holds rows of several;
    timing/ says which)."""
    iterations = m.train.get(s.ITERATION, np.array([], dtype=np.int64))
    ranks = m.timing.get(s.WORLD_SIZE)
    if ranks is None:
        return np.ones(len(iterations), dtype=bool)
    other = ranks != int(m.attrs.get(s.WORLD_SIZE, 1))
    layer, last = m.timing.get(s.LAYER_RANKS), m.attrs.get(s.LAYER_RANKS)
    if layer is not None and last is not None:      # 1 x 2 resumed as 2 x 1
        other |= layer != int(last)
    return ~np.isin(iterations, m.timing[s.ITERATION][other])


def _mean(a) -> float | None:
    a = np.asarray(a if a is not None else [])[1:]
    a = a[a >= 0]
    return float(a.mean()) if len(a) else None


def flat(cfg: dict, prefix: str = "") -> dict:
    """{'a.b': value} of a nested dict."""
    out = {}
    for key, value in cfg.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def mismatch(run: MeasuredRun, model_cfg: dict, threads: int) -> list[str]:
    """COST_KEYS whose value in the run differs from the modelled config, and the run's
    threads per rank where they are not the `threads` the kernels were timed with (one
    rank of a 2-core machine takes both cores: its iterations run up to 2x faster)."""
    a, b = flat(run.config), flat(model_cfg)
    out = [f"{k}={a.get(k)!r}" for k in COST_KEYS if a.get(k) != b.get(k)]
    if run.threads is not None and run.threads != threads:
        out.append(f"threads={run.threads} (model {threads})")
    return out


def run_model(run: MeasuredRun, model: Model) -> Model:
    """The model of the run's own structure (its layers and MGRIT node), with the
    modelled configuration's network otherwise."""
    net = model.net
    layers = int(run.config.get("network", {}).get("layers", net.opts.layers))
    node = run.config.get("mgrit")
    known = {f.name for f in fields(MGRITOptions)}
    opts = MGRITOptions(**{k: v for k, v in node.items() if k in known}) \
        if isinstance(node, dict) else model.mgrit
    if layers == net.opts.layers and opts == model.mgrit:
        return model
    if layers != net.opts.layers:
        from lptrain.model.network import ResNet
        net = ResNet(replace(net.opts, layers=layers), net.in_shape, net.n_classes)
    return Model(net, opts, model.batch, model.mini_batches, model.dtype)


def run_grid(run: MeasuredRun) -> Grid:
    """The run's layer × data grid (P × 1 for a layer-parallel run that did not log it,
    1 × P for serial)."""
    if run.mode == s.MODE_SERIAL:
        return Grid(1, run.ranks)
    layer = run.layer or run.ranks
    return Grid(layer, max(run.ranks // layer, 1))


def predict_run(run: MeasuredRun, model: Model, m: Machine):
    """(seconds per iteration predicted for the run, note) — seconds None if impossible:
    the median over its iterations of each one's prediction from its own Work (from the
    run's means, the L-BFGS memory full, where it logged none)."""
    rm, grid = run_model(run, model), run_grid(run)
    if grid.layer > rm.max_layer:
        return None, "more ranks than C-intervals"
    ropts = rm.mgrit

    def cycles(w: Work) -> tuple[float, float]:
        return (w.fwd if w.fwd is not None else ropts.fwd_iters,
                w.adj if w.adj is not None else ropts.adj_iters)

    means = Work(run.trials, run.fwd, run.adj)
    work = run.work or (means,)
    each = {w: rm.grid_time(grid, run.mode, m, Counts(w.trials), cycles(w), w.pairs)
            for w in set(work)}
    t = float(np.median([each[w] for w in work]))
    fwd, adj = cycles(means)
    note = f"{grid.layer} x {grid.data} ranks, {run.trials:.2g} " \
           f"evaluation{'' if run.trials == 1 else 's'}"
    if run.mode != s.MODE_SERIAL:
        note += f", {fwd:.2g} fwd + {adj:.2g} adj cycles"
    if len(each) > 1:
        note += f" (means; {len(each)} kinds of iteration, each predicted)"
    return t, note
