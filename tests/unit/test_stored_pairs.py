"""L-BFGS's pairs in a checkpoint entry of their own (train/stored_pairs.py): the record
holds none of their values, a rank reads exactly the range it asks for, a format 3
checkpoint (the pairs in the record) still resumes exactly, and a short entry is one
clear error."""
import zipfile

import numpy as np
import pytest
import torch

from helpers import StopAt, composed
from lptrain import app
from lptrain.errors import InputFileError, Interrupted
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import AtomicArchive, load_entry
from lptrain.train import checkpoint as ck
from lptrain.train.stored_pairs import PAIRS_ENTRY, StoredVector

ARGS = ["network.layers=8", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "seed=5", "eval_every=4", "mode=serial", "optimizer.memory=3"]
K = 9


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped after 5 iterations (3 pairs kept) and the pairs its optimizer held."""
    run = tmp_path_factory.mktemp("run")
    held = {}
    build = app.build

    def watched(*args, **kwargs):
        built = build(*args, **kwargs)
        held["optimizer"] = built[-1]
        return built
    mp = pytest.MonkeyPatch()
    mp.setattr(app, "build", watched)
    try:
        with pytest.raises(Interrupted):
            app.run(composed(*ARGS, f"train.iterations={K}"), None, run, StopAt(5))
    finally:
        mp.undo()
    return run, [(s.clone(), y.clone(), rho) for s, y, rho in held["optimizer"].mem]


def test_the_record_holds_where_the_pairs_lie_and_they_read_back_bitwise(stopped):
    run, pairs = stopped
    path = run / ck.CHECKPOINT_FILE
    raw = load_entry(path, ck.RECORD_ENTRY, "checkpoint")
    assert raw["format_version"] == 4 and len(pairs) == 3
    n, item = pairs[0][0].numel(), pairs[0][0].element_size()
    assert [[p["offset"] for p in pair[:2]] for pair in raw["optimizer"]["mem"]] == \
        [[2 * i * n * item, (2 * i + 1) * n * item] for i in range(3)]
    with zipfile.ZipFile(path) as z:
        assert z.getinfo(PAIRS_ENTRY).file_size == 6 * n * item
    mem = ck.load_checkpoint(path)["optimizer"]["mem"]
    for (s, y, rho), (s0, y0, rho0) in zip(mem, pairs, strict=True):
        assert isinstance(s, StoredVector) and len(s) == n and rho == rho0
        assert torch.equal(s.clone(), s0) and torch.equal(y.clone(), y0)
        assert torch.equal(s[3:11], s0[3:11]) and torch.equal(y[n - 2:], y0[n - 2:])


def _raw_vector(tmp_path, n=1000, block=64):
    """A file holding n float64 values raw, and a StoredVector of them with CRCs of
    `block` bytes."""
    import zlib
    values = torch.randn(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    data = values.view(torch.uint8).numpy().tobytes()
    path = tmp_path / "raw.bin"
    path.write_bytes(b"head" + data)
    crc = [zlib.crc32(data[i:i + block]) for i in range(0, len(data), block)]
    return path, values, StoredVector(path, 4, n, torch.float64, crc, block)


def test_a_slice_reads_the_blocks_that_hold_it_only(tmp_path, monkeypatch):
    """A rank's part costs it the part's bytes and at most two checksum blocks more,
    not the vector's."""
    from lptrain.train import stored_pairs
    path, values, s = _raw_vector(tmp_path)
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, *args):
            return self.f.seek(*args)

        def readinto(self, buffer):
            got = self.f.readinto(buffer)
            read.append(got)
            return got
    monkeypatch.setattr(stored_pairs, "open", lambda *a: Counting(open(*a)), raising=False)
    assert torch.equal(s[100:110], values[100:110])    # bytes 800-880: blocks 12 and 13
    assert sum(read) == 2 * 64
    assert torch.equal(s[:], values) and torch.equal(s[995:], values[995:])
    assert s[7:7].numel() == 0


def test_a_damaged_block_is_refused_by_the_rank_that_reads_it(tmp_path):
    path, values, s = _raw_vector(tmp_path)
    data = bytearray(path.read_bytes())
    data[4 + 50 * 64 + 3] ^= 0x10                       # one bit in block 50
    path.write_bytes(bytes(data))
    assert torch.equal(s[100:110], values[100:110])    # blocks 12-13: intact
    for part in (slice(395, 405), slice(None)):        # blocks 49-50, all
        with pytest.raises(InputFileError, match=f"{path}: damaged checkpoint \\(pairs.bin: "
                           "the bytes of a pair's block 50 do not match its CRC-32\\)"):
            s[part]


