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
# Cases (numbers of issue #7): 0 the link works; 1 a peer SIGKILLed while
# idle and mid-transfer; 2 the server restarted; 3 netem loss and delay;
# 4 the receiver SIGSTOPped (and RNR counters); 5 no server, no host;
# 6 rdma link delete mid-transfer; 12 clients beyond --max-clients;
# 13 load, 8 clients x 32 files, with the server's peak RSS; fx: filexfer
# across the guests, plain and under loss.
#
#   scripts/softroce-vm --hosts 2 -- scripts/fault-suite.sh [BINDIR [CASE...]]
#
# BINDIR holds the built apps (default: target/debug of the work tree).
# CASE... runs only those cases (numbers of issue #7: 0 1 2 3 4 5 6 12 13
# fx), for a quick loop while working on one; the summary line then says
# which ran. scripts/test.sh runs them all.
set -u
BIN=${1:-${PINPOLL_WORKDIR:-$PWD}/target/debug}
shift $(($# > 0 ? 1 : 0))
ONLY=" $* "
for c in "$@"; do
    case $c in 0 | 1 | 2 | 3 | 4 | 5 | 6 | 12 | 13 | fx) ;; *) echo "error: unknown case '$c' (cases: 0 1 2 3 4 5 6 12 13 fx)" >&2; exit 2 ;; esac
done
selected() { [ "$ONLY" = "  " ] || [[ $ONLY == *" $1 "* ]]; }
SUITE_T0=$SECONDS
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
said() { echo "     said: $(grep -m1 '^error:' "$1")"; } # FILE: its error line

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
case_0() {
local fam peer job out rc
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
}

# 3. Loss and delay on guest 0's link: the data arrive identical.
case_3() {
local job
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
}

# 5. No server at that port on a live host; no host at that address.
case_5() {
next_port
fails_cleanly "no server on the peer: refused" "rejected\|refused" "$PEER4" --port "$port" --timeout 5
fails_cleanly "no host at the address: bounded error" "unreachable\|timed out\|resolv\|did not answer" 169.254.0.99 --port "$port" --timeout 5
}

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
case_fx() {
file_arrives "filexfer 64 MiB across guests arrives identical" 64
file_arrives "filexfer 8 MiB under 10 % loss arrives identical" 8 loss 10%
}

# ---------------------------------------------------------------------------
# filexfer with a peer that dies, stops, restarts or loses its device, too
# many clients, and load (issue #7 cases 1, 2, 4, 6, 12, 13). Servers run on
# guest 1 into a fresh directory there, clients here. `timeout`s and the
# bounded waits below are hang guards only: every expected end comes from
# the programs' own deadlines (--timeout, heartbeats, rdma_cm events).

SRC=/tmp/fxsrc             # guest 0: the files that are sent
BIG_MIB=64                 # long enough to be hit mid-transfer (~10 s)
DEV=${PINPOLL_DEVICE:-rxe0}

on1() { pinpoll-peer 1 bash -c "$1"; } # a shell command on guest 1
job_pid() { cat "/run/pinpoll/jobs-1/$1.pid"; } # a job's pid on guest 1
fresh_dir() { on1 "rm -rf '$1' && mkdir -p '$1'" >/dev/null 2>&1; }
remote_names() { on1 "ls -A '$1'" 2>/dev/null | sort | tr '\n' ' ' | sed 's/ $//'; }
remote_sha() { on1 "sha256sum <'$1'" 2>/dev/null | cut -d' ' -f1; }
sha_of() { sha256sum <"$1" | cut -d' ' -f1; }

make_src() { # NAME MIB
    mkdir -p "$SRC"
    [ -s "$SRC/$1" ] || head -c "$(($2 * 1024 * 1024))" /dev/urandom >"$SRC/$1"
}

# Starts `filexfer serve --dir DIR --port $port ARGS...` on guest 1 and
# waits until it listens; prints the job id.
fx_listen() { # DIR ARGS...
    local dir=$1 job n
    shift
    job=$(pinpoll-peer-bg 1 "$BIN/filexfer" serve --dir "$dir" --port "$port" "$@") || return 1
    for ((n = 0; n < 300; n++)); do
        pinpoll-peer-log 1 "$job" 2>/dev/null | grep -q "listening on" && { echo "$job"; return 0; }
        sleep 0.1
    done
    echo "filexfer server on guest 1 never listened: $(pinpoll-peer-log 1 "$job" 2>&1 | tail -2)" >&2
    pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
    return 1
}

