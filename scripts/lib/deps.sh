# shellcheck shell=bash
# scripts/lib/deps.sh: make sure Debian packages are installed.
#
#   . scripts/lib/deps.sh
#   pinpoll_ensure_packages qemu-system-x86 cpio ...
#
# For each package name, dpkg-query tells whether it is installed. Missing
# ones are installed as root with
#   apt-get update            (once per process tree, see PINPOLL_APT_UPDATED)
#   apt-get install -y --no-install-recommends PKG...
# When not root, the exact command to run is printed and the calling script
# exits 1. Generic: any script of the project may source this file.
#
# Other functions:
#   pinpoll_missing_packages PKG...  print the missing ones (one a line), no side effects
#   pinpoll_apt_update_once          run `apt-get update` once (root only)

# Guard against double sourcing.
if [ -n "${__PINPOLL_DEPS_SH:-}" ]; then return 0; fi
__PINPOLL_DEPS_SH=1

pinpoll_missing_packages() {
    [ "$#" -eq 0 ] && return 0
    # One dpkg-query call for all names; unknown names print nothing.
    local installed
    installed=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "$@" 2>/dev/null |
        awk '$2 == "installed" { print $1 }') || true
    local p
    for p in "$@"; do
        grep -qxF -- "$p" <<<"$installed" || printf '%s\n' "$p"
    done
}

pinpoll_apt_update_once() {
    if [ "${PINPOLL_APT_UPDATED:-}" = 1 ]; then return 0; fi
    echo "+ apt-get update" >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 || {
        echo "error: apt-get update failed" >&2
        return 1
    }
    export PINPOLL_APT_UPDATED=1
}

pinpoll_ensure_packages() {
    if ! command -v dpkg-query >/dev/null 2>&1; then
        echo "error: dpkg-query not found: this helper only knows Debian/Ubuntu (needed: $*)" >&2
        exit 1
    fi
    local missing
    mapfile -t missing < <(pinpoll_missing_packages "$@")
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: missing packages: ${missing[*]}" >&2
        echo "install them with:" >&2
        echo "  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi
    echo "installing missing packages: ${missing[*]}" >&2
    pinpoll_apt_update_once || exit 1
    echo "+ apt-get install -y --no-install-recommends ${missing[*]}" >&2
    if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
            --no-install-recommends "${missing[@]}" >&2; then
        echo "error: apt-get install failed for: ${missing[*]}" >&2
        exit 1
    fi
    mapfile -t missing < <(pinpoll_missing_packages "$@")
    if [ "${#missing[@]}" -ne 0 ]; then
        echo "error: still missing after apt-get install: ${missing[*]}" >&2
        exit 1
    fi
}

# valgrind and iai-callgrind's runner of the very version the benches link
# (benches/Cargo.toml pins it): the instruction-count benches need both.
pinpoll_ensure_iai_runner() {
    pinpoll_ensure_packages valgrind
    local want have
    want=$(sed -n 's/^iai-callgrind = "=\(.*\)"/\1/p' benches/Cargo.toml)
    [ -n "$want" ] || { echo "error: benches/Cargo.toml pins no iai-callgrind version" >&2; exit 1; }
    # (The runner has no --version of its own: it checks the crate's.)
    have=$(cargo install --list | sed -n 's/^iai-callgrind-runner v\([^:]*\):$/\1/p')
    if [ "$have" != "$want" ] || ! command -v iai-callgrind-runner >/dev/null; then
        echo "+ cargo install iai-callgrind-runner --version $want --locked" >&2
        cargo install iai-callgrind-runner --version "$want" --locked
    fi
}

# A nightly toolchain, for the AddressSanitizer run and the fuzzers
# (-Zsanitizer=address and libFuzzer's instrumentation are nightly-only).
pinpoll_ensure_nightly() {
    rustc +nightly -vV >/dev/null 2>&1 && return 0
    command -v rustup >/dev/null \
        || { echo "error: the ASan run and the fuzzers need a nightly Rust toolchain, and rustup is not here to install one" >&2; exit 1; }
    echo "+ rustup toolchain install nightly --profile minimal" >&2
    rustup toolchain install nightly --profile minimal
}

# cargo-fuzz, for scripts/fuzz.sh; a C++ compiler builds libFuzzer itself.
# cargo-fuzz is pinned, as the runner above is: the fuzz runs of every
# machine drive libFuzzer the same way.
PINPOLL_CARGO_FUZZ_VERSION=0.13.2
pinpoll_ensure_cargo_fuzz() {
    pinpoll_ensure_packages g++
    pinpoll_ensure_nightly
    local have
    have=$(cargo install --list | sed -n 's/^cargo-fuzz v\([^:]*\):$/\1/p')
    if [ "$have" != "$PINPOLL_CARGO_FUZZ_VERSION" ] || ! command -v cargo-fuzz >/dev/null; then
        echo "+ cargo +nightly install cargo-fuzz --version $PINPOLL_CARGO_FUZZ_VERSION --locked" >&2
        cargo +nightly install cargo-fuzz --version "$PINPOLL_CARGO_FUZZ_VERSION" --locked
    fi
}
