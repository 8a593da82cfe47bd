#!/usr/bin/env python3
"""Plan and transfer time of a weight reshard (``mooncake.reshard``) for a
7B-like float16 model (LLaMA-7B shapes: 32 layers, hidden 4096, MLP 11008,
vocab 32000), TP 2 -> TP 4 on one host.

    # ours (installed wheel)
    python benchmarks/reshard_bench.py --impl ours
    # the reference: its wheel (0.3.13.post1) ships the same pure-Python
    # module as its repository's mooncake-reshard/python; --reference-src
    # adds a checkout's copy to the package path instead
    python benchmarks/reshard_bench.py --impl reference

Plan time: building both placements (validation included) and planning,
median of ``--repeat`` runs, for all 32 layers. Transfer time: moving the
bytes of ``--transfer-layers`` layers (plus embedding and head) from the
TP 2 shards to freshly allocated TP 4 shards, every byte checked after each run; medians of ``--repeat``
rounds that alternate the ways.
The reference ships a planner only (its README: transfer execution is a
separate phase), so for it the transfer runs its plan's segments
(``iter_segments``) as Python slice copies; ``numpy`` is the memcpy-class
bound: each target shard filled by one sliced assignment per source.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from math import prod

HIDDEN, MLP, VOCAB, LAYERS = 4096, 11008, 32000, 32


def specs(layers: int) -> list[tuple[str, tuple[int, ...], int | None]]:
    """(name, shape, TP split dim or None): column-parallel weights split
    their output rows (dim 0), row-parallel ones their input columns."""

    out: list[tuple[str, tuple[int, ...], int | None]] = [("embed_tokens", (VOCAB, HIDDEN), 0)]
    for i in range(layers):
        p = f"layers.{i}."
        out += [(p + n, (HIDDEN, HIDDEN), 0) for n in ("q_proj", "k_proj", "v_proj")]
        out += [(p + "o_proj", (HIDDEN, HIDDEN), 1)]
        out += [(p + n, (MLP, HIDDEN), 0) for n in ("gate_proj", "up_proj")]
        out += [(p + "down_proj", (HIDDEN, MLP), 1)]
        out += [(p + n, (HIDDEN,), None) for n in ("input_norm", "post_norm")]
    out += [("norm", (HIDDEN,), None), ("lm_head", (VOCAB, HIDDEN), 0)]
    return out


def build(w, table, tp: int, prefix: str):
    ranks = [w.ParallelRank(tp=t) for t in range(tp)]
    topo = w.ParallelTopology(
        tp_size=tp, pp_size=1, ep_size=1, dp_size=1,
        participants=tuple(w.TopologyParticipant(f"{prefix}-{r.tp}", r) for r in ranks),
    )
    tensors, fragments = [], []
    for name, shape, dim in table:
        axes = (w.SplitAxis(kind="tp", dim=dim),) if dim is not None else (w.ReplicatedAxis(kind="tp"),)
        tensors.append(w.TensorDescriptor(
            tensor_id=name, global_shape=shape, dtype="float16", itemsize=2,
            shard_dims=() if dim is None else (dim,), layout_fingerprint="hf", parallel_axes=axes,
        ))
        for r in ranks:
            off, shp = [0] * len(shape), list(shape)
            if dim is not None:
                shp[dim] = shape[dim] // tp
                off[dim] = r.tp * shp[dim]
            fragments.append(w.PlacementFragment(
                tensor_id=name, global_offset=tuple(off), local_shape=tuple(shp),
                nbytes=prod(shp) * 2, rank=r,
            ))
    return w.WeightPlacementManifest.from_fragments(
        resource_id="llama-7b", revision="step-1", weight_generation=1,
        placement_set_id=f"{prefix}-tp{tp}", topology=topo, tensors=tuple(tensors), fragments=tuple(fragments),
    )


def plan_once(w, table):
    t0 = time.perf_counter()
    src, dst = build(w, table, 2, "trainer"), build(w, table, 4, "rollout")
    t1 = time.perf_counter()
    plan = w.plan_placement_transfer(src, dst)
    t2 = time.perf_counter()
    return plan, t1 - t0, t2 - t1


def shard_arrays(np, plan, table):
    """Source shards cut from a random global tensor per name; returns
    (global tensors, source buffers by fragment ID, empty targets)."""

    shapes = {n: s for n, s, _ in table}
    rng = np.random.default_rng(0)
    whole = {n: rng.integers(0, 1 << 16, size=s, dtype=np.uint16) for n, s in shapes.items()}

    def cut(f):
        idx = tuple(slice(o, o + e) for o, e in zip(f.global_offset, f.local_shape))
        return np.ascontiguousarray(whole[f.tensor_id][idx])

    sources = {f.placement_fragment_id: cut(f) for f in plan.source_placement.fragments}
    targets = {f.placement_fragment_id: np.empty(f.local_shape, np.uint16) for f in plan.target_placement.fragments}
    return whole, cut, sources, targets


def python_segments(plan, sources, targets):
    for op in plan.operations:
        s = memoryview(sources[op.source.fragment_id]).cast("B")
        t = memoryview(targets[op.target.placement_fragment_id]).cast("B")
        for so, to, n in op.iter_segments(max_segments=op.segment_count):
            t[to:to + n] = s[so:so + n]


def numpy_slices(plan, sources, targets):
    for op in plan.operations:
        src, dst = op.source, op.target
        s_idx = tuple(slice(o - b, o - b + e) for o, b, e in zip(op.overlap_offset, src.global_offset, op.overlap_shape))
        t_idx = tuple(slice(o - b, o - b + e) for o, b, e in zip(op.overlap_offset, dst.global_offset, op.overlap_shape))
        targets[dst.placement_fragment_id][t_idx] = sources[src.fragment_id][s_idx]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=["ours", "reference"], required=True)
    ap.add_argument("--reference-src", help="a reference checkout's mooncake-reshard/python/mooncake")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--transfer-layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import numpy as np
    import mooncake

    if args.impl == "reference":
        if args.reference_src:
            mooncake.__path__.insert(0, args.reference_src)
    import mooncake.reshard.weight as w

    table = specs(LAYERS)
    times = [plan_once(w, table) for _ in range(args.repeat)]
    plan = times[-1][0]
    result = {
        "impl": args.impl,
        "module": w.__file__,
        "tensors": len(table),
        "bytes": plan.total_bytes,
        "operations": len(plan.operations),
        "build_s": statistics.median(t[1] for t in times),
        "plan_s": statistics.median(t[2] for t in times),
    }
    small = specs(args.transfer_layers)
    tplan = plan_once(w, small)[0]
    whole, cut, sources, targets = shard_arrays(np, tplan, small)
    runs = [("numpy_slices", numpy_slices)]
    if args.impl == "ours":
        from mooncake.reshard.weight.execute import execute_plan

        runs.insert(0, ("execute_plan", lambda p, s, t: execute_plan(p, s, t, nthreads=args.threads)))
    else:
        runs.insert(0, ("python_segments", python_segments))
    result["transfer_bytes"] = tplan.total_bytes
    took: dict[str, list[float]] = {label: [] for label, _ in runs}
    # Alternate the ways round by round so load drift hits all alike; the
    # targets are written once before timing (no first-touch faults).
    for _ in range(args.repeat):
        for label, run in runs:
            for t in targets.values():
                t.fill(0)
            t0 = time.perf_counter()
            run(tplan, sources, targets)
            took[label].append(time.perf_counter() - t0)
            for f in tplan.target_placement.fragments:
                if not np.array_equal(targets[f.placement_fragment_id], cut(f)):
                    raise SystemExit(f"{label}: wrong bytes in {f.tensor_id} rank {f.rank.tp}")
    for label, samples in took.items():
        median = statistics.median(samples)
        result[f"{label}_s"] = median
        result[f"{label}_gbps"] = tplan.total_bytes / median / 1e9
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
