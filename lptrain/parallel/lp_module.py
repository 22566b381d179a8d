"""`LayerParallel`: a torch module of N user residual branches whose forward runs MGRIT
and whose backward runs the adjoint MGRIT (lp_autograd.py), each rank holding only its
own layers."""
from __future__ import annotations

import math
import warnings
from contextlib import ExitStack
from dataclasses import fields
from itertools import chain
from operator import attrgetter, is_
from typing import NamedTuple

import torch
from torch import nn

from lptrain.errors import ConfigError, counted
from lptrain.mgrit.options import MGRITOptions
from lptrain.model.coarse_steps import CoarseSteps
from lptrain.model.module_steps import STACKED, ModuleSteps, seeded
from lptrain.model.module_vjp import with_params
from lptrain.parallel.context import make_exchange
from lptrain.parallel.ddp import check_ddp_group
from lptrain.parallel.halo import owned_layers
from lptrain.parallel.lp_autograd import _Solve
from lptrain.parallel.lp_checks import (agree_on_loading, check_arguments, check_averaged,
                                        check_dtype, check_limits, check_sample_shape,
                                        check_tensor, layer_count)
from lptrain.parallel.lp_grads import average_gradients, clip_grad_norm_
from lptrain.parallel.module_faults import agreed, all_arrived, ends_every_rank, refuse_tied
from lptrain.parallel.module_solver import ModuleSolver
from lptrain.parallel.same_input import check_same
from lptrain.parallel.train_buffers import lend_copies, take_back, update_once

# the gradient helpers are importable from here too
__all__ = ["LayerParallel", "average_gradients", "clip_grad_norm_"]


