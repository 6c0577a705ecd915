# shellcheck shell=bash
# shellcheck disable=SC2054 # qemu options are comma-separated words
# scripts/vm/launch.sh — part of the launcher (scripts/softroce-vm), sourced
# by it last: starts the guests' qemu processes, follows COMMAND's output,
# watches the guests' status files (boot, setup, COMMAND, a power cut, the
# timeout) and exits with COMMAND's status or the rig's own.
# ---------------------------------------------------------------- launch
qesc() { printf '%s' "${1//,/,,}"; } # qemu option values: double the commas
# no_timer_check: on a busy host a TCG guest's timer can miss the kernel's
# early IO-APIC check, which then panics ("IO-APIC + timer doesn't work").
qemu_args() { # INDEX -> QARGS
    local i=$1 k
    QARGS=(-name "pinpoll-vm-$i" -nodefaults -no-user-config -display none -no-reboot
        "${ACCEL[@]}" -smp "$SMP" -m "$MEM"
        -kernel "$KERNEL" -initrd "$INITRD"
        -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off no_timer_check pinpoll.host=$i pinpoll.rootcache=${PINPOLL_VM_ROOT_CACHE:-loose} hugepagesz=2M hugepages=$HUGEPAGES"
        -chardev "file,id=con,path=$(qesc "$T/console-$i.log")" -serial chardev:con -monitor none
        -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$(qesc "$S"),mount_tag=pprun,security_model=none,multidevs=remap"
        -virtfs "local,path=$(qesc "$KDIR"),mount_tag=ppkernel,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$(qesc "$WORK"),mount_tag=ppwork,security_model=none,multidevs=remap"
        -nic none)
    for ((k = 0; k < ${#RSHARES[@]}; k++)); do
        QARGS+=(-virtfs "local,path=$(qesc "${RSHARES[k]}"),mount_tag=ppshare$k,security_model=none,multidevs=remap")
    done
    if [ "$i" -eq 0 ]; then
        QARGS+=(-device virtio-serial-pci,id=vser0
            -chardev "file,id=cout,path=$(qesc "$T/stdout"),append=on"
            -device virtserialport,bus=vser0.0,chardev=cout,name=pinpoll.stdout
            -chardev "file,id=cerr,path=$(qesc "$T/stderr"),append=on"
            -device virtserialport,bus=vser0.0,chardev=cerr,name=pinpoll.stderr)
        if [ -n "$DISK" ]; then
            QARGS+=(-drive "file=$(qesc "$DISK"),format=raw,if=none,id=disk0,cache=writeback"
                -device virtio-blk-pci,drive=disk0)
        fi
    fi
    if [ "$HOSTS" -eq 2 ]; then
        # One point-to-point link: guest 0 listens, guest 1 connects.
        if [ "$i" -eq 0 ]; then
            QARGS+=(-netdev "stream,id=net0,server=on,addr.type=unix,addr.path=$(qesc "$T/net-1.sock")")
        else
            QARGS+=(-netdev "stream,id=net0,server=off,addr.type=unix,addr.path=$(qesc "$T/net-1.sock")")
        fi
        QARGS+=(-device "virtio-net-pci,netdev=net0,mac=$(mac_of "$i")")
    elif [ "$HOSTS" -gt 2 ]; then
        # Star: guest 0's qemu runs a hub joining its NIC and one stream per peer.
        if [ "$i" -eq 0 ]; then
            for ((k = 1; k < HOSTS; k++)); do
                QARGS+=(-netdev "stream,id=s$k,server=on,addr.type=unix,addr.path=$(qesc "$T/net-$k.sock")"
                    -netdev "hubport,id=hp$k,hubid=0,netdev=s$k")
            done
            QARGS+=(-netdev hubport,id=net0,hubid=0)
        else
            QARGS+=(-netdev "stream,id=net0,server=off,addr.type=unix,addr.path=$(qesc "$T/net-$i.sock")")
        fi
        QARGS+=(-device "virtio-net-pci,netdev=net0,mac=$(mac_of "$i")")
    fi
}
start_guest() { # INDEX
    local i=$1
    qemu_args "$i"
    : >"$T/console-$i.log"
    "$QEMU" "${QARGS[@]}" </dev/null >"$T/qemu-$i.log" 2>&1 &
    QPIDS[i]=$!
    disown "$!" # no "Killed"/"Aborted" job notices; liveness is checked with qemu_alive
    # Until the fork has exec'd qemu its command line is ours: wait for that.
    local n
    for ((n = 0; n < 200; n++)); do
        qemu_alive "$i" && return 0
        kill -0 "${QPIDS[i]}" 2>/dev/null || return 0
        sleep 0.02
    done
}
# True while guest I's qemu (the very process this script started) runs; the
# command line check guards against a recycled PID.
qemu_alive() {
    local p=${QPIDS[$1]:-} a
    [ -n "$p" ] || return 1
    mapfile -d '' a 2>/dev/null <"/proc/$p/cmdline" || return 1
    [[ "${a[*]}" == *"$T/console-$1.log"* ]]
}
stop_qemu() { # INDEX SIGNAL
    if qemu_alive "$1"; then kill -s "$2" "${QPIDS[$1]}" 2>/dev/null || true; fi
}

console_tail() { # INDEX [LINES]
    local i=$1 n=${2:-40}
    (
        set +e +o pipefail
        echo "---- guest $i console (last $n lines) ----"
        sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1b[c()][0-9A-Za-z]\{0,1\}//g; s/\r$//; s/\r/\n/g' "$T/console-$i.log" 2>/dev/null |
            grep -v -E '^(SeaBIOS|iPXE|Booting from|Machine UUID|$)' | tail -n "$n"
        if [ -s "$T/qemu-$i.log" ]; then
            echo "---- qemu $i messages ----"
            tail -n 20 "$T/qemu-$i.log"
        fi
        echo "----"
    ) >&2 || true
}
# What guest I reported in its status file (see scripts/vm/lib.sh).
guest_has() { status_has "$S/host-$1/status" "$2"; }
guest_msg() { status_msg "$S/host-$1/status" "$2"; }

: >"$T/stdout"
: >"$T/stderr"
say "kernel $KVER, accel $ACCEL_MODE, $HOSTS guest(s) x ${MEM} MiB x $SMP vCPU, work dir $WORK"
start_guest 0
if [ "$HOSTS" -gt 1 ]; then
    for ((k = 1; k < HOSTS; k++)); do
        for _ in $(seq 100); do
            [ -S "$T/net-$k.sock" ] && break
            qemu_alive 0 || break
            sleep 0.05
        done
        [ -S "$T/net-$k.sock" ] || { console_tail 0; die "qemu for guest 0 did not open $T/net-$k.sock"; }
    done
    for ((k = 1; k < HOSTS; k++)); do start_guest "$k"; done
fi

# COMMAND's output: the chardev files, followed as qemu writes them.
tail -n +1 -s 0.1 --pid="${QPIDS[0]}" -f "$T/stdout" &
TAILPIDS+=($!)
tail -n +1 -s 0.1 --pid="${QPIDS[0]}" -f "$T/stderr" >&2 &
TAILPIDS+=($!)
if [ "$CONSOLE" = 1 ]; then
    echo >&2
    for ((k = 0; k < HOSTS; k++)); do
        tail -n +1 -s 0.2 --pid="${QPIDS[k]}" -f "$T/console-$k.log" |
            sed -u -e 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1b[c()][0-9A-Za-z]\{0,1\}//g; s/\r//g' |
            grep --line-buffered -v -E '^(SeaBIOS|iPXE|Booting from|Machine UUID|$)' |
            sed -u "s/^/[console $k] /" >&2 &
        TAILPIDS+=($!)
    done
fi
if [ -n "$PEER_CMD" ]; then
    for ((k = 1; k < HOSTS; k++)); do
        for f in out err; do
            tail -n +1 -s 0.2 --pid="${QPIDS[k]}" -F "$S/jobs-$k/main.$f" 2>/dev/null | sed -u "s/^/[guest $k] /" >&2 &
            TAILPIDS+=($!)
        done
    done
fi

# ---------------------------------------------------------------- watch
fail_run() { # MESSAGE [INDEX]
    echo "$PROG: error: $1" >&2
    console_tail "${2:-0}"
    exit 125
}
kill_guests() { # only the qemu processes this script started, by PID
    local k
    for k in "${!QPIDS[@]}"; do stop_qemu "$k" KILL; done
    for k in "${!QPIDS[@]}"; do
        for _ in $(seq 50); do qemu_alive "$k" || break; sleep 0.1; done
    done
}
DEADLINE=$((T0 + TIMEOUT * 1000))
BOOT_DEADLINE=$((T0 + BOOT_TIMEOUT * 1000))
ready_seen=0 booted_seen=0 cmd_seen=0 WARNED=()
while qemu_alive 0; do
    t=$(now_ms)
    if [ "$t" -ge "$DEADLINE" ]; then
        echo "$PROG: timeout after ${TIMEOUT}s; stopping the guests" >&2
        kill_guests
        console_tail 0 15
        exit 124
    fi
    if [ -e "$S/power-cut" ]; then
        kill_guests
        for p in "${TAILPIDS[@]:0:2}"; do wait "$p" 2>/dev/null || true; done
        echo "$PROG: power cut: every guest's qemu killed with SIGKILL, as asked by $(cat "$S/power-cut")" >&2
        exit 0
    fi
    if [ "$booted_seen" = 0 ] && guest_has 0 stage2; then
        booted_seen=1
        say "guest 0 booted after $(elapsed)"
    fi
    if [ "$cmd_seen" = 0 ]; then
        for ((k = 0; k < HOSTS; k++)); do
            if guest_has "$k" fatal; then fail_run "guest $k: $(guest_msg "$k" fatal)" "$k"; fi
            if guest_has "$k" fail; then
                [ "$KEEP_GOING" = 1 ] || fail_run "guest $k setup failed: $(guest_msg "$k" fail)" "$k"
                if [ -z "${WARNED[k]:-}" ]; then
                    WARNED[k]=1
                    warn "guest $k setup failed (continuing, --keep-going): $(guest_msg "$k" fail)"
                fi
            fi
            if [ "$k" -gt 0 ] && [ "$KEEP_GOING" = 0 ] && ! qemu_alive "$k"; then
                fail_run "guest $k exited before guest 0 started COMMAND" "$k"
            fi
        done
        if [ "$ready_seen" = 0 ] && guest_has 0 ready; then
            ready_seen=1
            say "guest 0 ready (rxe0 ACTIVE) after $(elapsed)"
        fi
        if guest_has 0 command; then
            cmd_seen=1
            say "COMMAND started after $(elapsed)"
        elif [ "$t" -ge "$BOOT_DEADLINE" ]; then
            kill_guests
            if [ "$booted_seen" = 0 ]; then
                hint=
                [ "$ACCEL_MODE" = kvm ] && hint=" (KVM guests are known to hang in early boot here; try PINPOLL_VM_ACCEL=tcg)"
                fail_run "guest 0 did not boot within ${BOOT_TIMEOUT}s$hint"
            fi
            fail_run "guests were not ready within ${BOOT_TIMEOUT}s (PINPOLL_VM_BOOT_TIMEOUT)"
        fi
    fi
    nap 0.1 # also how soon a power cut comes
done
for p in "${TAILPIDS[@]:0:2}"; do wait "$p" 2>/dev/null || true; done
say "guest 0 powered off after $(elapsed)"

# Peers: ask them to power off, the cleanup trap kills what is left.
if [ "$HOSTS" -gt 1 ]; then
    touch "$S/shutdown"
    for ((k = 1; k < HOSTS; k++)); do
        for _ in $(seq 30); do qemu_alive "$k" || break; sleep 0.1; done
    done
    if [ -n "$PEER_CMD" ]; then
        for ((k = 1; k < HOSTS; k++)); do
            if [ -e "$S/jobs-$k/main.rc" ]; then
                prc=$(cat "$S/jobs-$k/main.rc")
                [ "$prc" = 0 ] || warn "guest $k: --peer-command exited $prc"
            fi
        done
    fi
fi

if [ -e "$S/host-0/rc" ]; then
    rc=$(cat "$S/host-0/rc")
    if [ -s "$S/host-0/dmesg" ] && grep -qE 'WARNING:|BUG:|Oops|Call Trace:|general protection' "$S/host-0/dmesg"; then
        warn "the guest kernel logged warnings (dmesg excerpt):"
        grep -E -A3 'WARNING:|BUG:|Oops|general protection' "$S/host-0/dmesg" | head -40 >&2 || true
    fi
    is_uint "$rc" || rc=125
    exit "$rc"
fi
if guest_has 0 fatal; then fail_run "guest 0: $(guest_msg 0 fatal)"; fi
if guest_has 0 fail && ! guest_has 0 command; then fail_run "guest 0 setup failed: $(guest_msg 0 fail)"; fi
if guest_has 0 command; then
    grep -q 'Kernel panic' "$T/console-0.log" 2>/dev/null && fail_run "guest 0 kernel panicked while COMMAND was running"
    fail_run "guest 0 died while COMMAND was running (poweroff or crash?)"
fi
if guest_has 0 stage2; then fail_run "guest 0 powered off during setup"; fi
msg=$(sed -n 's/.*pinpoll-vm: FATAL: //p' "$T/console-0.log" 2>/dev/null | head -1 | tr -d '\r')
[ -n "$msg" ] && fail_run "guest 0 failed to boot: $msg"
grep -q 'Kernel panic' "$T/console-0.log" 2>/dev/null && fail_run "guest 0 kernel panicked during boot"
fail_run "guest 0 failed to boot (see console below)"

