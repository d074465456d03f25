# iscsi-fio.sh - fio with verify=crc32c through open-iscsi on a ferrited
# fileio LUN: 4 KiB random writes at queue depth 1, 32 and 128 and 1 MiB
# sequential writes at queue depth 8, each read back and verified; then a
# mixed random read/write job verifying as it goes. The session's queue depth
# is raised to 128 so the deep jobs reach the target. FIO_4K_MB (32) and
# FIO_SEQ_MB (128) size the deep 4 KiB jobs and the 1 MiB job.
# Runs over TCP, or over iSER with LAB_ISCSI_TRANSPORT=iser (lib.sh: iscsi_transport).
. "$(dirname "$0")/lib.sh"
iscsi_transport
IQN=iqn.2026-12.org.ferrite.lab:fio
cat >/tmp/fio.json <<JSON
{ "devices": [ { "name": "f0", "handler": "vdisk_fileio", "filename": "/tmp/fio.img", "size": 268435456 } ],
  "targets": { "iscsi": [ { "name": "$IQN", "portals": [$PORTALS], "luns": [ { "lun": 0, "device": "f0" } ] } ] } }
JSON
start_ferrited --config /tmp/fio.json
wait_portal
start_iscsid
discover
iscsiadm -m node -T $IQN -o update -n node.session.queue_depth -v 128 >/dev/null
iscsiadm -m node -T $IQN -o update -n node.session.cmds_max -v 256 >/dev/null
check "login" iscsiadm -m node -T $IQN -p $P --login
check_transport
D=$(wait_disks $IQN 1) || fail "no disk"
qd=$(cat /sys/block/$D/device/queue_depth)
[ "$qd" -ge 128 ] || fail "the disk's queue depth is $qd, not 128"
M4=${FIO_4K_MB:-32}
MS=${FIO_SEQ_MB:-128}
fio_verify rand4k-qd1 /dev/$D --rw=randwrite --bs=4k --iodepth=1 --size=4m
fio_verify rand4k-qd32 /dev/$D --rw=randwrite --bs=4k --iodepth=32 --size=${M4}m --offset=32m
fio_verify rand4k-qd128 /dev/$D --rw=randwrite --bs=4k --iodepth=128 --size=${M4}m --offset=64m
fio_verify seq1m-qd8 /dev/$D --rw=write --bs=1m --iodepth=8 --size=${MS}m --offset=128m
fio_verify mixed-qd32 /dev/$D --rw=randrw --bs=4k --iodepth=32 --size=$((M4 / 2))m --offset=96m --verify_backlog=64
pass "fio verify: 4 KiB random at QD 1/32/128, 1 MiB sequential at QD 8, mixed at QD 32"
