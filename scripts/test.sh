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

# Each step says when it began (minutes:seconds into the run): where a
# run's time goes, against CI's limit.
step() { printf '\n==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

if [ "$host" = 1 ]; then
    step "shellcheck: every script of the rig"
    shellcheck -x scripts/*.sh scripts/softroce-vm scripts/vm/* scripts/lib/*.sh scripts/fault/*.sh .ci/run
    step "python: the perftest comparison's arithmetic (scripts/lib/test_*.py)"
    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
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
    step "fuzzing: every decoder a peer reaches, 12 s a target (scripts/fuzz.sh)"
    pinpoll_ensure_cargo_fuzz
    scripts/fuzz.sh --seconds 12
    step "build matrix: libclang 14/16/19, a dependent crate, rust-version"
    scripts/check-builds.sh
    step "publishable: cargo publish --dry-run, the tarballs' tests, docs as docs.rs builds them"
    scripts/check-publish.sh
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
# The echo pair of a crate outside the workspace (scripts/check-builds.sh
# built it against the public API alone): its client starts its server.
dependent_echo=$top/target/check-dependent/debug/echo_client
if [ "$host" = 1 ]; then
    [ -x "$dependent_echo" ] || { echo "error: $dependent_echo was not built" >&2; exit 1; }
    printf '%s\t%s\texample\n' "$top" "$dependent_echo" >> "$list"
else
    echo "note: the dependent crate's echo pair runs only with the host steps (scripts/check-builds.sh builds it)"
fi

step "building the engine's tests with AddressSanitizer (nightly -Zsanitizer=address)"
# The engine's unit tests and its device tests (the model test of the public
# API among them) run a second time in the guest below, instrumented: an
# out-of-bounds or use-after-free access of the heap, the stack or a global
# by Rust code, C's through libc's intercepted calls, and leaks at exit
# fail them. Registered memory is mmap'ed and written by the NIC, which
# ASan cannot see: the model test's canaries watch that. --target keeps the
# flag off build scripts and proc-macros. Left out: record_decode (no
# device, no unsafe: decoding peer records in safe code) and zero_alloc,
# whose counted run preloads a malloc interposer ahead of ASan's runtime,
# which then refuses to start ("incompatible ASan runtimes"); what it
# drives runs here anyway.
pinpoll_ensure_nightly
asan_target=$(rustc +nightly -vV | sed -n 's/^host: //p')
# --cfg pinpoll_asan: a test that preloads the malloc-counting interposer
# (ASan's runtime refuses to start beside it) runs its work uncounted.
RUSTFLAGS="-Zsanitizer=address --cfg pinpoll_asan" CARGO_TARGET_DIR=target/asan \
    cargo +nightly test -p pinpoll --target "$asan_target" --tests --no-run --message-format=json \
    | python3 scripts/lib/cargo_artifacts.py tests \
    | awk -F'\t' '$3 == "test" && $2 !~ /\/(zero_alloc|record_decode)-[0-9a-f]+$/ { print $1 "\t" $2 "\tasan" }' > target/asan-tests.list
# The runtime must really be in them: ASan answers help=1 with its flags.
asan_lib=$(awk -F'\t' '$2 ~ /\/pinpoll-[0-9a-f]+$/ { print $2 }' target/asan-tests.list)
asan_flags=$( [ -z "$asan_lib" ] || ASAN_OPTIONS=help=1 "$asan_lib" --list 2>&1 )
if ! grep -q 'AddressSanitizer' <<< "$asan_flags"; then
    echo "error: the ASan build of the engine's unit tests is missing or not instrumented" >&2
    exit 1
fi
cat target/asan-tests.list >> "$list"
echo "$(wc -l < "$list") test binaries ($(wc -l < target/asan-tests.list) of them under ASan)"

step "device tests inside the SoftRoCE guest (scripts/softroce-vm)"
# The runner in the guest: every binary with --include-ignored; the summary
# line counts the tests each binary reported.
cat > "$top/target/pinpoll-device-tests.sh" <<'RUNNER'
#!/usr/bin/env bash
set -u
list=$1 passed=0 failed=0 bad=()
leaks_ok=$PWD/scripts/lib/lsan.supp
ibv_devinfo -d "${PINPOLL_DEVICE:?PINPOLL_DEVICE unset: not inside scripts/softroce-vm}" >/dev/null \
    || { echo "error: device $PINPOLL_DEVICE not usable in the guest" >&2; exit 1; }
took() { echo "    ($(basename "$exe"): $((SECONDS - t0)) s)"; }
while IFS=$'\t' read -r dir exe kind; do
    echo "--- $kind $(basename "$exe") (in ${dir#"$PWD"/})"
    t0=$SECONDS
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
        took
        continue
    fi
    asan=()
    # halt_on_error is ASan's default; leaks are checked at exit, but for
    # the ones made on purpose (scripts/lib/lsan.supp). The model test runs
    # its full 10 000 steps uninstrumented: here one sequence of 1 000.
    [ "$kind" = asan ] && asan=(env ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$leaks_ok"
        PINPOLL_MODEL_RUNS=1)
    if [ "$kind" = example ]; then
        # Examples are programs a user runs: each must exit 0 on the device.
        # A server (NAME_server) is a program of its own that its client
        # starts, as a user would run the two.
        case $(basename "$exe") in
            *_server | *_server-*) echo "    (started by its client)"; continue ;;
        esac
        out=$(cd "$dir" && timeout 300 "$exe" 2>&1)
        rc=$?
        printf '%s\n' "$out" | tail -5
        if [ "$rc" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); bad+=("$(basename "$exe")"); fi
        took
        continue
    fi
    out=$(cd "$dir" && "${asan[@]}" "$exe" --include-ignored --test-threads="${PINPOLL_TEST_THREADS:-2}" 2>&1)
    rc=$?
    printf '%s\n' "$out" | grep -E '^(test |test result|failures:|---- |thread |  left|  right|error|==[0-9]+==ERROR|SUMMARY: )' || true
    p=$(printf '%s\n' "$out" | sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\1/p' | tail -1)
    f=$(printf '%s\n' "$out" | sed -n 's/^test result: .* \([0-9]*\) passed; \([0-9]*\) failed.*/\2/p' | tail -1)
    passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
    if [ "$rc" -ne 0 ]; then
        bad+=("$(basename "$exe")")
        [ "${f:-0}" -gt 0 ] || failed=$((failed + 1))
        printf '%s\n' "$out" | tail -40
    fi
    took
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
