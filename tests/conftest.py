"""Every test gets its tier marker (tests/tiers.py), and only cli and mpi tests may start
another process: a test of another tier that does fails, naming the tier it belongs in.
Under pytest-xdist (`make test`) each file runs on one worker."""
import os
import platform
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# the environment's commands first on PATH, as in a shell with it activated: the resume
# lines runs print then name bare `mpiexec` and `lptrain` (errors.launch_words)
os.environ["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), os.environ.get("PATH", "")])

from tiers import SHARED_LAUNCH, TIERS, tier_of  # noqa: E402

_running: list[str] = []     # the tiers of the test being run


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath))
        marked = {m.name for m in item.iter_markers()}
        tier = None
        if path.parent.name == "unit":
            tier = tier_of(path.name, getattr(item, "originalname", item.name), marked)
        elif not marked & set(TIERS):
            tier = {"cli": "cli", "mpi": "mpi"}.get(path.parent.name)
        if tier is not None:
            item.add_marker(tier)
    _longest_first(items)


# files that start many processes at once: handed out last of tests/cli and tests/mpi, so
# that the other worker runs in-process files beside them, not another such file (with
# test_signals' 24 ranks beside it, a fresh `lptrain` in test_run_faults took 56 s to
# log its first rows instead of 4)
STORMS = {"test_signals.py"}


def _longest_first(items) -> None:
    """The files in the order pytest-xdist hands them out (`make test`): tests/cli and
    tests/mpi first, as collected but STORMS last (few long tests each: started last,
    one would end the run alone), then the other files by their number of tests, most
    first, so that the last files handed out are short ones and the two workers end
    together."""
    counts = Counter(str(item.fspath) for item in items)

    def key(item):
        path = Path(str(item.fspath))
        if path.parent.name in ("cli", "mpi"):
            return (0, path.name in STORMS, "")
        return (1, -counts[str(path)], str(path))
    items.sort(key=key)         # stable: a file's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist with `--dist loadfile` (`make test`): each file on one worker, so
    that its module fixtures are built once, and the files of the shared 4-rank launch
    (tiers.SHARED_LAUNCH) on one worker, so that it runs once."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "shared 4-rank launch" if path in SHARED_LAUNCH else path

    return ByFile(config, log)


def _refuse_other_processes(event, args):
    if event in ("subprocess.Popen", "os.fork", "os.posix_spawn") and _running and \
            not {"cli", "mpi"} & set(_running):
        raise RuntimeError(f"a {'/'.join(_running)} test may not start another process "
                           f"({event}): mark it cli or mpi (tests/tiers.py)")


# platform.processor() runs `uname -p` once per interpreter and caches it; h5py asks for it
# on its first import. Ask here, before any test, so that a test which happens to import
# h5py first is not refused for the interpreter's own start-up work.
platform.processor()
sys.addaudithook(_refuse_other_processes)


@pytest.fixture(autouse=True)
def _tier(request):
    _running[:] = [m.name for m in request.node.iter_markers() if m.name in TIERS]
    yield
    _running.clear()
