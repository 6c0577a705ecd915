#!/usr/bin/env bash
# softroce.sh: SoftRoCE (rdma_rxe) on this machine's own kernel.
#
# For machines whose kernel has rdma_rxe. Machines without it (no
# /lib/modules, no InfiniBand support) use scripts/softroce-vm instead.
set -euo pipefail

PROG=softroce.sh
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib/deps.sh
. "$SCRIPT_DIR/lib/deps.sh"
STATE_DIR=/run/pinpoll-softroce
DUMMY=pinpoll0
DUMMY_MAC=52:54:00:50:00:01 # same scheme as softroce-vm guest 0
DUMMY_ADDR6=fe80::5054:ff:fe50:1
DUMMY_ADDR4=169.254.0.1

usage() {
    cat <<'EOF'
Usage: scripts/softroce.sh up [--dummy] [--device NAME] [NETDEV]
       scripts/softroce.sh down [--device NAME]
       scripts/softroce.sh status [--device NAME]
       scripts/softroce.sh env [--device NAME]

SoftRoCE on this machine's own kernel (needs root and the rdma_rxe module;
without them use scripts/softroce-vm, which runs a guest kernel under qemu).

  up      load rdma_rxe (+ ib_uverbs, rdma_ucm), create rxe device NAME
          (default rxe0) on NETDEV, wait until its port is ACTIVE, then print
          `export PINPOLL_...=...` lines on stdout, so that
              eval "$(sudo scripts/softroce.sh up --dummy)"
          sets PINPOLL_DEVICE, PINPOLL_NETDEV, PINPOLL_ADDR6, PINPOLL_ADDR4,
          PINPOLL_GID_INDEX (= PINPOLL_GID_INDEX4: RoCE v2 GID of ADDR4, for
          perftest -x), PINPOLL_GID_INDEX6 (RoCE v2 GID of ADDR6).
          NETDEV: the argument, else the first UP interface other than lo.
          --dummy: create dummy netdev pinpoll0 (MAC 52:54:00:50:00:01,
          fe80::5054:ff:fe50:1, 169.254.0.1/32: link-local only, no route
          added) and use it: RDMA stays inside this machine.
          Idempotent: an existing device on the same netdev is reused.
  down    delete the rxe device, and pinpoll0 when `up --dummy` created it
  status  show the device; exit 0 if its port is ACTIVE, 1 otherwise
  env     print the export lines for an existing device
EOF
}

die() { echo "$PROG: error: $*" >&2; exit 1; }
say() { echo "$PROG: $*" >&2; }

CMD=${1:-}
[ -n "$CMD" ] || { usage >&2; exit 2; }
shift
DEV=rxe0 USE_DUMMY=0 NETDEV=
while [ "$#" -gt 0 ]; do
    case $1 in
    --dummy) USE_DUMMY=1; shift ;;
    --device) [ "$#" -ge 2 ] || die "--device needs a name"; DEV=$2; shift 2 ;;
    --device=*) DEV=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$NETDEV" ] || die "only one NETDEV"; NETDEV=$1; shift ;;
    esac
done
case $CMD in
-h | --help | help) usage; exit 0 ;;
up | down | status | env) ;;
*) echo "$PROG: unknown command $CMD" >&2; usage >&2; exit 2 ;;
esac
[ "$USE_DUMMY" = 0 ] || [ -z "$NETDEV" ] || die "--dummy and NETDEV are exclusive"

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$CMD needs root: sudo scripts/softroce.sh $CMD ..."
}
no_rxe() {
    cat >&2 <<EOF
$PROG: error: this kernel ($(uname -r)) has no SoftRoCE: $1
$PROG: use scripts/softroce-vm instead (it boots a Debian kernel with rdma_rxe under qemu):
    scripts/softroce-vm -- COMMAND...
EOF
    exit 1
}

# The rxe device's netdev, or nothing.
dev_netdev() {
    [ -d "/sys/class/infiniband/$DEV" ] || return 0
    rdma link show "$DEV/1" 2>/dev/null | sed -n 's/.* netdev \([^ ]*\).*/\1/p'
}
port_state() { cat "/sys/class/infiniband/$DEV/ports/1/state" 2>/dev/null || true; }

