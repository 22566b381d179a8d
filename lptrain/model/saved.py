"""The trained network on disk and the atomic writes of run files.

A run writes two model files with every checkpoint and when it ends, however it ends:
`model.pt`, the parameters of the best validation so far (highest accuracy, then lowest
loss), and `model-last.pt`, those of the last finished iteration that passed the
divergence rule. Each holds what rebuilding the network needs (the network options, the
input shape, the classes, the dtype), the iteration, its validation loss and accuracy, and
the dataset's description (name, source, and its meta, among it the preprocessing the
loader applied: data/preprocessing.py). Loading needs neither MPI nor Hydra:
`load_model(run_dir)` returns a `Classifier` (model/classifier.py).
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import re
import struct
import warnings
import zipfile
from pathlib import Path

import torch
from lptrain.errors import InputFileError, RunFileError, first_line, one_of, reason
from lptrain.model.network import ResNet
from lptrain.model.zip_entry import EntryFile, check_crc, crc_blocks, entry_span

MODEL_FILE = "model.pt"
FORMAT = "lptrain-model"
FORMAT_VERSION = 2     # 1: the last parameters only, no "which", no "validation"


def _temporary(path: Path) -> Path:
    """The hidden file next to `path` an atomic write goes to before its rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def remove_leftovers(directory: Path, names) -> list[Path]:
    """Delete the temporary files of atomic writes of `names` in `directory` that a killed
    process left (a deep run's checkpoint: gigabytes); the ones removed. Only for a
    directory no other process writes (a run's, which its lock holds)."""
    gone = []
    for name in names:
        for tmp in Path(directory).glob(f".{name}.*.tmp"):
            try:
                tmp.unlink()
                gone.append(tmp)
            except OSError:
                pass
    return gone


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file next to `path`, sync it, rename it over `path`.

    A reader sees the old file or the new one, never a part; a failure removes the
    temporary file and raises RunFileError naming `path`.
    """
    path = Path(path)
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise RunFileError(f"{path}: cannot write ({reason(exc)})") from None


def save_torch(obj, path: Path) -> None:
    """torch.save into memory first (torch reports a full disk as a RuntimeError without
    the path), then write_atomically."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    write_atomically(path, buffer.getvalue())


FULL_BYTES = 2 ** 20   # a file system with less free space than this counts as full


class AtomicArchive:
    """A zip of torch-saved entries, written one entry at a time to a temporary file next
    to `path` and renamed over it by `commit()`: a reader sees the old file or the new
    one; memory holds one entry at a time.  Failures raise RunFileError naming `path`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.tmp = _temporary(self.path)
        self._file = self._zip = None
        with self._failing("cannot write"):
            self._file = open(self.tmp, "wb")
            self._zip = zipfile.ZipFile(self._file, "w", zipfile.ZIP_STORED, allowZip64=True)

    def add(self, name: str, obj) -> None:
        """torch.save `obj` straight into the entry (no copy of it in memory)."""
        with self._failing("cannot write"):
            with self._zip.open(name, "w", force_zip64=True) as entry:
                torch.save(obj, entry)

    def add_raw(self, name: str, tensors) -> list[tuple]:
        """The bytes of `tensors` (an iterable: each written as it comes) one after
        another as entry `name`, stored as written (model/zip_entry.py); returns each
        one's (offset in the entry, numel, dtype, CRC-32 of each of its blocks)."""
        places, offset = [], 0
        with self._failing("cannot write"):
            with self._zip.open(name, "w", force_zip64=True) as entry:
                for t in tensors:
                    data = t.detach().cpu().contiguous().view(torch.uint8).numpy()
                    entry.write(data)
                    places.append((offset, t.numel(), t.dtype, crc_blocks(data)))
                    offset += t.numel() * t.element_size()
        return places

    def commit(self) -> None:
        with self._failing("cannot write"):
            self._zip.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self.tmp, self.path)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._zip.close()
        with contextlib.suppress(Exception):
            self._file.close()
        with contextlib.suppress(OSError):
            self.tmp.unlink()

    @contextlib.contextmanager
    def _failing(self, what: str):
        try:
            yield
        except (OSError, RuntimeError) as exc:   # torch.save reports a full disk so
            reason = _write_failure(exc, self.path)   # before abort() frees the space
            self.abort()
            raise RunFileError(f"{self.path}: {what} ({reason})") from None


