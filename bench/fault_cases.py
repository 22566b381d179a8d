"""The fault matrix's refusals: bad options and malformed input files (bench/fault_matrix.py).

Each case launches lptrain (or lptrain-eval) once on a tiny problem and expects the README's
refusal: exit 2 and one line naming the option or the file. A refusal must leave no
metrics.h5 or model behind. The files are damaged copies of fixtures built once: a finished
1-rank run, a small valid MNIST IDX set, and the Indian Pines scene as .mat files.
"""
from __future__ import annotations

import gzip
import os
import shutil
import threading
from pathlib import Path

import numpy as np

from fault_matrix import Case, Outcome, run_once
from lptrain.metrics import schema as ms
from lptrain.model.saved import MODEL_FILES
from lptrain.train.checkpoint import CHECKPOINT_FILE

TINY = ["network.layers=4", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "eval_every=1000000", "optimizer=adam"]
OVERRIDES = ".hydra/overrides.yaml"
DAMAGES = ("random", "half", "empty")

# (override(s), the name the line must give); the ones marked 2 also run on 2 ranks
OPTIONS = [
    ("network.layers=0", "network.layers", 2), ("network.width=0", "network.width", 1),
    ("network.T=1e300", "network.T", 2), ("network.T=nan", "network.T", 1),
    ("network.T=-inf", "network.T", 1), ("seed=99999999999999999999", "seed", 2),
    ("seed=18446744073709551615", "seed", 1), ("seed=-1", "seed", 1),
    ("network.init_hidden=nan", "network.init_hidden", 1),
    ("network.init_hidden=inf", "network.init_hidden", 1),
    ("network.init_hidden=-1", "network.init_hidden", 1),
    ("network.init_opening=1e200", "network.init_opening", 1),
    ("network.gamma_ddt=inf", "network.gamma_ddt", 2),
    ("train.iterations=0", "train.iterations", 1), ("train.iterations=abc", "train.iterations", 1),
    ("optimizer.lr=nan", "optimizer.lr", 1), ("optimizer.lr=-1", "optimizer.lr", 1),
    ("dataset.n_train=0", "dataset.n_train", 1), ("network.nosuchkey=1", "network.nosuchkey", 2),
    ("nosuchkey=1", "nosuchkey", 1), ("mode=nope", "mode", 1), ("mode=mode_schema", "mode", 2),
    ("network=network_schema", "network", 1), ("optimizer=adam_schema", "optimizer", 1),
    ("mgrit.levels=0", "mgrit.levels", 1), ("mgrit.cfactor0=1", "mgrit.cfactor0", 1),
    ("train.batch_size=100000", "train.batch_size", 1),
    ("checkpoint_every=-1", "checkpoint_every", 1), ("eval_every=-1", "eval_every", 1),
    ("dtype=float16", "dtype", 1), ("device=cuda", "device", 1),
    ("network.width=1000000", "memory", 2), ("network.layers=10000000", "memory", 1),
    ("resume=/no/such/dir", "/no/such/dir", 2),
    ("dataset=mnist dataset.path=/no/such/dir", "/no/such/dir", 1),
    ("parallel.layer_ranks=3", "parallel.layer_ranks", 2),
    ("parallel.data_ranks=3", "parallel.data_ranks", 2),
]
QUICK_OPTIONS = {"network.T=1e300", "seed=18446744073709551615", "network.init_hidden=nan",
                 "network.nosuchkey=1", "mode=mode_schema", "network.width=1000000",
                 "dataset=mnist dataset.path=/no/such/dir"}


def refusal(where: Path, timeout: float, args: list[str], ranks: int, run_dir: Path,
            prog: str | None = None, fresh: bool = True) -> Outcome:
    """One launch that must be refused; the files a fresh run wrote anyway are named in
    `lost`."""
    out = run_once(args, ranks, where, timeout, run_dir, **({"prog": prog} if prog else {}))
    left = [n for n in (ms.FILE_NAME, *MODEL_FILES.values()) if (run_dir / n).exists()]
    if fresh and left and out.rc not in (0, None):
        out.lost = f"refused, yet wrote {', '.join(left)}"   # a refusal keeps nothing
    return out


