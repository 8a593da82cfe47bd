"""The ``mooncake-cpu`` process group: a ``torch.distributed.ProcessGroup``
subclass whose operations run on the shared-memory plane (``_plane``) and
the per-peer mailboxes of ``mooncake._mooncake.pg``."""

from __future__ import annotations

import collections
import os
import threading

import torch
import torch.distributed as dist

from .. import _mooncake
from . import _fault, _plane, _tcp
from ._channels import Channels
from ._grow import GrowMixin
from ._plane import GroupBroken, Plane, RedOp, _op_type, check_op, flat
from ._options import MooncakeBackendOptions
from ._work import MooncakeWork, Ready

_native = _mooncake.pg


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a byte count") from None


def _check_options(opts, size: int) -> None:
    """Refuses what this backend cannot do rather than ignore it."""
    if opts.max_group_size and opts.max_group_size < size:
        raise ValueError(
            f"max_group_size {opts.max_group_size} is smaller than the group's {size} ranks"
        )
    if opts.auto_sync_on_failure and not opts.auto_deactivate_on_failure:
        raise ValueError(
            "auto_sync_on_failure needs auto_deactivate_on_failure: without it a failed "
            "operation has no membership change to synchronise"
        )


class MooncakeProcessGroup(GrowMixin, dist.ProcessGroup):
    """A group of ranks (on one host: shared memory; else TCP), joined
    through the c10d store.

    ``max_group_size`` rank numbers are reserved; the first ``size`` are
    active from the start, the others join later (``recover_ranks`` on the
    active ranks, ``join_group`` on an ``is_extension`` rank)."""

    # batch_isend_irecv calls send/recv per operation, each returning its
    # own Work (the reference's tests read each one's failure); they are
    # issued together all the same: each peer has its own channels.
    supports_coalescing = False

    def __init__(self, store, rank: int, size: int, timeout_s: float, options=None, global_ranks=None):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._timeout_s = timeout_s
        self._options = options
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        opts = options if options is not None else MooncakeBackendOptions(size)
        _check_options(opts, size)
        self._max = opts.max_group_size or size
        # Ranks reserved past the initial group are named by their group rank.
        self._global_ranks += list(range(len(self._global_ranks), self._max))
        self._fault = _fault.hook()
        # An extension rank runs alone until it is activated (join_group).
        self._joined = not opts.is_extension
        self._left = False
        self._store = store
        # The incarnation (segment nonce) of each mapped rank.
        self._inc: dict[int, str] = {}
        self._auto_deactivate = opts.auto_deactivate_on_failure
        self._auto_sync = opts.auto_sync_on_failure
        # Ranks found dead by any operation; the ones not yet reconciled by
        # sync_after_failure; the membership view's epoch.
        self._dead: set[int] = set()
        self._unsynced: set[int] = set()
        self._epoch = 0
        self._state_lock = threading.Lock()
        self._closed = False
        self._slot_bytes = _env_bytes("MOONCAKE_PG_SLOT_BYTES", 4 << 20)
        self._ring_bytes = _env_bytes("MOONCAKE_PG_MAILBOX_BYTES", 4 << 20)
        # Segments this process owned before it rejoined in place.
        self._retired: list = []
        self._shm = self._rendezvous(store, self._slot_bytes, self._ring_bytes)
        self._plane = self._new_plane()
        self._plane.ranks = list(range(size)) if self._joined else [rank]
        self._senders = Channels("mooncake-pg-send")
        self._receivers = Channels("mooncake-pg-recv")
        # Held while one message from a peer is read (header, then body):
        # a receive from any source may read from the same peer.
        self._rx_locks = collections.defaultdict(threading.Lock)
        # Messages read past while looking for another tag: (src, tag) -> bytes.
        self._stash: dict[tuple[int, int], collections.deque] = collections.defaultdict(collections.deque)

    # -- setup -----------------------------------------------------------
    def _rendezvous(self, store, slot: int, ring: int):
        """Each rank creates its segment (over TCP: its listener) and
        publishes it in the store; the initial ranks map (dial) each
        other's and wait until all have mapped all. An extension rank maps
        its peers when it is activated."""
        rank, size = self._rank, self._size
        if self._joined:
            # A destroyed and re-created group may reuse the store's prefix:
            # the generation keeps its keys apart from the last one's.
            gen = store.add(f"mooncake-pg/gen/{rank}", 1)
            store.set("mooncake-pg/gen", str(gen))
        else:
            gen = int(store.get("mooncake-pg/gen"))
        self._gen = gen
        if self._joined:
            self._transport = _tcp.transport(store, lambda r: self._key("host", r), rank, size)
            # What extension ranks of this generation join.
            store.set(self._key("transport", rank), self._transport)
        else:
            self._transport = _tcp.forced() or store.get(self._key("transport", 0)).decode()
        group = self._publish(store, slot, ring)
        if not self._joined:
            return group
        try:
            for peer in range(size):
                if peer != rank:
                    pid, nonce, where = self._published(peer, wait=True)
                    group.attach(peer, where, pid, int(nonce, 16), self._timeout_s)
                    self._inc[peer] = nonce
            if self._transport == "tcp":
                group.wait_connected([p for p in range(size) if p != rank], self._timeout_s)
            self._ready(group, gen)
        except BaseException:
            if self._transport == "tcp":
                group.close()
            raise
        return group

    def _ready(self, shm, gen: int) -> None:
        """Until every rank is connected to all the others."""
        shm.post(_plane.READY, gen & _plane.MASK)
        dead = shm.wait(list(range(self._size)), _plane.READY, gen & _plane.MASK, self._timeout_s)
        if dead:
            raise RuntimeError(f"ranks {dead} of the mooncake-cpu group died while it was set up")

    def _new_plane(self) -> Plane:
        return Plane(self._shm, self._rank, self._max, self._timeout_s, self._fault, self._global_ranks)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "mooncake-cpu"

    @property
    def name(self):
        return "mooncake-cpu"

    def _get_backend(self, device=None):
        return self

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._senders.shutdown(wait=True)
        self._receivers.shutdown(wait=True)
        self._close_transport()

    def abort(self) -> None:
        self._closed = True
        self._senders.shutdown(wait=False)
        self._receivers.shutdown(wait=False)
        self._close_transport()

    def _close_transport(self) -> None:
        if self._transport == "tcp":
            self._shm.close()
        self._close_segment()

    # -- membership ----------------------------------------------------
    @property
    def _n(self) -> int:
        """How many ranks are active: the size collectives' tensors follow."""
        return len(self._plane.ranks)

    def _observe(self, dead) -> None:
        """Records ranks an operation found dead; with auto-deactivation
        they leave the active set (a new epoch) before the operation
        completes. A collective's finding is every survivor's (they wait
        on the same words); a point-to-point one is this rank's first, and
        the others' collectives find the same dead process by themselves."""
        dead = set(dead)
        # A rank that left finds every peer gone; they are not.
        if not dead or self._left:
            return
        with self._state_lock:
            self._dead |= dead
            if not self._auto_sync:
                self._unsynced |= dead
            if self._auto_deactivate:
                self._deactivate(dead)

    def _deactivate(self, ranks) -> None:
        active = [r for r in self._plane.ranks if r not in ranks]
        if active != self._plane.ranks:
            self._plane.ranks = active
            self._epoch += 1

    def active_ranks(self) -> list[int]:
        self._prune_left()
        return list(self._plane.ranks)

    def epoch(self) -> int:
        return self._epoch

    def size(self) -> int:
        """The extent of the active rank space (one past the highest active
        rank); a rank waiting to join reports the size it declared."""
        return _native.visible_size(self._plane.ranks, self._size, self._joined and not self._left)

    @property
    def max_group_size(self) -> int:
        return self._max

    def deactivate(self, ranks: list[int]) -> tuple[list[int], str]:
        """Removes dead ``ranks`` from the active set; returns the ones it
        removed, or a reason to refuse. Every survivor finds the same ranks
        dead, so each applies the same change without a coordinator; a
        live peer cannot be removed this way (it would go on waiting for
        the others). A rank may remove itself: it takes part in no more
        operations, and its peers see it as gone."""
        for r in ranks:
            self._check_rank(r, "rank")
        others = [r for r in ranks if r != self._rank]
        alive = [r for r in others if self._shm.connected(r) and r not in self._dead and not self._shm.dead([r])]
        if alive:
            return [], f"ranks {alive} are alive: mooncake-cpu deactivates dead ranks or the calling rank only"
        with self._state_lock:
            if len(others) != len(ranks):
                self._depart_locked()
            self._dead |= set(others)
            removed = [r for r in ranks if r in self._plane.ranks]
            self._deactivate(set(ranks))
        return removed, ""

    def _depart_locked(self) -> None:
        """This rank leaves the group (its peers see it gone); it may come
        back in place with ``join_group``."""
        if not self._left:
            self._left = True
            self._shm.post(_plane.LEFT, 1)
        self._deactivate({self._rank})

    def sync_after_failure(self) -> bool:
        """Applies the failures seen so far to the membership view (with
        auto-deactivation); whether any were pending."""
        with self._state_lock:
            pending = bool(self._unsynced)
            if self._auto_deactivate:
                self._deactivate(self._dead)
            self._unsynced.clear()
        return pending

    # -- running operations --------------------------------------------
    def _run(self, fn, result) -> MooncakeWork:
        self._check_usable()
        if self._left:
            # Out of the group until it rejoins: refused locally, as failed.
            return MooncakeWork(result, failed=self._plane.ranks, group_size=self._max)
        self._plane.missing = set()
        lost = []
        try:
            fn()
        except _fault.TransferFailed as exc:
            # This rank could not deliver its part: it leaves, so its
            # peers complete the round without it.
            lost = exc.ranks
            with self._state_lock:
                self._depart_locked()
        finally:
            missing = sorted(self._plane.missing)
            self._plane.missing = set()
            self._observe(missing)
        return MooncakeWork(result, failed=missing + lost, group_size=self._max)

    @staticmethod
    def _root(opts) -> int:
        return int(opts.rootRank)

    def _check_rank(self, r: int, what: str) -> None:
        if not 0 <= r < self._max:
            raise ValueError(f"{what} {r} is outside a group of {self._max}")

    def _check_root(self, r: int, what: str) -> None:
        self._check_rank(r, what)
        if r not in self._plane.ranks:
            raise ValueError(f"{what} {r} is not an active rank of the group")

    # -- collectives ---------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = _op_type(opts.reduceOp) if opts is not None else RedOp.SUM
        for t in tensors:
            check_op(op, t.dtype)
        return self._run(lambda: [self._plane.all_reduce(t, op) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        root = self._root(opts)
        self._check_root(root, "broadcast root")
        return self._run(lambda: [self._plane.broadcast(t, root) for t in tensors], tensors)

    def barrier(self, opts=None):
        return self._run(self._plane.barrier, None)

    def _gather_into(self, outs: list[torch.Tensor], inp: torch.Tensor) -> None:
        flats = [flat(o) for o in outs]
        self._plane.all_gather([f for f, _ in flats], inp)
        for o, (f, back) in zip(outs, flats):
            if back:
                o.copy_(f.view(o.shape))

    def allgather(self, output_lists, inputs, opts=None):
        for outs in output_lists:
            if len(outs) != self._expect(len(outs)):
                raise ValueError(f"all_gather needs {self._n} output tensors, got {len(outs)}")
        return self._run(
            lambda: [self._gather_into(outs, inp) for outs, inp in zip(output_lists, inputs)],
            output_lists,
        )

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def _gather_single(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if out.numel() != inp.numel() * self._expect(out.numel() // max(inp.numel(), 1)):
            raise ValueError(
                f"all_gather_into_tensor: output has {out.numel()} elements, "
                f"not {self._n} x {inp.numel()}"
            )
        f, back = flat(out)
        self._plane.all_gather(list(f.chunk(self._n)) if inp.numel() else [f] * self._n, inp)
        if back:
            out.copy_(f.view(out.shape))

    def all_gather_single(self, out, inp, opts=None):
        return self._run(lambda: self._gather_single(out, inp), [out])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outs, inps, opts=None):
        return self._run(lambda: [self._gather_single(o, i) for o, i in zip(outs, inps)], outs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _reduce_scatter_single(self, out, inp, op) -> None:
        if inp.numel() != out.numel() * self._expect(inp.numel() // max(out.numel(), 1)):
            raise ValueError(
                f"reduce_scatter_tensor: input has {inp.numel()} elements, "
                f"not {self._n} x {out.numel()}"
            )
        check_op(op, out.dtype)
        fi, _ = flat(inp)
        fo, back = flat(out)
        blocks = list(fi.chunk(self._n)) if out.numel() else [fi] * self._n
        self._plane.reduce_scatter(fo, blocks, op)
        if back:
            out.copy_(fo.view(out.shape))

    def reduce_scatter_single(self, out, inp, opts=None):
        op = _op_type(opts.reduceOp) if opts is not None else RedOp.SUM
        check_op(op, out.dtype)
        return self._run(lambda: self._reduce_scatter_single(out, inp, op), [out])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outs, inps, opts=None):
        op = _op_type(opts.reduceOp) if opts is not None else RedOp.SUM
        return self._run(
            lambda: [self._reduce_scatter_single(o, i, op) for o, i in zip(outs, inps)], outs
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, outs, input_lists, opts=None):
        op = _op_type(opts.reduceOp) if opts is not None else RedOp.SUM

        def run():
            for out, ins in zip(outs, input_lists):
                if len(ins) != self._expect(len(ins)):
                    raise ValueError(f"reduce_scatter needs {self._n} inputs, got {len(ins)}")
                check_op(op, out.dtype)
                fo, back = flat(out)
                self._plane.reduce_scatter(fo, [flat(i)[0] for i in ins], op)
                if back:
                    out.copy_(fo.view(out.shape))

        return self._run(run, outs)

    def reduce(self, tensors, opts):
        root = self._root(opts)
        self._check_root(root, "reduce root")
        op = _op_type(opts.reduceOp)
        for t in tensors:
            check_op(op, t.dtype)
        return self._run(lambda: [self._plane.reduce(t, root, op) for t in tensors], tensors)

    def gather(self, output_lists, inputs, opts):
        root = self._root(opts)
        self._check_root(root, "gather root")
        if self._rank == root and (not output_lists or len(output_lists[0]) != self._n):
            raise ValueError(f"gather on its root needs {self._n} output tensors")

        def run():
            if self._rank == root:
                flats = [flat(o) for o in output_lists[0]]
                self._plane.gather([f for f, _ in flats], inputs[0], root)
                for o, (f, back) in zip(output_lists[0], flats):
                    if back:
                        o.copy_(f.view(o.shape))
            else:
                self._plane.gather(None, inputs[0], root)

        return self._run(run, output_lists)

    def gather_single(self, out, inp, opts):
        root = self._root(opts)
        self._check_root(root, "gather root")

        def run():
            if self._rank == root:
                f, back = flat(out)
                self._plane.gather(list(f.chunk(self._n)) if inp.numel() else [f] * self._n, inp, root)
                if back:
                    out.copy_(f.view(out.shape))
            else:
                self._plane.gather(None, inp, root)

        return self._run(run, [out])

    def scatter(self, outputs, input_lists, opts):
        root = self._root(opts)
        self._check_root(root, "scatter root")
        if self._rank == root and (not input_lists or len(input_lists[0]) != self._n):
            raise ValueError(f"scatter on its root needs {self._n} input tensors")

        def run():
            out = outputs[0]
            fo, back = flat(out)
            ins = [flat(i)[0] for i in input_lists[0]] if self._rank == root else None
            self._plane.scatter(fo, ins, root)
            if back:
                out.copy_(fo.view(out.shape))

        return self._run(run, outputs)

    def _longest(self, local: int) -> int:
        """The longest block any rank sends (one small all_reduce)."""
        t = torch.tensor([local], dtype=torch.int64)
        self._plane.all_reduce(t, RedOp.MAX)
        return int(t.item())

    def all_to_all_single(self, out, inp, out_splits, in_splits, opts=None):
        w = self._n

        def rows(t, splits, what):
            if not splits:
                if t.numel() % w:
                    raise ValueError(f"all_to_all_single: {what} of {t.numel()} elements does not split {w} ways")
                return [t.numel() // w] * w
            if len(splits) != w or sum(splits) != (t.size(0) if t.dim() else 0):
                raise ValueError(f"all_to_all_single: {what} splits {list(splits)} do not cut {tuple(t.shape)} {w} ways")
            row = t.numel() // t.size(0) if t.size(0) else 0
            return [int(s) * row for s in splits]

        out_sizes = rows(out, out_splits, "output")
        in_sizes = rows(inp, in_splits, "input")

        def run():
            fi, _ = flat(inp)
            fo, back = flat(out)
            ins = list(fi.split_with_sizes(in_sizes))
            outs = list(fo.split_with_sizes(out_sizes))
            equal = not out_splits and not in_splits
            longest = in_sizes[0] if equal else self._longest(max(in_sizes, default=0))
            self._plane.all_to_all(outs, ins, longest)
            if back:
                out.copy_(fo.view(out.shape))

        return self._run(run, [out])

    alltoall_base = all_to_all_single

    def alltoall(self, outs, ins, opts=None):
        if len(outs) != self._expect(len(outs)) or len(ins) != self._n:
            raise ValueError(f"all_to_all needs {self._n} input and output tensors")

        def run():
            fi = [flat(i)[0] for i in ins]
            fo = [flat(o) for o in outs]
            longest = self._longest(max(i.numel() for i in fi))
            self._plane.all_to_all([f for f, _ in fo], fi, longest)
            for o, (f, back) in zip(outs, fo):
                if back:
                    o.copy_(f.view(o.shape))

        return self._run(run, outs)

    # -- point to point ------------------------------------------------
    def _p2p_failed(self, peer: int) -> MooncakeWork | None:
        self._check_usable()
        if self._left:
            return MooncakeWork(None, failed=[peer], group_size=self._max)
        if not self._shm.connected(peer):
            raise ValueError(f"rank {peer} has not joined the group")
        # A send to a dead peer would only fill its mailbox: it fails.
        if peer in self._dead or self._shm.dead([peer]):
            self._observe([peer])
            return MooncakeWork(None, failed=[peer], group_size=self._max)
        return None

    def _do_send(self, dst: int, tag: int, data: torch.Tensor) -> int:
        try:
            if self._fault is not None and self._fault.transfer(
                self._global_ranks[self._rank], [self._global_ranks[dst]]
            ):
                with self._state_lock:
                    self._depart_locked()
                raise GroupBroken([dst])
            return self._shm.send(dst, tag, data.data_ptr(), data.numel() * data.element_size(), self._timeout_s)
        except _native.PeerFailure as exc:
            self._observe(exc.args[1])
            raise GroupBroken(list(exc.args[1])) from None

    def send(self, tensors, dst, tag=0):
        self._check_rank(dst, "send destination")
        if dst == self._rank:
            raise ValueError("a rank cannot send to itself")
        failed = self._p2p_failed(dst)
        t = tensors[0]
        data = t.view(-1) if t.is_contiguous() else t.contiguous().view(-1)
        if failed is not None:
            return failed
        # A message that fits in the mailbox now, with no earlier send to
        # dst pending, goes from this thread (no hand-off to wait for).
        end = None
        if self._fault is None and self._senders.idle(dst):
            end = self._shm.try_send(dst, int(tag), data.data_ptr(), data.numel() * data.element_size())
        fut = Ready(end) if end is not None else self._senders.submit(dst, self._do_send, dst, int(tag), data)
        return MooncakeWork(tensors, future=fut, group_size=self._max, confirm=lambda end: self._wait_read(dst, end))

    def _wait_read(self, dst: int, end: int) -> None:
        """A send is done when its peer has read it, so that a peer dying
        with the message unread fails the send."""
        try:
            self._shm.wait_read(dst, end, self._timeout_s)
        except _native.PeerFailure as exc:
            self._observe(exc.args[1])
            raise GroupBroken(list(exc.args[1])) from None

    def _recv_message(self, src: int, tag: int, t: torch.Tensor) -> int:
        with self._rx_locks[src]:
            return self._recv_locked(src, tag, t)

    def _recv_locked(self, src: int, tag: int, t: torch.Tensor) -> int:
        """Reads messages from ``src`` until one has ``tag``; keeps the
        others for later receives."""
        want = t.numel() * t.element_size()
        q = self._stash.get((src, tag))
        if q:
            data = q.popleft()
            if data.numel() != want:
                raise RuntimeError(f"recv: rank {src} sent {data.numel()} bytes under tag {tag}, expected {want}")
            t.view(-1).view(torch.uint8).copy_(data) if want else None
            return src
        try:
            # Over TCP a receive posted before its message arrives is read
            # from the socket straight into the tensor.
            if want and t.is_contiguous() and self._transport == "tcp":
                if self._shm.recv_into(src, tag, t.data_ptr(), want, self._timeout_s):
                    return src
            while True:
                got_tag, n = self._shm.recv_header(src, self._timeout_s)
                if got_tag == tag and n == want:
                    target = t.view(-1) if t.is_contiguous() else None
                    buf = target if target is not None else torch.empty(t.numel(), dtype=t.dtype)
                    self._shm.recv_body(src, buf.data_ptr(), n, self._timeout_s)
                    if target is None:
                        t.copy_(buf.view(t.shape))
                    return src
                data = torch.empty(n, dtype=torch.uint8)
                self._shm.recv_body(src, data.data_ptr(), n, self._timeout_s)
                if got_tag == tag:
                    raise RuntimeError(f"recv: rank {src} sent {n} bytes under tag {tag}, expected {want}")
                self._stash[(src, got_tag)].append(data)
        except _native.PeerFailure as exc:
            self._observe(exc.args[1])
            raise GroupBroken(list(exc.args[1])) from None

    def recv(self, tensors, src, tag=0):
        self._check_rank(src, "recv source")
        if src == self._rank:
            raise ValueError("a rank cannot receive from itself")
        failed = self._p2p_failed(src)
        if failed is not None:
            return failed
        fut = self._receivers.submit_shared(src, self._recv_message, src, int(tag), tensors[0])
        return MooncakeWork(tensors, future=fut, group_size=self._max, source=src)

    def recv_anysource(self, tensors, tag=0):
        def any_source():
            import time

            while True:
                for src in range(self._max):
                    if src != self._rank and self._shm.connected(src) and (self._stash.get((src, tag)) or self._shm.pending(src)):
                        return self._recv_message(src, tag, tensors[0])
                time.sleep(0.0005)

        fut = self._receivers.submit(-1, any_source)
        return MooncakeWork(tensors, future=fut, group_size=self._max)
