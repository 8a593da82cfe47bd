#!/usr/bin/env bash
# Throughput through the C ABI (crates/mooncake-capi/tests/c/te_bench.c over
# libmooncake_capi.so) beside our Rust transfer_engine_bench and the
# reference's, interleaved cell by cell so all three see the same load.
# Every system runs one submitting thread that moves a 64 MiB region per
# batch (64 MiB / block requests), over TCP (MC_FORCE_TCP=1 for ours).
# Usage:
#   benchmarks/capi_compare.sh [REF_BENCH] [TARGET_DIR] [SECONDS] [ROUNDS]
# Defaults: /work/venv-ref/bin/transfer_engine_bench, target/release, 3, 1.
# Needs `cargo build --release -p mooncake-capi -p mooncake-cli --bin
# transfer_engine_bench` and `cc`. Prints a markdown table (GB/s).
set -u
REF=${1:-/work/venv-ref/bin/transfer_engine_bench}
TGT=$(realpath "${2:-target/release}")
SECS=${3:-3}
ROUNDS=${4:-1}
META_BIN=${META_BIN:-$(dirname "$REF")/mooncake_http_metadata_server}
OURS=$TGT/transfer_engine_bench
LEN=$((64 << 20))
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT

CBENCH=$WORK/te_bench
cc -O2 -o "$CBENCH" crates/mooncake-capi/tests/c/te_bench.c \
    $(PKG_CONFIG_PATH=$TGT pkg-config --cflags --libs mooncake) \
    "-Wl,-rpath,$TGT/deps" || { echo "cannot build te_bench.c" >&2; exit 1; }

H=$(free_port)
"$META_BIN" --host 127.0.0.1 --port "$H" >/dev/null 2>&1 &
PIDS+=($!)
sleep 1
COMMON=(--protocol=tcp "--metadata_server=http://127.0.0.1:$H/metadata" --buffer_size=268435456
    --threads=1 --report_unit=GB)

gbs() { # bench's "throughput X GB/s" -> X
    grep -oE 'throughput +[0-9.]+' | grep -oE '[0-9.]+$' | head -1
}

bench_cell() { # system bench env op block
    local sys=$1 bench=$2 envs=$3 op=$4 block=$5 t i tp out
    t=$(free_port); i=$(free_port)
    # Its own process group: the reference's console script runs the
    # real binary as a child, which must end with it.
    setsid env $envs "$bench" --mode=target "--local_server_name=127.0.0.1:$t" "${COMMON[@]}" \
        >"$WORK/target.log" 2>&1 &
    tp=$!
    sleep 2
    out=$(env $envs timeout $((SECS + 60)) "$bench" --mode=initiator \
        "--local_server_name=127.0.0.1:$i" "--segment_id=127.0.0.1:$t" "--operation=$op" \
        "--block_size=$block" "--batch_size=$((LEN / block))" "--duration=$SECS" \
        "${COMMON[@]}" 2>&1 | gbs)
    kill -INT -- -$tp 2>/dev/null; sleep 0.5; kill -9 -- -$tp 2>/dev/null; wait $tp 2>/dev/null
    echo "${out:-FAILED}"
}

capi_cell() { # op block
    local op=$1 block=$2 ready out sp
    # A fresh file per cell: the old one could still be read before the
    # backgrounded child truncates it.
    rm -f "$WORK/server.out"
    MC_FORCE_TCP=1 "$CBENCH" server >"$WORK/server.out" 2>"$WORK/server.err" &
    sp=$!
    for _ in $(seq 100); do
        ready=$(grep -m1 '^READY' "$WORK/server.out" 2>/dev/null) && [ -n "$ready" ] && break
        sleep 0.1
    done
    if [ -z "$ready" ]; then
        cat "$WORK/server.err" >&2; kill $sp 2>/dev/null; echo FAILED; return
    fi
    set -- $ready
    out=$(MC_FORCE_TCP=1 timeout $((SECS + 60)) "$CBENCH" client "$2" "$3" "$4" "$SECS" "$op" "$block" |
        awk '{print $3}')
    sleep 1; kill $sp 2>/dev/null; wait $sp 2>/dev/null
    echo "${out:-FAILED}"
}

echo "| op | block | reference (C++) | ours, Rust API | ours, C ABI | C ABI / Rust | C ABI / reference |"
echo "|---|---|---|---|---|---|---|"
for _ in $(seq "$ROUNDS"); do
    for block in 65536 1048576 8388608; do
        for op in write read; do
            r=$(bench_cell ref "$REF" "" $op $block)
            o=$(bench_cell ours "$OURS" "MC_FORCE_TCP=1" $op $block)
            c=$(capi_cell $op $block)
            ratio() { python3 -c "import sys; a,b=sys.argv[1:]; print(f'{float(a)/float(b):.2f}x')" "$1" "$2" 2>/dev/null || echo -; }
            echo "| $op | $block | $r | $o | $c | $(ratio "$c" "$o") | $(ratio "$c" "$r") |"
        done
    done
done
