#!/usr/bin/env python3
"""The RL loop of docs/rl.md end to end on CPU, with every byte checked.

    python examples/rl_loop.py [--steps 3] [--rollouts 2] [--trainers 2]
        [--rows 256] [--seq 512] [--hidden 1024] [--layers 2] [--vocab 4096]
        [--master HOST:PORT --metadata URL]

Without --master it starts a single-node cluster (`mooncake_master` from
PATH, on free loopback ports, with its HTTP metadata server) and stops it at
the end. The driver process mounts the store's memory; the workers are
spawned processes with store clients of their own:

- rollout engines (`--rollouts`): each holds the weights in a TP 4 layout
  (its four TP ranks in one process) and, every step, puts an experience
  batch as a DataProto (`MooncakeBundleTransfer.put_dataproto`, stage
  "rollout"), then adds rewards as a second stage
  (`append_dataproto_fields`, stage "reward") and hands the exported ref to
  the driver as JSON;
- trainer ranks (`--trainers`, the TP size of the training layout): each
  reads its share of every batch's rows (an index list) and four of its
  fields, checks them against the batch the rollout was seeded to produce,
  computes a "gradient" (a scalar, summed over ranks by the driver), applies
  the update to its TP shard and publishes the new generation: one payload
  object per rank plus a `WeightManifest` (mooncake.reshard);
- the rollout engines then read the manifest, plan the move into their TP 4
  layout (`plan_stored_transfer_to_target_placement`), read the payload
  objects and run the plan (`execute_plan`).

The driver recomputes everything on its own (the batches, the reduction, the
weights of each generation) and checks the trainers' shards and every
rollout engine's shards by digest; any difference stops the run with a
message naming the step, the process and the tensor. Exit status 0 and a
final "rl_loop: OK" line mean every check passed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import queue
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
import zlib
from collections import defaultdict
from dataclasses import dataclass
from math import prod

import numpy as np

LOOPBACK = "127.0.0.1"
RESOURCE = "rl-demo-model"
FIELDS_READ = ["input_ids", "attention_mask", "scores", "prompt"]
REPLY_TIMEOUT_S = 300.0


class DataProto:
    """The three sections of verl's DataProto, which is all the store needs."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None):
        self.batch = batch or {}
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}

    @classmethod
    def from_dict(cls, batch, non_tensor_batch=None, meta_info=None):
        return cls(batch, non_tensor_batch, meta_info)


# ---- what every process can recompute ---------------------------------------


@dataclass(frozen=True)
class Sizes:
    rows: int
    seq: int
    hidden: int
    layers: int
    vocab: int


