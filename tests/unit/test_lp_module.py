"""LayerParallel on one rank: gradcheck, several forwards, no_grad, state dicts, dtypes,
one-shot training with warm starts; halo index arithmetic for many ranks."""
import re
import warnings

import pytest
import torch
from torch import nn

from helpers import PairLayer, WiderLayer
from lptrain import LayerParallel, MGRITOptions
from lptrain.mgrit.options import MGRITOptions as Options
from lptrain.parallel.halo import needed_layers, owned_layers, transfers

CONVERGED = dict(levels=3, cfactor0=2, cfactor=2, tol=1e-13, max_iter=60)


def drawn(m, n, scale=0.6):
    """m with its parameters drawn from a generator seeded with n."""
    gen = torch.Generator().manual_seed(n)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return m


def dense(n, width=3, scale=0.6, dtype=torch.float64):
    return drawn(nn.Sequential(nn.Linear(width, width), nn.Tanh()).to(dtype), n, scale)


def inputs(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def grads(loss, mod, u0):
    return torch.autograd.grad(loss, [u0, *mod.parameters()])


def close(a, b, rel=1e-10):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) <= rel * max(float(b.abs().max()), 1e-30)


# -- halo arithmetic ---------------------------------------------------------------------
@pytest.mark.parametrize("average, want", [(False, ([4], [0, 2, 3])),
                                           (True, ([4, 5, 6, 7], [0, 1, 2, 3]))])
