#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/, cargo-fuzz + libFuzzer) and runs each for
# a bounded time or number of executions. Fails when a target crashes,
# panics, hangs or goes over its memory bound; the input that did it is left
# in fuzz/artifacts/<target>/. See docs/security.md, "Fuzzing".
#
#   scripts/fuzz.sh [--seconds N | --runs N] [--asan] [--build-only] [TARGET...]
#
# --seconds N  time per target (default 5); --runs N: executions per target
# --asan       AddressSanitizer (nightly compiler flags, through
#              RUSTC_BOOTSTRAP=1 on the stable toolchain); default: none
# --build-only build and stop
# Extra libFuzzer flags: FUZZ_ARGS="-max_len=65536 ...".
set -euo pipefail
cd "$(dirname "$0")/.."

limit=(-max_total_time=5)
sanitizer=none
build_only=false
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) limit=(-max_total_time="$2"); shift 2 ;;
        --runs) limit=(-runs="$2"); shift 2 ;;
        --asan) sanitizer=address; shift ;;
        --build-only) build_only=true; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz is missing: cargo install cargo-fuzz --locked" >&2
    exit 2
fi
if [ "$sanitizer" = address ]; then
    # -Zsanitizer is a nightly flag; the stable compiler accepts it this way.
    export RUSTC_BOOTSTRAP=1
fi
# Optimised, with debug assertions and overflow checks (cargo fuzz's -O).
fuzz=(--sanitizer "$sanitizer" -O)

cd fuzz
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

start=$(date +%s)
cargo fuzz build "${fuzz[@]}"
echo "fuzz.sh: build took $(($(date +%s) - start)) s"
$build_only && exit 0

failed=()
for t in "${targets[@]}"; do
    # New inputs go to a scratch corpus; the checked-in seeds (corpus/) and
    # crash regressions (regressions/) are only read.
    mkdir -p "target/corpus/$t" "artifacts/$t"
    dirs=("target/corpus/$t" "corpus/$t")
    [ -d "regressions/$t" ] && dirs+=("regressions/$t")
    dict=()
    [ -f "dict/$t.dict" ] && dict=(-dict="dict/$t.dict")
    log="target/$t.log"
    # Bounds: 10 s per input (a hang), 2 GiB of RSS, no allocation over
    # 256 MiB (libFuzzer sees allocations only under ASan; the targets' own
    # heap budget, see src/lib.rs, is the finer check and always on).
    # -reload=0: one job per target, so nobody else adds to its corpus;
    # rereading (a stat of every file, each second) cost the fast targets
    # about 6% of their time.
    # shellcheck disable=SC2086
    if cargo fuzz run "${fuzz[@]}" "$t" "${dirs[@]}" -- \
        "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -reload=0 \
        -print_final_stats=1 "${dict[@]}" ${FUZZ_ARGS:-} >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed+=("$t")
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    echo "fuzz.sh: $t: $status, ${runs:-?} runs in ${secs:-?} s (${rate:-?}/s); log fuzz/$log"
done

if [ ${#failed[@]} -gt 0 ]; then
    for t in "${failed[@]}"; do
        echo "--- $t (fuzz/target/$t.log):" >&2
        grep -E -A12 "panicked at|ERROR: libFuzzer|SUMMARY" "target/$t.log" | head -40 >&2 || true
        ls "artifacts/$t/" >&2 || true
    done
    echo "fuzz.sh: failed: ${failed[*]}; inputs in fuzz/artifacts/<target>/" >&2
    exit 1
fi
