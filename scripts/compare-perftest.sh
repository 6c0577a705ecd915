#!/usr/bin/env bash
# scripts/compare-perftest.sh — pinpoll-perf beside perftest, on rxe, like
# for like.
#
#   scripts/compare-perftest.sh            full compare (5 rounds, 20 000
#                                          samples a latency run)
#   scripts/compare-perftest.sh --quick    fewer iterations (to try the tooling)
#   scripts/compare-perftest.sh --sweep    also sweep sizes and draw the plot
#                                          (benchmarks.svg in the run's directory,
#                                          by `pinpoll-tune plot`)
#   options: --rounds N (>= 5; --quick: >= 3)  --out DIR  --no-build
#            --only REGEX (point names)
#
# Outside the SoftRoCE guest it builds pinpoll-perf (release) on the host and
# re-runs itself inside `scripts/softroce-vm` ($PINPOLL_VM=1 there). Inside,
# every point runs perftest and pinpoll-perf in turn, the order reversed
# from one round to the next (A B, B A, ...: ABBA), each pinned the same
# way (server on core 0, client on core 1), both on the same GID (perftest's
# -x and pinpoll-perf's -x: the RoCE v2 GID of the guest's IPv4 address).
#
# Latency: perftest prints every sample in TSC cycles (-C -U), pinpoll-perf
# every round trip in TSC ticks (--raw-samples); the first $warmup samples
# of every run are dropped from both (perftest keeps none for itself: its
# first samples carry code warming up and its peer calibrating its clock),
# and compare_table.py computes every percentile of both, in one place,
# from the same number of samples. pinpoll-perf runs twice per round: "as
# perftest" (-I 0: perftest turns inline off on rxe; --await-sends: perftest
# signals every send and busy-waits for its completion) and "as meant" (its
# profile: inline, one send in 16 signaled, none awaited).
# Bandwidth: the same tx depth, post list and CQ moderation on both sides
# (-t 128 -l 32 -Q 32; the 64 B message rate also at perftest's defaults,
# -t 128 -l 1 -Q 100), inline off on both.
#
# A Markdown table is printed: each tool's median over the rounds with its
# range, the ratio pinpoll/perftest of the medians with the range of the
# per-round ratios, the two command lines of every point and each knob that
# differs. Every raw output is kept under --out (default
# target/compare-perftest/), with summary.json. The last line is a verdict.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD

quick=0 sweep=0 rounds='' build=1 out="$top/target/compare-perftest" only=''
args=("$@")
while [ $# -gt 0 ]; do
    case $1 in
        --quick) quick=1 ;;
        --sweep) sweep=1 ;;
        --rounds) rounds=${2:?--rounds needs a number}; shift ;;
        --out) out=${2:?--out needs a directory}; shift ;;
        --no-build) build=0 ;;
        --only) only=${2:?--only needs a pattern}; shift ;;
        -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
least_rounds=$(( quick ? 3 : 5 ))
rounds=${rounds:-$least_rounds}
case $rounds in ''|*[!0-9]*) echo "error: --rounds must be a number" >&2; exit 2 ;; esac
[ "$rounds" -ge "$least_rounds" ] ||
    { echo "error: --rounds must be at least $least_rounds (medians and spreads of alternated rounds)" >&2; exit 2; }

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
    exec scripts/softroce-vm --timeout "${PINPOLL_COMPARE_TIMEOUT:-7200}" -- \
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
results=$run_dir/results.tsv commands=$run_dir/commands.tsv
: > "$results"
: > "$commands"

# Latency: $warmup samples dropped from every run, $lat_samples compared.
# perftest makes N - 1 samples of N iterations (each the time between two
# posts), pinpoll-perf N: both run warmup + samples + 1.
if [ "$quick" = 1 ]; then
    warmup=200 lat_samples=2000 bw64_n=20480 bw64k_n=320 bw1m_n=64
else
    # (perftest wants -n a multiple of its post list, 32.)
    warmup=1000 lat_samples=20000 bw64_n=51200 bw64k_n=1024 bw1m_n=96