def rollout_batch(step: int, engine: int, sizes: Sizes) -> tuple[DataProto, np.ndarray]:
    """The experience batch engine `engine` produces at `step`, and its rewards."""
    rng = np.random.default_rng([step, engine])
    rows, seq = sizes.rows, sizes.seq
    lengths = rng.integers(seq // 4, seq + 1, size=rows)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int8)
    batch = {
        "input_ids": rng.integers(0, sizes.vocab, size=(rows, seq), dtype=np.int64),
        "attention_mask": mask,
        "old_log_probs": rng.standard_normal((rows, seq)).astype(np.float32),
        "values": rng.standard_normal((rows, seq)).astype(np.float16),
    }
    prompts = np.asarray([f"step {step} engine {engine} prompt {i}: " + "x" * int(rng.integers(0, 40))
                          for i in range(rows)], dtype=object)
    meta = {"step": step, "engine": engine, "weight_generation": step}
    scores = rng.standard_normal(rows).astype(np.float32)
    return DataProto(batch, {"prompt": prompts}, meta), scores


def trainer_rows(step: int, rank: int, trainers: int, rows: int) -> list[int]:
    """Rank `rank`'s rows of every batch at `step`: a shuffled share."""
    perm = np.random.default_rng([step, 9973]).permutation(rows)
    return [int(i) for i in perm[rank::trainers]]


def partial_gradient(ids: np.ndarray, mask: np.ndarray, scores: np.ndarray) -> float:
    """A stand-in for a backward pass: deterministic in the bytes read."""
    tokens = (ids * mask).sum(axis=1).astype(np.float64)
    return float(np.sum(scores.astype(np.float64) * (tokens % 97)))


def update_scale(total: float) -> np.float32:
    return np.float32((total % 1000.0) / 1000.0 - 0.5) * np.float32(0.01)


def tensor_specs(sizes: Sizes) -> list[tuple[str, tuple[int, ...], int | None]]:
    """(name, shape, TP split dim or None for replicated): a small decoder."""
    h, v = sizes.hidden, sizes.vocab
    specs = [("embed", (v, h), 0)]
    for i in range(sizes.layers):
        specs += [(f"layers.{i}.qkv", (3 * h, h), 0), (f"layers.{i}.o", (h, h), 1),
                  (f"layers.{i}.norm", (h,), None)]
    return specs + [("lm_head", (v, h), 0)]


def initial_weights(sizes: Sizes) -> dict[str, np.ndarray]:
    return {name: np.random.default_rng(zlib.crc32(name.encode())).standard_normal(shape).astype(np.float16)
            for name, shape, _ in tensor_specs(sizes)}


def apply_update(w: np.ndarray, scale: np.float32) -> np.ndarray:
    """Elementwise, so a shard updated alone equals the slice of the whole."""
    return (w.astype(np.float32) * np.float32(0.999) + scale).astype(np.float16)


def placement(sizes: Sizes, tp: int, prefix: str, generation: int):
    from mooncake.reshard.weight import (ParallelRank, ParallelTopology, PlacementFragment, ReplicatedAxis,
                                         SplitAxis, TensorDescriptor, TopologyParticipant,
                                         WeightPlacementManifest)

    ranks = [ParallelRank(tp=t) for t in range(tp)]
    topology = ParallelTopology(tp_size=tp, pp_size=1, ep_size=1, dp_size=1,
                                participants=tuple(TopologyParticipant(f"{prefix}-tp{r.tp}", r) for r in ranks))
    tensors, fragments = [], []
    for name, shape, dim in tensor_specs(sizes):
        tensors.append(TensorDescriptor(
            tensor_id=name, global_shape=shape, dtype="float16", itemsize=2,
            shard_dims=() if dim is None else (dim,), layout_fingerprint="row-major",
            parallel_axes=(ReplicatedAxis(kind="tp") if dim is None else SplitAxis(kind="tp", dim=dim),)))
        for r in ranks:
            offset, local = [0] * len(shape), list(shape)
            if dim is not None:
                local[dim] = shape[dim] // tp
                offset[dim] = r.tp * local[dim]
            fragments.append(PlacementFragment(tensor_id=name, global_offset=tuple(offset),
                                               local_shape=tuple(local), nbytes=prod(local) * 2, rank=r))
    return WeightPlacementManifest.from_fragments(
        resource_id=RESOURCE, revision=f"gen-{generation}", weight_generation=generation,
        placement_set_id=f"{prefix}-tp{tp}", topology=topology, tensors=tuple(tensors),
        fragments=tuple(fragments))


def box(fragment) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(fragment.global_offset, fragment.local_shape))


def digest(a) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(a)).cast("B")).hexdigest()


def weights_group(generation: int) -> str:
    return f"rl-weights/gen-{generation}"


def stored_layout(trainer_placement, group: str):
    """Where each trainer shard sits: one payload object per TP rank, its
    shards back to back; a replicated tensor is stored once (by rank 0)."""
    from mooncake.reshard.weight import StoredFragment

    stored, per_rank, seen = [], defaultdict(list), set()
    offsets: dict[int, int] = defaultdict(int)
    for f in sorted(trainer_placement.fragments, key=lambda f: (f.rank.tp, f.tensor_id)):
        key = (f.tensor_id, f.global_offset, f.local_shape)
        if key in seen:
            continue
        seen.add(key)
        obj = f"{group}/payload/tp{f.rank.tp}"
        at = offsets[f.rank.tp]
        stored.append(StoredFragment(f"{obj}#{at}", f.tensor_id, f.global_offset, f.local_shape, obj, at, f.nbytes))
        per_rank[f.rank.tp].append(f)
        offsets[f.rank.tp] += f.nbytes
    return stored, per_rank


# ---- worker processes -------------------------------------------------------


def connect(master: str, metadata: str):
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    # No segment of its own: its objects live in the driver's memory.
    rc = store.setup(LOOPBACK, metadata, 0, 64 << 20, "tcp", "", master)
    if rc != 0:
        raise RuntimeError(f"store setup failed: {rc}")
    return store


