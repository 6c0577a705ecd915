#!/usr/bin/env bash
# scripts/power-loss.sh — filexfer's promise under a power cut.
#
#   scripts/power-loss.sh [BINDIR]      on the host (scripts/test.sh runs it)
#
# `filexfer send` says a file is complete only after the server fsynced the
# file and its directory. Proven here with a guest whose `--dir` is ext4 on
# a virtio-blk disk image (scripts/softroce-vm --disk, qemu cache=writeback:
# what the guest flushes reaches the image) and whose power is cut
# (pinpoll-power-cut: the host SIGKILLs its qemu), then booted again on the
# same image. Cases:
#   complete_file_survives_power_cut   cut right after the client said it
#       is complete: after the reboot the file is there, same SHA-256
#   mid_transfer_cut_leaves_no_file    cut mid-transfer: nothing under the
#       final name; the next `filexfer serve` removes the orphan temp file
#       and says so
#   cut_before_dir_fsync_is_all_or_nothing   cut while the server pauses
#       between the data's fsync and the directory's (debug-build hook
#       PINPOLL_FX_PAUSE_BEFORE_DIR_FSYNC): the whole file or nothing
# Four boots; each checks what the previous cut left and arms the next cut.
# Prints "power loss: N passed, N failed" last.
#
# In the guest (what the boots run): power-loss.sh BINDIR WORKDIR STEP...
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
top=$PWD
# shellcheck source=scripts/lib/wait.sh
. scripts/lib/wait.sh

PORT=7700
MNT=/run/power-loss # the disk's mount point in the guest

# ------------------------------------------------------------ on the host
on_host() {
    local bin=${1:-$top/target/debug} w=$top/target/power-loss out rc boot passed=0 failed=0
    bin=$(cd "$bin" && pwd) || exit 2
    [ -x "$bin/filexfer" ] || { echo "error: $bin/filexfer not built (cargo build -p pinpoll-apps)" >&2; exit 2; }
    # shellcheck source=scripts/lib/deps.sh
    . scripts/lib/deps.sh
    pinpoll_ensure_packages e2fsprogs coreutils
    rm -rf "$w" && mkdir -p "$w/src"
    head -c $((16 << 20)) /dev/urandom >"$w/src/complete.bin"
    head -c $((64 << 20)) /dev/urandom >"$w/src/big.bin"
    head -c $((8 << 20)) /dev/urandom >"$w/src/paused.bin"
    head -c $((1 << 20)) /dev/urandom >"$w/src/after.bin"
    truncate -s 512M "$w/disk.img"
    # Initialised in full now: no lazy init writing in the guest's background.
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$w/disk.img" || { echo "error: mkfs.ext4 failed" >&2; exit 1; }
    boot=0
    for steps in "cut_after_complete" \
        "check_complete cut_mid_transfer" \
        "check_mid_transfer cut_before_dir_fsync" \
        "check_before_dir_fsync"; do
        boot=$((boot + 1))
        echo "--- boot $boot on $w/disk.img: $steps"
        # shellcheck disable=SC2086 # the steps are words
        out=$(scripts/softroce-vm --disk "$w/disk.img" --timeout 600 -- scripts/power-loss.sh "$bin" "$w" $steps 2>&1)
        rc=$?
        printf '%s\n' "$out" | sed 's/^/     /'
        passed=$((passed + $(grep -c '^ok ' <<<"$out")))
        failed=$((failed + $(grep -c '^FAIL ' <<<"$out")))
        if [ "$rc" -ne 0 ]; then
            failed=$((failed + 1))
            echo "FAIL boot $boot ($steps): exit status $rc"
        fi
    done
    echo
    echo "power loss: $passed passed, $failed failed"
    [ "$failed" -eq 0 ] && [ "$passed" -eq 3 ]
}

# ------------------------------------------------------------ in the guest
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1: $2"; }
names() { # DIR: the names in it, hidden ones too, on one line
    local f out=()
    for f in "$1"/* "$1"/.[!.]*; do [ -e "$f" ] && out+=("${f##*/}"); done
    echo "${out[*]}"
}

# Starts `filexfer serve --dir DIR --count 1` in the background (output in
# LOG, extra environment first) and waits until it listens; sets $spid.
serve_bg() { # DIR LOG [VAR=VALUE...]
    local dir=$1 log=$2
    shift 2
    mkdir -p "$dir"
    env "$@" "$BIN/filexfer" serve --dir "$dir" --port "$PORT" --count 1 --timeout 30 >"$log" 2>&1 &
    spid=$!
    wait_line "$log" "listening on" 60 || { echo "error: the server never listened: $(tail -3 "$log")" >&2; return 1; }
}
send() { # FILE: sends it to the server of serve_bg
    "$BIN/filexfer" send "$PINPOLL_ADDR4" "$1" --port "$PORT" --timeout 30 -q
}
power_cut() { # WHAT: cut the power now; returns only if the cut never came
    echo "     cutting the power: $1"
    pinpoll-power-cut
    exit 1
}

cut_after_complete() {
    serve_bg "$MNT/complete" /tmp/s.log || exit 1
    send "$W/src/complete.bin" || { echo "error: the send failed before any cut" >&2; exit 1; }
    power_cut "the client has just said complete.bin is complete"
}
check_complete() {
    local name=complete_file_survives_power_cut d=$MNT/complete
    if [ "$(names "$d")" != complete.bin ]; then
        bad "$name" "after the reboot the directory holds '$(names "$d")', expected complete.bin"
    elif [ "$(sha_of "$d/complete.bin")" != "$(sha_of "$W/src/complete.bin")" ]; then
        bad "$name" "complete.bin survived with another SHA-256 ($(stat -c %s "$d/complete.bin") bytes)"
    else
        ok "$name"
        echo "     complete.bin after the cut: $(sha_of "$d/complete.bin") (the source's)"
    fi
}