fi
lat_n=$((warmup + lat_samples + 1))
# The same send queue, post list and CQ moderation on both sides.
bw_knobs=(-t 128 -l 32 -Q 32)
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
    if ! timeout 600 taskset -c 1 "$prog" -d "$dev" -x "$gid" -p "$port" "$@" "$addr" > "$cli" 2>&1; then
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
    timeout 900 "$perf" "$@" --loopback -d "$dev" -x "$gid" --server-core 0 --json \
        > "$run_dir/$label.json" 2> "$run_dir/$label.err" || {
        echo "warning: pinpoll-perf $* failed: $(cat "$run_dir/$label.err")" >&2
        return 1
    }
}

# record NAME TOOL ROUND PATH [SAMPLES]: SAMPLES latency samples of the
# run are compared (after the warm-up), 0 for bandwidth.
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-0}" >> "$results"; }

# One run of one tool: run_one NAME TOOL ROUND SAMPLES PROG [ARGS...].
# TOOL is perftest (PROG is its program) or a pinpoll configuration (PROG
# is pinpoll-perf's subcommand).
run_one() {
    local name=$1 tool=$2 r=$3 samples=$4 prog=$5; shift 5
    local label="$name.$tool.$r"
    if [ "$tool" = perftest ]; then
        if perftest "$prog" "$label" "$@"; then
            record "$name" "$tool" "$r" "$run_dir/$label.txt" "$samples"
        else
            record "$name" failed "$r" "$run_dir/$label.txt"
        fi
    elif pinpoll "$label" "$prog" "$@"; then
        record "$name" "$tool" "$r" "$run_dir/$label.json" "$samples"
    else
        record "$name" failed "$r" "$run_dir/$label.err"
    fi
}

# The command lines of a point, for the table (guest-specific values as
# variables), and what differs between them.
commands_of() { # NAME TOOL COMMAND NOTE
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$commands"
}

wanted() { [[ -z $only || $1 =~ $only ]]; }

