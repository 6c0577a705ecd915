# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034 # port job spid cpid come from steps.sh; the suite reads why
# scripts/fault/cases.sh — the fault cases, one function each, named by
# what they prove; built from scripts/fault/steps.sh. The table that
# orders them is FAULT_CASES in scripts/fault-suite.sh. Each case sets
# $why (empty: passed); the suite gives the verdict.

SMALL_MIB=4 # a file that is sent whole
BIG_MIB=64  # long enough to be hit mid-transfer (~10 s in the TCG guests)
LOSSY_MIB=8 # ~8200 packets of 1 KiB: at 1 % loss, none lost has odds e^-80
HEAVY_LOSSY_MIB=2 # at 10 % loss, ~200 of ~2050 packets lost

# A 3000-byte message with a checkable structure.
MESSAGE=$(for i in $(seq 1 100); do printf 'line %03d of the fault suite...\n' "$i"; done | tr '\n' '|' | cut -c1-3000)

# ---------------------------------------------------------------- the link
# Messages cross the link both ways, over IPv4 and IPv6 (no fault).
messages_cross_the_link() {
    local fam peer out rc
    why=''
    for fam in 4 6; do
        peer=$PEER4
        [ "$fam" = 6 ] && peer=$PEER6
        listen basic server --count 1 || { fail_if "IPv$fam: server did not start"; continue; }
        out=$(timeout 120 "$BIN/basic" client "$peer" --port "$port" 2>&1)
        rc=$?
        finish >/tmp/server.out 2>&1
        if [ "$rc" -ne 0 ] || ! grep -q "message from server pid" <<<"$out" || ! grep -q "message from client pid" /tmp/server.out; then
            fail_if "IPv$fam: rc=$rc $out $(tail -2 /tmp/server.out)"
            note "IPv$fam neighbours: $(ip -"$fam" neigh show dev "$NETDEV" | tr '\n' ';')"
        fi
    done
}

# A file of BIG_MIB crosses the link and arrives identical (no fault).
file_arrives_identical() {
    make_src big.bin "$BIG_MIB"
    why=''
    fx_listen /tmp/kf --count 1 --timeout 60 || { why="server did not start"; return; }
    why=$(send_and_compare /tmp/kf "$SRC/big.bin" 60)
    finish >/dev/null 2>&1 || fail_if "the server failed"
}

# ---------------------------------------------------------------- netem
# Every packet of guest 0 delayed 50 ms: an RDMA WRITE still arrives byte
# for byte (the fault seen: the packets went through the netem qdisc).
delay_is_tolerated() {
    local out rc
    why=''
    listen readwrite server --count 1 --timeout 60 || { why="server did not start"; return; }
    inject netem delay 50ms
    with_counters 0 0 write_message
    netem
    finish >/tmp/server.out 2>&1 || fail_if "server failed: $(tail -2 /tmp/server.out)"
    [ "$rc" -eq 0 ] || fail_if "client rc=$rc: $out"
    grep -qF -- "$MESSAGE" /tmp/server.out || fail_if "the server printed something else: $(tail -3 /tmp/server.out)"
}

write_message() { # sets out and rc of delay_is_tolerated
    out=$(timeout 120 "$BIN/readwrite" client write "$PEER4" --port "$port" --timeout 60 --message "$MESSAGE" 2>&1)
    rc=$?
}

# Guest 0's packets under NETEM (a loss, perhaps with a delay): packets
# are lost, rxe retransmits them, and a file of MIB sent with SEND-ARGS
# arrives identical.
lossy_file_arrives() { # "NETEM" MIB [SEND-ARGS...]
    local compared faults=$1
    rm -f "$SRC/lossy.bin"
    make_src lossy.bin "$2"
    shift 2
    why=''
    fx_listen /tmp/kl --count 1 --timeout 60 || { why="server did not start"; return; }
    # shellcheck disable=SC2086 # NETEM is words
    inject netem $faults
    with_counters 1 1 send_lossy "$@"
    netem
    finish >/tmp/server.out 2>&1 || fail_if "the server failed: $(tail -2 /tmp/server.out | tr '\n' ' ')"
    fail_if "$compared"
}
send_lossy() { compared=$(send_and_compare /tmp/kl "$SRC/lossy.bin" 60 "$@"); }
loss_1pct_is_retransmitted() { lossy_file_arrives "loss 1%" "$LOSSY_MIB"; }
loss_10pct_is_retransmitted() { lossy_file_arrives "loss 10%" "$HEAVY_LOSSY_MIB"; }

