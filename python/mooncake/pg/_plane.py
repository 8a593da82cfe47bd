"""Collectives over the ranks' shared slots.

Every collective is a sequence of rounds; a round moves at most one slot's
worth of bytes. In round ``k`` a rank writes into its slot ``k % 2``,
announces ``Arrive(k)``, waits for the others' ``Arrive(k)``, reads what it
needs from their slots, and announces ``Done(k)``. Before it writes slot
``k % 2`` again (round ``k + 2``) it waits for every peer's ``Done(k)``, so
one round's reads overlap the next round's writes. The rounds and the
partitions come from the pure schedules in ``mooncake._mooncake.pg``; torch
does the copies and the arithmetic, so every dtype and layout torch has
works, with torch's own vectorised kernels.
"""

from __future__ import annotations

import ctypes

import torch
import torch.distributed as dist

from .. import _mooncake
from . import _fault

_native = _mooncake.pg
ARRIVE, REDUCED, DONE, READY, LEFT = 0, 1, 2, 3, 4
MASK = 0xFFFFFFFF
RedOp = dist.ReduceOp.RedOpType

# CPU dtypes whose arithmetic torch lacks: reduced in float32.
_UPCAST = {
    getattr(torch, name)
    for name in (
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    )
    if hasattr(torch, name)
}


def _op_type(op) -> RedOp:
    return op.op if hasattr(op, "op") else RedOp(int(op))


def _combine(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: RedOp) -> None:
    if op in (RedOp.SUM, RedOp.AVG):
        torch.add(a, b, out=out)
    elif op == RedOp.PRODUCT:
        torch.mul(a, b, out=out)
    elif op == RedOp.MIN:
        torch.minimum(a, b, out=out)
    elif op == RedOp.MAX:
        torch.maximum(a, b, out=out)
    elif op == RedOp.BAND:
        torch.bitwise_and(a, b, out=out)
    elif op == RedOp.BOR:
        torch.bitwise_or(a, b, out=out)
    elif op == RedOp.BXOR:
        torch.bitwise_xor(a, b, out=out)
    else:
        raise ValueError(f"mooncake-cpu does not support reduce op {op}")


def check_op(op: RedOp, dtype: torch.dtype) -> None:
    """Refuse what cannot be reduced before any rank starts moving bytes."""
    if op == RedOp.PREMUL_SUM:
        raise ValueError("mooncake-cpu does not support PREMUL_SUM")
    if op == RedOp.AVG and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"ReduceOp.AVG needs a floating-point tensor, not {dtype}")
    if op in (RedOp.BAND, RedOp.BOR, RedOp.BXOR) and (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"bitwise reduce op {op} needs an integer or bool tensor, not {dtype}")
    if op in (RedOp.MIN, RedOp.MAX) and dtype.is_complex:
        raise ValueError(f"{op} is undefined for complex tensors")


def reduce_into(out: torch.Tensor, srcs: list[torch.Tensor], op: RedOp) -> None:
    """``out = srcs[0] op srcs[1] op ...`` in list order, so every rank that
    computes the same result computes it bitwise the same. ``out`` must not
    alias any of ``srcs`` but the first."""
    if out.dtype in _UPCAST:
        acc = torch.empty(out.shape, dtype=torch.float32)
        reduce_into(acc, [s.float() for s in srcs], op)
        out.copy_(acc)
        return
    if len(srcs) == 1:
        if out.data_ptr() != srcs[0].data_ptr():
            out.copy_(srcs[0])
        return
    _combine(out, srcs[0], srcs[1], op)
    for s in srcs[2:]:
        _combine(out, out, s, op)


def divide(t: torch.Tensor, n: int) -> None:
    """``t /= n`` in place (for AVG), through float32 where torch has no
    arithmetic for the dtype."""
    if n == 1:
        return
    if t.dtype in _UPCAST:
        t.copy_(t.float() / n)
    else:
        t.div_(n)


