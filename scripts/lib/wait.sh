# shellcheck shell=bash
# scripts/lib/wait.sh — bounded waits and file hashes for the scripts that
# drive filexfer in the guests (fault-suite.sh, power-loss.sh). Sourced.
# Every wait here is a hang guard: what a case expects comes from the
# programs' own deadlines, never from how long something took.

# Until FILE has a line containing TEXT (grep pattern); fails after SECS.
wait_line() { # FILE TEXT SECS
    local n
    for ((n = 0; n < $3 * 10; n++)); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# Waits for a child of this shell; after SECS it is killed with SIGKILL
# and the result is 124, otherwise its exit status.
wait_bounded() { # PID SECS
    local n
    for ((n = 0; n < $2 * 10; n++)); do
        # (no "Killed" notice from bash for a child that died of a signal)
        kill -0 "$1" 2>/dev/null || { wait "$1" 2>/dev/null; return; }
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 124
}

sha_of() { sha256sum <"$1" | cut -d' ' -f1; } # FILE
