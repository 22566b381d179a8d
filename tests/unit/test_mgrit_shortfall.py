"""mode=mgrit promises exact gradients: a solve that stops at mgrit.max_iter above its
tolerance is said (once) and counted in metrics.h5, instead of a run that reports
`completed` with gradients off by 1e-3 and nothing in the run noticing."""
import logging

from helpers import composed
from lptrain import app
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

TINY = ["mode=mgrit", "network.layers=8", "network.width=4", "dataset.n_train=100",
        "dataset.n_val=20", "mgrit.levels=2", "mgrit.cfactor0=2", "train.iterations=3"]
# the default network's shape and hierarchy
DEFAULT_NET = ["network.layers=32", "network.width=8", "mgrit.levels=3", "mgrit.cfactor0=4"]


def _run(tmp_path, caplog, *overrides):
    with caplog.at_level(logging.INFO, logger="lptrain"):
        app.run(composed(*TINY, *overrides), None, tmp_path)
    said = [m for m in caplog.messages if "stopped at mgrit.max_iter" in m]
    return read_metrics(tmp_path / ms.FILE_NAME).mgrit["unconverged"], said


def test_solves_cut_short_are_said_once_and_counted(tmp_path, caplog):
    counts, said = _run(tmp_path, caplog, "mgrit.max_iter=1")
    assert list(counts) == [2, 2, 2]            # the forward and the adjoint of each
    assert len(said) == 1 and said[0].startswith("iteration 1: 2 MGRIT solve(s) ")


def test_converged_solves_count_none(tmp_path, caplog):
    counts, said = _run(tmp_path, caplog)
    assert list(counts) == [0, 0, 0] and said == []


def test_one_shot_solves_are_inexact_by_design(tmp_path, caplog):
    counts, said = _run(tmp_path, caplog, "mode=simultaneous")
    assert list(counts) == [0, 0, 0] and said == []


def test_solves_without_a_tolerance_are_never_short(tmp_path, caplog):
    """tol = rtol = 0 asks for exactly max_iter iterations: every solve was counted."""
    counts, said = _run(tmp_path, caplog, "mgrit.tol=0", "mgrit.rtol=0", "mgrit.max_iter=2")
    assert list(counts) == [0, 0, 0] and said == []


def test_solves_stagnated_at_round_off_are_not_told_to_iterate_more(tmp_path, caplog):
    """float32 with a large T: the forward residual sits at round-off above mgrit.tol,
    and the advice was 'raise mgrit.max_iter', which only cost time."""
    counts, _ = _run(tmp_path, caplog, *DEFAULT_NET, "dtype=float32", "network.T=100",
                     "mgrit.max_iter=20")
    assert counts[0] >= 1
    text = "\n".join(caplog.messages)
    assert "stagnated at float32's round-off: raise mgrit.tol or use dtype=float64" in text
    assert "raise mgrit.max_iter" not in text


def test_a_float64_run_is_not_told_to_use_float64(tmp_path, caplog):
    """A custom step with noise below the build check's stalled mode=mgrit's solves at
    6e-4 in float64, and the advice was 'use dtype=float64' (held-out check)."""
    from lptrain.train.notes import _stall_advice
    assert not any("dtype=float64" in line for custom in (False, True)
                   for line in _stall_advice("float64", custom))
    assert "deterministic" in " ".join(_stall_advice("float64", True))
    assert "deterministic" not in " ".join(_stall_advice("float64", False))
    assert "bfloat16's round-off" in _stall_advice("bfloat16", False)[0]
    # a custom step in float32: noise first, float32's round-off beside it (re-check: a
    # noisy step stalled alike in float64, which the advice alone named)
    said = " ".join(_stall_advice("float32", True))
    assert "make network.step deterministic" in said and "dtype=float64" in said
    counts, _ = _run(tmp_path, caplog, "network=custom", "network.width=4",
                     "network.step._target_=custom_step_pkg.BelowCheckNoise",
                     "+network.step.width=4", "+network.step.hidden=3", "mgrit.max_iter=8")
    assert counts[0] >= 1
    text = "\n".join(caplog.messages)
    assert "make network.step deterministic" in text and "dtype=float64" not in text


def test_stagnation_is_the_last_ratios_near_one():
    from lptrain.train.control import stagnated
    assert stagnated([1.0, 1e-2, 1e-3, 0.99e-3, 0.98e-3, 0.98e-3])
    assert not stagnated([1.0, 0.5, 0.25, 0.125])         # slow, but still falling
    assert not stagnated([1.0, 1.0, 1.0])                 # too few ratios to tell


