"""The MGRIT solver's protocols (mgrit.protocols): what an Observer is told of the steps,
sums and messages, and the callers that meet the protocols."""
from collections import Counter

import pytest
import torch

from helpers import Counting, batch, dense_net
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel
from lptrain.parallel.propagators import ForwardPropagator


class Seen:
    """An Observer (mgrit.protocols) that logs what it is told."""

    def __init__(self):
        self.steps, self.messages, self.sums = Counter(), [], []
        self.last = Counter()      # states stepped in a last sweep, by level
        self.kernels = []

    def step(self, level, states, last):
        self.steps[level] += states
        self.last[level] += states if last else 0

    def message(self, level, peer, sent):
        self.messages.append((level, peer, sent))

    def sum(self, level, values, itemsize=8):
        assert level == 0
        self.sums.append((values, itemsize))

    def kernel(self, name, states, seconds):
        self.kernels.append((name, states))


class ZeroExchange:
    """Rank `rank` of `size` alone: receives give zeros, sums never converge; logs
    every message (peer, sent)."""

    def __init__(self, rank, size, log=None):
        self.rank, self.size, self.log = rank, size, [] if log is None else log

    def send(self, tensor, dest):
        self.log.append((dest, True))

    def recv(self, template, source):
        self.log.append((source, False))
        return torch.zeros_like(template)

    def wait(self):
        pass

    def allreduce_sums(self, values):
        return [1.0] * len(values)

    def reversed(self):
        return ZeroExchange(self.size - 1 - self.rank, self.size, self.log)


@pytest.mark.parametrize("iters", [1, 3])
@pytest.mark.parametrize("opts", [dict(levels=3, cfactor0=2, cfactor=2),
                                  dict(levels=3, cfactor0=2, cfactor=2, nrelax0=1, cycle="F")],
                         ids=["V", "F-nrelax0"])
def test_the_observer_sees_every_step_sum_and_the_last_sweep_once_per_layer(opts, iters):
    # steps by level = the propagator's calls by step length (1, 2, 4 fine steps); sums =
    # the residual measurements; a fixed solve's last sweep steps each layer once (what the
    # propagator keeps for the adjoint), a solve to a tolerance every level-0 step
    net, theta = dense_net(layers=32, T=3.0, activation="tanh")
    x, y = batch(net)
    for tol in (0.0, 1e-300):
        seen, counted = Seen(), []
        lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange(), observer=seen)
        for solver in (lp.fwd, lp.adj):
            solver.ops.begin = (lambda prop, *a, _b=solver.ops.begin:
                                counted.append(Counting(prop)) or _b(counted[-1], *a))
        res = lp.forward(theta, x, max_iter=iters, tol=tol)
        ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
        _, ares = lp.backward(theta, x, res.states, ev, max_iter=iters, tol=tol)
        by_length = sum((c.steps for c in counted), Counter())
        assert dict(seen.steps) == {l: by_length[2 ** l] for l in range(3)}
        # the residual measurements (2 floats), then LayerParallel's own: loss and hits
        # after the forward, the gradient after the adjoint
        assert res.history and ares.history
        assert seen.sums == [(2, 8)] * len(res.history) + [(1, 8)] * 2 + \
            [(2, 8)] * len(ares.history) + [(theta.numel(), 8)]
        assert not seen.messages and not seen.kernels
        assert seen.last[0] == (2 * 32 if tol == 0 else seen.steps[0])
        assert seen.last[1] == seen.last[2] == 0


def test_the_observer_sees_every_message_with_its_level():
    # rank 1 of 3 alone (zeros received): each message the exchange carries, in order,
    # with the level whose neighbour it goes to or comes from
    net, theta = dense_net(layers=32, T=3.0, activation="tanh")
    x, _ = batch(net)
    seen, ex = Seen(), ZeroExchange(1, 3)
    lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=2, cfactor=2), ex, observer=seen)
    lp.forward(theta, x, max_iter=2, tol=0.0)
    assert [(peer, sent) for _, peer, sent in seen.messages] == ex.log and ex.log
    hier, levels = lp.hier, {level for level, _, _ in seen.messages}
    assert levels == {0, 1, 2}
    for level, peer, sent in seen.messages:
        assert peer == (hier.right(level, 1) if sent else hier.left(level, 1))


def test_the_observer_sees_the_adjoint_s_messages_in_the_group_s_numbering():
    # the adjoint solver's exchange numbers rank r as 2 − r (mirrored); its observer is
    # told the layer group's ranks: adjoints go left (to 0), come from the right (2), as
    # does u_hi, the next rank's first state, at level 0
    net, theta = dense_net(layers=32, T=3.0, activation="tanh")
    x, y = batch(net)
    seen, ex = Seen(), SummingZeroExchange(1, 3)
    lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=2, cfactor=2), ex, observer=seen)
    res = lp.forward(theta, x, max_iter=2, tol=0.0)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    seen.messages.clear()
    lp.backward(theta, x, res.states, ev, max_iter=2, tol=0.0)
    assert seen.messages[:2] == [(0, 0, True), (0, 2, False)]      # u_lo out, u_hi in
    assert {level for level, _, _ in seen.messages[2:]} == {0, 1, 2}
    assert all(peer == (0 if sent else 2) for _, peer, sent in seen.messages)


class SummingZeroExchange(ZeroExchange):
    """ZeroExchange with the sums of loss, hits and the gradient (this rank's own)."""

    def allreduce_sum(self, value):
        return value

    def allreduce_tensor(self, tensor):
        return tensor

    def reversed(self):
        return SummingZeroExchange(self.size - 1 - self.rank, self.size, self.log)


def test_the_solver_s_callers_meet_its_protocols():
    # what the solver is given: the exchanges and propagators of parallel/ (both modules'
    # and the network's), the counting wrapper of the tests and bench/, and this file's
    # stand-ins
    from lptrain.mgrit.protocols import Exchange, Observer, Propagator
    from lptrain.parallel.module_propagators import ModuleAdjoint, ModuleForward
    from lptrain.parallel.propagators import AdjointPropagator
    net, theta = dense_net(layers=4)
    fwd = ForwardPropagator(net.stepper(theta), net.h)
    adj = AdjointPropagator(net.stepper(theta), net.h, 4, lin=None)
    for prop in (fwd, adj, Counting(fwd), ModuleForward(None, 1.0, False),
                 ModuleAdjoint(None, 1.0, 4, None, False, ())):
        assert isinstance(prop, Propagator)
    assert isinstance(SerialExchange(), Exchange) and isinstance(Seen(), Observer)
    from lptrain.model_perf.record import Recorder
    from lptrain.model_perf.scripted import ScriptedExchange
    from lptrain.parallel.layer_parallel import Mirrored
    assert isinstance(ScriptedExchange(0, 2), Exchange)
    assert all(isinstance(o, Observer) for o in (Recorder(), Mirrored(Seen(), 2)))
    assert not isinstance(ZeroExchange(0, 2), Exchange)    # no sums of tensors
