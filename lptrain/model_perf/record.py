"""One optimizer iteration of a mode on one layer group, recorded by running the real code.

For every rank of a layer group of `layer` ranks, the training oracle of the mode as
app.py builds it (train/oracles.py, oneshot.py; data_parallel.py for `data` > 1 groups;
objective.py) runs two optimizer iterations — `value` then `gradient` — on a batch of
the group's shard size, with

- a recording network: its stepper's kernels are logged (which kernel, how many states
  stacked in the call) and return zeros instead of computing; the opening, classifier
  and regulariser are logged and computed;
- recording exchanges: sends and receives are logged (a receive gives zeros), and so
  are the sums, the layer group's and the data groups'.  The solvers' residual-norm
  sums are scripted: a solve to a tolerance stops after the cycles asked for.

Ranks run one after the other in this process: a rank only ever waits for messages,
and zeros do as well as states (the control flow depends on nothing else), so its log
is what it does on P ranks.  What the rank computes outside the logged calls (the
solver's vector work, the Python around every call: `Glue`) is timed as it runs, in
this thread's CPU time, and logged before the next message or sum.  The second
iteration, warm as every later one, is kept: its `value` and `gradient` apart (each
ends in sums every rank waits for).  The record is exactly what training calls, so a
change to the solver, the oracles or the adjoint changes the model with it.  Kernels
are charged their measured costs elsewhere (predict.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Union

import torch

from lptrain.errors import LptrainError
from lptrain.modes import MGRIT, SIMULTANEOUS

LAYER, DATA = "layer", "data"     # which ranks a sum is over


class RecordingError(LptrainError):
    """A recorded iteration did not do what was asked (cycles per solve)."""


@dataclass(frozen=True)
class Kernel:
    """`calls` calls of kernel `name`, each on `states` states (stacked intervals)."""

    name: str
    states: int = 1
    calls: int = 1


@dataclass(frozen=True)
class Glue:
    """CPU seconds the rank computed outside the logged calls since its last op."""

    seconds: float


@dataclass(frozen=True)
class Send:
    """A non-blocking send of `states` states to layer rank `peer`."""

    peer: int
    states: int = 1


@dataclass(frozen=True)
class Recv:
    """A blocking receive of `states` states from layer rank `peer`."""

    peer: int
    states: int = 1


@dataclass(frozen=True)
class Allreduce:
    """A sum of `nbytes`: over the layer group (every rank waits for the last) or over
    the data groups (the same rank of every group, all alike: a delay)."""

    nbytes: int
    group: str = LAYER


Op = Union[Kernel, Glue, Send, Recv, Allreduce]
Schedule = tuple  # schedule[rank]: that rank's ops in program order


@dataclass(frozen=True)
class Record:
    """One optimizer iteration: an objective evaluation and a gradient, per layer rank."""

    value: Schedule
    gradient: Schedule
    layer: int
    data: int

    def kernels(self) -> set[tuple[str, int]]:
        """(kernel, states per call) of every kernel call in the record."""
        return {(op.name, op.states) for part in (self.value, self.gradient)
                for ops in part for op in ops if isinstance(op, Kernel)}


def record_iteration(net, mode: str, mgrit_opts, layer: int = 1, data: int = 1,
                     fwd: int = 1, adj: int = 1, mini_batches: bool = False,
                     dtype=torch.float64, batch: int = 2) -> Record:
    """The optimizer iteration of `mode` on a layer group of `layer` ranks (of `data`
    groups) on a shard of `batch` samples: mode=mgrit solves stop after fwd / adj
    cycles, mode=simultaneous runs them.

    Raises SolverError (as training would) for more layer ranks than C-intervals.
    """
    if mode == SIMULTANEOUS:
        mgrit_opts = replace(mgrit_opts, control="fixed", fwd_iters=fwd, adj_iters=adj,
                             adaptive=False, calibrate_every=0)
    theta = net.init_params(0, dtype, "cpu")
    x = torch.randn((batch, *net.in_shape), generator=torch.Generator().manual_seed(0),
                    dtype=dtype)
    y = torch.arange(batch) % net.n_classes
    value, gradient = [], []
    for r in range(layer):
        log = _Log(math.prod(net.state_dims(batch)))
        ex, data_ex, rec_net = _Exchange(log, r, layer, LAYER), None, _Network(net, log)
        if data > 1:
            data_ex = _Exchange(log, 0, data, DATA)
        oracle = iteration_oracle(rec_net, mode, mgrit_opts, ex, data_ex, mini_batches)
        for kept in (False, True):
            ex.script(fwd if mode == MGRIT else None)
            ex.twin.script(adj if mode == MGRIT else None)
            log.begin(kept)
            ev = value_of(oracle, theta, x, y)
            value_ops = log.end()
            log.begin(kept)
            gradient_of(oracle, ev)
            gradient_ops = log.end()
        if mode != "serial":
            _check(mode, mgrit_opts, net.opts.layers, layer, fwd, ex.checks, adj,
                   ex.twin.checks)
        value.append(tuple(value_ops))
        gradient.append(tuple(gradient_ops))
    return Record(tuple(value), tuple(gradient), layer, data)


def iteration_oracle(net, mode: str, mgrit_opts, exchange, data_exchange=None,
                     mini_batches: bool = False):
    """A rank's training oracle as app.py builds it: the mode's data terms on the layer
    group's `exchange`, summed over the data groups (`data_exchange`, None: one group),
    and the regulariser."""
    from lptrain.train.data_parallel import DataParallelOracle
    from lptrain.train.objective import Objective
    from lptrain.train.terms import make_oracle
    terms = make_oracle(SimpleNamespace(name=mode, warm_batches=1), net, exchange, mgrit_opts,
                        mini_batches)
    if data_exchange is not None:
        terms = DataParallelOracle(terms, data_exchange)
    return Objective(terms, net)


def value_of(oracle, theta, x, y):
    """The objective evaluation that opens an optimizer iteration on the batch (x, y)."""
    from lptrain.train.oracles import Batch
    oracle.begin(Batch(x, y, 0, x.shape[0]))
    return oracle.value(theta)


def gradient_of(oracle, ev):
    """The gradient of the evaluation `ev`, accepted."""
    grad = oracle.gradient(ev)
    oracle.accept(ev)
    return grad


def _check(mode: str, mgrit_opts, n_layers: int, layer: int, fwd: int, fwd_checks: int,
           adj: int, adj_checks: int) -> None:
    """The solves did the cycles asked for: a warm solve of k cycles measures its
    residual k + 1 times (none with one level)."""
    hier = mgrit_opts.hierarchy(n_layers, layer)
    if len(hier.levels) < 2:
        want = (0, 0)
    else:
        want = (min(fwd, mgrit_opts.max_iter) + 1, min(adj, mgrit_opts.adjoint_max_iter) + 1)
    if (fwd_checks, adj_checks) != want:
        raise RecordingError(f"mode={mode}: asked for {fwd} forward and {adj} adjoint "
                             f"cycles, the solves measured their residual {fwd_checks} and "
                             f"{adj_checks} times (expected {want[0]} and {want[1]})")


class _Log:
    """A rank's ops as they happen, between begin() and end() (nothing unless kept).

    Consecutive calls of one kernel on as many states merge; the CPU time spent
    outside logged calls accumulates and goes in as one Glue before the next message
    or sum (where it falls among the kernels between two of those does not matter).
    """

    def __init__(self, state_numel: int):
        self.state_numel, self.target = state_numel, None
        self.glue, self.mark = 0.0, time.thread_time()

    def states(self, t: torch.Tensor) -> int:
        return max(t.numel() // self.state_numel, 1)

    def begin(self, kept: bool) -> None:
        self.target = [] if kept else None
        self.glue, self.mark = 0.0, time.thread_time()

    def end(self) -> list:
        self._pause()
        self._flush()
        ops, self.target = self.target, None
        return ops

    def _pause(self) -> None:
        now = time.thread_time()
        self.glue += now - self.mark
        self.mark = now

    def _flush(self) -> None:
        if self.target is not None and self.glue > 0:
            self.target.append(Glue(self.glue))
        self.glue = 0.0

    def add(self, op: Op) -> None:
        """Log a message or sum (instantaneous here)."""
        self._pause()
        self._flush()
        if self.target is not None:
            self.target.append(op)
        self.mark = time.thread_time()

    def call(self, name: str, t: torch.Tensor, fn, *args, **kw):
        """Log kernel `name` on t's states and return fn(*args, **kw), its time not glue."""
        self._pause()
        out = fn(*args, **kw)
        if self.target is not None:
            op, last = Kernel(name, self.states(t)), self.target[-1] if self.target else None
            if isinstance(last, Kernel) and (last.name, last.states) == (op.name, op.states):
                op = Kernel(op.name, op.states, last.calls + 1)
                self.target.pop()
            self.target.append(op)
        self.mark = time.thread_time()
        return out


