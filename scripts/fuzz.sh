#!/usr/bin/env bash
# scripts/fuzz.sh — run every fuzz target (fuzz/fuzz_targets/) for a fixed
# time each, one after the other; fail on the first crash.
#
#   scripts/fuzz.sh [--seconds N] [TARGET...]   (default: 20 s, every target)
#
# Needs the nightly toolchain and cargo-fuzz (scripts/lib/deps.sh installs
# them). Each target starts from its committed seeds (fuzz/corpus/TARGET,
# recorded from real sessions by scripts/record-corpus.sh, never written
# here) and what earlier runs found (target/fuzz/corpus/TARGET), with the
# dictionary fuzz/dict/TARGET.dict when there is one. A crash —
# a panic, a broken invariant, a sanitizer report, an input that takes
# over 10 s, more than 2 GiB of memory — fails the run; its input is saved
# as target/fuzz/artifacts/TARGET/crash-* and the command that replays it
# is printed. Prints per target: runs, executions/s, coverage (libFuzzer's
# cov: edges and ft: features), corpus entries.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=20
targets=()
while [ "$#" -gt 0 ]; do
    case $1 in
        --seconds) seconds=${2:?--seconds N}; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "error: --seconds $seconds: a whole number of seconds expected" >&2; exit 2; }

cargo +nightly fuzz build
[ "${#targets[@]}" -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
[ "${#targets[@]}" -gt 0 ] || { echo "error: no fuzz targets found" >&2; exit 1; }

work=target/fuzz
stat() { sed -n "s/^stat::$1:[[:space:]]*//p" "$log" | tail -1; } # NAME: of the last run
printf '%-20s %10s %8s %6s %7s %7s\n' target runs exec/s cov ft corpus
for t in "${targets[@]}"; do
    [ -d "fuzz/corpus/$t" ] || { echo "error: $t has no seed corpus fuzz/corpus/$t" >&2; exit 1; }
    mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
    log=$work/$t.log
    dict=()
    [ ! -f "fuzz/dict/$t.dict" ] || dict=(-dict="fuzz/dict/$t.dict")
    # The first corpus directory is where libFuzzer adds what it finds:
    # the committed seeds stay as they are.
    if ! cargo +nightly fuzz run "$t" "$work/corpus/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/$t/" "${dict[@]}" >"$log" 2>&1; then
        grep -E -A4 'panicked at|ERROR: |SUMMARY: ' "$log" | head -40 >&2
        echo "error: fuzz target $t crashed (full log: $log)" >&2
        crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        [ -z "$crash" ] || echo "replay: cargo +nightly fuzz run $t $crash" >&2
        exit 1
    fi
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1)
    printf '%-20s %10s %8s %6s %7s %7s\n' "$t" "$(stat number_of_executed_units)" \
        "$(stat average_exec_per_sec)" \
        "$(sed -n 's/.* cov: \([0-9]*\) .*/\1/p' <<<"$done_line")" \
        "$(sed -n 's/.* ft: \([0-9]*\) .*/\1/p' <<<"$done_line")" \
        "$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$done_line")"
done
