#!/usr/bin/env bash
# Every check and test, as CI runs them: format, lints, Rust tests (with real
# etcd and redis servers started here), then the Python suite against the wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --test
# A run from a fresh clone gains nothing from incremental caches; they only
# take disk.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# No module import cycles inside a crate (docs/architecture.md).
python3 scripts/cycles.py

# Real etcd and redis on loopback for the metadata-backend tests.
. ./scripts/services.sh
start_services

# Every test binary runs even after one fails, so a run reports every failure.
cargo test --workspace --no-fail-fast -- --test-threads=2

# The fuzz targets keep building and survive a short run on their seeds
# (docs/security.md, "Fuzzing"); install-deps.sh installed cargo-fuzz.
# Skipped only when asked, and said so.
if [ "${MOONCAKE_SKIP_FUZZ:-0}" = 1 ]; then
    echo "test.sh: fuzz smoke SKIPPED (MOONCAKE_SKIP_FUZZ=1)" >&2
else
    ./scripts/fuzz.sh --seconds 2
fi

# The Python package, built and installed like a user would, and its suite.
MOONCAKE_WHEEL_PROFILE=dev ./scripts/test-python.sh
