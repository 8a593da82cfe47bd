#!/usr/bin/env bash
# The Python suite: installs the package into a throwaway venv the way users
# do (`pip install .`), then runs pytest against the installed package and the
# programs it puts on PATH (mooncake_master, mooncake_client, ...).
#
# MOONCAKE_WHEEL_PROFILE=dev (what test.sh uses) builds the extension with the
# dev profile, reusing what `cargo test` just compiled; the default is the
# release build users get.
#
# pyzmq and msgspec read the master's KV events as vLLM and SGLang do; xxhash
# computes the Conductor's block hashes as routers do.
#
# The tensor tests run against real PyTorch and safetensors, installed into the
# venv once (PyPI's default torch wheel: ~5.4 GB with its CUDA libraries, about
# 90 s on a fresh machine; it runs on CPU without a GPU). MOONCAKE_TEST_TORCH=0
# skips that install for a quick run: the tensor tests then run on the numpy
# stand-in (tests/python/fake_torch.py) and the real-torch ones are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MOONCAKE_TEST_VENV:-.venv-test}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
venv=$(cd "$venv" && pwd)
"$venv/bin/python" -m pip install -q --upgrade pip maturin pytest numpy uv aiohttp pyzmq msgspec xxhash msgpack
if [ "${MOONCAKE_TEST_TORCH:-1}" != 0 ]; then
    # uv hard-links packages from its cache, so every venv on the machine
    # shares one 5 GB copy of torch; no --upgrade: a venv that has them already
    # skips the download.
    start=$SECONDS
    "$venv/bin/uv" pip install -q --python "$venv/bin/python" --link-mode=hardlink \
        torch safetensors
    echo "torch and safetensors ready in $((SECONDS - start)) s" >&2
    export MOONCAKE_TEST_REQUIRE_TORCH=1
fi
if [ -n "${MOONCAKE_WHEEL_PROFILE:-}" ]; then
    export MATURIN_PEP517_ARGS="--profile $MOONCAKE_WHEEL_PROFILE"
fi
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps .
export PATH="$venv/bin:$PATH"
# The Kubernetes API stand-in the k8s HA test runs against (a dev-only
# binary, built by `cargo test`).
if [ -z "${MOONCAKE_TEST_K8S_STANDIN:-}" ] && [ -x target/debug/k8s-standin ]; then
    export MOONCAKE_TEST_K8S_STANDIN=$PWD/target/debug/k8s-standin
fi
# Run from the tests' directory so `import mooncake` finds the installed
# package, not the sources under python/; a test named from the checkout's
# root (tests/python/test_x.py) is named from there.
args=()
for a in "$@"; do
    args+=("${a#tests/python/}")
done
cd tests/python
set +e
python -m pytest -q -p no:cacheprovider ${args[@]+"${args[@]}"}
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: the Python suite did not run" >&2
    exit 1
fi
exit "$rc"
