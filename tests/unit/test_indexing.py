"""Index arithmetic of the solver's buffers: runs, slices, destinations."""
import pytest
import torch

from lptrain.mgrit.indexing import arithmetic_runs, destination, gather, index_of, scatter


@pytest.mark.parametrize("positions,runs", [
    ([], []),
    ([5], [[5]]),
    ([3, 7, 11, 15], [[3, 7, 11, 15]]),
    ([1, 3, 5, 6], [[1, 3, 5], [6]]),          # the last point a C-point after a C-point
    ([0, 4, 8, 9, 10, 12], [[0, 4, 8], [9, 10], [12]]),
])
def test_arithmetic_runs_are_maximal_from_the_left(positions, runs):
    assert arithmetic_runs(positions) == runs
    assert [p for run in runs for p in run] == positions


def test_index_of_gives_slices_for_progressions_only():
    assert index_of([4]) == slice(4, 5)
    assert index_of([2, 5, 8]) == slice(2, 9, 3)
    assert torch.equal(index_of([8, 5, 2]), torch.tensor([8, 5, 2]))   # decreasing
    assert torch.equal(index_of([1, 2, 4]), torch.tensor([1, 2, 4]))
    X = torch.arange(10.0)
    for pos in ([4], [2, 5, 8], [8, 5, 2], [1, 2, 4]):
        assert gather(X, pos).tolist() == [float(p) for p in pos]
        Y = X.clone()
        scatter(Y, pos, -torch.ones(len(pos)))
        assert all(Y[p] == -1 for p in pos) and int((Y == -1).sum()) == len(pos)


def test_destination_is_a_view_unless_it_would_read_what_it_writes():
    X = torch.zeros(9, 2)
    out, put = destination(lambda pos: (X, [p - 1 for p in pos]), [3, 5, 7])
    assert out.data_ptr() == X[2].data_ptr() and out.shape == (3, 2)
    out.fill_(1.0)
    put(out)
    assert X[[2, 4, 6]].eq(1).all() and X.sum() == 6
    # values computed from points among the targets: written after, by put
    out, put = destination(lambda pos: (X, pos), [5, 6], clash=True)
    assert out is None
    put(torch.full((2, 2), 7.0))
    assert X[5].eq(7).all() and X[6].eq(7).all()
    # a non-progression: no view either
    out, put = destination(lambda pos: (X, pos), [0, 1, 3])
    assert out is None
    assert destination(None, [1, 2])[0] is None
