"""The per-rank memory estimate and the memory a rank may use (parallel.memory, preflight)."""
import math

import pytest

from lptrain.data.base import Sizes
from lptrain.parallel import memory
from lptrain.parallel.grid import Grid


def test_estimate_counts_states_per_owned_layer_and_sample():
    state = 10 * 100 * 8
    one = memory.estimate("simultaneous", 32, 1, 10, 100, 0, 8, 0.0, 0)
    assert one.states == pytest.approx(state * (memory.STATE_COPIES["simultaneous"] * 33
                                                + memory.STATE_EXTRA))
    four = memory.estimate("simultaneous", 32, 4, 10, 100, 0, 8, 0.0, 0)
    assert four.states == pytest.approx(state * (memory.STATE_COPIES["simultaneous"] * 9
                                                 + memory.STATE_EXTRA))
    serial = memory.estimate("serial", 32, 1, 10, 100, 0, 8, 0.0, 0)
    assert serial.states == pytest.approx(state * (memory.STATE_COPIES["serial"] * 33
                                                   + memory.STATE_EXTRA))
    # kept mini-batch warm starts: their C-points only (8 C-intervals: 3 per rank of 4)
    warm = memory.estimate("simultaneous", 32, 4, 10, 100, 0, 8, 0.0, 0, warm_batches=3,
                           intervals=8)
    assert warm.warm == pytest.approx(memory.WARM_COPIES * 3 * state * 3)
    one_level = memory.estimate("simultaneous", 32, 4, 10, 100, 0, 8, 0.0, 0, warm_batches=3)
    assert one_level.warm == pytest.approx(memory.WARM_COPIES * 9 * state * 3)
    val = memory.estimate("simultaneous", 32, 4, 10, 100, 0, 8, 0.0, 0, val_chunk=5)
    assert val.states - four.states == pytest.approx(
        memory.VAL_COPIES * 33 * math.ceil(5 / 4) * state / 10)
    p = memory.estimate("mgrit", 32, 4, 10, 100, 1000, 8, 5.0, 28)
    assert p.params == 28 * 1000 * 8 and p.data == 5.0 and p.checkpoint == 0
    assert p.total == pytest.approx(memory.BASE + p.params + p.data + p.states)
    # rank 0 receives one other rank's oracle state at a checkpoint
    ranks = memory.estimate("simultaneous", 32, 4, 10, 100, 0, 8, 0.0, 0, warm_batches=3,
                            ranks=4, intervals=8)
    assert ranks.checkpoint == pytest.approx(memory.CHECKPOINT_COPIES * 2 * 3 * state * 3)
    full = memory.estimate("simultaneous", 32, 4, 10, 100, 0, 8, 0.0, 0, ranks=4, intervals=8)
    assert full.checkpoint == pytest.approx(memory.CHECKPOINT_COPIES * 2 * 9 * state)
    assert memory.estimate("serial", 32, 1, 10, 100, 0, 8, 0.0, 0, ranks=4).checkpoint == 0


def test_meminfo_and_cgroup_limits(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       8000000 kB\nMemAvailable:   4000000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    got = memory.available(4, info, cg) - memory.resident()
    assert got == pytest.approx(4000000 * 1024 / 4, rel=1e-3)
    (cg / "memory.max").write_text("2048000000\n")
    (cg / "memory.current").write_text("48000000\n")
    got = memory.available(4, info, cg) - memory.resident()
    assert got == pytest.approx(2000000000 / 4, rel=1e-3)
    (cg / "memory.max").write_text("max\n")       # no cgroup limit
    got = memory.available(2, info, cg) - memory.resident()
    assert got == pytest.approx(4000000 * 1024 / 2, rel=1e-3)


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