def test_one_shot_errors_out_of_the_controllers_reach_are_said_once(tmp_path, caplog):
    """network.T=100: the controller planned its most iterations every step and the
    estimated gradient error stayed 4 orders above mgrit.grad_tol, without a word."""
    with caplog.at_level(logging.INFO, logger="lptrain"):
        app.run(composed(*TINY, *DEFAULT_NET, "mode=simultaneous", "network.T=100"), None,
                tmp_path)
    said = [m for m in caplog.messages if "stays far above mgrit.grad_tol" in m]
    assert len(said) == 1 and all(len(m) <= 80 for m in caplog.messages if "mgrit" in m)
    (tmp_path / "b").mkdir()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lptrain"):      # the default network: none
        app.run(composed(*TINY, *DEFAULT_NET, "mode=simultaneous"), None, tmp_path / "b")
    assert not [m for m in caplog.messages if "stays far above" in m]


class _Lines:
    def __init__(self):
        self.lines = []

    def message(self, line):
        self.lines.append(line)


def _notes(control="error", most=6):
    from types import SimpleNamespace

    from lptrain.train.notes import SolveNotes
    console = _Lines()
    return SolveNotes(console, SimpleNamespace(control_max_iters=most, grad_tol=0.005,
                                           control=control)), console


def test_a_fixed_plan_is_told_nothing_of_the_controllers_target():
    """mgrit.control=fixed: the run said grad_tol and control_max_iters were not used,
    then advised 'a smaller mgrit.grad_tol' or 'a larger control_max_iters', and whether
    it said so depended on their values."""
    notes, console = _notes("fixed", most=1)
    at_most = dict(fwd_iterations=1, adj_iterations=1, fwd_plan=1, adj_plan=1, grad_error=0.009,
                   true_error=0.09)
    for k in range(1, 10):
        notes.after(k, at_most)
    assert console.lines == []
    notes, console = _notes("error", most=1)
    for k in range(1, 4):
        notes.after(k, {**at_most, "grad_error": 0.09})
    assert console.lines[0].startswith("iteration 1: a calibration")
    assert console.lines[4].startswith("iteration 3: with 1 iteration a solve")


def test_a_fixed_plan_whose_estimates_stay_above_a_percent_is_said_once():
    """experiment=peaks_paper seed=1 (mgrit.control=fixed, 2 + 2 iterations): estimates
    of 1-11 % from iteration 100 on, 45 of 130 above 0.5 %, ending 1.26 x serial's
    objective, with no word beyond the progress lines' gerr."""
    notes, console = _notes("fixed")
    notes.mgrit.fwd_iters = notes.mgrit.adj_iters = 2
    for k, error in enumerate([0.02, 0.02, 0.009, 0.02, 0.03], start=1):
        notes.after(k, dict(grad_error=error, fwd_iterations=2, adj_iterations=2))
    assert console.lines == []
    notes.after(6, dict(grad_error=0.05))
    notes.after(7, dict(grad_error=0.05))
    assert console.lines == [
        "iteration 6: the estimated one-shot gradient error 5.0e-02 stays above 1e-02",
        "  at the fixed 2 + 2 iterations a solve (mgrit.control=fixed); mgrit.control=error",
        "  plans more where they are needed, mode=mgrit solves exactly"]


def test_out_of_reach_needs_solves_run_at_their_most_three_times_in_a_row():
    """The note fired on a one-off spike of a 3-iteration adjoint whose next plan was 6
    (network.layers=16, iteration 66), although every 6-iteration solve met grad_tol."""
    notes, console = _notes()
    spike = dict(fwd_iterations=3, adj_iterations=3, fwd_plan=4, adj_plan=6, grad_error=0.09)
    at_most = dict(spike, fwd_iterations=6, adj_iterations=6)
    met = dict(at_most, grad_error=0.004)
    for k, stats in enumerate([spike, spike, spike, at_most, at_most, met, at_most, at_most]):
        notes.after(k + 1, stats)
    assert console.lines == []
    notes.after(9, at_most)
    assert console.lines[0].startswith("iteration 9: with 6 iterations a solve")
    notes.after(10, at_most)
    assert len(console.lines) == 4 and all(len(line) <= 80 for line in console.lines)
    assert console.lines[-1] == "  (network.T) or weights (network.init_hidden)"


