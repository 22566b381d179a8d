"""Cases of module_case.py for what users' training scripts do around the module: feed
every rank the same batch (or not), stop and carry on with the optimizer's state,
initialise the layers after building them."""
from __future__ import annotations

import torch
from torch import nn

from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.lp_module import LayerParallel
from module_case import N, TOL, _input, dense, loss_of


def other_inputs(comm) -> dict:
    """Ranks fed other inputs (each its own samples), or other output gradients (each
    its own labels), are refused with a ConfigError on every rank; a difference of
    rounding passes. One rank has nothing to compare: 1 there by definition."""
    from lptrain.errors import ConfigError
    if comm is None or comm.Get_size() == 1:
        return {"refused-input": torch.ones(()), "refused-grad": torch.ones(()),
                "rounding-passes": torch.ones(())}
    rank, out = comm.Get_rank(), {}
    mod = LayerParallel(dense, T=1.0, n_layers=N, comm=comm,
                        mgrit=MGRITOptions(levels=3, cfactor0=2, cfactor=2, **TOL))
    for key, call in (("refused-input", lambda: mod(_input((6, 5), 20 + rank))),
                      ("refused-grad", lambda: loss_of(mod(_input((6, 5), 20)),
                                                       30 + rank).backward())):
        try:
            call()
            out[key] = torch.zeros(())
        except ConfigError as e:
            out[key] = torch.tensor(float("differs from rank 0" in str(e)))
    mod(_input((6, 5), 21) * (1 + 1e-12 * rank))
    out["rounding-passes"] = torch.ones(())
    return out


def resumed(comm) -> dict:
    """Adam on a network with a LayerParallel body: 2 steps, the model and the optimizer
    state saved (gathered, by name), loaded into a new network on as many ranks and into
    one on one rank, 2 more steps each. comm None: the 4 steps in one go (reference)."""
    from lptrain.parallel.optimizer_state import (load_optimizer_state_dict,
                                                  optimizer_state_dict)

    def net(c, shift=0):
        torch.manual_seed(11 + shift)
        return nn.Sequential(nn.Linear(4, 5).double(), LayerParallel(
            lambda n: dense(n + shift), T=1.0, n_layers=N, comm=c,
            mgrit=MGRITOptions(levels=3, cfactor0=2, cfactor=2, **TOL)),
            nn.Linear(5, 3).double())

    def train(m, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            loss_of(m(_input((6, 4), 12)), 13).backward()
            opt.step()
        return torch.cat([v.reshape(-1) for v in m.state_dict().values()])

    first = net(comm)
    opt = torch.optim.Adam(first.parameters(), lr=0.05)
    if comm is None:
        out = train(first, opt, 4)
        return {"resumed-same-ranks": out, "resumed-one-rank": out}
    train(first, opt, 2)
    saved, state = first.state_dict(), optimizer_state_dict(opt, first, first[1])
    out = {}
    for key, c in (("resumed-same-ranks", comm), ("resumed-one-rank", None)):
        again = net(c, shift=100)
        again.load_state_dict(saved)
        opt = torch.optim.Adam(again.parameters(), lr=0.05)
        load_optimizer_state_dict(opt, again, state)
        out[key] = train(again, opt, 2)
    return out


def initialized(comm) -> dict:
    """Layers initialised after building with LayerParallel.initialize: the same values
    on any number of ranks (comm None: one rank, the reference)."""
    torch.manual_seed(14)
    mod = LayerParallel(dense, T=1.0, n_layers=N, comm=comm)
    torch.manual_seed(100 + (0 if comm is None else comm.Get_rank()))   # ranks' streams
    mod.initialize(lambda m: nn.init.orthogonal_(m.lin.weight), seed=5)
    state = mod.state_dict()
    return {"initialized": torch.cat([state[f"layers.{n}.lin.weight"].reshape(-1)
                                      for n in range(N)])}
