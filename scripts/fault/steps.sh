# shellcheck shell=bash
# scripts/fault/steps.sh — the steps the fault cases (scripts/fault/cases.sh)
# are made of. Sourced by scripts/fault-suite.sh inside
# `scripts/softroce-vm --hosts 2`: guest 0 (here) runs the clients, guest 1
# the servers (through pinpoll-peer*). Uses BIN, PEER4, PEER6, NETDEV, DEV,
# SRC and port from the suite.
#
# A case sets $why to what is wrong (empty: all is well) and ends with
# `verdict NAME`. Every `timeout` and bounded wait is a hang guard: what a
# case expects comes from the programs' own deadlines (--timeout,
# heartbeats, rdma_cm events), never from how long something took.

# shellcheck source=scripts/lib/wait.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/wait.sh"

passed=0 failed=0
verdict() { # NAME: pass unless $why says otherwise
    if [ -z "$why" ]; then
        passed=$((passed + 1))
        echo "ok   $1"
    else
        failed=$((failed + 1))
        echo "FAIL $1: $why"
    fi
}
fail_if() { [ -n "$why" ] || why=$1; } # WHY: the first failure wins
note() { echo "     $*"; }
said() { note "said: $(grep -m1 '^error:' "$1")"; } # FILE: its error line

# ---------------------------------------------------------------- faults
# FAULT_SUITE_DISARM=1 runs every case without its fault (no qdisc, no
# signal, no delete, ...): each fault case must then FAIL, which shows its
# checks see the fault rather than pass regardless.
armed() { [ "${FAULT_SUITE_DISARM:-0}" != 1 ]; }
inject() { # CMD...: the fault, unless disarmed
    if armed; then "$@"; else note "disarmed: not running '$*'"; fi
}

netem() { # ARGS... (none: remove the qdisc)
    tc qdisc del dev "$NETDEV" root 2>/dev/null
    if [ "$#" -gt 0 ]; then
        tc qdisc add dev "$NETDEV" root netem "$@"
    else
        # Heavy loss leaves the peer's neighbour entry FAILED: later
        # connects would time out resolving its address. Learn it anew.
        ip neigh flush dev "$NETDEV" 2>/dev/null
        true
    fi
}
# The netem qdisc's own counters on guest 0's link: "SENT DROPPED"
# packets (0 0 without a netem qdisc). Read before the qdisc is removed.
netem_counts() {
    tc -s qdisc show dev "$NETDEV" | awk '
        $1 == "qdisc" { netem = ($2 == "netem") }
        netem && $1 == "Sent" { pkts = $4; drops = $7; sub(",", "", drops) }
        END { print pkts + 0, drops + 0 }'
}

