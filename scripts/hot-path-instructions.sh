#!/usr/bin/env bash
# scripts/hot-path-instructions.sh — instructions per posted request and per
# reaped completion, split by object: pinpoll's own code first.
#
#   scripts/hot-path-instructions.sh            build, run in the SoftRoCE guest, print
#   scripts/hot-path-instructions.sh --table    only print the table of the last run
#
# Runs the `hot_path` bench (benches/benches/hot_path.rs: iai-callgrind,
# callgrind in the guest, deterministic counts; setup and teardown are not
# counted, and no poll that finds nothing is) and splits each benchmark's
# self instructions by object with scripts/lib/callgrind_objects.py: the
# bench binary (pinpoll, std and the bench's few lines, fat LTO), the
# provider (librxe here; libmlx5 on ConnectX), libibverbs, librdmacm, libc
# and the rest (ld.so, valgrind's preload). pinpoll's own figure is the one
# that carries over to ConnectX; the provider's is rxe's, not mlx5's.
# The bench also fails if a count goes over its hard limit (the guard).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD
out=$top/target/iai/hot_path

table() {
    mapfile -t files < <(find "$out" -name 'callgrind.*.out' ! -name '*.old' ! -name '*@*' | sort)
    [ "${#files[@]}" -gt 0 ] || { echo "error: no callgrind output under $out: run without --table first" >&2; exit 1; }
    echo "| bench | total Ir | pinpoll own | provider | libibverbs | librdmacm | libc | other |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    python3 scripts/lib/callgrind_objects.py hot_path- "${files[@]}" | tail -n +2 |
        while IFS=$'\t' read -r file total own provider verbs cm libc other; do
            # One file per thread; only the measuring thread runs the
            # benchmark function, the others count nothing in it.
            [ "$total" -gt 0 ] || continue
            name=$(basename "$file" .out); name=${name#callgrind.}; name=${name%.t[0-9]*.p[0-9]*}
            echo "| $name | $total | $own | $provider | $verbs | $cm | $libc | $other |"
        done
}

case ${1:-} in
    --table) table; exit 0 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    '') ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
esac

if [ -z "${PINPOLL_DEVICE:-}" ]; then
    # shellcheck source=scripts/lib/deps.sh
    . scripts/lib/deps.sh
    pinpoll_ensure_packages python3
    pinpoll_ensure_iai_runner
    exe=$(cargo bench -p pinpoll-benches --bench hot_path --no-run --message-format=json |
        python3 scripts/lib/cargo_artifacts.py benches | awk -F'\t' '$1 == "hot_path" { print $3 }')
    [ -x "$exe" ] || { echo "error: the hot_path bench did not build" >&2; exit 1; }
    scripts/softroce-vm --timeout "${PINPOLL_HOT_PATH_TIMEOUT:-3600}" \
        --env IAI_CALLGRIND_RUNNER="$(command -v iai-callgrind-runner)" \
        --env PINPOLL_HOT_PATH_EXE="$exe" -- "$0"
    table
    exit 0
fi

# In the guest: the bench, from its package directory as cargo runs it.
cd benches
"${PINPOLL_HOT_PATH_EXE:?not set: run scripts/hot-path-instructions.sh from the host}" --bench
