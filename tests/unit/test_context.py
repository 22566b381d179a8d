"""Per-node settings (threads, devices) and launcher detection: no MPI needed."""
import pytest
import torch

from lptrain.errors import ConfigError
from lptrain.parallel.context import Node, launcher, limit_threads, threads_per_rank
from lptrain.preflight import device_for


@pytest.mark.parametrize(("node", "env", "want"), [
    (Node(0, 1, 2), {}, 2),              # one rank: every core, set explicitly
    (Node(3, 4, 16), {}, 4),
    (Node(0, 16, 2), {}, 1),             # oversubscribed: at least one
    (Node(0, 3, 8), {}, 2),
    (Node(0, 4, 16), {"OMP_NUM_THREADS": "3"}, 3),
    (Node(0, 4, 16), {"OMP_NUM_THREADS": ""}, 4),
])
def test_threads_per_rank_share_the_node(node, env, want):
    assert threads_per_rank(node, env) == want


def test_limit_threads_sets_torch_also_on_one_rank(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert limit_threads(Node(0, 1, 3)) == 3
        assert torch.get_num_threads() == 3
        assert limit_threads(Node(0, 3, 3)) == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cuda_device_is_the_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_for("cuda", Node(1, 2, 16)) == "cuda:1"
    assert device_for("cpu", Node(1, 2, 16)) == "cpu"
    with pytest.raises(ConfigError, match=r"^device='cuda': 3 ranks on a node with 2 CUDA"):
        device_for("cuda", Node(2, 3, 16))


def test_cuda_absent_is_a_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^device='cuda': no CUDA device is available"):
        device_for("cuda", Node(0, 1, 2))


@pytest.mark.parametrize(("env", "want"), [
    ({}, None),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, ("MPICH", "PMI_RANK")),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, ("Open MPI", "OMPI_COMM_WORLD_SIZE")),
    ({"PMIX_RANK": "1"}, ("Open MPI", "PMIX_RANK")),
])
def test_launcher_from_the_environment(env, want):
    assert launcher(env) == want


def test_keep_freed_memory_sets_glibc_s_allocator_without_a_library_search(monkeypatch):
    """On glibc it takes mallopt from the process's own symbols; ctypes.util.find_library
    would start ldconfig (this tier's audit hook refuses any subprocess)."""
    import ctypes.util
    import platform

    from lptrain.parallel.context import keep_freed_memory

    def searched(name):
        raise AssertionError(f"find_library({name!r}) called")
    monkeypatch.setattr(ctypes.util, "find_library", searched)
    assert keep_freed_memory() == (platform.libc_ver()[0] == "glibc")


@pytest.mark.parametrize("overrides, says", [
    (["optimizer=adam", "train.batch_size=100000"],
     "larger than the 5000 training samples; give train.batch_size=5000 or less"),
    (["train.batch_size=100"], "optimizer=lbfgs is full batch")])
def test_a_batch_that_cannot_be_is_refused_before_the_network_and_the_split(
        monkeypatch, overrides, says):
    """On 2 ranks the refusal came after a minute of timing the automatic split
    (held-out): it needs only the data's size."""
    from lptrain import preflight
    from lptrain.config import compose

    def built(*args):
        raise AssertionError("the network was built before the batch was checked")
    monkeypatch.setattr(preflight, "_network", built)
    opts, _ = compose(overrides)
    with pytest.raises(ConfigError, match=says):
        preflight.plan(opts, None)
