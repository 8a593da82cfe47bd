"""Growing a ``mooncake-cpu`` group: publishing a rank's segment, mapping
ranks that join (a new rank, or a new process taking over a dead rank's
number), and the two sides of an activation.

The store holds, under the group's prefix and generation ``gen``:

- ``seg/<rank>``: ``"<pid> <nonce> <where>"`` of the rank's current
  process; a replacement overwrites it, and the nonce tells the
  incarnations apart. Over shared memory ``where`` is
  ``/proc/<pid>/fd/<fd>``: the segment file is removed at once, and peers,
  even ones that join much later, open it through the owner's descriptor
  (a crash leaves no file behind). Over TCP it is ``"<host> <port>"``, the
  rank's listener, which takes peers in for as long as the group lives.
- ``act/<rank>/<nonce>``: written by the active ranks once they agreed to
  activate that incarnation: ``"<round> <active ranks>"``.
- ``ack/<rank>/<nonce>``: written by the joiner once it has mapped the
  active ranks and taken the group's round number; only then do the active
  ranks count it in (its control words are then the group's).

The decision itself (which ranks, agreed how) is the pure arithmetic of
``mooncake_pg::membership``.
"""

from __future__ import annotations

import os
import time
import uuid

import torch

from .. import _mooncake
from . import _plane, _tcp
from ._plane import RedOp

_native = _mooncake.pg

POLL_S = 0.002
# How long dialing a published TCP peer may take.
ATTACH_S = 10.0
SHM_DIR = os.environ.get("MOONCAKE_PG_SHM_DIR", "/dev/shm")


