"""The `lptrain-model` command: predicted strong scaling of a configuration, as table and plot.

    lptrain-model [KEY=VALUE ...] [--step-time S] [--adjoint-time S] [--weight-time S]
                  [--latency S] [--bandwidth B] [--ranks 1,2,...] [--measured PATH ...]
                  [--fresh] [--paper] [--out DIR]

KEY=VALUE are the `lptrain` command's Hydra overrides.  The iteration of each mode is
recorded from the real code (record.py); the kernels it calls cost what they were
measured to cost on this host for this configuration (kept, costs.py; measured now
the first time or with --fresh) unless step costs are given; latency and bandwidth
not given come from a ping-pong under `mpiexec -n 2`, else from defaults.
"""
from __future__ import annotations

import math
import os
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from lptrain.config import compose
from lptrain.errors import ConfigError, LptrainError
from lptrain.metrics.quantities import ITERATION_TIME
from lptrain.metrics.streams import say
from lptrain.model.dtypes import DTYPES
from lptrain.model_perf import measure
from lptrain.model_perf.costs import KernelCosts, given_costs
from lptrain.model_perf.options import PROG, check_args, numbers, parse, ranks_of
from lptrain.model_perf.predict import Collecting, Counts, Machine, Model
from lptrain.model_perf.record import solve_cycles
from lptrain.model_perf.report import comparison_table, grid_section, plot, scaling_table
from lptrain.model_perf.simulate import Link
from lptrain.model_perf.summary import split_of, summary
from lptrain.modes import LAYERED, MGRIT, SERIAL, SIMULTANEOUS
from lptrain.parallel.grid import Grid

EXIT_ERROR = 2


def build_network(opts):
    """(net, θ, batch) of the configured dataset, network, dtype and device."""
    from lptrain.data import load_dataset
    from lptrain.model.network import ResNet
    data = load_dataset(opts.dataset, opts.seed)
    batch = opts.train.batch_size or data.x_train.shape[0]
    net = ResNet(opts.network, data.feature_shape, data.n_classes)
    dtype = DTYPES[opts.dtype]
    return net, net.init_params(opts.seed, dtype, opts.device), batch


def make_model(opts, net, theta, batch: int) -> Model:
    return Model(net, opts.mgrit, batch, opts.train.batch_size is not None, theta.dtype)


# a load average from other processes at which kernel costs are no idle host's (one
# core busy: a run beside them shares caches and memory bandwidth, BENCHMARKS.md)
BUSY_LOAD = 1.0


def kernel_costs(args, model: Model, theta, kernels, device) -> tuple[KernelCosts, str]:
    """Costs of `kernels` from the options where given, else this host's (costs.py)."""
    if args.step_time is not None and args.adjoint_time is not None:
        weights = args.adjoint_time if args.weight_time is None else args.weight_time
        return given_costs(model.batch, args.step_time, args.adjoint_time, weights,
                           args.overhead or 0.0), "given"
    import torch

    from lptrain.model_perf.costs import measured
    costs, note = measured(model.net, theta, model.batch, kernels, device,
                           torch.get_num_threads(), args.fresh, sharing(args),
                           progress=_progress)
    note = f"{note}: batch {model.batch}, {torch.get_num_threads()} thread(s)"
    if costs.load >= BUSY_LOAD:     # the report's sources (the summary's line ends at ':')
        note += f"; timed at a load average of {costs.load:.1f} from other processes"
        _progress(f"note: other processes kept this host's load average at "
                  f"{costs.load:.1f} ({os.cpu_count()} cores) when its kernel costs were "
                  f"timed: the predictions are a busy host's (--fresh times them anew)")
    return costs, note


def _threads(args) -> int:
    """torch's threads as --threads sets them, for the records and the kernels alike."""
    import torch
    torch.set_num_threads(max(args.threads, 1))
    return torch.get_num_threads()


def sharing(args) -> int:
    """Ranks per host the costs are measured with: --host-ranks, else this host's cores
    (1 with --threads above 1: the neighbours are forked, which threads make unsafe)."""
    if args.host_ranks is None:
        return measure.host_ranks() if args.threads <= 1 else 1
    if args.host_ranks < 1:
        raise ConfigError(f"--host-ranks must be at least 1, got {args.host_ranks}")
    if args.host_ranks > 1 and args.threads > 1:
        raise ConfigError(f"--host-ranks {args.host_ranks} needs --threads 1 (got "
                          f"{args.threads}): the neighbours are forked copies")
    return args.host_ranks


