"""The stall rule: patience in iterations (full batch) or epochs (mini-batches)."""
import pytest

from lptrain.train.stall import NO_STEP, StallRule


def test_patience_counts_iterations_without_a_new_best():
    p = StallRule(patience=3)
    for j in (5.0, 4.0, 4.0, 4.5, 3.9, 3.95, 3.9):
        assert p.update(j) is None
    assert p.update(3.91) is not None and "3 iterations" in p.stalled


def test_exhausted_line_search_stalls_at_once():
    p = StallRule(patience=100)
    assert p.update(1.0) is None
    assert "steepest descent" in p.update(1.0, exhausted=True)


def test_zero_patience_never_stalls_on_a_flat_objective():
    p = StallRule(patience=0)
    assert all(p.update(1.0) is None for _ in range(50))


def test_zero_patience_never_stalls_with_mini_batches():
    """train.patience=0 turns the rule off with mini-batches too (it had become two
    epochs)."""
    p = StallRule(patience=0, batches_per_epoch=4)
    assert all(p.update(1.0) is None for _ in range(50))


def test_mini_batches_compare_epoch_means():
    # 4 batches an epoch, patience 5 iterations -> 2 epochs; noisy batches whose epoch
    # mean keeps falling never stall, a flat epoch mean stalls after two epochs
    p = StallRule(patience=5, batches_per_epoch=4)
    assert p.patience == 2
    for epoch in range(6):
        for j in (3.0, 1.0, 2.5, 0.5):
            assert p.update(j - 0.1 * epoch) is None
    for _ in range(2 * 4 - 1):
        assert p.update(5.0) is None
    # the best is an epoch's mean, not an objective the run reached (read as one, it
    # contradicted a final objective below it)
    assert p.update(5.0).endswith("for 2 epochs (best epoch mean 1.25)")


def test_the_last_whole_epochs_mean_is_kept_and_carried_on():
    """What a sweep ranks a mini-batch run by: one batch's objective named the worst of
    three jobs by validation the best (held-out, stop 64)."""
    p = StallRule(patience=0, batches_per_epoch=3)
    for j in (3.0, 1.0, 2.0, 0.5):
        p.update(j)
    assert p.last_epoch == 2.0                      # the part of the next epoch: not yet
    q = StallRule(patience=0, batches_per_epoch=3)
    q.load_state_dict(p.state_dict())               # a resume
    for j in (0.7, 0.3):
        q.update(j)
    assert q.last_epoch == pytest.approx(0.5)
    old = {k: v for k, v in p.state_dict().items() if k != "last_epoch"}
    q.load_state_dict(old)                          # a checkpoint from before stop 64
    assert q.last_epoch is None
    full = StallRule(patience=3)
    full.update(1.0)
    assert full.last_epoch is None


def test_an_epochs_mean_weighs_each_batch_by_its_samples():
    """Batches of 9 and 1 sample: the remainder batch's objective had counted as much as
    the full one's (held-out: 1.318 where the epoch's samples give 1.454)."""
    from lptrain.train.stall import epoch_mean
    p = StallRule(patience=0, batches_per_epoch=2)
    p.update(1.14857, samples=1)
    p.update(1.48806, samples=9)
    assert p.last_epoch == pytest.approx((1.14857 + 9 * 1.48806) / 10)
    assert epoch_mean([(0.1, 3), (0.2, 3), (0.4, 3)]) == (0.1 + 0.2 + 0.4) / 3  # to the bit
    # a checkpoint of objectives alone (older code): their samples are not known, so the
    # epoch that spans the resume takes the plain mean (held-out: weights of 1 beside 30)
    q = StallRule(patience=0, batches_per_epoch=2)
    q.load_state_dict({"best": 1.0, "since": 0, "epoch": [1.0]})
    q.update(2.0, samples=30)
    assert q.last_epoch == 1.5
    r = StallRule(patience=0, batches_per_epoch=2)   # and one of this form
    mid = StallRule(patience=0, batches_per_epoch=2)
    mid.update(1.0, samples=3)
    state = mid.state_dict()
    assert state["epoch"] == [1.0] and state["epoch_samples"] == [3]   # old code reads it
    r.load_state_dict(state)
    r.update(2.0, samples=1)
    assert r.last_epoch == pytest.approx(1.25)


def test_one_iteration_without_progress_is_one_not_ones():
    p = StallRule(patience=1)
    p.update(1.0)
    assert p.update(2.0).startswith("the objective has not decreased for 1 iteration (")


