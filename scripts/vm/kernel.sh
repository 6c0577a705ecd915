# shellcheck shell=bash
# shellcheck disable=SC2034,SC2054 # sets the launcher's KERNEL INITRD ACCEL; qemu options are comma-separated words
# scripts/vm/kernel.sh — part of the launcher (scripts/softroce-vm), sourced
# by it: the guest kernel (Debian's package, fetched once into the cache),
# its vmlinux for a PVH boot, the initramfs around scripts/vm/init, and the
# acceleration. Sets KVER KDIR KERNEL INITRD ACCEL_MODE ACCEL; uses the
# launcher's CACHE, QEMU, MODPROBE, DEPMOD, BUSYBOX, VM_DIR and helpers.
# ---------------------------------------------------------------- cache: kernel
if [ -n "${PINPOLL_VM_CACHE:-}" ]; then
    CACHE=$PINPOLL_VM_CACHE
elif [ "$(id -u)" -eq 0 ] || [ -w /var/cache/pinpoll-vm ]; then
    CACHE=/var/cache/pinpoll-vm
else
    CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/pinpoll-vm
fi
mkdir -p "$CACHE" 2>/dev/null || die "cannot create cache dir $CACHE (set PINPOLL_VM_CACHE)"
CACHE=$(cd "$CACHE" && pwd -P)
KDIR=$CACHE/kernel
LOCKFD=
cache_lock() {
    [ -n "$LOCKFD" ] && return 0
    exec {LOCKFD}>>"$CACHE/.lock" || die "cannot write $CACHE/.lock (set PINPOLL_VM_CACHE to a writable dir)"
    if ! flock -n "$LOCKFD"; then
        echo "$PROG: waiting for another softroce-vm to finish building $CACHE ..." >&2
        flock -w 900 "$LOCKFD" || die "timed out waiting for lock $CACHE/.lock"
    fi
}
cache_unlock() { if [ -n "$LOCKFD" ]; then exec {LOCKFD}>&-; LOCKFD=; fi; }

newest_cached_kver() {
    local f best=
    for f in "$KDIR"/.complete-*; do
        [ -e "$f" ] || continue
        best=$(printf '%s\n%s\n' "$best" "${f##*/.complete-}" | sed '/^$/d' | sort -V | tail -1)
    done
    echo "$best"
}
resolve_kernel_pkg() {
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }') || true
    if [ -z "$pkg" ] && [ "$(id -u)" -eq 0 ]; then
        pinpoll_apt_update_once >&2 || true
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
            awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }') || true
    fi
    [ -n "$pkg" ] || die "cannot resolve Debian's linux-image-amd64 (apt-cache depends linux-image-amd64 printed no linux-image-*; run apt-get update as root, or set PINPOLL_VM_KVER)"
    echo "$pkg"
}
fetch_kernel() { # KVER, under lock
    local kver=$1 pkg="linux-image-$1" dl
    [ -e "$KDIR/.complete-$kver" ] && return 0
    echo "$PROG: fetching guest kernel $pkg into $KDIR (once) ..." >&2
    dl=$(mktemp -d "$CACHE/download.XXXXXX")
    # apt's sandbox user must be able to write the download dir.
    if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then chown _apt "$dl" 2>/dev/null || true; fi
    if ! (cd "$dl" && apt-get download -q "$pkg" >&2); then
        if [ "$(id -u)" -eq 0 ]; then
            pinpoll_apt_update_once >&2 || true
            (cd "$dl" && apt-get download -q "$pkg" >&2) || { rm -rf "$dl"; die "apt-get download $pkg failed"; }
        else
            rm -rf "$dl"
            die "apt-get download $pkg failed (as root, run: apt-get update)"
        fi
    fi
    mkdir -p "$KDIR"
    dpkg-deb -x "$dl"/"$pkg"_*.deb "$KDIR" || { rm -rf "$dl"; die "dpkg-deb -x failed for $pkg"; }
    rm -rf "$dl"
    { [ -r "$KDIR/boot/vmlinuz-$kver" ] && [ -d "$KDIR/lib/modules/$kver" ]; } ||
        die "$pkg did not contain boot/vmlinuz-$kver and lib/modules/$kver"
    "$DEPMOD" -b "$KDIR" "$kver" || die "depmod -b $KDIR $kver failed"
    touch "$KDIR/.complete-$kver"
}

