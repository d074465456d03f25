# srp-login.sh - the Linux SRP initiator (ib_srp) logs in to ferrited's SRP
# port over RDMA/CM on soft-RoCE (rdma_rxe, the verbs provider) as Linux sends
# it: the compact RDMA/CM login layout, immediate data requested, two channels
# (ch_count=2); the request limit it was granted; 16 MiB written and read back
# identical; ferrited lists one SRP nexus with two channels.
. "$(dirname "$0")/lib.sh"
rxe_pair
modprobe_all ib_srp sd_mod
srp_config /tmp/srp.json '{ "name": "mem0", "handler": "vdisk_nullio", "mem": true, "size": 268435456 }' \
    '{ "lun": 0, "device": "mem0" }'
start_ferrited --config /tmp/srp.json
wait_srp_listening
step "login over RDMA/CM with ch_count=2"
srp_login "ch_count=2"
D=$(srp_disks 1) || fail "no SCSI disk appeared after the SRP login: $(dmesg | grep -i srp | tail -5)"
step "disk /dev/$D"
H=$(ls -d /sys/class/scsi_disk/*/device/block/$D | sed 's#.*/scsi_disk/\([0-9]*\):.*#\1#')
S=/sys/class/scsi_host/host$H
[ "$(cat $S/proc_name 2>/dev/null)" = ib_srp ] || fail "/dev/$D is not an ib_srp disk"
ch=$(cat $S/ch_count); lim=$(cat $S/req_lim)
step "ib_srp host$H: ch_count=$ch req_lim=$lim"
[ "$ch" -eq 2 ] || fail "ib_srp has $ch channels, not 2"
[ "$lim" -gt 1 ] || fail "request limit $lim"
dmesg | grep -q "using immediate data" || fail "ib_srp does not use immediate data: $(dmesg | grep -i srp | tail -3)"
step "kernel: $(dmesg | grep -m1 'using immediate data' | cut -c1-100)"
dd if=/dev/urandom of=/tmp/pattern bs=1M count=16 2>/dev/null
check "16 MiB write" dd if=/tmp/pattern of=/dev/$D bs=1M oflag=direct
check "16 MiB read" dd if=/dev/$D of=/tmp/back bs=1M count=16 iflag=direct
cmp /tmp/pattern /tmp/back || fail "the 16 MiB read back differ from what was written"
step "16 MiB written and read back identical"
# small writes go as immediate data, large ones are fetched with RDMA READ
fio_verify small-imm /dev/$D --rw=randwrite --bs=4k --iodepth=8 --size=8m
ctl sessions >/out/sessions.txt 2>&1 || fail "ferritectl sessions"
cat /out/sessions.txt
grep -q "^srp srp0 .*channels=2" /out/sessions.txt || fail "ferritectl sessions does not list one SRP nexus with two channels"
pass "Linux SRP login over RDMA/CM, immediate data, two channels, 16 MiB round trip"
