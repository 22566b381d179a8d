"""The per-rank memory estimate and the memory a rank may use (parallel.memory, preflight)."""
import math
import re

import pytest

from lptrain.data.base import Sizes
from lptrain.parallel import memory
from lptrain.parallel.grid import Grid


class _HeapPeak:
    """The most heap a block of code held above what it started with: glibc's bytes in
    use (mallinfo2: chunks and mmapped blocks, torch's tensors included), sampled by a
    thread every 0.2 ms; the states live for whole sweeps, so sampling sees them."""

    def __init__(self):
        import ctypes

        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]
        try:
            self._info = ctypes.CDLL("libc.so.6").mallinfo2
        except (OSError, AttributeError):
            pytest.skip("no glibc mallinfo2 here")
        self._info.restype = Info

    def in_use(self) -> int:
        info = self._info()
        return info.uordblks + info.hblkhd

    def __enter__(self):
        import gc
        import threading
        import time
        gc.collect()          # earlier tests' garbage freed during the run read as negative
        self.start = self.top = self.in_use()
        self._on = True

        def sample():
            while self._on:
                self.top = max(self.top, self.in_use())
                time.sleep(2e-4)
        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._on = False
        self._thread.join()
        self.top = max(self.top, self.in_use())
        self.peak = self.top - self.start


# overrides -> (lowest, highest) estimate / measured peak. The estimate (without BASE) is
# fitted to peaks of the resident set (BENCHMARKS.md "Memory per rank"), which keeps some
# freed memory, while the heap in use is what the run holds: the MGRIT modes hold what
# they are estimated to (1.0 here), serial and kept warm starts less (2.1 and 1.7: with
# compact warm starts the solver needs one level-0 buffer of the two the estimate counts)
PEAK_CASES = {
    "serial": (["mode=serial"], 1.0, 3.0),
    "mgrit": (["mode=mgrit"], 0.85, 1.2),
    "simultaneous-warm-starts": (["mode=simultaneous", "optimizer=adam",
                                  "train.batch_size=500"], 1.2, 2.2),
}


@pytest.mark.parametrize("case", list(PEAK_CASES))
def test_the_estimate_is_the_measured_peak(case, tmp_path):
    # 32 layers of 16 x 4000 float64 states (512 KB each): tens of MB, far above the
    # heap's noise; a tiny run first, so that one-time allocations are not counted
    from helpers import composed
    from lptrain import app, preflight
    overrides, low, high = PEAK_CASES[case]
    common = ["network.layers=32", "network.width=16", "dataset.n_val=100",
              "eval_every=100", "mgrit.levels=3", "mgrit.cfactor0=2", *overrides]
    tiny, cfg = (composed(*common, *more) for more in
                 (["dataset.n_train=500", "train.iterations=1"],
                  ["dataset.n_train=4000", "train.iterations=3"]))
    for name in ("tiny", "run", "again"):
        (tmp_path / name).mkdir()
    app.run(tiny, None, tmp_path / "tiny")
    need = preflight.plan(app.options(cfg), None).need
    peaks = []
    for name in ("run", "again"):   # a sampled peak can miss the top on a loaded machine
        with _HeapPeak() as heap:     # (CI: 157 MB of 173 once): the larger of two runs
            app.run(cfg, None, tmp_path / name)
        peaks.append(heap.peak)
    ratio = (need.total - need.base) / max(peaks)
    assert low <= ratio <= high, (case, need, [p / 1e6 for p in peaks])


