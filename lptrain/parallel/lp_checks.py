"""LayerParallel's checks of what it is given: its arguments, a forward's limits and
input, and a state dict loaded on several ranks (refused alike on every rank).

Each raises ConfigError (or leaves torch's load error to be raised everywhere) before
anything is solved: inside a solve on several ranks a failure would end every rank
(module_faults.py).
"""
from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from lptrain.errors import ConfigError
from lptrain.mgrit.options import MGRITOptions


def check_arguments(T, n_layers, mgrit) -> None:
    """ConfigError naming a constructor argument no module can use."""
    if isinstance(T, bool) or not isinstance(T, Real) or not 0 < _as_float(T) < math.inf:
        shown = f"{T!r}" if len(repr(T)) <= 40 else f"{repr(T)[:20]}... ({len(repr(T))} " \
            f"characters)"
        raise ConfigError(f"T={shown}: the final time must be a positive finite number")
    if n_layers is not None and (isinstance(n_layers, bool)
                                 or not isinstance(n_layers, Integral) or n_layers < 1):
        raise ConfigError(f"n_layers={n_layers!r}: the number of layers must be a "
                          f"positive int")
    if mgrit is not None and not isinstance(mgrit, MGRITOptions):
        raise ConfigError(f"mgrit={mgrit!r}: give an lptrain.MGRITOptions, e.g. "
                          f"MGRITOptions(levels=3, max_iter=10)")


def _as_float(x) -> float:
    """`x` as a Python float; nan where it has none (an int beyond float's range)."""
    try:
        return float(x)
    except (OverflowError, ValueError):
        return math.nan


def layer_count(steps, n_layers, prebuilt: bool, coarse_steps) -> int:
    """N of `steps`: prebuilt steps' own, a factory's `n_layers`, a list's length; a
    given n_layers that disagrees, or none for a factory, is a ConfigError."""
    from torch import nn

    from lptrain.mgrit.protocols import StepFamily
    if prebuilt:
        N = steps.n_layers
        if n_layers not in (None, N):
            raise ConfigError(f"n_layers={n_layers} but the steps have {N} layers")
        if coarse_steps is not None and isinstance(steps, StepFamily):
            raise ConfigError(f"coarse_steps: {type(steps).__name__} runs its own "
                              "coarse steps (the fine steps with the coarse step size)")
    elif callable(steps) and not isinstance(steps, nn.Module):      # a layer factory
        N = n_layers
    else:
        N = len(steps)
        if n_layers not in (None, N):
            raise ConfigError(f"n_layers={n_layers} but {N} layers were given")
    if N is None:
        raise ConfigError("n_layers=None: a layer factory needs the number of layers")
    if not (isinstance(N, int) and N >= 1):
        raise ConfigError(f"LayerParallel: {N!r} layers; give at least one")
    return N


def check_averaged(steps, hier, owned, exchange) -> None:
    """ConfigError on every rank where a coarse step would average layers of two
    structures (coarse_weights='average'): each coarse step's range of fine layers, at
    every coarse level, with every rank's layers (collective)."""
    from lptrain.model.module_steps import first_structure
    mine = {n: steps.structure(n) for n in owned}
    structures = {}
    for part in exchange.allgather(mine):
        structures.update(part)
    for level in hier.levels[1:]:
        for a, b in zip(level.points, level.points[1:]):
            first_structure((n, structures[n]) for n in range(a, b) if n in structures)


def check_limits(max_iter, tol) -> None:
    """ConfigError naming a forward's max_iter / tol override that no solve can use."""
    if max_iter is not None and (isinstance(max_iter, bool) or not isinstance(max_iter, int)
                                 or max_iter < 1):
        raise ConfigError(f"max_iter={max_iter!r}: a positive int (iterations of the "
                          f"forward solve), or None for mgrit's")
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float))
                            or not 0 <= tol < math.inf):
        raise ConfigError(f"tol={tol!r}: a finite number >= 0 (the forward solve's "
                          f"residual tolerance; 0: max_iter iterations), or None for mgrit's")


def check_tensor(u0) -> None:
    """ConfigError where the input is not a floating-point tensor (a numpy array or
    integers failed deep in the solve; a user's layers may take states of any shape)."""
    if not isinstance(u0, torch.Tensor):
        kind = type(u0)
        raise ConfigError(f"LayerParallel: the input is a {kind.__module__}.{kind.__name__}; "
                          f"give a torch.Tensor (torch.as_tensor(x))")
    if not u0.is_floating_point():
        raise ConfigError(f"LayerParallel: the input is {u0.dtype}; give floating-point "
                          f"states, e.g. x.to(torch.float64)")


def check_sample_shape(u0: torch.Tensor, shape: tuple | None) -> None:
    """ConfigError where a sample of the input is not of the steps' `shape` (a None entry:
    any size; `shape` None: the steps take any). The ranks have the same input, so each
    raises alike."""
    if shape is None:
        return
    sample = tuple(u0.shape[1:])
    if len(sample) == len(shape) and all(w is None or w == n for w, n in zip(shape, sample)):
        return
    wanted = ", ".join("batch" if i == 0 else "any" if w is None else str(w)
                       for i, w in enumerate((0, *shape)))
    raise ConfigError(f"LayerParallel: the input has shape {tuple(u0.shape)}; the steps "
                      f"take ({wanted})")


def check_dtype(u0: torch.Tensor, dtypes: set) -> None:
    """ConfigError where the input's dtype is not the one (`dtypes`) of the layers'
    parameters and autocast is off. The ranks agree on both (the forward's settings and
    the same input), so each raises alike."""
    if len(dtypes) != 1 or not u0.is_floating_point() or u0.dtype in dtypes:
        return
    (dtype,) = dtypes
    try:
        autocast = torch.is_autocast_enabled(u0.device.type)
    except RuntimeError:        # a device without autocast
        autocast = False
    if dtype.is_floating_point and not autocast:
        raise ConfigError(f"LayerParallel: the input is {u0.dtype} but the layers' "
                          f"parameters are {dtype}; convert one, e.g. x.to({dtype}) or "
                          f"net.to({u0.dtype}) (or compute under torch.autocast)")


def agree_on_loading(exchange, prefix: str, incompatible, errors: list, start: int) -> None:
    """Every rank's missing and unexpected keys under `prefix` and its load errors from
    errors[start:] (a module's part of one load_state_dict), on every rank: torch then
    refuses (or, not strict, reports) alike on all of them. A rank lacks only its own
    layers' entries, and one that loaded while another refused would wait for it in the
    next collective call forever. A collective call on several ranks."""
    if exchange.size == 1:
        return
    lists = (incompatible.missing_keys, incompatible.unexpected_keys)
    at = [next((i for i, k in enumerate(keys) if k.startswith(prefix)), len(keys))
          for keys in lists]              # this module's keys come last, after others'
    parts = exchange.allgather(([keys[i:] for keys, i in zip(lists, at)], errors[start:]))
    for keys, i, j in zip(lists, at, range(2)):
        keys[i:] = _union(part[0][j] for part in parts)
    errors[start:] = _union(part[1] for part in parts)


def _union(lists) -> list:
    """The items of `lists` in order, each once."""
    return list(dict.fromkeys(item for items in lists for item in items))
