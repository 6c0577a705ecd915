#!/usr/bin/env bash
# scripts/compare-perftest.sh — pinpoll-perf beside perftest, on rxe.
#
#   scripts/compare-perftest.sh            full compare (3 rounds, ~10 min under TCG)
#   scripts/compare-perftest.sh --quick    fewer iterations (~4 min)
#   scripts/compare-perftest.sh --sweep    also sweep sizes and draw the plot
#                                          (benchmarks.svg in the run's directory,
#                                          by `pinpoll-tune plot`; docs/ has the published one)
#   options: --rounds N (>= 3)  --out DIR  --no-build  --only REGEX (point names)
#
# Outside the SoftRoCE guest it builds pinpoll-perf (release) on the host and
# re-runs itself inside `scripts/softroce-vm` ($PINPOLL_VM=1 there). Inside,
# every point runs pinpoll-perf and the matching perftest program in turn
# (A B A B ..., at least 3 rounds), each pinned the same way (server on core
# 0, client on core 1), and a Markdown table of the medians and the ratio
# pinpoll/perftest is printed. Every raw output is kept under --out (default
# target/compare-perftest/). The last line is a one-line verdict.
#
# perftest turns inline off on devices it does not know (rxe among them);
# pinpoll inlines up to its profile's threshold. Latency is perftest's
# convention: half a round trip for WRITE and SEND, a full one for READ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD

quick=0 sweep=0 rounds=3 build=1 out="$top/target/compare-perftest" only=''
args=("$@")
while [ $# -gt 0 ]; do
    case $1 in
        --quick) quick=1 ;;
        --sweep) sweep=1 ;;
        --rounds) rounds=${2:?--rounds needs a number}; shift ;;
        --out) out=${2:?--out needs a directory}; shift ;;
        --no-build) build=0 ;;
        --only) only=${2:?--only needs a pattern}; shift ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case $rounds in ''|*[!0-9]*) echo "error: --rounds must be a number" >&2; exit 2 ;; esac
[ "$rounds" -ge 3 ] || { echo "error: --rounds must be at least 3 (interleaved medians)" >&2; exit 2; }

target_dir=${CARGO_TARGET_DIR:-$top/target}
perf=$target_dir/release/pinpoll-perf
tune=$target_dir/release/pinpoll-tune

if [ "${PINPOLL_VM:-}" != 1 ]; then
    if [ "$build" = 1 ]; then
        echo "==> cargo build --release -p pinpoll-perf" >&2
        cargo build --release -p pinpoll-perf >&2
        if [ -f apps/src/bin/filexfer.rs ]; then
            echo "==> cargo build --release -p pinpoll-apps --bin filexfer" >&2
            cargo build --release -p pinpoll-apps --bin filexfer >&2 ||
                echo "warning: filexfer did not build; its row will say n/a" >&2
        fi
        if [ "$sweep" = 1 ]; then
            echo "==> cargo build --release -p pinpoll-tune" >&2
            cargo build --release -p pinpoll-tune >&2
        fi
    fi
    [ "$sweep" = 0 ] || [ -x "$tune" ] ||
        { echo "error: $tune is missing (it draws the --sweep plot); build it (drop --no-build)" >&2; exit 1; }
    [ -x "$perf" ] || { echo "error: $perf is missing; build it (drop --no-build)" >&2; exit 1; }
    exec scripts/softroce-vm --timeout "${PINPOLL_COMPARE_TIMEOUT:-1800}" -- \
        bash "$top/scripts/compare-perftest.sh" --no-build "${args[@]}"
fi

# ---- inside the guest -------------------------------------------------------
dev=${PINPOLL_DEVICE:?PINPOLL_DEVICE unset: not inside scripts/softroce-vm}
gid=${PINPOLL_GID_INDEX:?PINPOLL_GID_INDEX unset}
addr=${PINPOLL_ADDR4:?PINPOLL_ADDR4 unset}
[ -x "$perf" ] || { echo "error: $perf is missing; build it on the host first" >&2; exit 1; }
for p in ib_write_lat ib_send_lat ib_read_lat ib_write_bw ib_send_bw ib_read_bw rcopy python3 taskset; do
    command -v "$p" >/dev/null || { echo "error: $p is not installed (apt-get install perftest rdmacm-utils util-linux python3)" >&2; exit 1; }
done
run_dir="$out/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$run_dir"
results="$run_dir/results.tsv"
: > "$results"

# Iterations: each point a few seconds under TCG.
if [ "$quick" = 1 ]; then
    lat_n=500 bw64_n=20480 bw64k_n=320 bw1m_n=40
else
    # (perftest wants -n a multiple of its post list, 32.)
    lat_n=2000 bw64_n=51200 bw64k_n=1024 bw1m_n=96
fi
port=20000
next_port() { port=$((port + 1)); }