cut_mid_transfer() {
    local cpid
    serve_bg "$MNT/midway" /tmp/s.log || exit 1
    # Not through send(): $! must be the client itself, to stop it below.
    "$BIN/filexfer" send "$PINPOLL_ADDR4" "$W/src/big.bin" --port "$PORT" --timeout 30 -q >/tmp/c.log 2>&1 &
    cpid=$!
    wait_line /tmp/s.log ": receiving " 60 || { echo "error: the transfer never started: $(tail -3 /tmp/c.log)" >&2; exit 1; }
    sleep 1
    # The client stops where it is: the transfer cannot end between the
    # check below and the cut (it did, twice in a row on a loaded host:
    # after the reboot big.bin was whole under its final name).
    kill -STOP "$cpid"
    # What the kernel's periodic writeback does within seconds, done now:
    # the temp file and the data so far reach the disk, so the cut leaves
    # an orphan for the next server to find.
    sync -f "$MNT/midway"
    if grep -q ": received " /tmp/s.log || ! kill -0 "$cpid" 2>/dev/null; then
        echo "error: big.bin was complete before the cut: not mid-transfer" >&2
        exit 1
    fi
    power_cut "mid-transfer: $(grep ': receiving ' /tmp/s.log); on the disk: $(names "$MNT/midway")"
}
# The next server on DIR: it reports removing the one orphan, and then
# serves a transfer that arrives identical. Prints what is wrong.
serve_removes_orphan() { # DIR
    local orphan
    orphan=$(names "$1" | tr ' ' '\n' | grep '^\.filexfer-.*\.tmp$')
    [ "$(wc -w <<<"$orphan")" -eq 1 ] || { echo "expected one orphan temp file, found '$orphan'"; return; }
    serve_bg "$1" /tmp/s2.log || { echo "the next server did not start"; return; }
    send "$W/src/after.bin" >/tmp/c2.log 2>&1 || echo "the next transfer failed: $(tail -2 /tmp/c2.log)"
    wait_bounded "$spid" 60 || echo "the next server failed: $(tail -2 /tmp/s2.log)"
    grep -q "removed 1 temporary file(s) left by a server that died: $orphan" /tmp/s2.log ||
        echo "the next server did not report removing $orphan: $(head -3 /tmp/s2.log | tr '\n' ' ')"
    [ -e "$1/$orphan" ] && echo "$orphan is still there"
    [ "$(sha_of "$1/after.bin")" = "$(sha_of "$W/src/after.bin")" ] || echo "after.bin arrived different"
    echo "     $(grep 'removed 1 temporary' /tmp/s2.log)" >&2
}
check_mid_transfer() {
    local name=mid_transfer_cut_leaves_no_file d=$MNT/midway why left
    left=$(names "$d")
    if [ -e "$d/big.bin" ]; then
        why="big.bin exists under its final name after a cut mid-transfer"
    else
        why=$(serve_removes_orphan "$d")
    fi
    if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
    echo "     after the reboot: '$left'; after the next server: '$(names "$d")'"
}

cut_before_dir_fsync() {
    local cpid
    serve_bg "$MNT/paused" /tmp/s.log PINPOLL_FX_PAUSE_BEFORE_DIR_FSYNC=120 || exit 1
    send "$W/src/paused.bin" >/tmp/c.log 2>&1 &
    cpid=$!
    wait_line /tmp/s.log "PINPOLL_FX_PAUSE_BEFORE_DIR_FSYNC: pausing" 120 ||
        { echo "error: the server never paused: $(tail -3 /tmp/s.log)" >&2; exit 1; }
    kill -0 "$cpid" 2>/dev/null || { echo "error: the client ended before the directory fsync: $(tail -2 /tmp/c.log)" >&2; exit 1; }
    power_cut "the server paused between paused.bin's fsync and its directory's"
}
check_before_dir_fsync() {
    local name=cut_before_dir_fsync_is_all_or_nothing d=$MNT/paused why='' left
    left=$(names "$d")
    if [ -e "$d/paused.bin" ]; then
        [ "$(sha_of "$d/paused.bin")" = "$(sha_of "$W/src/paused.bin")" ] ||
            why="paused.bin survived, but not whole: $(stat -c %s "$d/paused.bin") bytes, another SHA-256"
        echo "     outcome: the whole file"
    else
        echo "     outcome: nothing under the final name"
    fi
    if [ -z "$why" ] && [[ " $left " == *" .filexfer-"* ]]; then
        why=$(serve_removes_orphan "$d")
    fi
    if [ -z "$why" ]; then ok "$name"; else bad "$name" "$why"; fi
    echo "     after the reboot: '$left'"
}

in_guest() { # BINDIR WORKDIR STEP...
    BIN=$1 W=$2
    shift 2
    [ -n "${PINPOLL_DISK:-}" ] || { echo "error: no disk: run under scripts/softroce-vm --disk IMAGE" >&2; exit 2; }
    mkdir -p "$MNT"
    # Mounting replays the journal after a cut, as a boot does.
    mount -t ext4 "$PINPOLL_DISK" "$MNT" || { echo "error: cannot mount $PINPOLL_DISK" >&2; exit 1; }
    local step
    for step in "$@"; do
        case $step in
        cut_after_complete | check_complete | cut_mid_transfer | check_mid_transfer | \
            cut_before_dir_fsync | check_before_dir_fsync) "$step" ;;
        *) echo "error: unknown step $step" >&2; exit 2 ;;
        esac
    done
    umount "$MNT"
}

if [ -n "${PINPOLL_VM:-}" ]; then in_guest "$@"; else on_host "$@"; fi