def test_a_stalled_run_resumed_gets_its_patience_afresh():
    """Resumed, a stalled run stopped again after one iteration while its note said it
    trains on."""
    p = StallRule(patience=2)
    for j in (1.0, 2.0, 2.0):
        stalled = p.update(j)
    assert stalled
    q = StallRule(patience=2)
    q.load_state_dict(p.state_dict())
    assert q.update(2.0) is None and q.best == 1.0
    assert q.update(2.0)


@pytest.mark.parametrize("optimizer, mode, why", [
    ("lbfgs", "serial", "flat"), ("sgd", "serial", "flat"), ("adam", "serial", "flat"),
    ("lbfgs", "serial", NO_STEP), ("lbfgs", "simultaneous", NO_STEP)])
def test_the_stall_hint_names_options_the_optimizer_has(optimizer, mode, why):
    """The hint of a serial run's stall message named optimizer.gtol for SGD and Adam,
    which refuse that key; a line search that found no step at iteration 1 (a large
    gradient) was told the optimum may be reached, or (simultaneous, exact solves
    already tried) to try mode=mgrit, where raising optimizer.max_ls lets it train."""
    import re

    from lptrain.app import _stall_message
    from lptrain.config import compose
    from lptrain.train.loop import Outcome
    opts, _ = compose([f"optimizer={optimizer}", f"mode={mode}"])
    outcome = Outcome(iterations=9, objective=1.0, loss=1.0, accuracy=0.5, val_loss=1.0,
                      val_accuracy=0.5, best_val_accuracy=0.5, wall_time=1.0,
                      converged=False, stalled=why)
    message = _stall_message(opts, outcome)
    assert ("optimizer.max_ls" in message) == (why == NO_STEP)
    # the patience has nothing to do with a line search that found no step
    assert ("train.patience" in message) == (why != NO_STEP)
    assert ("mode=mgrit" in message) == (why != NO_STEP and mode == "simultaneous")
    named = re.findall(r"optimizer\.(\w+)", _stall_message(opts, outcome))
    assert named and all(hasattr(opts.optimizer, key) for key in named), named


def test_a_stall_at_a_huge_layer_step_names_the_step():
    """network.T=1e4 on 64 layers (h = 156) stalled at iteration 1 with J 424, and was
    told the optimum may be reached (held-out check)."""
    from lptrain.app import _stall_message
    from lptrain.config import compose
    from lptrain.train.loop import Outcome
    outcome = Outcome(iterations=1, objective=424.0, loss=424.0, accuracy=0.1, val_loss=1.0,
                      val_accuracy=0.1, best_val_accuracy=0.1, wall_time=1.0,
                      converged=False, stalled=NO_STEP)
    for T, said in ((1e4, True), (5.0, False)):
        opts, _ = compose(["network.layers=64", f"network.T={T}"])
        message = _stall_message(opts, outcome)
        assert ("a layer step network.T / N = 156 is large for forward Euler: more layers "
                "or a smaller network.T" in message) == said


@pytest.mark.parametrize("optimizer, control, knob", [
    ("sgd", "error", "mgrit.grad_tol"), ("adam", "fixed", "mgrit.fwd_iters/adj_iters"),
    ("lbfgs", "error", "mgrit.grad_tol")])
def test_a_one_shot_stall_keeps_the_optimizers_hint(optimizer, control, knob):
    """An SGD one-shot run that stalled as serial and mgrit runs of it did was told only
    to raise mgrit.fwd_iters/adj_iters, which the error-controlled plan overrides and
    which changed nothing (held-out check): the optimizer's hint comes first, then the
    one-shot knob that sets its iterations."""
    from lptrain.app import _stall_message
    from lptrain.config import compose
    from lptrain.train.loop import Outcome
    opts, _ = compose([f"optimizer={optimizer}", "mode=simultaneous",
                       f"mgrit.control={control}"])
    outcome = Outcome(iterations=300, objective=1.0, loss=1.0, accuracy=0.5, val_loss=1.0,
                      val_accuracy=0.5, best_val_accuracy=0.5, wall_time=1.0,
                      converged=False, stalled="flat")
    message = _stall_message(opts, outcome)
    first = "optimizer.gtol" if optimizer == "lbfgs" else "optimizer.lr"
    assert first in message and knob in message
    assert message.index("train.patience") < message.index(first) < message.index(knob)
    assert ("grad_tol" in message) == (control == "error")
