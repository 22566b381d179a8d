"""The MGRIT record of a batch solved in data-group shards (train/data_parallel.py)."""
import math

import pytest

from lptrain.train.data_parallel import combined_record, whole_history


def _row(fwd, adj, iterations=2, **more):
    return {"fwd_iterations": iterations, "adj_iterations": iterations, "fwd_total": 3,
            "adj_total": 3, "adaptive_extra": 0, "rung": 0, "fwd_history": fwd,
            "adj_history": adj, "fwd_residual": fwd[-1], "adj_residual": adj[-1],
            "fwd_factor": 0.0, "adj_factor": 0.0, "grad_error": 1e-3, "fwd_plan": 2,
            "unconverged": 0, "refined": 0, **more}


def test_residuals_of_the_whole_batch_are_the_root_sum_of_squares():
    assert whole_history([([3.0, 0.3], 1.0), ([4.0, 0.4], 1.0)]) == pytest.approx([5, 0.5])
    # a group that stopped early keeps its last residual
    assert whole_history([([3.0], 1.0), ([4.0, 0.0], 1.0)]) == pytest.approx([5, 3])
    assert whole_history([([3.0, 1.0], 0.5), ([], 1.0)]) == pytest.approx([1.5, 0.5])
    assert whole_history([([], 1.0)]) == []


def test_groups_without_samples_are_left_out_and_the_slowest_counts():
    a = _row([3.0, 0.3, 0.03], [2.0, 0.2, 0.02])
    b = _row([4.0, 0.4, 0.04, 0.004], [2.0, 0.2, 0.02, 0.002], iterations=3, fwd_total=7,
             refined=1)
    out = combined_record([[a, 0.25], [None, 0.0], [b, 0.75]])
    assert out["fwd_iterations"] == out["adj_iterations"] == 3 and out["fwd_total"] == 7
    assert out["refined"] == 1
    assert out["fwd_history"] == pytest.approx([5.0, 0.5, 0.05, math.sqrt(0.03 ** 2 + 0.004 ** 2)])
    # the adjoint of a shard's mean loss: λ of the batch's is share × the shard's
    assert out["adj_history"][0] == pytest.approx(math.hypot(0.25 * 2.0, 0.75 * 2.0))
    assert out["fwd_residual"] == out["fwd_history"][-1]
    assert out["fwd_factor"] == pytest.approx(
        (out["fwd_history"][-1] / out["fwd_history"][0]) ** (1 / 3))
    assert out["grad_error"] == 1e-3 and out["fwd_plan"] == 2
    assert combined_record([[None, 1.0], [None, 0.0]]) is None
