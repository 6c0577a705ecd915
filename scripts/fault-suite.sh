#!/usr/bin/env bash
# scripts/fault-suite.sh — faults that need two machines, injected for real.
#
#   scripts/softroce-vm --hosts 2 -- scripts/fault-suite.sh [BINDIR [CASE...]]
#
# Runs inside `scripts/softroce-vm --hosts 2` (scripts/test.sh does that):
# guest 0 runs this script and the clients, guest 1 runs the servers. The
# guests are joined only to each other; every address is link-local. Each
# case expects a precise outcome — data identical, or one clear error
# within a bounded time — and checks that its fault really happened
# (netem's drop count, rxe's retransmission counters, a process's state);
# a case that cannot run fails, nothing is skipped. Prints
# "faults: N passed, N failed" last.
#
# BINDIR holds the built apps (default: target/debug of the work tree).
# CASE... runs only those cases, by name (the table below), in table order.
# FAULT_SUITE_DISARM=1 runs the cases without their faults: every fault
# case must then fail (cases without a fault are marked "no fault"). From
# the host: scripts/softroce-vm --hosts 2 --env FAULT_SUITE_DISARM=1 -- ...
#
# Adding a case: a function in scripts/fault/cases.sh (or load.sh,
# hostile.sh) that sets $why, and its name in FAULT_CASES.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/fault/steps.sh
. "$HERE/fault/steps.sh"
# shellcheck source=scripts/fault/cases.sh
. "$HERE/fault/cases.sh"
# shellcheck source=scripts/fault/load.sh
. "$HERE/fault/load.sh"
# shellcheck source=scripts/fault/hostile.sh
. "$HERE/fault/hostile.sh"

# The cases, in the order they run: NAME, and "fault" or "no fault" (the
# latter are not expected to fail when disarmed).
FAULT_CASES=(
    messages_cross_the_link "no fault"
    delay_is_tolerated fault
    loss_1pct_is_retransmitted fault
    loss_10pct_is_retransmitted fault
    streams_survive_delay_and_loss fault
    slow_client_is_cut_by_min_rate fault
    total_loss_fails_within_budget fault
    no_server_is_refused fault
    no_host_fails_within_budget fault
    file_arrives_identical "no fault"
    server_killed_while_idle fault
    client_killed_while_idle fault
    client_killed_mid_transfer fault
    server_killed_mid_transfer fault
    restarted_server_removes_orphan fault
    stopped_receiver_times_out fault
    stopped_receiver_resumes fault
    extra_clients_refused_as_busy fault
    device_deleted_mid_transfer fault
    load_is_served_in_bounded_memory "no fault"
    bad_chunks_are_never_stored fault
    hostile_client_is_bounded fault
    perf_clients_race_for_the_data_connection fault
)

BIN=${1:-${PINPOLL_WORKDIR:-$PWD}/target/debug}
shift $(($# > 0 ? 1 : 0))
declare -A KIND
for ((k = 0; k < ${#FAULT_CASES[@]}; k += 2)); do KIND[${FAULT_CASES[k]}]=${FAULT_CASES[k + 1]}; done
for c in "$@"; do
    [ -n "${KIND[$c]:-}" ] || { echo "error: unknown case '$c' (cases: $(printf '%s ' "${!KIND[@]}" | tr ' ' '\n' | sort | tr '\n' ' '))" >&2; exit 2; }
done
ONLY=" $* "
selected() { [ "$ONLY" = "  " ] || [[ $ONLY == *" $1 "* ]]; }

[ "${PINPOLL_HOSTS:-1}" -ge 2 ] || { echo "error: needs two guests: scripts/softroce-vm --hosts 2 -- $0" >&2; exit 2; }
for b in basic readwrite filexfer pinpoll-hostile pinpoll-perf; do
    [ -x "$BIN/$b" ] || { echo "error: $BIN/$b not built (cargo build --workspace)" >&2; exit 2; }
done
read -r _ PEER4 _ <<<"$PINPOLL_PEERS4"
read -r _ PEER6 _ <<<"$PINPOLL_PEERS6"
[[ $PEER6 == *%* ]] || PEER6="$PEER6%$PINPOLL_NETDEV"
NETDEV=$PINPOLL_NETDEV
DEV=${PINPOLL_DEVICE:-rxe0}
SRC=/tmp/fxsrc # guest 0: the files that are sent
port=7600
# The error a client gives when every packet is lost while it connects.
TOTAL_LOSS_ERROR="timed out after [0-9.]*s waiting for rdma_connect"

SUITE_T0=$SECONDS
# The rig before any case: the peer answers ping over both families.
# This also settles each family's neighbour entry before rdma_cm needs
# it: once (2026-12-03), the suite's first IPv6 connect "timed out after
# 9.77s waiting for rdma_resolve_addr" while IPv4 had just worked, and
# later connects over IPv6 did not. messages_cross_the_link shows the
# neighbour table if it fails again.
command -v ping >/dev/null && PING=ping || PING="busybox ping"
for peer in "$PEER4" "$PEER6"; do
    $PING -c 1 -W 5 -I "$NETDEV" "${peer%%%*}" >/dev/null 2>&1 ||
        $PING -c 3 -W 5 -I "$NETDEV" "${peer%%%*}" >/dev/null 2>&1 ||
        { echo "error: '$PING -I $NETDEV ${peer%%%*}' gets no answer: the rig's link (or that ping) does not work" >&2; exit 2; }
done
armed || echo "DISARMED (FAULT_SUITE_DISARM=1): no case injects its fault; every fault case must fail"
for ((k = 0; k < ${#FAULT_CASES[@]}; k += 2)); do
    c=${FAULT_CASES[k]}
    selected "$c" || continue
    t=$SECONDS
    "$c"
    if armed || [ "${KIND[$c]}" = fault ]; then
        verdict "$c"
    else
        verdict "$c (no fault)"
    fi
    note "($c: $((SECONDS - t)) s)"
done

echo
only=
[ "$ONLY" = "  " ] || only=" (only:$ONLY)"
echo "faults: $passed passed, $failed failed in $((SECONDS - SUITE_T0)) s$only"
[ "$failed" -eq 0 ]
