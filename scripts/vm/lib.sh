# shellcheck shell=bash
# scripts/vm/lib.sh — helpers shared by the launcher (scripts/softroce-vm),
# the guests' stage 2 (scripts/vm/stage2) and the peer helper
# (scripts/vm/pinpoll-peer). Sourced; the guests source the copy in their
# run dir (/run/pinpoll/lib.sh). Defines functions, and opens one file
# descriptor for nap.

# nap SECONDS: sleep without a fork (a read that times out on a pipe
# nobody writes). The launcher and the guests poll files many times a
# second; a `sleep` process each time costs real time under TCG.
exec {PP_NAPFD}<> <(:)
nap() { read -r -t "$1" -u "$PP_NAPFD" _ || true; }

# Guest I's fixed link identity: MAC, its EUI-64 IPv6 link-local address
# and its IPv4 link-local address (the only addresses guests ever use).
mac_of() { printf '52:54:00:50:00:%02x' $(($1 + 1)); }
addr6_of() { printf 'fe80::5054:ff:fe50:%x' $(($1 + 1)); }
addr4_of() { echo "169.254.0.$(($1 + 1))"; }

# A guest's status file (host-I/status in the run dir) gets one line per
# step: stage2, ready, command, done RC, fail MSG (setup), fatal MSG.
# Read with builtins only: the launcher polls it.
status_has() { # FILE WORD: a line starts with WORD
    local x=
    IFS= read -r -d '' x 2>/dev/null <"$1"
    [[ $'\n'$x == *$'\n'"$2"* ]]
}
status_msg() { # FILE WORD: the first line starting with WORD, without the word
    local x='' l
    IFS= read -r -d '' x 2>/dev/null <"$1"
    while IFS= read -r l; do
        [[ $l == "$2"* ]] && { echo "${l#"$2" }"; return; }
    done <<<"$x"
}
