#!/usr/bin/env bash
# scripts/fault-suite.sh — faults that need two machines, injected for real.
#
# Runs inside `scripts/softroce-vm --hosts 2` (scripts/test.sh does that):
# guest 0 runs this script and the clients, guest 1 runs the servers
# (started with pinpoll-peer-bg). The guests are joined only to each other;
# every address is link-local. Each case expects a precise outcome — data
# identical, or a clear error within a bounded time — and a case that cannot
# run fails; nothing is skipped. Prints "N passed, N failed" last.
#
#   scripts/softroce-vm --hosts 2 -- scripts/fault-suite.sh [BINDIR]
#
# BINDIR holds the built apps (default: target/debug of the work tree).
set -u
BIN=${1:-${PINPOLL_WORKDIR:-$PWD}/target/debug}
[ "${PINPOLL_HOSTS:-1}" -ge 2 ] || { echo "error: needs two guests: scripts/softroce-vm --hosts 2 -- $0" >&2; exit 2; }
for b in basic readwrite filexfer; do
    [ -x "$BIN/$b" ] || { echo "error: $BIN/$b not built (cargo build -p pinpoll-apps)" >&2; exit 2; }
done
read -r _ PEER4 _ <<<"$PINPOLL_PEERS4"
read -r _ PEER6 _ <<<"$PINPOLL_PEERS6"
NETDEV=$PINPOLL_NETDEV
passed=0 failed=0 port=7600

ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1: $2"; }
next_port() { port=$((port + 1)); }

# Starts a server on guest 1 and waits until it listens; prints the job id.
serve() { # PROGRAM ARGS...
    local job n
    job=$(pinpoll-peer-bg 1 "$BIN/$1" server --port "$port" --count 1 "${@:2}") || return 1
    for ((n = 0; n < 300; n++)); do
        pinpoll-peer-log 1 "$job" 2>/dev/null | grep -q "listening on" && { echo "$job"; return 0; }
        sleep 0.1
    done
    echo "server on guest 1 never listened" >&2
    return 1
}

# Waits (bounded) for a server job's end and prints its output; a server
# still running after 90 s is killed and the wait fails.
# (The status is the server's own: 124 only when the wait ran out.)
finish() { # JOB
    local rc
    timeout 90 pinpoll-peer-wait 1 "$1"
    rc=$?
    [ "$rc" -eq 0 ] || pinpoll-peer-kill 1 "$1" KILL >/dev/null 2>&1
    return "$rc"
}

netem() { # ARGS... (empty: remove)
    tc qdisc del dev "$NETDEV" root 2>/dev/null
    [ "$#" -eq 0 ] || tc qdisc add dev "$NETDEV" root netem "$@"
}

# A 3000-byte message with a checkable structure.
MESSAGE=$(for i in $(seq 1 100); do printf 'line %03d of the fault suite...\n' "$i"; done | tr '\n' '|' | cut -c1-3000)

# Case: an RDMA WRITE across the link arrives byte for byte under `netem`.
write_arrives() { # NAME NETEM-ARGS...
    local name=$1 job out
    shift
    next_port
    netem "$@" || { bad "$name" "tc netem $* failed"; return; }
    job=$(serve readwrite --timeout 60) || { netem; bad "$name" "server did not start"; return; }
    out=$(timeout 120 "$BIN/readwrite" client write "$PEER4" --port "$port" --timeout 60 --message "$MESSAGE" 2>&1)
    local rc=$?
    netem
    finish "$job" >/tmp/server.out 2>&1
    local src=$?
    if [ "$rc" -ne 0 ] || [ "$src" -ne 0 ]; then
        bad "$name" "client rc=$rc server rc=$src: $out $(tail -2 /tmp/server.out)"
    elif ! grep -qF -- "$MESSAGE" /tmp/server.out; then
        bad "$name" "the server printed something else: $(tail -3 /tmp/server.out)"
    else
        ok "$name"
    fi
}

# Case: a client fails with one clear error line, within its deadline.
fails_cleanly() { # NAME EXPECTED-TEXT CLIENT-ARGS...
    local name=$1 want=$2 out rc lines
    shift 2
    out=$(timeout 120 "$BIN/basic" client "$@" 2>&1 >/dev/null)
    rc=$?
    lines=$(printf '%s\n' "$out" | grep -c '^error:')
    if [ "$rc" -eq 124 ]; then
        bad "$name" "no answer within 120 s (the client's own deadline did not fire)"
    elif [ "$rc" -eq 0 ]; then
        bad "$name" "the client succeeded"
    elif [ "$lines" -ne 1 ] || ! printf '%s' "$out" | grep -qi -- "$want"; then
        bad "$name" "expected one error line mentioning '$want', got: $out"
    else
        ok "$name"
    fi
}

