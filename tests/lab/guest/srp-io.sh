# srp-io.sh - I/O through the Linux SRP initiator on ferrited's SRP port over
# rdma_rxe: the fio verify matrix (4 KiB random at QD 1, 32 and 128, 1 MiB
# sequential at QD 8), ext4 mkfs, files checksummed across a remount, fsck
# clean, and a LUN reset with `sg_reset -d` answered, the disk in service after.
. "$(dirname "$0")/lib.sh"
rxe_pair
modprobe_all ib_srp sd_mod ext4
srp_config /tmp/srp.json '{ "name": "f0", "handler": "vdisk_fileio", "filename": "/tmp/srp0.img", "size": 268435456 }' \
    '{ "lun": 0, "device": "f0" }'
start_ferrited --config /tmp/srp.json
wait_srp_listening
srp_login "ch_count=2,queue_size=128"
D=$(srp_disks 1) || fail "no SCSI disk appeared after the SRP login"
step "disk /dev/$D, queue depth $(cat /sys/block/$D/device/queue_depth)"
fio_verify rand4k-qd1 /dev/$D --rw=randwrite --bs=4k --iodepth=1 --size=4m
fio_verify rand4k-qd32 /dev/$D --rw=randwrite --bs=4k --iodepth=32 --size=32m --offset=32m
fio_verify rand4k-qd128 /dev/$D --rw=randwrite --bs=4k --iodepth=128 --size=32m --offset=64m
fio_verify seq1m-qd8 /dev/$D --rw=write --bs=1m --iodepth=8 --size=128m --offset=128m
step "ext4"
check "mkfs.ext4" mkfs.ext4 -q -F /dev/$D
mkdir -p /mnt/t; check "mount" mount /dev/$D /mnt/t
for i in $(seq 1 8); do
    dd if=/dev/urandom bs=1M count=8 2>/dev/null | tee /mnt/t/f$i | sha256sum | sed "s#-#/mnt/t/f$i#"
done >/tmp/sums
check "umount" umount /mnt/t
check "remount" mount /dev/$D /mnt/t
sha256sum -c --quiet /tmp/sums || fail "checksums changed across the remount"
check "umount" umount /mnt/t
e2fsck -f -n /dev/$D >/out/fsck.log 2>&1 || { cat /out/fsck.log; fail "e2fsck"; }
step "ext4: 64 MiB checksummed across a remount, fsck clean"
step "sg_reset -d"
# ib_srp sends SRP_TSK_MGMT LOGICAL UNIT RESET and waits for its SRP_RSP;
# sg_reset succeeds only if the response says the function completed.
check "sg_reset -d" sg_reset -d /dev/$D
dmesg | grep -q "reset_device called" || fail "ib_srp never sent the LUN reset"
step "kernel: $(dmesg | grep -m1 'reset_device called' | cut -c1-100)"
check "I/O after the reset" dd if=/dev/$D of=/dev/null bs=1M count=4 iflag=direct
e2fsck -f -n /dev/$D >/dev/null 2>&1 || fail "the filesystem is damaged after the reset"
pass "SRP fio verify matrix, ext4, LUN reset"
