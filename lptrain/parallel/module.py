"""`LayerParallelResNet`: lptrain's dense residual layers as a `LayerParallel` module,
with the initial weights of the command line's dense network."""
from __future__ import annotations

from numbers import Integral, Real

import torch

from lptrain.errors import ConfigError
from lptrain.mgrit.options import MGRITOptions
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.parallel.builtin_steps import BuiltinSteps
from lptrain.parallel.lp_module import LayerParallel


class LayerParallelResNet(LayerParallel):
    """N dense residual steps u ← u + h·σ(K_n u + b_n), h = T/N, solved by MGRIT.

    A `LayerParallel` of `BuiltinSteps.dense(K, b, activation)` whose K (N, w, w) and
    b (N, w), or (N, 1) for bias="scalar", are drawn as `lptrain network=dense
    network.opening=pad` draws them (normal, times init_scale, from `seed`; identical on
    every rank; the dense opening would draw its own weights first).  Layer n is
    `layers[str(n)]` with parameters K and b, held, trained and saved by the rank that
    owns it (`owned`); state_dict() gathers every layer.  Every rank of `comm` calls
    the module with the same input u_0 of shape (batch, width) and gets u_N back.
    """

    def __init__(self, width: int, layers: int, T: float = 1.0, activation: str = "tanh",
                 bias: str = "vector", mgrit: MGRITOptions | None = None, comm=None,
                 init_scale: float = 0.1, seed: int = 0, dtype=torch.float64,
                 warm_start: bool = False):
        K, b = initial_weights(width, layers, T, activation, bias, init_scale, seed, dtype)
        super().__init__(BuiltinSteps.dense(K, b, activation), T=T, mgrit=mgrit, comm=comm,
                         warm_start=warm_start)


def initial_weights(width: int, layers: int, T: float, activation: str, bias: str,
                    init_scale: float, seed: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(K, b) of the dense network's θ drawn from `seed` (validated by NetworkOptions)."""
    for name, value, kind in (("width", width, Integral), ("layers", layers, Integral),
                              ("T", T, Real), ("init_scale", init_scale, Real),
                              ("seed", seed, Integral)):
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ConfigError(f"{name}={value!r}: must be "
                              f"{'an integer' if kind is Integral else 'a number'}")
    if not 0 <= seed < 2 ** 32:            # as the command's seed, torch's generator
        raise ConfigError(f"seed={seed!r}: must be in [0, 2**32 - 1]")
    for name, value in (("T", T), ("init_scale", init_scale)):
        try:
            float(value)
        except OverflowError:                # an int of 400 digits
            raise ConfigError(f"{name}: an integer of {len(str(abs(value)))} digits, "
                              f"beyond a float's range") from None
    width, layers, seed, T, init_scale = int(width), int(layers), int(seed), float(T), \
        float(init_scale)
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ConfigError(f"dtype={dtype}: the weights must be floating point, e.g. "
                          f"torch.float64")
    try:              # its checks name the command's keys: the arguments' names here
        opts = NetworkOptions(width=width, layers=layers, T=T, activation=activation,
                              bias=bias, opening="pad", init="normal",
                              init_hidden=init_scale, gamma_tik=0.0, gamma_class=0.0,
                              gamma_ddt=0.0)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("network.init_hidden=", "init_scale=")
                          .replace("network.", "")) from None
    net = ResNet(opts, (width,), 1)
    return net.hidden_views(net.init_params(seed, dtype))
