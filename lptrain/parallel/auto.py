"""`parallel.layer_ranks=auto`: among the grids a run may use, the one predicted fastest.

The prediction is behind one narrow interface, `GridTimer`.  The entry points install
a factory of timers (`install`): the `lptrain` command the speedup model's, which
imports it only when called (model_perf/grid.py: recorded iterations, kernel costs
measured on this host and kept per configuration).  A timer is built only when there is
a choice: a run whose grid is explicit (or has one candidate) never loads the model.
Without an installed factory (lptrain used as a library) auto takes the data-parallel
split, which divides the work exactly.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from lptrain.errors import LptrainError
from lptrain.parallel.grid import TIE, Grid, choose


class GridTimer(Protocol):
    """Predicted seconds per optimizer iteration of a run on each grid."""

    def times(self, grids: Sequence[Grid]) -> dict[Grid, float]: ...


class DataParallelFirst:
    """The timer without a model: fewer layer ranks are faster."""

    note = "no speedup model installed: the data-parallel split"

    def times(self, grids: Sequence[Grid]) -> dict[Grid, float]:
        return {g: float(g.layer) for g in grids}


class Recorded:
    """A GridTimer that keeps what `timer` answered, for the line saying how the split
    was chosen (`note`; a timer may add its own `note`: where its costs came from)."""

    def __init__(self, timer: GridTimer):
        self.timer, self.found = timer, {}

    def times(self, grids: Sequence[Grid]) -> dict[Grid, float]:
        self.found = dict(self.timer.times(grids))
        return self.found

    def notes(self, chosen: Grid) -> list[str]:
        """Notes, one line each (the console breaks them at its width): the split and
        its predicted time beside the next best, then the timer's own notes (`note`:
        where its times came from, `assumed`: what they assume), indented."""
        own = getattr(self.timer, "note", None)
        text = f"auto split {chosen.layer} x {chosen.data}"
        lines = []
        if not isinstance(self.timer, DataParallelFirst) and chosen in self.found:
            text += f": predicted {self.found[chosen]:.3g} s/it"
            others = sorted((t, g.layer, g.data) for g, t in self.found.items()
                            if g != chosen)
            if others:
                t, layer, data = others[0]
                if t < self.found[chosen]:          # within TIE: more layer ranks won
                    lines = [f"  ({layer} x {data}: {t:.3g} s/it; within {TIE:.0%} of the "
                             f"fastest, the most layer ranks win)"]
                else:
                    text += f"; next best {layer} x {data}: {t:.3g} s/it"
        assumed = getattr(self.timer, "assumed", None)
        return [text, *lines, *(f"  {n}" for n in (own, assumed) if n)]


_factory: Callable | None = None     # the installed (opts, net, mode) -> GridTimer


def install(factory: Callable | None) -> None:
    """Use factory(opts, net, mode) for the timers of later choices (None: none)."""
    global _factory
    _factory = factory


def timer_for(opts, net, mode: str) -> GridTimer:
    """The installed factory's timer for a run of `opts` in `mode`, else DataParallelFirst."""
    return DataParallelFirst() if _factory is None else _factory(opts, net, mode)


def auto_grid(grids: Sequence[Grid], timer: GridTimer) -> Grid:
    """The grid to use: the only one, else the fastest (within parallel.grid.TIE the one
    with the most layer ranks)."""
    if len(grids) == 1:
        return grids[0]
    times = timer.times(grids)
    return choose(list(grids), times.__getitem__)


class RankZeroFailed(RuntimeError):
    """Raised on the ranks > 0 of a choice that failed on rank 0 with an error not auto's
    own: rank 0 raises that error itself (its type and traceback), these stop with it."""


def agreed_grid(grids: Sequence[Grid], make_timer, comm) -> Grid:
    """auto_grid on rank 0 of comm, the same grid on every rank.

    make_timer() builds the timer (only when there is a choice).  A failure on rank 0
    stops every rank instead of leaving them waiting: an LptrainError (the speedup
    model's own refusal, a kept cost file it cannot read) on every rank, saying it was
    auto's, with its exit status; any other exception, such as a user's step failing
    in the kernels the timer runs, as the run's error it is, raised on rank 0
    (RankZeroFailed on the others).
    """
    if len(grids) == 1:
        return grids[0]
    size = 1 if comm is None else comm.Get_size()
    found = error = failure = None
    if size == 1 or comm.Get_rank() == 0:
        try:
            found = auto_grid(grids, make_timer())
        except LptrainError as exc:     # every rank must hear of it: re-raised below
            error = (f"parallel.layer_ranks=auto: {exc}", exc.exit_code)
        except Exception as exc:        # not auto's to phrase
            failure = exc
    failed = failure is not None
    if size > 1:
        found, error, failed = comm.bcast((found, error, failed), root=0)
    if failure is not None:
        raise failure
    if failed:
        raise RankZeroFailed("rank 0 failed while parallel.layer_ranks=auto timed the "
                             "kernels (its error says why)")
    if error is not None:
        raise LptrainError(error[0], exit_code=error[1])
    return found
