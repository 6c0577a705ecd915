# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034 # port spid come from steps.sh; the suite reads why
# scripts/fault/load.sh — many clients at once against one filexfer server
# on guest 1. Every file is hashed (SHA-256) on guest 1 as soon as it is
# under its final name (filexfer puts it there only verified and
# fsynced), then removed, so guest 1's tmpfs never holds it all; the
# server's peak RSS (VmHWM) is sampled meanwhile.

# The server's own report of a chunk it rejected: its `error: client ADDR:
# ...` line for that transfer, whose reason names the failed check — today
# "chunk N (bytes ..) failed its CRC32C check", "chunk for slot S, expected
# slot E", "chunk N has L bytes, expected W", "a chunk after all N declared
# bytes", or the whole file's "BLAKE3 digest does not match". Protocol v3's
# chaining-value check names its chunk too.
REJECTION_PATTERN='^error: client .*\(chunk\|digest\)'

# Runs CLIENTS clients each sending FILES files of MIB MiB at once, with
# PROFILE_ARGS on both sides; sets LOAD_STORED (files that arrived),
# LOAD_MISMATCHES (stored files whose hash differs from the source),
# LOAD_FAILED (sends that failed), LOAD_HWM (the server's peak RSS, kB),
# LOAD_SERVER_RC and leaves the outputs in /tmp/load-*.
run_load() { # CLIENTS FILES MIB PROFILE_ARGS
    local clients=$1 files=$2 mib=$3 profile=$4 chk c i t0 pids=() f sum
    declare -A want
    mkdir -p "$SRC/load"
    # Different files from one random block (urandom is slow under TCG):
    # each starts with its own 16-byte header.
    make_src load/base.bin "$mib"
    for ((i = 0; i < files; i++)); do
        { printf '%-16s' "file $i"; head -c $((mib * 1024 * 1024 - 16)) "$SRC/load/base.bin"; } >"$SRC/load/f$i.bin"
        want[$i]=$(sha_of "$SRC/load/f$i.bin")
    done
    for ((c = 0; c < clients; c++)); do
        mkdir -p "$SRC/load/c$c"
        for ((i = 0; i < files; i++)); do ln -f "$SRC/load/f$i.bin" "$SRC/load/c$c/c$c-f$i.bin"; done
    done
    on1 "rm -f /tmp/load.done" >/dev/null 2>&1
    # shellcheck disable=SC2086 # PROFILE_ARGS are words
    fx_listen /tmp/kload --max-clients "$clients" --count $((clients * files)) --timeout 60 $profile || return 1
    # The checker on guest 1: hashes and removes every file that is in
    # place, and samples the server's VmHWM, until told to stop.
    chk=$(pinpoll-peer-bg 1 bash -c "
        cd /tmp/kload || exit 1
        while :; do
            stop=0; [ -e /tmp/load.done ] && stop=1
            grep -s '^VmHWM' /proc/$spid/status | tr -s ' ' | sed 's/^/hwm /'
            for f in c*.bin; do
                [ -e \"\$f\" ] || continue
                echo \"file \$f \$(sha256sum <\"\$f\" | cut -d' ' -f1)\"
                rm -f \"\$f\"
            done
            [ \"\$stop\" = 1 ] && break
            sleep 0.5
        done")
    t0=$SECONDS
    for ((c = 0; c < clients; c++)); do
        (
            for ((j = 0; j < files; j++)); do
                # shellcheck disable=SC2086
                "$BIN/filexfer" send "$PEER4" "$SRC/load/c$c/c$c-f$j.bin" --port "$port" --timeout 60 $profile -q ||
                    echo "FAILED c$c-f$j.bin (rc=$?)"
            done
        ) >"/tmp/load-client$c.out" 2>&1 &
        pids+=($!)
    done
    for c in "${pids[@]}"; do wait_bounded "$c" 900 || echo "FAILED: a client hung" >>/tmp/load-client0.out; done
    LOAD_SECS=$((SECONDS - t0))
    finish >/tmp/load-server.out 2>&1
    LOAD_SERVER_RC=$?
    on1 "touch /tmp/load.done" >/dev/null 2>&1
    timeout 120 pinpoll-peer-wait 1 "$chk" >/tmp/load-sums 2>&1 || pinpoll-peer-kill 1 "$chk" KILL >/dev/null 2>&1
    LOAD_HWM=$(awk '$1 == "hwm" { v = $3 } END { print v + 0 }' /tmp/load-sums)
    LOAD_STORED=$(grep -c '^file ' /tmp/load-sums)
    LOAD_FAILED=$(cat /tmp/load-client*.out | grep -c '^FAILED')
    LOAD_MISMATCHES=0
    while read -r _ f sum; do
        i=${f#*-f} i=${i%.bin}
        [ "$sum" = "${want[$i]:-}" ] || LOAD_MISMATCHES=$((LOAD_MISMATCHES + 1))
    done < <(grep '^file ' /tmp/load-sums)
    rm -rf "$SRC/load"
}

# 8 clients x 16 files x 4 MiB (512 MiB) at once with `--profile softroce`:
# every file identical, the server's memory bounded.
#
# Memory bound: a native transfer registers its rings — send, target and
# READ rings of SLOTS (16) x SLOT_SIZE (256 KiB) = 4 MiB each, and a receive
# ring of 2 x SLOTS slots = 8 MiB: 20 MiB (EngineConfig::registered_bytes
# of filexfer::engine_config) — and pinned memory is resident; its verifier
# pool holds SLOTS chunk buffers per stream (or 2 per verifier thread, if
# more): 4 MiB for these single-stream clients. 24 MiB per transfer; at
# most --max-clients (8) run at once: 192 MiB, plus 64 MiB for the program,
# its threads' stacks and the allocator. 256 MiB in all, whatever the
# number of files: 128 transfers leaking one transfer's memory each would
# be 3 GiB.
#
# Why softroce: with the default ACK timeout (QP timeout 14, ~67 ms) the
# TCG guests' stalls make Linux 6.1's rxe retransmit spuriously, and it
# does not always handle a retried multi-packet WRITE_WITH_IMM correctly
# (bad_chunks_are_never_stored shows what the server does about that).
# A SoftRoCE deployment should run the softroce profile (ACK timeout
# ~0.5 s), and this case is about load, not rxe.
# 8 files a client (64 transfers, 8 waves of 8 at once): the peak is
# reached with the first 8 transfers, and 7 more waves show it stays
# there; 16 took 5 of the suite's 17 minutes, 32 took 10 of 27.
LOAD_CLIENTS=8 LOAD_FILES=8 LOAD_MIB=4
load_is_served_in_bounded_memory() {
    local total before after limit_kb=$(((24 * LOAD_CLIENTS + 64) * 1024))
    why=''
    before=$(rxe_counters)
    run_load "$LOAD_CLIENTS" "$LOAD_FILES" "$LOAD_MIB" "--profile softroce" || { why="server did not start"; return; }
    after=$(rxe_counters)
    total=$((LOAD_CLIENTS * LOAD_FILES * LOAD_MIB))
    note "load: $total MiB in $LOAD_SECS s, $LOAD_STORED files checked; server peak RSS (VmHWM) $((LOAD_HWM / 1024)) MiB, limit $((limit_kb / 1024)) MiB"
    counter_growth "$before" "$after"
    note "rxe grew: $GROWTH"
    [ "$LOAD_FAILED" -eq 0 ] || fail_if "client errors: $(cat /tmp/load-client*.out | head -5 | tr '\n' ' ')"
    { [ "$LOAD_SERVER_RC" -eq 0 ] && ! grep -q '^error:' /tmp/load-server.out; } ||
        fail_if "server rc=$LOAD_SERVER_RC: $(grep '^error:' /tmp/load-server.out | head -3 | tr '\n' ' ')"
    { [ "$LOAD_STORED" -eq $((LOAD_CLIENTS * LOAD_FILES)) ] && [ "$LOAD_MISMATCHES" -eq 0 ]; } ||
        fail_if "$LOAD_STORED files arrived of $((LOAD_CLIENTS * LOAD_FILES)), $LOAD_MISMATCHES differ from what was sent"
    [ "$LOAD_HWM" -gt 0 ] || fail_if "the server's VmHWM was never read"
    [ "$LOAD_HWM" -le "$limit_kb" ] || fail_if "server peak RSS $LOAD_HWM kB is above the limit of $limit_kb kB"
}

# The default profile on purpose, under 8 clients and 1 % loss: rxe
# retransmits (the fault seen), and whatever it then delivers wrong — a
# chunk twice, out of place, corrupt — the server's checks catch: every
# file that was stored has its source's hash, every other send failed, and
# the server's rejections are counted from its own error lines
# (REJECTION_PATTERN). Disarmed: the softroce profile and no loss.
# 2 MiB files: 4 MiB ones took 99 s of the suite for ~2 000 drops and
# ~1 400 retransmission timeouts; half of that still shows the fault.
BAD_CHUNK_CLIENTS=8 BAD_CHUNK_FILES=2 BAD_CHUNK_MIB=2
bad_chunks_are_never_stored() {
    local total before after pkts=0 drops=0 profile='' rejected others
    why=''
    total=$((BAD_CHUNK_CLIENTS * BAD_CHUNK_FILES))
    armed || profile="--profile softroce"
    before=$(rxe_counters)
    inject netem loss 1%
    run_load "$BAD_CHUNK_CLIENTS" "$BAD_CHUNK_FILES" "$BAD_CHUNK_MIB" "$profile" || { netem; why="server did not start"; return; }
    read -r pkts drops < <(netem_counts)
    netem
    after=$(rxe_counters)
    rejected=$(grep -c "$REJECTION_PATTERN" /tmp/load-server.out)
    others=$(($(grep -c '^error:' /tmp/load-server.out) - rejected))
    counter_growth "$before" "$after"
    note "netem qdisc: $pkts packets, $drops dropped; rxe grew: $GROWTH"
    note "$total sends: $LOAD_STORED stored, $LOAD_MISMATCHES of them different from their source; $LOAD_FAILED sends failed"
    note "server: $rejected transfers rejected by its chunk checks, $others other failed transfers"
    grep "$REJECTION_PATTERN" /tmp/load-server.out | sed 's/^error: client [^:]*:[0-9]*: /     rejected: /' | sort | uniq -c | head -5
    # Drops first: a stalling TCG guest can make rxe retransmit without any.
    [ "$drops" -gt 0 ] || fail_if "netem dropped no packet: the loss never happened"
    [ "$RETRANSMITS" -gt 0 ] || fail_if "rxe retransmitted nothing: the fault was not seen"
    [ "$LOAD_MISMATCHES" -eq 0 ] || fail_if "$LOAD_MISMATCHES stored files differ from their source: a bad chunk got through"
    [ $((LOAD_STORED + LOAD_FAILED)) -ge "$total" ] || fail_if "only $LOAD_STORED stored and $LOAD_FAILED failed of $total sends"
    [ "$LOAD_STORED" -gt 0 ] || fail_if "no file was stored: nothing to compare"
    ! grep -q panicked /tmp/load-server.out || fail_if "the server panicked"
}
