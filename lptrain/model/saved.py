"""The trained network on disk (`model.pt`) and the torch module a saved one loads into.

A run writes `<run dir>/model.pt` when it ends, however it ends: the parameters of the
last finished iteration that passed the divergence rule, with what rebuilding the network
needs (the network options, the input shape, the classes, the dtype) and the dataset's
description (name, source, and its meta such as the normalisation the loader applied).
Loading needs neither MPI nor Hydra: `load_model(run_dir)` returns a `Classifier`.
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import pickle
import zipfile
from pathlib import Path

import torch
from torch import nn

from lptrain.errors import InputFileError, RunFileError, reason
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.model.serial import propagate
from lptrain.parallel.grid import chunks

MODEL_FILE = "model.pt"
FORMAT = "lptrain-model"
FORMAT_VERSION = 1
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _temporary(path: Path) -> Path:
    """The hidden file next to `path` an atomic write goes to before its rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


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


def load_entry(path: Path, name: str, what: str):
    """One entry of an AtomicArchive (tensors and plain values only)."""
    try:
        with zipfile.ZipFile(path) as z:
            data = z.read(name)
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except KeyError:
        raise InputFileError(f"{path}: {what} has no entry {name}") from None
    except (OSError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile,
            pickle.UnpicklingError) as exc:
        raise InputFileError(f"{path}: unreadable {what} ({_first_line(exc)})") from None


def load_torch(path: Path, what: str):
    """torch.load (tensors and plain Python values only), errors naming `path`."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputFileError(f"{path}: no {what} there") from None
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise InputFileError(f"{path}: unreadable {what} ({_first_line(exc)})") from None


def _first_line(exc: Exception) -> str:
    """torch's load errors run to many lines of advice; say what is wrong in one."""
    if isinstance(exc, pickle.UnpicklingError):
        return "not a torch file of tensors and plain values"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


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


def model_record(theta: torch.Tensor, net: ResNet, config_yaml: str, dtype: str, data,
                 iteration: int) -> dict:
    """What model.pt holds: plain values and one tensor (see the module docstring)."""
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "theta": theta.detach().to("cpu").clone(), "iteration": int(iteration),
            "network": dict(vars(net.opts)), "feature_shape": list(net.in_shape),
            "n_classes": int(net.n_classes), "dtype": dtype, "config": config_yaml,
            "dataset": {"name": data.name, "source": data.source, "meta": data.meta}}


EVAL_CHUNK = 4096   # samples Classifier.evaluate steps at once


class Classifier(nn.Module):
    """A trained ODE-ResNet for inference: `model(x)` gives the class scores.

    x has the training data's feature shape (after the dataset's normalisation,
    recorded in `dataset_meta`); the layers are stepped one after another, as
    the serial mode validates, so `evaluate` on the validation split reproduces
    the run's validation numbers.  The parameters are the flat buffer `theta`
    laid out by `net.layout` (`net.layout.views(model.theta)` names the blocks).
    """

    def __init__(self, record: dict):
        super().__init__()
        self.net = ResNet(NetworkOptions(**record["network"]), tuple(record["feature_shape"]),
                          record["n_classes"])
        self.register_buffer("theta", record["theta"].to(DTYPES[record["dtype"]]))
        self.iteration = record["iteration"]
        self.config_yaml = record["config"]
        self.dataset_name = record["dataset"]["name"]
        self.dataset_meta = record["dataset"]["meta"]

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return self.net.in_shape

    @property
    def n_classes(self) -> int:
        return self.net.n_classes

    def _final_states(self, x: torch.Tensor) -> torch.Tensor:
        net, theta = self.net, self.theta
        if tuple(x.shape[1:]) != net.in_shape:
            raise ValueError(f"input of shape {tuple(x.shape)}: expected (batch, "
                             f"{', '.join(map(str, net.in_shape))})")
        x = x.to(dtype=theta.dtype, device=theta.device)
        states, _ = propagate(net.stepper(theta), net.opening(theta, x), net.h, False)
        return states[-1]

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.logits(self.theta, self._final_states(x))

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """The most likely class of every sample (int64)."""
        return self.forward(x).argmax(1)

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor,
                 chunk: int = EVAL_CHUNK) -> tuple[float, float]:
        """Mean cross-entropy loss and accuracy (0..1) on the samples x with labels y,
        stepped `chunk` samples at a time (memory; the numbers are those of one pass
        to rounding, and bitwise where the run validated in the same chunks)."""
        n, loss, correct = x.shape[0], 0.0, 0
        for part in chunks(n, chunk):
            l, c, *_ = self.net.classify(self.theta, self._final_states(x[part]),
                                         y[part].to(self.theta.device), n, False)
            loss, correct = loss + float(l), correct + c
        return loss, correct / n


def model_path(run: str | Path) -> Path:
    """`run` itself if it is a file, else run/model.pt."""
    run = Path(run)
    return run if run.is_file() else run / MODEL_FILE


def load_model(run: str | Path, device: str = "cpu") -> Classifier:
    """The Classifier saved in a run directory (or a model.pt file), in eval mode."""
    record = load_record(model_path(run), "saved model", FORMAT, FORMAT_VERSION)
    return Classifier(record).to(device).eval()
