#!/usr/bin/env bash
# scripts/record-corpus.sh — record what real sessions exchange as the fuzz
# targets' seed corpora (fuzz/corpus/TARGET/, committed).
#
#   scripts/record-corpus.sh             build the programs (debug), run the
#                                        sessions in a SoftRoCE guest, and
#                                        replace fuzz/corpus/* with what they
#                                        exchanged
#   scripts/record-corpus.sh --sessions DIR   (inside the guest) only run
#                                        the sessions, recording into DIR
#
# Debug builds of the programs save every input of a decoder of peer bytes
# under $PINPOLL_RECORD_WIRE/TARGET/ (pinpoll::wire::record), and the
# filexfer server each transfer's events as a filexfer_server script
# (filexfer::server_script). The sessions:
# filexfer transfers of 0, 5 and 1 MiB + 3 bytes (the last on 3 streams), a
# name that exists (Fail), a file over --max-size (Fail) and a classic
# client; readwrite in write and read mode; basic; pinpoll-perf over
# rdma_cm and over the TCP exchange (connection records), and a client the
# server refuses (Error). Each file is stored under its SHA-1, as libFuzzer names
# corpus entries. Stops only the servers it started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD
# shellcheck source=scripts/lib/wait.sh
. scripts/lib/wait.sh

say() { printf '==> %s\n' "$*"; }

# Starts PROGRAM ARGS... in the background, output in $work/server.N, and
# waits until it says it listens. Sets $server.
servers=0
listen() { # PROGRAM ARGS...
    servers=$((servers + 1))
    local out=$work/server.$servers
    "$@" >"$out" 2>&1 &
    server=$!
    started+=("$server")
    wait_line "$out" 'listening on \|Waiting for a client' 60 \
        || { echo "error: $* did not listen: $(cat "$out")" >&2; return 1; }
}

# Runs a client the server must refuse.
refused() { # PROGRAM ARGS...
    if "$@"; then
        echo "error: $* was not refused" >&2
        exit 1
    fi
}

# Waits for the last server (it exits after its --count or its one client).
served() {
    wait_bounded "$server" 120 || true
}

filexfer_sessions() {
    local fx=$bin/filexfer addr=$PINPOLL_ADDR4 port=18801
    mkdir -p "$work/in" "$work/small-in"
    head -c 5 /dev/urandom >"$work/five"
    : >"$work/empty"
    head -c $(((1 << 20) + 3)) /dev/urandom >"$work/mib"
    say "filexfer: native (1 and 3 streams, an empty file, a name that exists) and classic"
    listen "$fx" serve --dir "$work/in" --port "$port" --count 5 --timeout 30
    "$fx" send "$addr" "$work/five" --port "$port" --timeout 30
    "$fx" send "$addr" "$work/mib" --port "$port" --timeout 30 --streams 3
    "$fx" send "$addr" "$work/empty" --port "$port" --timeout 30
    refused "$fx" send "$addr" "$work/five" --port "$port" --timeout 30
    cp "$work/five" "$work/classic"
    "$fx" send "$addr" "$work/classic" --port "$port" --timeout 30 --classic
    served
    say "filexfer: a file over --max-size"
    listen "$fx" serve --dir "$work/small-in" --port "$((port + 1))" --count 1 --max-size 1000 --timeout 30
    refused "$fx" send "$addr" "$work/mib" --port "$((port + 1))" --timeout 30
    served
}

readwrite_sessions() {
    local rw=$bin/readwrite addr=$PINPOLL_ADDR4 port=18811
    say "readwrite: write, then read"
    listen "$rw" server --port "$port" --count 2 --timeout 30
    "$rw" client write "$addr" --port "$port" --message "recorded by record-corpus.sh" --timeout 30
    "$rw" client read "$addr" --port "$port" --timeout 30
    served
    say "basic: a message each way"
    listen "$bin/basic" server --port "$((port + 1))" --count 1 --timeout 30
    "$bin/basic" client "$addr" --port "$((port + 1))" --timeout 30
    served
}

perf_sessions() {
    local perf=$bin/pinpoll-perf dev=$PINPOLL_DEVICE port=18821
    local test host oob
    for test in send-lat write-bw read-lat; do
        for oob in "" --oob; do
            host=$PINPOLL_ADDR4
            [ -z "$oob" ] || host=127.0.0.1
            say "pinpoll-perf $test ${oob:-(rdma_cm)}"
            port=$((port + 1))
            # shellcheck disable=SC2086 # $oob: no flag or one word
            listen "$perf" "$test" -p "$port" -d "$dev" --timeout 60 $oob
            # shellcheck disable=SC2086
            "$perf" "$test" "$host" -p "$port" -d "$dev" --timeout 60 -n 20 -s 64 $oob
            served
        done
    done
    say "pinpoll-perf: a client the server refuses"
    port=$((port + 1))
    listen "$perf" write-lat -p "$port" -d "$dev" --timeout 60
    refused "$perf" read-lat "$PINPOLL_ADDR4" -p "$port" -d "$dev" --timeout 60 -n 20
    served
}

# Stops the servers this script started (those still running), by PID.
cleanup() {
    local pid
    for pid in "${started[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}

# Inside the guest: every session, recording into $1.
run_sessions() { # DIR
    [ -n "${PINPOLL_VM:-}" ] || { echo "error: --sessions runs inside scripts/softroce-vm" >&2; exit 2; }
    bin=$top/target/debug
    work=$(mktemp -d)
    started=()
    trap cleanup EXIT
    export PINPOLL_RECORD_WIRE=$1
    filexfer_sessions
    readwrite_sessions
    perf_sessions
}

# On the host: build, record in the guest, store by SHA-1.
record() {
    local rec=$top/target/wire-record dir target n
    say "building the programs (debug: only debug builds record)"
    cargo build -p pinpoll-apps -p pinpoll-perf --bins
    rm -rf "$rec"
    mkdir -p "$rec"
    scripts/softroce-vm -- scripts/record-corpus.sh --sessions "$rec"
    for dir in "$rec"/*/; do
        target=$(basename "$dir")
        rm -rf "fuzz/corpus/$target"
        mkdir -p "fuzz/corpus/$target"
        n=0
        for f in "$dir"*; do
            cp "$f" "fuzz/corpus/$target/$(sha1sum <"$f" | cut -d' ' -f1)"
            n=$((n + 1))
        done
        echo "fuzz/corpus/$target: $n inputs"
    done
}

case ${1:-} in
    --sessions) run_sessions "${2:?--sessions DIR}" ;;
    "") record ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
