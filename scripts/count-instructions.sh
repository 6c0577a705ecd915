#!/usr/bin/env bash
# scripts/count-instructions.sh — own instructions per operation, pinpoll-perf
# beside perftest, counted by callgrind inside the SoftRoCE guest.
#
#   scripts/count-instructions.sh               every row: 28 callgrind runs,
#                                               ~30 min in an idle TCG guest
#   options: --n1 N --n2 N   iterations of the two counted runs (default 200,
#                            1200; write-bw runs 32 times as many requests)
#            --out DIR  (default target/count-instructions/runs)
#            --only REGEX (tests: write-lat send-lat read-lat write-bw
#                            engine-read-lat engine-send-lat)  --no-build
#
# Outside the guest it installs valgrind and perftest (scripts/lib/deps.sh;
# the guest sees this root read-only), builds pinpoll-perf in release with
# line tables only (CARGO_PROFILE_RELEASE_DEBUG=line-tables-only, into
# target/count-instructions/build so target/release is left alone; the
# instructions are those of the plain release build, fat LTO, in another
# order), and re-runs itself in `scripts/softroce-vm`. Inside, for each test
# the server runs natively (core 0) and the client under
# `valgrind --tool=callgrind` (core 1), with compare-perftest.sh's programs,
# sizes and flags (rdma_cm for pinpoll-perf, perftest's -x GID index), at N1
# and N2 iterations (pinpoll-perf: 50 warm-up in both), and, for the
# latency and engine tests, once more at N2 with the server on core 1.
#
# Own instructions = callgrind's self cost (Ir) in the tool's own object: the
# perftest binary, or pinpoll-perf (pinpoll and std are linked into it).
# librxe, libibverbs, librdmacm, libc, ld.so, the vDSO and valgrind's
# preload objects are excluded; a call's inclusive cost is never added to
# its caller. Reporting that is not per operation is left out too: the
# comparator libc's qsort calls back while perftest sorts its samples, and
# pinpoll-perf's hdrhistogram walks (mean, deviation, percentiles).
# own/op = (own(N2) - own(N1)) / (ops(N2) - ops(N1)), so set-up and
# tear-down cancel. Busy-wait turns that find nothing are timing, not work:
# a wait loop is a backward jump of the own object whose taken count
# changes between the N2 run and the crowded one (same work, longer
# waits); an own instruction whose count changes by m times one loop's
# change (m <= 4), or by the sum of the changes of two or three of the four
# loops that changed most (a head reached by several paths), runs that
# often per empty turn, and m x empty turns are removed from every run.
# Empty turns = the jump's taken count, or, for a loop that never ends
# (engine mode's worker), the runs of its instructions that only empty
# turns execute. What no loop explains stays in and is printed (residual:
# N2 minus crowded after removal, instructions, 0 when all is explained).
# Engine mode counts the application thread and the worker separately
# (--separate-threads=yes). write-bw has no crowded run (its server does
# no work); its spins column is the provider's CQ-poll calls per request
# (one completion per 32 requests), and nothing is removed.
#
# Prints a Markdown table (test, perftest own/op, pinpoll own/op, ratio,
# spins/op of each) and the method line; every callgrind file, the
# manifest, counts.json/tsv and table.md stay under --out/<timestamp>/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD

n1=200 n2=1200 build=1 out="$top/target/count-instructions/runs" only=''
args=("$@")
while [ $# -gt 0 ]; do
    case $1 in
        --n1) n1=${2:?--n1 needs a number}; shift ;;
        --n2) n2=${2:?--n2 needs a number}; shift ;;
        --out) out=${2:?--out needs a directory}; shift ;;
        --no-build) build=0 ;;
        --only) only=${2:?--only needs a pattern}; shift ;;
        -h|--help) sed -n '2,51p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for v in "$n1" "$n2"; do
    case $v in ''|*[!0-9]*) echo "error: --n1/--n2 must be numbers" >&2; exit 2 ;; esac
done
if [ "$n1" -lt 50 ] || [ $((n2 / 10)) -le $((n1 / 10)) ]; then
    echo "error: need 50 <= --n1 and --n2 at least 10 more (got $n1, $n2)" >&2
    exit 2
fi

build_dir=$top/target/count-instructions/build
perf=$build_dir/release/pinpoll-perf

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
    exec scripts/softroce-vm --timeout "${PINPOLL_COUNT_TIMEOUT:-10800}" -- \
        bash "$top/scripts/count-instructions.sh" --no-build "${args[@]}"
fi

# ---- inside the guest -------------------------------------------------------
dev=${PINPOLL_DEVICE:?PINPOLL_DEVICE unset: not inside scripts/softroce-vm}
gid=${PINPOLL_GID_INDEX:?PINPOLL_GID_INDEX unset}
addr=${PINPOLL_ADDR4:?PINPOLL_ADDR4 unset}
[ -x "$perf" ] || { echo "error: $perf is missing; build it on the host first" >&2; exit 1; }
for p in valgrind ib_write_lat ib_send_lat ib_read_lat ib_write_bw python3 taskset stdbuf; do
    command -v "$p" >/dev/null || { echo "error: $p is not installed (apt-get install valgrind perftest python3 util-linux)" >&2; exit 1; }
