"""metrics/columns.py: a Column appends what h5py's high-level indexing (the reference)
appends, through chunk boundaries and after a resumed file was cut back."""
import h5py
import numpy as np

from lptrain.metrics import schema as s
from lptrain.metrics.columns import CHUNK_ROWS, Columns, append_plain

FIELDS = {"count": s.INT, "value": s.FLOAT}


def _values(seed, rows):
    gen = np.random.default_rng(seed)
    return {"count": gen.integers(-5, 10 ** 9, rows).tolist(),
            "value": [float(v) for v in
                      gen.standard_normal(rows) * 10.0 ** gen.integers(-300, 300, rows)]}


def _write(path, rows, fast, cut=None, more=()):
    """`rows` rows into group train/ of a new file; with `cut`, reopen it, keep `cut`
    rows (as a resume does) and append `more`."""
    def append(f, values):
        g, columns = f.require_group("train"), Columns()
        for i in range(len(values["count"])):
            for name, dtype in FIELDS.items():
                if fast:
                    columns.get(g, name, dtype, s.FILL[dtype]).append(values[name][i])
                else:
                    append_plain(g, name, dtype, s.FILL[dtype], values[name][i])
    with h5py.File(path, "w") as f:
        append(f, rows)
    if cut is not None:
        with h5py.File(path, "r+") as f:
            for ds in f["train"].values():
                ds.resize((cut,))
            append(f, more)
    with h5py.File(path, "r") as f:
        return {name: (ds[()], ds.dtype, ds.chunks, ds.maxshape, ds.fillvalue)
                for name, ds in f["train"].items()}


def _same(a, b):
    assert a.keys() == b.keys() == FIELDS.keys()
    for name in a:
        (va, *pa, fa), (vb, *pb, fb) = a[name], b[name]
        np.testing.assert_array_equal(va, vb)
        assert pa == pb and np.array_equal(fa, fb, equal_nan=True)


def test_a_column_writes_what_the_reference_writes(tmp_path):
    rows = _values(0, CHUNK_ROWS + 45)          # into a second chunk
    fast = _write(tmp_path / "fast.h5", rows, True)
    _same(fast, _write(tmp_path / "plain.h5", rows, False))
    assert fast["count"][0].tolist() == rows["count"]
    assert fast["value"][0].tolist() == rows["value"]


def test_columns_of_a_resumed_file_continue_after_its_kept_rows(tmp_path):
    rows, more = _values(1, 70), _values(2, 30)
    fast = _write(tmp_path / "fast.h5", rows, True, cut=40, more=more)
    _same(fast, _write(tmp_path / "plain.h5", rows, False, cut=40, more=more))
    assert fast["count"][0].tolist() == rows["count"][:40] + more["count"]


def test_row_columns_write_what_the_plain_appends_write(tmp_path):
    """Histories that grow, shrink and come empty, per-rank rows that widen: kept
    RowColumns while a row fits, the plain append (which widens) when it does not."""
    from lptrain.metrics.columns import append_history, append_per_rank
    gen = np.random.default_rng(3)
    lengths = [3, 2, 5, 5, 0, None, 4, 7, 1] * 30            # past a chunk of rows
    ranks = [2, 2, 3, 3, 1, 3] * 45
    histories = [None if n is None else gen.standard_normal(n).tolist() for n in lengths]
    per_rank = [gen.random(r).tolist() for r in ranks]

    def write(path, fast):
        with h5py.File(path, "w") as f:
            g, columns = f.require_group("mgrit"), Columns()
            for name, rows, plain in (("h", histories, append_history),
                                      ("r", per_rank, append_per_rank)):
                for row in rows:
                    if fast:
                        columns.append_row(g, name, row, plain)
                    else:
                        plain(g, name, row)
        with h5py.File(path, "r") as f:
            return {n: (ds[()], ds.dtype, ds.chunks, ds.maxshape) for n, ds in f["mgrit"].items()}
    fast, plain = write(tmp_path / "fast.h5", True), write(tmp_path / "plain.h5", False)
    for name in ("h", "r"):
        np.testing.assert_array_equal(fast[name][0], plain[name][0])
        assert fast[name][1:] == plain[name][1:]
    assert fast["h"][0].shape == (len(lengths), 7) and fast["r"][0].shape == (len(ranks), 3)