# One file striped across 4 queue pairs (--streams 4) under a 20 ms delay
# and 1 % loss: every stream loses packets at its own places and rxe
# retransmits them within its queue pair (a long, lossy path), yet the
# server reassembles the stripes into the file that was sent.
streams_survive_delay_and_loss() { lossy_file_arrives "delay 20ms loss 1%" "$LOSSY_MIB" --streams 4; }

# Every packet lost while a client connects (the peer's address was just
# resolved, so the loss hits the connection request): the client ends
# with the one error its connection deadline gives — "timed out after
# ...s waiting for rdma_connect" — within --timeout's budget. A watchdog
# kills it at budget + margin; the case fails if it fired.
TOTAL_LOSS_TIMEOUT=5 WATCHDOG_MARGIN=30
total_loss_fails_within_budget() {
    local rc budget ping=ping
    why=''
    listen basic server --count 1 --timeout 60 || { why="server did not start"; return; }
    # Address and route resolution share one --timeout, connection set-up
    # has another: the budget is two of them.
    budget=$((2 * TOTAL_LOSS_TIMEOUT))
    command -v ping >/dev/null || ping="busybox ping"
    $ping -c 1 -W 5 -I "$NETDEV" "$PEER4" >/dev/null 2>&1 || fail_if "the peer does not answer ping before the loss"
    inject netem loss 100%
    with_counters 1 0 connect_lost
    netem
    pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
    [ "$rc" -ne 137 ] || fail_if "the watchdog killed the client after $((budget + WATCHDOG_MARGIN)) s: its own deadline did not end it"
    fail_if "$(check_error "$rc" /tmp/client.out "$TOTAL_LOSS_ERROR")"
    [ -n "$why" ] || said /tmp/client.out
}

connect_lost() { # under the watchdog; sets rc
    timeout -s KILL $((budget + WATCHDOG_MARGIN)) "$BIN/basic" client "$PEER4" --port "$port" --timeout "$TOTAL_LOSS_TIMEOUT" >/tmp/client.out 2>&1
    rc=$?
}

# ---------------------------------------------------------------- a slow client
# A client slowed by a 200 ms delay on every packet of guest 0 is ended
# by the server's --min-rate once a 10 s window has passed: the client
# fails with the one error that names the bound, the server reports the
# failed transfer, and nothing — no file, no temp file — is left.
#
# Why these figures: rxe lets a queue pair have at most 128 packets (of
# 1 KiB at its MTU of 1024) unacknowledged, so under a 200 ms round trip
# one stream carries at most ~650 KB/s, a third of MIN_RATE; undelayed,
# the guests' link carries ~5 MB/s (BIG_MIB in 12-15 s), more than twice
# MIN_RATE. Delayed, SLOW_MIB lasts well past the 10 s window, so the
# rate is measured; undelayed it ends within a few seconds, before any
# window (the disarmed run succeeds). The softroce profile on both sides
# (ACK timeout ~0.5 s, above the round trip) keeps rxe from retransmitting
# every packet the delay holds past the default ~67 ms.
SLOW_MIB=16 SLOW_DELAY=200ms MIN_RATE=2000000
slow_client_is_cut_by_min_rate() {
    local rc server_rc
    make_src slow.bin "$SLOW_MIB"
    why=''
    fx_listen /tmp/kr --count 1 --timeout 60 --min-rate "$MIN_RATE" --profile softroce || { why="server did not start"; return; }
    inject netem delay "$SLOW_DELAY"
    with_counters 0 0 send_slowly
    netem
    finish >/tmp/server.out 2>&1
    server_rc=$?
    fail_if "$(check_error "$rc" /tmp/client.out "fell below --min-rate")"
    fail_if "$(check_error "$server_rc" /tmp/server.out "client .*slow.bin.*fell below --min-rate")"
    [ -z "$(remote_names /tmp/kr)" ] || fail_if "left on the server: $(remote_names /tmp/kr)"
    # Its error, or (undelayed) the rate it had: "sent slow.bin: ... MiB/s".
    note "client: $(tail -1 /tmp/client.out)"
    [ -n "$why" ] || note "server: $(grep '^error:' /tmp/server.out)"
}
send_slowly() { # sets rc of slow_client_is_cut_by_min_rate
    timeout 300 "$BIN/filexfer" send "$PEER4" "$SRC/slow.bin" --port "$port" --timeout 30 --profile softroce >/tmp/client.out 2>&1
    rc=$?
}