# perftest: server on core 0 in the background, client on core 1.
# $1 = program, $2 = label, rest = flags for both sides.
perftest() {
    local prog=$1 label=$2; shift 2
    local srv="$run_dir/$label.server.txt" cli="$run_dir/$label.txt"
    next_port
    # Line-buffered, so its banner shows as soon as it listens.
    stdbuf -oL taskset -c 0 "$prog" -d "$dev" -x "$gid" -p "$port" "$@" > "$srv" 2>&1 &
    local spid=$!
    # (Few probes: every process start is slow under TCG.)
    for _ in $(seq 40); do
        grep -qE -- "Waiting|---" "$srv" 2>/dev/null && break
        sleep 0.25
    done
    if ! timeout 90 taskset -c 1 "$prog" -d "$dev" -x "$gid" -p "$port" "$@" "$addr" > "$cli" 2>&1; then
        kill "$spid" 2>/dev/null || true
        wait "$spid" 2>/dev/null || true
        echo "warning: $prog $* failed (or hung); see $cli" >&2
        return 1
    fi
    timeout 30 tail --pid="$spid" -f /dev/null || kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
}

# pinpoll-perf --loopback: server thread on core 0, client on core 1.
pinpoll() {
    local label=$1; shift
    timeout 300 "$perf" "$@" --loopback -d "$dev" --server-core 0 --json \
        > "$run_dir/$label.json" 2> "$run_dir/$label.err" || {
        echo "warning: pinpoll-perf $* failed: $(cat "$run_dir/$label.err")" >&2
        return 1
    }
}

record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$results"; }

# One point: both tools, interleaved, $rounds times.
# point NAME KIND SIZE ITERS PERFTEST_PROG [PINPOLL FLAGS...] -- [PERFTEST FLAGS...]
point() {
    local name=$1 kind=$2 size=$3 n=$4 prog=$5; shift 5
    local pflags=() tflags=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do pflags+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    tflags=("$@")
    [[ -z $only || $name =~ $only ]] || return 0
    echo "--- $name" >&2
    for r in $(seq "$rounds"); do
        if pinpoll "$name.pinpoll.$r" "$kind" -s "$size" -n "$n" "${pflags[@]}"; then
            record "$name" pinpoll "$run_dir/$name.pinpoll.$r.json"
        else
            record "$name" failed "$run_dir/$name.pinpoll.$r.err"
        fi
        if [ "$prog" != none ]; then
            if perftest "$prog" "$name.perftest.$r" -s "$size" -n "$n" "${tflags[@]}"; then
                record "$name" perftest "$run_dir/$name.perftest.$r.txt"
            else
                record "$name" failed "$run_dir/$name.perftest.$r.txt"
            fi
        fi
    done
}

start=$(date +%s)
point write-lat-8 write-lat 8 "$lat_n" ib_write_lat --
point send-lat-8 send-lat 8 "$lat_n" ib_send_lat --
point read-lat-8 read-lat 8 "$lat_n" ib_read_lat --
point write-lat-4k write-lat 4096 "$lat_n" ib_write_lat --
point engine-read-lat-8 read-lat 8 "$lat_n" none --mode engine --
point engine-write-lat-8 write-lat 8 "$lat_n" none --mode engine --
point write-bw-64 write-bw 64 "$bw64_n" ib_write_bw -- --report_gbits
# perftest's best configuration at 64 B: its defaults or a post list of 32
# with one completion per 32 (-l 32 -Q 32).
[[ -z $only || write-bw-64 =~ $only ]] && echo "--- write-bw-64 (perftest -l 32 -Q 32)" >&2
for r in $(seq "$rounds"); do
    [[ -z $only || write-bw-64 =~ $only ]] || break
    if perftest ib_write_bw "write-bw-64-l32.perftest.$r" -s 64 -n "$bw64_n" -l 32 -Q 32 --report_gbits; then
        record write-bw-64-l32 perftest "$run_dir/write-bw-64-l32.perftest.$r.txt"
    else
        # perftest's post-list mode sometimes stalls on rxe; its defaults
        # still count as its best when every -l 32 round fails.
        record write-bw-64-l32 failed "$run_dir/write-bw-64-l32.perftest.$r.txt"
    fi
done
point write-bw-64k write-bw 65536 "$bw64k_n" ib_write_bw -- --report_gbits
point write-bw-1m write-bw 1048576 "$bw1m_n" ib_write_bw -- --report_gbits
point send-bw-64k send-bw 65536 "$bw64k_n" ib_send_bw -- --report_gbits
point read-bw-64k read-bw 65536 "$bw64k_n" ib_read_bw -- --report_gbits