class LayerParallel(nn.Module):
    """u_{n+1} = u_n + h·f_n(u_n), n = 0..N−1, h = T/N, solved by MGRIT over `comm`.

    steps: N `nn.Module`s, or a factory `steps(n) -> nn.Module` with `n_layers`
    (a rank then builds only its layers and copies of the few it borrows), or a
    step family such as `BuiltinSteps.dense(K, b)` / `.conv(K, b)` (lptrain's own
    steps with their hand-written adjoint: parallel/builtin_steps.py), which brings
    its own propagators (`mgrit.protocols.StepFamily`); user modules get autograd's.
    Every rank of `comm` (mpi4py; None: one process) calls the module with the
    same input u_0 (any shape; f_n must keep it) and gets u_N back.  Parameters
    and gradients of layer n live on the rank that owns it (`owned`), so each
    rank's optimizer steps its own layers (`initialize` sets them up alike on any
    number of ranks; parallel/optimizer_state.py saves an optimizer's state by name).
    Forward, backward and state_dict() are collective: every rank calls them in the
    same order, with the same batch (checked: parallel/same_input.py, module_faults.py).

    mgrit.tol / max_iter drive the forward solve, adj_tol / adj_max_iter the
    adjoint; tol=0 gives fixed iterations (one-shot training), best with
    warm_start=True: each solve starts from the last one's C-points (the
    forward's from the last forward with gradients, the adjoint's from the last
    backward).  Forwards without gradients (torch.no_grad) use but do not
    replace the warm start.  stack=True steps many layers at once with vmap
    (layers of one structure only; see ModuleSteps).

    coarse_steps: a factory `coarse_steps(CoarseStep) -> nn.Module` g for MGRIT's
    coarse steps u ← u + H·g(u) (model/coarse_steps.py: which parameters of g follow
    the fine layers'); None: the fine f with the coarse step size H.  Converged
    solves do not depend on it; the iterations' convergence does.

    Data parallelism: wrap the network in DistributedDataParallel with
    parallel/ddp.py's data_process_group, or call `average_gradients` after backward.
    """

    def __init__(self, steps, T: float = 1.0, n_layers: int | None = None,
                 mgrit: MGRITOptions | None = None, comm=None, warm_start: bool = False,
                 stack: bool = False, coarse_steps=None):
        super().__init__()
        check_arguments(T, n_layers, mgrit)       # numbers of any kind: as Python's
        T, n_layers = float(T), None if n_layers is None else int(n_layers)
        self.options = mgrit or MGRITOptions()
        if comm is not None and not callable(getattr(comm, "Get_size", None)):
            raise ConfigError(f"comm={comm!r}: give an mpi4py communicator "
                              f"(MPI.COMM_WORLD, a split of it) or None for one process")
        self.exchange = make_exchange(comm)
        prebuilt = isinstance(steps, ModuleSteps)         # e.g. BuiltinSteps.dense(K, b)
        N = layer_count(steps, n_layers, prebuilt, coarse_steps)
        hier = self.options.hierarchy(N, self.exchange.size)
        self.owned = owned_layers(hier, self.exchange.rank)
        def build():
            built = steps if prebuilt else ModuleSteps(steps, N, build=self.owned,
                                                       stack=stack)
            layers = {n: built.ensure(n) for n in self.owned}
            if self.exchange.size > 1:
                refuse_tied(layers)
            if layers:
                built.check_one_dtype(layers)
            if stack and layers:
                built.check_one_structure(layers, STACKED)
            return built
        self.steps = agreed(self.exchange, build, "building the layers")
        if self.options.coarse_weights == "average":     # every rank built its layers
            check_averaged(self.steps, hier, self.owned, self.exchange)
        self.layers = self.steps.modules          # registered: this rank's parameters
        self.n_layers, self.T, self.h = N, T, T / N
        coarse = None if coarse_steps is None else CoarseSteps(coarse_steps)
        self.solver = ModuleSolver(self.steps, self.h, self.options, self.exchange, coarse)
        self.warm_start = warm_start
        # the keys of dropout's masks, one per forward in training mode: every rank draws
        # the same (seeded from the layers' base seed, else torch's initial seed)
        base = getattr(self.steps, "_seed", None)
        self.generator = torch.Generator().manual_seed(
            (torch.initial_seed() if base is None else base + 0x5DEECE66D) % 2 ** 63)
        self._warm = [None, None]
        self._index: _Index | None = None     # _indexed_params' last answer
        self._ddp_checked: set = set()   # process groups of a DDP around this module, sound
        self._same_checked: set = set()  # inputs found alike on every rank (same_input.py)
        self.last_forward = self.last_backward = None    # SolveResult of the latest solves
        self._register_load_state_dict_pre_hook(self._drop_other_layers)
        self.register_load_state_dict_post_hook(self._agree_on_loading)
        self._loading = None      # (prefix, error_msgs, its length) while loading

    def extra_repr(self) -> str:
        """What print() shows besides this rank's layers: depth, time and ranks."""
        here = f"{self.owned[0]}..{self.owned[-1]}" if len(self.owned) else "none"
        return (f"n_layers={self.n_layers}, T={self.T}, ranks={self.exchange.size} "
                f"(layers here: {here}), warm_start={self.warm_start}")

    def _indexed_params(self) -> "_Index":
        """This rank's layers' parameters in the autograd inputs' order and their (layer,
        name); remembered while every module of the layers holds the same parameter and
        submodule objects (checked with C-level maps, not a Python loop per layer)."""
        c, layers = self._index, self.layers._modules.values()
        if c is not None and _same(c.layers, layers) \
                and _same(c.entries, _values(c.modules, "_parameters")) \
                and _same(c.subs, _values(c.modules, "_modules")):
            return c
        index = [(n, k, p) for n in self.owned for k, p in _named_params(self.steps.module(n))]
        modules = [sub for m in layers for sub in m.modules()]
        self._index = _Index([p for _, _, p in index], [(n, k) for n, k, _ in index],
                             list(layers), modules, list(_values(modules, "_parameters")),
                             list(_values(modules, "_modules")))
        return self._index

    # -- forward ---------------------------------------------------------------------
    def forward(self, u0: torch.Tensor, max_iter: int | None = None,
                tol: float | None = None) -> torch.Tensor:
        """u_N.  max_iter / tol override mgrit's for this forward solve (e.g. an exact
        evaluation in a one-shot training: max_iter=50, tol=1e-8).

        Runs eagerly under torch.compile: a compiled network around it compiles the
        rest, while Dynamo would otherwise trace the solver's Python, its messages and
        norms (graph breaks at each, tens of seconds of compilation). The escape is made
        only while compiling: `torch.compiler.disable` imports Dynamo, which a process
        that never compiles need not load."""
        check_limits(max_iter, tol)
        if torch.compiler.is_compiling():
            return torch.compiler.disable(self._forward)(u0, max_iter, tol)
        return self._forward(u0, max_iter, tol)

    def _forward(self, u0, max_iter, tol):
        check_tensor(u0)
        index = self._indexed_params()
        grad = torch.is_grad_enabled() and (u0.requires_grad or any(map(_REQUIRES_GRAD,
                                                                        index.params)))
        dtypes = set(map(_DTYPE, index.params))
        all_arrived(self.exchange, "forward" if grad else "forward without gradients",
                    u0.numel(), self._settings(u0, max_iter, tol, dtypes)
                    if self.exchange.size > 1 else None)
        check_ddp_group(self, self.owned, self._ddp_checked)
        check_same(self.exchange, u0, "input", self._same_checked)
        check_sample_shape(u0, self.steps.sample_shape())
        check_dtype(u0, dtypes)
        if grad:
            return _Solve.apply(self, (max_iter, tol, index.names), u0, *index.params)
        # not in inference mode: the solver's buffers outlive this call, and as inference
        # tensors no later training forward could write them
        with torch.inference_mode(False), torch.no_grad():
            return self._forward_solve(u0, False, max_iter, tol)[0]

    def _settings(self, u0, max_iter, tol, dtypes: set) -> dict:
        """What a forward solve depends on besides the data (`dtypes`: this rank's
        parameters'): every rank must agree."""
        o = self.options
        return {"n_layers": self.n_layers, "T": self.T, "max_iter": max_iter, "tol": tol,
                "dtype": u0.dtype, "training": self.training, "warm_start": self.warm_start,
                "layer dtypes": sorted(map(str, dtypes)),
                **{f"mgrit.{f.name}": getattr(o, f.name) for f in fields(o)}}

    def _forward_solve(self, u0, keep: bool, max_iter=None, tol=None):
        """u_N on every rank, this rank's states (keep, in training mode: they become
        the next warm start), the adjoint's `kept` and the f it solved with: (dropout
        keys, pinned buffers), what its backward must evaluate."""
        s = self.solver
        x = s.family.to_state(u0.detach())
        warm = self._warm[0] if self.warm_start else None
        if warm is not None and (warm.shape[1:] != x.shape or warm.dtype != x.dtype):
            warm = None                      # another batch shape: a cold start
        kept = {} if keep else None
        # only a training forward renews the warm start: an eval-mode forward with
        # gradients (validation without no_grad, saliency) reads it and leaves it
        renew = keep and self.training and self.warm_start
        reuse = renew and warm is not None      # its warm start is replaced below
        if reuse:
            self._warm[0] = None                # (a failed solve leaves a cold start)
        with ends_every_rank(self.exchange, "forward solve"):
            res, pins, draws = self._solve_forward(x, warm, max_iter, tol, kept, reuse)
        self.last_forward = res
        _warn_unconverged("forward", res, self.options.tol if tol is None else tol,
                          self.options.rtol, self.exchange.rank)
        if renew:
            # the C-points where they lie: the states are lent to the backward, then
            # only the next forward with gradients writes there (MGRIT.c_point_rows)
            self._warm[0] = s.fwd.c_point_rows(res.states)
        uN = self.exchange.broadcast_tensor(res.states[-1] if s.last else None,
                                            self.exchange.size - 1, x)
        return s.family.from_state(uN).clone(), res, kept, (draws, pins)

    def _solve_forward(self, x, warm, max_iter, tol, kept, reuse):
        """The forward solve with this forward's f (dropout keys, buffers lent to the
        solve; their update once after it): (solve, pinned buffers, keys)."""
        s = self.solver
        s.share()
        self.steps.draws = draws = self._next_draws()    # after share: the copies' modes
        try:
            lent = lend_copies(self.steps, self._local())
            pins = self.steps.pinned
            try:
                res = s.forward(x, x, warm, max_iter, tol, keep=kept, reuse_warm=reuse)
            finally:
                changed = take_back(lent, self.steps)
            if changed:      # e.g. BatchNorm in training mode: once, at the solved states
                update_once(self.steps, self.owned,
                            lambda n: s.family.from_state(res.states[n - s.lo]))
        finally:
            self.steps.draws = None
        return res, pins, draws

    def _backward_solve(self, states, grad_uN, want_input: bool, kept=None,
                        f=(None, None), training: bool = True):
        """λ_0 (if wanted) and this rank's parameter gradients, solving with the forward's
        f (`_forward_solve`'s: the same dropout masks and pinned buffers); the backward
        of a `training` forward renews the adjoint's warm start."""
        s = self.solver
        all_arrived(self.exchange, "backward", grad_uN.numel())
        check_same(self.exchange, grad_uN, "gradient of the output", self._same_checked)
        lamN = s.adjoint_state(grad_uN)
        renew = training and self.warm_start
        warm = self._warm[1] if self.warm_start else None
        if warm is not None and (warm.shape[1:] != lamN.shape or warm.dtype != lamN.dtype):
            warm = None
        reuse = renew and warm is not None
        if reuse:
            self._warm[1] = None                # (a failed solve leaves a cold start)
        draws, pins = f
        with ends_every_rank(self.exchange, "adjoint solve"):
            self.steps.draws = draws
            lent = lend_copies(self.steps, self._local(), pins)
            try:    # the linearisations run the forward's f: they must not update buffers
                res, grads = s.backward(states, lamN, lamN, warm, kept=kept,
                                        reuse_warm=reuse)
            finally:
                take_back(lent, self.steps)
                self.steps.draws = None
        self.last_backward = res
        _warn_unconverged("adjoint", res, self.options.adjoint_tol, self.options.rtol,
                          self.exchange.rank)
        if renew:
            self._warm[1] = s.adj.c_point_rows(res.states)
        lam0 = None
        if want_input:
            lam0 = self.exchange.broadcast_tensor(s.lam(res.states, 0) if s.first else None,
                                                  0, lamN)
            lam0 = s.input_gradient(lam0)
        return lam0, grads

    def _as_in_forward(self, names, params):
        """The layers computing with the parameters their forward had: where it ran inside
        torch.func.functional_call (tensors other than the modules' own), the backward
        linearises inside the same replacement, else nothing to do."""
        stack = ExitStack()
        if all(map(is_, self._indexed_params().params, params)):
            return stack
        by_layer: dict[int, dict] = {}
        for (n, k), p in zip(names, params):
            by_layer.setdefault(n, {})[k] = p
        for n, P in by_layer.items():
            stack.enter_context(with_params(self.steps.module(n), P)())
        return stack

    def initialize(self, init, seed: int) -> None:
        """init(layer) for each layer this rank owns, with torch's seed set to seed + n for
        layer n: alike on any number of ranks (`net.apply(init)` draws from each rank's
        own stream, so layer n would start differently on 1 and on 2 ranks)."""
        for n in self.owned:
            with seeded(seed + n):
                init(self.steps.module(n))

    def _local(self) -> list[int]:
        """The layers built on this rank: its own and the borrowed copies."""
        return [*self.steps.built, *self.steps.halo]

    def _next_draws(self):
        """(key, layers that draw) of a forward in training mode, None without dropout
        in training mode; the key is the next of `generator` whatever the layers."""
        if not self.training:
            return None
        key = int(torch.randint(2 ** 62, (1,), generator=self.generator))
        layers = self.steps.draw_layers(self._local())
        return (key, layers) if layers else None

    def serial(self, u0: torch.Tensor) -> torch.Tensor:
        """The same layers stepped one after another with autograd (the reference);
        needs every layer on this rank (comm of one rank). Dropout draws the masks a
        forward would with the same state of `generator`."""
        if len(self.owned) != self.n_layers:
            raise ConfigError(f"serial(): this rank holds layers {self.owned.start}.."
                              f"{self.owned.stop - 1} of {self.n_layers}; build the module "
                              "with comm=None for the serial reference")
        self.steps.draws = self._next_draws()
        try:
            u = u0
            for n in range(self.n_layers):
                u = self.steps.step(u, n, self.h)
        finally:
            self.steps.draws = None
        return u

    # -- state dict ------------------------------------------------------------------
    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """Every layer's entries on every rank (gathered; a collective call)."""
        out = super().state_dict(*args, destination=destination, prefix=prefix,
                                 keep_vars=keep_vars)
        if self.exchange.size == 1:
            return out
        all_arrived(self.exchange, "state_dict()")
        own = {k: v for k, v in out.items() if k.startswith(prefix + "layers.")}
        device = next(iter(own.values())).device if own else None
        mine = {k: v.detach().cpu() for k, v in own.items()}
        for r, part in enumerate(self.exchange.allgather(mine)):
            if r != self.exchange.rank:
                out.update({k: v.to(device) for k, v in part.items()})
        return out

    def _drop_other_layers(self, state_dict, prefix, local_metadata, strict, missing_keys,
                           unexpected_keys, error_msgs):
        """load_state_dict takes every layer's entries and keeps this rank's; entries of
        layers the module does not have (a dict of a deeper network) stay, for
        load_state_dict to refuse as unexpected keys."""
        self._loading = (prefix, error_msgs, len(error_msgs))
        head = prefix + "layers."
        for key in [k for k in state_dict if k.startswith(head)]:
            n = key[len(head):].split(".", 1)[0]
            if n.isdigit() and int(n) < self.n_layers and int(n) not in self.owned:
                del state_dict[key]

    def _agree_on_loading(self, module, incompatible) -> None:
        """What any rank refuses in this module's dict, refused (or, not strict,
        reported) alike on every rank (lp_checks.agree_on_loading)."""
        prefix, errors, start = self._loading
        self._loading = None
        agree_on_loading(self.exchange, prefix, incompatible, errors, start)