def link(args) -> tuple[Link, str, bool]:
    """(link, where it came from, whether this process should go on: rank 0 only)."""
    if args.latency is not None and args.bandwidth is not None:
        return Link(args.latency, args.bandwidth), "given", True
    go_on = True
    if measure.launched_size() >= 2:
        from lptrain.parallel.context import foreign_launch, says_for_launch, world
        foreign = foreign_launch(os.environ, PROG)     # else MPI_Init's 40-line abort
        if foreign and not says_for_launch(os.environ):
            raise SystemExit(EXIT_ERROR)               # said once, by rank 0
        if foreign:
            raise ConfigError(foreign)
        comm = world()
        found, note = measure.ping_pong(comm), "ping-pong between ranks 0 and 1"
        go_on = comm.Get_rank() == 0
    else:
        found = measure.DEFAULT_LINK
        note = "defaults: not under mpiexec with 2 ranks, no ping-pong"
    return found, note, go_on


def counts(args, runs, others: int = 0) -> tuple[Counts, str]:
    """Evaluations per iteration and mode=mgrit cycles: options, else runs, else
    defaults; mode=simultaneous cycles: runs, else the MGRIT options (predict.Counts).
    `runs` are the measured runs of the modelled configuration (`of_config`), `others`
    how many of another were left out."""
    notes = []
    trials = args.trials
    if trials is None:
        trials = sum(r.trials for r in runs) / len(runs) if runs else 1.0
        notes.append(f"evaluations/iteration {trials:.3g} "
                     f"({'mean of measured runs' if runs else 'assumed'})")
    mg = _mean_cycles(runs, MGRIT)
    if args.mgrit_iters:
        fwd, adj = numbers(args.mgrit_iters, "--mgrit-iters", 2)
        if min(fwd, adj) < 1:
            raise ConfigError(f"--mgrit-iters {args.mgrit_iters!r}: need at least 1 cycle "
                              f"per solve")
    elif mg:
        fwd, adj = mg
        notes.append("mgrit cycles: mean of measured mgrit runs")
    else:
        fwd = adj = 5.0
        notes.append("mgrit cycles assumed")
    # mgrit.control=error plans the one-shot cycles: what the runs took, not fwd_iters
    sim_fwd, sim_adj = _mean_cycles(runs, SIMULTANEOUS) or (None, None)
    if sim_fwd is not None:
        notes.append("simultaneous cycles: mean of measured simultaneous runs")
    if others:
        notes.append(f"{others} measured run{'s' if others > 1 else ''} of another config "
                     f"not counted")
    return Counts(trials, fwd, adj, sim_fwd, sim_adj), "; ".join(notes) or "given"


def of_config(runs, model: Model, cfg) -> list:
    """The measured runs of the modelled configuration: its cost keys (runs.mismatch,
    threads aside), its optimizer, and the layers and MGRIT options its times depend on.
    Only they give the counts (a run of another network, dataset or optimizer takes
    other trials and cycles: Adam one evaluation an iteration)."""
    from lptrain.model_perf.runs import flat, mismatch, run_model
    name = flat(cfg).get("optimizer.name")
    return [r for r in runs if not mismatch(r, cfg, r.threads)
            and flat(r.config).get("optimizer.name") == name
            and _same_structure(run_model(r, model), model)]


def _mean_cycles(runs, mode: str) -> tuple[float, float] | None:
    """The mean forward and adjoint cycles per solve of the measured runs of `mode` that
    logged them (None: none did)."""
    logged = [r for r in runs if r.mode == mode and r.fwd is not None]
    if not logged:
        return None
    return (sum(r.fwd for r in logged) / len(logged),
            sum(r.adj or 0.0 for r in logged) / len(logged))


def load_runs(paths: Sequence[Path]):
    from lptrain.model_perf.runs import load_run
    from lptrain.metrics.reader import find_metrics
    runs = []
    for path in find_metrics(paths) if paths else []:
        run = load_run(path)
        if run is None:
            say(f"{PROG}: {path}: fewer than 2 iterations (the first is not timed); "
                f"left out")
        else:
            runs.append(run)
    return runs