# rdma-core's rcopy (rsockets; verifies nothing, fsyncs nothing) copies
# $1 to $2 once: server on core 0, client on core 1. Its figure is its own
# "N bytes in S seconds": the data and the server's acknowledgement, without
# process start, connection set-up, open and fallocate. Recorded as
# "filexfer rcopy" when the copy is byte-identical.
rcopy_once() {
    local src=$1 dst=$2 r=$3 secs
    next_port
    rm -f "$dst"
    stdbuf -oL taskset -c 0 rcopy -p "$port" > "$run_dir/rcopy.server.$r.txt" 2>&1 &
    local rpid=$!
    for _ in $(seq 240); do
        grep -q "waiting for connection" "$run_dir/rcopy.server.$r.txt" && break
        sleep 0.25
    done
    if timeout 300 taskset -c 1 rcopy "$src" "$addr:$dst" -p "$port" > "$run_dir/rcopy.$r.txt" 2>&1 &&
        secs=$(sed -n 's/.* bytes in \([0-9.]*\) seconds .*/\1/p' "$run_dir/rcopy.$r.txt") &&
        [ -n "$secs" ] && cmp -s "$src" "$dst"; then
        python3 -c "import json,sys; json.dump({'seconds': $secs, 'bytes': 64<<20}, open(sys.argv[1],'w'))" "$run_dir/rcopy.$r.json"
        record filexfer rcopy "$run_dir/rcopy.$r.json"
    else
        record filexfer failed "$run_dir/rcopy.$r.txt"
    fi
    # rcopy's server serves forever: stopped by the pid it was started as.
    kill "$rpid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
    rm -f "$dst"
}

# filexfer (built by apps/ when it exists) against rcopy and ib_write_bw at
# 1 MiB, interleaved.
filexfer=""
for f in "$target_dir/release/filexfer" "$target_dir/debug/filexfer"; do
    [ -x "$f" ] && { filexfer=$f; break; }
done
[[ -z $only || filexfer =~ $only ]] || filexfer=""
if [ -n "$filexfer" ]; then
    echo "--- filexfer 64 MiB" >&2
    # Both files on the guest's own tmpfs: the work dir is the host's disk
    # over 9p, which would measure 9p, and ib_write_bw touches no file.
    fxdir=$(mktemp -d /tmp/compare-filexfer.XXXXXX)
    file="$fxdir/filexfer.src"
    head -c $((64 << 20)) /dev/urandom > "$file"
    for r in $(seq "$rounds"); do
        next_port
        rm -rf "$fxdir/dst" && mkdir -p "$fxdir/dst"
        # Server on core 0, sender on core 1 (as every other point). The
        # time is the sender's own summary: from Start to "verified,
        # fsynced, in place", without process start and connection set-up
        # (ib_write_bw's figure leaves those out too).
        taskset -c 0 "$filexfer" serve --dir "$fxdir/dst" --count 1 -p "$port" \
            --core 0 > "$run_dir/filexfer.server.$r.txt" 2>&1 &
        fpid=$!
        # Until it listens (process start is slow under TCG), at most 60 s.
        for _ in $(seq 240); do
            grep -q "listening on" "$run_dir/filexfer.server.$r.txt" && break
            sleep 0.25
        done
        if timeout 300 taskset -c 1 "$filexfer" send "$addr" "$file" -p "$port" --core 1 \
            > "$run_dir/filexfer.$r.txt" 2>&1 &&
            secs=$(sed -n 's/.* bytes in \([0-9.]*\) s .*/\1/p' "$run_dir/filexfer.$r.txt") &&
            [ -n "$secs" ]; then
            python3 -c "import json,sys; json.dump({'seconds': $secs, 'bytes': 64<<20}, open(sys.argv[1],'w'))" "$run_dir/filexfer.$r.json"
            record filexfer pinpoll "$run_dir/filexfer.$r.json"
        else
            record filexfer failed "$run_dir/filexfer.$r.txt"
        fi
        timeout 30 tail --pid="$fpid" -f /dev/null || kill "$fpid" 2>/dev/null || true
        wait "$fpid" 2>/dev/null || true
        perftest ib_write_bw "filexfer-ref.perftest.$r" -s 1048576 -n 64 --report_gbits &&
            record filexfer perftest "$run_dir/filexfer-ref.perftest.$r.txt"
        rcopy_once "$file" "$fxdir/rcopy.dst" "$r"
    done
    rm -rf "$fxdir"
fi

if [ "$sweep" = 1 ]; then
    # One interleaved pair per size per round, for the plot.
    for s in 8 64 256 1024 4096 16384 65536; do
        point "sweep-write-lat-$s" write-lat "$s" "$lat_n" ib_write_lat --
    done
    for s in 64 1024 4096 65536 262144 1048576; do
        n=$(( s <= 4096 ? 20000 : (s <= 65536 ? 1000 : 100) ))
        [ "$quick" = 1 ] && n=$(( n / 2 ))
        point "sweep-write-bw-$s" write-bw "$s" "$n" ib_write_bw -- --report_gbits
    done
fi
elapsed=$(( $(date +%s) - start ))

table_status=0
python3 "$top/scripts/lib/compare_table.py" "$results" "$run_dir" "$elapsed" "$rounds" \
    "$( [ -n "$filexfer" ] && echo yes || echo no )" > "$run_dir/table.md" || table_status=$?
if [ "$sweep" = 1 ] && [ "$table_status" = 0 ]; then
    # The plot's messages go to stderr: the table's last line stays the verdict.
    "$tune" plot "$run_dir/summary.json" -o "$run_dir/benchmarks.svg" >&2 ||
        echo "warning: the plot was not drawn (see above); the table stands" >&2
fi
cat "$run_dir/table.md"
exit "$table_status"