def _as_format_3(run, out):
    """The run's checkpoint with its pairs as tensors in the record (format 3)."""
    path = run / ck.CHECKPOINT_FILE
    record = ck.load_checkpoint(path)
    record["optimizer"]["mem"] = [[s.clone(), y.clone(), rho]
                                  for s, y, rho in record["optimizer"]["mem"]]
    record["format_version"] = 3
    out.mkdir()
    (out / ms.FILE_NAME).write_bytes((run / ms.FILE_NAME).read_bytes())
    archive = AtomicArchive(out / ck.CHECKPOINT_FILE)
    archive.add(ck.RECORD_ENTRY, record)
    archive.add(ck.oracle_entry(0), load_entry(path, ck.oracle_entry(0), "checkpoint"))
    archive.commit()
    with zipfile.ZipFile(out / ck.CHECKPOINT_FILE) as z:
        assert PAIRS_ENTRY not in z.namelist()
    return out


def test_a_format_3_checkpoint_resumes_as_the_format_4_one(stopped, tmp_path):
    run, _ = stopped
    old = _as_format_3(run, tmp_path / "old")
    new = tmp_path / "new"
    new.mkdir()
    for name in (ms.FILE_NAME, ck.CHECKPOINT_FILE):
        (new / name).write_bytes((run / name).read_bytes())
    whole = tmp_path / "whole"
    whole.mkdir()
    app.run(composed(*ARGS, f"train.iterations={K}"), None, whole)
    for resumed in (old, new):
        app.run(composed(*ARGS, f"train.iterations={K}"), None, resumed, resume=True)
        got = read_metrics(resumed / ms.FILE_NAME)
        np.testing.assert_array_equal(got.train[ms.ITERATION], np.arange(1, K + 1))
        np.testing.assert_array_equal(got.train[ms.OBJECTIVE],
                                      read_metrics(whole / ms.FILE_NAME).train[ms.OBJECTIVE])


def test_a_short_or_missing_pairs_entry_is_one_clear_error(stopped, tmp_path):
    run, _ = stopped
    path = run / ck.CHECKPOINT_FILE
    record = load_entry(path, ck.RECORD_ENTRY, "checkpoint")
    with zipfile.ZipFile(path) as z:
        pairs = z.read(PAIRS_ENTRY)
    for name, data in (("short", pairs[:-8]), ("missing", None)):
        target = tmp_path / name / ck.CHECKPOINT_FILE
        target.parent.mkdir()
        archive = AtomicArchive(target)
        archive.add(ck.RECORD_ENTRY, record)
        if data is not None:
            with archive._zip.open(PAIRS_ENTRY, "w") as entry:
                entry.write(data)
        archive.commit()
        what = "holds .* bytes, its record places a vector up to byte" if data \
            else f"has no entry {PAIRS_ENTRY}"
        with pytest.raises(InputFileError, match=f"{target}: checkpoint.*{what}"):
            ck.load_checkpoint(target)
    s = StoredVector(path, path.stat().st_size - 16, 4, torch.float64, [0], 64)
    with pytest.raises(InputFileError, match="ends early"):
        s[0:4]


def test_restore_sends_every_tensor_of_the_run_to_its_device(stopped):
    """A checkpoint is read onto the CPU; restore() sends θ, the optimizer's pairs and
    point, the kept parameters and the oracle's state to the run's device, and leaves
    torch's RNG state on the CPU. Tested with a dtype in place of a device (this machine
    has one device): every tensor that is sent arrives as float32."""
    from lptrain.train.guard import Progress
    from lptrain.train.optimizers import LBFGS
    run, pairs = stopped
    saved = ck.read_run_state(run / ck.CHECKPOINT_FILE)
    opts = app.options(composed(*ARGS, f"train.iterations={K}"))
    optimizer, progress, seen = LBFGS(opts.optimizer), Progress(saved.theta), {}

    class Oracle:
        def load_state_dict(self, state):
            seen.update(state)
    state = {"cache": [[3, torch.zeros(2, dtype=torch.float64), None]]}
    theta = ck.restore(saved, optimizer, Oracle(), progress, state, torch.float32)
    assert theta.dtype == progress.theta.dtype == torch.float32
    assert torch.equal(theta, saved.theta.float())
    assert [(s.dtype, y.dtype) for s, y, _ in optimizer.mem] == [(torch.float32,) * 2] * 3
    assert torch.equal(optimizer.mem[0][0], pairs[0][0].float())
    assert optimizer.current[1].dtype == torch.float32
    assert progress.best.theta.dtype == torch.float32
    assert seen["cache"][0][0] == 3 and seen["cache"][0][1].dtype == torch.float32
    assert torch.equal(torch.get_rng_state(), saved.rng)