# Starts `filexfer send` here in the background (output in OUT); sets $cpid.
fx_send_bg() { # OUT FILE ARGS...
    local out=$1 file=$2
    shift 2
    "$BIN/filexfer" send "$PEER4" "$file" --port "$port" "$@" >"$out" 2>&1 &
    cpid=$!
}

# Waits for a process of ours; a hang guard: after SECS it is killed and
# the result is 124. Otherwise its exit status.
wait_bounded() { # PID SECS
    local n
    for ((n = 0; n < $2 * 10; n++)); do
        kill -0 "$1" 2>/dev/null || { wait "$1"; return; }
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 124
}

wait_line() { # FILE TEXT SECS: until FILE has a line with TEXT
    local n
    for ((n = 0; n < $3 * 10; n++)); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

wait_job_lines() { # JOB TEXT COUNT SECS: until the job printed COUNT lines with TEXT
    local n
    for ((n = 0; n < $4 * 10; n++)); do
        [ "$(pinpoll-peer-log 1 "$1" 2>&1 | grep -c -- "$2")" -ge "$3" ] && return 0
        sleep 0.1
    done
    return 1
}

# Until the server (job JOB) has been receiving a file for a second: the
# transfer is under way (BIG_MIB takes ~10 s in the TCG guests). Whether
# the fault then really hit mid-transfer is checked afterwards: the file
# must not have been completed (mid_transfer).
wait_receiving() { # JOB
    wait_job_lines "$1" ": receiving " 1 60 || return 1
    sleep 1
}
mid_transfer() { # JOB: the server completed no file
    ! pinpoll-peer-log 1 "$1" 2>&1 | grep -q ": received "
}
# A failure as the programs must report it: status 1 (not a hang guard's
# 124), exactly one `error:` line, and that line matching PATTERN (grep).
# Prints what is wrong, nothing if all is well.
check_error() { # RC FILE PATTERN
    local lines
    lines=$(grep -c '^error:' "$2")
    if [ "$1" -eq 124 ]; then
        echo "no end within the hang guard (its own deadline did not fire): $(tail -3 "$2" | tr '\n' ' ')"
    elif [ "$1" -ne 1 ]; then
        echo "exit status $1, expected 1: $(tail -3 "$2" | tr '\n' ' ')"
    elif [ "$lines" -ne 1 ]; then
        echo "$lines error lines, expected 1: $(tr '\n' ' ' <"$2")"
    elif ! grep '^error:' "$2" | grep -q -- "$3"; then
        echo "the error line does not match '$3': $(grep '^error:' "$2")"
    fi
}

# Sends FILE to the server on $port and checks it arrived in DIR on guest 1
# with the same SHA-256; prints what is wrong.
send_and_compare() { # DIR FILE TIMEOUT
    local out rc got
    out=$(timeout 300 "$BIN/filexfer" send "$PEER4" "$2" --port "$port" --timeout "$3" -q 2>&1)
    rc=$?
    got=$(remote_sha "$1/$(basename "$2")")
    if [ "$rc" -ne 0 ]; then
        echo "send of $(basename "$2") failed (rc=$rc): $out"
    elif [ "$got" != "$(sha_of "$2")" ]; then
        echo "$(basename "$2") arrived with sha256 ${got:-none}, sent $(sha_of "$2")"
    fi
}

# 1. A peer killed with SIGKILL while idle and mid-transfer. "Idle": the
# client is connected and waits for its file (--wait-for-file); only
# heartbeats cross the link. A process that dies has its rdma_cm ids
# destroyed by its kernel, which sends a DREQ: the survivor sees the
# disconnect at once (a dead host would be found by the heartbeats).
case_1() {
    local name job why='' rc
    make_src big.bin "$BIG_MIB"
    make_src small.bin 4
    rm -f "$SRC/idle.bin"

    name="1. server SIGKILLed while idle: the client ends with one clear error"
    next_port
    fresh_dir /tmp/k1
    if job=$(fx_listen /tmp/k1 --count 1 --timeout 60); then
        fx_send_bg /tmp/c1.out "$SRC/idle.bin" --timeout 20 --wait-for-file 60
        if wait_line /tmp/c1.out "waiting up to" 30; then
            sleep 3 # idle: heartbeats only
            pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
            wait_bounded "$cpid" 60
            why=$(check_error $? /tmp/c1.out "idle.bin to appear: .*\(server disconnected\|heartbeat\|stopped answering\)")
            [ -z "$why" ] && [ -n "$(remote_names /tmp/k1)" ] && why="files on the server: $(remote_names /tmp/k1)"
        else
            why="the client never waited: $(tr '\n' ' ' </tmp/c1.out)"
            kill -KILL "$cpid" 2>/dev/null
            pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
        fi
        if [ -z "$why" ]; then ok "$name" && said /tmp/c1.out; else bad "$name" "$why"; fi
    else
        bad "$name" "server did not start"
    fi

    name="1. client SIGKILLed while idle: the server ends with one clear error, no file"
    next_port
    fresh_dir /tmp/k1
    if job=$(fx_listen /tmp/k1 --count 1 --timeout 60); then
        fx_send_bg /tmp/c1.out "$SRC/idle.bin" --timeout 20 --wait-for-file 60
        if wait_line /tmp/c1.out "waiting up to" 30; then
            sleep 3
            kill -KILL "$cpid"
            wait "$cpid" 2>/dev/null
            finish "$job" >/tmp/s1.out 2>&1
            why=$(check_error $? /tmp/s1.out "client .*Start: the client \(disconnected\|stopped answering\)\|client .*heartbeat")
            [ -z "$why" ] && [ -n "$(remote_names /tmp/k1)" ] && why="files on the server: $(remote_names /tmp/k1)"
        else
            why="the client never waited: $(tr '\n' ' ' </tmp/c1.out)"
            kill -KILL "$cpid" 2>/dev/null
            pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
        fi
        if [ -z "$why" ]; then ok "$name" && said /tmp/s1.out; else bad "$name" "$why"; fi
    else
        bad "$name" "server did not start"
    fi

    name="1. client SIGKILLed mid-transfer: no file, no temp file, the server serves the next client"
    next_port
    fresh_dir /tmp/k1
    if job=$(fx_listen /tmp/k1 --count 2 --timeout 60); then
        fx_send_bg /tmp/c1.out "$SRC/big.bin" --timeout 20
        if wait_receiving "$job"; then
            kill -KILL "$cpid"
            wait "$cpid" 2>/dev/null
            if ! wait_job_lines "$job" "^error: client" 1 60; then
                why="the server reported no failed client: $(pinpoll-peer-log 1 "$job" 2>&1 | tail -3 | tr '\n' ' ')"
            elif ! mid_transfer "$job"; then
                why="big.bin was complete before the kill: not mid-transfer"
            elif [ -n "$(remote_names /tmp/k1)" ]; then
                why="left on the server: $(remote_names /tmp/k1)"
            else
                why=$(send_and_compare /tmp/k1 "$SRC/small.bin" 20)
            fi
            finish "$job" >/tmp/s1.out 2>&1
            rc=$?
            [ -z "$why" ] && why=$(check_error "$rc" /tmp/s1.out "client .*receiving big.bin.*the client \(disconnected\|stopped answering\)")
            [ -z "$why" ] && [ "$(remote_names /tmp/k1)" != small.bin ] && why="on the server: $(remote_names /tmp/k1), expected small.bin"
        else
            why="the transfer never started: $(tr '\n' ' ' </tmp/c1.out)"
            kill -KILL "$cpid" 2>/dev/null
            pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
        fi
        if [ -z "$why" ]; then ok "$name" && said /tmp/s1.out; else bad "$name" "$why"; fi
    else
        bad "$name" "server did not start"
    fi
}

# 1 and 2. The server SIGKILLed mid-transfer, then restarted on the same
# port. A killed server cannot remove its temp file (.filexfer-PID-N.tmp)
# and nothing may appear under the final name; the restarted server finds
# the orphan (its lock is gone with its process) and removes it.
case_2() {
    local name job why='' rc
    make_src big.bin "$BIG_MIB"
    name="1. server SIGKILLed mid-transfer: the client ends with one clear error, no file under the final name"
    next_port
    fresh_dir /tmp/k2
    if ! job=$(fx_listen /tmp/k2 --count 1 --timeout 60); then
        bad "$name" "server did not start"
        bad "2. server restarted on the same port: a new transfer arrives identical" "not run: the first server did not start"
        return
    fi
    fx_send_bg /tmp/c2.out "$SRC/big.bin" --timeout 20
    if wait_receiving "$job"; then
        pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
        wait_bounded "$cpid" 60
        why=$(check_error $? /tmp/c2.out "the server \(disconnected\|stopped answering\|sent nothing\)")
        [ -z "$why" ] && ! mid_transfer "$job" && why="big.bin was complete before the kill: not mid-transfer"
        [ -z "$why" ] && [[ " $(remote_names /tmp/k2) " == *" big.bin "* ]] && why="big.bin exists on the server"
    else
        why="the transfer never started: $(tr '\n' ' ' </tmp/c2.out)"
        kill -KILL "$cpid" 2>/dev/null
        pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
    fi
    if [ -z "$why" ]; then ok "$name" && said /tmp/c2.out; else bad "$name" "$why"; fi
    echo "     left by the killed server: $(remote_names /tmp/k2)"

    name="2. server restarted on the same port: it removes the dead server's temp file, and a new transfer arrives identical"
    if job=$(fx_listen /tmp/k2 --count 1 --timeout 60); then
        why=$(send_and_compare /tmp/k2 "$SRC/big.bin" 20)
        finish "$job" >/tmp/s2.out 2>&1
        rc=$?
        [ -z "$why" ] && [ "$rc" -ne 0 ] && why="server rc=$rc: $(tail -2 /tmp/s2.out | tr '\n' ' ')"
        [ -z "$why" ] && ! grep -q "removed 1 temporary file(s) left by a server that died: .filexfer-" /tmp/s2.out &&
            why="the restarted server did not report removing the orphan: $(head -3 /tmp/s2.out | tr '\n' ' ')"
        [ -z "$why" ] && [ "$(remote_names /tmp/k2)" != big.bin ] && why="on the server: $(remote_names /tmp/k2), expected big.bin alone"
        if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
    else
        bad "$name" "the server did not start again on port $port"
    fi
}

# The RNR counters of this guest's and guest 1's device: requester got an
# RNR NAK (rcvd_rnr_err), responder sent one (send_rnr_err), RNR retries
# ran out (retry_rnr_exceeded_err).
rnr_counters() {
    local cmd="cd /sys/class/infiniband/$DEV/ports/1/hw_counters && for c in rcvd_rnr_err send_rnr_err retry_rnr_exceeded_err; do printf '%s=%s ' \$c \$(cat \$c); done"
    echo "guest0: $(bash -c "$cmd" 2>&1) guest1: $(on1 "$cmd" 2>&1)"
}

# 4. The receiver stopped with SIGSTOP mid-transfer. Its kernel (rxe) still
# acknowledges the client's writes into the ring, and the client never has
# more chunks in flight than the server posted receives (credits), so the
# client meets no RNR: it waits for credits and its --timeout ends it.
case_4() {
    local name job spid why='' before after rc src
    make_src big.bin "$BIG_MIB"
    name="4. receiver SIGSTOPped mid-transfer: the client ends with a timeout or RNR error within --timeout"
    next_port
    fresh_dir /tmp/k4
    if job=$(fx_listen /tmp/k4 --count 1 --timeout 60); then
        spid=$(job_pid "$job")
        fx_send_bg /tmp/c4.out "$SRC/big.bin" --timeout 5
        if wait_receiving "$job"; then
            on1 "kill -STOP $spid"
            wait_bounded "$cpid" 60
            why=$(check_error $? /tmp/c4.out "within --timeout\|timed out\|RNR")
            on1 "kill -CONT $spid"
            finish "$job" >/dev/null 2>&1
            [ -z "$why" ] && [[ " $(remote_names /tmp/k4) " == *" big.bin "* ]] && why="big.bin exists on the server"
        else
            why="the transfer never started: $(tr '\n' ' ' </tmp/c4.out)"
            kill -KILL "$cpid" 2>/dev/null
            pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
        fi
        if [ -z "$why" ]; then ok "$name" && said /tmp/c4.out; else bad "$name" "$why"; fi
    else
        bad "$name" "server did not start"
    fi

    name="4. receiver SIGSTOPped 3 s (budget 30 s), then SIGCONT: the file arrives identical, no RNR counted"
    next_port
    fresh_dir /tmp/k4
    before=$(rnr_counters)
    if job=$(fx_listen /tmp/k4 --count 1 --timeout 60); then
        spid=$(job_pid "$job")
        fx_send_bg /tmp/c4.out "$SRC/big.bin" --timeout 30
        if wait_receiving "$job"; then
            on1 "kill -STOP $spid"
            mid_transfer "$job" || why="big.bin was complete before SIGSTOP: not mid-transfer"
            sleep 3
            on1 "kill -CONT $spid"
            wait_bounded "$cpid" 300
            rc=$?
            finish "$job" >/tmp/s4.out 2>&1
            src=$?
            after=$(rnr_counters)
            echo "     RNR counters before: $before"
            echo "     RNR counters after:  $after"
            if [ -n "$why" ]; then
                :
            elif [ "$rc" -ne 0 ] || [ "$src" -ne 0 ]; then
                why="client rc=$rc server rc=$src: $(tail -2 /tmp/c4.out | tr '\n' ' ') $(tail -2 /tmp/s4.out | tr '\n' ' ')"
            elif [ "$(remote_sha /tmp/k4/big.bin)" != "$(sha_of "$SRC/big.bin")" ]; then
                why="big.bin arrived different"
            elif [ "$before" != "$after" ]; then
                why="RNR counters changed"
            fi
        else
            why="the transfer never started: $(tr '\n' ' ' </tmp/c4.out)"
            kill -KILL "$cpid" 2>/dev/null
            on1 "kill -CONT $spid"
            pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
        fi
        if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
    else
        bad "$name" "server did not start"
    fi
}

# 12. More clients than --max-clients: the extra ones are refused with
# "server busy" while the accepted ones go on and arrive identical. The
# accepted two hold their slots idle (--wait-for-file) while the extra
# ones knock, then get their files: the check is the server's limit, not
# how the TCG guests cope with two streams and three connects at once.
case_12() {
    local name job why='' a b i extra=() rc
    make_src small.bin 4
    name="12. clients beyond --max-clients 2 are refused as busy; the accepted ones arrive identical"
    mkdir -p "$SRC/m12"
    rm -f "$SRC/m12/a.bin" "$SRC/m12/b.bin"
    next_port
    fresh_dir /tmp/k12
    # --count 3: busy refusals do not count, and the server must still be
    # accepting (not finishing) when the extra ones come.
    if ! job=$(fx_listen /tmp/k12 --max-clients 2 --count 3 --timeout 60); then
        bad "$name" "server did not start"
        return
    fi
    fx_send_bg /tmp/c12a.out "$SRC/m12/a.bin" --timeout 20 --wait-for-file 50
    a=$cpid
    fx_send_bg /tmp/c12b.out "$SRC/m12/b.bin" --timeout 20 --wait-for-file 50
    b=$cpid
    if wait_line /tmp/c12a.out "waiting up to" 30 && wait_line /tmp/c12b.out "waiting up to" 30; then
        for i in 1 2 3; do
            ln -f "$SRC/small.bin" "$SRC/m12/x$i.bin"
            fx_send_bg "/tmp/c12x$i.out" "$SRC/m12/x$i.bin" --timeout 20
            extra+=("$cpid")
        done
        for i in 1 2 3; do
            wait_bounded "${extra[$((i - 1))]}" 60
            rc=$?
            [ -z "$why" ] && why=$(check_error "$rc" "/tmp/c12x$i.out" "server busy")
        done
    else
        why="the first two clients did not both connect: $(tr '\n' ' ' </tmp/c12a.out) $(tr '\n' ' ' </tmp/c12b.out)"
    fi
    # Their files appear (hard links: complete at once); both go.
    ln -f "$SRC/small.bin" "$SRC/m12/a.bin"
    ln -f "$SRC/small.bin" "$SRC/m12/b.bin"
    wait_bounded "$a" 300
    rc=$?
    [ -z "$why" ] && [ "$rc" -ne 0 ] && why="a.bin: rc=$rc $(tail -2 /tmp/c12a.out | tr '\n' ' ')"
    wait_bounded "$b" 300
    rc=$?
    [ -z "$why" ] && [ "$rc" -ne 0 ] && why="b.bin: rc=$rc $(tail -2 /tmp/c12b.out | tr '\n' ' ')"
    # A slot is free again: the next client is accepted.
    ln -f "$SRC/small.bin" "$SRC/m12/c.bin"
    [ -z "$why" ] && why=$(send_and_compare /tmp/k12 "$SRC/m12/c.bin" 20)
    finish "$job" >/tmp/s12.out 2>&1
    rc=$?
    [ -z "$why" ] && [ "$rc" -ne 0 ] && why="server rc=$rc: $(tail -3 /tmp/s12.out | tr '\n' ' ')"
    [ -z "$why" ] && [ "$(grep -c 'refused, server busy' /tmp/s12.out)" -ne 3 ] && why="the server did not report 3 busy refusals: $(tr '\n' ' ' </tmp/s12.out)"
    [ -z "$why" ] && [ "$(remote_names /tmp/k12)" != "a.bin b.bin c.bin" ] && why="on the server: $(remote_names /tmp/k12)"
    for i in a b; do
        [ -z "$why" ] && [ "$(remote_sha "/tmp/k12/$i.bin")" != "$(sha_of "$SRC/small.bin")" ] && why="$i.bin arrived different"
    done
    [ -z "$why" ] && echo "     refused: $(grep -h '^error:' /tmp/c12x1.out)"
    if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
}

# Whether guest 1's device port is ACTIVE (waits up to 30 s).
wait_active() {
    local n
    for ((n = 0; n < 60; n++)); do
        on1 "rdma link show $DEV/1 2>/dev/null" | grep -q "state ACTIVE" && return 0
        sleep 0.5
    done
    return 1
}

# 6. Guest 1's RDMA device deleted (`rdma link delete`) mid-transfer: the
# server's connection ends with the device's event, the server — one
# without --count, which would otherwise serve on — exits with one error
# line, the client fails cleanly, and nothing of the server is left in
# the kernel's resource tables. rxe cannot revoke a process's hold on a
# device (no disassociate), so the delete itself completes only once the
# server has let go of it: a server that stayed up would block it. Then
# the link is re-created as scripts/softroce-vm does, so later cases have
# a device.
case_6() {
    local name job spid='' del why='' rc src left
    make_src big.bin "$BIG_MIB"
    name="6. rdma link delete on guest 1 mid-transfer: device error on the server, clean failure on the client, nothing left"
    next_port
    fresh_dir /tmp/k6
    if job=$(fx_listen /tmp/k6 --timeout 30); then
        spid=$(job_pid "$job")
        fx_send_bg /tmp/c6.out "$SRC/big.bin" --timeout 20
        if wait_receiving "$job"; then
            # In the background: deleting the device waits until every
            # process that has it open has let go of it.
            del=$(pinpoll-peer-bg 1 rdma link delete "$DEV")
            finish "$job" >/tmp/s6.out 2>&1
            src=$?
            timeout 60 pinpoll-peer-wait 1 "$del" >/tmp/d6.out 2>&1
            rc=$?
            wait_bounded "$cpid" 90
            why=$(check_error $? /tmp/c6.out "the server \(disconnected\|stopped answering\|sent nothing\)")
            [ -z "$why" ] && [ "$rc" -ne 0 ] && why="rdma link delete failed (rc=$rc): $(tr '\n' ' ' </tmp/d6.out)"
            [ -z "$why" ] && why=$(check_error "$src" /tmp/s6.out "reported \(RDMA_CM_EVENT_DEVICE_REMOVAL\|DEVICE_FATAL\|PORT_ERR\): the port or device failed")
            [ -z "$why" ] && ! grep -q "^stopping: RDMA device $DEV reported" /tmp/s6.out && why="the server did not say it stops for the device: $(tr '\n' ' ' </tmp/s6.out)"
            [ -z "$why" ] && grep -q "panicked" /tmp/s6.out && why="the server panicked: $(tr '\n' ' ' </tmp/s6.out)"
            [ -z "$why" ] && echo "     server: $(grep '^error:' /tmp/s6.out)" && echo "     client: $(grep '^error:' /tmp/c6.out)"
            [ -z "$why" ] && [[ " $(remote_names /tmp/k6) " == *" big.bin "* ]] && why="big.bin exists on the server"
            [ -z "$why" ] && on1 "kill -0 $spid" 2>/dev/null && why="the server (pid $spid) still runs"
        else
            why="the transfer never started: $(tr '\n' ' ' </tmp/c6.out)"
            kill -KILL "$cpid" 2>/dev/null
            pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
        fi
    else
        why="server did not start"
    fi
    # Back to a working device, as scripts/softroce-vm makes it.
    on1 "rdma link show $DEV/1 >/dev/null 2>&1 || rdma link add $DEV type rxe netdev \$PINPOLL_NETDEV" >/dev/null 2>&1
    if ! wait_active; then
        [ -z "$why" ] && why="$DEV on guest 1 is not ACTIVE again after rdma link add: $(on1 "rdma link show" 2>&1 | tr '\n' ' ')"
    fi
    # Resources are tagged with the owning process; none may remain.
    left=$(on1 "rdma resource show qp; rdma resource show cq; rdma resource show mr; rdma resource show pd; rdma resource show cm_id" 2>&1 | grep -E "pid $spid |comm filexfer")
    [ -z "$why" ] && [ -n "$left" ] && why="resources left of the server: $(tr '\n' ' ' <<<"$left")"
    echo "     guest 1 after: $(on1 "rdma link show; rdma resource show" 2>&1 | tr '\n' ' ')"
    if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi

    name="6. after rdma link add the device serves again: a transfer arrives identical"
    next_port
    fresh_dir /tmp/k6
    make_src small.bin 4
    if job=$(fx_listen /tmp/k6 --count 1 --timeout 30); then
        why=$(send_and_compare /tmp/k6 "$SRC/small.bin" 20)
        finish "$job" >/dev/null 2>&1
        if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
    else
        bad "$name" "server did not start"
    fi
}

# 13. Load: 8 clients at once, each sending 32 files of 4 MiB (1 GiB in
# all) to one server. Every file is checked by SHA-256 on guest 1 as soon
# as it is under its final name (filexfer puts it there only verified and
# fsynced), then removed, so guest 1's tmpfs never holds 1 GiB. The
# server's peak RSS (VmHWM) is sampled meanwhile.
#
# Memory bound: a native transfer registers its rings — send, target and
# READ rings of SLOTS (16) x SLOT_SIZE (256 KiB) = 4 MiB each, and a receive
# ring of 2 x SLOTS slots = 8 MiB: 20 MiB (EngineConfig::registered_bytes
# of filexfer::engine_config) — and pinned memory is resident. At most
# --max-clients (8) transfers run at once: 160 MiB, plus 64 MiB for the
# program, its threads' stacks and the allocator. 224 MiB in all, whatever
# the number of files: 256 files leaking one ring set each would be 5 GiB.
#
# rxe limitation: with the production ACK timeout (QP timeout 14, ~67 ms)
# the TCG guests' stalls under this load make rxe retransmit spuriously,
# and Linux 6.1's rxe does not always handle a retried multi-packet
# WRITE_WITH_IMM correctly: the receiver sees a chunk twice ("chunk for
# slot 1, expected slot 2", caught by the server's checks) or a
# REM_INV_REQ_ERR. Either ends that transfer with an error — nothing bad
# is ever stored — but it is rxe's doing, so both sides run with
# `--profile softroce` (ACK timeout ~0.5 s), as a SoftRoCE deployment
# should, and rxe's retry counters are printed.
LOAD_CLIENTS=8 LOAD_FILES=32 LOAD_MIB=4
rxe_counters() { # this guest's and guest 1's loss and retry counters
    local cmd="cd /sys/class/infiniband/$DEV/ports/1/hw_counters && for c in send_err out_of_seq_request duplicate_request rcvd_seq_err completer_retry_err retry_exceeded_err; do printf '%s=%s ' \$c \$(cat \$c); done"
    echo "guest0: $(bash -c "$cmd" 2>&1) guest1: $(on1 "$cmd" 2>&1)"
}
LOAD_RSS_LIMIT_KB=$(((20 * LOAD_CLIENTS + 64) * 1024))
case_13() {
    local name job spid chk why='' c i rc t0 secs total bad_sends=0 pids=() lines hwm mismatches
    name="13. load: $LOAD_CLIENTS clients x $LOAD_FILES files x $LOAD_MIB MiB at once, every file identical, server memory bounded"
    mkdir -p "$SRC/load"
    declare -A want
    # 32 different files from one random block (urandom is slow under
    # TCG): each starts with its own 16-byte header.
    make_src load/base.bin "$LOAD_MIB"
    for ((i = 0; i < LOAD_FILES; i++)); do
        { printf '%-16s' "file $i"; head -c $((LOAD_MIB * 1024 * 1024 - 16)) "$SRC/load/base.bin"; } >"$SRC/load/f$i.bin"
        want[$i]=$(sha_of "$SRC/load/f$i.bin")
    done
    for ((c = 0; c < LOAD_CLIENTS; c++)); do
        mkdir -p "$SRC/load/c$c"
        for ((i = 0; i < LOAD_FILES; i++)); do ln -f "$SRC/load/f$i.bin" "$SRC/load/c$c/c$c-f$i.bin"; done
    done
    next_port
    fresh_dir /tmp/k13
    on1 "rm -f /tmp/k13.done" >/dev/null 2>&1
    if ! job=$(fx_listen /tmp/k13 --max-clients "$LOAD_CLIENTS" --count $((LOAD_CLIENTS * LOAD_FILES)) --timeout 60 --profile softroce); then
        bad "$name" "server did not start"
        return
    fi
    spid=$(job_pid "$job")
    echo "     rxe before: $(rxe_counters)"
    # The checker on guest 1: hashes and removes every file that is in
    # place, and samples the server's VmHWM, until told to stop.
    chk=$(pinpoll-peer-bg 1 bash -c '
        cd /tmp/k13 || exit 1
        while :; do
            stop=0; [ -e /tmp/k13.done ] && stop=1
            grep -s "^VmHWM" /proc/'"$spid"'/status | tr -s " " | sed "s/^/hwm /"
            for f in c*.bin; do
                [ -e "$f" ] || continue
                echo "file $f $(sha256sum <"$f" | cut -d" " -f1)"
                rm -f "$f"
            done
            [ "$stop" = 1 ] && break
            sleep 0.5
        done')
    t0=$SECONDS
    for ((c = 0; c < LOAD_CLIENTS; c++)); do
        (
            for ((i = 0; i < LOAD_FILES; i++)); do
                "$BIN/filexfer" send "$PEER4" "$SRC/load/c$c/c$c-f$i.bin" --port "$port" --timeout 60 --profile softroce -q ||
                    echo "FAILED c$c-f$i.bin (rc=$?)"
            done
        ) >"/tmp/c13-$c.out" 2>&1 &
        pids+=($!)
    done
    for c in "${pids[@]}"; do
        wait_bounded "$c" 900 || bad_sends=$((bad_sends + 1))
    done
    secs=$((SECONDS - t0))
    finish "$job" >/tmp/s13.out 2>&1
    rc=$?
    echo "     rxe after:  $(rxe_counters)"
    on1 "touch /tmp/k13.done" >/dev/null 2>&1
    timeout 120 pinpoll-peer-wait 1 "$chk" >/tmp/k13.sums 2>&1 || pinpoll-peer-kill 1 "$chk" KILL >/dev/null 2>&1
    total=$((LOAD_CLIENTS * LOAD_FILES * LOAD_MIB))
    hwm=$(awk '$1 == "hwm" { v = $3 } END { print v + 0 }' /tmp/k13.sums)
    lines=$(grep -c '^file ' /tmp/k13.sums)
    mismatches=0
    while read -r _ f sum; do
        i=${f#*-f} i=${i%.bin}
        [ "$sum" = "${want[$i]:-}" ] || mismatches=$((mismatches + 1))
    done < <(grep '^file ' /tmp/k13.sums)
    echo "     load: $total MiB in $secs s ($(awk -v m="$total" -v s="$secs" 'BEGIN { printf "%.1f", (s > 0 ? m / s : 0) }') MiB/s), $lines files checked; server peak RSS (VmHWM) $((hwm / 1024)) MiB, limit $((LOAD_RSS_LIMIT_KB / 1024)) MiB"
    if [ -n "$why" ]; then
        :
    elif [ "$bad_sends" -ne 0 ] || grep -q . /tmp/c13-*.out; then
        why="client errors: $(cat /tmp/c13-*.out | head -5 | tr '\n' ' ')"
    elif [ "$rc" -ne 0 ] || grep -q '^error:' /tmp/s13.out; then
        why="server rc=$rc: $(grep '^error:' /tmp/s13.out | head -3 | tr '\n' ' ')"
    elif [ "$lines" -ne $((LOAD_CLIENTS * LOAD_FILES)) ] || [ "$mismatches" -ne 0 ]; then
        why="$lines files arrived of $((LOAD_CLIENTS * LOAD_FILES)), $mismatches differ from what was sent"
    elif [ "$hwm" -le 0 ]; then
        why="the server's VmHWM was never read"
    elif [ "$hwm" -gt "$LOAD_RSS_LIMIT_KB" ]; then
        why="server peak RSS $hwm kB is above the limit of $LOAD_RSS_LIMIT_KB kB"
    fi
    if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
    rm -rf "$SRC/load"
}

for c in 0 3 5 fx 1 2 4 12 6 13; do
    selected "$c" || continue
    t=$SECONDS
    "case_$c"
    echo "     (case $c: $((SECONDS - t)) s)"
done

echo
only=
[ "$ONLY" = "  " ] || only=" (only cases:$ONLY)"
echo "faults: $passed passed, $failed failed in $((SECONDS - SUITE_T0)) s$only"
[ "$failed" -eq 0 ]