def test_meminfo_and_cgroup_limits(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       8000000 kB\nMemAvailable:   4000000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    own = tmp_path / "no-proc"           # no /proc/self/cgroup: the mount's own files
    got = memory.available(4, info, cg, own) - memory.resident()
    assert got == pytest.approx(4000000 * 1024 / 4, rel=1e-3)
    (cg / "memory.max").write_text("2048000000\n")
    (cg / "memory.current").write_text("48000000\n")
    got = memory.available(4, info, cg, own) - memory.resident()
    assert got == pytest.approx(2000000000 / 4, rel=1e-3)
    (cg / "memory.max").write_text("max\n")       # no cgroup limit
    got = memory.available(2, info, cg, own) - memory.resident()
    assert got == pytest.approx(4000000 * 1024 / 2, rel=1e-3)


def _limits(d, limit, used, v1=False):
    d.mkdir(parents=True, exist_ok=True)
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes") if v1 else \
        ("memory.max", "memory.current")
    for name, value in zip(names, (limit, used)):
        (d / name).write_text(f"{value}\n")


def test_a_job_s_own_cgroup_limits_the_room(tmp_path):
    """Only the mount's top memory.max was read: a batch system's job cgroup (v2 below
    the root, or v1's memory controller) let runs start that its OOM killer ended."""
    mount, own = tmp_path / "cg", tmp_path / "self_cgroup"
    # v1: the job's cgroup under memory/, 1.5 GB; its parent unlimited
    _limits(mount / "memory" / "slurm" / "job_7", 1_500_000_000, 500_000_000, v1=True)
    _limits(mount / "memory" / "slurm", 2 ** 63 - 4096, 0, v1=True)
    own.write_text("4:memory:/slurm/job_7\n3:cpu:/slurm/job_7\n0::/\n")
    assert memory.cgroup_room(mount, own) == 1_000_000_000
    # v2 on a hybrid host (mounted at unified/): a parent's limit holds for its children
    _limits(mount / "unified" / "user.slice", 3_000_000_000, 2_900_000_000)
    (mount / "unified" / "user.slice" / "run-1").mkdir()
    own.write_text("0::/user.slice/run-1\n")
    assert memory.cgroup_room(mount, own) == 100_000_000
    # page cache the kernel reclaims first is room: a job that read its data sat at its
    # limit in cache, and runs that fit were refused
    (mount / "unified" / "user.slice" / "memory.stat").write_text(
        "anon 100000000\ninactive_file 2500000000\nactive_file 300000000\n")
    assert memory.cgroup_room(mount, own) == 2_600_000_000
    own.write_text("1:cpu:/\n")                    # no memory controller named: no limit
    assert memory.cgroup_room(mount, own) == math.inf


def test_a_rank_of_a_bigger_grid_needs_less():
    from lptrain.config.schema import Config, LBFGSOptions, ModeOptions
    from lptrain.data.mnist import MnistOptions
    from lptrain.mgrit.options import MGRITOptions
    from lptrain.model.network import NetworkOptions, ResNet
    from lptrain.preflight import need
    net_opts = NetworkOptions(name="conv", channels=4, layers=32, opening="replicate")
    opts = Config(dataset=MnistOptions(n_train=160, n_val=32), network=net_opts,
                  optimizer=LBFGSOptions(), mode=ModeOptions("simultaneous"),
                  mgrit=MGRITOptions())
    sizes = Sizes(160, 32, (1, 28, 28), 10, 5000)
    net = ResNet(net_opts, sizes.feature_shape, sizes.n_classes)
    one, grid, data = (need(opts, sizes, net, g).states
                       for g in (Grid(1, 1), Grid(8, 2), Grid(1, 16)))
    assert one > grid and one > data
    assert data == pytest.approx(one / 16)


def _mnist_setup(n_train, n_val):
    from lptrain.config.schema import Config, LBFGSOptions, ModeOptions
    from lptrain.data.mnist import MnistOptions
    from lptrain.mgrit.options import MGRITOptions
    from lptrain.model.network import NetworkOptions, ResNet
    net_opts = NetworkOptions(name="conv", channels=4, layers=32, opening="replicate")
    opts = Config(dataset=MnistOptions(n_train=n_train, n_val=n_val), network=net_opts,
                  optimizer=LBFGSOptions(), mode=ModeOptions("simultaneous"),
                  mgrit=MGRITOptions())
    sizes = Sizes(n_train, n_val, (1, 28, 28), 10, n_train + n_val)
    return opts, sizes, ResNet(net_opts, sizes.feature_shape, sizes.n_classes)


def test_validation_set_takes_no_state_memory_beyond_a_batch():
    from lptrain.preflight import need
    small, mid, big = (need(*_mnist_setup(600, n_val), Grid(1, 1))
                       for n_val in (10, 600, 10000))
    assert mid.states == big.states > small.states   # validation goes in batch-sized chunks
    assert big.data > small.data                     # but its samples are held


def test_refusal_names_the_largest_batch_that_fits():
    from lptrain.preflight import _batch_hint, need
    opts, sizes, net = _mnist_setup(60000, 10000)
    g = Grid(1, 1)
    limit = need(opts, sizes, net, g, 500).total
    assert need(opts, sizes, net, g, 501).total > limit
    hint = _batch_hint(opts, sizes, net, g, limit)
    assert "at most 500 samples" in hint and "train.batch_size=500" in hint
    assert _batch_hint(opts, sizes, net, g, memory.BASE / 2) == ""   # nothing fits


def test_refusal_names_the_warm_starts_that_fit():
    import dataclasses
    from lptrain.config.schema import TrainOptions
    from lptrain.preflight import _warm_hint, need
    opts, sizes, net = _mnist_setup(60000, 10000)
    opts = dataclasses.replace(opts, train=TrainOptions(iterations=1, batch_size=500))
    g = Grid(1, 1)
    full = need(opts, sizes, net, g)
    assert full.warm > 0 and opts.mode.warm_batches == 64
    per_batch = full.warm / 64
    limit = full.total - full.warm + 23.5 * per_batch
    assert _warm_hint(opts, sizes, full, limit) == \
        ", fewer kept warm starts (mode.warm_batches=23)"
    assert _warm_hint(opts, sizes, need(*_mnist_setup(600, 10), g), limit) == ""
    # where no kept batch fits, none is named (it offered mode.warm_batches=0, refused)
    assert _warm_hint(opts, sizes, full, full.total - full.warm + 0.5 * per_batch) == ""


@pytest.mark.parametrize(("n_train", "ranks", "expect"), [
    (4800, 1, "checkpoints: up to about 2.17 GB each, the warm starts of 48 kept batches"),
    (4800, 2, "checkpoints: up to about 2.17 GB each, the warm starts of 48 kept batches"),
    (600, 1, None)])          # 6 kept batches: 271 MB, no line
def test_checkpoints_made_large_by_kept_warm_starts_are_said(n_train, ranks, expect):
    """`dataset=mnist mode=simultaneous` wrote 2,168,101,422-byte checkpoints, unsaid."""
    import dataclasses
    from lptrain.config.schema import TrainOptions
    from lptrain.preflight import Plan, checkpoint_notes, need
    opts, sizes, net = _mnist_setup(n_train, 200)
    opts = dataclasses.replace(opts, train=TrainOptions(iterations=1, batch_size=100))
    g = Grid(1, ranks)       # the data groups' shards: each rank keeps half of a batch
    plan = Plan(g, sizes, None, "cpu", need(opts, sizes, net, g), 1e12)
    notes = checkpoint_notes(opts, plan)
    assert notes == ([] if expect is None else [expect + " (mode.warm_batches); the disk "
                                                "needs room for two while one is written"])


def test_calibration_adds_a_serial_evaluation_of_the_layer_groups_share():
    import dataclasses
    from lptrain.preflight import need
    opts, sizes, net = _mnist_setup(600, 10)
    calibrated = dataclasses.replace(opts, mgrit=dataclasses.replace(opts.mgrit,
                                                                     calibrate_every=10))
    extra = [need(calibrated, sizes, net, g).states - need(opts, sizes, net, g).states
             for g in (Grid(1, 1), Grid(4, 1))]
    state = 600 * 4 * 28 * 28 * 8          # one float64 state of the batch
    assert extra[0] == pytest.approx(memory.STATE_COPIES["serial"] * 33 * state)
    assert extra[1] == pytest.approx(extra[0] / 4)      # the batch split over 4 layer ranks


@pytest.mark.parametrize("n, cf0, cf, levels, min_coarse", [
    (32, 4, 4, 3, 2), (256, 2, 2, 10, 2), (30, 2, 2, 2, 2), (31, 3, 5, 6, 1),
    (1024, 4, 4, 4, 2), (7, 8, 2, 3, 2), (64, 2, 4, 1, 2), (33, 2, 2, 6, 0)])
def test_coarse_steps_are_the_hierarchy_s(n, cf0, cf, levels, min_coarse):
    from lptrain.mgrit.hierarchy import build_levels
    from lptrain.parallel.grid import c_intervals, coarse_steps, hierarchy_steps
    built = [len(lv.points) - 1 for lv in build_levels(n, cf0, cf, levels, min_coarse)]
    assert hierarchy_steps(n, cf0, cf, levels, min_coarse) == built
    assert coarse_steps(n, cf0, cf, levels, min_coarse) == sum(built[1:])
    assert c_intervals(n, cf0, levels, min_coarse) == (built[1] if len(built) > 1 else n)


def test_a_hierarchy_coarsened_by_two_needs_more():
    """indian_pines_deep (cfactor 2, 10 levels: 254 coarse steps for 256 layers) was
    estimated as if coarsened by 4 and killed by the OOM killer at 7.3 GB against 5.4."""
    by = {c: memory.estimate("mgrit", 256, 1, 1000, 235, 10_000, 8, 0.0, 4,
                             coarse=coarse) for c, coarse in ((2, 254), (4, 84))}
    state = 1000 * 235 * 8
    assert by[2].states - by[4].states == pytest.approx(memory.COARSE_COPIES * 170 * state)


def test_the_peaks_grid_is_counted_and_holds_what_the_loader_needs():
    """peaks_sizes left out the grid² points the loader labels, so dataset.grid=10⁸ passed
    the preflight and the loader asked for 8·10¹⁶ bytes (a traceback, not a refusal)."""
    from lptrain.data.peaks import PeaksOptions, load_peaks, peaks_sizes
    options = PeaksOptions(n_train=500, n_val=100, grid=1500)
    sizes = peaks_sizes(options)
    assert sizes.read == 1500 ** 2
    with _HeapPeak() as heap:
        load_peaks(options, 0)
    counted = sizes.read * math.prod(sizes.feature_shape) * 8 * 2   # as preflight.need
    assert 0.3 * counted < heap.peak <= counted, heap.peak / counted


def test_a_peaks_grid_that_does_not_fit_is_refused_before_loading():
    from helpers import composed
    from lptrain import app, preflight
    from lptrain.errors import ConfigError
    for grid in (100_000_000, 1_000_000):          # 10¹⁶ and 10¹² points
        with pytest.raises(ConfigError, match="^memory: .* more than the .* so more ranks do "
                           "not help: use a smaller dataset \\(dataset.grid\\)$"):
            preflight.plan(app.options(composed(f"dataset.grid={grid}")), None)


def test_parameters_beyond_memory_name_the_network_not_the_dataset():
    """The advice named the dataset (its 65536 points, 2 MB) for a network of 9·10⁵ GB of
    parameters: where neither more ranks nor fewer samples would do, the larger of the
    two that every rank holds is the one to shrink."""
    from helpers import composed
    from lptrain import app, preflight
    from lptrain.errors import ConfigError
    with pytest.raises(ConfigError, match="^memory: .* so more ranks do not help: use a "
                       "smaller network \\(network.width"):
        preflight.plan(app.options(composed("network.width=1000000")), None)


def test_lbfgs_pairs_are_counted_as_each_ranks_part_where_theta_splits():
    """From shards.LEAST parameters each rank keeps 1/P of the 2m pairs, and a checkpoint
    passes one whole vector through rank 0 (train/stored_pairs.py); below it every rank
    keeps the whole pairs."""
    from helpers import composed
    from lptrain import app, preflight
    from lptrain.data.base import dataset_sizes
    from lptrain.parallel.grid import Grid
    from lptrain.train import shards
    for width, split in ((8, False), (100, True)):     # 2.5·10³ and 3.3·10⁵ parameters
        opts = app.options(composed(f"network.width={width}", "network.layers=32"))
        sizes = dataset_sizes(opts.dataset)
        net = preflight._network(opts, sizes, "cpu")
        assert shards.splits(net.layout.size) == split
        vector = net.layout.size * 8
        m = opts.optimizer.memory
        by = {p: preflight.need(opts, sizes, net, Grid(1, p)).params for p in (1, 4)}
        assert by[1] == (2 * m + 9) * vector
        assert by[4] == ((2 * m) // 4 + 9 if split else 2 * m + 9) * vector


@pytest.mark.parametrize("override, advice", [
    ("dataset.grid=100000", "use a smaller dataset (dataset.grid)"),
    ("dataset.n_train=10000000000", "use fewer samples (dataset.n_train, dataset.n_val)"),
    ("dataset.n_val=10000000000", "use fewer samples (dataset.n_train, dataset.n_val)")])
def test_a_source_beyond_memory_names_the_keys_that_make_it_so(override, advice):
    """dataset.n_train=10¹⁰ was told to shrink dataset.grid, at its default (held-out)."""
    from helpers import composed
    from lptrain import app, preflight
    from lptrain.errors import ConfigError
    with pytest.raises(ConfigError, match=f"so more ranks do not help: {re.escape(advice)}$"):
        preflight.plan(app.options(composed(override)), None)


@pytest.mark.parametrize("override", ["dataset.n_val=10000000000", "dataset.grid=100000"])
def test_lptrain_eval_refuses_a_dataset_beyond_memory_before_loading_it(override,
                                                                         monkeypatch):
    """`lptrain-eval RUN dataset.n_val=10000000000` was killed by the OOM killer after
    taking 18 GB (held-out): the lptrain command's refusal, before the data is drawn."""
    from lptrain import evaluate
    from lptrain.config.schema import dataset_options
    from lptrain.errors import ConfigError
    from lptrain.parallel import memory as mem

    def loaded(*a, **k):
        raise AssertionError("the data was loaded")
    monkeypatch.setattr("lptrain.data.load_dataset", loaded)
    monkeypatch.setattr(mem, "available", lambda local_size: 19.2e9)
    key, value = override.split("=")
    options = dataset_options()["peaks"](**{key.split(".")[1]: int(value)})
    with pytest.raises(ConfigError, match=r"^memory: \d+ training and \d+ validation "
                       r"samples need about [\d.]+ GB to load, more than the 19.2 GB"):
        evaluate._fits(options)
    evaluate._fits(dataset_options()["peaks"]())      # the default fits
