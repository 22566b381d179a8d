"""The only messages MGRIT sends: neighbour states and residual-norm sums.

`MPIExchange` wraps an mpi4py communicator passed in by the caller;
`SerialExchange` is the one-rank stand-in.  Both implement the solver's
`protocols.Exchange` (plus the gathers training uses for checkpoints) and
time their blocking calls so runs can report compute against communication
and waiting.
"""
from __future__ import annotations

import atexit
import sys
import time
import weakref

import numpy as np
import torch


class Clock:
    """Seconds spent in communication calls and in waiting for messages."""

    def __init__(self):
        self.comm = 0.0
        self.wait = 0.0
        self.messages = 0


class SerialExchange:
    """One rank: no neighbours, sums are the local value."""

    rank, size = 0, 1

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or Clock()

    def send(self, tensor, dest):  # pragma: no cover - never has a neighbour
        raise RuntimeError(f"SerialExchange has no rank {dest}")

    def recv(self, template, source):  # pragma: no cover
        raise RuntimeError(f"SerialExchange has no rank {source}")

    def wait(self):
        pass

    def allreduce_sum(self, value: float) -> float:
        return value

    def allreduce_sums(self, values) -> list[float]:
        return [float(v) for v in values]

    def allreduce_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_tensor(self, tensor, root: int, template: torch.Tensor) -> torch.Tensor:
        return tensor

    def allgather(self, obj) -> list:
        return [obj]

    def allgather_tensor(self, part: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return part

    def gather_tensor(self, part: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return part

    def gather(self, values: list) -> list:
        return [values]

    def gather_each(self, obj, consume) -> None:
        consume(0, obj)

    def reversed(self) -> "SerialExchange":
        return self


HALF = (torch.bfloat16, torch.float16)     # 16-bit floats: numpy or MPI may lack them


def _buffer(t: torch.Tensor) -> np.ndarray:
    """The bytes of CPU tensor `t` as a numpy array MPI can move: 16-bit floats as
    16-bit integers (numpy has no bfloat16; MPI libraries may lack a half type)."""
    if t.dtype in HALF:
        return t.view(torch.int16).numpy()
    return t.numpy()


def _joined(whole: torch.Tensor, counts: list[int]) -> list:
    """MPI's receive spec of ranks' parts joined in rank order into `whole`: its buffer,
    each rank's count and where each part begins."""
    return [_buffer(whole), (list(counts), [sum(counts[:r]) for r in range(len(counts))])]


_LIVE: "weakref.WeakSet[MPIExchange]" = weakref.WeakSet()
_EXIT_HOOK: list = []
# the pending sends of exchanges collected before the end (a module replaced in a loop):
# dropped unfinished, their requests held the communicator past MPI_Finalize
_ORPHANED: list[list] = []


ABORT_GRACE = 0.5     # seconds for the launcher to forward a rank's last lines


def abort(comm, code: int) -> None:
    """End every rank of `comm`'s job (MPI_Abort) with exit status `code`, after this
    rank's output is flushed and the launcher has had ABORT_GRACE to forward it: at
    MPI_Abort the launcher ends the job at once, and a line written just before (the
    one that says why) could be lost."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    time.sleep(ABORT_GRACE)
    comm.Abort(code)


def release_sent() -> None:
    """Forget, on every live exchange and of collected ones (_ORPHANED), the sends that
    have gone. Run at exit, before MPI finalises (registered after mpi4py's own exit
    handler, so it runs first): the last sends of a solve arrive after the solver's last
    look, and their requests would otherwise be references to the communicator that
    MPI_Finalize reports as pending."""
    for exchange in list(_LIVE):
        exchange.wait()
    _tidy_orphans()


def _tidy_orphans() -> None:
    """Test the sends of collected exchanges, and forget those that have gone."""
    for pending in _ORPHANED:
        _release(pending)
    _ORPHANED[:] = [pending for pending in _ORPHANED if pending]


def _release(pending: list) -> None:
    """Drop from `pending` (in place: a collected exchange's list lives on in _ORPHANED)
    the sends that have gone."""
    pending[:] = [(req, buf) for req, buf in pending if not req.Test()]


class MPIExchange:
    """Point-to-point state messages and float allreduces on an mpi4py communicator.

    With `mirror=True` rank r is addressed as size−1−r (the adjoint's view).
    A state is sent from a contiguous CPU copy of its own, so the caller may
    overwrite the tensor at once and no rank blocks on its own send: a large
    message only completes once the neighbour posts its receive, after that
    neighbour's own steps.  A pending send keeps its copy until it has gone.
    """

    TAG = 17
    GATHER_TAG = 18

    def __init__(self, comm, mirror: bool = False, clock: Clock | None = None):
        self.comm, self.mirror = comm, mirror
        self.size = comm.Get_size()
        self.rank = self._map(comm.Get_rank())
        self._pending: list = []        # (request, buffer) of sends not known gone
        self.clock = clock or Clock()
        if not _EXIT_HOOK:        # now: mpi4py, imported for `comm`, registered its own
            _EXIT_HOOK.append(atexit.register(release_sent))
        _LIVE.add(self)
        _tidy_orphans()
        weakref.finalize(self, _ORPHANED.append, self._pending).atexit = False

    def _map(self, r: int) -> int:
        return self.size - 1 - r if self.mirror else r

    def reversed(self) -> "MPIExchange":
        return MPIExchange(self.comm, not self.mirror, self.clock)

    def __deepcopy__(self, memo) -> "MPIExchange":
        """An exchange over the same communicator (a copy of a module on several ranks,
        e.g. an average of its weights, talks to the same ranks), with its own sends
        and clock: a communicator made by Split or Dup cannot be copied itself."""
        return MPIExchange(self.comm, self.mirror)

    def __reduce_ex__(self, protocol):
        """Refused: what holds an exchange of several ranks holds only this rank's part
        (a LayerParallel its own layers), and no other process has its communicator."""
        raise TypeError(f"an object on {self.size} MPI ranks cannot be pickled (e.g. by "
                        f"torch.save(module)): each rank holds only its part, e.g. a "
                        f"LayerParallel its own layers; save state = net.state_dict() "
                        f"(gathered, on every rank) with torch.save on rank 0 instead")

    def send(self, tensor: torch.Tensor, dest: int) -> None:
        t0 = time.perf_counter()
        buf = tensor.detach().to("cpu").contiguous()
        if buf.data_ptr() == tensor.data_ptr():
            buf = buf.clone()
        req = self.comm.Isend(_buffer(buf), dest=self._map(dest), tag=self.TAG)
        self._release()
        self._pending.append((req, buf))
        self.clock.messages += 1
        self.clock.comm += time.perf_counter() - t0

    def recv(self, template: torch.Tensor, source: int) -> torch.Tensor:
        t0 = time.perf_counter()
        buf = torch.empty(template.shape, dtype=template.dtype)
        self.comm.Recv(_buffer(buf), source=self._map(source), tag=self.TAG)
        self.clock.wait += time.perf_counter() - t0
        return buf.to(template.device)

    def wait(self) -> None:
        """Release the copies of the sends that have gone; does not block (the others go
        when their receives are posted: every send of the solver has one)."""
        if self._pending:
            t0 = time.perf_counter()
            self._release()
            self.clock.comm += time.perf_counter() - t0

    def _release(self) -> None:
        _release(self._pending)

    def allreduce_sum(self, value: float) -> float:
        t0 = time.perf_counter()
        from mpi4py import MPI
        out = self.comm.allreduce(float(value), op=MPI.SUM)
        self.clock.comm += time.perf_counter() - t0
        return out

    def allreduce_sums(self, values) -> list[float]:
        """Several float sums in one allreduce (elementwise)."""
        t0 = time.perf_counter()
        from mpi4py import MPI
        buf = np.array(values, dtype=np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        self.clock.comm += time.perf_counter() - t0
        return buf.tolist()

    def allreduce_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over the ranks (in place on a CPU tensor's buffer)."""
        if self.size == 1:
            return tensor
        t0 = time.perf_counter()
        from mpi4py import MPI
        buf = tensor.detach().to("cpu").contiguous()
        if buf.dtype in HALF:       # summed in float32
            buf = buf.float()
        self.comm.Allreduce(MPI.IN_PLACE, buf.numpy(), op=MPI.SUM)
        self.clock.comm += time.perf_counter() - t0
        return buf.to(device=tensor.device, dtype=tensor.dtype)

    def broadcast_tensor(self, tensor: torch.Tensor | None, root: int,
                         template: torch.Tensor) -> torch.Tensor:
        """`tensor` from rank `root` on every rank (template gives shape and dtype)."""
        if self.size == 1:
            return tensor
        t0 = time.perf_counter()
        buf = (tensor.detach().to("cpu").contiguous().clone() if self.rank == root
               else torch.empty(template.shape, dtype=template.dtype))
        self.comm.Bcast(_buffer(buf), root=self._map(root))
        self.clock.comm += time.perf_counter() - t0
        return buf.to(template.device)

    def allgather(self, obj) -> list:
        """Every rank's `obj` (small Python values), in rank order, on every rank."""
        return self.comm.allgather(obj)

    def allgather_tensor(self, part: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The ranks' 1-D parts joined in rank order, on every rank; `counts`: every
        rank's part length (the same list on every rank; not on a mirrored view)."""
        if self.size == 1:
            return part
        if self.mirror:
            raise ValueError("allgather_tensor on a mirrored exchange: use the unmirrored one")
        t0 = time.perf_counter()
        whole = torch.empty(sum(counts), dtype=part.dtype)
        send = part.detach().to("cpu").contiguous()
        self.comm.Allgatherv(_buffer(send), _joined(whole, counts))
        self.clock.comm += time.perf_counter() - t0
        return whole.to(part.device)

    def gather_tensor(self, part: torch.Tensor, counts: list[int]) -> torch.Tensor | None:
        """The ranks' 1-D parts joined in rank order on rank 0 (None elsewhere), straight
        into one buffer there; `counts` as for allgather_tensor."""
        if self.size == 1:
            return part
        if self.mirror:
            raise ValueError("gather_tensor on a mirrored exchange: use the unmirrored one")
        t0 = time.perf_counter()
        send = part.detach().to("cpu").contiguous()
        whole = torch.empty(sum(counts), dtype=part.dtype) if self.rank == 0 else None
        self.comm.Gatherv(_buffer(send), None if whole is None else _joined(whole, counts),
                          root=0)
        self.clock.comm += time.perf_counter() - t0
        return None if whole is None else whole.to(part.device)

    def iallgather_ints(self, values):
        """Every rank's few integers, non-blocking: (request, table (size, len(values)))
        whose rows are filled once the request's Test() is True."""
        send = np.asarray(values, dtype=np.int64)
        table = np.empty((self.size, send.size), dtype=np.int64)
        return self.comm.Iallgather(send, table), table

    def abort(self, code: int) -> None:
        """End every rank of the communicator's job with exit status `code` (`abort`)."""
        abort(self.comm, code)

    def gather(self, values: list) -> list | None:
        """Every rank's `values` on rank 0 (None elsewhere)."""
        return self.comm.gather(values, root=0)

    def gather_each(self, obj, consume) -> None:
        """Every rank's `obj` to rank 0 in rank order, one at a time: rank 0 calls
        consume(rank, obj) for each, so it never holds two other ranks' objects
        (large ones: checkpointed warm starts).  `consume` must not raise."""
        if self.comm.Get_rank() != 0:
            self.comm.send(obj, dest=0, tag=self.GATHER_TAG)
            return
        consume(0, obj)
        for r in range(1, self.size):
            consume(r, self.comm.recv(source=r, tag=self.GATHER_TAG))
