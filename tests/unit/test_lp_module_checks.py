"""LayerParallel's checks of its arguments, layers and inputs: each refusal names the bad
value in one line, before any solve."""
import re

import pytest
import torch
from torch import nn

from helpers import CONVERGED, PairLayer, WiderLayer, dense, inputs
from lptrain import LayerParallel, MGRITOptions


@pytest.mark.parametrize("kwargs, message", [
    (dict(T=float("inf")), "T=inf: the final time must be a positive finite number"),
    (dict(T=True), "T=True: the final time"),
    (dict(n_layers=8.0), "n_layers=8.0: the number of layers must be a positive int"),
    (dict(n_layers=True), "n_layers=True: the number"),
    (dict(mgrit={"levels": 2}), "mgrit={'levels': 2}: give an lptrain.MGRITOptions")])
def test_bad_arguments_are_named(kwargs, message):
    """Were NaN outputs (T=inf), a TypeError or AttributeError naming no argument, or
    n_layers=True taken as 1."""
    from lptrain.errors import ConfigError
    with pytest.raises(ConfigError, match=re.escape(message)):
        LayerParallel(dense, **{"T": 1.0, "n_layers": 4, **kwargs})


def test_a_list_of_layers_is_the_number_of_layers():
    """n_layers=8 with 5 modules built 5 layers of h = 0.2, silently."""
    from lptrain.errors import ConfigError
    with pytest.raises(ConfigError, match=r"n_layers=8 but 5 layers were given"):
        LayerParallel([dense(n) for n in range(5)], T=1.0, n_layers=8)
    assert LayerParallel([dense(n) for n in range(5)], T=1.0, n_layers=5).n_layers == 5


def test_averaged_coarse_weights_need_layers_of_one_structure():
    """coarse_weights='average' (the default) over Linear layers and nn.Tanh() ended in a
    KeyError from inside the solve, 68 lines (on 2 ranks an MPICH abort); 'inject' is
    right there (serial's output to rounding)."""
    from lptrain.errors import ConfigError

    def mixed(n):
        return dense(n) if n % 2 == 0 else nn.Tanh()
    with pytest.raises(ConfigError, match=r"coarse_weights='average': layers 0 and 1 "
                       r"differ in their parameters \(0.weight 3x3, 0.bias 3 against "
                       r"none\).*use coarse_weights='inject'"):
        LayerParallel(mixed, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    # two structures, each coarse step within one: averaging is fine (1 rank as on 2)
    halves = LayerParallel(lambda n: dense(n) if n < 4 else nn.Sequential(
        nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 3)).double(), T=1.0, n_layers=8,
        mgrit=MGRITOptions(levels=2, cfactor0=4, tol=1e-13, max_iter=60))
    x8 = inputs(5, 3)
    u8 = x8
    for n in range(8):
        u8 = u8 + 0.125 * halves.steps.module(n)(u8)
    assert torch.allclose(halves(x8), u8, atol=1e-12)
    # stacked in one vmap they cannot be (was torch's stack error from the forward)
    with pytest.raises(ConfigError, match=r"^stack=True: layers 0 and 4 differ .* use "
                       r"stack=False$"):
        LayerParallel(lambda n: dense(n) if n < 4 else nn.Sequential(
            nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 3)).double(), T=1.0, n_layers=8,
            stack=True, mgrit=MGRITOptions(levels=2, cfactor0=4))
    mod = LayerParallel(mixed, T=1.0, n_layers=4,
                        mgrit=MGRITOptions(**CONVERGED, coarse_weights="inject"))
    x = inputs(5, 3)
    u = x
    for n in range(4):
        u = u + 0.25 * mod.steps.module(n)(u)
    assert torch.allclose(mod(x), u, atol=1e-12)


@pytest.mark.parametrize("other", [3, 1])
def test_layers_of_two_dtypes_are_refused_naming_two(other):
    """One layer built in float32 among float64 ones: torch's dtype error from inside the
    solve, 88 lines (on 2 ranks a message blaming the ranks)."""
    from lptrain.errors import ConfigError

    def layers(n):
        return dense(n, dtype=torch.float32 if n == other else torch.float64)
    with pytest.raises(ConfigError, match=rf"^layers 0 and {other} hold torch.float64 and "
                       r"torch.float32 tensors: build every layer in one dtype"):
        LayerParallel(layers, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))