def test_layers_a_rank_borrows(average, want):
    # N = 8, levels 0..2 with points 0..8, (0, 2, 4, 6, 8), (0, 4, 8); rank 0 owns
    # points 0..3, rank 1 points 4..8.  Rank 1's forward steps into 4 (layer 3), 4 from
    # 2 and 8 from 4 on level 1, 4 from 0 on level 2; rank 0's adjoint steps into λ_3
    # (layer 4) and the mirrored coarse steps over [4, 6) and [4, 8).
    hier = Options(levels=3, cfactor0=2, cfactor=2).hierarchy(8, 2)
    assert [list(owned_layers(hier, r)) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (needed_layers(hier, 0, average), needed_layers(hier, 1, average)) == want
    plan = transfers(hier, average)
    assert [(n, src, dst) for n, src, dst in plan if dst == 0] == [(n, 1, 0) for n in want[0]]


def test_one_rank_borrows_nothing():
    hier = Options(levels=4).hierarchy(32, 1)
    assert transfers(hier, True) == [] and list(owned_layers(hier, 0)) == list(range(32))


# -- the module --------------------------------------------------------------------------
def test_gradcheck_on_a_tiny_case():
    mod = LayerParallel(lambda n: dense(n, 2), T=1.0, n_layers=4,
                        mgrit=MGRITOptions(levels=2, cfactor0=2, tol=1e-14, max_iter=80))
    u0 = inputs(2, 2).requires_grad_()
    params = list(mod.parameters())

    def f(u, *ps):
        return mod(u)

    assert torch.autograd.gradcheck(f, (u0, *params), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_several_forwards_before_one_backward():
    mod = LayerParallel(dense, T=2.0, n_layers=8, mgrit=MGRITOptions(**CONVERGED))
    u1, u2 = inputs(4, 3, seed=1).requires_grad_(), inputs(5, 3, seed=2).requires_grad_()
    loss = (mod(u1) ** 2).sum() + mod(u2).sin().sum()
    with torch.no_grad():
        mod(u2 * 3)                                   # an evaluation in between
    got = torch.autograd.grad(loss, [u1, u2, *mod.parameters()])
    ref = (mod.serial(u1) ** 2).sum() + mod.serial(u2).sin().sum()
    want = torch.autograd.grad(ref, [u1, u2, *mod.parameters()])
    assert all(close(a, b) for a, b in zip(got, want))


def test_no_grad_evaluation_keeps_the_training_warm_start():
    mod = LayerParallel(dense, T=2.0, n_layers=8, warm_start=True,
                        mgrit=MGRITOptions(levels=2, cfactor0=2, tol=0.0, max_iter=2))
    u0 = inputs(4, 3)
    mod(u0).sum().backward()
    warm = mod._warm[0].clone()
    with torch.no_grad():
        out = mod(inputs(4, 3, seed=5))
    # (row 0 is u_0, which every solve writes into its warm start)
    assert not out.requires_grad and torch.equal(mod._warm[0][1:], warm[1:])


def test_in_place_parameter_changes_before_backward_are_refused():
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(levels=2, cfactor0=2))
    loss = mod(inputs(2, 3)).sum()
    with torch.no_grad():
        next(mod.parameters()).add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("replace", ["parameter", "submodule", "layer"])
def test_a_replaced_parameter_is_the_one_differentiated(replace):
    """After a forward, a layer's parameter, submodule or whole module replaced by a new
    object: the next forward differentiates the new one (as serial does)."""
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    u0 = inputs(2, 3).requires_grad_()
    grads(mod(u0).sum(), mod, u0)
    if replace == "parameter":
        mod.layers["1"][0].weight = nn.Parameter(torch.full((3, 3), 0.3, dtype=torch.float64))
    elif replace == "submodule":
        mod.layers["2"][0] = dense(7)[0]
    else:
        mod.layers["3"] = dense(8)
    got, want = grads(mod(u0).sum(), mod, u0), grads(mod.serial(u0).sum(), mod, u0)
    assert len(got) == 1 + 8 and all(close(a, b) for a, b in zip(got, want, strict=True))


def test_state_dict_round_trip_and_loading_into_a_parent():
    mod = LayerParallel(dense, T=1.0, n_layers=6, mgrit=MGRITOptions(**CONVERGED))
    other = nn.Sequential(nn.Linear(3, 3).double(),
                          LayerParallel(lambda n: dense(n + 50), T=1.0, n_layers=6,
                                        mgrit=MGRITOptions(**CONVERGED)))
    state = {f"1.{k}": v for k, v in mod.state_dict().items()}
    state.update({f"0.{k}": v for k, v in other[0].state_dict().items()})
    assert sorted(other.state_dict()) == sorted(state)
    other.load_state_dict(state)
    u0 = inputs(3, 3)
    with torch.no_grad():
        assert close(other[1](u0), mod(u0))


def test_a_lambdas_layers_pickle_on_one_rank():
    """README: 'On one rank it pickles like any module'; with a lambda as the factory it
    was a PicklingError (the layers kept their factory after building every layer)."""
    import io
    mod = LayerParallel(lambda n: dense(n), T=1.0, n_layers=8,
                        mgrit=MGRITOptions(levels=2, cfactor0=2))
    buffer = io.BytesIO()
    torch.save(mod, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    u0 = inputs(3, 3)
    with torch.no_grad():
        assert torch.equal(loaded(u0), mod(u0))


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


@pytest.mark.parametrize("limits, message", [
    (dict(max_iter=0), "max_iter=0: a positive int"), (dict(max_iter=2.5), "max_iter=2.5"),
    (dict(tol=-1.0), "tol=-1.0: a finite number >= 0"), (dict(tol=float("nan")), "tol=nan")])
def test_a_forwards_limits_are_checked(limits, message):
    """Were accepted: max_iter=-1 warned 'stopped after -1 iterations'."""
    from lptrain.errors import ConfigError
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    with pytest.raises(ConfigError, match=re.escape(message)):
        mod(inputs(2, 3), **limits)


def test_a_deeper_networks_state_dict_is_refused():
    """The hook that keeps a rank's own layers dropped every other layer's entries,
    those of layers the module does not have too: 8 layers loaded into 4 without a
    word. They stay now, for load_state_dict to refuse (strict=False takes the 4)."""
    deeper = LayerParallel(dense, T=1.0, n_layers=8, mgrit=MGRITOptions(**CONVERGED))
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "layers\.4\.'):
        mod.load_state_dict(deeper.state_dict())
    mod.load_state_dict(deeper.state_dict(), strict=False)
    assert all(torch.equal(v, deeper.state_dict()[k]) for k, v in mod.state_dict().items())


@pytest.mark.parametrize("dtype, rel", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_float32_and_float64(dtype, rel):
    opts = dict(CONVERGED, tol=1e-6 if dtype == torch.float32 else 1e-13)
    mod = LayerParallel(lambda n: dense(n, dtype=dtype), T=2.0, n_layers=8,
                        mgrit=MGRITOptions(**opts))
    u0 = inputs(4, 3, dtype=dtype).requires_grad_()
    out = mod(u0)
    assert out.dtype == dtype
    got, want = grads(out.pow(2).sum(), mod, u0), grads(mod.serial(u0).pow(2).sum(), mod, u0)
    assert close(out, mod.serial(u0), rel) and all(close(a, b, rel) for a, b in zip(got, want))


@pytest.mark.parametrize("iters", [1, 30])
def test_fixed_iterations_reuse_the_forwards_linearisations(iters):
    # a fixed solve leaves f's graphs at its returned states for the adjoint: the
    # gradient equals that of recomputed graphs (no keep), exactly, and after enough
    # iterations serial's
    opts = dict(levels=3, cfactor0=2, cfactor=2, tol=0.0, max_iter=iters)
    mod = LayerParallel(dense, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
    u0 = inputs(4, 3).requires_grad_()
    got = grads(mod(u0).pow(2).sum(), mod, u0)
    assert len(mod.solver.plan) == 0 and mod.last_forward.iterations == iters
    solver_forward = mod.solver.forward
    mod.solver.forward = lambda *a, keep=None, **kw: solver_forward(*a, keep=None, **kw)
    again = grads(mod(u0).pow(2).sum(), mod, u0)
    assert all(torch.allclose(a, b, rtol=1e-14, atol=1e-15) for a, b in zip(got, again))
    if iters == 30:
        want = grads(mod.serial(u0).pow(2).sum(), mod, u0)
        assert all(close(a, b) for a, b in zip(got, want))



@pytest.mark.parametrize("iters", [1, 3])
def test_a_fixed_adjoint_takes_parameter_products_in_its_last_sweep(iters, monkeypatch):
    # the last adjoint sweep's fused products replace every separate parameter product,
    # and the gradients are bitwise those of separate products
    from lptrain.model.module_vjp import Linear
    from lptrain.parallel import module_propagators
    opts = dict(levels=3, cfactor0=2, cfactor=2, tol=0.0, max_iter=iters)
    mod = LayerParallel(dense, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
    u0 = inputs(4, 3).requires_grad_()
    calls = []
    vjp_params = Linear.vjp_params
    monkeypatch.setattr(Linear, "vjp_params", lambda *a: calls.append(1) or vjp_params(*a))
    fused = grads(mod(u0).pow(2).sum(), mod, u0)
    assert calls == []
    init = module_propagators.ModuleAdjoint.__init__

    def unfused(self, *a, **k):
        init(self, *a, **k)
        self.fixed = False
    monkeypatch.setattr(module_propagators.ModuleAdjoint, "__init__", unfused)
    separate = grads(mod(u0).pow(2).sum(), mod, u0)
    assert len(calls) == 8 and all(torch.equal(a, b) for a, b in zip(fused, separate))

def frozen(n):
    """dense with its bias frozen, and layer 2 frozen whole (as in fine-tuning)."""
    m = dense(n)
    m[0].bias.requires_grad_(False)
    return m.requires_grad_(False) if n == 2 else m


@pytest.mark.parametrize("opts", [CONVERGED, dict(CONVERGED, tol=0.0, max_iter=30)],
                         ids=["converged", "fixed"])
def test_frozen_parameters_get_no_gradient_and_stay_put(opts):
    # was: autograd's "One of the differentiated Tensors does not require grad"
    mod = LayerParallel(frozen, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
    u0 = inputs(4, 3).requires_grad_()
    mod(u0).pow(2).sum().backward()
    got = [u0.grad, *(p.grad for p in mod.parameters())]
    mod.zero_grad(set_to_none=True)
    u0.grad = None
    mod.serial(u0).pow(2).sum().backward()
    want = [u0.grad, *(p.grad for p in mod.parameters())]
    assert [g is None for g in got] == [g is None for g in want] == \
        [False, *(not p.requires_grad for p in mod.parameters())]
    assert sum(g is None for g in got) == 7 + 2
    assert all(close(a, b) for a, b in zip(got, want) if b is not None)
    before = [p.detach().clone() for p in mod.parameters()]
    torch.optim.Adam(mod.parameters(), lr=0.1).step()
    assert [torch.equal(a, p) for a, p in zip(before, mod.parameters())] == \
        [not p.requires_grad for p in mod.parameters()]


def batchnormed(n):
    # no bias before the normalisation: its gradient would be round-off (BN takes the mean)
    return drawn(nn.Sequential(nn.Linear(3, 3, bias=False), nn.BatchNorm1d(3),
                               nn.Tanh()).double(), n)


@pytest.mark.parametrize("opts", [CONVERGED, dict(CONVERGED, tol=0.0, max_iter=30)],
                         ids=["converged", "fixed"])
def test_batchnorm_in_training_mode_updates_its_statistics_as_serial(opts):
    # MGRIT runs each f many times per solve; the running statistics were updated at
    # every evaluation (10 batches counted a forward, means 0.08 off serial's)
    mods = [LayerParallel(batchnormed, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
            for _ in range(2)]
    for step in range(2):
        u0 = inputs(6, 3, seed=step).requires_grad_()
        got = grads(mods[0](u0).pow(2).sum(), mods[0], u0)
        want = grads(mods[1].serial(u0).pow(2).sum(), mods[1], u0)
        assert all(close(a, b) for a, b in zip(got, want, strict=True))
    stats = [{k: v for k, v in m.state_dict().items() if "running" in k or "batches" in k}
             for m in mods]
    assert len(stats[0]) == 3 * 8 and all(int(v) == 2 for k, v in stats[0].items()
                                          if "batches" in k)
    assert all(close(stats[0][k].double(), v.double()) for k, v in stats[1].items())
    for m in mods:
        m.eval()
    u1 = inputs(6, 3, seed=5)
    with torch.no_grad():
        assert close(mods[0](u1), mods[1].serial(u1))


def spectral(n):
    from torch.nn.utils.parametrizations import spectral_norm
    m = dense(n)
    return nn.Sequential(spectral_norm(m[0]), m[1])


@pytest.mark.parametrize("opts", [CONVERGED, dict(CONVERGED, tol=0.0, max_iter=30)],
                         ids=["converged", "fixed"])
def test_spectral_norm_takes_one_power_iteration_per_forward_as_serial(opts):
    # each evaluation of f took a power iteration of its own: f changed from call to
    # call (28 iterations to tol, outputs 0.04 off serial's)
    import copy
    mod = LayerParallel(spectral, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
    u0 = inputs(5, 3).requires_grad_()
    start = copy.deepcopy(mod.state_dict())
    got = grads(mod(u0).pow(2).sum(), mod, u0)
    assert mod.last_forward.iterations <= (10 if opts["tol"] > 0 else 30)
    after = copy.deepcopy(mod.state_dict())
    mod.load_state_dict(start)
    want = grads(mod.serial(u0).pow(2).sum(), mod, u0)
    assert all(close(a, b) for a, b in zip(got, want, strict=True))
    assert all(close(v, mod.state_dict()[k]) for k, v in after.items())


def dropped(n):
    return nn.Sequential(*dense(n), nn.Dropout(0.3))


@pytest.mark.parametrize("opts, stack", [(CONVERGED, False), (CONVERGED, True),
                                         (dict(CONVERGED, tol=0.0, max_iter=30), False)],
                         ids=["converged", "stacked", "fixed"])
def test_dropout_draws_one_mask_per_layer_and_forward(opts, stack):
    # each evaluation of f drew a new mask: the forward solve did not converge (residual
    # 1.5 after 20 iterations), silently
    mod = LayerParallel(dropped, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts), stack=stack)
    u0 = inputs(6, 3).requires_grad_()
    out = mod(u0)
    assert mod.last_forward.residual <= 1e-12
    mod.generator.manual_seed(3)
    out = mod(u0)
    got = grads(out.pow(2).sum(), mod, u0)
    mod.generator.manual_seed(3)        # serial() then draws the forward's masks
    ref = mod.serial(u0)
    want = grads(ref.pow(2).sum(), mod, u0)
    assert close(out, ref) and all(close(a, b) for a, b in zip(got, want, strict=True))
    with torch.no_grad():
        assert not close(mod(u0), out, 1e-3)             # the next forward: new masks
        mod.eval()
        assert torch.equal(mod(u0), mod(u0)) and close(mod(u0), mod.serial(u0))


def conv_dropped(n):
    torch.manual_seed(70 + n)
    return nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.Tanh(), nn.Dropout(0.3),
                         nn.Conv2d(2, 2, 3, padding=1)).double()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
def test_dropout_on_image_states_gives_the_gradient_of_the_forward_it_ran(layout):
    """The adjoint linearised 4-d states in channels_last order, and dropout draws its
    mask in memory order: the same seed dropped other pixels than in the forward, and
    the gradient was off by 2 % (a conv step with dropout), silently."""
    mod = LayerParallel(conv_dropped, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    u0 = inputs(3, 2, 5, 5)
    u0 = {"contiguous": u0, "channels_last": u0.contiguous(memory_format=torch.channels_last),
          "transposed": u0.transpose(2, 3).contiguous().transpose(2, 3)}[layout]
    u0.requires_grad_()
    w = inputs(3, 2, 5, 5, seed=1)
    mod.generator.manual_seed(3)
    got = grads((mod(u0) * w).sum(), mod, u0)
    mod.generator.manual_seed(3)
    want = grads((mod.serial(u0) * w).sum(), mod, u0)
    assert all(close(a, b) for a, b in zip(got, want, strict=True))


def test_a_solve_that_misses_its_tolerance_warns():
    mod = LayerParallel(dense, T=2.0, n_layers=8,
                        mgrit=MGRITOptions(**dict(CONVERGED, max_iter=2)))
    u0 = inputs(4, 3).requires_grad_()
    with pytest.warns(RuntimeWarning, match=r"the forward MGRIT solve stopped after 2 "
                                            r"iterations at residual .* \(tol=1e-13"):
        out = mod(u0)
    with pytest.warns(RuntimeWarning, match="the adjoint MGRIT solve stopped after 2"):
        out.sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mod(u0, max_iter=60)                              # converged: silent
        LayerParallel(dense, T=2.0, n_layers=8,           # fixed iterations: by design
                      mgrit=MGRITOptions(**dict(CONVERGED, tol=0.0, max_iter=2)))(u0)


@pytest.mark.parametrize("norm_type", [1.0, 3.0, float("inf")])
def test_clip_grad_norm_takes_torchs_arguments(norm_type):
    """norm_type, error_if_nonfinite and foreach were TypeErrors; one tensor clipped
    nothing and returned 0."""
    from lptrain.parallel.lp_module import clip_grad_norm_
    body = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    net = nn.Sequential(body, nn.Linear(3, 2).double())
    net(inputs(5, 3)).pow(2).sum().backward()
    before = [p.grad.clone() for p in net.parameters()]
    norm = clip_grad_norm_(net.parameters(), 1e-2, body, norm_type=norm_type, foreach=True)
    got = [p.grad.clone() for p in net.parameters()]
    for p, g in zip(net.parameters(), before):
        p.grad = g.clone()
    want = torch.nn.utils.clip_grad_norm_(net.parameters(), 1e-2, norm_type=norm_type)
    assert close(norm, want) and all(close(a, b) for a, b in zip(got, net_grads(net)))
    one = body.layers["0"][0].weight
    one.grad = torch.full_like(one, 2.0)
    assert close(clip_grad_norm_(one, 1.0, body), torch.tensor(6.0, dtype=torch.float64))
    assert close(one.grad.norm(), torch.tensor(1.0, dtype=torch.float64), 1e-5)
    one.grad[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="nan, so it cannot be clipped"):
        clip_grad_norm_([one], 1.0, body, error_if_nonfinite=True)
    with pytest.raises(TypeError, match="body=2.0: the network's LayerParallel module"):
        clip_grad_norm_([one], 1.0, 2.0)          # torch's positional norm_type


def net_grads(net):
    return [p.grad for p in net.parameters()]


@pytest.mark.parametrize("max_norm", [1e-3, 1e6])
def test_clip_grad_norm_is_torchs_on_one_rank(max_norm):
    # on several layer ranks the norm sums over them (tests/mpi/module_case.py: clipped)
    from lptrain.parallel.lp_module import clip_grad_norm_
    body = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    net = nn.Sequential(body, nn.Linear(3, 2).double())
    net(inputs(5, 3)).pow(2).sum().backward()
    before = [p.grad.clone() for p in net.parameters()]
    norm = clip_grad_norm_(net.parameters(), max_norm, body)
    got = [p.grad.clone() for p in net.parameters()]
    for p, g in zip(net.parameters(), before):
        p.grad = g.clone()
    want = torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)
    assert norm.dtype == torch.float64 and close(norm, want)
    assert all(close(a, p.grad) for a, p in zip(got, net.parameters()))
    assert (max_norm > 1) == all(torch.equal(a, b) for a, b in zip(got, before))


def test_serial_needs_every_layer(monkeypatch):
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(levels=2, cfactor0=2))
    monkeypatch.setattr(mod, "owned", range(0, 2))
    with pytest.raises(Exception, match="holds layers 0..1 of 4"):
        mod.serial(inputs(2, 3))


# -- one-shot training -------------------------------------------------------------------
class Net(nn.Module):
    """A user's network: an opening, 8 layer-parallel residual layers, a classifier."""

    def __init__(self, mgrit, warm_start):
        super().__init__()
        torch.manual_seed(0)
        self.open, self.cls = nn.Linear(2, 8).double(), nn.Linear(8, 3).double()
        self.body = LayerParallel(lambda n: dense(n, 8, 0.5), T=5.0, n_layers=8,
                                  mgrit=mgrit, warm_start=warm_start)

    def forward(self, x, serial=False):
        u = self.open(x)
        return self.cls(self.body.serial(u) if serial else self.body(u))


def train(mgrit, warm_start, serial=False, steps=100):
    """Loss of the exact (serial) network after Adam steps on a fixed batch."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(100, 2, generator=gen, dtype=torch.float64) * 4 - 2
    y = ((x[:, 0] ** 2 + torch.sin(3 * x[:, 1])) > 1).long() + (x[:, 0] > 1).long()
    net = Net(mgrit, warm_start)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x, serial), y).backward()
        opt.step()
    with torch.no_grad():
        return float(nn.functional.cross_entropy(net(x, serial=True), y))


@pytest.mark.slow
def test_one_shot_training_with_warm_starts_reaches_serial_quality():
    # two iterations per solve of a two-level MGRIT with coarse steps of 4 layers
    # (h = 0.625): from a cold start each solve is too rough to train the network
    # (a loss ~5x serial's); from the last solve's states they follow the training
    # to within ~8 % of the serial network's loss
    one_shot = dict(levels=2, cfactor0=4, tol=0.0, max_iter=2, adj_max_iter=2)
    reference = train(MGRITOptions(), False, serial=True)
    warm = train(MGRITOptions(**one_shot), True)
    cold = train(MGRITOptions(**one_shot), False)
    assert warm <= 1.15 * reference, (warm, reference)
    assert cold >= 2 * reference, (cold, reference)


@pytest.mark.slow
def test_the_readme_example_trains():
    import contextlib
    import io
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                if "LayerParallel(" in b]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    losses = [float(line.split()[1]) for line in out.getvalue().splitlines()]
    assert len(losses) == 5 and losses[-1] < losses[0]


def test_a_second_derivative_is_refused():
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(levels=2, cfactor0=2))
    u0 = inputs(2, 3).requires_grad_()
    (g,) = torch.autograd.grad(mod(u0).pow(2).sum(), u0, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()


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