def flat(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A flat contiguous view of ``t``, or a copy (True) to write back."""
    if t.is_contiguous():
        return t.view(-1) if t.dim() != 1 else t, False
    return t.contiguous().view(-1), True


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a flat contiguous tensor."""
    if t.dtype == torch.uint8:
        return t
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    return t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


class GroupBroken(RuntimeError):
    """A point-to-point operation could not complete because its peer died."""

    def __init__(self, ranks: list[int]):
        super().__init__(f"ranks {sorted(ranks)} of the group are dead")
        self.mooncake_failed_ranks = sorted(ranks)


class Plane:
    """One rank's rounds over the group's slots.

    ``ranks`` are the active ranks, in group order; a collective runs over
    them, and the position of a rank in it is its index in gathered and
    scattered tensors. A rank found dead during an operation (it never
    posted a word the others wait on) is added to ``missing``: the
    operation goes on without it from that round on, and the caller
    reports it. Every rank waits for every live rank's Arrive in every
    round, and a dead rank's words no longer move, so every survivor finds
    the same ranks missing at the same round and computes the same result.
    """

    def __init__(self, shm, rank: int, world: int, timeout_s: float, fault=None, global_ranks=None):
        self.shm = shm
        self.rank = rank
        self.world = world
        self.timeout_s = timeout_s
        self.k = 0
        self._tcp = shm.transport == "tcp"
        self.ranks = list(range(world))
        self.missing: set[int] = set()
        self.slot_bytes = shm.slot_bytes
        self._slots: list[list[torch.Tensor] | None] = [None] * world
        self._typed: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}
        # Over TCP (_tcp) the bytes written into this rank's slot travel
        # with the round's post: the plane says which.
        self._touch = shm.touch if self._tcp else None
        for r in range(world):
            if shm.connected(r):
                self.attach(r)
        if fault is not None:
            # The test-only hook (_fault): only a group made with it set
            # pays for the check.
            self._fault = fault
            self._global = global_ranks
            self.post = self._post_checked

    @property
    def ranks(self) -> list[int]:
        return self._ranks

    @ranks.setter
    def ranks(self, ranks: list[int]) -> None:
        # Over TCP a collective's words go to the active ranks only (a
        # rank dialed but not activated runs its own rounds meanwhile).
        self._ranks = ranks
        if self._tcp:
            self.shm.set_members(ranks)

    def attach(self, rank: int) -> None:
        """Views of ``rank``'s slots, once it is mapped (again)."""
        self._typed = {key: v for key, v in self._typed.items() if key[0] != rank}
        self._slots[rank] = [
            torch.frombuffer(
                (ctypes.c_uint8 * self.slot_bytes).from_address(self.shm.slot_addr(rank, s)),
                dtype=torch.uint8,
            )
            for s in range(2)
        ]

    # -- rounds ----------------------------------------------------------
    def live(self) -> list[int]:
        if not self.missing:
            return self.ranks
        return [r for r in self.ranks if r not in self.missing]

    def _wait(self, flag: int, k: int, ranks=None) -> set[int]:
        """Waits for ``ranks`` (default: the live ones); returns those found
        dead instead, which are missing from now on."""
        got = self.shm.wait(self.live() if ranks is None else ranks, flag, k, self.timeout_s)
        self.missing.update(got)
        return set(got)

    def begin(self) -> tuple[int, int]:
        self.k = (self.k + 1) & MASK
        k = self.k
        self._wait(DONE, (k - 2) & MASK)
        if self._touch is not None:
            self.shm.clean(k & 1)
        return k, k & 1

    def post(self, flag: int, k: int) -> None:
        self.shm.post(flag, k)

    def _post_checked(self, flag: int, k: int) -> None:
        """``post`` through the fault hook: an Arrive is this rank's part
        of a round, a transfer to each live peer."""
        if flag == ARRIVE:
            self._check_transfer()
        self.shm.post(flag, k)

    def _check_transfer(self) -> None:
        if getattr(self, "_fault", None) is None:
            return
        peers = [r for r in self.live() if r != self.rank]
        g = self._global
        failed = self._fault.transfer(g[self.rank], [g[r] for r in peers])
        if failed:
            raise _fault.TransferFailed([r for r in peers if g[r] in failed])

    def view(self, rank: int, slot: int, dtype: torch.dtype, n: int, at: int = 0) -> torch.Tensor:
        """``n`` elements of ``dtype`` from element ``at`` of a slot."""
        # One slice of a cached typed view: small operations are mostly
        # this bookkeeping.
        typed = self._typed.get((rank, slot, dtype))
        if typed is None:
            typed = self._typed[(rank, slot, dtype)] = self._slots[rank][slot].view(dtype)
        if rank == self.rank and self._touch is not None:
            self._touch(slot, at * dtype.itemsize, (at + n) * dtype.itemsize)
        return typed[at : at + n]

    def per(self, dtype: torch.dtype, blocks: int) -> int:
        return _native.block_elems(self.slot_bytes, dtype.itemsize, blocks)

    def pos(self, rank: int) -> int:
        """``rank``'s index among the active ranks."""
        return self.ranks.index(rank)

    # -- collectives -----------------------------------------------------
    def barrier(self) -> None:
        k, _ = self.begin()
        self.post(ARRIVE, k)
        self._wait(ARRIVE, k)
        self.post(DONE, k)

    def all_reduce(self, t: torch.Tensor, op: RedOp) -> None:
        f, back = flat(t)
        if len(self.live()) > 1:
            # Decided on the group's capacity, which every rank agrees on
            # even while their views of a rank that just died differ.
            direct = _native.all_reduce_direct(f.numel() * f.element_size(), self.world)
            for a, b in _native.rounds(f.numel(), self.per(f.dtype, 1)):
                m = b - a
                k, s = self.begin()
                if not direct and self._touch is not None:
                    lost = self._scatter_gather_tcp(f, a, b, op, k, s)
                    self.post(DONE, k)
                    for lo, hi in lost:
                        self._finish_lost(f[a:b], lo, hi, op)
                    continue
                mine = self.view(self.rank, s, f.dtype, m)
                mine.copy_(f[a:b])
                self.post(ARRIVE, k)
                self._wait(ARRIVE, k)
                live = self.live()
                srcs = [self.view(r, s, f.dtype, m) for r in live]
                if direct or len(live) == 1:
                    reduce_into(f[a:b], srcs, op)
                else:
                    parts = _native.partition(m, len(live))

                    def order(i, lo, hi):
                        # Part i is reduced in rank live[i]'s order, by it or
                        # by the survivors when it died before posting it.
                        return [srcs[i][lo:hi]] + [x[lo:hi] for j, x in enumerate(srcs) if j != i]

                    me = live.index(self.rank)
                    lo, hi = parts[me]
                    reduce_into(mine[lo:hi], order(me, lo, hi), op)
                    if self._touch is not None:
                        # Over TCP the peers have the rest from Arrive.
                        self.shm.clean(s)
                        self._touch(s, lo * f.element_size(), hi * f.element_size())
                    self.post(REDUCED, k)
                    gone = self._wait(REDUCED, k, live)
                    for i, (lo, hi) in enumerate(parts):
                        if live[i] in gone:
                            reduce_into(f[a + lo : a + hi], order(i, lo, hi), op)
                        else:
                            f[a + lo : a + hi].copy_(srcs[i][lo:hi])
                self.post(DONE, k)
        if op == RedOp.AVG:
            divide(f, len(self.live()))
        if back:
            t.copy_(f.view(t.shape))

    def _scatter_gather_tcp(self, f, a: int, b: int, op: RedOp, k: int, s: int) -> list[tuple[int, int]]:
        """One round of a large all_reduce over TCP, straight from and into
        ``f[a:b]``: each peer gets only the part it reduces (Arrive), then
        every rank's reduced part goes to all (Reduced), about twice the
        chunk per rank in all; the peers' bytes land in their slot copies.
        Returns the parts (element ranges of the chunk) whose owners went
        missing before their reduced part reached this rank: those still
        hold this rank's own input, for ``_finish_lost``."""
        es = f.element_size()
        chunk = f[a:b]
        addr, nbytes = chunk.data_ptr(), chunk.numel() * es
        # Every rank partitions among the same ranks (the active ones not
        # missing yet, which every survivor agrees on), even those it
        # already sees dead: their parts are finished as lost ones.
        members = self.live()
        parts = _native.owned_parts(b - a, members, self.world)
        self._check_transfer()
        self.shm.post_parts(ARRIVE, k, [(lo * es, hi * es) for lo, hi in parts], addr, nbytes)
        self._wait(ARRIVE, k)
        lo, hi = parts[self.rank]
        peers = [r for r in members if r != self.rank and r not in self.missing]
        reduce_into(chunk[lo:hi], [chunk[lo:hi]] + [self.view(r, s, f.dtype, hi - lo, lo) for r in peers], op)
        self.shm.post_parts(REDUCED, k, [(lo * es, hi * es)] * self.world, addr, nbytes)
        self._wait(REDUCED, k)
        lost = []
        for r in members:
            plo, phi = parts[r]
            if r == self.rank or phi == plo:
                continue
            if r in self.missing:
                lost.append((plo, phi))
            else:
                chunk[plo:phi].copy_(self.view(r, s, f.dtype, phi - plo, plo))
        return lost

    def _finish_lost(self, chunk: torch.Tensor, lo: int, hi: int, op: RedOp) -> None:
        """Reduces ``chunk[lo:hi]``, the part of a rank that went missing
        mid-round, among the survivors, in a round of its own: each sends
        every other its input of the part (which the chunk still holds
        there), then each reduces the inputs in rank order, so all compute
        the same result. Shaped as a scatter-gather round (Arrive, Reduced,
        Done), so that a survivor that saw the part complete (its owner
        died between sending it to one peer and another, the one case the
        survivors can see differently) still finds the words it waits on."""
        es = chunk.element_size()
        k, s = self.begin()
        mine = chunk[lo:hi]
        self.shm.post_parts(ARRIVE, k, [(lo * es, hi * es)] * self.world, chunk.data_ptr(), chunk.numel() * es)
        self._wait(ARRIVE, k)
        srcs = [mine if r == self.rank else self.view(r, s, chunk.dtype, hi - lo, lo) for r in self.live()]
        out = torch.empty_like(mine)
        reduce_into(out, srcs, op)
        mine.copy_(out)
        self.post(REDUCED, k)
        self._wait(REDUCED, k)
        self.post(DONE, k)

    # Rooted collectives: every rank posts and waits for every live rank's
    # Arrive, not only the root's, so that a dead rank is found missing at
    # the same word by every survivor (the same membership everywhere).

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        f, back = flat(t)
        got = False
        # Over TCP a receiver takes the root's bytes into a scratch buffer
        # and writes the tensor once every round arrived: a root that dies
        # midway (even halfway into a round) leaves the tensor untouched.
        staged = self._touch is not None and self.rank != root
        # (A non-contiguous tensor's flat copy is a scratch buffer already.)
        dst = f if not staged or back else self._staging(f)
        for a, b in _native.rounds(f.numel(), self.per(f.dtype, 1)):
            k, s = self.begin()
            if self.rank == root and self._touch is not None:
                # Over TCP the root sends from the tensor, not its slot.
                chunk = f[a:b]
                n = chunk.numel() * chunk.element_size()
                self._check_transfer()
                self.shm.post_parts(ARRIVE, k, [(0, n)] * self.world, chunk.data_ptr(), n)
                self._wait(ARRIVE, k)
            elif staged and root not in self.missing:
                # Over TCP the root's bytes go straight into the scratch
                # buffer when they have not arrived yet.
                chunk = dst[a:b]
                into = self.shm.redirect(root, ARRIVE, k, chunk.data_ptr(), chunk.numel() * chunk.element_size())
                filled = False
                try:
                    self.post(ARRIVE, k)
                    self._wait(ARRIVE, k)
                finally:
                    if into:
                        filled = self.shm.end_redirect(root, self.timeout_s)
                if root not in self.missing:
                    if not filled:
                        chunk.copy_(self.view(root, s, f.dtype, b - a))
                    got = True
            else:
                if self.rank == root:
                    self.view(root, s, f.dtype, b - a).copy_(f[a:b])
                self.post(ARRIVE, k)
                self._wait(ARRIVE, k)
                if self.rank != root and root not in self.missing:
                    f[a:b].copy_(self.view(root, s, f.dtype, b - a))
                    got = True
            self.post(DONE, k)
        if staged:
            got = root not in self.missing
            if got and dst is not f:
                f.copy_(dst)
        if back and got:
            t.copy_(f.view(t.shape))

    def _staging(self, f: torch.Tensor) -> torch.Tensor:
        """A scratch buffer shaped as ``f``, reused across calls (a fresh
        one would page-fault in every time)."""
        n = f.numel() * f.element_size()
        buf = getattr(self, "_stage", None)
        if buf is None or buf.numel() < n:
            buf = self._stage = torch.empty(n, dtype=torch.uint8)
        return buf[:n].view(f.dtype) if n else f

    def all_gather(self, outs: list[torch.Tensor], inp: torch.Tensor) -> None:
        """``outs[i]`` (flat, contiguous, ``inp``'s size) gets the input of
        the ``i``-th active rank; a missing rank's is left as it was."""
        f, _ = flat(inp)
        for a, b in _native.rounds(f.numel(), self.per(f.dtype, 1)):
            k, s = self.begin()
            self.view(self.rank, s, f.dtype, b - a).copy_(f[a:b])
            self.post(ARRIVE, k)
            self._wait(ARRIVE, k)
            for i, r in enumerate(self.ranks):
                if r not in self.missing:
                    outs[i][a:b].copy_(self.view(r, s, f.dtype, b - a))
            self.post(DONE, k)

    def reduce_scatter(self, out: torch.Tensor, blocks: list[torch.Tensor], op: RedOp) -> None:
        """``out`` (flat) gets block ``pos(rank)`` of the live ranks'
        ``blocks`` reduced."""
        n = out.numel()
        me = self.pos(self.rank)
        for a, b in _native.rounds(n, self.per(out.dtype, self.world)):
            m = b - a
            k, s = self.begin()
            for i in range(len(self.ranks)):
                self.view(self.rank, s, out.dtype, m, i * m).copy_(blocks[i][a:b])
            self.post(ARRIVE, k)
            self._wait(ARRIVE, k)
            srcs = [self.view(r, s, out.dtype, m, me * m) for r in self.live()]
            reduce_into(out[a:b], srcs, op)
            self.post(DONE, k)
        if op == RedOp.AVG:
            divide(out, len(self.live()))

    def reduce(self, t: torch.Tensor, root: int, op: RedOp) -> None:
        f, back = flat(t)
        for a, b in _native.rounds(f.numel(), self.per(f.dtype, 1)):
            m = b - a
            k, s = self.begin()
            self.view(self.rank, s, f.dtype, m).copy_(f[a:b])
            self.post(ARRIVE, k)
            self._wait(ARRIVE, k)
            if self.rank == root:
                reduce_into(f[a:b], [self.view(r, s, f.dtype, m) for r in self.live()], op)
            self.post(DONE, k)
        if self.rank == root:
            if op == RedOp.AVG:
                divide(f, len(self.live()))
            if back:
                t.copy_(f.view(t.shape))

    def gather(self, outs: list[torch.Tensor] | None, inp: torch.Tensor, root: int) -> None:
        f, _ = flat(inp)
        for a, b in _native.rounds(f.numel(), self.per(f.dtype, 1)):
            k, s = self.begin()
            self.view(self.rank, s, f.dtype, b - a).copy_(f[a:b])
            self.post(ARRIVE, k)
            self._wait(ARRIVE, k)
            if self.rank == root:
                for i, r in enumerate(self.ranks):
                    if r not in self.missing:
                        outs[i][a:b].copy_(self.view(r, s, f.dtype, b - a))
            self.post(DONE, k)

    def scatter(self, out: torch.Tensor, ins: list[torch.Tensor] | None, root: int) -> None:
        n = out.numel()
        me = self.pos(self.rank)
        for a, b in _native.rounds(n, self.per(out.dtype, self.world)):
            m = b - a
            k, s = self.begin()
            if self.rank == root:
                for i in range(len(self.ranks)):
                    self.view(root, s, out.dtype, m, i * m).copy_(ins[i][a:b])
            self.post(ARRIVE, k)
            self._wait(ARRIVE, k)
            if root not in self.missing:
                out[a:b].copy_(self.view(root, s, out.dtype, m, me * m))
            self.post(DONE, k)

    def all_to_all(self, outs: list[torch.Tensor], ins: list[torch.Tensor], longest: int) -> None:
        """``outs[i]`` gets the ``i``-th active rank's block for this rank;
        ``ins[i]`` goes to the ``i``-th; all flat. ``longest`` is the
        longest block any rank sends (the same on every rank)."""
        dtype = outs[0].dtype if outs else ins[0].dtype
        per = self.per(dtype, self.world)
        me = self.pos(self.rank)
        for a, b in _native.rounds(longest, per):
            k, s = self.begin()
            for i in range(len(self.ranks)):
                lo, hi = min(a, ins[i].numel()), min(b, ins[i].numel())
                if hi > lo:
                    self.view(self.rank, s, dtype, hi - lo, i * per).copy_(ins[i][lo:hi])
            self.post(ARRIVE, k)
            self._wait(ARRIVE, k)
            for i, r in enumerate(self.ranks):
                lo, hi = min(a, outs[i].numel()), min(b, outs[i].numel())
                if hi > lo and r not in self.missing:
                    outs[i][lo:hi].copy_(self.view(r, s, dtype, hi - lo, me * per))
            self.post(DONE, k)
