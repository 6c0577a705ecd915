#!/usr/bin/env bash
# scripts/check-publish.sh — the two published crates, proved publishable
# (scripts/test.sh runs it):
#
#   1. `cargo publish --dry-run` of pinpoll-verbs-sys and pinpoll together
#      (the engine's versioned dependency on the binding resolves against
#      the binding's own package);
#   2. the packaged crates, unpacked outside this checkout, build with
#      their tests, examples and doctests from the tarballs alone (cargo's
#      own verification builds only the library: this builds more);
#   3. their documentation builds as docs.rs builds it (`DOCS_RS` set) on a
#      machine with no rdma-core headers and no libclang: the binding then
#      uses engine/verbs-sys/src/docs_bindings.rs;
#   4. the binding's `links` key does not collide with another verbs
#      binding's (rust-ibverbs' ibverbs-sys links "ibverbs"): a crate that
#      depends on both resolves.
#
#   scripts/check-publish.sh               the checks above
#   scripts/check-publish.sh --regenerate  rewrite src/docs_bindings.rs from
#                                          this machine's headers
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
top=$PWD

regenerate=0
case ${1:-} in
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --regenerate) regenerate=1 ;;
    "") ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
esac

# shellcheck source=scripts/lib/deps.sh
. scripts/lib/deps.sh
pinpoll_ensure_packages libibverbs-dev librdmacm-dev libclang-dev pkg-config

step() { printf '\n==> %s\n' "$*"; }
docs_bindings=engine/verbs-sys/src/docs_bindings.rs

if [ "$regenerate" = 1 ]; then
    step "regenerating $docs_bindings from this machine's headers"
    out=$(cargo build -p pinpoll-verbs-sys --message-format=json |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed" and "pinpoll-verbs-sys" in m["package_id"]:
        print(m["out_dir"])')
    [ -f "$out/bindings.rs" ] || { echo "error: the build script wrote no bindings.rs" >&2; exit 1; }
    {
        echo "// Pre-generated bindings for documentation builds only (DOCS_RS set: no"
        echo "// rdma-core headers there); a program is always built from its own"
        echo "// system's headers. From libibverbs $(pkg-config --modversion libibverbs) and librdmacm"
        echo "// $(pkg-config --modversion librdmacm). Rewrite with: scripts/check-publish.sh --regenerate"
        cat "$out/bindings.rs"
    } > "$docs_bindings"
    echo "wrote $docs_bindings ($(wc -l < "$docs_bindings") lines)"
    exit 0
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Every build below shares the workspace's target directory: the
# dependencies the host tests built are reused (a cold CI machine built
# them a second time in a directory of its own, ~1 of its 60 minutes);
# the unpacked packages are crates of other paths, built apart.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$top/target}"

step "cargo publish --dry-run -p pinpoll-verbs-sys -p pinpoll"
# --no-verify: cargo's verification builds only the library from the
# tarball; step 2 builds it too, with everything else the tarball holds.
# --allow-dirty: a dry run of what is checked out, committed or not.
cargo publish --dry-run --no-verify --allow-dirty -p pinpoll-verbs-sys -p pinpoll
# The same two tarballs, where cargo package leaves them.
cargo package --no-verify --allow-dirty --quiet -p pinpoll-verbs-sys -p pinpoll
# --touch: the files get the time of extraction. With the archive's own
# times, older than the last run's build in the shared target directory,
# cargo took the unpacked sources for unchanged and tested the last run's
# library against this run's doctests.
for crate in pinpoll-verbs-sys pinpoll; do
    tar --touch -xzf "$CARGO_TARGET_DIR/package/$crate-0.1.0.crate" -C "$scratch"
done
for need in README.md LICENSE-MIT LICENSE-APACHE CHANGELOG.md; do
    for crate in pinpoll-verbs-sys pinpoll; do
        [ -f "$scratch/$crate-0.1.0/$need" ] || { echo "error: the $crate package has no $need" >&2; exit 1; }
    done
done
# The licences and the changelog are the workspace's own texts (a file
# holding only a path, a flattened symlink, once shipped in their place).
for need in LICENSE-MIT LICENSE-APACHE CHANGELOG.md; do
    for crate in pinpoll-verbs-sys pinpoll; do
        cmp -s "$scratch/$crate-0.1.0/$need" "$top/$need" \
            || { echo "error: the $crate package's $need is not the workspace's $need" >&2; exit 1; }
    done
done

step "the packaged crates build with their tests, examples and doctests from the tarballs"
# A workspace of the two unpacked packages, nothing of this checkout: the
# engine's versioned dependency on the binding resolves to the unpacked one.
cat > "$scratch/Cargo.toml" <<'EOF'
[workspace]
members = ["pinpoll-verbs-sys-0.1.0", "pinpoll-0.1.0"]
resolver = "2"

[patch.crates-io]
pinpoll-verbs-sys = { path = "pinpoll-verbs-sys-0.1.0" }
EOF
# The workspace's lock file: the dependencies at the versions the host
# tests built (cargo drops what the two packages do not use).
cp Cargo.lock "$scratch/Cargo.lock"
(cd "$scratch" && cargo test --workspace --all-targets --no-run && cargo test --workspace --doc --quiet)

step "the documentation as docs.rs builds it: no headers, no libclang"
# PKG_CONFIG and LIBCLANG_PATH point nowhere: a build script that still
# looked for either would fail here.
(cd "$scratch" && DOCS_RS=1 PKG_CONFIG=/nonexistent LIBCLANG_PATH=/nonexistent \
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps)

step "the links key beside rust-ibverbs' ibverbs-sys"
mkdir -p "$scratch/both/src"
echo 'fn main() {}' > "$scratch/both/src/main.rs"
cat > "$scratch/both/Cargo.toml" <<EOF
[package]
name = "depends-on-both-bindings"
version = "0.1.0"
edition = "2021"

[dependencies]
pinpoll-verbs-sys = { path = "$scratch/pinpoll-verbs-sys-0.1.0" }
ibverbs-sys = "0.3"

[workspace]
EOF
# Resolution alone finds a `links` collision; nothing is built.
(cd "$scratch/both" && cargo generate-lockfile --quiet)
echo "pinpoll-verbs-sys and ibverbs-sys resolve side by side"
