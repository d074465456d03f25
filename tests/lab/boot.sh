#!/usr/bin/env bash
# boot.sh SCENARIO OUT_DIR - run one lab scenario: boot the installed Debian
# kernel under qemu on this machine's own root filesystem and run SCENARIO (a
# shell script, by path) as root inside it, then power off.
#
# The guest sees the host's / read-only over 9p with a tmpfs overlay on top, so
# the ferrited built here, open-iscsi, fio, rdma-core and the kernel's modules
# (iscsi_tcp, ib_srp, rdma_rxe, LIO's target_core_*, dm-multipath) are all
# there unchanged. OUT_DIR is shared read-write at /out: the scenario's logs
# and results come back through it. The console (the scenario's stdout and
# stderr) is saved as OUT_DIR/console.log.
#
# Exit status: the scenario's, as the guest wrote it to /out/rc; 90 when the
# guest never wrote one (kernel panic, hang, time limit), 2 when the lab cannot
# start at all (the reason is printed). Nothing here passes silently.
#
# Environment: LAB_CACHE (vmlinux + initramfs, built once per kernel; default
# /var/tmp/ferrite-lab), LAB_MEM_MB (2048), LAB_CPUS (2), LAB_TIMEOUT_S (900),
# OUT_DIR/env (sourced by the guest before the scenario: its variables).
#
# qemu runs TCG: nested KVM is not available on the machines this runs on.
# The uncompressed vmlinux (the compressed payload of Debian's bzImage) boots through
# its PVH entry point without firmware, a few seconds to a shell.
set -euo pipefail
die() { echo "lab: $*" >&2; exit 2; }
scenario=$(readlink -f "${1:?usage: boot.sh SCENARIO OUT_DIR}")
[[ -f $scenario ]] || die "no scenario $1"
out=${2:?usage: boot.sh SCENARIO OUT_DIR}
mkdir -p "$out"; out=$(cd "$out" && pwd)
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: install qemu-system-x86 (tools/install-test-deps does)"
command -v zstd >/dev/null || die "zstd missing: install zstd (tools/install-test-deps does)"
[[ -x /bin/busybox ]] || die "/bin/busybox missing: install busybox-static (tools/install-test-deps does)"
kver=$(find /boot -maxdepth 1 -name 'vmlinuz-*' -printf '%f\n' 2>/dev/null | sed 's/^vmlinuz-//' | sort -V | tail -1)
[[ -n $kver ]] || die "no /boot/vmlinuz-*: install linux-image-amd64 (tools/install-test-deps does)"
mods=/lib/modules/$kver/kernel
[[ -d $mods ]] || die "no $mods for kernel $kver"
cache=${LAB_CACHE:-/var/tmp/ferrite-lab}/$kver
mkdir -p "$cache"
# The initramfs is this script's own: a new version of the script builds a new one.
vmlinux=$cache/vmlinux initrd=$cache/initramfs-$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12).gz

# One builder at a time; a finished file is renamed into place.
exec 9>"$cache/.lock"
flock 9
if [[ ! -s $vmlinux ]]; then
    python3 - "/boot/vmlinuz-$kver" "$vmlinux.tmp" <<'PY' || die "cannot extract vmlinux from /boot/vmlinuz-$kver"
import bz2, lzma, subprocess, sys, zlib
# The bzImage's payload is the ELF vmlinux, compressed as the kernel's
# configuration chose (Debian: xz up to 6.1, zstd from 6.12). Each candidate
# frame is decompressed until one yields an ELF image.
def unzstd(b):
    return subprocess.run(["zstd", "-dcq"], input=b, capture_output=True).stdout
def unxz(b):
    return lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(b)
def unlzma(b):
    return lzma.LZMADecompressor(lzma.FORMAT_ALONE).decompress(b)
def ungzip(b):
    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(b)
def unbzip2(b):
    return bz2.BZ2Decompressor().decompress(b)
formats = [(b"\x28\xb5\x2f\xfd", unzstd), (b"\xfd7zXZ\x00", unxz),
           (b"\x1f\x8b\x08", ungzip), (b"BZh", unbzip2), (b"\x5d\x00\x00", unlzma)]
