"""1 rank against 2, 3 and 4 ranks (oversubscribed): same states, gradients, trajectories."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import ranks_case  # noqa: E402
from helpers import batch, dense_net, serial_objective_and_grad  # noqa: E402
from lptrain.mgrit.exchange import SerialExchange  # noqa: E402
pytestmark = pytest.mark.mpi
FOUR_RANKS = "ranks"     # this file's case in the shared 4-rank launch (conftest.py)


@pytest.fixture(scope="module")
def reference():
    return ranks_case.run(SerialExchange())


@pytest.fixture(scope="module")
def many(four_ranks):
    """{ranks: results} on 2, 3 and 4 ranks, from the shared launch."""
    return four_ranks[FOUR_RANKS]


def test_one_rank_matches_serial_network(reference):
    net, theta = dense_net(layers=ranks_case.N, width=4, T=3.0, activation="tanh",
                           gamma_ddt=1e-3)
    x, y = batch(net, n=40)
    value, grad, states = serial_objective_and_grad(net, theta, x, y)
    for name in ranks_case.SOLVERS:
        got = reference[f"{name}-{ranks_case.CONVERGED}-states"]
        assert float((got - states).norm() / states.norm()) <= 1e-10
        g = reference[f"{name}-{ranks_case.CONVERGED}-grad"].clone()
        net.regulariser(theta, g)
        assert float((g - grad).norm() / grad.norm()) <= 1e-8
    assert reference["traj-mgrit"] == pytest.approx(reference["traj-serial"], rel=1e-8)


def test_reference_level_operations_match_the_fused_ones(reference):
    # the plain cases run on every rank count too (test_many_ranks_equal_one_rank)
    plain = [key for key in reference if key.startswith("plain-")]
    assert len(plain) == 16
    for key in plain:
        ref, got = reference[key[len("plain-"):]], reference[key]
        scale = max(float(ref.abs().max()), 1e-30)
        assert float((got - ref).abs().max()) <= 1e-10 * scale, key


def test_warm_starts_from_the_solution_stay_there(reference):
    warm = {k: v for k, v in reference.items() if k.startswith("warm-")}
    assert len(warm) == 4
    for key, errors in warm.items():
        assert float(errors.max()) <= 1e-11, (key, errors)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_many_ranks_equal_one_rank(ranks, reference, many):
    got = many[ranks]
    assert set(got) == set(reference)
    for key, ref in reference.items():
        assert got[key].shape == ref.shape, key
        scale = max(float(ref.abs().max()), 1e-30)
        if key.startswith("warm-"):      # errors against the solution: ~0 on any rank count
            assert float(got[key].max()) <= 1e-11, (key, got[key])
            continue
        assert float((got[key] - ref).abs().max()) <= 1e-10 * scale, key


def test_module_loaded_from_its_state_dict_gives_its_output(reference):
    # LayerParallelResNet; many ranks: its gathered state dict, scattered again
    assert torch.allclose(reference["module-loaded"], reference["module-out"], rtol=1e-12)
    assert reference["module-state-K"].shape == (ranks_case.N, 4, 4)
    assert not torch.allclose(reference["module-twice-gK"], reference["module-gK"])