# ---------------------------------------------------------------- no peer
# No server at that port on a live host: refused at once, one error line.
no_server_is_refused() {
    local rc
    why=''
    next_port
    armed || listen basic server --count 1 # disarmed: there is a server
    # 15 s, not 5: the case is about the refusal, and on a loaded host
    # (two TCG guests and more on two cores) resolving the peer's address
    # alone once took 4.7 s of a 5 s budget, so the client timed out
    # before it could be refused.
    timeout 120 "$BIN/basic" client "$PEER4" --port "$port" --timeout 15 >/tmp/client.out 2>&1
    rc=$?
    armed || finish >/dev/null 2>&1
    why=$(check_error "$rc" /tmp/client.out "rejected\|refused")
    [ -n "$why" ] || said /tmp/client.out
}

# No host at the address: a bounded error, one line.
no_host_fails_within_budget() {
    local rc addr=169.254.0.99
    why=''
    next_port
    armed || { listen basic server --count 1 && addr=$PEER4; } # disarmed: a host and a server
    timeout -s KILL $((2 * 5 + WATCHDOG_MARGIN)) "$BIN/basic" client "$addr" --port "$port" --timeout 5 >/tmp/client.out 2>&1
    rc=$?
    armed || finish >/dev/null 2>&1
    why=$(check_error "$rc" /tmp/client.out "unreachable\|timed out\|resolv\|did not answer")
    [ -n "$why" ] || said /tmp/client.out
}

# ---------------------------------------------------------------- killed peers
# A fault that hits a transfer of BIG_MIB while the server receives it
# (with SMALL_MIB at hand for a transfer afterwards).
hit_mid_transfer() { # DIR "SERVER-ARGS" "CLIENT-ARGS" FAULT
    make_src big.bin "$BIG_MIB"
    make_src small.bin "$SMALL_MIB"
    hit_transfer "$1" "$2" "$SRC/big.bin" "$3" receiving "$4"
}
# A process that dies has its rdma_cm ids destroyed by its kernel, which
# sends a DREQ: the survivor sees the disconnect at once (a dead host
# would be found by the heartbeats). "Idle": the client is connected and
# waits for its file (--wait-for-file); only heartbeats cross the link.

server_killed_while_idle() {
    rm -f "$SRC/idle.bin"
    hit_transfer /tmp/k1 "--count 1 --timeout 60" "$SRC/idle.bin" "--timeout 20 --wait-for-file 60" waiting_idle kill_idle_server
}
kill_idle_server() {
    sleep 3 # idle: heartbeats only
    inject pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
    wait_bounded "$cpid" 60
    why=$(check_error $? /tmp/client.out "idle.bin to appear: .*\(server disconnected\|heartbeat\|stopped answering\)")
    [ -z "$(remote_names /tmp/k1)" ] || fail_if "files on the server: $(remote_names /tmp/k1)"
    stop_all
    [ -n "$why" ] || said /tmp/client.out
}

