#!/usr/bin/env bash
# Installs the system packages the build and the tests need on a fresh
# Debian machine: protoc (etcd-client's build), etcd and redis servers (real
# metadata backends in tests), Python build tooling for the wheel, and
# Debian's official Kubernetes Python client (checks the k8s API stand-in),
# Prometheus (scrapes a live cluster to check the dashboard's queries),
# Chromium (loads the master's status page headless), and cargo-fuzz from
# crates.io for the fuzz smoke (not with MOONCAKE_SKIP_FUZZ=1). A C++
# compiler builds libzmq (the zmq crate's zmq-sys compiles it from source)
# for the master's KV-event publisher. The C ABI's tests use cc, pkg-config
# and nm; the link tests iproute2.
set -euo pipefail
need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v g++ >/dev/null || need+=(g++)
if [ "${1:-}" = "--test" ]; then
    command -v etcd >/dev/null || need+=(etcd-server)
    command -v redis-server >/dev/null || need+=(redis-server)
    python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
    /usr/bin/python3 -c 'import kubernetes' 2>/dev/null || need+=(python3-kubernetes)
    command -v prometheus >/dev/null || need+=(prometheus)
    command -v chromium >/dev/null || need+=(chromium)
    # The C ABI's tests: C programs built with cc against our headers,
    # pkg-config reading mooncake.pc, nm listing the library's exports.
    command -v cc >/dev/null || need+=(gcc)
    command -v pkg-config >/dev/null || need+=(pkg-config)
    command -v nm >/dev/null || need+=(binutils)
    # Network namespaces, veth pairs and shaped links (`ip`, `tc`) for the
    # multi-path transfer tests.
    { command -v ip >/dev/null && command -v tc >/dev/null; } || need+=(iproute2)
fi
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ "${1:-}" = "--test" ]; then
    # An S3-compatible server for the snapshot tests: moto from PyPI, in a
    # venv of its own (test-support finds it through MOONCAKE_TEST_MOTO_VENV).
    moto_venv=${MOONCAKE_TEST_MOTO_VENV:-/opt/mooncake-moto}
    if [ ! -x "$moto_venv/bin/moto_server" ]; then
        python3 -m venv "$moto_venv"
        "$moto_venv/bin/pip" install -q 'moto[server]'
    fi
    if [ "${MOONCAKE_SKIP_FUZZ:-0}" != 1 ] && ! cargo fuzz --version >/dev/null 2>&1; then
        cargo install cargo-fuzz --locked
    fi
fi