def _write_failure(exc: Exception, path: Path) -> str:
    """The reason a write failed, in the system's words: torch reports a full disk as
    "[enforce fail at inline_container.cc] unexpected pos" without the errno."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    try:
        fs = os.statvfs(path.parent)
        full = fs.f_bavail * fs.f_frsize < FULL_BYTES
    except OSError:
        full = False
    return os.strerror(errno.ENOSPC) if full else _first_line(exc)


def archive_entries(path: Path) -> list[str] | None:
    """The entry names of an AtomicArchive at `path`; None for any other file."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    # a torch file is a zip too, its entries in one folder; an archive's are flat
    return names if names and all("/" not in n for n in names) else None


# what torch.load raises on bytes that are not a torch file: its own checks, and the
# unpickler's when damaged opcodes reach it (an empty stack, a bad memo key or argument)
_UNPICKLING = (pickle.UnpicklingError, IndexError, KeyError, TypeError, AttributeError,
               struct.error, OverflowError)
_DAMAGED = (OSError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile, *_UNPICKLING)


def load_entry(path: Path, name: str, what: str):
    """One entry of an AtomicArchive (tensors and plain values only), read from the file
    in place (model/zip_entry.py: not in memory twice)."""
    try:
        z = zipfile.ZipFile(path)
    except _DAMAGED as exc:
        raise InputFileError(f"{path}: unreadable {what} ({_first_line(exc)})") from None
    with z:
        try:
            span = entry_span(z, name)
            if span is not None:
                check_crc(z.fp, *span, z.getinfo(name).CRC, name)
            source = io.BytesIO(z.read(name)) if span is None else EntryFile(z.fp, *span)
        except KeyError:
            raise InputFileError(f"{path}: {what} has no entry {name}") from None
        except _DAMAGED as exc:
            raise InputFileError(f"{path}: unreadable {what} ({_first_line(exc)})") from None
        try:
            return _torch_load(source)
        except _DAMAGED as exc:
            raise InputFileError(f"{path}: unreadable {what} ({_first_line(exc)})") from None


def load_torch(path: Path, what: str):
    """torch.load (tensors and plain Python values only), errors naming `path`: a file
    that is not whole or whose entries do not match their CRC-32 (torch's reader checks
    none) is refused before it is read."""
    try:
        _check_whole(path)
        return _torch_load(path)
    except FileNotFoundError:
        raise InputFileError(f"{path}: no {what} there") from None
    except _DAMAGED as exc:
        raise InputFileError(f"{path}: unreadable {what} ({_first_line(exc)})") from None


def _check_whole(path: Path) -> None:
    """zipfile.BadZipFile for an empty file, a file that begins as a zip (torch's files
    and lptrain's archives do) but does not end with its zip directory (cut short, or
    bytes added), and a zip whose entries' bytes do not match their CRC-32."""
    with open(path, "rb") as f:
        head = f.read(4)
        if not head:
            raise zipfile.BadZipFile("an empty file")
        if head != b"PK\x03\x04":
            return                     # not a zip: torch's reader says what it is
        f.seek(0, os.SEEK_END)
        f.seek(max(f.tell() - _END_RECORD, 0))
        if f.read(4) != b"PK\x05\x06":
            raise zipfile.BadZipFile("not whole: it begins as a zip file but does not end "
                                     "with its zip directory (cut short, or bytes added)")
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
    if bad is not None:
        raise zipfile.BadZipFile(f"Bad CRC-32 for file {bad!r}")


_END_RECORD = 22     # bytes of a zip's end-of-directory record, the file's last (no comment)


