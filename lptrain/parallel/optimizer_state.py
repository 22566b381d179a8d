"""An optimizer's state for a network with a LayerParallel body, whole and by name.

`optimizer.state_dict()` on a rank holds only the rank's own layers' states (Adam's
moments, momentum buffers), keyed by position in the rank's parameter list; another rank,
or another number of ranks, has other layers at those positions, and loading one rank's
dict into another would pass torch's size checks and resume with wrong states. Here the
states are keyed by the parameters' names in the network (`module.named_parameters()`,
the same on any number of ranks: layer n is `...layers.n...` everywhere), gathered over
the body's ranks; loading takes the entries of the rank's own parameters.
"""
from __future__ import annotations

import torch

from lptrain.errors import ConfigError
from lptrain.parallel.module_faults import all_arrived


def optimizer_state_dict(optimizer: torch.optim.Optimizer, module: torch.nn.Module,
                         body) -> dict:
    """{"state": {name: state}, "param_groups": [{hyper-parameters, "params": [names]}]}
    for the whole network on every rank of `body` (a LayerParallel in `module`); a
    collective call. Parameters outside the body are alike on every rank: rank 0's."""
    names = _names(module)
    order = [p for group in optimizer.param_groups for p in group["params"]]
    raw = optimizer.state_dict()
    state = {names[id(order[i])]: {k: _cpu(v) for k, v in s.items()}
             for i, s in raw["state"].items()}
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [names[id(order[i])] for i in g["params"]]}
              for g in raw["param_groups"]]
    all_arrived(body.exchange, "optimizer_state_dict()")
    parts = body.exchange.allgather((state, groups))
    whole = {}          # rank 0's entries, then the others' layers (as state_dict())
    for part, _ in parts:
        whole.update({n: s for n, s in part.items() if n not in whole})
    merged = []
    for i, group in enumerate(parts[0][1]):
        members = dict.fromkeys(n for _, gs in parts for n in gs[i]["params"])
        merged.append({**group, "params": list(members)})
    return {"state": whole, "param_groups": merged}


def load_optimizer_state_dict(optimizer: torch.optim.Optimizer, module: torch.nn.Module,
                              state_dict: dict) -> None:
    """optimizer.load_state_dict of the entries of this rank's parameters in a dict of
    `optimizer_state_dict` (saved on any number of ranks): by name, not position."""
    names = _names(module)
    groups = state_dict["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        raise ConfigError(f"optimizer state: {len(groups)} parameter groups saved, the "
                          f"optimizer has {len(optimizer.param_groups)}")
    state, local, index = {}, [], 0
    for saved, group in zip(groups, optimizer.param_groups):
        members, indices = set(saved["params"]), []
        for p in group["params"]:
            name = names[id(p)]
            if name not in members:
                raise ConfigError(f"optimizer state: parameter {name!r} is not in its "
                                  f"group of the saved state (another network?)")
            if name in state_dict["state"]:     # copies: the optimizer updates in place
                state[index] = {k: _cpu(v) for k, v in state_dict["state"][name].items()}
            indices.append(index)
            index += 1
        local.append({**{k: v for k, v in saved.items() if k != "params"},
                      "params": indices})
    optimizer.load_state_dict({"state": state, "param_groups": local})


class _Names(dict):
    """id(parameter) -> its name in the module; a parameter outside it is refused."""

    def __missing__(self, key):
        raise ConfigError("optimizer state: the optimizer holds a parameter that is not "
                          "in the module given; pass the module it trains")


def _names(module: torch.nn.Module) -> dict[int, str]:
    return _Names((id(p), n) for n, p in module.named_parameters())


def _cpu(value):
    return value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
