# srp-restart.sh - ferrited killed (SIGKILL) under a verified write job from
# the Linux SRP initiator and started again: ib_srp reconnects (its
# reconnect_delay), the job finishes, and its verify pass finds every block
# it wrote, acknowledged before or after the kill, on the write-through LUN.
. "$(dirname "$0")/lib.sh"
rxe_pair
modprobe_all ib_srp sd_mod
srp_config /tmp/srp.json '{ "name": "f0", "handler": "vdisk_fileio", "filename": "/tmp/srp0.img", "size": 134217728, "write_through": true }' \
    '{ "lun": 0, "device": "f0" }'
start_ferrited --config /tmp/srp.json
wait_srp_listening
srp_login
D=$(srp_disks 1) || fail "no SCSI disk appeared after the SRP login"
P=$(ls -d /sys/class/srp_remote_ports/port-* | head -1)
echo 2 >$P/reconnect_delay || fail "reconnect_delay"
echo 120 >$P/dev_loss_tmo; echo 90 >$P/fast_io_fail_tmo || fail "fast_io_fail_tmo"
step "remote port $(basename $P): reconnect_delay=$(cat $P/reconnect_delay) fast_io_fail_tmo=$(cat $P/fast_io_fail_tmo) dev_loss_tmo=$(cat $P/dev_loss_tmo)"
fio --name=restart --filename=/dev/$D --direct=1 --ioengine=libaio --rw=write --bs=64k --iodepth=8 \
    --size=96m --verify=crc32c --verify_fatal=1 --output-format=terse --terse-version=3 \
    >/out/fio-restart.log 2>&1 &
FIO=$!
sleep 3
kill -0 $FIO 2>/dev/null || fail "the job finished before the kill; make it longer"
step "SIGKILL ferrited under load"
kill -KILL "$FERRITED_PID"; wait "$FERRITED_PID" 2>/dev/null; FERRITED_PID=
sleep 2
start_ferrited --config /tmp/srp.json
step "ferrited started again"
wait $FIO; rc=$?
[ $rc -eq 0 ] || { cat /out/fio-restart.log; fail "the job failed across the restart (fio status $rc)"; }
awk -F';' '$1=="3" && $5!=0 {exit 1}' /out/fio-restart.log || fail "fio reported an error"
dmesg | grep -qi "reconnect" || step "(kernel log names no reconnect)"
step "kernel: $(dmesg | grep -i 'srp' | grep -i -m2 'reconnect\|queue\|failed' | tr '\n' ' ' | cut -c1-160)"
check "I/O after the restart" dd if=/dev/$D of=/dev/null bs=1M count=4 iflag=direct
pass "ib_srp reconnected after SIGKILL and restart; the verified job finished"
