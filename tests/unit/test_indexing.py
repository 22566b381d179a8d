"""Index arithmetic of the solver's buffers: runs, slices, destinations."""
import pytest
import torch

from lptrain.mgrit.indexing import (arithmetic_runs, destination, gather, index_of, layout_order,
                                     row_write_order, scatter, zeros_rows)


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


def test_rows_are_laid_out_as_their_template():
    cl = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    assert layout_order(cl) == (0, 2, 3, 1) and layout_order(torch.zeros(2, 3, 4)) == (0, 1, 2)
    rows = zeros_rows(cl, 3)
    assert rows.shape == (3, 2, 3, 4, 5) and not rows.any()
    assert all(rows[i].is_contiguous(memory_format=torch.channels_last) for i in range(3))
    assert zeros_rows(torch.zeros(2, 3), 4).is_contiguous()


@pytest.mark.parametrize("out, before, after, order", [
    ((1, 14, 4), [(0, 13, 4)], [], "up"),         # an F-relaxation: disjoint rows
    ((1, 5, 1), [(0, 4, 1)], [], "down"),         # each row written over the next input
    ((0, 4, 1), [(1, 5, 1)], [], "up"),           # ... over the last input
    ((0, 4, 1), [(0, 4, 1)], [], "up"),           # in place
    ((0, 4, 1), [], [(0, 4, 1)], None),           # in place over what is read after
    ((0, 3, 1), [(0, 6, 2)], [], "up"),
    ((1, 5, 1), [(0, 4, 1)], [(0, 4, 1)], "down"),
    ((0, 6, 2), [(1, 4, 1)], [(3, 6, 1)], "up"),
    ((1, 5, 1), [(0, 4, 1)], [(2, 6, 1)], None),  # one order for each read: neither
])
def test_rows_are_written_in_an_order_that_reads_each_row_first(out, before, after, order):
    X = torch.zeros(17, 3, 4)
    view = lambda s: X[slice(*s)]                 # noqa: E731
    got = row_write_order(view(out), [view(s) for s in before], [view(s) for s in after])
    k = view(out).shape[0]
    want = {"up": range(k), "down": range(k - 1, -1, -1), None: None}[order]
    assert got == want
    assert row_write_order(view(out), [torch.zeros(17, 3, 4)]) == range(k)   # other storage


@pytest.mark.parametrize("template", [
    torch.zeros(5, 3, dtype=torch.float64), torch.zeros(4, 8, 7, 7),
    torch.zeros(4, 8, 7, 7).to(memory_format=torch.channels_last), torch.zeros(6),
    torch.zeros(2, 1, 3), torch.zeros(3, 1, 1, 2).to(memory_format=torch.channels_last)])
def test_a_block_fits_where_new_rows_would_make_its_form(template):
    from lptrain.mgrit.indexing import fits_rows, new_rows
    block = new_rows(template, 9)
    assert fits_rows(block, template, 9)
    assert not fits_rows(block, template, 8) and not fits_rows(None, template, 9)
    assert not fits_rows(block.to(torch.float16), template, 9)
    assert not fits_rows(new_rows(template, 18)[::2], template, 9)     # not dense
    if template.dim() == 4 and template.shape[1] > 1:                  # the other layout
        other = template.contiguous() if template.is_contiguous(
            memory_format=torch.channels_last) else template.to(
            memory_format=torch.channels_last)
        assert not fits_rows(new_rows(other, 9), template, 9)
