"""The lines under a run's title: its MGRIT hierarchy, where it validates, its step's
eval-mode modules, and what a resume starts from and changes (app.py puts them with the
title; the console shows them once)."""
from __future__ import annotations

from omegaconf import OmegaConf

from lptrain.data.base import source_files
from lptrain.errors import counted
from lptrain.metrics import schema as ms
from lptrain.modes import LAYERED, MGRIT, SERIAL, SIMULTANEOUS


def level_steps(opts, grid) -> list[int] | None:
    """In the MGRIT modes, the steps on each level of the hierarchy the solver builds for
    these layers, finest first (`mgrit.levels` and the coarsening factors are bounds, so
    a short network gets fewer levels, and a factor beyond N none to coarsen to)."""
    if opts.mode.name not in LAYERED:
        return None
    return [lv.n_points - 1 for lv in opts.mgrit.hierarchy(opts.network.layers,
                                                          grid.layer).levels]


def hierarchy_notes(opts, steps: list[int] | None) -> list[str]:
    """The lines under the run's title that say what its `level_steps` are, and why a
    run in an MGRIT mode steps serially where it got one level."""
    if steps is None:
        return []
    if len(steps) > 1:
        return ["MGRIT levels (steps): " + joined(steps, " / ")]
    N, m = opts.network.layers, opts.mgrit
    why = "mgrit.levels=1" if m.levels == 1 else "a single layer" if N == 1 else \
        f"mgrit.cfactor0={m.cfactor0} leaves fewer than mgrit.min_coarse={m.min_coarse} " \
        "coarse steps"
    return [f"MGRIT levels (steps): {N} only, so MGRIT steps serially", f"  ({why})"]


def data_notes(data, sizes) -> list[str]:
    """The lines under the title that say what the run trains on: its samples and the
    files they come from (`dataset.n_train=null` is a number only the data knows), and
    where `val` and the validation accuracies are on the dataset's test set
    (lptrain-eval names that split `test`). `sizes`: the whole sets', as `data` may be
    one data group's shard of them."""
    names = source_files(data.source)
    more = len(names) - 1
    files = names[0] + (f" and {counted(more, 'more file')}" if more else "")
    lines = [f"data: {sizes.n_train} training, {sizes.n_val} validation samples ({files})"]
    if data.validation_set == "test":
        lines += [f"validation: {data.name}'s test set ({sizes.n_val} images)"]
    return lines


def precision_notes(opts) -> list[str]:
    """A line under the title where mode=mgrit's tolerance lies below the dtype's
    round-off: its solves stop at 10·ε·‖u_C‖ instead (docs/method.md §3), as converged,
    with residuals far above mgrit.tol (float32 at the default 1e-10)."""
    import torch

    from lptrain.model.dtypes import DTYPES
    tol, eps = opts.mgrit.tol, torch.finfo(DTYPES[opts.dtype]).eps
    if opts.mode.name != MGRIT or not 0 < tol < 10 * eps:
        return []
    return [f"mgrit.tol={tol:g} is below {opts.dtype}'s round-off: solves stop at "
            f"10 eps |u|"]


def plan_notes(opts) -> list[str]:
    """A line under the title where the error control's first plans (mgrit.fwd_iters,
    adj_iters) exceed mgrit.control_max_iters, which caps every plan: `fwd_iters=10
    control_max_iters=6` ran 6 with nothing said."""
    m = opts.mgrit
    above = [f"mgrit.{k}={getattr(m, k)}" for k in ("fwd_iters", "adj_iters")
             if getattr(m, k) > m.control_max_iters]
    if opts.mode.name != SIMULTANEOUS or m.control != "error" or not above:
        return []
    return [f"{' and '.join(above)} above mgrit.control_max_iters={m.control_max_iters}: "
            f"the plans are capped at {m.control_max_iters}"]


def step_notes(net) -> list[str]:
    """A line under the title where a command-line step holds modules that do nothing in
    the eval mode it runs in (dropout, batch normalisation with its initial statistics)."""
    inert = net.custom.inert if net.custom is not None else []
    return [f"network.step: its {', '.join(inert)} run in eval mode"] if inert else []