client_killed_while_idle() {
    rm -f "$SRC/idle.bin"
    hit_transfer /tmp/k1 "--count 1 --timeout 60" "$SRC/idle.bin" "--timeout 20 --wait-for-file 60" waiting_idle kill_idle_client
}
kill_idle_client() {
    sleep 3
    inject kill -KILL "$cpid"
    wait_bounded "$cpid" 70 # disarmed: until its own --wait-for-file ends it
    local client_rc=$?
    finish >/tmp/server.out 2>&1
    why=$(check_error $? /tmp/server.out "client .*Start: the client \(disconnected\|stopped answering\)\|client .*heartbeat")
    # The fault seen: the client died of the SIGKILL, it did not end itself.
    [ "$client_rc" -eq 137 ] || fail_if "the client was not killed: it ended with status $client_rc: $(tail -1 /tmp/client.out)"
    [ -z "$(remote_names /tmp/k1)" ] || fail_if "files on the server: $(remote_names /tmp/k1)"
    [ -n "$why" ] || said /tmp/server.out
}

# Mid-transfer: no file, no temp file, and the server serves the next client.
client_killed_mid_transfer() { hit_mid_transfer /tmp/k1 "--count 2 --timeout 60" "--timeout 20" kill_sending_client; }
kill_sending_client() {
    inject kill -KILL "$cpid"
    wait_bounded "$cpid" 300 # disarmed: until the transfer ends
    if ! wait_job_lines "^error: client" 60; then
        why="the server reported no failed client: $(pinpoll-peer-log 1 "$job" 2>&1 | tail -3 | tr '\n' ' ')"
    elif ! mid_transfer; then
        why="big.bin was complete before the kill: not mid-transfer"
    elif [ -n "$(remote_names /tmp/k1)" ]; then
        why="left on the server: $(remote_names /tmp/k1)"
    else
        why=$(send_and_compare /tmp/k1 "$SRC/small.bin" 20)
    fi
    finish >/tmp/server.out 2>&1
    fail_if "$(check_error $? /tmp/server.out "client .*receiving big.bin.*the client \(disconnected\|stopped answering\)")"
    [ "$(remote_names /tmp/k1)" = small.bin ] || fail_if "on the server: $(remote_names /tmp/k1), expected small.bin"
    stop_all
    [ -n "$why" ] || said /tmp/server.out
}
# The client ends with one clear error; nothing under the final name.
server_killed_mid_transfer() { hit_mid_transfer /tmp/k2 "--count 1 --timeout 60" "--timeout 20" kill_receiving_server; }
kill_receiving_server() {
    inject pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
    wait_bounded "$cpid" 60
    # $why may hold the mid_transfer verdict already: add to it.
    fail_if "$(check_error $? /tmp/client.out "the server \(disconnected\|stopped answering\|sent nothing\)")"
    mid_transfer || fail_if "big.bin was complete before the kill: not mid-transfer"
    [[ " $(remote_names /tmp/k2) " != *" big.bin "* ]] || fail_if "big.bin exists on the server"
    stop_all
    [ -n "$why" ] || said /tmp/client.out
}

# A server killed mid-transfer cannot remove its temp file
# (.filexfer-PID-N.tmp); the next server on that directory finds the
# orphan (its lock died with its process), removes it, says so, and
# serves a new transfer.
restarted_server_removes_orphan() { hit_mid_transfer /tmp/k2 "--count 1 --timeout 60" "--timeout 20" restart_killed_server; }
restart_killed_server() {
    inject pinpoll-peer-kill 1 "$job" KILL >/dev/null 2>&1
    wait_bounded "$cpid" 60
    note "left by the first server: $(remote_names /tmp/k2)"
    if ! listen filexfer serve --dir /tmp/k2 --count 1 --timeout 60; then
        why="the server did not start again"
        return
    fi
    why=$(send_and_compare /tmp/k2 "$SRC/small.bin" 20)
    finish >/tmp/server.out 2>&1 || fail_if "server: $(tail -2 /tmp/server.out | tr '\n' ' ')"
    grep -q "removed 1 temporary file(s) left by a server that died: .filexfer-" /tmp/server.out ||
        fail_if "the restarted server did not report removing the orphan: $(head -3 /tmp/server.out | tr '\n' ' ')"
    [ "$(remote_names /tmp/k2)" = small.bin ] || fail_if "on the server: $(remote_names /tmp/k2), expected small.bin alone"
    [ -n "$why" ] || note "$(grep 'removed 1 temporary' /tmp/server.out)"
}