done
run_dir="$out/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run_dir"
manifest=$run_dir/manifest.tsv
: > "$manifest"
warmup=50
port=22000
callgrind=(valgrind --tool=callgrind --dump-instr=yes --collect-jumps=yes
    --compress-strings=no --compress-pos=no --separate-threads=yes)

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
# count TEST TOOL VARIANT ITERS SERVER_CORE -- CLIENT_COMMAND... -- SERVER_COMMAND...
count() {
    local test=$1 tool=$2 variant=$3 iters=$4 score=$5; shift 5
    local client=() server=()
    shift # --
    while [ "$1" != -- ]; do client+=("$1"); shift; done
    shift
    server=("$@")
    local label="$test.$tool.$variant" banner="Waiting|---"
    [ "$tool" = pinpoll ] && banner="Waiting for a client"
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
    if timeout 1200 taskset -c 1 "${callgrind[@]}" --callgrind-out-file="$run_dir/$label.cg" \
            "${client[@]/@PORT@/$port}" > "$run_dir/$label.txt" 2>&1; then
        printf '%s\t%s\t%s\t%s\t1\t%s\t%s\n' "$test" "$tool" "$variant" "$iters" \
            "$run_dir/$label.cg" "$(readlink -f "$(command -v "${client[0]}")")" >> "$manifest"
        echo "    $label: $((SECONDS - start)) s" >&2
    else
        echo "warning: $label failed (see $run_dir/$label.txt)" >&2
        kill "$spid" 2>/dev/null || true
    fi
    reap_server "$spid"
}

perftest_run() { # TEST VARIANT ITERS CORE PROG FLAGS...
    local test=$1 variant=$2 iters=$3 score=$4 prog=$5; shift 5
    local common=("$prog" -d "$dev" -x "$gid" -p @PORT@ "$@")
    count "$test" perftest "$variant" "$iters" "$score" -- "${common[@]}" "$addr" -- "${common[@]}"
}

pinpoll_run() { # TEST VARIANT ITERS CORE KIND FLAGS...
    local test=$1 variant=$2 iters=$3 score=$4 kind=$5; shift 5
    count "$test" pinpoll "$variant" "$iters" "$score" -- \
        "$perf" "$kind" "$addr" -d "$dev" -p @PORT@ --timeout 300 "$@" --json -- \
        "$perf" "$kind" -d "$dev" -p @PORT@ --timeout 900
}

wanted() { [[ -z $only || $1 =~ $only ]]; }

# The three runs of a latency test: N1 and N2 iterations with the server
# on core 0, and N2 again with the server on the client's core (crowded).
# three_runs TEST N1 N2 COMMAND ARGS... runs COMMAND ARGS... VARIANT ITERS CORE.
three_runs() {
    local test=$1 a=$2 b=$3
    shift 3
    wanted "$test" || return 0
    echo "--- $test" >&2
    "$@" n1 "$a" 0
    "$@" n2 "$b" 0
    "$@" crowded "$b" 1
}

both_tools() { # TEST PERFTEST_PROG PINPOLL_KIND VARIANT ITERS CORE
    perftest_run "$1" "$4" "$5" "$6" "$2" -s 8 -n "$5"
    pinpoll_run "$1" "$4" "$5" "$6" "$3" -s 8 -n "$5" --warmup "$warmup"
}

# Engine mode runs a tenth of the iterations. Under valgrind one thread
# runs at a time, for up to 100 000 blocks, and both of the client's
# threads busy-poll, so every hand-off waits out a time slice: ~1.5 s an
# operation in the TCG guest. The waiting is removed exactly, so few
# operations do.
engine_mode() { # TEST PINPOLL_KIND VARIANT ITERS CORE
    pinpoll_run "$1" "$3" "$4" "$5" "$2" -s 8 -n "$4" --warmup 10 --mode engine
}

start=$SECONDS
for t in write-lat send-lat read-lat; do
    three_runs "$t" "$n1" "$n2" both_tools "$t" "ib_${t/-/_}" "$t"
done
if wanted write-bw; then
    echo "--- write-bw" >&2
    # compare-perftest.sh's 64 B message-rate row: perftest with a post
    # list of 32 and one completion per 32 (-l 32 -Q 32), pinpoll-perf
    # with its throughput profile (batch 32, one signal per 32). perftest
    # turns its peak figure off by itself above 20 000 requests, and that
    # figure stamps every request and compares every pair: -N (--noPeak)
    # in both runs, as compare-perftest.sh's counts get anyway.
    for v in n1 n2; do
        n=$((n2 * 32))
        [ "$v" = n1 ] && n=$((n1 * 32))
        perftest_run write-bw "$v" "$n" 0 ib_write_bw -s 64 -n "$n" -l 32 -Q 32 -N --report_gbits
        pinpoll_run write-bw "$v" "$n" 0 write-bw -s 64 -n "$n"
    done
fi
for t in read-lat send-lat; do
    three_runs "engine-$t" $((n1 / 10)) $((n2 / 10)) engine_mode "engine-$t" "$t"
done
echo "(callgrind runs: $((SECONDS - start)) s; raw files in $run_dir)" >&2

python3 "$top/scripts/lib/count_instructions.py" "$run_dir" "$manifest"