def test_a_layer_of_two_dtypes_is_named_once():
    """Was 'layers 0 and 0 hold torch.float64 and torch.float32 tensors'."""
    from lptrain.errors import ConfigError

    def layers(n):
        return nn.Sequential(dense(n), dense(n, dtype=torch.float32)) if n == 0 else dense(n)
    with pytest.raises(ConfigError, match=r"^layer 0 holds torch.float64 and torch.float32 "
                       r"tensors: build every layer in one dtype"):
        LayerParallel(layers, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))


def test_a_state_of_no_dimensions_is_a_state():
    """A 0-d input (any shape, as documented) ended in an IndexError inside the solve."""
    mod = LayerParallel(lambda n: nn.Tanh(), T=1.0, n_layers=8,
                        mgrit=MGRITOptions(**CONVERGED))
    x = torch.tensor(0.7, dtype=torch.float64)
    u = x
    for _ in range(8):
        u = u + torch.tanh(u) / 8
    assert mod(x).shape == () and torch.allclose(mod(x), u, atol=1e-12)


def test_an_input_of_another_dtype_than_the_layers_is_refused_before_the_solve():
    """Was torch's error from inside the solve: on several ranks it ended every rank."""
    from lptrain.errors import ConfigError
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    with pytest.raises(ConfigError, match=re.escape(
            "the input is torch.float32 but the layers' parameters are torch.float64")):
        mod(inputs(2, 3).float())
    mod = LayerParallel(lambda n: dense(n, dtype=torch.float32), T=1.0, n_layers=4,
                        mgrit=MGRITOptions(**CONVERGED))
    with torch.autocast("cpu", dtype=torch.bfloat16):     # autocast casts: allowed
        assert mod(inputs(2, 3).bfloat16()).shape == (2, 3)


@pytest.mark.parametrize("x, message", [
    (torch.zeros(3, 5), "the input has shape (3, 5); the steps take (batch, 4)"),
    (torch.zeros(4), "the input has shape (4,); the steps take (batch, 4)"),
    (torch.zeros(2, 3, 4), "the input has shape (2, 3, 4); the steps take (batch, 4)"),
    (torch.tensor(1.0), "the input has shape (); the steps take (batch, 4)"),
    (torch.zeros(3, 4, dtype=torch.int64), "the input is torch.int64; give floating-point"),
    (torch.zeros(3, 4).numpy(), "the input is a numpy.ndarray; give a torch.Tensor")])
def test_an_input_the_built_in_steps_cannot_take_is_refused_before_the_solve(x, message):
    """Were torch's errors from inside the solve (shapes transposed by its layout, an
    IndexError, 'no attribute requires_grad'); on 2 ranks they ended every rank."""
    from lptrain import LayerParallelResNet
    from lptrain.errors import ConfigError
    mod = LayerParallelResNet(width=4, layers=8)
    x = x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
    with pytest.raises(ConfigError, match="^LayerParallel: " + re.escape(message)):
        mod(x)
    assert mod(torch.zeros(3, 4, dtype=torch.float64)).shape == (3, 4)


def test_conv_steps_take_their_channels_at_any_image_size():
    from lptrain.errors import ConfigError
    from lptrain.parallel.builtin_steps import BuiltinSteps
    steps = BuiltinSteps.conv(torch.zeros(8, 2, 2, 3, 3, dtype=torch.float64),
                              torch.zeros(8, 2, dtype=torch.float64))
    mod = LayerParallel(steps, T=1.0)
    assert mod(torch.zeros(3, 2, 5, 6, dtype=torch.float64)).shape == (3, 2, 5, 6)
    with pytest.raises(ConfigError, match=re.escape("the steps take (batch, 2, any, any)")):
        mod(torch.zeros(3, 3, 5, 5, dtype=torch.float64))