def option_cases(quick: bool) -> list[Case]:
    cases = []
    for text, needle, most in OPTIONS:
        for ranks in (1, 2)[:1 if quick else most]:
            if quick and text not in QUICK_OPTIONS:
                continue
            if ranks == 1 and text.startswith("parallel."):
                continue                    # a 1-rank run has nothing to split

            def run(where, timeout, text=text, ranks=ranks):
                rd = where / "run"
                base = [] if text.startswith("resume=") else [f"hydra.run.dir={rd}", *TINY]
                return refusal(where, timeout, [*base, *text.split()], ranks, rd)
            cases.append(Case("options", text, ranks, (2,), needle, run,
                              quick=text in QUICK_OPTIONS))
    return cases


# -- fixtures ----------------------------------------------------------------------------
class Fixtures:
    """Valid inputs, each built once on first use (cases run in threads)."""

    def __init__(self, root: Path, timeout: float = 300):
        self.root, self.timeout, self.lock = root, timeout, threading.Lock()
        self.built: dict[str, Path] = {}

    def get(self, name: str) -> Path:
        with self.lock:
            if name not in self.built:
                path = self.root / name
                path.mkdir(parents=True, exist_ok=True)
                getattr(self, f"_build_{name}")(path)
                self.built[name] = path
            return self.built[name]

    def _build_run(self, path: Path) -> None:
        out = run_once([f"hydra.run.dir={path / 'run'}", *TINY, "train.iterations=2"], 1,
                       path, self.timeout)
        if out.rc != 0:
            raise RuntimeError(f"the fixture run failed: {out.stderr}")

    def _build_mnist(self, path: Path) -> None:
        gen = np.random.default_rng(0)
        for split, n in (("train", 100), ("t10k", 40)):
            labels = np.arange(n, dtype=np.uint8) % 10
            images = gen.integers(0, 256, (n, 28, 28), dtype=np.uint8)
            (path / f"{split}-images-idx3-ubyte").write_bytes(idx_bytes(images))
            (path / f"{split}-labels-idx1-ubyte").write_bytes(idx_bytes(labels))

    def _build_indian_pines(self, path: Path) -> None:
        import scipy.io
        from lptrain.data.indian_pines import CUBE_FILES, GT_FILE, tensorly_files
        found = tensorly_files()
        if found is None:
            raise RuntimeError("the Indian Pines fixture needs tensorly's copy (the data extra)")
        cube, gt = (np.load(p) for p in found)
        scipy.io.savemat(path / CUBE_FILES["corrected"], {"indian_pines_corrected": cube})
        scipy.io.savemat(path / GT_FILE, {"indian_pines_gt": gt})


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes: magic 0x0000 08 ndim, big-endian dims, the data."""
    head = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape)
    return head + array.tobytes()


def damaged(data: bytes, how: str) -> bytes:
    return {"random": os.urandom(max(5000, len(data) // 100)), "half": data[:len(data) // 2],
            "empty": b"", "gzip-half": gzip.compress(data)[:len(gzip.compress(data)) // 2],
            }[how]


def copy_of(src: Path, where: Path, name: str) -> Path:
    dst = where / name
    shutil.copytree(src, dst, symlinks=True)
    return dst


# -- malformed files ---------------------------------------------------------------------
MNIST_ARGS = ["dataset=mnist", "recipe=default", "network.channels=2",
              "network.opening=replicate", "network.layers=4", "dataset.n_train=40",
              "dataset.n_val=20", "train.iterations=1", "eval_every=1000000"]
IP_ARGS = ["dataset=indian_pines", "network.width=8", "network.layers=4",
           "dataset.n_train=160", "dataset.n_val=80", "train.iterations=1",
           "eval_every=1000000"]


def data_case(fx: Fixtures, fixture: str, args: list[str], target: str | None, how: str,
              ranks: int, quick: bool) -> Case:
    """A dataset run on a copy of a fixture with `target` damaged (None: intact, must run)."""
    def run(where, timeout):
        data = copy_of(fx.get(fixture), where, "data")
        if target == "zero-images":          # valid headers, no image (issue 19 item 3)
            (data / "train-images-idx3-ubyte").write_bytes(
                idx_bytes(np.zeros((0, 28, 28), np.uint8)))
            (data / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(0, np.uint8)))
        elif target:
            (data / target).write_bytes(damaged((data / target).read_bytes(), how))
        rd = where / "run"
        return refusal(where, timeout, [f"hydra.run.dir={rd}", *args,
                                        f"dataset.path={data}"], ranks, rd)
    name = f"{fixture}:{target or 'intact'}" + (f":{how}" if target and how else "")
    needle = "" if target is None else ("train-images" if target == "zero-images" else target)
    return Case("data files", name, ranks, (0,) if target is None else (2,), needle, run, quick)


def data_cases(fx: Fixtures, quick: bool) -> list[Case]:
    from lptrain.data.indian_pines import CUBE_FILES, GT_FILE
    cases = [data_case(fx, "mnist", MNIST_ARGS, None, "", 1, True),
             data_case(fx, "mnist", MNIST_ARGS, "zero-images", "", 1, True),
             data_case(fx, "indian_pines", IP_ARGS, None, "", 1, False)]
    for target in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                   "t10k-images-idx3-ubyte"):
        for how in DAMAGES:
            cases.append(data_case(fx, "mnist", MNIST_ARGS, target, how, 1,
                                   target.startswith("train-images") and how == "half"))
    for target in (CUBE_FILES["corrected"], GT_FILE):
        for how in DAMAGES:
            cases.append(data_case(fx, "indian_pines", IP_ARGS, target, how, 1,
                                   how == "random" and target == GT_FILE))
    cases += [data_case(fx, "mnist", MNIST_ARGS, "train-images-idx3-ubyte", "half", 2, False),
              data_case(fx, "indian_pines", IP_ARGS, CUBE_FILES["corrected"], "random", 2,
                        False)]
    return [c for c in cases if c.quick or not quick]


def run_file_case(fx: Fixtures, target: str, how: str, ranks: int, quick: bool) -> Case:
    """Resume (or, for a model, lptrain-eval) a finished run whose `target` is damaged;
    the other files must come out of the refusal unchanged."""
    is_model = target in MODEL_FILES.values()

    def run(where, timeout):
        rd = copy_of(fx.get("run") / "run", where, "run")
        (rd / target).write_bytes(damaged((rd / target).read_bytes(), how))
        before = {p: p.read_bytes() for p in rd.rglob("*") if p.is_file()}
        if is_model:
            which = [k for k, v in MODEL_FILES.items() if v == target][0]
            from fault_matrix import LPTRAIN
            prog = str(Path(LPTRAIN).with_name("lptrain-eval"))
            out = refusal(where, timeout, [str(rd), "--which", which], 1, rd, prog=prog,
                          fresh=False)
        else:
            out = refusal(where, timeout, [f"resume={rd}", "train.iterations=4"], ranks, rd,
                          fresh=False)
        changed = [str(p.relative_to(rd)) for p, b in before.items()
                   if p.name != "lptrain.log" and (not p.exists() or p.read_bytes() != b)]
        kept = [c for c in changed if not c.startswith(".hydra/")]
        if kept and out.rc != 0:
            out.lost = f"the refused resume changed {', '.join(kept)}"
        elif changed and out.rc != 0:        # the saved configuration a resume reads
            out.wrong = f"the refused resume rewrote {', '.join(changed)}"
        return out
    return Case("run files", f"{target}:{how}", ranks, (2,), target, run, quick,
                prog="lptrain-eval" if is_model else "lptrain")


def run_file_cases(fx: Fixtures, quick: bool) -> list[Case]:
    cases = []
    for target in (CHECKPOINT_FILE, ms.FILE_NAME, OVERRIDES, *MODEL_FILES.values()):
        for how in DAMAGES:
            is_model = target in MODEL_FILES.values()
            for ranks in (1,) if is_model or how == "half" else (1, 2):
                cases.append(run_file_case(fx, target, how, ranks,
                                           ranks == 1 and how == "random"
                                           and target in (CHECKPOINT_FILE, ms.FILE_NAME,
                                                          "model.pt")))
    return [c for c in cases if c.quick or not quick]
