"""agree_on_error / collectively: one rank's failure becomes every rank's error."""
from __future__ import annotations

import pytest

from lptrain.errors import REFUSED, ConfigError, LptrainError, RunFileError
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.collective import agree_on_error, collectively


class Peers:
    """Rank `rank` of a 2-rank job whose other rank reports `other` to allgather."""

    def __init__(self, rank: int, other: str | None):
        self.rank, self.size, self.other = rank, 2, other

    def allgather(self, obj):
        return [obj, self.other] if self.rank == 0 else [self.other, obj]


def test_the_rank_without_the_error_raises_the_failing_ranks_message_and_status():
    with pytest.raises(LptrainError, match=r"^metrics.h5: disk full \(on rank 0\)$") as info:
        agree_on_error(Peers(1, ("metrics.h5: disk full", 1)), None)
    assert info.value.exit_code == 1
    with pytest.raises(LptrainError, match=r"^data: holds no images \(on rank 0\)$") as info:
        agree_on_error(Peers(1, ("data: holds no images", REFUSED)), None)
    assert info.value.exit_code == REFUSED
    agree_on_error(Peers(1, None), None)          # nobody failed: nothing raised


def test_what_a_failing_rank_tells_the_others():
    seen = []

    class Recorder(Peers):
        def allgather(self, obj):
            seen.append(obj)
            return super().allgather(obj)
    with pytest.raises(ConfigError):
        agree_on_error(Recorder(0, None), ConfigError("seed=-1: must be >= 0"))
    assert seen == [("seed=-1: must be >= 0", REFUSED)]


def test_the_failing_rank_raises_its_own_error():
    own = ConfigError("network.T = 0: must be positive")
    with pytest.raises(ConfigError) as info:
        agree_on_error(Peers(0, None), own)
    assert info.value is own


def test_collectively_turns_os_errors_into_one_line_naming_the_file():
    def fail():
        raise PermissionError(13, "Permission denied", "/run/model.pt")
    with pytest.raises(RunFileError, match=r"^/run/model.pt: Permission denied$"):
        collectively(SerialExchange(), fail)
    assert collectively(Peers(1, None), fail, enabled=False) is None
    assert collectively(SerialExchange(), lambda: 7) == 7


def test_ranks_of_one_host_take_turns():
    """Rank 2 of [a, b, a, a] is the second on host a: it runs in the second of three
    turns, and every rank ends each turn together."""
    from lptrain.train.collective import in_turns
    events = []

    class Hosts:
        rank, size = 2, 4

        def allgather(self, obj):
            return ["a", "b", "a", "a"] if isinstance(obj, str) else [None] * 4

        def allreduce_sum(self, value):
            events.append("turn ends")
            return value
    assert in_turns(Hosts(), lambda: events.append("runs") or 7) == 7
    assert events == ["turn ends", "runs", "turn ends", "turn ends"]
    assert in_turns(SerialExchange(), lambda: 3) == 3
    with pytest.raises(RunFileError, match="cannot read"):
        in_turns(SerialExchange(), lambda: (_ for _ in ()).throw(OSError("cannot read")))