# Each round runs the point's configurations in order, and the next round
# in the reverse order (ABBA); a configuration is "TOOL|PROG|ARGS...".
alternate() { # NAME SAMPLES CONFIG...
    local name=$1 samples=$2; shift 2
    local configs=("$@") r i
    for r in $(seq "$rounds"); do
        local order=()
        if [ $((r % 2)) = 1 ]; then
            order=("${configs[@]}")
        else
            for ((i = ${#configs[@]} - 1; i >= 0; i--)); do order+=("${configs[$i]}"); done
        fi
        local c
        for c in "${order[@]}"; do
            local fields
            IFS='|' read -r -a fields <<< "$c"
            run_one "$name" "${fields[0]}" "$r" "$samples" "${fields[@]:1}"
        done
    done
}

# A latency point: perftest, pinpoll-perf as perftest and as meant.
# lat_point NAME KIND SIZE PROG [ITERS]
lat_point() {
    local name=$1 kind=$2 size=$3 prog=$4 n=${5:-$lat_n}
    wanted "$name" || return 0
    echo "--- $name" >&2
    local common=(-s "$size" -n "$n" --warmup 0 --raw-samples)
    local as_perftest=("${common[@]}" -I 0 --await-sends)
    commands_of "$name" perftest "$prog -d \$DEV -x \$GID -s $size -n $n -C -U [HOST]" \
        "-C -U: every sample in TSC cycles; tx depth 1 (perftest's latency default)"
    commands_of "$name" pinpoll-as-perftest "pinpoll-perf $kind --loopback -d \$DEV -x \$GID ${as_perftest[*]}" \
        "-I 0: perftest cannot inline on rxe; --await-sends: perftest signals every send and waits for it; --warmup 0 --raw-samples: the same $warmup samples are dropped from both"
    local configs=("perftest|$prog|-s|$size|-n|$n|-C|-U"
        "pinpoll-as-perftest|$kind|$(IFS='|'; echo "${as_perftest[*]}")")
    # The sweep plots like for like only.
    if [[ $name != sweep-* ]]; then
        commands_of "$name" pinpoll "pinpoll-perf $kind --loopback -d \$DEV -x \$GID ${common[*]}" \
            "pinpoll's latency profile: inline up to 128 B, one send in 16 signaled, none awaited"
        configs+=("pinpoll|$kind|$(IFS='|'; echo "${common[*]}")")
    fi
    alternate "$name" $((n - warmup - 1)) "${configs[@]}"
}

# A bandwidth point: both tools with the same knobs, inline off on both.
# bw_point NAME KIND SIZE ITERS PROG KNOBS...
bw_point() {
    local name=$1 kind=$2 size=$3 n=$4 prog=$5; shift 5
    local knobs=("$@")
    wanted "$name" || return 0
    echo "--- $name" >&2
    commands_of "$name" perftest "$prog -d \$DEV -x \$GID -s $size -n $n ${knobs[*]} --report_gbits [HOST]" \
        "perftest cannot inline on rxe"
    commands_of "$name" pinpoll "pinpoll-perf $kind --loopback -d \$DEV -x \$GID -s $size -n $n ${knobs[*]} -I 0" \
        "-I 0: perftest cannot inline on rxe; pinpoll-perf's stream reaps as it goes, perftest polls its CQ between posts (each tool's own loop)"
    alternate "$name" 0 "perftest|$prog|-s|$size|-n|$n|$(IFS='|'; echo "${knobs[*]}")|--report_gbits" \
        "pinpoll|$kind|-s|$size|-n|$n|$(IFS='|'; echo "${knobs[*]}")|-I|0"
}

# Engine mode against direct mode (pinpoll-perf alone), N iterations.
engine_point() { # NAME KIND SIZE N
    local name=$1 kind=$2 size=$3 n=$4
    wanted "$name" || return 0
    echo "--- $name" >&2
    commands_of "$name" pinpoll "pinpoll-perf $kind --loopback -d \$DEV -x \$GID -s $size -n $n --warmup 0 --raw-samples --mode engine" \
        "set against the direct-mode run (as meant) of the same kind"
    alternate "$name" $((n - warmup - 1)) "pinpoll|$kind|-s|$size|-n|$n|--warmup|0|--raw-samples|--mode|engine"
}

start=$(date +%s)
lat_point write-lat-8 write-lat 8 ib_write_lat
lat_point send-lat-8 send-lat 8 ib_send_lat
lat_point read-lat-8 read-lat 8 ib_read_lat
lat_point write-lat-4k write-lat 4096 ib_write_lat
engine_point engine-read-lat-8 read-lat 8 "$lat_n"
# Three busy threads on two vCPUs take turns by the scheduler's tick
# (milliseconds a round trip): a tenth of the samples.
engine_point engine-write-lat-8 write-lat 8 $((warmup + lat_samples / 10 + 1))
bw_point write-bw-64 write-bw 64 "$bw64_n" ib_write_bw "${bw_knobs[@]}"
bw_point write-bw-64-l1 write-bw 64 "$bw64_n" ib_write_bw -t 128 -l 1 -Q 100
bw_point write-bw-64k write-bw 65536 "$bw64k_n" ib_write_bw "${bw_knobs[@]}"
bw_point write-bw-1m write-bw 1048576 "$bw1m_n" ib_write_bw "${bw_knobs[@]}"
bw_point send-bw-64k send-bw 65536 "$bw64k_n" ib_send_bw "${bw_knobs[@]}"
bw_point read-bw-64k read-bw 65536 "$bw64k_n" ib_read_bw "${bw_knobs[@]}"

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
        record filexfer rcopy "$r" "$run_dir/rcopy.$r.json"
    else
        record filexfer failed "$r" "$run_dir/rcopy.$r.txt"
    fi
    # rcopy's server serves forever: stopped by the pid it was started as.
    kill "$rpid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
    rm -f "$dst"
}

# filexfer send of $file once (server on core 0, sender on core 1). The
# time is the sender's own summary: from Start to "verified, fsynced, in
# place", without process start and connection set-up (ib_write_bw's figure
# leaves those out too).
filexfer_once() {
    local file=$1 fxdir=$2 r=$3 secs
    next_port
    rm -rf "$fxdir/dst" && mkdir -p "$fxdir/dst"
    taskset -c 0 "$filexfer" serve --dir "$fxdir/dst" --count 1 -p "$port" \
        --core 0 > "$run_dir/filexfer.server.$r.txt" 2>&1 &
    local fpid=$!
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
        record filexfer pinpoll "$r" "$run_dir/filexfer.$r.json"
    else
        record filexfer failed "$r" "$run_dir/filexfer.$r.txt"
    fi
    timeout 30 tail --pid="$fpid" -f /dev/null || kill "$fpid" 2>/dev/null || true
    wait "$fpid" 2>/dev/null || true
}

# filexfer (built by apps/ when it exists) against ib_write_bw at 1 MiB and
# rcopy, the three in turn, the order reversed every round.
filexfer=""
for f in "$target_dir/release/filexfer" "$target_dir/debug/filexfer"; do
    [ -x "$f" ] && { filexfer=$f; break; }
done
wanted filexfer || filexfer=""
if [ -n "$filexfer" ]; then
    echo "--- filexfer 64 MiB" >&2
    # Both files on the guest's own tmpfs: the work dir is the host's disk
    # over 9p, which would measure 9p, and ib_write_bw touches no file.
    fxdir=$(mktemp -d /tmp/compare-filexfer.XXXXXX)
    file="$fxdir/filexfer.src"
    head -c $((64 << 20)) /dev/urandom > "$file"
    commands_of filexfer pinpoll "filexfer send HOST 64MiB-file --core 1 (server: filexfer serve --count 1 --core 0)" \
        "filexfer verifies and fsyncs; ib_write_bw and rcopy do neither"
    commands_of filexfer perftest "ib_write_bw -d \$DEV -x \$GID -s 1048576 -n 64 --report_gbits [HOST]" "-"
    for r in $(seq "$rounds"); do
        steps=(filexfer perftest rcopy)
        [ $((r % 2)) = 1 ] || steps=(rcopy perftest filexfer)
        for step in "${steps[@]}"; do
            case $step in
                filexfer) filexfer_once "$file" "$fxdir" "$r" ;;
                rcopy) rcopy_once "$file" "$fxdir/rcopy.dst" "$r" ;;
                perftest) run_one filexfer perftest "$r" 0 ib_write_bw -s 1048576 -n 64 --report_gbits ;;
            esac
        done
    done
    rm -rf "$fxdir"
