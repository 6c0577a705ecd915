#!/usr/bin/env bash
# scripts/test.sh — THE test command of pinpoll (CI runs it through .ci/run).
#
#   scripts/test.sh              fmt, clippy -D warnings, host tests, then every
#                                device test inside the SoftRoCE guest (full run)
#   scripts/test.sh --host-only  stop after the host tests (quick development loop)
#   scripts/test.sh --device-only  only the device tests in the guest
#
# Device tests are `#[ignore = "needs an RDMA device"]` on the host; here they
# run with --include-ignored inside `scripts/softroce-vm` on rxe0. If the guest
# cannot start, this script fails: nothing is silently skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD

host=1 device=1
for arg in "$@"; do
    case $arg in
        --host-only) device=0 ;;
        --device-only) host=0 ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown option $arg (see --help)" >&2; exit 2 ;;
    esac
done

# shellcheck source=scripts/lib/deps.sh
. scripts/lib/deps.sh
pinpoll_ensure_packages libibverbs-dev librdmacm-dev libclang-dev pkg-config \
    rdma-core ibverbs-providers ibverbs-utils perftest iproute2 python3 shellcheck

step() { printf '\n==> %s\n' "$*"; }

if [ "$host" = 1 ]; then
    step "shellcheck: every script of the rig"
    shellcheck -x scripts/*.sh scripts/softroce-vm scripts/vm/* scripts/lib/*.sh scripts/fault/*.sh .ci/run
    step "cargo fmt --check"
    cargo fmt --all -- --check
    step "cargo clippy -D warnings"
    cargo clippy --workspace --all-targets -- -D warnings
    step "host tests"
    cargo test --workspace
    step "loom: every interleaving of the hand-off ring (engine/src/sys/handoff.rs)"
    # --cfg loom swaps the ring's atomics and slot cells for loom's model
    # checker; its own target directory keeps the ordinary builds' caches.
    # Only the `loom_tests` modules run: other tests would use loom's types
    # outside a model. A filter that matched nothing would pass: it must not.
    RUSTFLAGS="--cfg loom -D warnings" CARGO_TARGET_DIR=target/loom \
        cargo test -p pinpoll --release --lib -- loom_tests | tee target/loom.log
    grep -q '^test result: ok\. [1-9]' target/loom.log \
        || { echo "error: no loom test ran" >&2; exit 1; }
    step "build matrix: libclang 14/16/19, a dependent crate, rust-version"
    scripts/check-builds.sh
fi

# Every bench runs for real, briefly (a bench run is not a timing assertion:
# it only has to finish): the device-free ones here, the device ones in the
# guest below. Built once, with the bench profile users measure with.
bench_list="$top/target/pinpoll-benches.list"
if [ "$host" = 1 ] || [ "$device" = 1 ]; then
    step "building the benches"
    mkdir -p target
    cargo bench -p pinpoll-benches --no-run --message-format=json \
        | python3 scripts/lib/cargo_artifacts.py benches > "$bench_list"
    [ -s "$bench_list" ] || { echo "error: no bench binaries were built" >&2; exit 1; }
fi
if [ "$host" = 1 ]; then
    step "device-free benches, briefly"
    while IFS=$'\t' read -r name dir exe; do
        case $name in hotpath|verify) ;; *) continue ;; esac
        echo "--- bench $name"
        (cd "$dir" && "$exe" --bench --warm-up-time 0.05 --measurement-time 0.1) | grep -E 'time:|thrpt:' | head -40
        [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "error: bench $name failed" >&2; exit 1; }
    done < "$bench_list"
fi

[ "$device" = 1 ] || exit 0

# The instruction-count guard needs valgrind and iai-callgrind's runner.
pinpoll_ensure_iai_runner

step "building the device tests"
# Build on the host (fast), then run the very same binaries in the guest,
# each from its package directory as cargo would.
# Under target/: the guest sees the work tree, but its /tmp is its own.
mkdir -p target
list="$top/target/pinpoll-device-tests.list"
cargo test --workspace --no-run --message-format=json \
    | python3 scripts/lib/cargo_artifacts.py tests > "$list"
[ -s "$list" ] || { echo "error: no test binaries were built" >&2; exit 1; }
# The device benches run in the guest with the tests.
awk -F'\t' '$1 == "latency" || $1 == "bandwidth" { print $2 "\t" $3 "\tbench" }
    $1 == "hot_path" { print $2 "\t" $3 "\tinstructions" }' "$bench_list" >> "$list"
echo "$(wc -l < "$list") test binaries"

step "device tests inside the SoftRoCE guest (scripts/softroce-vm)"
# The runner in the guest: every binary with --include-ignored; the summary
# line counts the tests each binary reported.
cat > "$top/target/pinpoll-device-tests.sh" <<'RUNNER'
#!/usr/bin/env bash
set -u
list=$1 passed=0 failed=0 bad=()
ibv_devinfo -d "${PINPOLL_DEVICE:?PINPOLL_DEVICE unset: not inside scripts/softroce-vm}" >/dev/null \
    || { echo "error: device $PINPOLL_DEVICE not usable in the guest" >&2; exit 1; }
while IFS=$'\t' read -r dir exe kind; do
    echo "--- $kind $(basename "$exe") (in ${dir#"$PWD"/})"
    if [ "$kind" = bench ] || [ "$kind" = instructions ]; then
        # Briefly, for real: criterion's benches with short windows; the
        # instruction-count guard as it is (callgrind counts, no window).
        if [ "$kind" = bench ]; then
            out=$(cd "$dir" && timeout 900 "$exe" --bench --warm-up-time 0.05 --measurement-time 0.1 2>&1)
        else
            out=$(cd "$dir" && timeout 1800 "$exe" --bench 2>&1)
        fi
        rc=$?
        printf '%s\n' "$out" | grep -E 'time:|thrpt:|Instructions:|Limit|Performance has regressed|error|panicked' | head -60
        if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); bad+=("$(basename "$exe")"); printf '%s\n' "$out" | tail -30; fi
        continue
    fi
    if [ "$kind" = example ]; then
        # Examples are programs a user runs: each must exit 0 on the device.
        out=$(cd "$dir" && timeout 300 "$exe" 2>&1)
        rc=$?
        printf '%s\n' "$out" | tail -5
        if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); bad+=("$(basename "$exe")"); fi
        continue
    fi
    out=$(cd "$dir" && "$exe" --include-ignored --test-threads="${PINPOLL_TEST_THREADS:-2}" 2>&1)
    rc=$?
    printf '%s\n' "$out" | grep -E '^(test |test result|failures:|---- |thread |  left|  right|error)' || true
    p=$(printf '%s\n' "$out" | sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p' | tail -1)
    f=$(printf '%s\n' "$out" | sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p' | tail -1)
    passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
    if [ "$rc" -ne 0 ]; then
        bad+=("$(basename "$exe")")
        [ "${f:-0}" -gt 0 ] || failed=$((failed + 1))
        printf '%s\n' "$out" | tail -40
    fi
done < "$list"
echo
echo "device: $passed passed, $failed failed"
[ "${#bad[@]}" -eq 0 ] || { echo "failing binaries: ${bad[*]}" >&2; exit 1; }
RUNNER
chmod +x "$top/target/pinpoll-device-tests.sh"
scripts/softroce-vm --timeout "${PINPOLL_TEST_TIMEOUT:-2400}" -- "$top/target/pinpoll-device-tests.sh" "$list"

step "power loss: a guest's power cut at three points of a transfer (scripts/power-loss.sh)"
# filexfer's durability promise, on ext4 on a virtio-blk image: four boots.
scripts/power-loss.sh "$top/target/debug"

step "two-guest fault suite (scripts/softroce-vm --hosts 2)"
# Faults that need a real link between two machines (tc netem, a peer
# killed, stopped or restarted, a device deleted, too many clients, load);
# see scripts/fault-suite.sh (and FAULT_SUITE_DISARM=1 there). About 30
# minutes in the TCG guests.
scripts/softroce-vm --hosts 2 --timeout "${PINPOLL_FAULT_TIMEOUT:-2700}" -- scripts/fault-suite.sh "$top/target/debug"