# Index of the RoCE v2 GID $1 (sysfs format) in the device's GID table, or nothing.
gid_index() {
    local f g n t
    for f in "/sys/class/infiniband/$DEV/ports/1/gids/"*; do
        read -r g <"$f" 2>/dev/null || continue
        [ "$g" = "$1" ] || continue
        n=${f##*/}
        read -r t <"/sys/class/infiniband/$DEV/ports/1/gid_attrs/types/$n" 2>/dev/null || continue
        [ "$t" = "RoCE v2" ] && { echo "$n"; return 0; }
    done
    return 0
}
gid_index_v4() { # IPv4 address -> index of its IPv4-mapped RoCE v2 GID
    local o1 o2 o3 o4
    IFS=. read -r o1 o2 o3 o4 <<<"$1"
    gid_index "$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$o1" "$o2" "$o3" "$o4")"
}
ip6_expand() { # fe80::1 -> fe80:0000:0000:0000:0000:0000:0000:0001
    local a=${1%%%*} head tail out='' g n i
    local -a H=() TL=()
    if [[ $a == *::* ]]; then head=${a%%::*} tail=${a#*::}; else head=$a tail=; fi
    [ -z "$head" ] || IFS=: read -r -a H <<<"$head"
    [ -z "$tail" ] || IFS=: read -r -a TL <<<"$tail"
    n=$((8 - ${#H[@]} - ${#TL[@]}))
    for g in "${H[@]}"; do out+=$(printf '%04x:' "0x$g"); done
    for ((i = 0; i < n; i++)); do out+="0000:"; done
    for g in "${TL[@]}"; do out+=$(printf '%04x:' "0x$g"); done
    echo "${out%:}"
}
gid_index_v6() { # IPv6 address -> index of its RoCE v2 GID
    gid_index "$(ip6_expand "$1")"
}

print_env() {
    local nd a6 a4 gi
    nd=$(dev_netdev)
    [ -n "$nd" ] || die "no rxe device $DEV (run: scripts/softroce.sh up)"
    a6=$(ip -6 -o addr show dev "$nd" scope link 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
    a4=$(ip -4 -o addr show dev "$nd" 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
    gi='' gi6=''
    [ -z "$a4" ] || gi=$(gid_index_v4 "$a4")
    [ -z "$a6" ] || gi6=$(gid_index_v6 "$a6")
    printf 'export PINPOLL_DEVICE=%q\n' "$DEV"
    printf 'export PINPOLL_PORT=1\n'
    printf 'export PINPOLL_NETDEV=%q\n' "$nd"
    [ -z "$a6" ] || printf 'export PINPOLL_ADDR6=%q\n' "$a6%$nd"
    [ -z "$a4" ] || printf 'export PINPOLL_ADDR4=%q\n' "$a4"
    [ -z "$gi" ] || printf 'export PINPOLL_GID_INDEX=%q\nexport PINPOLL_GID_INDEX4=%q\n' "$gi" "$gi"
    [ -z "$gi6" ] || printf 'export PINPOLL_GID_INDEX6=%q\n' "$gi6"
}

case $CMD in
status)
    nd=$(dev_netdev)
    if [ -z "$nd" ]; then
        if [ -d /sys/module/rdma_rxe ]; then
            say "no rxe device $DEV (rdma_rxe is loaded)"
        elif modprobe -n rdma_rxe >/dev/null 2>&1; then
            say "no rxe device $DEV (rdma_rxe is available, not loaded)"
        else
            say "no rxe device $DEV; this kernel ($(uname -r)) has no rdma_rxe: use scripts/softroce-vm"
        fi
        exit 1
    fi
    st=$(port_state)
    echo "$DEV on $nd: port 1 ${st:-unknown}"
    ip -br addr show dev "$nd" 2>/dev/null || true
    [[ $st == *ACTIVE* ]]
    ;;
env)
    print_env
    ;;
down)
    need_root
    if [ -n "$(dev_netdev)" ]; then
        rdma link delete "$DEV" || die "rdma link delete $DEV failed"
        say "deleted $DEV"
    else
        say "no rxe device $DEV"
    fi
    if [ -e "$STATE_DIR/$DEV.dummy" ]; then
        d=$(cat "$STATE_DIR/$DEV.dummy")
        if ip link show "$d" >/dev/null 2>&1; then
            ip link delete "$d" && say "deleted dummy netdev $d"
        fi
        rm -f "$STATE_DIR/$DEV.dummy"
    fi
    ;;
up)
    need_root
    pinpoll_ensure_packages iproute2 rdma-core ibverbs-utils ibverbs-providers kmod
    if [ ! -d /sys/module/rdma_rxe ]; then
        if ! modprobe rdma_rxe 2>/dev/null; then
            if [ -d "/lib/modules/$(uname -r)" ]; then
                no_rxe "modprobe rdma_rxe failed (kernel built without CONFIG_RDMA_RXE?)"
            else
                no_rxe "modprobe rdma_rxe failed: /lib/modules/$(uname -r) does not exist"
            fi
        fi
    fi
    for m in ib_uverbs rdma_ucm; do
        [ -d "/sys/module/$m" ] || modprobe "$m" || say "warning: modprobe $m failed"
    done

    if [ "$USE_DUMMY" = 1 ]; then
        NETDEV=$DUMMY
        if ! ip link show "$DUMMY" >/dev/null 2>&1; then
            [ -d /sys/module/dummy ] || modprobe dummy || die "modprobe dummy failed"
            ip link add "$DUMMY" address "$DUMMY_MAC" type dummy || die "cannot create dummy netdev $DUMMY"
            mkdir -p "$STATE_DIR"
            echo "$DUMMY" >"$STATE_DIR/$DEV.dummy"
            # Only link-local addresses, added by hand: no automatic address, no DAD, no routes.
            echo 1 >"/proc/sys/net/ipv6/conf/$DUMMY/addr_gen_mode" 2>/dev/null || true
            echo 0 >"/proc/sys/net/ipv6/conf/$DUMMY/accept_dad" 2>/dev/null || true
            ip link set "$DUMMY" up
            ip -6 addr add "$DUMMY_ADDR6/64" dev "$DUMMY" nodad || die "cannot add $DUMMY_ADDR6 to $DUMMY"
            ip addr add "$DUMMY_ADDR4/32" dev "$DUMMY" || die "cannot add $DUMMY_ADDR4 to $DUMMY"
            say "created dummy netdev $DUMMY ($DUMMY_ADDR6, $DUMMY_ADDR4)"
        fi
    elif [ -z "$NETDEV" ]; then
        NETDEV=$(ip -o link show up 2>/dev/null | awk -F': ' '$2 != "lo" { sub(/@.*/, "", $2); print $2; exit }')
        [ -n "$NETDEV" ] || die "no UP network interface besides lo; pass NETDEV or use --dummy"
        say "using netdev $NETDEV (RoCE traffic may leave this machine; --dummy keeps it local)"
    fi
    ip link show "$NETDEV" >/dev/null 2>&1 || die "no such netdev $NETDEV"

    cur=$(dev_netdev)
    if [ -n "$cur" ] && [ "$cur" != "$NETDEV" ]; then
        die "$DEV already exists on $cur (run: scripts/softroce.sh down)"
    elif [ -z "$cur" ]; then
        rdma link add "$DEV" type rxe netdev "$NETDEV" || die "rdma link add $DEV type rxe netdev $NETDEV failed"
        say "created $DEV on $NETDEV"
    fi
    st=
    for _ in $(seq 200); do
        st=$(port_state)
        [[ $st == *ACTIVE* ]] && break
        sleep 0.1
    done
    [[ $st == *ACTIVE* ]] || die "$DEV port 1 did not become ACTIVE (state: ${st:-none}; is $NETDEV up with carrier?)"
    if command -v ibv_devinfo >/dev/null; then
        ibv_devinfo -d "$DEV" 2>/dev/null | grep -q PORT_ACTIVE ||
            die "ibv_devinfo -d $DEV does not show PORT_ACTIVE (libibverbs rxe provider missing? package ibverbs-providers)"
    fi
    # The IPv4 GID appears shortly after the device.
    a4=$(ip -4 -o addr show dev "$NETDEV" 2>/dev/null | awk '{ split($4, a, "/"); print a[1]; exit }')
    if [ -n "$a4" ]; then
        for _ in $(seq 50); do
            [ -n "$(gid_index_v4 "$a4")" ] && break
            sleep 0.1
        done
    fi
    say "$DEV on $NETDEV: PORT_ACTIVE"
    print_env
    ;;
esac