# ---------------------------------------------------------------- a stopped receiver
# The receiver SIGSTOPped mid-transfer: its kernel (rxe) still
# acknowledges the client's writes into the ring, and the client never
# has more chunks in flight than the server posted receives (credits), so
# it meets no RNR: it waits for credits and its --timeout ends it.
# The client sends one chunk per STOP_TRICKLE_MS (a debug build's test
# hook), so BIG_MIB lasts ~13 s whatever the guests' speed: the stop
# lands with most of the file unsent. Unpaced, a fast run could reach
# the stop with no more than a ring's worth left: the stopped server's
# kernel took it all into the ring, the client timed out waiting for the
# verdict, and the resumed server rightly stored the whole file.
STOP_TRICKLE_MS=50
stopped_receiver_times_out() {
    PINPOLL_FILEXFER_TEST_TRICKLE_MS=$STOP_TRICKLE_MS \
        hit_mid_transfer /tmp/k4 "--count 1 --timeout 60" "--timeout 5" stop_receiver
}
stop_receiver() {
    local rc state
    inject on1 "kill -STOP $spid"
    state=$(on1 "sed -n 's/^State:\t//p' /proc/$spid/status")
    wait_bounded "$cpid" 60
    rc=$?
    # The fault seen first: the server stopped, and (its log is as it was
    # at the stop) not yet done with big.bin.
    [[ $state == T* ]] || why="the server was not stopped (state '$state')"
    mid_transfer || fail_if "big.bin was complete before SIGSTOP: not mid-transfer"
    fail_if "$(check_error "$rc" /tmp/client.out "within --timeout\|timed out\|RNR")"
    on1 "kill -CONT $spid"
    finish >/dev/null 2>&1
    [[ " $(remote_names /tmp/k4) " != *" big.bin "* ]] || fail_if "big.bin exists on the server"
    [ -n "$why" ] || said /tmp/client.out
}

# SIGSTOP for 3 s within a 30 s budget, then SIGCONT: the file arrives
# identical and no RNR was counted (the fault seen: the server was
# stopped mid-transfer, as its state in /proc said).
RNR_COUNTERS="rcvd_rnr_err send_rnr_err retry_rnr_exceeded_err"
stopped_receiver_resumes() {
    # Read before the transfer: once it runs, the stop must come at once.
    rnr_before=$(RXE_COUNTERS=$RNR_COUNTERS rxe_counters)
    hit_mid_transfer /tmp/k4 "--count 1 --timeout 60" "--timeout 30" pause_receiver
}
pause_receiver() {
    local before=$rnr_before after rc state
    inject on1 "kill -STOP $spid"
    state=$(on1 "sed -n 's/^State:\t//p' /proc/$spid/status")
    # The fault seen first: a server left running finishes big.bin meanwhile.
    [[ $state == T* ]] || why="the server was not stopped (state '$state')"
    mid_transfer || fail_if "big.bin was complete before SIGSTOP: not mid-transfer"
    sleep 3
    on1 "kill -CONT $spid"
    wait_bounded "$cpid" 300
    rc=$?
    finish >/tmp/server.out 2>&1 || fail_if "server: $(tail -2 /tmp/server.out | tr '\n' ' ')"
    after=$(RXE_COUNTERS=$RNR_COUNTERS rxe_counters)
    counter_growth "$before" "$after"
    note "server state while stopped: $state; RNR counters grew: $GROWTH"
    [ "$rc" -eq 0 ] || fail_if "client rc=$rc: $(tail -2 /tmp/client.out | tr '\n' ' ')"
    [ "$(remote_sha /tmp/k4/big.bin)" = "$(sha_of "$SRC/big.bin")" ] || fail_if "big.bin arrived different"
    [ "$before" = "$after" ] || fail_if "RNR counters changed"
}

