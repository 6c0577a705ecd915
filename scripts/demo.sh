#!/usr/bin/env bash
# scripts/demo.sh — the pinpoll demo: build, bring up SoftRoCE, move a 64 MiB
# random file over real RDMA verbs with `filexfer`, and verify its SHA-256;
# both sides print the file's BLAKE3 digest (as `b3sum` does), compared here
# with each other and with `b3sum` when it is installed.
#
#   scripts/demo.sh            build (release), then run the demo on this
#                              machine's RDMA device if `ibv_devices` lists
#                              one, else inside the SoftRoCE guest
#                              (scripts/softroce-vm)
#   DEMO_MIB=16 scripts/demo.sh  a smaller file (default 64 MiB)
#
# Exit status 0 only if the file arrived intact (same SHA-256, same BLAKE3
# on both sides) and both sides reported success. It stops only the server it started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD
bin=$top/target/release/filexfer
mib=${DEMO_MIB:-64}

say() { printf '==> %s\n' "$*"; }

run_demo() {
    # Globals: the EXIT trap needs them after this function returns.
    local addr=$1 port send_rc=0 serve_rc=0
    work=$(mktemp -d "${TMPDIR:-/tmp}/filexfer-demo.XXXXXX")
    mkdir "$work/in"
    say "generating a ${mib} MiB random file"
    head -c "$((mib * 1024 * 1024))" /dev/urandom > "$work/demo.bin"
    say "starting the server: filexfer serve --dir $work/in --port 0 --count 1"
    "$bin" serve --dir "$work/in" --port 0 --count 1 > "$work/server.out" 2> "$work/server.err" &
    spid=$!
    # Stop only the server this script started, whatever happens.
    trap 'kill "$spid" 2>/dev/null || true; rm -rf "$work"' EXIT
    for _ in $(seq 150); do
        grep -q '^listening on ' "$work/server.out" && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.2
    done
    port=$(sed -n 's/^listening on .*:\([0-9][0-9]*\)$/\1/p' "$work/server.out" | head -1)
    if [ -z "$port" ]; then
        echo "error: the server did not start: $(cat "$work/server.err")" >&2
        return 1
    fi
    say "sending: filexfer send $addr demo.bin --port $port"
    "$bin" send "$addr" "$work/demo.bin" --port "$port" --timeout 60 > "$work/send.out" || send_rc=$?
    cat "$work/send.out"
    wait "$spid" || serve_rc=$?
    sed 's/^/server: /' "$work/server.out"
    if [ -s "$work/server.err" ]; then sed 's/^/server: /' "$work/server.err" >&2; fi
    if [ "$send_rc" != 0 ] || [ "$serve_rc" != 0 ]; then
        echo "error: the transfer failed (send exit $send_rc, serve exit $serve_rc)" >&2
        return 1
    fi
    local want got
    want=$(sha256sum < "$work/demo.bin" | cut -d' ' -f1)
    got=$(sha256sum < "$work/in/demo.bin" | cut -d' ' -f1)
    echo "sha256 sent:     $want"
    echo "sha256 received: $got"
    if [ "$want" != "$got" ]; then
        echo "error: the received file differs from the sent one" >&2
        return 1
    fi
    local sent_b3 received_b3
    sent_b3=$(sed -n 's/^sent .*, BLAKE3 \([0-9a-f]\{64\}\)$/\1/p' "$work/send.out")
    received_b3=$(sed -n 's/^client .*: received .*, BLAKE3 \([0-9a-f]\{64\}\)$/\1/p' "$work/server.out")
    echo "blake3 sent:     $sent_b3"
    echo "blake3 received: $received_b3"
    if [ -z "$sent_b3" ] || [ "$sent_b3" != "$received_b3" ]; then
        echo "error: the two sides printed different BLAKE3 digests" >&2
        return 1
    fi
    if command -v b3sum >/dev/null; then
        local b3
        b3=$(b3sum --no-names "$work/demo.bin")
        echo "b3sum:           $b3"
        [ "$b3" = "$sent_b3" ] || { echo "error: b3sum disagrees with filexfer's digest" >&2; return 1; }
    fi
    say "demo OK: ${mib} MiB moved over RDMA and verified"
}

if [ "${1:-}" = --inner ]; then
    # Inside the guest (or on a machine with a device): the address of the
    # RDMA netdev.
    addr=${PINPOLL_ADDR4:-}
    if [ -z "$addr" ]; then
        netdev=$(rdma link show 2>/dev/null | sed -n 's/.* netdev \([^ ]*\).*/\1/p' | head -1)
        addr=$(ip -o -4 addr show dev "$netdev" 2>/dev/null | awk '{ sub("/.*", "", $4); print $4; exit }')
        if [ -z "$addr" ]; then
            ll=$(ip -o -6 addr show dev "$netdev" scope link 2>/dev/null | awk '{ sub("/.*", "", $4); print $4; exit }')
            [ -n "$ll" ] && addr="$ll%$netdev"
        fi
    fi
    [ -n "$addr" ] || { echo "error: no address on the RDMA device's netdev" >&2; exit 1; }
    run_demo "$addr"
    exit
fi

# shellcheck source=scripts/lib/deps.sh
. scripts/lib/deps.sh
pinpoll_ensure_packages libibverbs-dev librdmacm-dev libclang-dev pkg-config \
    rdma-core ibverbs-providers ibverbs-utils iproute2

say "building: cargo build --release -p pinpoll-apps"
cargo build --release -p pinpoll-apps

if ibv_devices 2>/dev/null | awk 'NR > 2 && NF' | grep -q .; then
    say "using this machine's RDMA device"
    exec "$0" --inner
fi
say "no RDMA device here: running inside the SoftRoCE guest (scripts/softroce-vm)"
exec scripts/softroce-vm --env DEMO_MIB="$mib" -- "$top/scripts/demo.sh" --inner
