#!/usr/bin/env bash
# Throughput table of every scenario, side by side with the raw baseline.
#
#   bench/run.sh              5 interleaved rounds at N=200000: median msgs/s,
#                             ratio to raw-mpsc, allocations per message
#   bench/run.sh --callgrind  also marginal instructions per message,
#                             (Ir(N=2000) - Ir(N=1000)) / 1000, median of 3,
#                             current-thread runtime (needs valgrind)
set -euo pipefail

callgrind=false
case "${1:-}" in
    "") ;;
    --callgrind)
        if command -v valgrind >/dev/null; then
            callgrind=true
        else
            echo "valgrind not found: no instruction counts" >&2
        fi
        ;;
    *) echo "usage: $0 [--callgrind]" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release -p ruststream-bench --manifest-path "$root/Cargo.toml" >&2
bin=${CARGO_TARGET_DIR:-$root/target}/release/ruststream-bench

mapfile -t scenarios < <("$bin" --list)
n=200000
rounds=5

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
# Median of the whitespace-separated numbers on stdin.
median() { tr -s ' \n' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# Total instructions (Ir) of one run under callgrind, current-thread runtime,
# leaving out building and freeing the payloads (harness work proportional to
# N). --collect-atstart must come after --toggle-collect, which turns it off.
ir() {
    local out
    out=$(mktemp /tmp/ruststream-bench.callgrind.XXXXXX)
    RUSTSTREAM_BENCH_RT=current valgrind --tool=callgrind --fair-sched=yes --callgrind-out-file="$out" \
        --toggle-collect='*payload::build*' --toggle-collect='*payload::discard*' \
        --collect-atstart=yes "$bin" "$1" "$2" >/dev/null 2>&1
    awk '/^(summary|totals):/ { print $2; exit }' "$out"
    rm -f "$out"
}

declare -A rates allocs instrs
for ((round = 1; round <= rounds; round++)); do
    for s in "${scenarios[@]}"; do
        rates[$s]+="$("$bin" "$s" $n | field msgs_per_s) "
    done
done
for s in "${scenarios[@]}"; do
    allocs[$s]=$(RUSTSTREAM_BENCH_RT=current RUSTSTREAM_BENCH_ALLOCS=1 "$bin" "$s" $n | field allocs_per_msg)
    if $callgrind; then
        small=$(for _ in 1 2 3; do ir "$s" 1000; done | median)
        large=$(for _ in 1 2 3; do ir "$s" 2000; done | median)
        instrs[$s]=$(((large - small) / 1000))
    fi
done

raw=$(median <<<"${rates[raw-mpsc]}")
printf '%-14s %14s %12s %11s' scenario "msgs/s (med)" "vs raw-mpsc" allocs/msg
$callgrind && printf ' %10s' instr/msg
printf '\n'
for s in "${scenarios[@]}"; do
    rate=$(median <<<"${rates[$s]}")
    printf '%-14s %14.0f %11.2fx %11s' "$s" "$rate" "$(awk "BEGIN { print $rate / $raw }")" "${allocs[$s]}"
    $callgrind && printf ' %10s' "${instrs[$s]}"
    printf '\n'
done
echo "(N=$n, $rounds interleaved rounds, runtime ${RUSTSTREAM_BENCH_RT:-multi}; allocs/msg from a current-thread run)"
