"""One layer-parallel problem solved on however many ranks this runs on.

Run under mpiexec on the rank counts argv[2:] (tests/mpi/sizes.py): rank 0 saves the
results to argv[1] for the pytest side, which compares them with the same function run
on one rank.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import batch, dense_net  # noqa: E402
from lptrain.config.schema import LBFGSOptions, SGDOptions  # noqa: E402
from lptrain.mgrit.options import MGRITOptions  # noqa: E402
from lptrain.parallel.module import LayerParallelResNet  # noqa: E402
from lptrain.parallel.layer_parallel import LayerParallel  # noqa: E402
from lptrain.train.optimizers import LBFGS, SGD  # noqa: E402
from lptrain.train.objective import Objective  # noqa: E402
from lptrain.train.mgrit_oracle import MGRITOracle  # noqa: E402
from lptrain.train.oneshot import SimultaneousOracle  # noqa: E402
from lptrain.train.oracles import Batch, SerialOracle  # noqa: E402

N = 30
SOLVERS = {"V3": dict(levels=3, cfactor0=2, cfactor=2, nrelax0=0, nrelax=1),
           "F4": dict(levels=4, cfactor0=2, cfactor=3, cycle="F", coarse_weights="average"),
           "V4a": dict(levels=4, cfactor0=2, cfactor=3, coarse_weights="average"),
           "F4i": dict(levels=4, cfactor0=2, cfactor=3, cycle="F"),
           "V4i": dict(levels=4, cfactor0=2, cfactor=3)}
# fixed iterations that take every solver here to the serial states at rounding (10 leave
# 4e-14, 15 leave 1e-16): the converged case; 2 is the unconverged one
CONVERGED = 15


def gather_states(exchange, comm, local):
    if comm is None:
        return local
    parts = comm.gather(local, root=0)
    return torch.cat(parts) if parts is not None else None


def trajectory(oracle, optimizer, theta, x, y, steps=5):
    out = []
    for _ in range(steps):
        oracle.begin(Batch(x, y))
        theta, info = optimizer.step(theta, oracle)
        out.append(info.objective)
    return torch.tensor(out, dtype=torch.float64), theta


def run(exchange, comm=None) -> dict:
    net, theta = dense_net(layers=N, width=4, T=3.0, activation="tanh", gamma_ddt=1e-3)
    x, y = batch(net, n=40)
    results = {}
    cases = [(name, opts, "fused") for name, opts in SOLVERS.items()] + \
        [(f"plain-{name}", SOLVERS[name], "plain") for name in ("V3", "F4")]
    for name, opts, level_ops in cases:
        lp = LayerParallel(net, MGRITOptions(tol=0.0, level_ops=level_ops, **opts), exchange)
        for iters in (2, CONVERGED):
            res = lp.forward(theta, x, max_iter=iters, tol=0.0)
            ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
            grad, ares = lp.backward(theta, x, res.states, ev, max_iter=iters, tol=0.0)
            results[f"{name}-{iters}-states"] = gather_states(exchange, comm, res.states.clone())
            results[f"{name}-{iters}-grad"] = grad
            results[f"{name}-{iters}-fwd"] = torch.tensor(res.history)
            results[f"{name}-{iters}-adj"] = torch.tensor(ares.history)
    results.update(warm_case(net, theta, x, y, exchange))
    mgrit_opts = MGRITOptions(tol=1e-11, max_iter=50, **SOLVERS["V3"])
    simultaneous_opts = MGRITOptions(fwd_iters=2, adj_iters=1, **SOLVERS["V3"])
    def objective(terms):
        return Objective(terms, net)
    results["traj-serial"], _ = trajectory(objective(SerialOracle(net, exchange)),
                                           LBFGS(LBFGSOptions()), theta, x, y)
    results["traj-mgrit"], _ = trajectory(objective(MGRITOracle(net, exchange, mgrit_opts)),
                                          LBFGS(LBFGSOptions()), theta, x, y)
    results["traj-simultaneous"], _ = trajectory(
        objective(SimultaneousOracle(net, exchange, simultaneous_opts)),
        LBFGS(LBFGSOptions()), theta, x, y)
    results["traj-sgd-serial"], _ = trajectory(objective(SerialOracle(net, exchange)),
                                               SGD(SGDOptions(lr=0.1)), theta, x, y)
    # a mini-batch of 2 samples: on 3 or 4 ranks some data shards are empty
    serial = objective(SerialOracle(net, exchange))
    results["traj-sgd-serial-2"], end = trajectory(serial, SGD(SGDOptions(lr=0.1)), theta,
                                                   x[:2], y[:2])
    results["validate-serial-2"] = torch.tensor(serial.validate(end, x[:2], y[:2]),
                                                dtype=torch.float64)
    # validation in chunks of 3 samples (some ranks get none of a chunk)
    results["validate-serial-chunks"] = torch.tensor(serial.validate(end, x, y, 3),
                                                     dtype=torch.float64)
    results["validate-mgrit-chunks"] = torch.tensor(
        MGRITOracle(net, exchange, mgrit_opts).validate(end, x, y, 3), dtype=torch.float64)
    results.update(module_case(comm))
    return results


def warm_case(net, theta, x, y, exchange) -> dict:
    """Warm solves (1 iteration) from the converged solution, after the solvers' buffers
    held another one: errors of states, adjoints and gradient (all should be ~0)."""
    out = {}
    for name in ("V3", "F4"):
        for skip in (True, False):
            lp = LayerParallel(net, MGRITOptions(tol=1e-14, max_iter=80, skip_first_down=skip,
                                                 **SOLVERS[name]), exchange)
            ref = _solve(lp, theta, x, y)
            _solve(lp, 1.3 * theta, x, y)
            got = _solve(lp, theta, x, y, warm=ref[:2], iters=1)
            errs = [exchange.allreduce_sum(float((a - b).pow(2).sum())) ** 0.5 for a, b in
                    zip(got[:2], ref[:2])] + [float((got[2] - ref[2]).norm())]
            out[f"warm-{name}-{skip}"] = torch.tensor(errs)
    return out


def _solve(lp, theta, x, y, warm=(None, None), iters=None):
    """(states, adjoint states, gradient), copies; converged unless iters is given."""
    tol = None if iters is None else 0.0
    res = lp.forward(theta, x, warm=warm[0], max_iter=iters, tol=tol)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev, warm=warm[1], max_iter=iters, tol=tol)
    return res.states.clone(), ares.states.clone(), grad.clone()


def module_case(comm) -> dict:
    """LayerParallelResNet on this communicator: output, every layer's gradient (from the
    rank that owns it), two forwards before one backward, the gathered state dict and a
    module loaded from it."""
    def make(seed=0):
        return LayerParallelResNet(width=4, layers=N, T=3.0, comm=comm, init_scale=0.5,
                                   seed=seed, mgrit=MGRITOptions(tol=1e-12, max_iter=60,
                                                                 **SOLVERS["V3"]))
    mod = make()
    u0 = torch.linspace(-1, 1, 24, dtype=torch.float64).view(6, 4).requires_grad_()
    out = mod(u0)
    loss = (out ** 2).sum()
    gu, *grads = torch.autograd.grad(loss, (u0, *mod.parameters()))
    results = {"module-out": out.detach(), "module-gu": gu}
    results.update(_by_layer(comm, mod, grads, "module"))
    twice = (mod(u0) ** 2).sum() + (mod(0.5 * u0.flip(1)) ** 2).sum()
    results.update(_by_layer(comm, mod, torch.autograd.grad(twice, list(mod.parameters())),
                             "module-twice"))
    state = mod.state_dict()
    results["module-state-K"] = torch.stack([state[f"layers.{n}.K"] for n in range(N)])
    other = make(seed=1)
    other.load_state_dict(state)
    with torch.no_grad():
        results["module-loaded"] = other(u0)
    return results


def _by_layer(comm, mod, grads, name) -> dict:
    """{name-gK: (N, w, w), name-gb: (N, w)}: every rank's gradients of its own layers."""
    mine = {k: g for (k, _), g in zip(mod.named_parameters(), grads, strict=True)}
    parts = [mine] if comm is None else comm.allgather(mine)
    every = {k: g for part in parts for k, g in part.items()}
    return {f"{name}-g{p}": torch.stack([every[f"layers.{n}.{p}"] for n in range(N)])
            for p in ("K", "b")}


if __name__ == "__main__":
    from lptrain.parallel.context import make_exchange
    from sizes import main
    main(lambda comm: run(make_exchange(comm), comm))
