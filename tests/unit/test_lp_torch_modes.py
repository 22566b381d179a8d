"""LayerParallel under torch's modes: inside a network under torch.compile (the network
around it is compiled, the MGRIT solves run eagerly: Dynamo traces none of lptrain's code,
and the results are eager's), evaluations under torch.inference_mode between
training steps, torch.func.functional_call with parameters of the caller's,
torch.autocast, and no autograd graph kept from one training step to the next."""
import gc

import pytest
import torch
from torch import nn

from lptrain import LayerParallel, MGRITOptions


def block(n: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.Tanh())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.open = nn.Conv2d(1, 2, 3, padding=1).double()
        self.body = LayerParallel(block, T=1.0, n_layers=4, warm_start=True,
                                  mgrit=MGRITOptions(levels=2, cfactor0=2, tol=0.0,
                                                     max_iter=2, adj_max_iter=2))
        self.body.double()
        self.head = nn.Linear(2 * 5 * 5, 3).double()

    def forward(self, x):
        return self.head(self.body(self.open(x)).flatten(1))


def trained(net, step, x, y, steps=3):
    """The loss of each SGD step on (x, y) and the parameters after them."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(step(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in net.parameters()]


def test_a_compiled_network_runs_the_solves_eagerly_with_eagers_results():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 1, 5, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(3, (4,), generator=gen)
    graphs = []

    def backend(gm, example_inputs):        # records what Dynamo captured, runs it as is
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    eager = Net()
    compiled = Net()
    want = trained(eager, eager, x, y)
    got = trained(compiled, torch.compile(compiled, backend=backend), x, y)
    torch._dynamo.reset()
    assert got[0] == want[0]          # warm-started one-shot steps: bitwise eager's
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    traced = {str(node.meta.get("stack_trace", "")) for gm in graphs for node in gm.graph.nodes}
    assert graphs and not any("lptrain" in t for t in traced), \
        [t for t in traced if "lptrain" in t][:1]


def test_inference_mode_evaluations_between_training_steps():
    # the solver keeps its buffers from call to call: made under inference mode, they were
    # inference tensors, and the next training forward could not write them
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 1, 5, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(3, (4,), generator=gen)
    plain, evaluated = Net(), Net()
    opt = torch.optim.SGD(evaluated.parameters(), lr=0.1)
    want = trained(plain, plain, x, y)
    with torch.no_grad():
        scores = [plain(x)]
    for _ in range(3):
        with torch.inference_mode():
            evaluated(x)
        opt.zero_grad()
        nn.functional.cross_entropy(evaluated(x), y).backward()
        opt.step()
    with torch.inference_mode():
        scores.append(evaluated(x))
    # one-shot warm starts are the training forwards' (no_grad and inference mode use
    # them and leave them), so the trainings and their last scores are the same
    assert all(torch.equal(a, b) for a, b in zip(want[1], evaluated.parameters()))
    assert torch.equal(scores[0], scores[1])


def dense(n: int) -> nn.Module:
    return nn.Sequential(nn.Linear(3, 3), nn.Tanh()).double()


@pytest.mark.parametrize("solve", [dict(tol=1e-13, max_iter=60, adj_tol=1e-13,
                                        adj_max_iter=60), dict(tol=0.0, max_iter=2,
                                                                adj_max_iter=2)],
                         ids=["converged", "fixed"])
def test_functional_call_differentiates_the_parameters_it_was_given(solve):
    # the backward linearises (converged: every layer; fixed: the coarse steps) after
    # functional_call has put the module's own parameters back: it must use the given
    def body():
        torch.manual_seed(0)
        return LayerParallel(dense, T=1.0, n_layers=8,
                             mgrit=MGRITOptions(levels=2, cfactor0=2, **solve))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    called, holding = body(), body()
    P = {k: (1.1 * v.detach()).requires_grad_() for k, v in called.named_parameters()}
    with torch.no_grad():
        for k, p in holding.named_parameters():
            p.copy_(P[k])
    torch.func.functional_call(called, P, (x,)).square().sum().backward()
    holding(x).square().sum().backward()
    assert all(p.grad is None for p in called.parameters())
    assert all(torch.equal(P[k].grad, p.grad) for k, p in holding.named_parameters())


def test_the_whole_body_under_activation_checkpointing():
    # torch.utils.checkpoint around the module recomputes its forward in the backward and
    # unpacks each saved tensor only once
    def body():
        torch.manual_seed(0)
        return LayerParallel(dense, T=1.0, n_layers=8, mgrit=MGRITOptions(
            levels=2, cfactor0=2, tol=1e-13, max_iter=60, adj_tol=1e-13, adj_max_iter=60))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    wrapped, plain = body(), body()
    u = x.clone().requires_grad_()
    torch.utils.checkpoint.checkpoint(wrapped, u, use_reentrant=False).square().sum().backward()
    plain(x).square().sum().backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(wrapped.parameters(),
                                                          plain.parameters()))


class Recorded(nn.Module):
    """A dense branch that records the autocast state of each call."""

    calls: list = []

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))

    def forward(self, u):
        self.calls.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return self.f(u)


@pytest.mark.parametrize("solve", [dict(tol=1e-13, max_iter=40),          # converged
                                   dict(tol=0.0, max_iter=2, adj_max_iter=2)])  # one-shot
def test_the_backward_runs_f_in_the_precision_autocast_gave_the_forward(solve):
    """Under torch.autocast the forward evaluates f in bfloat16; the adjoint's
    linearisations must too (as autograd's backward of the serial loop does), not in
    float32 outside the autocast region where backward() is called."""
    torch.manual_seed(0)
    body = LayerParallel(lambda n: Recorded(), T=1.0, n_layers=8,
                         mgrit=MGRITOptions(levels=2, cfactor0=2, **solve))
    x = torch.randn(32, 16)

    def grads(f, autocast):
        body.zero_grad()
        Recorded.calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = f(x).float().square().mean()
        loss.backward()           # outside the region, as training scripts do
        return torch.cat([p.grad.reshape(-1) for p in body.parameters()])

    got = grads(body, True)
    assert set(Recorded.calls) == {(True, torch.bfloat16)}, set(Recorded.calls)
    if solve["tol"]:       # converged: serial's bfloat16 gradient up to its rounding
        serial, full = grads(body.serial, True), grads(body.serial, False)
        assert (got - serial).norm() < 0.01 * (serial - full).norm()   # before: 0.99


def _graphs() -> list:
    """The tensors alive in this process that an autograd graph hangs from."""
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is torch.Tensor and o.grad_fn is not None]


@pytest.mark.parametrize("solve", [dict(tol=1e-13, max_iter=40),          # converged
                                   dict(tol=0.0, max_iter=2, adj_max_iter=2)])  # one-shot
def test_no_graph_outlives_its_backward(solve):
    """The linearisations of f a forward and its backward make (the forward's kept
    ones, the adjoint's) are let go once the backward is done: they kept all of f's
    activations until the next backward (the example network at N = 64, one-shot:
    +437 MiB of peak memory from the second step on)."""
    torch.manual_seed(0)
    body = LayerParallel(lambda n: Recorded(), T=1.0, n_layers=8, warm_start=True,
                         mgrit=MGRITOptions(levels=2, cfactor0=2, **solve))
    x = torch.randn(32, 16)
    before = {id(t) for t in _graphs()}
    for _ in range(2):
        body(x).square().mean().backward()
        assert [tuple(t.shape) for t in _graphs() if id(t) not in before] == []
