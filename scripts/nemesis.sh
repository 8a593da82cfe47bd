#!/usr/bin/env bash
# Long nemesis runs (docs/ha.md, "Nemesis"): three replicated masters per
# backend under a put/get/remove load and random faults from a seed.
#
#   scripts/nemesis.sh [--backend etcd|redis|k8s|all] [--rounds N] [--seed S]
#
# Defaults: every backend, 100 rounds each, a seed from the clock (printed;
# give it back with --seed to replay the same faults in the same order).
# Needs etcd and redis-server on PATH (scripts/install-deps.sh --test);
# the full-disk fault needs root (it mounts a small tmpfs per master) and
# is skipped, said so, without. Logs of a failed run are kept (the path is
# printed).
set -euo pipefail
cd "$(dirname "$0")/.."

backend=all
rounds=100
seed=
while [ $# -gt 0 ]; do
    case "$1" in
        --backend) backend=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "nemesis.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$backend" in
    etcd|redis|k8s|all) ;;
    *) echo "nemesis.sh: --backend is one of etcd, redis, k8s, all" >&2; exit 2 ;;
esac

export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# The programs the harness runs, then the harness.
cargo build -p mooncake-cli --bins
MOONCAKE_NEMESIS_BACKEND=$backend MOONCAKE_NEMESIS_ROUNDS=$rounds MOONCAKE_NEMESIS_SEED=$seed \
    cargo test -p mooncake-system-tests --test nemesis -- --ignored nemesis_long_run \
    --exact --nocapture