# rxe's counters on both guests (/sys/class/infiniband/rxe0/ports/1/
# hw_counters, what `rdma statistic show` prints): retransmissions by the
# requester (completer_retry_err: after an ACK timeout or a NAK),
# sequence-error NAKs it received (rcvd_seq_err), requests the responder
# saw twice (duplicate_request) or out of order (out_of_seq_request), and
# retries run out (retry_exceeded_err).
RXE_COUNTERS="completer_retry_err rcvd_seq_err duplicate_request out_of_seq_request retry_exceeded_err"
rxe_counters() { # -> "g0.NAME=V ... g1.NAME=V ..."
    local cmd="cd /sys/class/infiniband/$DEV/ports/1/hw_counters && for c in $RXE_COUNTERS; do printf '%s=%s ' \$c \$(cat \$c); done"
    { bash -c "$cmd" | sed 's/\([a-z_]*=\)/g0.\1/g'; on1 "$cmd" | sed 's/\([a-z_]*=\)/g1.\1/g'; } 2>/dev/null | tr '\n' ' '
}
# How much each counter grew between two rxe_counters readings: sets
# GROWTH to "g0.NAME +D ..." for the ones that did, and RETRANSMITS to
# the sum of both guests' completer_retry_err growth.
counter_growth() { # BEFORE AFTER
    local kv name d out='' b
    RETRANSMITS=0
    for kv in $2; do
        name=${kv%%=*}
        b=$(tr ' ' '\n' <<<"$1" | sed -n "s/^$name=//p")
        d=$((${kv#*=} - ${b:-0}))
        [ "$d" -eq 0 ] || out+="$name +$d "
        [[ $name == *.completer_retry_err ]] && RETRANSMITS=$((RETRANSMITS + d))
    done
    GROWTH=${out:-none grew}
}

# Runs CMD... with rxe's counters and the netem qdisc's counters recorded
# around it, prints them, and fails the case unless the netem fault was
# seen: a dropped packet (NEED_DROP=1) or at least packets that went
# through the netem qdisc, and with NEED_RETRANSMIT=1 a retransmission.
with_counters() { # NEED_DROP NEED_RETRANSMIT CMD...
    local need_drop=$1 need_retx=$2 before after pkts drops
    shift 2
    before=$(rxe_counters)
    "$@"
    read -r pkts drops < <(netem_counts)
    after=$(rxe_counters)
    counter_growth "$before" "$after"
    note "netem qdisc: $pkts packets sent, $drops dropped; rxe grew: $GROWTH"
    if [ $((pkts + drops)) -eq 0 ]; then
        fail_if "no packet went through a netem qdisc: the fault was not there"
    elif [ "$need_drop" = 1 ] && [ "$drops" -eq 0 ]; then
        fail_if "netem dropped no packet: the loss never happened"
    elif [ "$need_retx" = 1 ] && [ "$RETRANSMITS" -eq 0 ]; then
        fail_if "no retransmission counted (completer_retry_err): the loss was not recovered by retransmission"
    fi
}

# ---------------------------------------------------------------- guest 1
on1() { pinpoll-peer 1 bash -c "$1"; }          # a shell command on guest 1
job_pid() { cat "/run/pinpoll/jobs-1/$1.pid"; } # a job's pid on guest 1
fresh_dir() { on1 "rm -rf '$1' && mkdir -p '$1'" >/dev/null 2>&1; }
remote_names() { on1 "ls -A '$1'" 2>/dev/null | sort | tr '\n' ' ' | sed 's/ $//'; }
remote_sha() { on1 "sha256sum <'$1'" 2>/dev/null | cut -d' ' -f1; }
next_port() { port=$((port + 1)); }

# Starts PROGRAM ARGS... as a server on guest 1 on the next port and waits
# until it listens; sets $job (its job id) and $spid (its pid).
listen() { # PROGRAM ARGS...
    local n
    next_port
    job=$(pinpoll-peer-bg 1 "$BIN/$1" "${@:2}" --port "$port") || return 1
    for ((n = 0; n < 300; n++)); do
        if pinpoll-peer-log 1 "$job" 2>/dev/null | grep -q "listening on"; then
            spid=$(job_pid "$job")
            return 0
        fi
        sleep 0.1
    done
    echo "server on guest 1 never listened: $(pinpoll-peer-log 1 "$job" 2>&1 | tail -2)" >&2
    pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
    return 1
}
fx_listen() { fresh_dir "$1" && listen filexfer serve --dir "$@"; } # DIR ARGS...

# Waits (bounded) for the server job's end and prints its output; a
# server still running after 90 s is killed. The status is the server's
# own (124 only when the wait ran out).
finish() {
    local rc
    timeout 90 pinpoll-peer-wait 1 "$job"
    rc=$?
    [ "$rc" -eq 0 ] || pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
    return "$rc"
}
stop_all() { # after a case went wrong: nothing of it may linger
    [ -z "${cpid:-}" ] || kill -KILL "$cpid" 2>/dev/null
    [ -z "${spid:-}" ] || on1 "kill -CONT $spid" >/dev/null 2>&1
    [ -z "${job:-}" ] || pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
}

# ---------------------------------------------------------------- clients
# Starts `filexfer send FILE` here in the background (output in OUT); sets $cpid.
fx_send_bg() { # OUT FILE ARGS...
    local out=$1 file=$2
    shift 2
    "$BIN/filexfer" send "$PEER4" "$file" --port "$port" "$@" >"$out" 2>&1 &
    cpid=$!
}
# Sends FILE to the server and checks it arrived in DIR on guest 1 with
# the same SHA-256; prints what is wrong.
send_and_compare() { # DIR FILE TIMEOUT [ARGS...]
    local out rc got
    out=$(timeout 300 "$BIN/filexfer" send "$PEER4" "$2" --port "$port" --timeout "$3" -q "${@:4}" 2>&1)
    rc=$?
    got=$(remote_sha "$1/$(basename "$2")")
    if [ "$rc" -ne 0 ]; then
        echo "send of $(basename "$2") failed (rc=$rc): $out"
    elif [ "$got" != "$(sha_of "$2")" ]; then
        echo "$(basename "$2") arrived with sha256 ${got:-none}, sent $(sha_of "$2")"
    fi
}
appear() { cp "$1" "$2.part" && mv "$2.part" "$2"; } # SRC DST: a copy, complete at once
make_src() { # NAME MIB
    mkdir -p "$SRC"
    [ -s "$SRC/$1" ] || head -c "$(($2 * 1024 * 1024))" /dev/urandom >"$SRC/$1"
}

# Until the client of hit_transfer connected and waits for its file.
waiting_idle() { wait_line /tmp/client.out "waiting up to" 30; }
wait_job_lines() { # TEXT SECS: until the server job printed a line with TEXT
    # By the clock: each look at the log is a round trip to guest 1 that
    # takes far longer than the pause between looks under TCG.
    local until=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$until" ]; do
        pinpoll-peer-log 1 "$job" 2>&1 | grep -q -- "$1" && return 0
        sleep 0.1
    done
    return 1
}

# Until the server has been receiving a file for a second: the transfer
# is under way (BIG_MIB takes ~10 s in the TCG guests). Whether the fault
# then really hit mid-transfer is checked afterwards (mid_transfer).
receiving() { wait_job_lines ": receiving " 60 && sleep 1; }
mid_transfer() { ! pinpoll-peer-log 1 "$job" 2>&1 | grep -q ": received "; } # no file completed yet

# A failure as the programs must report it: status 1 (not a hang guard's
# 124), exactly one `error:` line, and that line matching PATTERN (grep).
# Prints what is wrong, nothing if all is well.
check_error() { # RC FILE PATTERN
    local lines
    lines=$(grep -c '^error:' "$2")
    if [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then
        echo "no end within the hang guard (its own deadline did not fire): $(tail -3 "$2" | tr '\n' ' ')"
    elif [ "$1" -ne 1 ]; then
        echo "exit status $1, expected 1: $(tail -3 "$2" | tr '\n' ' ')"
    elif [ "$lines" -ne 1 ]; then
        echo "$lines error lines, expected 1: $(tr '\n' ' ' <"$2")"
    elif ! grep '^error:' "$2" | grep -q -- "$3"; then
        echo "the error line does not match '$3': $(grep '^error:' "$2")"
    fi
}

# The shape of the cases that hit a transfer: a filexfer server on guest
# 1 (fresh DIR, SERVER-ARGS), a client here sending FILE (CLIENT-ARGS,
# output /tmp/client.out), and once WHEN (waiting_idle | receiving) holds,
# FAULT runs — a function that injects the fault, waits for the ends and
# sets $why. A transfer that never reached WHEN fails the case.
hit_transfer() { # DIR "SERVER-ARGS" FILE "CLIENT-ARGS" WHEN FAULT
    local dir=$1 server_args=$2 file=$3 client_args=$4 when=$5 fault=$6
    why='' job='' spid='' cpid=''
    # shellcheck disable=SC2086 # the argument lists are words
    if ! fx_listen "$dir" $server_args; then
        why="server did not start"
        return
    fi
    # shellcheck disable=SC2086
    fx_send_bg /tmp/client.out "$file" $client_args
    if "$when"; then
        "$fault"
    else
        why="the transfer never got there ($when): $(tr '\n' ' ' </tmp/client.out)"
        stop_all
    fi
}
