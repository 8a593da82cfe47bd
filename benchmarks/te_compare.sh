#!/usr/bin/env bash
# transfer_engine_bench, reference vs ours, interleaved in one run so both see
# the same machine load. Usage:
#   benchmarks/te_compare.sh [REF_BENCH] [OUR_BENCH] [SECONDS] [ROUNDS]
# Defaults: /work/refvenv/bin/transfer_engine_bench, target/release/transfer_engine_bench, 3, 1.
# Systems: ref (TCP), ours-tcp (MC_FORCE_TCP=1), ours (default: same-host shared memory).
# Every run: HTTP metadata server, --protocol=tcp --buffer_size=268435456 --threads=2.
set -u
REF=${1:-/work/refvenv/bin/transfer_engine_bench}
OURS=${2:-target/release/transfer_engine_bench}
SECS=${3:-3}
ROUNDS=${4:-1}
META_BIN=${META_BIN:-/work/refvenv/bin/mooncake_http_metadata_server}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

H=$(free_port)
"$META_BIN" --host 127.0.0.1 --port "$H" >/dev/null 2>&1 &
META_PID=$!
trap 'kill $META_PID 2>/dev/null' EXIT
sleep 1
COMMON=(--protocol=tcp "--metadata_server=http://127.0.0.1:$H/metadata" --buffer_size=268435456)

run() { # system bench env op block
    local sys=$1 bench=$2 envs=$3 op=$4 block=$5 t i out tp
    t=$(free_port); i=$(free_port)
    # Its own process group: the reference's console script runs the real
    # binary as a child, which must end with it.
    setsid env $envs GLOG_minloglevel=0 GLOG_logtostderr=1 "$bench" --mode=target \
        "--local_server_name=127.0.0.1:$t" "${COMMON[@]}" >/tmp/te_target.log 2>&1 &
    tp=$!
    sleep 2
    out=$(env $envs GLOG_minloglevel=0 GLOG_logtostderr=1 timeout $((SECS + 60)) "$bench" --mode=initiator \
        "--local_server_name=127.0.0.1:$i" "--segment_id=127.0.0.1:$t" "--operation=$op" \
        "--block_size=$block" --threads=2 "--duration=$SECS" "${COMMON[@]}" 2>&1 |
        grep -oE 'throughput +[0-9.]+ *[A-Za-z]+/s' | head -1)
    kill -INT -- -$tp 2>/dev/null; sleep 0.5; kill -9 -- -$tp 2>/dev/null; wait $tp 2>/dev/null
    echo "| $sys | $op | $block | ${out:-FAILED} |"
}

echo "| system | op | block | result |"
echo "|---|---|---|---|"
for _ in $(seq "$ROUNDS"); do
    for block in 65536 1048576; do
        for op in read write; do
            run ref "$REF" "" $op $block
            run ours-tcp "$OURS" "MC_FORCE_TCP=1" $op $block
            run ours "$OURS" "" $op $block
        done
    done
done