def machine(args, model: Model, theta, device: str, the_link: Link, predictions
            ) -> tuple[Machine, str]:
    """(the Machine, where its costs come from) for what `predictions(machine)` computes:
    a first pass at no cost says which kernels it charges, those are measured (or kept)."""
    probe = Machine(Collecting(), the_link)
    predictions(probe)
    costs, note = kernel_costs(args, model, theta, probe.costs.kernels, device)
    return Machine(costs, the_link), note


def with_optimizer(args, opts, m: Machine, theta) -> tuple[Machine, str]:
    """(m with the optimizer's arithmetic per iteration on this host, kept per host and
    configuration (optimizer_cost.py), one line saying so); given kernel costs stand for
    everything and leave it uncharged, as they leave the glue."""
    name = opts.optimizer.name
    if getattr(m.costs, "given", None):
        return m, f"optimizer {name}: not charged (given costs)"
    import torch

    from lptrain.model_perf.optimizer_cost import measured_optimizer
    from lptrain.train import shards
    cost, note = measured_optimizer(opts.optimizer, theta, torch.get_num_threads(),
                                    args.fresh, sharing(args))
    return replace(m, optimizer=cost.seconds, optimizer_per_pair=cost.per_pair,
                   memory=cost.memory, optimizer_shared=cost.shared,
                   theta_bytes=theta.numel() * theta.element_size(),
                   split_pairs=shards.splits(theta.numel())), \
        f"optimizer {name}: {cost.seconds:.2g} s per iteration on one rank ({note})"


def setup_text(opts, model: Model, costs: KernelCosts, sources: dict, cnt: Counts) -> str:
    """The model's inputs, as a markdown list."""
    o, net = opts.mgrit, model.net
    sim = cnt.simultaneous(o)
    hier = o.hierarchy(net.opts.layers, 1)
    steps = " / ".join(str(lv.n_points - 1) for lv in hier.levels)
    state = model.batch * math.prod(net.state_shape) * model.item
    lines = [
        f"- network: {opts.network.name}, N = {net.opts.layers}, state {state} bytes "
        f"(batch {model.batch}), gradient {net.layout.size * model.item} bytes, "
        f"{opts.dtype} on {opts.device}",
        f"- MGRIT: {len(hier.levels)} levels with {steps} steps, cfactor0 {o.cfactor0}, "
        f"cfactor {o.cfactor}, nrelax0 {o.nrelax0}, nrelax {o.nrelax}, {o.cycle}-cycle, "
        f"skip_first_down {o.skip_first_down}; simultaneous: {sim[0]:.3g} forward + "
        f"{sim[1]:.3g} adjoint cycles; mgrit: {cnt.mgrit_fwd:g} + {cnt.mgrit_adj:g} "
        f"cycles to tolerance",
        f"- kernel costs ({sources['costs']}): {_kernel_list(costs)}"
        + (f"; the records' {model.glue.note}" if model.glue else ""),
        f"- link ({sources['link']}): latency {sources['alpha']:.3g} s, "
        f"bandwidth {sources['beta']:.3g} bytes/s",
        f"- per optimizer iteration: {cnt.trials:g} objective evaluation(s) + 1 gradient "
        f"({sources['counts']})",
        f"- {sources['optimizer']}",
        f"- at most {model.max_layer} ranks (C-intervals of the finest level)"]
    return "\n".join(lines) + "\n"


def _kernel_list(costs: KernelCosts) -> str:
    """`name×states` seconds at the full batch (and at one sample), or the given costs."""
    if costs.given:
        step, adjoint, weights, o = costs.given
        return (f"forward step {step:.3g} s, adjoint {adjoint:.3g} s, weight product "
                f"{weights:.3g} s, per-call overhead {o:.3g} s")
    return ", ".join(f"{name}×{m} {t:.3g} s ({costs.one[(name, m)]:.2g} s)"
                     for (name, m), t in sorted(costs.full.items()))


