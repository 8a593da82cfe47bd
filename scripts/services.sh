# Sourced by test.sh: starts throwaway etcd and redis servers on loopback and
# exports their addresses; both stop, and their data is removed, when the
# calling shell exits.
start_services() {
    local dir
    dir=$(mktemp -d /tmp/mooncake-services.XXXXXX)
    export MOONCAKE_TEST_ETCD_PORT=${MOONCAKE_TEST_ETCD_PORT:-23790}
    export MOONCAKE_TEST_REDIS_PORT=${MOONCAKE_TEST_REDIS_PORT:-26379}
    etcd --data-dir "$dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$MOONCAKE_TEST_ETCD_PORT" \
        --advertise-client-urls "http://127.0.0.1:$MOONCAKE_TEST_ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$((MOONCAKE_TEST_ETCD_PORT + 1))" \
        >"$dir/etcd.log" 2>&1 &
    SERVICES_ETCD_PID=$!
    redis-server --port "$MOONCAKE_TEST_REDIS_PORT" --bind 127.0.0.1 --save '' \
        --appendonly no >"$dir/redis.log" 2>&1 &
    SERVICES_REDIS_PID=$!
    SERVICES_DIR=$dir
    # Stop both and drop their data (etcd's is ~64 MB) when the shell exits.
    trap 'kill $SERVICES_ETCD_PID $SERVICES_REDIS_PID 2>/dev/null
          wait $SERVICES_ETCD_PID $SERVICES_REDIS_PID 2>/dev/null
          rm -rf "$SERVICES_DIR"' EXIT
    # The S3 server (moto) is started by each test that needs one.
    export MOONCAKE_TEST_MOTO_VENV=${MOONCAKE_TEST_MOTO_VENV:-/opt/mooncake-moto}
    export MOONCAKE_TEST_ETCD="127.0.0.1:$MOONCAKE_TEST_ETCD_PORT"
    export MOONCAKE_TEST_REDIS="127.0.0.1:$MOONCAKE_TEST_REDIS_PORT"
    for _ in $(seq 1 50); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$MOONCAKE_TEST_ETCD_PORT") 2>/dev/null &&
           (exec 3<>"/dev/tcp/127.0.0.1/$MOONCAKE_TEST_REDIS_PORT") 2>/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    echo "etcd or redis did not start:" >&2
    tail -n 20 "$dir"/*.log >&2
    return 1
}
