"""Each training mode's data terms, by the mode's name (lptrain/modes.py): one registry."""
from __future__ import annotations

from lptrain.modes import MGRIT, SERIAL, SIMULTANEOUS
from lptrain.train.mgrit_oracle import MGRITOracle
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import SerialOracle

# name -> (net, exchange, MGRITOptions, warm_batches, mini_batches, observer) -> the data terms
TERMS = {
    SERIAL: lambda net, exchange, mgrit, warm_batches, mini_batches, observer:
        SerialOracle(net, exchange, observer),
    MGRIT: lambda net, exchange, mgrit, warm_batches, mini_batches, observer:
        MGRITOracle(net, exchange, mgrit, observer=observer),
    SIMULTANEOUS: lambda net, exchange, mgrit, warm_batches, mini_batches, observer:
        SimultaneousOracle(net, exchange, mgrit, warm_batches, mini_batches, observer),
}


def make_oracle(mode, net, exchange, mgrit_opts, mini_batches: bool = False, observer=None):
    """The data terms of `mode` (a ModeOptions) on `exchange`'s ranks; `observer` (an
    `mgrit.protocols.Observer`, None: none) is told of their steps, messages and sums."""
    return TERMS[mode.name](net, exchange, mgrit_opts, mode.warm_batches, mini_batches,
                            observer)
