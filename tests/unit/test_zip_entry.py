"""A checkpoint's entries are read from the file in place (model/zip_entry.py): the same
values as the entry's bytes read whole, without those bytes in memory."""
import io
import zipfile

import pytest
import torch

from lptrain.model.saved import AtomicArchive, load_entry
from lptrain.model.zip_entry import EntryFile, entry_span


def _archive(path):
    """An archive of two torch entries, one of several tensors and plain values."""
    gen = torch.Generator().manual_seed(3)
    record = {"theta": torch.randn(1000, generator=gen, dtype=torch.float64),
              "mem": [(torch.randn(700, generator=gen, dtype=torch.float64),
                       torch.randn(700, generator=gen, dtype=torch.float64), 0.5)
                      for _ in range(3)],
              "iteration": 7, "name": "x"}
    archive = AtomicArchive(path)
    archive.add("record.pt", record)
    archive.add("other.pt", {"v": torch.arange(5)})
    archive.commit()
    return record


def test_an_entry_file_holds_the_entrys_bytes_and_seeks_within_them(tmp_path):
    path = tmp_path / "a.zip"
    _archive(path)
    with zipfile.ZipFile(path) as z:
        whole = z.read("other.pt")
        start, size = entry_span(z, "other.pt")
        f = EntryFile(z.fp, start, size)
        assert size == len(whole) and f.read() == whole
        assert f.seek(-10, io.SEEK_END) == size - 10 and f.read(4) == whole[-10:-6]
        assert f.seek(3) == 3 and f.read(5) == whole[3:8] and f.tell() == 8
        assert f.seek(2, io.SEEK_CUR) == 10 and f.read(1) == whole[10:11]
        f.seek(size + 5)
        assert f.read(3) == b""                 # past the end: nothing, as a file
        with pytest.raises(ValueError, match="negative seek position -1"):
            f.seek(-1)
        with pytest.raises(KeyError):
            entry_span(z, "missing.pt")


def test_load_entry_reads_in_place_the_values_written(tmp_path, monkeypatch):
    path = tmp_path / "a.zip"
    record = _archive(path)

    def whole(*args, **kwargs):
        raise AssertionError("a stored entry was read into memory whole")
    monkeypatch.setattr(zipfile.ZipFile, "read", whole)
    got = load_entry(path, "record.pt", "checkpoint")
    assert got["iteration"] == 7 and got["name"] == "x"
    assert torch.equal(got["theta"], record["theta"])
    for (s, y, rho), (s0, y0, rho0) in zip(got["mem"], record["mem"], strict=True):
        assert torch.equal(s, s0) and torch.equal(y, y0) and rho == rho0
    assert torch.equal(load_entry(path, "other.pt", "checkpoint")["v"], torch.arange(5))


def test_a_compressed_entry_is_read_whole(tmp_path):
    """An entry another tool rewrote compressed has no bytes in place: read whole."""
    path = tmp_path / "a.zip"
    record = _archive(path)
    packed = tmp_path / "packed.zip"
    with zipfile.ZipFile(path) as src, \
            zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as dst:
        for name in src.namelist():
            dst.writestr(name, src.read(name))
    with zipfile.ZipFile(packed) as z:
        assert entry_span(z, "record.pt") is None
    assert torch.equal(load_entry(packed, "record.pt", "checkpoint")["theta"],
                       record["theta"])


def test_a_damaged_local_header_is_an_unreadable_checkpoint(tmp_path):
    from lptrain.errors import InputFileError
    path = tmp_path / "a.zip"
    _archive(path)
    with zipfile.ZipFile(path) as z:
        offset = z.getinfo("other.pt").header_offset
    data = bytearray(path.read_bytes())
    data[offset:offset + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match=f"{path}: unreadable checkpoint .*bad header"):
        load_entry(path, "other.pt", "checkpoint")


def test_a_changed_byte_inside_an_entry_is_refused_by_its_crc(tmp_path):
    """torch's reader checks no checksum: read in place, a flipped byte in a tensor's
    bytes would load as a wrong value. The entry's CRC-32 is checked first, as zipfile's
    own reads do (a damaged checkpoint was refused so before it was read in place)."""
    from lptrain.errors import InputFileError
    path = tmp_path / "a.zip"
    _archive(path)
    with zipfile.ZipFile(path) as z:
        start, size = entry_span(z, "record.pt")
    data = bytearray(path.read_bytes())
    data[start + size - 200] ^= 0x01          # inside the last tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match=f"{path}: unreadable checkpoint \\(Bad CRC-32 "
                                             f"for file 'record.pt'\\)"):
        load_entry(path, "record.pt", "checkpoint")
    assert torch.equal(load_entry(path, "other.pt", "checkpoint")["v"], torch.arange(5))


@pytest.mark.parametrize("kept", [0.3, 0.5, 0.9, 0.999])
def test_a_truncated_checkpoint_or_model_is_said_to_be_truncated(tmp_path, kept):
    """Cut short, a zip has no directory at its end, and torch's reader said so in
    miniz's words and advice (or as `[Errno 22] Invalid argument`, or found the
    directory of a torch file nested in the archive's last 64 KB, by where the cut
    falls)."""
    from lptrain.errors import InputFileError
    from lptrain.model.saved import load_torch, save_torch
    from lptrain.train import checkpoint as ck
    path, model = tmp_path / ck.CHECKPOINT_FILE, tmp_path / "model.pt"
    _archive(path)
    save_torch({"theta": torch.zeros(1000)}, model)
    for file, what, read in ((path, "checkpoint", ck.load_checkpoint),
                             (model, "model", lambda p: load_torch(p, "model"))):
        file.write_bytes(file.read_bytes()[:int(file.stat().st_size * kept)])
        with pytest.raises(InputFileError) as caught:
            read(file)
        assert str(caught.value) == (f"{file}: unreadable {what} (not whole: it begins "
                                     f"as a zip file but does not end with its zip "
                                     f"directory (cut short, or bytes added))")


def test_a_damaged_or_empty_model_file_is_refused(tmp_path):
    """torch's reader checks no CRC-32: a model file with damaged tensor bytes loaded
    (0xFF bytes: a model of nan loss). The entries' checksums are checked first."""
    from lptrain.errors import InputFileError
    from lptrain.model.saved import load_torch, save_torch
    path = tmp_path / "model.pt"
    save_torch({"theta": torch.arange(1000.0)}, path)
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("data/0"))
        start, size = entry_span(z, name)
    data = bytearray(path.read_bytes())
    data[start + 100:start + 164] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match=f"{path}: unreadable saved model \\(Bad CRC-32 "
                                             f"for file '{name}'\\)"):
        load_torch(path, "saved model")
    path.write_bytes(b"")
    with pytest.raises(InputFileError, match=f"{path}: unreadable saved model \\(an empty "
                                             f"file\\)"):
        load_torch(path, "saved model")
