#!/usr/bin/env bash
# scripts/count-instructions.sh — user-space instructions per operation inside
# the measured loop, pinpoll-perf beside perftest, counted by callgrind in
# the SoftRoCE guest.
#
#   scripts/count-instructions.sh                  every row (~45 callgrind runs)
#   options: --n1 N --n2 N   iterations of the two counted runs (default 2000,
#                            12000: N2 - N1 >= 10000; write-bw posts 32 times
#                            as many requests)
#            --out DIR  (default target/count-instructions/runs)
#            --only REGEX (tests: write-lat send-lat read-lat write-bw)
#            --perftest-bin DIR  perftest's programs with symbols (default
#                            $PINPOLL_PERFTEST_BIN, else target/perftest/bin)
#            --no-build
#
# Outside the guest it installs valgrind and perftest (scripts/lib/deps.sh;
# the guest sees this root read-only), builds pinpoll-perf in release with
# line tables only (into target/count-instructions/build: the instructions
# are those of the plain release build, fat LTO), and re-runs itself in
# `scripts/softroce-vm`. Distributions ship perftest stripped, and
# callgrind needs the measured loop's function by name: --perftest-bin DIR
# must hold ib_write_lat, ib_send_lat, ib_read_lat and ib_write_bw of the
# installed perftest's version with their symbols. Each is checked
# function by function against the installed program
# (scripts/lib/perftest_identity.py: the same bytes at the same address),
# and a count that runs a differing function inside a measured loop is
# refused, so what is counted is the installed perftest's code. Inside, for each
# test the server runs natively (core 0) and the client under `valgrind
# --tool=callgrind` (core 1), at N1 and N2 iterations, and once more at N1
# with the server on the client's core (crowded: the same work, longer
# waits). pinpoll-perf is counted twice, "as perftest" (-I 0 --await-sends,
# the work perftest does) and "as meant" (its latency profile).
#
# Only the measured loop is counted, on both sides (--collect-atstart=no
# --toggle-collect): perftest's run_iter_* function (less get_cpu_mhz, its
# clock calibration, which it calls there) and pinpoll-perf's
# timed_round_trips / timed_stream, each with everything they call. Set-up,
# the peer's wait, the report and its statistics are outside. Every object
# is counted the same way for both tools: the tool's executable ("own":
# perftest's, or pinpoll-perf's with pinpoll and the few std pieces the
# loop inlines), the provider (librxe), libibverbs, libc and the rest, and
# their sum (user space). Per operation = (count(N2) - count(N1)) /
# (ops(N2) - ops(N1)). Busy-wait turns that find nothing are timing, not
# work, and come out the same way for both tools: a wait loop is a backward
# jump of the executable whose taken count changes between the N1 run and
# the crowded one; an instruction of any object whose count changes by m
# times one loop's change (m <= 16), or by m1 and m2 times the changes of
# two of the loops that changed most, runs that often per empty turn and is
# removed that often from every run (a count); one no loop
# explains is removed in proportion to the busiest loop's empty turns (an
# estimate, printed in its own column). write-bw has no crowded run (its
# server does no work) and nothing removed; its empty polls are its figure.
#
# Prints Markdown tables; every callgrind file, the manifest, counts.json
# and table.md stay under --out/<timestamp>/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD

n1=2000 n2=12000 build=1 out="$top/target/count-instructions/runs" only=''
ptbin=${PINPOLL_PERFTEST_BIN:-$top/target/perftest/bin}
args=("$@")
while [ $# -gt 0 ]; do
    case $1 in
        --n1) n1=${2:?--n1 needs a number}; shift ;;
        --n2) n2=${2:?--n2 needs a number}; shift ;;
        --out) out=${2:?--out needs a directory}; shift ;;
        --no-build) build=0 ;;
        --only) only=${2:?--only needs a pattern}; shift ;;
        --perftest-bin) ptbin=${2:?--perftest-bin needs a directory}; shift ;;
        -h|--help) sed -n '2,55p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for v in "$n1" "$n2"; do
    case $v in ''|*[!0-9]*) echo "error: --n1/--n2 must be numbers" >&2; exit 2 ;; esac
done
if [ "$n1" -lt 100 ] || [ "$n2" -le "$n1" ]; then
    echo "error: need 100 <= --n1 < --n2 (got $n1, $n2)" >&2
    exit 2
