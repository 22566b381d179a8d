"""The fused C dense step (model/kernel.py) against the torch path it replaces."""
import math
import shutil

import pytest
import torch

from lptrain.model import kernel
from lptrain.model.activations import ACTIVATIONS
from lptrain.model.steps import DenseSteps, _euler

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
TANH = ACTIVATIONS["tanh"]


def reference(u, K, b, h, save):
    """The torch path of DenseSteps.apply."""
    stepper = DenseSteps.__new__(DenseSteps)
    stepper.act = TANH
    z = stepper._z(u, K, b)
    return _euler(u, TANH.f_(z, save), h, TANH)


def case(w, m, B=37, bias=True, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    shape = (m, w, B) if m else (w, B)
    u = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    K = torch.randn((m, w, w) if m else (w, w), generator=g, dtype=torch.float64)
    b = torch.randn((m, w if bias else 1) if m else (w if bias else 1,), generator=g,
                    dtype=torch.float64)
    return u, K, b


@needs_cc
@pytest.mark.parametrize("w", [2, 4, 8, 16])
@pytest.mark.parametrize("m", [0, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_step_and_saved_sigmoid_equal_torch(w, m, bias):
    u, K, b = case(w, m, bias=bias)
    h = 0.3 if not m else torch.tensor([0.1, 0.2, 0.4], dtype=torch.float64)
    save, ref_save = torch.empty_like(u), torch.empty_like(u)
    got = kernel.dense_sigmoid_step(u, K, b, h, TANH.scale_out, TANH.shift, save)
    want = reference(u, K, b, h, ref_save)
    assert got is not None
    assert torch.allclose(got, want, rtol=1e-14, atol=1e-14)
    assert torch.allclose(save, ref_save, rtol=1e-14, atol=1e-15)


@needs_cc
@pytest.mark.parametrize("m", [0, 3])
def test_kernel_adds_the_level_rhs(m):
    # coarse MGRIT levels step u ← Φ(u) + g: the rhs joins the same pass
    u, K, b = case(8, m)
    g = case(8, m, seed=1)[0]
    got = kernel.dense_sigmoid_step(u, K, b, 0.2, 2.0, -1.0, plus=g)
    assert got is not None
    assert torch.allclose(got, reference(u, K, b, 0.2, None) + g, rtol=1e-14, atol=1e-14)
    # no level both saves activations and has a rhs: the torch path
    assert kernel.dense_sigmoid_step(u, K, b, 0.2, 2.0, -1.0, torch.empty_like(u), plus=g) \
        is None


@needs_cc
def test_kernel_saturates_like_torch():
    # |z| up to ~1e4: the sigmoid is 1 or below 4e-308 (clamped exponent), never inf or nan
    u, K, b = case(8, 0, scale=300.0)
    save, ref_save = torch.empty_like(u), torch.empty_like(u)
    got = kernel.dense_sigmoid_step(u, K, b, 0.5, 2.0, -1.0, save)
    assert torch.isfinite(got).all() and float(save.min()) < 4e-308 and float(save.max()) == 1.0
    assert torch.allclose(got, reference(u, K, b, 0.5, ref_save), rtol=1e-14, atol=1e-12)
    # (z = K u + b sums terms of ~1e3 in another order than MKL: relative 1e-13 in e^z)
    assert torch.allclose(save, ref_save, rtol=1e-11, atol=1e-300)


@needs_cc
def test_interleaved_stacks_of_one_buffer_use_the_kernel():
    # the F-relaxation steps every c-th state into the next: views of one buffer whose
    # address ranges overlap although no state is shared
    X = case(8, 9)[0]
    K, b = case(8, 4)[1:]
    src, dst = X[0:8:2], X[1:9:2]
    want = reference(src, K, b, 0.1, None)
    assert kernel.dense_sigmoid_step(src, K, b, 0.1, 2.0, -1.0, out=dst) is dst
    assert torch.allclose(dst, want, rtol=1e-14, atol=1e-14)
    # stacks of 8 with one state in common (at either end, or from the other side)
    Y = case(8, 64, B=5)[0]
    K8, b8 = case(8, 8)[1:]
    for src, dst in ((Y[0:16:2], Y[14:30:2]), (Y[14:30:2], Y[0:16:2]), (Y[0:32:4], Y[28:60:4])):
        assert kernel.dense_sigmoid_step(src, K8, b8, 0.1, 2.0, -1.0, out=dst) is None
    assert kernel.dense_sigmoid_step(Y[0:16:2], K8, b8, 0.1, 2.0, -1.0, out=Y[17:33:2]) \
        is not None


def test_torch_path_where_the_kernel_does_not_apply():
    u, K, b = case(8, 3)
    assert kernel.dense_sigmoid_step(u, K, b, 0.1, 2.0, -1.0, out=u) is None   # in place
    for w in (5, 32):                                                        # widths
        uw, Kw, bw = case(w, 0)
        assert kernel.dense_sigmoid_step(uw, Kw, bw, 0.1, 2.0, -1.0) is None
    assert kernel.dense_sigmoid_step(u.float(), K.float(), b.float(), 0.1, 2.0, -1.0) is None
    assert kernel.dense_sigmoid_step(u.transpose(1, 2), K, b, 0.1, 2.0, -1.0) is None
    Kg = K.clone().requires_grad_()
    assert kernel.dense_sigmoid_step(u, Kg, b, 0.1, 2.0, -1.0) is None        # autograd


def test_switched_off_or_without_a_compiler_the_steps_are_torch(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel, "_state", {})
    monkeypatch.setenv("LPTRAIN_KERNELS", "0")
    assert kernel.load() is None and kernel.status() == "torch ops (LPTRAIN_KERNELS=0)"
    u, K, b = case(8, 0)
    assert kernel.dense_sigmoid_step(u, K, b, 0.1, 2.0, -1.0) is None
    monkeypatch.setattr(kernel, "_state", {})
    monkeypatch.setenv("LPTRAIN_KERNELS", "1")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("LPTRAIN_KERNEL_CACHE", str(tmp_path / "cache"))
    assert kernel.load() is None and kernel.status().startswith("torch ops (FileNotFoundError")


@needs_cc
def test_compiles_into_its_cache_once(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel, "_state", {})
    monkeypatch.setenv("LPTRAIN_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("LPTRAIN_KERNELS", raising=False)
    monkeypatch.delenv("CC", raising=False)
    assert kernel.load() is not None and kernel.status() == "C kernel"
    built = sorted(tmp_path.iterdir())
    assert len(built) == 1 and built[0].name.startswith("dense_kernel-")
    monkeypatch.setattr(kernel, "_state", {})
    kernel.load()
    assert sorted(tmp_path.iterdir()) == built          # no temporary left, no rebuild


@needs_cc
def test_a_stepper_says_how_it_runs():
    u, K, b = case(8, 4)
    assert DenseSteps(K, b, TANH).implementation() == "C kernel"
    assert DenseSteps(K, b, ACTIVATIONS["relu"]).implementation() == "torch ops (activation relu)"
    assert DenseSteps(K.float(), b.float(), TANH).implementation() == \
        "torch ops (torch.float32, cpu)"
    K32, b32 = case(32, 4)[1:]
    assert DenseSteps(K32, b32, TANH).implementation() == "torch ops (width 32)"


@needs_cc
@pytest.mark.parametrize("m", [0, 4])
def test_residual_pass_equals_torch(m):
    X = case(8, 13)[0]
    phi0 = X[0:4] if m else X[0]
    target = X[5:13:2] if m else X[5]       # every other state of a buffer: a strided stack
    G = case(8, 4 if m else 0, seed=3)[0]
    r = phi0 - target
    want = float((r * r).sum())
    assert kernel.residual(phi0.clone(), target, "norm") == pytest.approx(want, rel=1e-13)
    phi = phi0.clone()
    assert kernel.residual(phi, target, "in_place") == pytest.approx(want, rel=1e-13)
    assert torch.allclose(phi, r, rtol=0, atol=1e-15)
    out = G.clone()
    assert kernel.residual(phi0.clone(), target, "add_to", out) == pytest.approx(want, rel=1e-13)
    assert torch.allclose(out, G + r, rtol=0, atol=1e-15)


def test_residual_pass_falls_back_on_other_layouts():
    # the same results from torch ops where the states are not contiguous blocks
    X, Y = case(8, 4)[0], case(8, 4, seed=2)[0]
    r = X - Y
    want = float((r * r).sum())
    for phi, target in ((X.transpose(1, 2), Y.transpose(1, 2)), (X.float(), Y.float())):
        assert kernel._residual_pass(phi, target, "norm", None) is None
        assert kernel.residual(phi.clone(), target) == pytest.approx(want, rel=1e-6)
    out, G = case(8, 4, seed=3)[0].transpose(1, 2), case(8, 4, seed=3)[0].transpose(1, 2)
    phi = X.transpose(1, 2).clone()
    assert kernel.residual(phi, Y.transpose(1, 2), "add_to", out) == pytest.approx(want)
    assert torch.allclose(out, G + r.transpose(1, 2), rtol=0, atol=1e-15)
    assert kernel.residual(phi, Y.transpose(1, 2), "in_place") == pytest.approx(want)
    assert torch.allclose(phi, r.transpose(1, 2), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="needs `out`"):
        kernel.residual(X, Y, "add_to")


def test_other_devices_and_dtypes_never_build_the_kernel(monkeypatch):
    monkeypatch.setattr(kernel, "_state", {})
    u, K, b = case(8, 0)
    assert kernel.dense_sigmoid_step(u.float(), K.float(), b.float(), 0.1, 2.0, -1.0) is None
    assert kernel.residual(u.float(), u.float()) == 0.0
    assert kernel._state == {}           # not loaded, let alone compiled


@needs_cc
@pytest.mark.parametrize("mode", ["serial", "simultaneous"])
def test_training_with_the_kernel_follows_torch_ops(mode, monkeypatch):
    # the paper's Peaks run with tanh (width 8: the kernel's case), 20 L-BFGS iterations:
    # the C step changes the trajectory only by rounding
    from test_simultaneous import run
    runs = []
    for use in (True, False):
        if not use:
            monkeypatch.setattr(kernel, "_state", {"lib": None, "why": "test"})
        out, rows = run(mode, ["network.activation=tanh"])
        assert (kernel.load() is not None) == use
        runs.append([r["objective"] for r in rows.train])
    assert len(runs[0]) == 20 and runs[0] == pytest.approx(runs[1], rel=1e-9)


def test_a_failing_compiler_is_reported_in_one_line(monkeypatch, tmp_path):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'cc: error: no such flag' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setattr(kernel, "_state", {})
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("LPTRAIN_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LPTRAIN_KERNELS", raising=False)
    assert kernel.status() == "torch ops (CalledProcessError: cc: error: no such flag)"
    assert list((tmp_path / "cache").iterdir()) == []        # no half-written library


@needs_cc
def test_nan_propagates_as_in_torch():
    # a diverged run must stay NaN (the optimizer stops it as diverged), also through the
    # clamped exponential: NaN where the torch path has NaN, and nowhere else
    u, K, b = case(8, 0)
    K[2, 3] = float("nan")
    u2 = u.clone()
    u2[0, 5] = float("nan")
    for uu, KK in ((u, K), (u2, case(8, 0)[1])):
        got = kernel.dense_sigmoid_step(uu, KK, b, 0.1, 2.0, -1.0)
        want = reference(uu, KK, b, 0.1, None)
        assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got).any()
    phi = u2.clone()
    assert math.isnan(kernel.residual(phi, u))