def _torch_load(source):
    """torch.load of plain values and tensors, without the warning its unpickler gives
    for damaged bytes that read as an unknown pickle protocol: what is wrong is then said
    once, by the caller's error (a warning would make it several lines)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol",
                                category=UserWarning)
        return torch.load(source, map_location="cpu", weights_only=True)


def _is_archive(path: Path) -> bool:
    """Whether `path` is an AtomicArchive (a checkpoint): a zip whose entries sit at its
    top level, where torch.save's zip keeps them in a folder."""
    try:
        with zipfile.ZipFile(path) as z:
            return any("/" not in name for name in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _first_line(exc: Exception) -> str:
    """torch's load errors run to many lines of advice; say what is wrong in one."""
    pickled = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
    if pickled:      # torch.save(model): a pickled object, whose loading runs its code
        return (f"a pickled Python object holding {pickled.group(1)}, as torch.save(obj) "
                f"writes; lptrain reads the files it saves: load this one with "
                f"torch.load(path, weights_only=False), only if you trust it")
    if isinstance(exc, _UNPICKLING):
        return "not a torch file of tensors and plain values"
    return first_line(exc).split(". This is an internal miniz error")[0]   # its advice


def load_record(path: Path, what: str, fmt: str, version: int) -> dict:
    """load_torch of a file lptrain wrote as `fmt` (e.g. "lptrain-model"), refusing other
    files and later format versions than `version`."""
    return check_record(load_torch(path, what), path, fmt, version)


def check_record(record, path: Path, fmt: str, version: int) -> dict:
    """`record` if it is an lptrain `fmt` record no newer than `version` (else
    InputFileError naming `path`)."""
    label = fmt.removeprefix("lptrain-")
    if not isinstance(record, dict) or record.get("format") != fmt:
        raise InputFileError(f"{path}: not an lptrain {label}")
    if record.get("format_version", 0) > version:
        raise InputFileError(f"{path}: {label} format {record['format_version']} is newer "
                             f"than this lptrain reads ({version})")
    return record


MODEL_FILES = {"best": MODEL_FILE, "last": "model-last.pt"}   # which parameters -> file


def model_record(theta: torch.Tensor, net: ResNet, config_yaml: str, dtype: str, data,
                 iteration: int, which: str = "last",
                 validation: tuple[float, float] | None = None,
                 chunk: int | None = None) -> dict:
    """What a model file holds: plain values and one tensor (see the module docstring).
    `which` says whose parameters they are ("best" or "last"), `validation` their
    validation (loss, accuracy) when the run validated them, `chunk` the samples its
    validation passes took at once (evaluate's default: the run's numbers, bitwise)."""
    meta = {k: v for k, v in data.meta.items() if k != "shard"}   # the rank's, not the model's
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "which": which,
            "theta": theta.detach().to("cpu").clone(), "iteration": int(iteration),
            "validation": None if validation is None else [float(v) for v in validation],
            "validation_chunk": None if chunk is None else int(chunk),
            "network": dict(vars(net.opts)), "signature": net.signature(),
            "feature_shape": list(net.in_shape),
            "n_classes": int(net.n_classes), "dtype": dtype, "config": config_yaml,
            "dataset": {"name": data.name, "source": data.source, "meta": meta}}


def model_path(run: str | Path, which: str | None = None) -> Path:
    """`run` itself if it is a file, else the run directory's file of `which` (default
    best: model.pt)."""
    if which is not None and which not in MODEL_FILES:    # a file's too: 'worst' is none
        raise ValueError(f"which={which!r}: {one_of(sorted(MODEL_FILES))}")
    run = Path(run)
    if run.is_file():
        return run
    return run / MODEL_FILES[which or "best"]


def load_model(run: str | Path, which: str | None = None, device: str = "cpu"):
    """The Classifier (model/classifier.py) saved in a run directory, in eval mode:
    `which="best"` (the default) the parameters of the best validation, model.pt;
    `which="last"` those of the last good iteration, model-last.pt. A file path loads that
    file (`which`, if given, must be what the file holds)."""
    # the module (torch.nn, the data transforms) is needed only to load
    from lptrain.model.classifier import Classifier
    if not Path(run).exists():          # a typo: not "no saved model there"
        raise InputFileError(f"{run}: no such file or directory")
    if not (Path(run).is_dir() or Path(run).is_file()):
        raise InputFileError(f"{run}: neither a run directory nor a model file")
    path = model_path(run, which)
    last = path.parent / MODEL_FILES["last"]
    if which is None and not path.exists() and Path(run).is_dir() and last.is_file():
        raise InputFileError(f"{path}: no saved model there, but {last.name} is (a run "
                             f"writes {path.name} at its first validation); which='last' "
                             f"(lptrain-eval --which last) loads it")
    try:
        record = load_record(path, "saved model", FORMAT, FORMAT_VERSION)
    except InputFileError:
        if _is_archive(path):       # what torch says of it is no help
            raise InputFileError(f"{path}: a checkpoint (what `lptrain resume=` continues), "
                                 f"not a saved model; load {MODEL_FILE} or "
                                 f"{MODEL_FILES['last']} of its run") from None
        raise
    held = record.get("which", "last")          # format 1 held the last parameters only
    if which is not None and held != which:
        raise InputFileError(f"{path}: holds the {held} parameters, not the {which} ones"
                             + ("" if record.get("which") else
                                " (written by an lptrain that kept only the last)"))
    model = Classifier(record, source=str(path))
    try:
        return model.to(device).eval()
    except (AssertionError, RuntimeError) as exc:   # torch's "not compiled with CUDA"
        raise ValueError(f"device={device!r}: {exc}") from None