fi
[ $((n2 - n1)) -ge 10000 ] ||
    echo "warning: N2 - N1 = $((n2 - n1)) < 10000: a trial, not a figure to publish" >&2

build_dir=$top/target/count-instructions/build
perf=$build_dir/release/pinpoll-perf
# Where the identity check of --perftest-bin's programs leaves the
# functions that differ from the installed ones (the guest reads them).
ptcheck=$top/target/count-instructions/perftest-check
perftest_programs=(ib_write_lat ib_send_lat ib_read_lat ib_write_bw)

if [ "${PINPOLL_VM:-}" != 1 ]; then
    # shellcheck source=scripts/lib/deps.sh
    . scripts/lib/deps.sh
    pinpoll_ensure_packages valgrind perftest python3 util-linux coreutils
    if [ "$build" = 1 ]; then
        echo "==> cargo build --release -p pinpoll-perf (line tables only, $build_dir)" >&2
        CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
            cargo build --release -p pinpoll-perf --target-dir "$build_dir" >&2
    fi
    [ -x "$perf" ] || { echo "error: $perf is missing; build it (drop --no-build)" >&2; exit 1; }
    version=$(dpkg-query -W -f='${Version}' perftest)
    mkdir -p "$ptcheck"
    for p in "${perftest_programs[@]}"; do
        [ -x "$ptbin/$p" ] || {
            echo "error: no $ptbin/$p: --perftest-bin DIR (or PINPOLL_PERFTEST_BIN) must hold perftest $version's" >&2
            echo "       ${perftest_programs[*]} with symbols (the installed ones are stripped)" >&2
            exit 1
        }
        python3 scripts/lib/perftest_identity.py "$ptbin/$p" "$(command -v "$p")" "$ptcheck/$p.differing.tsv" >&2
    done
    exec scripts/softroce-vm --timeout "${PINPOLL_COUNT_TIMEOUT:-14400}" -- \
        bash "$top/scripts/count-instructions.sh" --no-build "${args[@]}"
fi

# ---- inside the guest -------------------------------------------------------
dev=${PINPOLL_DEVICE:?PINPOLL_DEVICE unset: not inside scripts/softroce-vm}
gid=${PINPOLL_GID_INDEX:?PINPOLL_GID_INDEX unset}
addr=${PINPOLL_ADDR4:?PINPOLL_ADDR4 unset}
[ -x "$perf" ] || { echo "error: $perf is missing; build it on the host first" >&2; exit 1; }
for p in valgrind python3 taskset stdbuf; do
    command -v "$p" >/dev/null || { echo "error: $p is not installed (apt-get install valgrind python3 util-linux)" >&2; exit 1; }
done
run_dir="$out/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run_dir"
manifest=$run_dir/manifest.tsv
: > "$manifest"
port=22000
callgrind=(valgrind --tool=callgrind --dump-instr=yes --collect-jumps=yes
    --compress-strings=no --compress-pos=no --separate-threads=yes --collect-atstart=no)
pinpoll_loops=(--toggle-collect='*timed_round_trips*' --toggle-collect='*timed_stream*')

# Waits (at most 60 s: process start is slow under TCG) until FILE says
# PATTERN.
await_banner() {
    for _ in $(seq 240); do
        grep -qE -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.25
    done
    return 1
}

