"""`_Solve`, the autograd function of `LayerParallel` (lp_module.py): its forward is the
module's forward MGRIT solve, its backward the adjoint MGRIT solve, under the autocast
state the forward ran in."""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.autograd.function import once_differentiable


class _Solve(torch.autograd.Function):
    """u_N(u_0, θ) by forward MGRIT; its vector-Jacobian product by adjoint MGRIT."""

    @staticmethod
    def forward(ctx, mod, limits, u0, *params):    # mod: the LayerParallel
        max_iter, tol, ctx.names = limits       # names: (layer, name) of each parameter
        uN, res, kept, ctx.f = mod._forward_solve(u0, True, max_iter, tol)
        ctx.training = mod.training        # a training solve renews the warm starts
        ctx.autocast = _autocast_state(u0.device.type)    # f's precision, for its VJPs
        ctx.mod, ctx.states = mod, mod.solver.fwd.take(res.states)   # lent until backward
        ctx.released = None                # the states' version when given back
        ctx.kept = kept                    # f's graphs at those states (fixed solves)
        ctx.save_for_backward(*params)     # autograd then refuses in-place changes of θ
        return uN

    @staticmethod
    @once_differentiable            # the adjoint solve is not itself differentiated
    def backward(ctx, grad_uN):
        params = ctx.saved_tensors      # once (checkpointing unpacks each only once)
        mod = ctx.mod
        if ctx.released is not None and ctx.states._version != ctx.released:
            raise RuntimeError("LayerParallel: a second backward through a forward after a "
                               "later forward reused its states; run the forward again")
        with mod._as_in_forward(ctx.names, params), _autocast(ctx.autocast):
            lam0, grads = mod._backward_solve(ctx.states, grad_uN, ctx.needs_input_grad[2],
                                              ctx.kept, ctx.f, ctx.training)
        ctx.kept = None
        mod.solver.fwd.release(ctx.states)   # the next forward may write into it
        ctx.released = ctx.states._version
        # a frozen parameter (requires_grad False) has no product: None, as autograd's
        return (None, None, lam0, *[grads[n].get(k) for n, k in ctx.names])


def _autocast_state(device_type: str) -> tuple | None:
    """torch.autocast's state for this device where f ran (None: a device without one).
    The backward solve linearises f again under it, as torch.utils.checkpoint recomputes:
    otherwise a forward under autocast would get the VJPs of f in full precision."""
    try:
        return (device_type, torch.is_autocast_enabled(device_type),
                torch.get_autocast_dtype(device_type), torch.is_autocast_cache_enabled())
    except RuntimeError:
        return None


def _autocast(state: tuple | None):
    """The context that re-enters an `_autocast_state`."""
    if state is None:
        return nullcontext()
    device_type, enabled, dtype, cache = state
    return torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache)