fi

if [ "$sweep" = 1 ]; then
    # For the plot: write latency like for like (fewer samples above 4 KiB,
    # where a round trip lasts milliseconds here) and write bandwidth with
    # the same knobs on both sides.
    for s in 8 64 256 1024 4096 16384 65536; do
        n=$lat_n
        [ "$s" -le 4096 ] || n=$((warmup + lat_samples / (s / 4096) + 1))
        lat_point "sweep-write-lat-$s" write-lat "$s" ib_write_lat "$n"
    done
    for s in 64 1024 4096 65536 262144 1048576; do
        n=$(( s <= 4096 ? 20480 : (s <= 65536 ? 1024 : 128) ))
        [ "$quick" = 1 ] && n=$(( n / 2 ))
        bw_point "sweep-write-bw-$s" write-bw "$s" "$n" ib_write_bw "${bw_knobs[@]}"
    done
fi
elapsed=$(( $(date +%s) - start ))

table_status=0
python3 "$top/scripts/lib/compare_table.py" "$results" "$commands" "$run_dir" "$elapsed" \
    "$rounds" "$warmup" "$lat_samples" "$( [ -n "$filexfer" ] && echo yes || echo no )" \
    > "$run_dir/table.md" || table_status=$?
if [ "$sweep" = 1 ] && [ "$table_status" = 0 ]; then
    # The plot's messages go to stderr: the table's last line stays the verdict.
    "$tune" plot "$run_dir/summary.json" -o "$run_dir/benchmarks.svg" >&2 ||
        echo "warning: the plot was not drawn (see above); the table stands" >&2
fi
cat "$run_dir/table.md"
exit "$table_status"
