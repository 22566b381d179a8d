"""The propagators MGRIT steps for a ModuleSteps network: Φ (forward) and Φᵀ (adjoint).

Both map the solver's step (start, stop), in fine indices of the solver's own
direction, to a layer's module and parameters and a step size h·(stop − start):
coarse steps use the fine f with the parameters of the layer where the step
starts in forward time (inject) or their mean over the covered layers (average),
or on coarse levels the user's coarse module g (`coarse`, parallel/coarse.py) with
those parameters.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lptrain.mgrit.indexing import new_rows, row_write_order, same_view


@dataclass(frozen=True)
class Copies:
    """Which copies the autograd family's propagators leave out (all in every run; no
    option reaches them: tests switch one off to compare with the plain version and
    bench/module_step.py to time it).  Neither changes a value: the same elementwise
    operations run on the same numbers, only where the results are written differs."""

    write_rows: bool = True     # stepped rows go straight into the solver's rows
    adjoint_layout: bool = True  # λ in the linearisations' memory format throughout
    lam_view: bool = True       # the last sweep's λ kept as the row it read, not a clone


class AutogradFamily:
    """A user's modules (a ModuleSteps) as an `mgrit.protocols.StepFamily`: steps and
    vector-Jacobian products from the modules and autograd, layer by layer (the
    fallback for steps that bring no fast path of their own).  Forward states keep the
    caller's layout, adjoint states λ that of the linearisations (`adjoint_layout`);
    the forward keeps f's graphs only in fixed solves (a solve to a tolerance would
    linearise at every sweep)."""

    def __init__(self, steps, owned=(), coarse=None, copies: Copies = Copies()):
        self.steps, self.owned, self.coarse = steps, owned, coarse
        self.n_layers = steps.n_layers
        self.copies = copies

    def adjoint_layout(self, lam):
        """λ as the adjoint solve holds it (its template: the solver's rows take its
        layout): in the memory format linearisations see, so that no state product
        converts λ and λ + h·g adds tensors of one format (`Copies.adjoint_layout`)."""
        return self.steps.layout(lam) if self.copies.adjoint_layout else lam

    @staticmethod
    def to_state(u):
        return u

    from_state = to_state

    def forward_propagator(self, h, average, span, template, keep, fixed=False):
        return ModuleForward(self.steps, h, average, keep if fixed else None, self.owned,
                             self.coarse, self.copies.write_rows)

    def adjoint_propagator(self, h, average, span, state, kept, fixed=False):
        return ModuleAdjoint(self.steps, h, self.n_layers, state, average, self.owned,
                             kept, self.coarse, fixed, self.copies.write_rows,
                             self.copies.lam_view)

    @staticmethod
    def param_grads(adjoint, layers, lam) -> dict:
        """The layers' gradients: the adjoint's last use, so its linearisations (f's
        graphs, with every activation they saved) are let go here, not kept until the
        next backward replaces the propagator."""
        grads = {n: adjoint.param_grads(n, lam(n + 1)) for n in layers}
        adjoint.release()
        return grads


class ModuleForward:
    """Φ: u ← u + H·f(u).  Single-layer steps call the module itself (no parameter
    swap); averaged coarse parameters are computed once per solve.

    With a `keep` dict, finest-level steps asked to save (those of a fixed solve's
    last sweep, at its returned states) run f as a linearisation and leave it in
    keep[layer], so the adjoint need not run f again there; layers in `owned` keep
    their parameters' products too.
    """

    def __init__(self, steps, h: float, average: bool, keep: dict | None = None,
                 owned=(), coarse=None, write_rows: bool = True):
        self.steps, self.h, self.average = steps, h, average
        self.keep, self.owned, self.coarse = keep, set(owned), coarse
        self.write_rows = write_rows
        self._means: dict[tuple[int, int], dict] = {}

    def params(self, start: int, stop: int):
        """Parameters of the step start → stop (None: layer start's own)."""
        if not (self.average and stop - start > 1):
            return None
        key = (start, stop)
        if key not in self._means:
            self._means[key] = self.steps.mean_params(range(start, stop))
        return self._means[key]

    def step(self, u, start: int, stop: int, out=None, plus=None, level: int = 0,
             last: bool = False):
        """Φ(u) [+ plus] for the step start → stop (not last: nothing to keep, the adjoint
        linearises at the converged states); into `out` (not overlapping u unless it is
        u, nor plus) without a copy."""
        h = self.h * (stop - start)
        if last and level == 0 and self.keep is not None and stop - start == 1:
            # linearize holds f(u) to kept_update, as a step does
            lin = self.steps.linearize(u, start, params=start in self.owned)
            self.keep[start] = lin
            return _add(u, lin.y.detach(), h, out, plus)
        c = self.coarse.of(level, start, stop) if self.coarse else None
        if c is not None:
            P = self.params(start, stop) or self.steps.params(start)
            return _finish(self.coarse.steps.step(u, c, P), out, plus)
        y = self.steps.step(u, start, h, self.params(start, stop), out=out)
        return y if plus is None else y.add_(plus)

    def step_many(self, U, starts, stops, out=None, plus=None, level: int = 0,
                  last: bool = False):
        if self.steps.stack and not (last and level == 0 and self.keep is not None) \
                and not (self.coarse and level > 0):
            hs = [self.h * (b - a) for a, b in zip(starts, stops)]
            Ps = [self.params(a, b) for a, b in zip(starts, stops)]
            return _finish(self.steps.step_many(U, list(starts), hs, Ps), out, plus)
        return _rows(self.step, U, starts, stops, out, plus, level, last, self.write_rows)


class ModuleAdjoint:
    """Φᵀ in mirrored time: λ_n = λ_{n+1} + H (∂f/∂u)ᵀ λ_{n+1} at u_n.

    The mirrored step a → b covers forward layers [N−b, N−a) and is linearised
    at u_{N−b} = state(N−b).  Linearisations (f's autograd graph at that state)
    are kept for the whole solve (or come from the forward: `kept`): every cycle
    reuses them, and those of the layers in `owned` keep parameter leaves for
    `param_grads`.

    In a fixed solve (`fixed`) the last sweep steps every layer from the λ the solve
    returns: there an owned layer's step takes its parameters' product in the same
    backward pass (`Linear.vjp_both`), kept with that λ, and `param_grads` uses it
    when its λ is bitwise that one (else it runs the product itself).  The λ kept is
    the tensor the step read, no copy (`lam_view`): a last step's input is a state
    the solve returns, which nothing writes afterwards (`protocols.Propagator`; the
    forward's kept linearisations rely on the same), so a `param_grads` handed that
    same row needs no comparison either.
    """

    def __init__(self, steps, h: float, n_steps: int, state, average: bool, owned,
                 kept: dict | None = None, coarse=None, fixed: bool = False,
                 write_rows: bool = True, lam_view: bool = True):
        self.steps, self.h, self.N, self.state = steps, h, n_steps, state
        self.average, self.owned, self.coarse = average, set(owned), coarse
        self.fixed, self.write_rows, self.lam_view = fixed, write_rows, lam_view
        # the forward's linearisations at these states (ModuleForward.keep)
        self._kept = kept
        self._lin: dict[object, object] = {(n, 1): lin for n, lin in (kept or {}).items()}
        self._grads: dict[int, tuple] = {}    # layer -> (λ_{n+1}, its parameters' product)

    def release(self) -> None:
        """Let go of every linearisation, the forward's kept ones too (a second backward
        through the same forward linearises again)."""
        self._lin.clear()
        self._grads.clear()
        if self._kept is not None:
            self._kept.clear()

    def linear(self, n: int, k: int = 1, level: int = 0):
        """f of the k layers from n (one, or their mean) linearised at u_n; on a coarse
        level the user's coarse g of that step if given."""
        c = self.coarse.of(level, n, n + k) if self.coarse else None
        if c is not None:
            if c not in self._lin:
                P = self.steps.mean_params(c.layers) if self.average else self.steps.params(n)
                self._lin[c] = self.coarse.steps.linearize(self.state(n), c, P,
                                                           self.steps.layout)
            return self._lin[c]
        k = k if self.average else 1
        if (n, k) not in self._lin:
            P = self.steps.mean_params(range(n, n + k)) if k > 1 else None
            self._lin[(n, k)] = self.steps.linearize(self.state(n), n, P,
                                                     params=k == 1 and n in self.owned)
        return self._lin[(n, k)]

    def step(self, lam, a: int, b: int, out=None, plus=None, level: int = 0,
             last: bool = False):
        n = self.N - b
        lin = self.linear(n, b - a, level)
        if last and self.fixed and level == 0 and b - a == 1 and n in self.owned:
            g, grads = lin.vjp_both(lam)
            if grads is not None:
                self._grads[n] = (lam if self.lam_view else lam.clone(), grads)
        else:
            g = lin.vjp_state(lam)
        return _add(lam, g, self.h * (b - a), out, plus)

    def step_many(self, L, starts, stops, out=None, plus=None, level: int = 0,
                  last: bool = False):
        return _rows(self.step, L, starts, stops, out, plus, level, last, self.write_rows)

    def param_grads(self, n: int, lam_next) -> dict:
        """h·(∂f_n/∂θ)ᵀ λ_{n+1}: the loss gradient of layer n's parameters."""
        lam, grads = self._grads.pop(n, (None, None))
        if lam is None or not (self.lam_view and same_view(lam, lam_next)
                               or torch.equal(lam, lam_next)):
            grads = self.linear(n).vjp_params(lam_next)
        return {k: g.mul_(self.h) for k, g in grads.items()}


def _rows(step, U, starts, stops, out, plus, level: int, last: bool, write: bool):
    """step(U[i], starts[i], stops[i]) [+ plus[i]] for the rows i of U, into `out` (or new
    rows laid out as U's).  write: each row goes straight into its place, in an order
    in which no row of U or plus is written over before it is read; without one, or
    without write, the rows are stacked and copied in."""
    order = None
    if write and out is None:                 # new rows: nothing read is written over
        target = new_rows(U[0], U.shape[0])
        order = range(U.shape[0])
    elif write:
        target, order = out, row_write_order(out, before=(U,), after=(plus,))
    if order is None:
        ys = [step(U[i], a, b, level=level, last=last) for i, (a, b) in
              enumerate(zip(starts, stops))]
        return _finish(torch.stack(ys), out, plus)
    Us, outs = U.unbind(0), target.unbind(0)
    pluses = (None,) * len(Us) if plus is None else plus.unbind(0)
    for i in order:
        step(Us[i], starts[i], stops[i], out=outs[i], plus=pluses[i], level=level, last=last)
    return target


def _add(u, y, h: float, out, plus):
    """u + h·y [+ plus], into `out` if given: the operations of `_finish` on
    torch.add(u, y, alpha=h), elementwise, so the same numbers in any layout."""
    y = torch.add(u, y, alpha=h, out=out)
    return y if plus is None else y.add_(plus)


def _finish(y, out, plus):
    """y [+ plus], into `out` if given (y is a fresh tensor)."""
    if plus is not None:
        y.add_(plus)
    return y if out is None else out.copy_(y)
