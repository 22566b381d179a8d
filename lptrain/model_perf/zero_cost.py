"""The network at zero cost: its stepper's kernels give zeros, and every kernel call is
reported to an observer (`mgrit.protocols.Observer.kernel`).

What record.py needs of the network while it runs the real optimizer iteration: the
stepper's kernels (names: measure.py) return zeros of their result's shape instead
of computing, the opening, classifier and regulariser compute (they are cheap and give
the loss); weights and everything else are the real network's.  The serial sweeps
(model/serial.py) are the stepper's kernels too: each is one call of N layers, which
measure.py times by running the sweep as the serial oracle does.  Each call is told to
the observer with the states it was on (stacked intervals count each) and its own
time, which the observer keeps apart from the time spent around the kernels.
"""
from __future__ import annotations

import time

import torch


class ZeroCostNetwork:
    """`net` whose kernels report to `observer`; a state of the recorded batch has
    `state_numel` elements (a tensor of m states: m, at least 1)."""

    def __init__(self, net, observer, state_numel: int):
        self._net, self._report = net, _Reporter(observer, state_numel)

    def __getattr__(self, name):
        return getattr(self._net, name)

    def stepper(self, theta):
        return ZeroCostStepper(self._net.stepper(theta), self._report,
                               len(self._net.state_dims(1)))

    def opening(self, theta, y):
        return self._report("opening", y, self._net.opening, theta, y)

    def opening_vjp(self, theta, y, lam0, grad):
        return self._report("opening_vjp", y, self._net.opening_vjp, theta, y, lam0, grad)

    def classify(self, theta, uN, labels, n_total, want_grad):
        return self._report("classify_grad" if want_grad else "classify", uN,
                            self._net.classify, theta, uN, labels, n_total, want_grad)

    def regulariser(self, theta, grad=None):
        name = "regulariser" if grad is None else "regulariser_grad"
        return self._report(name, torch.empty(0), self._net.regulariser, theta, grad)


class ZeroCostStepper:
    """A stepper whose kernels give zeros of their result's shape; weights and
    everything else are the real stepper's."""

    def __init__(self, real, report: "_Reporter", state_dims: int):
        self._real, self._report = real, report
        self._state_dims = state_dims      # dims of one state; one more: a stack of them
        self.act = ZeroCostActivation(real.act, report)

    def sweep(self, states, saved, h: float) -> None:
        """The serial forward sweep (model/serial.py `propagate`): one kernel of N
        layers, serial_forward (serial_forward_nosave when it keeps no activations)."""
        name = "serial_forward" if saved is not None else "serial_forward_nosave"
        self._report(name, states[1:], _zeros, states[1:], states[1:])

    def adjoint_sweep(self, states, saved, lamN, h: float):
        """The serial adjoint sweep (model/serial.py `adjoint`): one kernel of N layers,
        serial_adjoint; (λ_0, gK, gb) zeros."""
        def zeros():
            return (torch.zeros_like(lamN), torch.zeros_like(self._real.K),
                    torch.zeros_like(self._real.b))
        return self._report("serial_adjoint", states[1:], zeros)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def step(self, u, n: int, h: float, save=None, out=None):
        K, b = self._real.weights(n)
        return self.apply(u, K, b, h, save, out)

    def apply(self, u, K, b, h, save=None, out=None, plus=None):
        return self._report(apply_kernel(save, plus), u, _zeros, u, out)

    def linearize(self, u, *args):
        return self._report("linearize", u, _zeros, u, None)

    def vjp_saved(self, saved, lam, K, h, out=None):
        return self._report("vjp_saved", lam, _zeros, lam, out)

    def vjp_and_g(self, saved, lam, K, h, out=None):
        return self._report("vjp_and_g", lam, lambda: (_zeros(lam, out), _zeros(lam)))

    def vjp_from_g(self, g, lam, K, h, out=None):
        return self._report("vjp_from_g", lam, _zeros, lam, out)

    def vjp_weights(self, u, g, K=None):
        def zeros():
            m = (u.shape[0],) if u.dim() > self._state_dims else ()   # stacked
            return (u.new_zeros((*m, *self._real.K.shape[1:])),
                    u.new_zeros((*m, *self._real.b.shape[1:])))
        return self._report("vjp_weights", u, zeros)


def apply_kernel(save, plus) -> str:
    """The kernel name of a stepper.apply call (measure.py's table): apply, with
    _save when it keeps activations, _plus when it adds a state."""
    return "apply" + ("_save" if save is not None else "") + \
        ("_plus" if plus is not None else "")


class ZeroCostActivation:
    """The activation with its one kernel of the adjoint sweeps (f′ ⊙ λ) at zero cost."""

    def __init__(self, real, report: "_Reporter"):
        self._real, self._report = real, report

    def __getattr__(self, name):
        return getattr(self._real, name)

    def vjp(self, saved, lam, out=None):
        return self._report("act_vjp", lam, _zeros, lam, out)


class _Reporter:
    """Runs a kernel and tells the observer: its name, states and CPU seconds."""

    def __init__(self, observer, state_numel: int):
        self.observer, self.state_numel = observer, state_numel

    def __call__(self, name: str, t: torch.Tensor, fn, *args, **kw):
        t0 = time.thread_time()
        out = fn(*args, **kw)
        self.observer.kernel(name, max(t.numel() // self.state_numel, 1),
                             time.thread_time() - t0)
        return out


def _zeros(like: torch.Tensor, out=None) -> torch.Tensor:
    return torch.zeros_like(like) if out is None else out.zero_()
