"""The ODE-ResNet: shapes, activations, and gradients against autograd and finite differences."""
import pytest
import torch

from helpers import (autograd_objective, batch, conv_net, dense_net,
                     serial_objective_and_grad)
from lptrain.errors import ConfigError
from lptrain.model.activations import ACTIVATIONS, smooth_relu, tanh
from lptrain.model.network import NetworkOptions, ResNet

REG = dict(gamma_tik=1e-2, gamma_class=2e-2, gamma_ddt=3e-2)


def _assert_adjoint_equals_autograd(net, theta):
    """J and ∇J of the hand-written serial adjoint equal autograd's on one batch."""
    x, y = batch(net)
    value, grad, _ = serial_objective_and_grad(net, theta, x, y)
    th = theta.clone().requires_grad_()
    ref_value = autograd_objective(net, th, x, y)
    ref_grad, = torch.autograd.grad(ref_value, th)
    assert value == pytest.approx(float(ref_value.detach()), rel=1e-13)
    assert torch.allclose(grad, ref_grad, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("bias", ["scalar", "vector"])
@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_hand_written_adjoint_equals_autograd(kind, bias, activation):
    make = dense_net if kind == "dense" else conv_net
    net, theta = make(activation=activation, bias=bias, **REG)
    _assert_adjoint_equals_autograd(net, theta)


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_autograd_objective_matches_finite_differences(kind):
    make = dense_net if kind == "dense" else conv_net
    net, theta = make(activation="tanh", layers=3, **REG)
    x, y = batch(net, n=5)
    th = theta.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: autograd_objective(net, t, x, y), (th,),
                                    eps=1e-6, atol=1e-7)


def test_gradient_directional_finite_difference():
    net, theta = dense_net(activation="smoothrelu", **REG)
    x, y = batch(net)
    _, grad, _ = serial_objective_and_grad(net, theta, x, y)
    d = torch.randn(theta.shape, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64)
    eps = 1e-6
    jp = serial_objective_and_grad(net, theta + eps * d, x, y)[0]
    jm = serial_objective_and_grad(net, theta - eps * d, x, y)[0]
    assert (jp - jm) / (2 * eps) == pytest.approx(float(grad @ d), rel=1e-7)