def _warn_unconverged(which: str, res, tol: float, rtol: float, rank: int = 0) -> None:
    """A warning, on rank 0 (every rank's solve ends alike: each printed it), where a
    solve with a tolerance stopped at its iteration limit (a fixed solve, tol = rtol = 0,
    stops there by design), or at a residual that is not finite (NaN or inf in the input
    or the layers: more iterations cannot help)."""
    if not (tol > 0 or rtol > 0) or res.converged or rank != 0:
        return
    advice = "raise max_iter, or check that each layer computes the same f at every call" \
        if math.isfinite(res.residual) else \
        "the states are not finite: check the input and the layers' parameters for NaN or inf"
    warnings.warn(f"LayerParallel: the {which} MGRIT solve stopped after "
                  f"{counted(res.iterations, 'iteration')} at residual {res.residual:.3g} "
                  f"(tol={tol:g}, rtol={rtol:g}); {advice}", RuntimeWarning, stacklevel=4)


class _Index(NamedTuple):
    """_indexed_params' answer (parameters, their (layer, name)) and what it was taken
    from: the layers' modules, every module of their trees, and those modules'
    parameter and submodule entries."""

    params: list
    names: list
    layers: list
    modules: list
    entries: list
    subs: list


_REQUIRES_GRAD = attrgetter("requires_grad")
_DTYPE = attrgetter("dtype")


def _values(modules, attr: str):
    """The values of each module's `attr` dict (_parameters / _modules), chained."""
    return chain.from_iterable(map(dict.values, map(attrgetter(attr), modules)))


def _same(xs: list, ys) -> bool:
    """Whether ys yields exactly the objects of xs, in order."""
    ys = list(ys)
    return len(xs) == len(ys) and all(map(is_, xs, ys))


def _named_params(module: nn.Module):
    """module.named_parameters(), read directly for a module without submodules."""
    if module._modules:
        return module.named_parameters()
    return [(k, p) for k, p in module._parameters.items() if p is not None]