# Ends a server that should be ending by itself.
reap_server() {
    timeout 60 tail --pid="$1" -f /dev/null || kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# One counted client run with its server.
# count TEST TOOL VARIANT OPS SERVER_CORE -- TOGGLES... -- CLIENT_COMMAND... -- SERVER_COMMAND...
count() {
    local test=$1 tool=$2 variant=$3 ops=$4 score=$5; shift 5
    local toggles=() client=() server=()
    shift # --
    while [ "$1" != -- ]; do toggles+=("$1"); shift; done
    shift
    while [ "$1" != -- ]; do client+=("$1"); shift; done
    shift
    server=("$@")
    local label="$test.$tool.$variant" banner="Waiting|---"
    [[ $tool == pinpoll* ]] && banner="Waiting for a client"
    port=$((port + 1))
    stdbuf -oL taskset -c "$score" "${server[@]/@PORT@/$port}" > "$run_dir/$label.server.txt" 2>&1 &
    local spid=$!
    if ! await_banner "$run_dir/$label.server.txt" "$banner"; then
        echo "warning: $label: the server did not start (see $run_dir/$label.server.txt)" >&2
        kill "$spid" 2>/dev/null || true
        wait "$spid" 2>/dev/null || true
        return 0
    fi
    local start=$SECONDS
    if timeout 3600 taskset -c 1 "${callgrind[@]}" "${toggles[@]}" \
            --callgrind-out-file="$run_dir/$label.cg" \
            "${client[@]/@PORT@/$port}" > "$run_dir/$label.txt" 2>&1; then
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$test" "$tool" "$variant" "$ops" \
            "$run_dir/$label.cg" "$(readlink -f "${client[0]}")" >> "$manifest"
        echo "    $label: $((SECONDS - start)) s" >&2
    else
        echo "warning: $label failed (see $run_dir/$label.txt)" >&2
        kill "$spid" 2>/dev/null || true
    fi
    reap_server "$spid"
}

# perftest_run TEST VARIANT OPS CORE PROG FLAGS...: its measured loop is
# LOOP (set by the caller), less get_cpu_mhz in the latency tests (-C: the
# report then reads no clock rate, so get_cpu_mhz runs only there).
perftest_run() {
    local test=$1 variant=$2 ops=$3 score=$4 prog=$5; shift 5
    local common=("$ptbin/$prog" -d "$dev" -x "$gid" -p @PORT@ "$@")
    local toggles=(--toggle-collect="$loop")
    [ "$test" = write-bw ] || toggles+=(--toggle-collect=get_cpu_mhz)
    count "$test" perftest "$variant" "$ops" "$score" -- "${toggles[@]}" -- \
        "${common[@]}" "$addr" -- "${common[@]}"
}

# pinpoll_run TEST TOOL VARIANT OPS CORE KIND FLAGS...
pinpoll_run() {
    local test=$1 tool=$2 variant=$3 ops=$4 score=$5 kind=$6; shift 6
    count "$test" "$tool" "$variant" "$ops" "$score" -- "${pinpoll_loops[@]}" -- \
        "$perf" "$kind" "$addr" -d "$dev" -p @PORT@ --timeout 600 "$@" --json -- \
        "$perf" "$kind" -d "$dev" -p @PORT@ --timeout 3600
}

wanted() { [[ -z $only || $1 =~ $only ]]; }

# A latency test: N1 and N2 with the server on core 0, N1 again with the
# server on the client's core; perftest, pinpoll-perf as perftest, as meant.
latency_test() { # TEST PERFTEST_PROG LOOP_FUNCTION
    local test=$1 prog=$2 v n c
    loop=$3
    wanted "$test" || return 0
    echo "--- $test" >&2
    for v in n1 n2 crowded; do
        n=$n1 c=0
        [ "$v" = n2 ] && n=$n2
        [ "$v" = crowded ] && c=1
        perftest_run "$test" "$v" "$n" "$c" "$prog" -s 8 -n "$n" -C
        pinpoll_run "$test" pinpoll-as-perftest "$v" "$n" "$c" "$test" -s 8 -n "$n" \
            --warmup 0 -I 0 --await-sends
        pinpoll_run "$test" pinpoll "$v" "$n" "$c" "$test" -s 8 -n "$n" --warmup 0
    done
}

start=$SECONDS
latency_test write-lat ib_write_lat run_iter_lat_write
latency_test send-lat ib_send_lat run_iter_lat_send
latency_test read-lat ib_read_lat run_iter_lat
if wanted write-bw; then
    echo "--- write-bw" >&2
    # compare-perftest.sh's 64 B message-rate row: the same tx depth, post
    # list of 32 and one completion per 32 on both sides, inline off on
    # both. -N (--noPeak): perftest turns its peak figure off by itself
    # above 20 000 requests, and that figure stamps every request.
    loop=run_iter_bw
    for v in n1 n2; do
        n=$((n1 * 32))
        [ "$v" = n2 ] && n=$((n2 * 32))
        perftest_run write-bw "$v" "$n" 0 ib_write_bw -s 64 -n "$n" -t 128 -l 32 -Q 32 -N --report_gbits
        pinpoll_run write-bw pinpoll-as-perftest "$v" "$n" 0 write-bw -s 64 -n "$n" -t 128 -l 32 -Q 32 -I 0
    done
fi
echo "(callgrind runs: $((SECONDS - start)) s; raw files in $run_dir)" >&2

python3 "$top/scripts/lib/count_instructions.py" "$run_dir" "$manifest" "$ptcheck"