# 0. The link works: messages both ways between the guests, IPv4 and IPv6.
for fam in 4 6; do
    next_port
    peer=$PEER4
    if [ "$fam" = 6 ]; then
        peer=$PEER6
        [[ $peer == *%* ]] || peer="$peer%$NETDEV"
    fi
    if job=$(serve basic); then
        out=$(timeout 120 "$BIN/basic" client "$peer" --port "$port" 2>&1)
        rc=$?
        finish "$job" >/tmp/server.out 2>&1
        if [ "$rc" -eq 0 ] && grep -q "message from server pid" <<<"$out" && grep -q "message from client pid" /tmp/server.out; then
            ok "messages cross the link (IPv$fam)"
        else
            bad "messages cross the link (IPv$fam)" "rc=$rc $out $(tail -2 /tmp/server.out)"
        fi
    else
        bad "messages cross the link (IPv$fam)" "server did not start"
    fi
done

# 3. Loss and delay on guest 0's link: the data arrive identical.
write_arrives "50 ms delay: the write arrives identical" delay 50ms
write_arrives "1 % loss: the write arrives identical" loss 1%
write_arrives "10 % loss: the write arrives identical" loss 10%

# 3. All packets lost: a bounded error, not a hang.
next_port
if job=$(serve basic --timeout 20); then
    netem loss 100%
    fails_cleanly "100 % loss: a bounded error" "timed out\|unreachable\|did not answer\|rejected\|error" "$PEER4" --port "$port" --timeout 5
    netem
    pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
else
    bad "100 % loss: a bounded error" "server did not start"
fi

# 5. No server at that port on a live host; no host at that address.
next_port
fails_cleanly "no server on the peer: refused" "rejected\|refused" "$PEER4" --port "$port" --timeout 5
fails_cleanly "no host at the address: bounded error" "unreachable\|timed out\|resolv\|did not answer" 169.254.0.99 --port "$port" --timeout 5

# filexfer across the link: a file arrives identical (SHA-256 on both
# guests), plain and under 10 % loss.
file_arrives() { # NAME MIB NETEM-ARGS...
    local name=$1 mib=$2 job out rc want got
    shift 2
    next_port
    rm -rf /tmp/fx && mkdir -p /tmp/fx
    head -c "$((mib * 1024 * 1024))" /dev/urandom >/tmp/fx/payload.bin
    want=$(sha256sum </tmp/fx/payload.bin | cut -d' ' -f1)
    pinpoll-peer 1 bash -c 'rm -rf /tmp/fxin && mkdir -p /tmp/fxin' >/dev/null 2>&1
    job=$(pinpoll-peer-bg 1 "$BIN/filexfer" serve --dir /tmp/fxin --port "$port" --count 1 --timeout 60) || { bad "$name" "server did not start"; return; }
    for ((n = 0; n < 300; n++)); do
        pinpoll-peer-log 1 "$job" 2>/dev/null | grep -q "listening on" && break
        sleep 0.1
    done
    netem "$@" || { bad "$name" "tc netem $* failed"; return; }
    out=$(timeout 600 "$BIN/filexfer" send "$PEER4" /tmp/fx/payload.bin --port "$port" --timeout 60 -q 2>&1)
    rc=$?
    netem
    finish "$job" >/tmp/server.out 2>&1
    got=$(pinpoll-peer 1 bash -c 'sha256sum </tmp/fxin/payload.bin' 2>/dev/null | cut -d' ' -f1)
    if [ "$rc" -ne 0 ]; then
        bad "$name" "send failed (rc=$rc): $out $(tail -2 /tmp/server.out)"
    elif [ "$got" != "$want" ]; then
        bad "$name" "received sha256 ${got:-none} != sent $want"
    else
        ok "$name"
    fi
}
file_arrives "filexfer 64 MiB across guests arrives identical" 64
file_arrives "filexfer 8 MiB under 10 % loss arrives identical" 8 loss 10%

echo
echo "faults: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
