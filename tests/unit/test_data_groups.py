"""DataParallelOracle over two data groups in one process (a thread per group): the whole
batch's objective and gradient, as one group computes them."""
import threading

import pytest
import torch

from helpers import batch, dense_net
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.data_parallel import DataParallelOracle
from lptrain.train.objective import Objective
from lptrain.train.oracles import Batch, SerialOracle


class Pair:
    """What two threads share for their sums: one slot each, a barrier before and after."""

    def __init__(self):
        self.slots, self.barrier = [None, None], threading.Barrier(2, timeout=30)

    def reduce(self, rank: int, value, add):
        self.slots[rank] = value
        self.barrier.wait()
        total = add(self.slots[0], self.slots[1])
        self.barrier.wait()
        return total


class ThreadGroup:
    """The data exchange of one of two groups (the sums DataParallelOracle makes)."""

    size = 2

    def __init__(self, pair: Pair, rank: int):
        self.pair, self.rank = pair, rank

    def allreduce_sum(self, value: float) -> float:
        return self.pair.reduce(self.rank, float(value), lambda a, b: a + b)

    def allreduce_tensor(self, t: torch.Tensor) -> torch.Tensor:
        return self.pair.reduce(self.rank, t.clone(), lambda a, b: a + b)


def _oracle(net, exchange=None):
    terms = SerialOracle(net, SerialExchange())
    return Objective(terms if exchange is None else DataParallelOracle(terms, exchange), net)


@pytest.mark.parametrize("split", [20, 33])
def test_two_groups_give_the_whole_batch_s_objective_and_gradient(split):
    """Each group's mean loss and gradient weighted by its share of the 50 samples (equal
    and unequal shards) and summed: the one-group values to 1e-13, float64."""
    net, theta = dense_net(layers=6, width=4, scale=0.3)
    x, y = batch(net, n=50)
    whole = _oracle(net)
    whole.begin(Batch(x, y))
    ev = whole.value(theta)
    ref_j, ref_g = ev.point.objective, whole.gradient(ev)
    pair, out = Pair(), {}

    def group(rank: int, lo: int, hi: int) -> None:
        oracle = _oracle(net, ThreadGroup(pair, rank))
        oracle.begin(Batch(x[lo:hi], y[lo:hi], n=50))
        ev = oracle.value(theta)
        out[rank] = (ev.point.objective, oracle.gradient(ev))
    threads = [threading.Thread(target=group, args=(0, 0, split)),
               threading.Thread(target=group, args=(1, split, 50))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(out) == {0, 1}
    for j, g in out.values():
        assert j == pytest.approx(ref_j, rel=1e-13)
        assert float((g - ref_g).norm() / ref_g.norm()) <= 1e-13
