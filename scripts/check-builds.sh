#!/usr/bin/env bash
# scripts/check-builds.sh — the builds a user's machine may attempt, proved
# (scripts/test.sh runs it):
#
#   1. the engine against every supported libclang: Debian 12's
#      libclang-14-dev, libclang-16-dev and libclang-19-dev (bindgen runs
#      over the system's verbs headers with each);
#   2. a crate outside this workspace that depends on `pinpoll`, built with
#      a plain `cargo build` (no environment variables) and run: it loads
#      the built-in profiles, as any dependent crate would; its echo server
#      and client (public API only) run in the guest from scripts/test.sh;
#   3. the engine without default features, and with each alone, clean
#      under clippy, and free of the dependencies the features gate;
#   4. no dependency declares a rust-version above the workspace's (clippy's
#      incompatible_msrv lint checks our own code against it).
#
#   scripts/check-builds.sh [--help]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD

case ${1:-} in
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
esac

# shellcheck source=scripts/lib/deps.sh
. scripts/lib/deps.sh
pinpoll_ensure_packages libibverbs-dev librdmacm-dev pkg-config python3 \
    libclang-14-dev libclang-16-dev libclang-19-dev

step() { printf '\n==> %s\n' "$*"; }

# The libclang that the newest run of the binding's build script in target
# directory $1 reported.
bindings_libclang() {
    local output
    output=$(find "$1"/debug/build -path '*/pinpoll-verbs-sys-*/output' -printf '%T@ %p\n' |
        sort -n | tail -1 | cut -d' ' -f2-)
    sed -n 's/^cargo:rustc-env=PINPOLL_VERBS_SYS_LIBCLANG=//p' "$output"
}

# One target directory: switching LIBCLANG_PATH re-runs only the binding's
# build script (it declares rerun-if-env-changed), not every dependency.
for version in 14 16 19; do
    step "cargo check -p pinpoll with libclang $version"
    LIBCLANG_PATH=/usr/lib/llvm-$version/lib CARGO_TARGET_DIR="$top/target/check-libclang" \
        cargo check -p pinpoll
    # The build script runs again whenever LIBCLANG_PATH changes, and says
    # which libclang generated the bindings; cargo keeps what it printed.
    used=$(bindings_libclang "$top/target/check-libclang")
    case $used in
        *"version $version."*) echo "bindings generated with: $used" ;;
        *) echo "error: expected libclang $version, the build script reported: ${used:-nothing}" >&2; exit 1 ;;
    esac
done

step "a crate outside the workspace that depends on pinpoll (plain cargo build)"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src"
cat > "$scratch/Cargo.toml" <<EOF
[package]
name = "depends-on-pinpoll"
version = "0.1.0"
edition = "2021"

[dependencies]
pinpoll = { path = "$top/engine" }
EOF
cat > "$scratch/src/main.rs" <<'EOF'
fn main() -> Result<(), pinpoll::Error> {
    for name in ["latency", "throughput", "softroce"] {
        let cfg = pinpoll::EngineConfig::load(name)?;
        println!("{name}: batch_size {} slot_size {}", cfg.batch_size, cfg.slot_size);
    }
    Ok(())
}
EOF
# An echo server and its client, written against the public API alone (the
# engine's examples, built here as a dependent's own programs): scripts/
# test.sh runs the client, which starts the server, in the guest.
mkdir -p "$scratch/src/bin"
cp engine/examples/echo_server.rs engine/examples/echo_client.rs "$scratch/src/bin/"
# Its own lock file and target directory, reused between runs; run from the
# scratch directory, so nothing of this checkout is on the way.
(cd "$scratch" && env -u LIBCLANG_PATH -u PINPOLL_PROFILE_DIR CARGO_TARGET_DIR="$top/target/check-dependent" \
    cargo build --quiet --bins &&
    env -u PINPOLL_PROFILE_DIR "$top/target/check-dependent/debug/depends-on-pinpoll")
for bin in echo_server echo_client; do
    [ -x "$top/target/check-dependent/debug/$bin" ] ||
        { echo "error: the dependent crate's $bin was not built" >&2; exit 1; }
done
# With several installed, bindgen takes the newest libclang by itself.
used=$(bindings_libclang "$top/target/check-dependent")
case $used in
    *"version 19."*) echo "bindings generated with: $used" ;;
    *) echo "error: the plain build used ${used:-no} libclang, not 19" >&2; exit 1 ;;
esac

step "the minimal build: pinpoll without its default features (profiles, engine)"
# Direct mode alone, then each feature alone; clippy, so code that only a
# feature uses is cfg'd, not dead. In the workspace's target directory,
# where clippy already checked the dependencies (a directory of its own
# cost a cold machine a build of them: 36 s of its 50).
for features in "" profiles engine; do
    echo "features: ${features:-none}"
    cargo clippy --quiet -p pinpoll --no-default-features ${features:+--features "$features"} -- -D warnings
done
# Its documentation builds too (links to what a feature gates excepted).
RUSTDOCFLAGS="-D warnings" cargo doc --quiet -p pinpoll --no-deps --no-default-features
# What the features gate must really leave the build.
minimal=$(cargo tree -p pinpoll --no-default-features -e normal --prefix none --format '{p}' | cut -d' ' -f1 | sort -u)
for dep in serde toml rtrb crossbeam core_affinity; do
    if grep -qx "$dep" <<< "$minimal"; then
        echo "error: pinpoll without default features still depends on $dep" >&2
        exit 1
    fi
done
echo "without default features: $(wc -l <<< "$minimal") crates, none of serde, toml, rtrb, crossbeam, core_affinity"

step "dependencies' rust-version against the workspace's"
cargo metadata --format-version 1 | python3 -c '
import json, sys
meta = json.load(sys.stdin)
def version(v):
    return tuple(int(x) for x in v.split("."))
ours = {p["name"]: p["rust_version"] for p in meta["packages"] if p["source"] is None}
floor = max(version(v) for v in ours.values() if v)
late = [(p["name"], p["version"], p["rust_version"]) for p in meta["packages"]
        if p["source"] is not None and p.get("rust_version") and version(p["rust_version"]) > floor]
missing = sorted(n for n, v in ours.items() if not v)
if missing:
    sys.exit("error: no rust-version in: " + ", ".join(missing))
if late:
    sys.exit("error: dependencies need a newer Rust than rust-version " + ".".join(map(str, floor)) + ": " +
             ", ".join(f"{n} {v} (rust {r})" for n, v, r in late))
print("rust-version", ".".join(map(str, floor)), "covers every dependency")
'
