# iscsi-live.sh - configuration changed under a logged-in Linux initiator: a
# LUN added with ferritectl appears after `iscsiadm -m session --rescan` and
# the kernel logs the unit attention (REPORTED LUNS DATA HAS CHANGED); a LUN
# resized with ferritectl is seen at its new size, the kernel logging
# CAPACITY DATA HAS CHANGED; I/O on the first LUN goes on throughout.
# Runs over TCP, or over iSER with LAB_ISCSI_TRANSPORT=iser (lib.sh: iscsi_transport).
. "$(dirname "$0")/lib.sh"
iscsi_transport
IQN=iqn.2026-12.org.ferrite.lab:live
T=/targets/iscsi/$IQN
cat >/tmp/live.json <<JSON
{ "devices": [ { "name": "f0", "handler": "vdisk_fileio", "filename": "/tmp/live0.img", "size": 67108864 } ],
  "targets": { "iscsi": [ { "name": "$IQN", "portals": [$PORTALS], "luns": [ { "lun": 0, "device": "f0" } ] } ] } }
JSON
start_ferrited --config /tmp/live.json
wait_portal
start_iscsid
discover
check "login" iscsiadm -m node -T $IQN -p $P --login
check_transport
D0=$(wait_disks $IQN 1) || fail "no disk"
step "LUN 0 is /dev/$D0"
fio --name=bg --filename=/dev/$D0 --direct=1 --ioengine=libaio --rw=randrw --bs=4k --iodepth=4 \
    --size=32m --verify=crc32c --verify_fatal=1 --loops=1000 --runtime=20 --time_based \
    >/out/fio-bg.log 2>&1 &
BG=$!

step "add a LUN"
check "add_device" ctl do /handlers/vdisk_fileio/mgmt "add_device f1 filename=/tmp/live1.img size=33554432"
check "add LUN 1" ctl do $T/luns/mgmt "add f1 1"
# The next command on LUN 0 gets the unit attention; the kernel logs it.
dd if=/dev/$D0 of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null
for i in $(seq 1 50); do dmesg | grep -q "LUN assignments on this target have changed" && break; sleep 0.2; done
dmesg | grep -q "LUN assignments on this target have changed" || fail "the kernel logged no REPORTED LUNS DATA HAS CHANGED"
step "kernel: $(dmesg | grep -m1 'LUN assignments on this target have changed' | cut -c1-120)"
check "rescan" iscsiadm -m session --rescan
D1=""; for i in $(seq 1 50); do D1=$(disk_of_lun $IQN 1); [ -n "$D1" ] && break; sleep 0.2; done
[ -n "$D1" ] || fail "LUN 1 did not appear after a rescan"
[ "$(cat /sys/block/$D1/size)" -eq 65536 ] || fail "LUN 1 has $(cat /sys/block/$D1/size) sectors, not 65536"
check "write to the new LUN" dd if=/dev/urandom of=/dev/$D1 bs=1M count=8 oflag=direct
step "LUN 1 appeared as /dev/$D1 (32 MiB)"

step "resize LUN 1 to 64 MiB"
check "resize" ctl set /devices/f1/size 67108864
dd if=/dev/$D1 of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null
for i in $(seq 1 50); do dmesg | grep -q "Capacity data has changed" && break; sleep 0.2; done
dmesg | grep -q "Capacity data has changed" || fail "the kernel logged no CAPACITY DATA HAS CHANGED"
step "kernel: $(dmesg | grep -m1 'Capacity data has changed' | cut -c1-120)"
size=0
for i in $(seq 1 50); do
    size=$(cat /sys/block/$D1/size); [ "$size" -eq 131072 ] && break
    [ "$i" -eq 10 ] && iscsiadm -m session --rescan >/dev/null
    sleep 0.2
done
[ "$size" -eq 131072 ] || fail "LUN 1 still has $size sectors after the resize and a rescan"
check "write past the old end" dd if=/dev/urandom of=/dev/$D1 bs=1M count=8 seek=48 oflag=direct
step "LUN 1 is 64 MiB: $(dmesg | grep -m1 'detected capacity change' | cut -c1-100)"

wait $BG || { tail -20 /out/fio-bg.log; fail "I/O on LUN 0 failed during the changes"; }
grep -q "err= 0" /out/fio-bg.log || { tail -20 /out/fio-bg.log; fail "fio on LUN 0 reported an error"; }
pass "LUN added and resized live, seen by the kernel; LUN 0 unaffected"
