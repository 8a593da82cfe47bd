#!/usr/bin/env bash
# The main job: a working single-node Mooncake cluster (master, embedded HTTP
# metadata server and a storage segment) in one process, no external services.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
exec cargo run --release -q -p mooncake-cli --bin mooncake -- up "$@"
