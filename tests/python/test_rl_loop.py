"""examples/rl_loop.py: the RL loop end to end (its own cluster, spawned
rollout and trainer processes), and its checks failing on wrong bytes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "rl_loop.py")
SMALL = ["--rows", "24", "--seq", "16", "--hidden", "32", "--layers", "1", "--vocab", "64", "--segment-mb", "32"]


def load_example():
    spec = importlib.util.spec_from_file_location("rl_loop_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_loop_runs_and_verifies_every_step() -> None:
    run = subprocess.run([sys.executable, EXAMPLE, "--steps", "3", "--rollouts", "2", "--trainers", "2", *SMALL],
                         capture_output=True, text=True, timeout=240)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    steps = re.findall(r"^step (\d): 2 rollouts put \d+ bytes .*; 2 trainers read 48 rows x 4 fields; "
                       r"generation (\d) resharded TP 2 -> TP 4 into 2 engines \((\d+) bytes\); verified", out, re.M)
    assert [(s, g) for s, g, _ in steps] == [("0", "1"), ("1", "2"), ("2", "3")], out
    # Each engine gets every weight byte, the replicated norm on each of its 4 ranks.
    weights = (64 * 32 * 2 + 96 * 32 + 32 * 32 + 32) * 2
    assert all(int(moved) == 2 * (weights + 3 * 32 * 2) for _, _, moved in steps), out
    assert re.search(r"^rl_loop: OK \(3 steps", out, re.M), out


def test_bad_arguments_are_refused() -> None:
    run = subprocess.run([sys.executable, EXAMPLE, "--hidden", "30"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "multiples of 4" in run.stderr
    run = subprocess.run([sys.executable, EXAMPLE, "--master", "127.0.0.1:1"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2 and "go together" in run.stderr


def test_the_checks_catch_wrong_bytes(store) -> None:
    ex = load_example()
    sizes = ex.Sizes(rows=8, seq=4, hidden=16, layers=1, vocab=32)
    cfg = {"trainers": 2}
    engine = ex.Rollout(1, sizes, cfg, store)
    engine.generation = 0
    handle = engine.generate(0)["handle"]
    trainer = ex.Trainer(0, sizes, cfg, store)
    # Engine 1's batch handed over as engine 0's: the rows differ from what engine 0 put.
    with pytest.raises(AssertionError, match="batch of engine 0: field input_ids differs"):
        trainer.read({"step": 0, "handles": [handle]})
    own = ex.Rollout(0, sizes, cfg, store)
    own.generation = 0
    good = own.generate(0)["handle"]
    assert trainer.read({"step": 0, "handles": [good]})["rows"] == 4
    for h in (handle, good):
        own.transfer.cleanup_dataproto(json.loads(h))

    ranks = [trainer, ex.Trainer(1, sizes, cfg, store)]
    for r in ranks:
        r.publish()
    want = ex.expected_digests(ex.initial_weights(sizes), ex.placement(sizes, 4, "engine", 0))
    ex.check_shards("generation 0, engine 1", engine.load_weights(0)["digests"], want)
    # One flipped byte in rank 1's payload reaches the engine's shards and is caught.
    key = f"{ex.weights_group(0)}/payload/tp1"
    payload = bytearray(store.get(key))
    payload[5] ^= 0xFF
    assert store.remove(key, force=True) == 0 and store.put(key, bytes(payload)) == 0
    with pytest.raises(AssertionError, match=r"engine 1: shard .* differs from the trainer's weights"):
        ex.check_shards("generation 0, engine 1", engine.load_weights(0)["digests"], want)
    ex.remove_generation(store, 0, 2)