def run(args) -> list[Path]:
    """Everything after argument parsing; returns the files written ([] on ranks > 0)."""
    check_args(args)
    the_link, link_note, go_on = link(args)
    if not go_on:
        return []
    opts, cfg = compose(args.overrides)
    from lptrain.model_perf.grid import ignored
    unread = ignored(args.overrides)
    if unread:     # it predicts every mode and split, one-shot solves with a fixed plan
        text = (f"not used: {' '.join(unread)} (the model predicts every mode and split, "
                f"one-shot solves with mgrit.fwd_iters / adj_iters)")
        _said_wrapped(text)
    net, theta, batch = build_network(opts)
    model = make_model(opts, net, theta, batch)
    if args.step_time is None:      # measured costs: the records' glue is one of them
        from lptrain.model_perf.kept_glue import kept_for
        model.glue = kept_for(model, opts.device, _threads(args), args.fresh)
    from lptrain.model_perf.grid import forget_kept_times, timers_reusing
    from lptrain.parallel import auto
    auto.install(timers_reusing(model))   # the auto column: as the lptrain command decides
    if args.fresh:
        forget_kept_times()
    runs = load_runs(args.measured)
    counted = of_config(runs, model, cfg)
    cnt, count_note = counts(args, counted, len(runs) - len(counted))
    ranks = ranks_of(args.ranks)
    _progress(f"recording the modes on P = {ranks[0]}" +       # in 80 columns
              (f" to {ranks[-1]}" if len(ranks) > 1 else "") + " (minutes for a deep network)")
    done = _Done(len(ranks))
    m, cost_note = machine(args, model, theta, opts.device, the_link,
                           lambda probe: _predictions(ranks, model, probe, cnt, runs, cfg,
                                                      done))
    m, optimizer_note = with_optimizer(args, opts, m, theta)
    costs = m.costs
    preds, baseline, measured, compared, grids = _predictions(ranks, model, m, cnt, runs, cfg,
                                                              done)
    if model.glue is not None:
        model.glue.save()
    auto = auto_splits(ranks, opts, net)
    sources = {"costs": cost_note, "link": link_note, "counts": count_note,
               "alpha": the_link.latency, "beta": the_link.bandwidth,
               "optimizer": optimizer_note}
    title = f"lptrain-model {' '.join(args.overrides)}".strip()
    text = (f"# {title}\n\n{setup_text(opts, model, costs, sources, cnt)}\n"
            f"Predicted {ITERATION_TIME} [s] of each mode: the seconds of a typical "
            f"optimizer iteration, as `lptrain` and `lptrain-report` measure it (the median "
            f"train/step_time); speedups over serial on 1 rank ({baseline:.4g} s).\n\n"
            + scaling_table(preds, baseline, model.max_layer, measured))
    text += "\n" + grid_section(ranks, auto, grids)
    if compared:
        text += "\n## Measured runs\n\n" + comparison_table(compared)
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / "speedup_model.md"
    md.write_text(text)
    setup = terminal_setup(opts, model, cnt, cost_note, the_link) + [optimizer_note]
    auto_times = {key: grids[key][1].get(g) for key, g in auto.items() if key in grids}
    drawn = sum(map(len, measured.values()))
    png = plot(preds, baseline, args.out / "speedup_model.png", measured, args.paper,
               f"{title}\n{opts.dataset.name}: {setup[0]}",     # what is modelled
               opts.dataset.name, auto_times, len(compared) - drawn)
    print(summary(title, setup, preds, baseline, model.max_layer, auto, compared, (md, png),
                  auto_times), end="")
    return [md, png]


def terminal_setup(opts, model: Model, cnt: Counts, cost_note: str, the_link: Link
                   ) -> list[str]:
    """The inputs but the optimizer's in four lines (all of them: the report's list)."""
    o, net = opts.mgrit, model.net
    asked = {SIMULTANEOUS: cnt.simultaneous(o), MGRIT: (cnt.mgrit_fwd, cnt.mgrit_adj)}
    run = {mode: solve_cycles(mode, o, *k) for mode, k in asked.items()}   # as trained
    sim, mg = (f"{run[m][0]:.2g} + {run[m][1]:.2g}" + (" (max_iter)" if run[m] != asked[m]
                                                        else "") for m in (SIMULTANEOUS, MGRIT))
    levels = len(o.hierarchy(net.opts.layers, 1).levels)
    costs = cost_note.split(" (")[0].split(":")[0]
    return [f"{opts.network.name}, N = {net.opts.layers}, batch {model.batch}, {opts.dtype} "
            f"on {opts.device}; MGRIT {levels} levels, cfactor {o.cfactor0} / {o.cfactor}",
            f"solve cycles: simultaneous {sim}, mgrit {mg}; {cnt.trials:.3g} "
            f"evaluation{'' if cnt.trials == 1 else 's'}/it",   # 80 columns: values of 3
            f"kernel costs {costs}" + (f"; {model.glue.note}" if model.glue else ""),
            f"messages: {the_link.latency:.2g} s + bytes / {the_link.bandwidth:.2g} B/s"]