@pytest.mark.parametrize("build, message", [
    (lambda: LayerParallel([], T=1.0), "LayerParallel: 0 layers; give at least one"),
    (lambda: __import__("lptrain").LayerParallelResNet(4, 8, dtype=torch.int64),
     "dtype=torch.int64: the weights must be floating point"),
    # held-out: torch's "'>' not supported between instances of 'str' and 'int'"
    (lambda: __import__("lptrain").LayerParallelResNet(4, "16"),
     "layers='16': must be an integer"),
    (lambda: __import__("lptrain").LayerParallelResNet(4, 8, T=None),
     "T=None: must be a number"),
    (lambda: __import__("lptrain").LayerParallelResNet(4, 8, comm=42),
     "comm=42: give an mpi4py communicator"),
    (lambda: __import__("lptrain").LayerParallelResNet(4, 8, seed=2 ** 70),
     "seed=1180591620717411303424: must be in [0, 2**32 - 1]"),
    (lambda: __import__("lptrain").LayerParallelResNet(4, 8, T=10 ** 400),
     "T: an integer of 401 digits, beyond a float's range"),
    (lambda: LayerParallel([torch.nn.Linear(2, 2)], T=10 ** 400),
     "T=10000000000000000000... (401 characters): the final time must be"),
    (lambda: __import__("lptrain").LayerParallelResNet(4, 8, init_scale=-1.0),
     "init_scale=-1.0: must be in [0, 100]"),            # not network.init_hidden
])
def test_no_layers_or_integer_weights_are_refused_in_one_line(build, message):
    """Were 'SolverError: invalid hierarchy: N=0 ...' and torch's 'Only Tensors of
    floating point ... can require gradients'."""
    from lptrain.errors import ConfigError
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        build()


def test_a_solve_stopped_by_a_non_finite_state_says_so():
    """Advised 'raise max_iter' for a NaN in the input after 1 of 50 iterations."""
    from lptrain import LayerParallelResNet
    x = torch.zeros(3, 4, dtype=torch.float64)
    x[0, 0] = float("nan")
    with pytest.warns(RuntimeWarning) as caught:
        LayerParallelResNet(width=4, layers=8)(x)
    text = str(caught[0].message)
    assert "after 1 iteration at residual nan" in text
    assert "the states are not finite" in text and "raise max_iter" not in text


@pytest.mark.parametrize("limits, message", [
    (dict(max_iter=0), "max_iter=0: a positive int"), (dict(max_iter=2.5), "max_iter=2.5"),
    (dict(tol=-1.0), "tol=-1.0: a finite number >= 0"), (dict(tol=float("nan")), "tol=nan")])
def test_a_forwards_limits_are_checked(limits, message):
    """Were accepted: max_iter=-1 warned 'stopped after -1 iterations'."""
    from lptrain.errors import ConfigError
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    with pytest.raises(ConfigError, match=re.escape(message)):
        mod(inputs(2, 3), **limits)


def test_serial_needs_every_layer(monkeypatch):
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(levels=2, cfactor0=2))
    monkeypatch.setattr(mod, "owned", range(0, 2))
    with pytest.raises(Exception, match="holds layers 0..1 of 4"):
        mod.serial(inputs(2, 3))


@pytest.mark.parametrize("where", ["coarse_steps", "kept", "plain"])
@pytest.mark.parametrize("bad, message", [(PairLayer, "maps a state to a tuple, not a tensor"),
                                          (WiderLayer, "maps a torch.float32 state to "
                                                       "torch.float64")])
def test_a_layer_or_coarse_step_that_returns_no_update_is_refused_on_every_path(
        where, bad, message):
    """The check was on the fine layers' plain steps only: a coarse step returning a
    tuple ended in torch's AttributeError, and a layer whose linearisation a one-level
    warm-started solve keeps was cast back silently (float64) or failed in .detach()."""
    good = lambda n: nn.Linear(4, 4)      # noqa: E731
    options = dict(levels=2, cfactor0=2, tol=0.0, max_iter=2, adj_max_iter=2)
    kw = dict(coarse_steps=lambda step: bad(4, 4)) if where == "coarse_steps" else {}
    if where == "kept":
        options.update(levels=1, max_iter=1, adj_max_iter=1)
        kw["warm_start"] = True
    torch.manual_seed(0)
    body = LayerParallel(good if where == "coarse_steps" else (lambda n: bad(4, 4)), T=1.0,
                         n_layers=8, mgrit=MGRITOptions(**options), **kw)
    with pytest.raises(ValueError, match=message):
        body(torch.randn(3, 4))


def test_numpy_numbers_build_the_module_python_numbers_build():
    """np.int64 sizes and seeds, np.float32 T: a seed crashed in torch's generator, T was
    refused as no 'positive finite number' (held-out)."""
    import numpy as np
    from lptrain import LayerParallelResNet
    x = torch.randn(3, 4, dtype=torch.float64)
    want = LayerParallelResNet(4, 8, T=2.0, seed=3)(x)
    got = LayerParallelResNet(np.int64(4), np.int64(8), T=np.float32(2.0), seed=np.int64(3))
    assert torch.equal(got(x), want)
