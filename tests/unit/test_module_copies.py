"""The copies LayerParallel's autograd family leaves out give bitwise the results of the
plain version (`Copies` off), and the forward's states lent to its backward stay sound."""
import pytest
import torch
from torch import nn

from lptrain import LayerParallel, MGRITOptions
from lptrain.mgrit.fused import Fusions
from lptrain.mgrit.solver import MGRIT
from lptrain.parallel.module_propagators import Copies

CL = torch.channels_last
SOLVES = {"fixed 2 + 2": dict(tol=0.0, max_iter=2, adj_max_iter=2),
          "fixed 1 + 1": dict(tol=0.0, max_iter=1, adj_max_iter=1),
          "converged": dict(tol=1e-9, max_iter=40, adj_tol=1e-9, adj_max_iter=40)}


def block(n: int) -> nn.Module:
    """The example's residual branch (examples/fashion_resnet.py), 4 channels."""
    return nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, padding=1))


def network(dtype, solve, weights, copies, fusions=Fusions()):
    torch.manual_seed(0)
    opening = nn.Conv2d(1, 4, 3, stride=2, padding=1).to(dtype)
    body = LayerParallel(block, T=2.0, n_layers=8, warm_start=True, mgrit=MGRITOptions(
        levels=2, cfactor0=4, coarse_weights=weights, **SOLVES[solve])).to(dtype)
    body.solver.family.copies = copies
    body.solver.fwd.ops.fusions = body.solver.adj.ops.fusions = fusions
    return opening, body, nn.Linear(4 * 6 * 6, 3).to(dtype)


def train(dtype, solve, weights, copies, fusions=Fusions()) -> tuple[list, LayerParallel]:
    """Outputs and every gradient of three SGD steps (warm starts carried between them),
    their solves' residual histories and state norms, and an evaluation forward after
    each."""
    opening, body, head = network(dtype, solve, weights, copies, fusions)
    params = [*opening.parameters(), *body.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    gen, seen = torch.Generator().manual_seed(1), []
    for _ in range(3):
        x = torch.randn(5, 1, 12, 12, generator=gen, dtype=dtype)
        opt.zero_grad()
        u = opening(x)
        uN = body(u)
        head(uN.flatten(1)).pow(2).sum().backward()
        seen += [uN.detach().clone(), *(p.grad.clone() for p in params), torch.tensor(
            [*body.last_forward.history, body.last_forward.state_norm,
             *body.last_backward.history, body.last_backward.state_norm])]
        opt.step()
        with torch.no_grad():
            seen.append(body(u))
    return seen, body


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("solve", list(SOLVES))
@pytest.mark.parametrize("weights", ["inject", "average"])
def test_the_copies_left_out_change_no_bit(dtype, solve, weights):
    fast, body = train(dtype, solve, weights, Copies())
    # the devices ran: λ's rows in channels_last, as the linearisations see states
    assert body.solver.adj._buffers[0][0].is_contiguous(memory_format=CL)
    plain, body = train(dtype, solve, weights,
                        Copies(write_rows=False, adjoint_layout=False, lam_view=False),
                        Fusions(residual_rows=False))
    assert body.solver.adj._buffers[0][0].is_contiguous()
    assert len(fast) == len(plain) == 3 * (1 + 2 + 8 * 6 + 2 + 1 + 1)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(fast, plain))


def test_each_row_is_written_where_the_solver_reads_it_once(monkeypatch):
    # direct writes: no stack of the stepped rows on level 0 (the fast path is taken)
    stacks = []
    stack = torch.stack
    monkeypatch.setattr(torch, "stack", lambda *a, **k: stacks.append(1) or stack(*a, **k))
    _, body, _ = network(torch.float64, "fixed 2 + 2", "inject", Copies())
    u = torch.randn(2, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    body(u).sum().backward()
    assert stacks == []
    body.solver.family.copies = Copies(write_rows=False)
    body(u).sum().backward()
    assert len(stacks) > 0


def test_a_second_backward_sees_the_states_of_its_forward():
    # the forward's states are the solver's buffer, lent until the backward gives it
    # back: a second backward right after works, after a later forward it refuses
    # (no warm starts: the second adjoint solve would start from the first's)
    _, body, _ = network(torch.float64, "fixed 2 + 2", "inject", Copies())
    body.warm_start = False
    u = torch.randn(2, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    out = body(u).pow(2).sum()
    first = torch.autograd.grad(out, [u, *body.parameters()], retain_graph=True)
    again = torch.autograd.grad(out, [u, *body.parameters()], retain_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert first[0].is_contiguous()       # the input's gradient as before: contiguous
    body(u + 1).pow(2).sum().backward()          # writes into the released buffer
    with pytest.raises(RuntimeError, match="second backward through a forward"):
        torch.autograd.grad(out, [u])


def test_several_forwards_keep_their_own_states():
    # two forwards before their backwards: each backward sees its own forward's states
    # (no warm starts: the solves do not depend on the order)
    _, body, _ = network(torch.float64, "fixed 2 + 2", "inject", Copies())
    body.warm_start = False
    params = list(body.parameters())
    u, v = (torch.randn(2, 4, 6, 6, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    a, b = body(u).pow(2).sum(), body(v).pow(3).sum()
    got = torch.autograd.grad(b, [v, *params]), torch.autograd.grad(a, [u, *params])
    _, body, _ = network(torch.float64, "fixed 2 + 2", "inject", Copies())
    body.warm_start = False
    params = list(body.parameters())
    a = body(u).pow(2).sum()
    want_a = torch.autograd.grad(a, [u, *params])
    b = body(v).pow(3).sum()
    want_b = torch.autograd.grad(b, [v, *params])
    assert all(torch.equal(x, y) for x, y in zip(got[1], want_a))
    assert all(torch.equal(x, y) for x, y in zip(got[0], want_b))


def warm_run(dtype) -> tuple[list, LayerParallel]:
    """Three SGD steps, each of two forwards with their backwards after both, then an
    evaluation forward (warm starts carried throughout): outputs and gradients."""
    opening, body, head = network(dtype, "fixed 2 + 2", "average", Copies())
    params = [*opening.parameters(), *body.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    gen, seen = torch.Generator().manual_seed(1), []
    for _ in range(3):
        x, z = (torch.randn(5, 1, 12, 12, generator=gen, dtype=dtype) for _ in range(2))
        opt.zero_grad()
        u, w = body(opening(x)), body(opening(z))
        (head(u.flatten(1)).pow(2).sum() + head(w.flatten(1)).sum()).backward()
        seen += [u.detach(), w.detach(), *(p.grad.clone() for p in params)]
        opt.step()
        with torch.no_grad():
            seen.append(body(opening(x)))
    return seen, body


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_warm_starts_kept_in_the_solvers_rows_change_no_bit(dtype, monkeypatch):
    # warm starts are the C-point rows of the last solves' buffers, which the next
    # solves with gradients work in (no copy out, none back in): bitwise the results of
    # compact copies, with two forwards before their backwards and evaluation forwards
    fast, body = warm_run(dtype)
    for solver, warm in zip((body.solver.fwd, body.solver.adj), body._warm):
        assert any(warm.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                   for b in solver._buffers)
    monkeypatch.setattr(MGRIT, "c_point_rows", MGRIT.c_point_states)
    plain, body = warm_run(dtype)
    assert body._warm[0].shape[0] == body._warm[0].untyped_storage().nbytes() // (
        body._warm[0][0].numel() * body._warm[0].element_size())      # a compact copy
    assert len(fast) == len(plain)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(fast, plain))
