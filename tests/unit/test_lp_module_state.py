"""LayerParallel as torch's tooling sees a module: state dicts, pickling and gradient
clipping."""
import pytest
import torch
from torch import nn

from helpers import CONVERGED, close, dense, inputs
from lptrain import LayerParallel, MGRITOptions


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