def worker(role: str, index: int, cfg: dict, inbox, outbox) -> None:
    """Runs commands from `inbox` until "stop"; any failure is reported."""
    try:
        store = connect(cfg["master"], cfg["metadata"])
        state = (Rollout if role == "rollout" else Trainer)(index, Sizes(**cfg["sizes"]), cfg, store)
        outbox.put((role, index, "ready", None))
        while True:
            command, arg = inbox.get()
            if command == "stop":
                break
            outbox.put((role, index, command, getattr(state, command)(arg)))
        store.close()
    except BaseException:  # noqa: BLE001 - reported to the driver, which stops the run
        outbox.put((role, index, "error", traceback.format_exc()))


class Rollout:
    def __init__(self, index: int, sizes: Sizes, cfg: dict, store) -> None:
        from mooncake.structured_object_store import MooncakeBundleTransfer

        self.index, self.sizes, self.store = index, sizes, store
        self.transfer = MooncakeBundleTransfer(store, key_prefix="rl")
        self.shards: dict[str, np.ndarray] = {}
        self.generation = -1

    def load_weights(self, generation: int) -> dict:
        """Reads generation `generation` from the store into this engine's TP 4 shards."""
        from mooncake.reshard.weight import WeightManifest, plan_stored_transfer_to_target_placement
        from mooncake.reshard.weight.execute import execute_plan

        raw = self.store.get(f"{weights_group(generation)}/manifest")
        if not raw:
            raise RuntimeError(f"no manifest for weight generation {generation}")
        manifest = WeightManifest.from_json(raw)
        layout = placement(self.sizes, 4, f"engine{self.index}", generation)
        plan = plan_stored_transfer_to_target_placement(manifest, layout)
        objects = {}
        for key in sorted({op.source.object_key for op in plan.operations}):
            objects[key] = self.store.get(key)
            if not objects[key]:
                raise RuntimeError(f"weight object {key} is missing")
        sources = {op.source.fragment_id: memoryview(objects[op.source.object_key])[
            op.source.object_offset:op.source.object_offset + op.source.nbytes] for op in plan.operations}
        targets = {f.placement_fragment_id: np.empty(f.local_shape, np.float16) for f in layout.fragments}
        moved = execute_plan(plan, sources, targets)
        assert moved == plan.total_bytes, f"engine {self.index}: moved {moved} of {plan.total_bytes} bytes"
        self.shards = {f"{f.tensor_id}@tp{f.rank.tp}": targets[f.placement_fragment_id] for f in layout.fragments}
        self.generation = generation
        return {"digests": {k: digest(v) for k, v in self.shards.items()}, "regions": len(plan.operations),
                "bytes": moved, "objects": len(objects)}

    def generate(self, step: int) -> dict:
        assert self.generation == step, f"engine {self.index} holds generation {self.generation} at step {step}"
        data, scores = rollout_batch(step, self.index, self.sizes)
        ref = self.transfer.put_dataproto(data, namespace="rl", partition=f"step-{step}", stage="rollout")
        # The reward model scores the rollout later, as its own stage.
        ref = self.transfer.append_dataproto_fields(ref, DataProto({"scores": scores}), stage="reward")
        from mooncake.structured_object_store import export_dataproto_ref

        nbytes = sum(a.nbytes for a in data.batch.values()) + scores.nbytes
        return {"handle": json.dumps(export_dataproto_ref(ref)), "bytes": nbytes}


