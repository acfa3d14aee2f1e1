"""The process group's side of a distributed reduction: transfers, agreement, errors.

Every exchange waits at most the sharding's timeout (by default the group's own), and a
transfer that fails to start or to finish, or times out, raises
:class:`DistributedReductionError` naming the rank, the reduction and the step. Before any kernel runs, :func:`handshake` gathers from every
rank its status, a hash of its prepared call and its sizes: a rank that failed to
prepare, or a call that differs, makes every rank raise. After the kernels,
:func:`agree` does the same for failures during the reduction, so that no rank returns
a result that another could not compute.
"""

from __future__ import annotations

import contextlib
import hashlib

import torch
import torch.distributed as dist

from .context import Sharding


class DistributedReductionError(RuntimeError):
    """A distributed reduction failed on some rank, timed out, or the ranks disagree."""


class Comm:
    """One process group as a ring of ranks, on the data's device."""

    def __init__(self, sharding: Sharding, device):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("a distributed reduction needs torch.distributed: call "
                               "torch.distributed.init_process_group(...) on every rank first")
        group = sharding.group
        self.group = None if isinstance(group, str) and group == "world" else group
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        if self.rank < 0:
            raise ValueError("this process is not a member of the reduction's process group")
        self.timeout = sharding.timeout
        self.device = torch.device(device)

    def global_rank(self, k: int) -> int:
        k %= self.size
        return k if self.group is None else dist.get_global_rank(self.group, k)

    @contextlib.contextmanager
    def reported(self, what: str):
        """A transfer that fails (to start or to finish: a peer that died closes its
        connections, and starting a send to it fails at once) or times out raises
        :class:`DistributedReductionError`, saying ``what`` failed."""
        try:
            yield
        except DistributedReductionError:
            raise
        except RuntimeError as e:
            raise DistributedReductionError(
                f"rank {self.rank}: {what} failed: a rank of the group failed, died or did not "
                f"reach this step within the timeout ({_first_line(e)})") from e

    def exchange(self, sends: list, recvs: list, what: str) -> list:
        """Start ``sends`` and ``recvs`` (lists of ``(tensor, group rank, tag)``)."""
        ops = [dist.P2POp(dist.isend, t, self.global_rank(k), self.group, tag)
               for t, k, tag in sends]
        ops += [dist.P2POp(dist.irecv, t, self.global_rank(k), self.group, tag)
                for t, k, tag in recvs]
        if not ops:
            return []
        with self.reported(what):
            return list(dist.batch_isend_irecv(ops))

    def wait(self, works: list, what: str) -> None:
        """Wait for ``works``; a failure or timeout raises, saying ``what`` waited."""
        with self.reported(what):
            for w in works:
                if self.timeout is None:
                    w.wait()
                else:
                    w.wait(self.timeout)

    def _collective(self, start, what: str) -> None:
        with self.reported(what):
            work = start()
        self.wait([work], what)

    def all_gather(self, t: torch.Tensor, what: str) -> torch.Tensor:
        """``(size, *t.shape)``: every rank's ``t``."""
        out = [torch.empty_like(t) for _ in range(self.size)]
        self._collective(lambda: dist.all_gather(out, t, group=self.group, async_op=True), what)
        return torch.stack(out)

    def all_reduce_(self, t: torch.Tensor, what: str) -> torch.Tensor:
        self._collective(lambda: dist.all_reduce(t, group=self.group, async_op=True), what)
        return t

    def broadcast_(self, t: torch.Tensor, what: str) -> torch.Tensor:
        self._collective(lambda: dist.broadcast(t, self.global_rank(0), group=self.group,
                                                async_op=True), what)
        return t

    def gather_objects(self, obj, what: str) -> list:
        out = [None] * self.size
        with self.reported(what):
            dist.all_gather_object(out, obj, group=self.group)
        return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _describe_failure(failure: BaseException | None) -> str:
    return "" if failure is None else f"{type(failure).__name__}: {_first_line(failure)}"


def _raise_failures(comm: Comm, status: torch.Tensor, failure, what: str, when: str):
    failed = [k for k in range(comm.size) if int(status[k]) != 0]
    if not failed:
        return
    texts = comm.gather_objects(_describe_failure(failure), f"{what}: the failures' messages")
    detail = "; ".join(f"rank {k}: {texts[k]}" for k in failed)
    raise DistributedReductionError(
        f"rank {comm.rank}: {what}: rank{'s' if len(failed) > 1 else ''} "
        f"{', '.join(map(str, failed))} failed {when} ({detail})") from failure


def digest(description: str) -> list:
    """Four int64 words of the sha256 of ``description`` (a prepared call's identity)."""
    h = hashlib.sha256(description.encode()).digest()
    return [int.from_bytes(h[k: k + 8], "little", signed=True) for k in range(0, 32, 8)]


def handshake(comm: Comm, description: str, counts: list, failure, what: str) -> list:
    """Every rank's ``counts`` (a list per rank) once every rank prepared the same call.

    A rank that failed to prepare (``failure``) or whose ``description`` hashes
    differently makes every rank raise :class:`DistributedReductionError`; the failing
    rank's own exception is chained.
    """
    words = digest(description) if failure is None else [0, 0, 0, 0]
    mine = torch.tensor([1 if failure is not None else 0, *words, *counts], dtype=torch.int64,
                        device=comm.device)
    table = comm.all_gather(mine, f"{what}: the handshake").cpu()
    _raise_failures(comm, table[:, 0], failure, what, "before the reduction started")
    hashes = [tuple(row[1:5].tolist()) for row in table]
    if len(set(hashes)) > 1:
        texts = comm.gather_objects(description, f"{what}: the calls' descriptions")
        groups: dict = {}
        for k, h in enumerate(hashes):
            groups.setdefault(h, []).append(k)
        detail = "; ".join(f"rank{'s' if len(ks) > 1 else ''} {', '.join(map(str, ks))}: "
                           f"{texts[ks[0]]}" for ks in groups.values())
        raise DistributedReductionError(
            f"rank {comm.rank}: {what}: the ranks do not make the same reduction call (the "
            f"formula, reduction, options, dtypes, variables or gradient needs differ): {detail}")
    return [row[5:].tolist() for row in table]


def agree(comm: Comm, failure, what: str) -> None:
    """Raise on every rank if the reduction failed on any (``failure``: this rank's)."""
    status = torch.tensor([1 if failure is not None else 0], dtype=torch.int64,
                          device=comm.device)
    table = comm.all_gather(status, f"{what}: the final agreement").cpu()
    _raise_failures(comm, table[:, 0], failure, what, "during the reduction")
    if failure is not None:  # pragma: no cover - the table holds this rank's failure
        raise failure


def broadcast_tensors(comm: Comm, tensors: list, what: str) -> list:
    """Copies of ``tensors`` (one dtype) holding the group's first rank's values."""
    if not tensors or comm.size == 1:
        return [t.detach() for t in tensors]
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    comm.broadcast_(flat, f"{what}: the broadcast of the parameters")
    out, pos = [], 0
    for t in tensors:
        out.append(flat[pos: pos + t.numel()].view(t.shape))
        pos += t.numel()
    return out


__all__ = ["Comm", "DistributedReductionError", "agree", "broadcast_tensors", "digest",
           "handshake"]