class GrowMixin:
    """The membership-growing half of ``MooncakeProcessGroup``."""

    # -- store keys ----------------------------------------------------
    def _key(self, what: str, rank: int, nonce: str | None = None) -> str:
        base = f"mooncake-pg/{self._gen}/{what}/{rank}"
        return base if nonce is None else f"{base}/{nonce}"

    def _publish(self, store, slot: int, ring: int):
        """Creates this rank's segment (over TCP: its slots and listener)
        and publishes it; returns the group, its peers not mapped yet."""
        if self._transport == "tcp":
            group = _tcp.new_group(self._rank, self._max, slot)
            nonce, where = f"{group.nonce:016x}", _tcp.address(group)
            self._seg_fd = None
        else:
            nonce = uuid.uuid4().hex[:12]
            path = os.path.join(SHM_DIR, f"mooncake-pg-{os.getpid()}-{nonce}-r{self._rank}")
            pending = _native.create(path, self._rank, self._max, slot, ring)
            try:
                self._seg_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            finally:
                os.unlink(path)
            group, where = pending.finish(), f"/proc/{os.getpid()}/fd/{self._seg_fd}"
        self._nonce = nonce
        self._inc[self._rank] = nonce
        store.set(self._key("seg", self._rank), f"{os.getpid()} {nonce} {where}")
        return group

    def _close_segment(self) -> None:
        fd, self._seg_fd = getattr(self, "_seg_fd", None), None
        for _, old in getattr(self, "_retired", []):
            if old is not None:
                os.close(old)
        self._retired = []
        if fd is not None:
            os.close(fd)

    def _published(self, rank: int, wait: bool = False):
        """``(pid, nonce, path)`` of ``rank``'s current process, or None."""
        key = self._key("seg", rank)
        if not wait and not self._store.check([key]):
            return None
        pid, nonce, path = self._store.get(key).decode().split(" ", 2)
        return int(pid), nonce, path

    def _attach(self, rank: int, pid: int, nonce: str, where: str) -> bool:
        """Maps (over TCP: dials) ``rank``'s incarnation ``nonce``; False if
        it is gone. A dead process's listener refuses at once; the bound
        is for a host that does not answer."""
        try:
            self._shm.attach(rank, where, pid, int(nonce, 16), min(self._timeout_s, ATTACH_S))
        except RuntimeError:
            return False
        self._inc[rank] = nonce
        self._plane.attach(rank)
        with self._state_lock:
            self._dead.discard(rank)
            self._unsynced.discard(rank)
        for key in [k for k in self._stash if k[0] == rank]:
            del self._stash[key]
        return not self._shm.dead([rank])

    # -- checks --------------------------------------------------------
    def _reincarnate(self) -> None:
        """Makes this process a new incarnation of its rank, as a
        replacement process would be: its old segment says it left, so
        it publishes a fresh one (the peers map it and start the
        mailboxes afresh) and waits, like an extension rank, to be
        activated."""
        # Drain: what the send and receive threads hold ends at once (a
        # rank that left finds every peer gone).
        self._senders.drain()
        self._receivers.drain()
        # The old segment and its descriptor stay until the group closes,
        # so nothing a peer or a late thread holds of it dangles.
        self._retired.append((self._shm, self._seg_fd))
        self._seg_fd = None
        if self._transport == "tcp":
            # Its peers' connections to the old incarnation end here.
            self._shm.close()
        self._shm = self._publish(self._store, self._slot_bytes, self._ring_bytes)
        self._inc = {self._rank: self._nonce}
        self._stash.clear()
        self._plane = self._new_plane()
        self._plane.ranks = [self._rank]
        with self._state_lock:
            self._joined = False
            self._left = False
            self._dead = set()
            self._unsynced = set()
            self._epoch += 1

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError("the mooncake-cpu process group was destroyed")

    def _prune_left(self) -> None:
        """Ranks that deactivated themselves leave this rank's active set
        (they announced it in their segment; they never come back)."""
        left = [
            r
            for r in self._plane.ranks
            if r != self._rank and self._shm.connected(r) and self._shm.flag(r, _plane.LEFT)
        ]
        if left:
            with self._state_lock:
                self._dead |= set(left)
                self._deactivate(set(left))

    def _expect(self, given: int) -> int:
        """How many ranks a symmetric collective's tensors must be sized
        for. Tensors sized for another count may follow a death this rank
        has not met yet, or one under way: with auto-deactivation the ranks
        first pass a barrier, which finds the dead ones alike on every rank
        (every rank of a symmetric collective sees the same mismatch)."""
        if given != self._n and self._auto_deactivate:
            self._run(self._plane.barrier, None)
        return self._n

    # -- queries -------------------------------------------------------
    def peer_ready(self, r: int) -> bool:
        """Whether ``r`` can take part: an active rank whose process runs,
        or an inactive one whose latest published process runs (it is
        mapped here on the way, ready to be activated)."""
        self._check_rank(r, "rank")
        if r == self._rank:
            return not self._left
        self._prune_left()
        if r in self._plane.ranks and self._shm.connected(r):
            return r not in self._dead and not self._shm.dead([r])
        pub = self._published(r)
        if pub is None:
            return False
        pid, nonce, path = pub
        if nonce == self._inc.get(r) and self._shm.connected(r):
            return not self._shm.dead([r])
        if self._fault is not None and self._fault.refuses(self._global_ranks[self._rank], self._global_ranks[r]):
            return False
        return self._attach(r, pid, nonce, path)

    # -- activation ----------------------------------------------------
    def activate(self, ranks) -> tuple[str, list[int]]:
        """Activates ``ranks`` on every active rank (each calls it with the
        same ranks); returns ``(reason, dropped)``: a reason when rejected,
        else the ranks asked for that did not join."""
        self._check_usable()
        if not self._joined or self._left:
            return "this rank is not active: it joins with join_group", []
        self._prune_left()
        try:
            want = _native.check_activation(self._max, self._plane.ranks, [int(r) for r in ranks])
        except ValueError as exc:
            return str(exc), []
        ready = [r for r in want if r not in self._plane.ranks and self.peer_ready(r)]
        vote = torch.tensor(_native.activation_vote(self._max, want, ready), dtype=torch.int64)
        self._run(lambda: self._plane.all_reduce(vote, RedOp.MAX), None)
        reason, active, add, dropped = _native.decide_activation(self._max, self._plane.ranks, vote.tolist())
        if reason:
            return reason, []
        record = f"{self._plane.k} {','.join(map(str, active))}"
        for r in add:
            self._store.set(self._key("act", r, self._inc[r]), record)
        late = [r for r in add if not self._await_ack(r)]
        with self._state_lock:
            self._plane.ranks = [r for r in active if r not in late]
            self._epoch += 1
        return "", sorted(dropped + late)

    def _await_ack(self, r: int) -> bool:
        """Until joiner ``r`` took the group's round; False if it died first."""
        key = self._key("ack", r, self._inc[r])
        deadline = time.monotonic() + self._timeout_s
        while not self._store.check([key]):
            if self._shm.dead([r]):
                return self._store.check([key])
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {r} did not take its activation within {self._timeout_s} s")
            time.sleep(POLL_S)
        return True

    def join(self) -> None:
        """Blocks until the active ranks activate this rank, then maps
        them and runs its operations with them. A rank that left (it
        deactivated itself, or its data path failed) rejoins in place."""
        if self._left and not self._closed:
            self._reincarnate()
        self._check_usable()
        if self._joined:
            return
        key = self._key("act", self._rank, self._nonce)
        deadline = time.monotonic() + self._timeout_s
        while not self._store.check([key]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self._rank} was not activated within {self._timeout_s} s")
            time.sleep(POLL_S)
        k_raw, ranks_raw = self._store.get(key).decode().split(" ", 1)
        k = int(k_raw)
        active = []
        for r in (int(x) for x in ranks_raw.split(",")):
            if r == self._rank:
                active.append(r)
                continue
            pid, nonce, path = self._published(r, wait=True)
            if (nonce == self._inc.get(r) and not self._shm.dead([r])) or self._attach(r, pid, nonce, path):
                active.append(r)
        # This rank's words become the group's: the round it is at.
        self._plane.k = k
        for flag in (_plane.ARRIVE, _plane.REDUCED, _plane.DONE):
            self._plane.post(flag, k)
        with self._state_lock:
            self._plane.ranks = active
            self._joined = True
            self._epoch += 1
        self._store.set(self._key("ack", self._rank, self._nonce), "1")