class _Exchange:
    """A rank's exchange that logs instead of sending (see the module docstring).

    `mirror`: the adjoint's view (rank r is addressed as size−1−r); logged peers are
    layer ranks.  `script(k)`: the residual-norm sums of the next solve report
    convergence at the check after k cycles (None: never, a fixed solve's case).
    """

    def __init__(self, log: _Log, rank: int, size: int, group: str, mirror: bool = False):
        self.log, self.size, self.group, self.mirror = log, size, group, mirror
        self.rank = self._map(rank)
        self._twin = None
        self.script(None)

    def _map(self, r: int) -> int:
        return self.size - 1 - r if self.mirror else r

    @property
    def twin(self) -> "_Exchange":
        return self.reversed()

    def reversed(self) -> "_Exchange":
        if self._twin is None:
            self._twin = _Exchange(self.log, self._map(self.rank), self.size, self.group,
                                   not self.mirror)
            self._twin._twin = self
        return self._twin

    def script(self, cycles: int | None) -> None:
        self.cycles, self.checks = cycles, 0

    def send(self, tensor, dest: int) -> None:
        self.log.add(Send(self._map(dest), self.log.states(tensor)))

    def recv(self, template, source: int):
        self.log.add(Recv(self._map(source), self.log.states(template)))
        return torch.zeros_like(template)

    def wait(self) -> None:
        pass

    def allreduce_sum(self, value: float) -> float:
        self.log.add(Allreduce(8, self.group))
        return float(value)

    def allreduce_sums(self, values) -> list[float]:
        """The residual norm's sums (the solver's only use): 1 until the scripted stop."""
        self.log.add(Allreduce(8 * len(values), self.group))
        self.checks += 1
        stop = self.cycles is not None and self.checks > self.cycles
        return [0.0 if stop else 1.0] + [1.0] * (len(values) - 1)

    def allreduce_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        self.log.add(Allreduce(tensor.numel() * tensor.element_size(), self.group))
        return tensor


