# iscsi-trim.sh - fstrim through open-iscsi on a thin fileio LUN: the kernel
# sees a thin-provisioned disk that takes UNMAP, and after a file is deleted
# and the filesystem trimmed, the image's allocated blocks shrink.
. "$(dirname "$0")/lib.sh"
ip link set lo up
IQN=iqn.2026-12.org.ferrite.lab:thin
cat >/tmp/thin.json <<JSON
{ "devices": [ { "name": "t0", "handler": "vdisk_fileio", "filename": "/tmp/thin.img", "size": 536870912, "thin_provisioned": true } ],
  "targets": { "iscsi": [ { "name": "$IQN", "portals": ["127.0.0.1:3260"], "luns": [ { "lun": 0, "device": "t0" } ] } ] } }
JSON
modprobe_all ext4
start_ferrited --config /tmp/thin.json
wait_port 127.0.0.1 3260
start_iscsid
check "discovery" iscsiadm -m discovery -t st -p 127.0.0.1:3260
check "login" iscsiadm -m node -T $IQN -p 127.0.0.1:3260 --login
D=$(wait_disks $IQN 1) || fail "no disk"
pm=$(cat /sys/block/$D/device/scsi_disk/*/provisioning_mode)
step "kernel's provisioning mode for /dev/$D: $pm"
[ "$pm" = unmap ] || fail "the kernel does not use UNMAP on the thin LUN (provisioning_mode=$pm)"
[ "$(cat /sys/block/$D/queue/discard_max_bytes)" -gt 0 ] || fail "no discard on /dev/$D"
alloc() { du -k /tmp/thin.img | cut -f1; }
check "mkfs.ext4" mkfs.ext4 -q -F -E nodiscard /dev/$D
mkdir -p /mnt/t; check "mount" mount -o nodiscard /dev/$D /mnt/t
check "write 128 MiB" dd if=/dev/urandom of=/mnt/t/big bs=1M count=128 conv=fsync
sync
before=$(alloc)
rm /mnt/t/big; sync
out=$(fstrim -v /mnt/t) || fail "fstrim"
step "$out"
sync
after=$(alloc)
step "image allocated: $before KiB before the trim, $after KiB after"
[ $((before - after)) -ge $((100 * 1024)) ] || fail "the trim freed only $((before - after)) KiB of the 128 MiB deleted"
check "umount" umount /mnt/t
e2fsck -f -n /dev/$D >/out/fsck.log 2>&1 || { cat /out/fsck.log; fail "e2fsck after the trim"; }
pass "fstrim freed $(( (before - after) / 1024 )) MiB of the image"