def test_smooth_relu_is_c1_at_the_joins():
    eta = 0.1
    z = torch.tensor([-eta, eta], dtype=torch.float64)
    assert torch.allclose(smooth_relu(z), torch.relu(z))
    dsig = ACTIVATIONS["smoothrelu"].derivative(z)
    assert torch.allclose(dsig, torch.tensor([0.0, 1.0], dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fast_tanh_is_torch_tanh_to_a_few_ulp(dtype):
    z = torch.cat([torch.linspace(-40, 40, 20001, dtype=dtype),
                   torch.randn(5000, generator=torch.Generator().manual_seed(0)).to(dtype)])
    eps = torch.finfo(dtype).eps
    assert (tanh(z) - torch.tanh(z)).abs().max() <= 2 * eps
    act, save = ACTIVATIONS["tanh"], torch.empty_like(z)
    s = act.f_(z * act.scale_in, save)          # the steppers' in-place path
    assert s.data_ptr() == save.data_ptr()
    assert torch.equal(s * act.scale_out + act.shift, tanh(z))
    assert (act.derivative(save) - (1 - torch.tanh(z) ** 2)).abs().max() <= 8 * eps


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_pieces_compose_to_sigma_and_its_derivative(name):
    # σ = scale_out·f(scale_in·z) + shift; vjp is σ′⊙λ / slope (steppers fold the slope)
    act = ACTIVATIONS[name]
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(200, generator=gen, dtype=torch.float64)
    lam = torch.randn(200, generator=gen, dtype=torch.float64)
    value, saved = act.forward(z)
    zs = z * act.scale_in
    assert torch.allclose(value, act.scale_out * act.f(zs) + act.shift, atol=1e-15)
    assert torch.equal(saved, act.saved_of(zs))
    zg = z.clone().requires_grad_()
    (dsig,) = torch.autograd.grad(act(zg).sum(), zg)
    assert torch.allclose(act.derivative(saved), dsig, rtol=1e-12, atol=1e-14)
    assert torch.allclose(act.vjp(saved, lam) * act.slope, dsig * lam, rtol=1e-12, atol=1e-14)
    # the factor weight gradients are scaled by: h·σ′ ⊙ λ from the vjp's f′ ⊙ λ
    assert torch.allclose(act.vjp(saved, lam) * act.weight_factor(0.3), 0.3 * dsig * lam,
                          rtol=1e-12, atol=1e-14)


def test_shapes_dense_and_conv():
    net, theta = dense_net(layers=5, width=6, features=3, classes=4)
    v = net.layout.views(theta)
    assert v["K"].shape == (5, 6, 6) and v["b"].shape == (5, 6)
    assert v["open_K"].shape == (6, 3) and v["W"].shape == (4, 6)
    x, _ = batch(net, n=7)
    u0 = net.opening(theta, x)          # dense states are feature-major (w, B)
    assert u0.shape == (6, 7) == net.state_dims(7) and u0.is_contiguous()
    assert torch.allclose(net.batch_major(u0), torch.tanh(x @ v["open_K"].t() + v["open_b"]),
                          atol=1e-15)
    cnet, ctheta = conv_net(layers=2, channels=3, opening="replicate", bias="scalar")
    cv = cnet.layout.views(ctheta)
    assert cv["K"].shape == (2, 3, 3, 3, 3) and cv["b"].shape == (2, 1)
    assert "open_K" not in cnet.layout
    x, _ = batch(cnet, n=2)
    u0 = cnet.opening(ctheta, x)
    assert u0.shape == (2, 3, 6, 6) == cnet.state_dims(2) and torch.equal(u0[:, 0], u0[:, 2])


def test_init_is_seeded_and_scaled():
    o = NetworkOptions(width=4, layers=3, init="uniform", init_hidden=1e-3)
    net = ResNet(o, (2,), 2)
    a, b = net.init_params(5), net.init_params(5)
    assert torch.equal(a, b) and not torch.equal(a, net.init_params(6))
    K = net.layout.views(a)["K"]
    assert float(K.min()) >= 0 and float(K.max()) < 1e-3


@pytest.mark.parametrize("key,value", [("width", 0), ("layers", -2), ("T", 0.0),
                                       ("activation", "sigmoid"), ("bias", "matrix")])
def test_bad_network_options_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"network.{key}={value!r}"):
        NetworkOptions(**{key: value})


def test_pad_opening_needs_enough_width():
    with pytest.raises(ConfigError, match="network.width=1"):
        ResNet(NetworkOptions(width=1, opening="pad"), (2,), 3)


def test_serial_sweeps_reuse_their_buffers():
    # a serial step's states and activations stay in the same tensors from one sweep to
    # the next of the same shape (no fresh pages per evaluation), with the same values
    from lptrain.model.serial import Buffers, propagate
    net, theta = dense_net(layers=6)
    x, _ = batch(net, n=5)
    st = net.stepper(theta)
    keep = Buffers()
    s1, a1 = propagate(st, net.opening(theta, x), net.h, buffers=keep)
    ptrs, first = (s1.data_ptr(), a1.data_ptr()), (s1.clone(), a1.clone())
    s2, a2 = propagate(st, net.opening(theta, x), net.h, buffers=keep)
    assert (s2.data_ptr(), a2.data_ptr()) == ptrs
    assert torch.equal(s2, first[0]) and torch.equal(a2, first[1])
    fresh = propagate(st, net.opening(theta, x), net.h)
    assert torch.equal(fresh[0], s2) and fresh[0].data_ptr() != ptrs[0]
    x3, _ = batch(net, n=7)
    s3, _ = propagate(st, net.opening(theta, x3), net.h, buffers=keep)
    assert s3.shape[-1] == 7 and s3.data_ptr() != ptrs[0]   # another shape: new tensors


@pytest.mark.parametrize("save", [True, False])
@pytest.mark.parametrize("bias", ["scalar", "vector"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_dense_sweep_equals_its_steps(activation, bias, save):
    # DenseSteps.sweep, the serial forward's loop, against step() layer by layer: bitwise
    from lptrain.model.serial import propagate
    net, theta = dense_net(layers=9, activation=activation, bias=bias)
    x, _ = batch(net, n=11)
    st = net.stepper(theta)
    states, saved = propagate(st, net.opening(theta, x), net.h, save)
    st.sweep = None
    ref_states, ref_saved = propagate(st, net.opening(theta, x), net.h, save)
    assert torch.equal(states, ref_states) and float(states[-1].abs().max()) > 0
    assert (saved is None and ref_saved is None) or torch.equal(saved, ref_saved)


@pytest.mark.parametrize("bias", ["scalar", "vector"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_weight_products_after_the_sweep_equal_those_per_layer(activation, bias):
    # the dense adjoint's batched weight products (WEIGHTS_AFTER_SWEEP) against the
    # per-layer ones of the same sweep; the batched sweep consumes the saved activations
    from lptrain.model.serial import adjoint, propagate
    net, theta = dense_net(layers=9, activation=activation, bias=bias)
    x, _ = batch(net, n=11)
    st = net.stepper(theta)
    states, saved = propagate(st, net.opening(theta, x), net.h)
    lamN = torch.randn(states[-1].shape, generator=torch.Generator().manual_seed(3),
                       dtype=states.dtype)
    kept = saved.clone()
    batched = adjoint(st, states, saved, lamN, net.h)
    st.WEIGHTS_AFTER_SWEEP = False
    per_layer = adjoint(st, states, kept, lamN, net.h)
    for got, want in zip(batched, per_layer):
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=1e-13, atol=1e-15)
    assert not torch.equal(saved, kept)


def test_assemble_writes_only_its_blocks():
    net, theta = dense_net(layers=3, width=4)
    K, b = (t.clone() for t in net.hidden_views(theta))
    W, mu = (t.clone() for t in net.classifier_views(theta))
    grad = net.assemble(torch.zeros_like(theta), hidden=(K, b))
    assert torch.equal(torch.cat([t.flatten() for t in net.hidden_views(grad)]),
                       torch.cat([K.flatten(), b.flatten()]))
    rest = grad.clone()
    net.assemble(rest, hidden=(torch.zeros_like(K), torch.zeros_like(b)))
    assert not rest.any()                                 # nothing else was written
    net.assemble(grad, classifier=(W, mu))
    v, g = net.layout.views(theta), net.layout.views(grad)
    for name in (*net.HIDDEN, *net.CLASSIFIER):
        assert torch.equal(g[name], v[name])
    assert not g["open_K"].any() and not g["open_b"].any()



def test_a_sample_with_non_finite_logits_is_no_hit():
    """lptrain-eval of a model whose logits were all NaN said 'loss nan, accuracy 0.2000':
    argmax takes a NaN for the largest, so class 0's samples were hits."""
    net, theta = dense_net(layers=2, width=4, classes=3)
    uN = net.opening(theta, batch(net, n=6)[0])         # (width, batch)
    labels = net.logits(theta, uN).argmax(1)             # every sample a hit
    assert net.classify(theta, uN, labels, 6, False)[1] == 6
    uN[0, 1], uN[2, 4] = float("nan"), float("inf")
    labels[[1, 4]] = net.logits(theta, uN)[[1, 4]].argmax(1)     # where argmax points
    loss, correct, *_ = net.classify(theta, uN, labels, 6, False)
    assert correct == 4 and not torch.isfinite(loss)


@pytest.mark.parametrize("pool", [2, 3, 6])
def test_pooled_classifier_adjoint_equals_autograd(pool):
    net, theta = conv_net(pool=pool, **REG)
    assert net.layout.blocks["W"].shape == (3, 2 * (6 // pool) ** 2)
    _assert_adjoint_equals_autograd(net, theta)


def test_pooled_logits_are_the_classifier_of_the_block_averages():
    net, theta = conv_net(pool=3)
    u = torch.randn(5, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    W, mu = net.classifier_views(theta)
    means = u.view(5, 2, 2, 3, 2, 3).mean((3, 5)).reshape(5, -1)
    assert torch.allclose(net.logits(theta, u), means @ W.t() + mu, rtol=1e-13)


@pytest.mark.parametrize("kw,match", [(dict(pool=4), "network.pool=4: must divide the image "
                                       "sides 6x6"),
                                      (dict(pool=0), "network.pool=0: must be >= 1")])
def test_bad_pooling_names_the_key(kw, match):
    with pytest.raises(ConfigError, match=match):
        conv_net(**kw)


def test_pooling_needs_a_conv_network():
    with pytest.raises(ConfigError, match="network.pool=2: pooling needs images"):
        dense_net(pool=2)


def test_a_dense_network_on_images_names_the_key_it_reads():
    """`dataset=mnist network=dense_wide` said `network=dense: ...`, a choice the user
    had not typed (dense_wide sets network.name=dense): the key it reads is named."""
    from lptrain.model.network import NetworkOptions, ResNet
    o = NetworkOptions(name="dense", width=4, layers=2, T=1.0)
    with pytest.raises(ConfigError, match=r"^network.name=dense: a dense network takes "
                       r"feature vectors, the data has samples of shape \(1, 28, 28\); "
                       r"use network=conv for images$"):
        ResNet(o, (1, 28, 28), 10)


@pytest.mark.parametrize("length, phase", [(2, 0), (4, 0), (4, 2), (3, 1), (9, 0)])
def test_block_mean_weights_equal_the_means_of_each_block(length, phase):
    # the propagators' coarse weights (coarse_weights=average) come from one reduction
    # per length and alignment: bitwise the per-block means, stacks of them views
    from lptrain.parallel.propagators import MeanWeights
    net, theta = dense_net(layers=19, bias="vector")
    st = net.stepper(theta)
    means = MeanWeights(st)
    starts = list(range(phase, 19 - length + 1, length))
    for a in starts:
        K, b = means(a, a + length)
        want = st.mean_weights(a, a + length)
        assert torch.equal(K, want[0]) and torch.equal(b, want[1])
    many = means.many(starts, [a + length for a in starts])
    assert torch.equal(many[0], torch.stack([st.mean_weights(a, a + length)[0]
                                             for a in starts]))
    table = means.table(length, phase)[0]
    assert many[0].data_ptr() == table.data_ptr()              # a view, no copy
    odd = means.many([phase, phase + length + 1], [phase + length, phase + 2 * length + 1])
    assert torch.equal(odd[1][1], st.mean_weights(phase + length + 1,
                                                  phase + 2 * length + 1)[1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lengths", [[4, 4, 2], [3, 3, 1], [3, 6, 3, 1]])
def test_stacked_steps_of_several_sizes_equal_each_step_bitwise(lengths, dtype):
    # coarse steps of unequal length (N = 30, c = 4) share a stack on one rank and not
    # on another: each step's result must not depend on its stack (the adjoint scaled
    # g by h first, where one step passes h as the product's alpha; in float32 the
    # sizes were products in float32, where one step's h is a product in double)
    from lptrain.parallel.propagators import _sizes
    net, theta = dense_net(layers=len(lengths), width=8)
    st = net.stepper(theta.to(dtype))
    gen = torch.Generator().manual_seed(1)
    U, L = (torch.randn(len(lengths), 8, 32, generator=gen, dtype=torch.float64).to(dtype)
            for _ in range(2))
    h = 1 / 7
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    hs = _sizes(h, starts, [a + n for a, n in zip(starts, lengths)], U)
    saved = st.linearize(U, st.K, st.b)
    stacked = st.vjp_saved(saved.clone(), L, st.K, hs)
    forward = st.apply(U, st.K, st.b, hs)
    for i, n in enumerate(lengths):
        assert torch.equal(stacked[i], st.vjp_saved(saved[i].clone(), L[i], st.K[i], h * n))
        assert torch.equal(forward[i], st.apply(U[i], st.K[i], st.b[i], h * n))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_the_seeded_scalar_gives_the_vjp_of_grad_outputs_bitwise(kind, dtype):
    """The opening's VJP through `_Seed` (no sympy import) is autograd's with
    grad_outputs=λ, to the bit."""
    from lptrain.model.network import _Seed
    gen = torch.Generator().manual_seed(3)
    shapes = {"dense": ((8, 2), (50, 2)), "conv": ((4, 1, 3, 3), (6, 1, 12, 12))}[kind]
    K = torch.randn(shapes[0], generator=gen, dtype=dtype, requires_grad=True)
    b = torch.randn(shapes[0][0], generator=gen, dtype=dtype, requires_grad=True)
    y = torch.randn(shapes[1], generator=gen, dtype=dtype)

    def u0():
        z = y @ K.T + b if kind == "dense" else torch.nn.functional.conv2d(y, K, b, padding=1)
        return torch.tanh(z)
    lam = torch.randn(u0().shape, generator=gen, dtype=dtype)
    want = torch.autograd.grad(u0(), (K, b), lam)
    got = torch.autograd.grad(_Seed.apply(u0(), lam), (K, b))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not torch.equal(got[0], torch.autograd.grad(u0().sum(), (K, b))[0])
