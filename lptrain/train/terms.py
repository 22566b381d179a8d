"""Each training mode's data terms, by the mode's name (lptrain/modes.py): one registry."""
from __future__ import annotations

from lptrain.modes import MGRIT, SERIAL, SIMULTANEOUS
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import MGRITOracle, SerialOracle

# name -> (net, exchange, MGRITOptions, warm_batches, mini_batches) -> the data terms
TERMS = {
    SERIAL: lambda net, exchange, mgrit, warm_batches, mini_batches:
        SerialOracle(net, exchange),
    MGRIT: lambda net, exchange, mgrit, warm_batches, mini_batches:
        MGRITOracle(net, exchange, mgrit),
    SIMULTANEOUS: lambda net, exchange, mgrit, warm_batches, mini_batches:
        SimultaneousOracle(net, exchange, mgrit, warm_batches, mini_batches),
}


def make_oracle(mode, net, exchange, mgrit_opts, mini_batches: bool = False):
    """The data terms of `mode` (a ModeOptions) on `exchange`'s ranks."""
    return TERMS[mode.name](net, exchange, mgrit_opts, mode.warm_batches, mini_batches)
