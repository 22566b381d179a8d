"""The run's wall time and the console's elapsed clock are one time, every validation in
it, the last one too, and the clock never goes back. (Held out: Fashion-MNIST's final
validation of 10,000 images ran while the display ticked on to 1:02 elapsed; then the
last line, set to train/wall_time, said 0:48, the time before that validation.)"""
import io
import types

from helpers import MemoryWriter
from lptrain.app import build
from lptrain.config import compose
from lptrain.metrics.console import Console
from lptrain.train import loop

VALIDATION_S = 100.0     # one validation on the test's clock; the iterations take none


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_wall_time_holds_every_validation_and_the_clock_never_goes_back(
        monkeypatch, plain_env):
    clock = Clock()
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=clock))
    opts, _ = compose(["train.iterations=3", "eval_every=2", "network.layers=4",
                       "dataset.n_train=40", "dataset.n_val=10"])
    ex, data, net, theta, oracle, opt = build(opts, None)
    out, shown = io.StringIO(), []
    console = Console(True, 3, "peaks", file=out, clock=clock)
    validate = oracle.validate

    def validating(*args):
        shown.append(console._position(now=clock.now) if console._iteration else None)
        clock.now += VALIDATION_S
        shown.append(console._position(now=clock.now) if console._iteration else None)
        return validate(*args)

    monkeypatch.setattr(oracle, "validate", validating)
    writer = MemoryWriter()
    loop.train(theta, opt, oracle, data, opts, writer, console, ex)
    # validations before iteration 1, after 2 and after 3 (the last)
    assert [r["wall_time"] for r in writer.train] == [100.0, 200.0, 300.0]
    assert shown == [None, None,         # before iteration 1: the console's own clock
                     "1/3  0:01:40 elapsed  validating", "1/3  0:03:20 elapsed  validating",
                     "2/3  0:03:20 elapsed  validating", "2/3  0:05:00 elapsed  validating"]
    last = [ln for ln in out.getvalue().splitlines() if ln.startswith("3/3")][-1]
    assert last.startswith("3/3  0:05:00 elapsed  eta 0:00:00"), last