def test_a_calibration_far_off_the_target_is_said_once():
    """seed=14 with mgrit.calibrate_every=5: calibrations measured true errors 2-3.5x
    grad_tol while the lagging scale kept the estimates below it, and nothing said so."""
    notes, console = _notes()
    notes.after(5, dict(true_error=float("nan"), grad_error=1e-3))
    notes.after(10, dict(true_error=0.009, grad_error=1e-3))           # within 2x
    assert console.lines == []
    notes.after(40, dict(true_error=0.011, grad_error=1e-3))
    notes.after(50, dict(true_error=0.0175, grad_error=1e-3))
    assert len(console.lines) == 3 and console.lines[0].startswith("iteration 40: a calib")
    assert "1.1e-02 off, above mgrit.grad_tol 0.005" in console.lines[1]
    assert all(len(line) <= 80 for line in console.lines)
    assert console.lines[2] == "  a smaller mgrit.grad_tol or mode=mgrit keeps nearer " \
                               "serial training"
    # plans at control_max_iters already (the image recipes cap them at 2): a smaller
    # grad_tol adds no iteration, and the advice said it would
    notes, console = _notes()
    notes.after(9, dict(true_error=0.02, grad_error=1e-3, fwd_plan=6, adj_plan=6))
    assert console.lines[2:] == ["  the plans are at mgrit.control_max_iters (6): a larger "
                                 "one or", "  mode=mgrit keeps nearer serial training"]
    assert all(len(line) <= 80 for line in console.lines)


def test_diverging_solves_are_not_told_round_off(tmp_path, caplog):
    """network.T=300 over 128 layers: MGRIT's residuals grow (100 -> 925), and the
    advice was the round-off one ('raise mgrit.tol or use dtype=float64') in float64."""
    _run(tmp_path, caplog, "network.layers=128", "network.T=300", "mgrit.levels=3",
         "mgrit.cfactor0=4", "mgrit.max_iter=6", "train.iterations=1")
    text = [m for m in caplog.messages if "mgrit" in m or "MGRIT" in m]
    assert any("they diverged: MGRIT does not converge" in m for m in text), text
    assert not any("round-off" in m for m in text) and all(len(m) <= 80 for m in text)


def test_growing_residuals_are_divergence_not_stagnation():
    from lptrain.train.control import grew, stagnated
    rising = [100.0, 114.0, 83.0, 61.0, 212.0, 541.0, 925.0]
    assert grew(rising) and not stagnated(rising)
    assert not grew([1.0, 1e-3, 1e-3, 1e-3])


def test_a_repeat_after_the_first_iteration_is_said_once():
    """Repeats of far-off gradients were shown nowhere but metrics.h5, while the steps
    with one took twice as long; the first iteration's (a cold start) is expected."""
    notes, console = _notes()
    notes.after(1, dict(refined=1))
    notes.after(2, dict(refined=0))
    assert console.lines == []
    notes.after(3, dict(refined=1))
    notes.after(4, dict(refined=2))
    assert console.lines[0].startswith("iteration 3: a one-shot gradient far above ")
    assert len(console.lines) == 3 and all(len(line) <= 80 for line in console.lines)



# a float32 run's forward residuals (dtype=float32 mgrit.grad_tol=1e-6, iteration 10):
# fast, then slowed at round-off; and a large layer step's, uniformly slow
FLOAT32_FLOOR = [11.5, 0.595, 2.46e-2, 5.34e-4, 4.07e-5, 2.64e-5, 1.90e-5]
LARGE_STEP = [40.0, 25.0, 15.0, 9.5, 6.0, 3.8, 2.4]


def test_a_solve_that_slowed_at_round_off_is_told_of_its_dtype():
    """dtype=float32 mgrit.grad_tol=1e-6: the advice said more iterations or smaller
    layer steps, where the solves had met float32's round-off (last ratio 0.72 after a
    first of 0.05); a uniformly slow solve (a large step) keeps that advice."""
    from types import SimpleNamespace

    from lptrain.train.notes import SolveNotes, slowed
    assert slowed(FLOAT32_FLOOR) and not slowed(LARGE_STEP)
    assert not slowed([1.0, 0.1, 0.01, 0.001]) and not slowed([1.0, 0.5])
    mgrit = SimpleNamespace(control_max_iters=6, grad_tol=1e-6, control="error")
    stats = dict(fwd_iterations=6, adj_iterations=6, fwd_plan=6, adj_plan=6,
                 grad_error=1.1e-5, fwd_history=FLOAT32_FLOOR, adj_history=[1e-3, 1e-5])
    said = {}
    for dtype, history in (("float32", FLOAT32_FLOOR), ("float64", FLOAT32_FLOOR),
                           ("float32", LARGE_STEP)):
        console = _Lines()
        notes = SolveNotes(console, mgrit, dtype)
        for k in range(1, 4):
            notes.after(k, {**stats, "fwd_history": history})
        said[dtype, history is LARGE_STEP] = " ".join(console.lines)
    assert "float32's round-off" in said["float32", False] and \
        "dtype=float64" in said["float32", False]
    assert "control_max_iters, or smaller layer steps" in said["float64", False]
    assert "control_max_iters, or smaller layer steps" in said["float32", True]