class _Network:
    """The network with its kernels logged: the stepper's (see _Stepper), the opening,
    classifier and regulariser (computed)."""

    def __init__(self, net, log: _Log):
        self._net, self._log = net, log

    def __getattr__(self, name):
        return getattr(self._net, name)

    def stepper(self, theta):
        return _Stepper(self._net.stepper(theta), self._log, len(self._net.state_dims(1)))

    def opening(self, theta, y):
        return self._log.call("opening", y, self._net.opening, theta, y)

    def opening_vjp(self, theta, y, lam0, grad):
        return self._log.call("opening_vjp", y, self._net.opening_vjp, theta, y, lam0, grad)

    def classify(self, theta, uN, labels, n_total, want_grad):
        return self._log.call("classify_grad" if want_grad else "classify", uN,
                              self._net.classify, theta, uN, labels, n_total, want_grad)

    def regulariser(self, theta, grad=None):
        name = "regulariser" if grad is None else "regulariser_grad"
        return self._log.call(name, torch.empty(0), self._net.regulariser, theta, grad)


class _Stepper:
    """A stepper whose kernels are logged and give zeros of their result's shape
    (names: measure.py); weights and everything else are the real stepper's."""

    def __init__(self, real, log: _Log, state_dims: int):
        self._real, self._log = real, log
        self._state_dims = state_dims      # dims of one state; one more: a stack of them
        self.act = _Activation(real.act, log)

    sweep = None     # a serial sweep steps layer by layer here, each step logged

    def __getattr__(self, name):
        return getattr(self._real, name)

    def step(self, u, n: int, h: float, save=None, out=None):
        K, b = self._real.weights(n)
        return self.apply(u, K, b, h, save, out)

    def apply(self, u, K, b, h, save=None, out=None, plus=None):
        name = "apply" + ("_save" if save is not None else "") + \
            ("_plus" if plus is not None else "")
        return self._log.call(name, u, _zeros, u, out)

    def linearize(self, u, *args):
        return self._log.call("linearize", u, _zeros, u, None)

    def vjp_saved(self, saved, lam, K, h, out=None):
        return self._log.call("vjp_saved", lam, _zeros, lam, out)

    def vjp_and_g(self, saved, lam, K, h, out=None):
        return self._log.call("vjp_and_g", lam, lambda: (_zeros(lam, out), _zeros(lam)))

    def vjp_from_g(self, g, lam, K, h, out=None):
        return self._log.call("vjp_from_g", lam, _zeros, lam, out)

    def vjp_weights(self, u, g, K=None):
        def zeros():
            m = (u.shape[0],) if u.dim() > self._state_dims else ()   # stacked
            return (u.new_zeros((*m, *self._real.K.shape[1:])),
                    u.new_zeros((*m, *self._real.b.shape[1:])))
        return self._log.call("vjp_weights", u, zeros)


class _Activation:
    """The activation with its one kernel of the adjoint sweeps (f′ ⊙ λ) logged."""

    def __init__(self, real, log: _Log):
        self._real, self._log = real, log

    def __getattr__(self, name):
        return getattr(self._real, name)

    def vjp(self, saved, lam, out=None):
        return self._log.call("act_vjp", lam, _zeros, lam, out)


def _zeros(like: torch.Tensor, out=None) -> torch.Tensor:
    return torch.zeros_like(like) if out is None else out.zero_()