if [ -n "${PINPOLL_VM_KVER:-}" ]; then
    KVER=$PINPOLL_VM_KVER
else
    KVER=
    [ "${PINPOLL_VM_REFRESH:-0}" = 1 ] || KVER=$(newest_cached_kver)
    if [ -z "$KVER" ]; then KVER=$(resolve_kernel_pkg); KVER=${KVER#linux-image-}; fi
fi
if [ ! -e "$KDIR/.complete-$KVER" ]; then cache_lock; fetch_kernel "$KVER"; fi
VMLINUZ=$KDIR/boot/vmlinuz-$KVER
[ -r "$VMLINUZ" ] || die "cannot read $VMLINUZ"

# Boot the uncompressed ELF vmlinux through its PVH entry point when the kernel
# has one: under TCG that skips seconds of in-guest decompression and real-mode
# setup. Extracted once from the bzImage (like the kernel's extract-vmlinux).
offsets() { # FILE HEXMAGIC -> byte offsets of MAGIC in FILE (first few)
    local pat='' k
    for ((k = 0; k < ${#2}; k += 2)); do pat+="\\x${2:k:2}"; done
    if ! LC_ALL=C grep -obUaP "$pat" "$1" 2>/dev/null | cut -d: -f1 | head -5; then
        od -An -v -tx1 -w1 "$1" | tr -d ' \n' | grep -ob "$2" | cut -d: -f1 |
            awk '$1 % 2 == 0 { print $1 / 2 }' | head -5
    fi
}
extract_vmlinux() { # BZIMAGE OUT
    local magic tool off
    for magic in 'fd377a585a00:xz -dc' '28b52ffd:zstd -qdc' '1f8b0800:gzip -dc'; do
        tool=${magic#*:} magic=${magic%%:*}
        for off in $(offsets "$1" "$magic"); do
            tail -c +$((off + 1)) "$1" | $tool >"$2" 2>/dev/null
            [ "$(head -c 4 "$2" 2>/dev/null | od -An -tx1 | tr -d ' ')" = 7f454c46 ] && return 0
        done
    done
    return 1
}
KERNEL=$VMLINUZ
VMLINUX=$KDIR/boot/vmlinux-$KVER
if [ "${PINPOLL_VM_PVH:-1}" = 1 ] && grep -q '^CONFIG_PVH=y' "$KDIR/boot/config-$KVER" 2>/dev/null; then
    if [ ! -s "$VMLINUX" ]; then
        cache_lock
        if [ ! -s "$VMLINUX" ]; then
            say "extracting $VMLINUX for PVH boot"
            if extract_vmlinux "$VMLINUZ" "$VMLINUX.tmp.$$"; then
                mv -f "$VMLINUX.tmp.$$" "$VMLINUX"
            else
                rm -f "$VMLINUX.tmp.$$"
                warn "could not extract vmlinux from $VMLINUZ; booting the bzImage (slower)"
            fi
        fi
    fi
    [ -s "$VMLINUX" ] && KERNEL=$VMLINUX
fi

# ---------------------------------------------------------------- cache: initramfs
# Stage 1 (busybox, in the initramfs): load virtio/9p modules, mount the host
# root read-only, a tmpfs on /run and the run dir on /run/pinpoll, then
# switch_root to bash running /run/pinpoll/stage2 (written for every run).
INITRAMFS_MODULES="virtio_pci virtio_console 9p 9pnet_virtio"
STAMP=$( { cat "$VM_DIR/init"; echo "$INITRAMFS_MODULES"; cksum <"$BUSYBOX"; } | sha256sum | cut -c1-12)
INITRD=$CACHE/initramfs-$KVER-$STAMP.cpio.gz
build_initramfs() {
    local w f m deps=
    for m in $INITRAMFS_MODULES; do
        f=$("$MODPROBE" -d "$KDIR" -S "$KVER" --show-depends "$m") || die "module $m not found for $KVER"
        deps+="$f"$'\n'
    done
    w=$(mktemp -d "$CACHE/initramfs.XXXXXX")
    mkdir -p "$w/bin" "$w/modules"
    cp "$BUSYBOX" "$w/bin/busybox"
    cp "$VM_DIR/init" "$w/init"
    chmod 755 "$w/init"
    : >"$w/modules/order"
    # busybox insmod may not read compressed modules: store them decompressed.
    while read -r f; do
        m=${f##*/}
        case $f in
        *.ko.xz) m=${m%.xz}; xz -dc "$f" >"$w/modules/$m" ;;
        *.ko.zst) m=${m%.zst}; zstd -qdc "$f" >"$w/modules/$m" ;;
        *.ko.gz) m=${m%.gz}; gzip -dc "$f" >"$w/modules/$m" ;;
        *) cp "$f" "$w/modules/$m" ;;
        esac || { rm -rf "$w"; die "cannot copy module $f into the initramfs"; }
        echo "$m" >>"$w/modules/order"
    done < <(awk '$1 == "insmod" { print $2 }' <<<"$deps" | awk '!seen[$0]++')
    (cd "$w" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$w.cpio.gz" ||
        { rm -rf "$w" "$w.cpio.gz"; die "building the initramfs failed"; }
    mv -f "$w.cpio.gz" "$INITRD"
    rm -rf "$w"
    # Drop initramfs images of older versions of this script (not just now:
    # a concurrent run may be about to boot one).
    find "$CACHE" -maxdepth 1 -name 'initramfs-*.cpio.gz' ! -path "$INITRD" -mmin +120 -delete 2>/dev/null || true
}
if [ ! -s "$INITRD" ]; then
    cache_lock
    [ -s "$INITRD" ] || { say "building initramfs $INITRD"; build_initramfs; }
fi
cache_unlock

# ---------------------------------------------------------------- acceleration
ACCEL_MODE=${PINPOLL_VM_ACCEL:-tcg}
case $ACCEL_MODE in
tcg) ;;
kvm) { [ -r /dev/kvm ] && [ -w /dev/kvm ]; } || die "PINPOLL_VM_ACCEL=kvm but /dev/kvm is not usable" ;;
auto)
    ACCEL_MODE=tcg
    if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
        probe=$CACHE/accel-probe-$KVER-$("$QEMU" --version | head -1 | cksum | cut -d' ' -f1)
        if [ ! -s "$probe" ]; then
            echo "$PROG: probing KVM (once, at most 20 s) ..." >&2
            if PINPOLL_VM_ACCEL=kvm PINPOLL_VM_BOOT_TIMEOUT=20 bash "$SCRIPT_DIR/softroce-vm" --timeout 30 -- true >/dev/null 2>&1; then
                echo kvm >"$probe.tmp.$$"
            else
                echo tcg >"$probe.tmp.$$"
            fi
            mv -f "$probe.tmp.$$" "$probe" 2>/dev/null || true
        fi
        ACCEL_MODE=$(cat "$probe" 2>/dev/null || echo tcg)
        say "accel probe result ($probe): $ACCEL_MODE"
    fi
    ;;
*) echo "$PROG: PINPOLL_VM_ACCEL must be tcg, kvm or auto" >&2; exit 2 ;;
esac
if [ "$ACCEL_MODE" = kvm ]; then
    ACCEL=(-accel kvm -cpu max,-arch-capabilities) # plain max: "failed to set MSR 0x10a" on some hosts
else
    ACCEL=(-accel tcg,thread=multi -cpu max)
fi

avail=$(awk '$1 == "MemAvailable:" { print int($2 / 1024) }' /proc/meminfo 2>/dev/null || echo 0)
if [ "${avail:-0}" -gt 0 ] && [ $((HOSTS * MEM)) -gt "$avail" ]; then
    warn "$HOSTS guest(s) x $MEM MiB is more than the $avail MiB available (use --mem)"
fi