# ---------------------------------------------------------------- too many clients
# More clients than --max-clients: the extra ones are refused with "server
# busy" while the accepted ones go on and arrive identical. The accepted
# two hold their slots idle (--wait-for-file) while the extra ones knock,
# then get their files: the check is the server's limit, not how the TCG
# guests cope with two streams and three connects at once.
extra_clients_refused_as_busy() {
    local a b i extra=() rc max=2
    make_src small.bin "$SMALL_MIB"
    armed || max=5 # disarmed: room for everyone
    mkdir -p "$SRC/m12"
    rm -f "$SRC/m12/a.bin" "$SRC/m12/b.bin"
    why=''
    # --count 3: busy refusals do not count, and the server must still be
    # accepting (not finishing) when the extra ones come.
    fx_listen /tmp/k12 --max-clients "$max" --count 3 --timeout 60 || { why="server did not start"; return; }
    fx_send_bg /tmp/c12a.out "$SRC/m12/a.bin" --timeout 20 --wait-for-file 50
    a=$cpid
    fx_send_bg /tmp/c12b.out "$SRC/m12/b.bin" --timeout 20 --wait-for-file 50
    b=$cpid
    if wait_line /tmp/c12a.out "waiting up to" 30 && wait_line /tmp/c12b.out "waiting up to" 30; then
        for i in 1 2 3; do
            appear "$SRC/small.bin" "$SRC/m12/x$i.bin"
            fx_send_bg "/tmp/c12x$i.out" "$SRC/m12/x$i.bin" --timeout 20
            extra+=("$cpid")
        done
        for i in 1 2 3; do
            wait_bounded "${extra[$((i - 1))]}" 60
            fail_if "$(check_error $? "/tmp/c12x$i.out" "server busy")"
        done
    else
        why="the first two clients did not both connect: $(tr '\n' ' ' </tmp/c12a.out) $(tr '\n' ' ' </tmp/c12b.out)"
    fi
    # Their files appear (renamed into place: complete at once); both go.
    # Each its own copy: a hard link to a file another sender holds open
    # would change that file's status-change time, which the sender takes
    # for a change under it.
    appear "$SRC/small.bin" "$SRC/m12/a.bin"
    appear "$SRC/small.bin" "$SRC/m12/b.bin"
    wait_bounded "$a" 300 || fail_if "a.bin: $(tail -2 /tmp/c12a.out | tr '\n' ' ')"
    wait_bounded "$b" 300 || fail_if "b.bin: $(tail -2 /tmp/c12b.out | tr '\n' ' ')"
    # A slot is free again: the next client is accepted.
    appear "$SRC/small.bin" "$SRC/m12/c.bin"
    fail_if "$(send_and_compare /tmp/k12 "$SRC/m12/c.bin" 20)"
    finish >/tmp/server.out 2>&1 || fail_if "server: $(tail -3 /tmp/server.out | tr '\n' ' ')"
    [ "$(grep -c 'refused, server busy' /tmp/server.out)" -eq 3 ] || fail_if "the server did not report 3 busy refusals: $(tr '\n' ' ' </tmp/server.out)"
    [ "$(remote_names /tmp/k12)" = "a.bin b.bin c.bin" ] || fail_if "on the server: $(remote_names /tmp/k12)"
    for i in a b; do
        [ "$(remote_sha "/tmp/k12/$i.bin")" = "$(sha_of "$SRC/small.bin")" ] || fail_if "$i.bin arrived different"
    done
    [ -n "$why" ] || note "refused: $(grep -h '^error:' /tmp/c12x1.out)"
}