def thread_notes(node, threads: int, environ=None) -> list[str]:
    """A line under the title where OMP_NUM_THREADS (in `environ`) is set but no number
    of threads (libgomp said so on each rank, lptrain nothing), and where rank 0's node
    runs more threads than it has cores (OMP_NUM_THREADS × its ranks): they take turns
    on the cores, and a rank waiting in MPI spins on one (README "Running on a
    cluster")."""
    given = (environ or {}).get("OMP_NUM_THREADS")
    notes = [f"OMP_NUM_THREADS={given!r} is no number of threads: {threads} per rank, "
             f"the node's cores shared by its ranks"] \
        if given is not None and not (given.strip().isdigit() and int(given) > 0) else []
    if threads * node.local_size <= node.cores:
        return notes
    fit = max(1, node.cores // node.local_size)
    ranks = f"{node.local_size} ranks x " if node.local_size > 1 else ""
    cores = f"{node.cores} core" + ("s" if node.cores != 1 else "")
    # the ranks alone outnumber the cores: fewer threads cannot help, fewer ranks can,
    # and MPICH's yielding waits let a waiting rank give its core away
    yielding = (environ or {}).get("MPIR_CVAR_ENABLE_HEAVY_YIELD") == "1"
    fix = f"OMP_NUM_THREADS={fit}" if node.local_size <= node.cores else \
        f"at most {node.cores} ranks here" + \
        ("" if yielding else ", or MPIR_CVAR_ENABLE_HEAVY_YIELD=1")
    return notes + [f"{ranks}{threads} thread{'s' if threads != 1 else ''} on {cores} take "
                    f"turns (many times slower): {fix}"]


def joined(numbers, sep: str) -> str | None:
    """'32 / 8 / 2' (sep ' / ') of the numbers, None for None."""
    return None if numbers is None else sep.join(map(str, numbers))


def resume_notes(saved, opts, status: tuple[str, str], grid=None,
                 recorded: int = 0, threads: tuple = (None, None)) -> list[str]:
    """Where a resume starts and what it changes beyond more iterations: the iterations
    the earlier start `recorded` after its checkpoint are run again, the grid may differ
    from the checkpoint's, a stalled run trains on, and a learning-rate schedule over
    train.iterations is stretched (or shortened) to the new length."""
    notes = [f"resumed from the checkpoint of iteration {saved.iteration}"]
    first, last = saved.iteration + 1, min(recorded, opts.train.iterations)
    if last > first:
        notes += [f"  iterations {first}-{last} of the earlier start are run again"]
    elif last == first:
        notes += [f"  iteration {first} of the earlier start is run again"]
    was = getattr(saved, "grid", None)
    if grid is not None and was is not None and (was.layer, was.data) != (grid.layer,
                                                                           grid.data):
        notes += [f"  on {grid.layer} layer x {grid.data} data ranks (it ran on "
                  f"{was.layer} x {was.data})"]
    if None not in threads and threads[0] != threads[1]:   # (the earlier start's, now)
        notes += [f"  on {threads[1]} threads per rank (it ran on {threads[0]}: the "
                  f"results differ in rounding)"]
    if not getattr(saved, "warm_starts", True) and opts.mode.name != SERIAL:
        notes += ["  no warm starts in its checkpoint (a full disk): the MGRIT solves "
                  "start cold"]
    if status[0] == ms.STALLED:
        notes += [f"the run had stalled; resumed, it trains on with train.patience="
                  f"{opts.train.patience} afresh", f"  ({status[1]})"]
    before = OmegaConf.create(saved.config).train.iterations
    schedule = getattr(opts.optimizer, "schedule", "constant")
    if before != opts.train.iterations and schedule != "constant":
        longer = opts.train.iterations > before
        notes += [f"optimizer.schedule={schedule} {'stretched' if longer else 'shortened'} "
                  f"to train.iterations={opts.train.iterations} (was {before}):",
                  f"  from iteration {saved.iteration + 1} the rate follows the "
                  + ("longer schedule" if longer else "shorter schedule (it drops)")]
    return notes