data = open(sys.argv[1], "rb").read()
for magic, unpack in formats:
    at = -1
    while (at := data.find(magic, at + 1)) >= 0:
        try:
            image = unpack(data[at:])
        except (lzma.LZMAError, zlib.error, OSError, EOFError, ValueError):
            continue
        if image[:4] == b"\x7fELF":
            open(sys.argv[2], "wb").write(image)
            sys.exit(0)
sys.exit("no compressed ELF image (zstd, xz, gzip, bzip2, lzma) in " + sys.argv[1])
PY
    mv "$vmlinux.tmp" "$vmlinux"
fi
if [[ ! -s $initrd ]]; then
    R=$(mktemp -d)
    mkdir -p "$R"/{bin,dev,proc,sys,lib/modules,mnt/host,mnt/root,mnt/rw}
    cp /bin/busybox "$R/bin/busybox"
    # What it takes to mount the host's root over virtio-9p with an overlay,
    # with every module they depend on, in load order (modules.dep decides;
    # a driver built into this kernel needs nothing).
    : >"$R/lib/modules/order"
    for m in virtio_pci 9pnet_virtio 9p overlay; do
        deps=$(modprobe -S "$kver" --show-depends "$m" 2>/dev/null) || { rm -rf "$R"; die "kernel $kver has no module $m"; }
        while read -r verb f _; do
            [[ $verb == insmod ]] || continue
            name=$(basename "$f"); name=${name%%.ko*}
            grep -qx "$name" "$R/lib/modules/order" && continue
            case $f in
                *.ko.xz) xz -dc "$f" >"$R/lib/modules/$name.ko" ;;
                *.ko.zst) zstd -dcq "$f" >"$R/lib/modules/$name.ko" ;;
                *) cp "$f" "$R/lib/modules/$name.ko" ;;
            esac
            echo "$name" >>"$R/lib/modules/order"
        done <<<"$deps"
    done
    cat >"$R/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
while read -r m; do insmod /lib/modules/$m.ko; done </lib/modules/order
fail() { echo "lab-init: $*"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /mnt/host || fail "9p root"
mount -t tmpfs tmpfs /mnt/rw && mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay overlay -o lowerdir=/mnt/host,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work /mnt/root || fail "overlay"
cp /lab-run /mnt/root/lab-run
for d in proc sys dev; do mount --move /$d /mnt/root/$d; done
exec switch_root /mnt/root /bin/sh /lab-run
INIT
    chmod +x "$R/init"
    # The second stage runs on the real root: the scenario, its status in /out/rc.
    cat >"$R/lab-run" <<'RUN'
#!/bin/sh
ln -sf /proc/self/fd /dev/fd; ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout; ln -sf /proc/self/fd/2 /dev/stderr
mount -t tmpfs tmpfs /run; mkdir -p /run/lock /out /tmp
mount -t tmpfs tmpfs /tmp
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /out
scenario=$(sed -n 's/.*lab=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -f /out/env ] && . /out/env
echo "lab: scenario $scenario starts"
bash "$scenario"; rc=$?
echo "lab: scenario exit status $rc"
echo $rc > /out/rc; sync; poweroff -f
RUN
    (cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$initrd.tmp"
    rm -rf "$R"
    mv "$initrd.tmp" "$initrd"
fi
flock -u 9
rm -f "$out/rc"; touch "$out/env"
set +e
timeout --kill-after=10 "${LAB_TIMEOUT_S:-900}" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -M q35 \
    -m "${LAB_MEM_MB:-2048}" -smp "${LAB_CPUS:-2}" -nographic -no-reboot -monitor none -serial stdio \
    -kernel "$vmlinux" -initrd "$initrd" \
    -append "console=ttyS0 quiet loglevel=1 panic=-1 lab=$scenario" \
    -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$out,mount_tag=out,security_model=none,multidevs=remap" \
    -nic none </dev/null >"$out/console.log" 2>&1
qrc=$?
set -e
[[ -s $out/rc ]] || { echo "lab: the guest never finished the scenario (qemu status $qrc; see $out/console.log)" >&2; exit 90; }
exit "$(cat "$out/rc")"