# ---------------------------------------------------------------- a device deleted
# Guest 1's RDMA device deleted (`rdma link delete`) mid-transfer: the
# server's connection ends with the device's event, the server — one
# without --count, which would otherwise serve on — exits with one error
# line, the client fails cleanly, nothing of the server is left in the
# kernel's resource tables, and once the link is added again (as
# scripts/softroce-vm makes it) a transfer arrives identical. rxe cannot
# revoke a process's hold on a device (no disassociate), so the delete
# completes only once the server has let go of it.
device_deleted_mid_transfer() {
    hit_mid_transfer /tmp/k6 "--timeout 30" "--timeout 20" delete_device
    restore_device
}
delete_device() {
    local del src rc crc
    # The client is stopped first, as power-loss.sh does: a transfer that
    # finished before the delete (1 run in 5 on the TCG guests) would leave
    # the server nothing to notice. It resumes once the server has ended.
    kill -STOP "$cpid"
    mid_transfer || fail_if "big.bin was complete before the client was stopped: not mid-transfer"
    # In the background: deleting the device waits until every process
    # that has it open has let go of it.
    if armed; then del=$(pinpoll-peer-bg 1 rdma link delete "$DEV"); else note "disarmed: not running 'rdma link delete $DEV'"; fi
    finish >/tmp/server.out 2>&1
    src=$?
    if armed; then
        timeout 60 pinpoll-peer-wait 1 "$del" >/tmp/delete.out 2>&1
        rc=$?
    fi
    kill -CONT "$cpid"
    wait_bounded "$cpid" 90
    crc=$?
    # $why may hold the mid_transfer verdict already: it stays first.
    fail_if "$(check_error "$crc" /tmp/client.out "the server \(disconnected\|stopped answering\|sent nothing\)")"
    [ "${rc:-1}" -eq 0 ] || fail_if "rdma link delete failed (rc=${rc:-not run}): $(tr '\n' ' ' 2>/dev/null </tmp/delete.out)"
    fail_if "$(check_error "$src" /tmp/server.out "reported \(RDMA_CM_EVENT_DEVICE_REMOVAL\|DEVICE_FATAL\|PORT_ERR\): the port or device failed")"
    grep -q "^stopping: RDMA device $DEV reported" /tmp/server.out || fail_if "the server did not say it stops for the device: $(tr '\n' ' ' </tmp/server.out)"
    ! grep -q "panicked" /tmp/server.out || fail_if "the server panicked: $(tr '\n' ' ' </tmp/server.out)"
    [[ " $(remote_names /tmp/k6) " != *" big.bin "* ]] || fail_if "big.bin exists on the server"
    ! on1 "kill -0 $spid" 2>/dev/null || fail_if "the server (pid $spid) still runs"
    [ -n "$why" ] || { note "server: $(grep '^error:' /tmp/server.out)"; note "client: $(grep '^error:' /tmp/client.out)"; }
}
restore_device() {
    local left
    on1 "rdma link show $DEV/1 >/dev/null 2>&1 || rdma link add $DEV type rxe netdev \$PINPOLL_NETDEV" >/dev/null 2>&1
    wait_active || fail_if "$DEV on guest 1 is not ACTIVE again after rdma link add: $(on1 "rdma link show" 2>&1 | tr '\n' ' ')"
    # Resources are tagged with the owning process; none may remain.
    left=$(on1 "for r in qp cq mr pd cm_id; do rdma resource show \$r; done" 2>&1 | grep -E "pid ${spid:-none} |comm filexfer")
    [ -z "$left" ] || fail_if "resources left of the server: $(tr '\n' ' ' <<<"$left")"
    if fx_listen /tmp/k6 --count 1 --timeout 30; then
        fail_if "$(send_and_compare /tmp/k6 "$SRC/small.bin" 20)"
        finish >/dev/null 2>&1
    else
        fail_if "after rdma link add no server started"
    fi
}
wait_active() { # guest 1's device port ACTIVE (up to 30 s)
    local n
    for ((n = 0; n < 60; n++)); do
        on1 "rdma link show $DEV/1 2>/dev/null" | grep -q "state ACTIVE" && return 0
        sleep 0.5
    done
    return 1
}
