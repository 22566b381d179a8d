"""Pure index arithmetic of the MGRIT hierarchy and its distribution over ranks."""
import itertools

import pytest

from lptrain.errors import SolverError
from lptrain.mgrit.hierarchy import build_hierarchy, build_levels, c_points, split_intervals

CASES = [(N, cf, P) for N, cf, P in itertools.product(
    [1, 2, 3, 7, 8, 10, 16, 30, 33, 64], [2, 3, 4], [1, 2, 3, 4, 5, 7])
    if P <= -(-N // cf)]


def test_c_points_every_cf_plus_last():
    assert c_points(11, 4) == (0, 4, 8, 10)
    assert c_points(9, 4) == (0, 4, 8)
    assert c_points(2, 4) == (0, 1)


def test_levels_coarsen_until_limits():
    lv = build_levels(30, 2, 2, 10, 10)      # the authors' Peaks: 30 → 15 steps
    assert [len(x.points) - 1 for x in lv] == [30, 15]
    lv = build_levels(64, 4, 2, 3, 1)
    assert [x.points[-1] for x in lv] == [64] * 3
    assert lv[1].points == tuple(range(0, 65, 4)) and lv[2].points == tuple(range(0, 65, 8))
    assert lv[-1].cpoints == ()
    assert len(build_levels(10, 2, 2, 1, 1)) == 1


@pytest.mark.parametrize("N,cf,P", CASES)
def test_ranges_partition_every_level(N, cf, P):
    h = build_hierarchy(N, cf, cf, 4, 1, P)
    for lv, ranges in zip(h.levels, h.ranges):
        covered = [i for lo, hi in ranges for i in range(lo, hi)]
        assert covered == list(range(lv.n_points))        # contiguous, disjoint, complete
    lv0 = h.levels[0]
    for lo, hi in h.ranges[0]:
        assert hi > lo and (len(h.levels) == 1 or lv0.is_c(lo))  # whole C-intervals
    for l in range(len(h.levels) - 1):                    # coarse points stay with owner
        for r, (lo, hi) in enumerate(h.ranges[l + 1]):
            fine = h.levels[l + 1].points[lo:hi]
            flo, fhi = h.ranges[l][r]
            assert all(p in h.levels[l].points[flo:fhi] for p in fine)


@pytest.mark.parametrize("N,cf,P", CASES)
def test_reversed_hierarchy_gives_each_rank_its_adjoints(N, cf, P):
    h = build_hierarchy(N, cf, cf, 3, 1, P)
    rev = h.reversed()
    for r in range(P):
        lo, hi = h.ranges[0][r]
        layers = range(lo, min(hi, N))
        rlo, rhi = rev.ranges[0][P - 1 - r]
        mirrored = {N - q for q in range(rlo, rhi)}        # forward indices of λ held
        assert {n + 1 for n in layers} <= mirrored        # λ_{n+1} of every own layer
        if lo == 0:
            assert 0 in mirrored                          # λ_0 for the opening layer
    for lv, rl in zip(h.levels, rev.levels):
        assert rl.points == tuple(N - p for p in reversed(lv.points))


def test_neighbours_skip_empty_ranks():
    h = build_hierarchy(16, 2, 2, 4, 1, 4)
    coarsest = len(h.levels) - 1
    ranges = h.ranges[coarsest]
    assert any(hi == lo for lo, hi in ranges) or len(h.levels[coarsest].points) >= 4
    for r, (lo, hi) in enumerate(ranges):
        if hi > lo and lo > 0:
            left = h.left(coarsest, r)
            assert h.ranges[coarsest][left][1] == lo


def test_too_many_ranks_is_a_clear_error():
    with pytest.raises(SolverError, match="5 ranks but only 4 C-intervals"):
        split_intervals(4, 5)
    with pytest.raises(SolverError, match="at most 2 ranks"):
        build_hierarchy(8, 4, 4, 2, 1, 3)


def test_split_is_balanced():
    blocks = split_intervals(10, 3)
    sizes = [b - a for a, b in blocks]
    assert sum(sizes) == 10 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("overrides, grid, want", [
    (["mode=serial"], (1, 1), []),
    (["mode=mgrit"], (1, 1), ["MGRIT levels (steps): 32 / 8 / 2"]),
    (["mode=simultaneous"], (2, 1), ["MGRIT levels (steps): 32 / 8 / 2"]),
    (["experiment=peaks_deep", "mode=simultaneous"], (1, 1), ["MGRIT levels (steps): 1024 / 256 / 64 / 16"]),
    (["experiment=peaks_paper", "mode=mgrit"], (1, 1), ["MGRIT levels (steps): 30 / 15"]),
    (["mode=mgrit", "mgrit.levels=10"], (1, 1), ["MGRIT levels (steps): 32 / 8 / 2"]),
    (["mode=mgrit", "mgrit.cfactor0=64"], (1, 1),
     ["MGRIT levels (steps): 32 only, so MGRIT steps serially",
      "  (mgrit.cfactor0=64 leaves fewer than mgrit.min_coarse=2 coarse steps)"]),
    (["mode=simultaneous", "mgrit.levels=1"], (1, 1),
     ["MGRIT levels (steps): 32 only, so MGRIT steps serially", "  (mgrit.levels=1)"]),
])
def test_a_run_says_the_levels_its_options_give(overrides, grid, want):
    """The lines under a run's title: the hierarchy the solver builds, not the options'
    bounds (a factor beyond N leaves one level, which a sweep over cfactor0 must show)."""
    from helpers import config_of
    from lptrain.app import hierarchy_notes, level_steps
    from lptrain.parallel.grid import Grid
    opts, _ = config_of(overrides)
    notes = hierarchy_notes(opts, level_steps(opts, Grid(*grid)))
    assert notes == want and all(len(line) <= 80 for line in notes)
    if len(want) == 1:
        steps = [lv.n_points - 1 for lv in
                 opts.mgrit.hierarchy(opts.network.layers, grid[0]).levels]
        assert want[0].endswith(" / ".join(map(str, steps)))


def test_more_threads_than_cores_is_said_under_the_title():
    """OMP_NUM_THREADS=2 on 2 ranks of a 2-core machine ran many times slower than
    OMP_NUM_THREADS=1, and nothing said so."""
    from lptrain.parallel.context import Node
    from lptrain.title_notes import thread_notes
    assert thread_notes(Node(0, 2, 2), 2) == [
        "2 ranks x 2 threads on 2 cores take turns (many times slower): OMP_NUM_THREADS=1"]
    assert thread_notes(Node(0, 1, 2), 4)[0].startswith("4 threads on 2 cores take turns")
    assert thread_notes(Node(0, 1, 1), 2)[0].startswith("2 threads on 1 core take")
    assert thread_notes(Node(0, 2, 2), 1) == thread_notes(Node(0, 1, 2), 2) == []
    # the ranks alone outnumber the cores: fewer threads cannot help (held-out, stop 67)
    assert thread_notes(Node(0, 6, 2), 1) == [
        "6 ranks x 1 thread on 2 cores take turns (many times slower): at most 2 ranks "
        "here, or MPIR_CVAR_ENABLE_HEAVY_YIELD=1"]
    assert thread_notes(Node(0, 3, 2), 1, {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}) == [
        "3 ranks x 1 thread on 2 cores take turns (many times slower): at most 2 ranks here"]
    assert thread_notes(Node(0, 4, 16), 4) == []
    # libgomp said it on each rank, lptrain nothing (held-out, stop 64)
    for bad in ("0", "abc", "-1", "1.5", ""):
        assert thread_notes(Node(0, 2, 2), 1, {"OMP_NUM_THREADS": bad}) == [
            f"OMP_NUM_THREADS={bad!r} is no number of threads: 1 per rank, the node's cores "
            f"shared by its ranks"]
    assert thread_notes(Node(0, 2, 2), 1, {"OMP_NUM_THREADS": "1"}) == []


def test_a_tolerance_below_the_dtypes_round_off_is_said_under_the_title():
    """mode=mgrit dtype=float32 showed residuals like 2.4e-04 against mgrit.tol 1e-10,
    with mgrit/unconverged 0: nothing said that its solves stop at round-off."""
    from helpers import composed
    from lptrain.config.typed import options
    from lptrain.title_notes import precision_notes
    assert precision_notes(options(composed("mode=mgrit", "dtype=float32"))) == [
        "mgrit.tol=1e-10 is below float32's round-off: solves stop at 10 eps |u|"]
    for given in (["mode=mgrit"], ["mode=simultaneous", "dtype=float32"],
                  ["mode=mgrit", "dtype=float32", "mgrit.tol=1e-5"],
                  ["mode=mgrit", "dtype=float32", "mgrit.tol=0"]):
        assert precision_notes(options(composed(*given))) == []


def test_first_plans_above_the_cap_are_said_under_the_title():
    """`mgrit.fwd_iters=10 mgrit.control_max_iters=6` ran 6 iterations, unsaid (held-out)."""
    from helpers import composed
    from lptrain.config.typed import options
    from lptrain.title_notes import plan_notes
    assert plan_notes(options(composed("mode=simultaneous", "mgrit.fwd_iters=10",
                                       "mgrit.control_max_iters=6"))) == [
        "mgrit.fwd_iters=10 above mgrit.control_max_iters=6: the plans are capped at 6"]
    for given in (["mode=simultaneous"], ["mode=mgrit", "mgrit.fwd_iters=10"],
                  ["mode=simultaneous", "mgrit.fwd_iters=10", "mgrit.control=fixed"]):
        assert plan_notes(options(composed(*given))) == []