def _progress(text: str) -> None:
    """A line on stderr while the model is built: that and what it is doing."""
    say(f"{PROG}: {text}")


def _said_wrapped(text: str) -> None:
    """`_progress` of a longer text, broken into lines of 80 columns."""
    _progress("\n  ".join(textwrap.wrap(text, 78 - len(PROG), break_on_hyphens=False,
                                         break_long_words=False)))


class _Done:
    """Says each rank count once, when its first prediction is done (the first pass
    records the iteration; later ones reuse the records)."""

    def __init__(self, total: int):
        self.total, self.said = total, set()

    def __call__(self, p: int) -> None:
        if self.total > 1 and p not in self.said:
            self.said.add(p)
            _progress(f"P = {p} recorded ({len(self.said)} of {self.total})")


def _predictions(ranks, model: Model, m: Machine, cnt: Counts, runs, cfg, done=None):
    """Everything the report shows that costs depend on; `done` hears of each P."""
    from lptrain.model_perf.grid import recommend
    preds = []
    for p in ranks:
        preds.append(model.predict_at(p, m, cnt))
        if done is not None:
            done(p)
    baseline = model.grid_time(Grid(1, 1), SERIAL, m, cnt)
    measured, compared = _compare(runs, model, m, cfg)
    grids = {(p, mode): recommend(p, mode, model, m, cnt) for p in ranks
             for mode in LAYERED}
    return preds, baseline, measured, compared, grids


def auto_splits(ranks, opts, net) -> dict:
    """{(P, mode): the split `parallel.layer_ranks=auto` takes} (its timer: this host's
    kept costs, preflight.auto_grid)."""
    from lptrain.data.base import dataset_sizes
    from lptrain.preflight import auto_grid
    sizes = dataset_sizes(opts.dataset)
    return {(p, mode): auto_grid(opts, sizes, net, p, mode) for p in ranks for mode in LAYERED}


def _same_structure(other: Model, model: Model) -> bool:
    """Whether a run's model has the modelled one's layers and the MGRIT options its
    times depend on."""
    from lptrain.model_perf.costs import model_mgrit
    return other.net.opts.layers == model.net.opts.layers and \
        model_mgrit(other.mgrit) == model_mgrit(model.mgrit)


def _compare(runs, model: Model, m: Machine, cfg):
    import torch

    from lptrain.model_perf.runs import mismatch, predict_run, run_model
    measured: dict = {}
    rows = []
    for r in runs:
        differs = mismatch(r, cfg, torch.get_num_threads())
        # kernel costs are this configuration's: a run of another network, batch or dtype
        # predicted with them is a number of nothing (its own overrides predict it)
        pred, note = (None, "") if differs else predict_run(r, model, m)
        rows.append((r, pred, note, differs))
        # beside the model's lines: its configuration only (a run of other layers or MGRIT
        # options has a model of its own, which its row compares it with)
        if not differs and _same_structure(run_model(r, model), model):
            measured.setdefault((r.mode, r.ranks, split_of(r)), []).append(r.iteration_time)
    return measured, rows


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `lptrain-model`; returns the exit status."""
    args = parse(argv)
    try:
        run(args)       # prints the summary, with the files it wrote
    except OSError as exc:
        if exc.filename is None and exc.strerror is not None:
            raise       # its output could not be written: commands._written says so
        say(f"{PROG}: error: {exc}")
        return EXIT_ERROR
    except (LptrainError, ValueError) as exc:
        say(f"{PROG}: error: {exc}")
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    from lptrain.errors import stops_on_signals
    sys.exit(stops_on_signals(PROG, lambda: main))