class Trainer:
    def __init__(self, rank: int, sizes: Sizes, cfg: dict, store) -> None:
        from mooncake.structured_object_store import MooncakeBundleTransfer

        self.rank, self.sizes, self.store = rank, sizes, store
        self.trainers = cfg["trainers"]
        self.transfer = MooncakeBundleTransfer(store, key_prefix="rl")
        whole = initial_weights(sizes)
        layout = placement(sizes, self.trainers, "trainer", 0)
        self.shards = {f.tensor_id: np.ascontiguousarray(whole[f.tensor_id][box(f)])
                       for f in layout.fragments if f.rank.tp == rank}
        self.generation = 0

    def read(self, arg: dict) -> dict:
        """Reads this rank's rows and four fields of every batch; checks them."""
        from mooncake.structured_object_store import import_dataproto_ref

        step, total, rows_read = arg["step"], 0.0, 0
        mine = trainer_rows(step, self.rank, self.trainers, self.sizes.rows)
        for engine, handle in enumerate(arg["handles"]):
            got = self.transfer.get_dataproto(import_dataproto_ref(json.loads(handle)), fields=FIELDS_READ,
                                              rows=mine, data_cls=DataProto)
            want, scores = rollout_batch(step, engine, self.sizes)
            where = f"step {step}, trainer {self.rank}, batch of engine {engine}"
            assert set(got.batch) == {"input_ids", "attention_mask", "scores"}, \
                f"{where}: read fields {sorted(got.batch)}, asked for {FIELDS_READ}"
            assert got.meta_info["weight_generation"] == step, f"{where}: the batch is off-policy"
            expected = {"input_ids": want.batch["input_ids"][mine],
                        "attention_mask": want.batch["attention_mask"][mine], "scores": scores[mine]}
            for name, array in expected.items():
                assert got.batch[name].dtype == array.dtype and got.batch[name].shape == array.shape \
                    and got.batch[name].tobytes() == array.tobytes(), f"{where}: field {name} differs from what was put"
            assert list(got.non_tensor_batch["prompt"]) == list(want.non_tensor_batch["prompt"][mine]), \
                f"{where}: field prompt differs from what was put"
            total += partial_gradient(got.batch["input_ids"], got.batch["attention_mask"], got.batch["scores"])
            rows_read += len(mine)
        return {"partial": total, "rows": rows_read}

    def update(self, arg: dict) -> dict:
        """Applies the all-reduced update and publishes the next generation."""
        scale = update_scale(arg["total"])
        self.shards = {k: apply_update(v, scale) for k, v in self.shards.items()}
        self.generation += 1
        return {"digests": self.publish()}

    def publish(self, _arg=None) -> dict:
        from mooncake.reshard.weight import WeightManifest

        g = self.generation
        group = weights_group(g)
        layout = placement(self.sizes, self.trainers, "trainer", g)
        stored, per_rank = stored_layout(layout, group)
        payload = b"".join(self.shards[f.tensor_id].tobytes() for f in per_rank.get(self.rank, []))
        if payload:
            rc = self.store.put(f"{group}/payload/tp{self.rank}", payload)
            assert rc == 0, (f"trainer {self.rank}: put of generation {g} failed ({rc}; "
                             "-200 is a full store: raise --segment-mb)")
        if self.rank == 0:
            # Rollouts read the manifest only after the driver saw every rank publish.
            manifest = WeightManifest(namespace="rl", resource_id=RESOURCE, revision=f"gen-{g}",
                                      weight_generation=g, group_id=group, manifest_key=f"{group}/manifest",
                                      tensors=layout.tensors, fragments=tuple(stored),
                                      created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            rc = self.store.put(manifest.manifest_key, manifest.to_json().encode())
            assert rc == 0, f"trainer 0: manifest put of generation {g} failed ({rc})"
        return {k: digest(v) for k, v in self.shards.items()}


# ---- the driver -------------------------------------------------------------


def free_port() -> int:
    """A free port below the ephemeral range (a bind(0) port can be taken by
    an outgoing connection before the master binds it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            start = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        start = 32768
    low, high = (10000, start) if start > 12000 else (61000, 65535)
    for _ in range(10000):
        port = random.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}..{high}")


class Master:
    """A `mooncake_master` with its HTTP metadata server, on free ports."""

    def __init__(self) -> None:
        exe = shutil.which("mooncake_master")
        if exe is None:
            raise SystemExit("mooncake_master is not on PATH: install the package (pip install .) "
                             "or pass --master and --metadata")
        rpc, http, metrics = free_port(), free_port(), free_port()
        self.proc = subprocess.Popen(
            [exe, f"--rpc_port={rpc}", f"--rpc_address={LOOPBACK}", "--enable_http_metadata_server=true",
             f"--http_metadata_server_host={LOOPBACK}", f"--http_metadata_server_port={http}",
             f"--metrics_port={metrics}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                if "mooncake_master listening on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60) or self.proc.poll() is not None:
            self.stop()
            raise SystemExit("mooncake_master did not start:\n" + "\n".join(self.lines))
        self.master = f"{LOOPBACK}:{rpc}"
        self.metadata = f"http://{LOOPBACK}:{http}/metadata"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Workers:
    """The spawned rollout engines and trainer ranks, one command queue each."""

    def __init__(self, cfg: dict) -> None:
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes: dict[tuple[str, int], object] = {}
        self.procs = []
        for role, count in (("rollout", cfg["rollouts"]), ("trainer", cfg["trainers"])):
            for i in range(count):
                inbox = ctx.Queue()
                p = ctx.Process(target=worker, args=(role, i, cfg, inbox, self.outbox), name=f"{role}-{i}")
                p.start()
                self.inboxes[(role, i)] = inbox
                self.procs.append(p)
        self.gather(list(self.inboxes), "ready")

    def call(self, role: str, command: str, args: dict[int, object]) -> dict[int, object]:
        """Sends `command` to every worker of `role` (arg by index); waits for all."""
        for i, arg in args.items():
            self.inboxes[(role, i)].put((command, arg))
        return {i: r for (_, i), r in self.gather([(role, i) for i in args], command).items()}

    def gather(self, who: list, command: str) -> dict:
        replies, deadline = {}, time.monotonic() + REPLY_TIMEOUT_S
        while len(replies) < len(who):
            try:
                role, i, what, result = self.outbox.get(timeout=1.0)
            except queue.Empty:
                # A worker that died without a word (killed, crashed) ends the run now.
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"no answer to {command!r} (exited: {dead or 'none'}, "
                                       f"{REPLY_TIMEOUT_S:.0f} s allowed)") from None
                continue
            if what == "error":
                raise RuntimeError(f"{role} {i} failed:\n{result}")
            replies[(role, i)] = result
        return replies

    def stop(self) -> None:
        for inbox in self.inboxes.values():
            inbox.put(("stop", None))
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
                p.join(5)


def check_shards(where: str, got: dict[str, str], want: dict[str, str]) -> None:
    assert got.keys() == want.keys(), f"{where}: shards {sorted(got)} instead of {sorted(want)}"
    for name in sorted(want):
        assert got[name] == want[name], f"{where}: shard {name} differs from the trainer's weights"


def expected_digests(weights: dict[str, np.ndarray], layout, rank: int | None = None) -> dict[str, str]:
    """Digests of a layout's shards cut from the whole tensors: per tensor for
    one rank (trainer), per tensor@tpN for all ranks (rollout engine)."""
    if rank is not None:
        return {f.tensor_id: digest(weights[f.tensor_id][box(f)]) for f in layout.fragments if f.rank.tp == rank}
    return {f"{f.tensor_id}@tp{f.rank.tp}": digest(weights[f.tensor_id][box(f)]) for f in layout.fragments}


def run_loop(args, master: str, metadata: str) -> None:
    from mooncake.reshard.weight import plan_placement_transfer
    from mooncake.store import MooncakeDistributedStore
    from mooncake.structured_object_store import MooncakeBundleTransfer

    sizes = Sizes(args.rows, args.seq, args.hidden, args.layers, args.vocab)
    # The driver is the store node: every object lives in its segment.
    store = MooncakeDistributedStore()
    rc = store.setup(LOOPBACK, metadata, args.segment_mb << 20, 16 << 20, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"store setup failed: {rc}")
    transfer = MooncakeBundleTransfer(store, key_prefix="rl")
    cfg = {"master": master, "metadata": metadata, "sizes": sizes.__dict__, "rollouts": args.rollouts,
           "trainers": args.trainers}
    started = time.monotonic()
    workers = Workers(cfg)
    engines, ranks = range(args.rollouts), range(args.trainers)
    try:
        weights = initial_weights(sizes)
        # The layouts' plan, in memory: what every rollout engine will run from the store.
        plan = plan_placement_transfer(placement(sizes, args.trainers, "trainer", 0), placement(sizes, 4, "engine", 0))
        print(f"rl_loop: {len(weights)} tensors, {sum(w.nbytes for w in weights.values())} bytes of fp16 weights; "
              f"TP {args.trainers} -> TP 4 is {len(plan.operations)} regions", flush=True)
        published = workers.call("trainer", "publish", {r: None for r in ranks})
        sync_weights(workers, weights, sizes, args, published, generation=0, plan_bytes=plan.total_bytes)
        for step in range(args.steps):
            t0 = time.monotonic()
            batches = workers.call("rollout", "generate", {e: step for e in engines})
            handles = [batches[e]["handle"] for e in engines]
            reads = workers.call("trainer", "read", {r: {"step": step, "handles": handles} for r in ranks})
            # The driver's own account of what each rank must have computed.
            for r in ranks:
                mine = trainer_rows(step, r, args.trainers, args.rows)
                want = 0.0
                for e in engines:
                    data, scores = rollout_batch(step, e, sizes)
                    want += partial_gradient(data.batch["input_ids"][mine], data.batch["attention_mask"][mine],
                                             scores[mine])
                assert reads[r]["partial"] == want, f"step {step}: trainer {r}'s gradient is not the one of its rows"
            total = sum(reads[r]["partial"] for r in ranks)
            weights = {k: apply_update(v, update_scale(total)) for k, v in weights.items()}
            published = workers.call("trainer", "update", {r: {"total": total} for r in ranks})
            moved = sync_weights(workers, weights, sizes, args, published, generation=step + 1,
                                 plan_bytes=plan.total_bytes)
            for h in handles:
                transfer.cleanup_dataproto(json.loads(h))
            remove_generation(store, step, args.trainers)
            print(f"step {step}: {args.rollouts} rollouts put {sum(b['bytes'] for b in batches.values())} bytes "
                  f"(stages rollout+reward); {args.trainers} trainers read "
                  f"{sum(r['rows'] for r in reads.values())} rows x {len(FIELDS_READ)} fields; "
                  f"generation {step + 1} resharded TP {args.trainers} -> TP 4 into {args.rollouts} engines "
                  f"({moved} bytes); verified in {time.monotonic() - t0:.2f} s", flush=True)
        remove_generation(store, args.steps, args.trainers)
    finally:
        workers.stop()
        store.close()
    print(f"rl_loop: OK ({args.steps} steps, {time.monotonic() - started:.1f} s)", flush=True)


def sync_weights(workers: Workers, weights: dict, sizes: Sizes, args, published: dict, *, generation: int,
                 plan_bytes: int) -> int:
    """Checks each trainer's shards, moves the generation into every rollout
    engine and checks their shards; returns the bytes moved."""
    trainer_layout = placement(sizes, args.trainers, "trainer", generation)
    for r, reply in published.items():
        check_shards(f"generation {generation}, trainer {r}", reply if generation == 0 else reply["digests"],
                     expected_digests(weights, trainer_layout, r))
    loaded = workers.call("rollout", "load_weights", {e: generation for e in range(args.rollouts)})
    want = expected_digests(weights, placement(sizes, 4, "engine", generation))
    for e, reply in loaded.items():
        check_shards(f"generation {generation}, rollout engine {e}", reply["digests"], want)
        assert reply["bytes"] == plan_bytes, f"engine {e} moved {reply['bytes']} bytes, the plan says {plan_bytes}"
    return sum(reply["bytes"] for reply in loaded.values())


def remove_generation(store, generation: int, trainers: int) -> None:
    group = weights_group(generation)
    for key in [f"{group}/manifest", *(f"{group}/payload/tp{r}" for r in range(trainers))]:
        # Forced: the engines' reads leave leases, and nobody reads this generation again.
        rc = store.remove(key, force=True)
        assert rc == 0, f"removing {key} failed ({rc})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=2, help="rollout engine processes (TP 4 each)")
    ap.add_argument("--trainers", type=int, default=2, help="trainer processes (the trainer's TP size)")
    ap.add_argument("--rows", type=int, default=256, help="rows per experience batch")
    ap.add_argument("--seq", type=int, default=512, help="tokens per row")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--segment-mb", type=int, default=256, help="store memory the driver mounts")
    ap.add_argument("--master", help="an existing master (HOST:PORT); default: start one")
    ap.add_argument("--metadata", help="its metadata URL (with --master)")
    args = ap.parse_args()
    if not __debug__:
        ap.error("the checks are assert statements: run without -O")
    if min(args.steps, args.rollouts, args.trainers, args.rows, args.seq, args.layers) < 1:
        ap.error("counts and sizes must be positive")
    if args.hidden % 4 or args.vocab % 4:
        ap.error("--hidden and --vocab must be multiples of 4 (the rollout layout is TP 4)")
    if args.trainers not in (1, 2, 4):
        ap.error("--trainers is the trainer TP size: 1, 2 or 4")
    if args.rows < args.trainers:
        ap.error("--rows must be at least --trainers")
    if bool(args.master) != bool(args.metadata):
        ap.error("--master and --metadata go together")
    master = None if args.master else Master()
    try:
        run_loop(args, args.master or master.master, args.metadata or master.metadata)
    except (AssertionError, RuntimeError) as e:
        print(f"rl_loop: FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if master is not None:
            master.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
