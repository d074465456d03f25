# iscsi-eh.sh - the kernel's SCSI error handler against ferrited. LUN 0's
# backend stalls reads of one range (fault injection: delay_ms, count 2). A
# read there times out; the kernel aborts it (ABORT TASK), which ferrited
# answers once the stalled read has drained; the retried read stalls again and
# times out again, and the kernel escalates to a LOGICAL UNIT RESET, which
# ferrited answers the same way. The disk then goes back to service, LUN 1 of
# the same session runs a verified fio throughout without an error and is
# never touched (no TMF for it, no abort or reset of it in the kernel log, no
# PDU of the session rejected: Linux gives the aborted command's ITT to the
# next command at once), the session never goes through recovery, and
# `sg_reset -d` gets its LUN reset answered.
#
# Timing. A command's timer (/sys/block/sdX/device/timeout, T) fires two or
# three times before libiscsi hands it to the error handler (once to note
# progress, once to ping the connection with a NOP-Out), so the abort goes out
# 2T-3T after the read. libiscsi treats a TMF that is not answered within its
# timeout (node.session.err_timeo.abort_timeout, lu_reset_timeout) as a dead
# connection and starts session recovery, and a target may answer ABORT TASK
# or LOGICAL UNIT RESET only once the affected task is gone (SAM-5 §7.2,
# §7.7; ferrited waits for the backend, as LIO and SCST do). So each stall
# (STALL_MS) must outlast 3T and end within the TMF timeouts of the moment the
# TMF is sent: T = 4 s, stalls of 20 s, both TMF timeouts 30 s.
# Runs over TCP, or over iSER with LAB_ISCSI_TRANSPORT=iser (lib.sh: iscsi_transport).
. "$(dirname "$0")/lib.sh"
iscsi_transport
T=iqn.2026-12.org.ferrite.lab:eh
CMD_TIMEOUT=4
STALL_MS=20000
TMF_TIMEOUT=30
STALL_LBA=65536        # 32 MiB into LUN 0, 512-byte blocks
cat >/tmp/eh.json <<JSON
{ "devices": [
    { "name": "slow", "handler": "vdisk_nullio", "mem": true, "size": 67108864,
      "fault": { "rules": [
        { "op": "read", "lba": $STALL_LBA, "blocks": 8, "delay_ms": $STALL_MS, "count": 2 } ] } },
    { "name": "busy", "handler": "vdisk_nullio", "mem": true, "size": 134217728 } ],
  "targets": { "iscsi": [
    { "name": "$T", "portals": [$PORTALS],
      "luns": [ { "lun": 0, "device": "slow" }, { "lun": 1, "device": "busy" } ] } ] } }
JSON
start_ferrited --config /tmp/eh.json
wait_portal
start_iscsid
modprobe_all sg

node() { iscsiadm -m node -T $T -p $P "$@"; }
discover
for kv in node.session.err_timeo.abort_timeout=$TMF_TIMEOUT node.session.err_timeo.lu_reset_timeout=$TMF_TIMEOUT \
    node.session.err_timeo.tgt_reset_timeout=$TMF_TIMEOUT node.session.timeo.replacement_timeout=60; do
    node -o update -n "${kv%%=*}" -v "${kv#*=}" >/dev/null || fail "iscsiadm: set $kv"
done
check "login" node --login
check_transport
DISKS=$(wait_disks $T 2) || fail "the two LUNs did not appear"
SLOW=$(disk_of_lun $T 0)
BUSY=$(disk_of_lun $T 1)
BUSY_HCTL=$(basename "$(readlink -f /sys/block/$BUSY/device)")
SESSION=$(ls -d /sys/class/iscsi_session/session* | head -1)
SID=$(basename "$SESSION" | tr -dc 0-9)
echo $CMD_TIMEOUT >/sys/block/$SLOW/device/timeout || fail "cannot set the command timeout of $SLOW"
step "LUN 0 (stalling) is /dev/$SLOW, command timeout ${CMD_TIMEOUT} s; LUN 1 (busy) is /dev/$BUSY"
# The error handler's steps in the kernel log: libiscsi's EH debug lines
# ("aborting", "LU Reset", their results) and the SCSI midlayer's error
# recovery log (level 4: "abort scheduled", "previous abort failed", ...).
echo 1 >/sys/module/libiscsi/parameters/debug_libiscsi_eh || fail "cannot enable libiscsi's EH log"
echo 4 >/proc/sys/dev/scsi/logging_level || fail "cannot set the SCSI logging level"
# dmesg_since N: the kernel log after its first N lines.
dmesg_since() { dmesg | tail -n +$(($1 + 1)); }
mark=$(dmesg | wc -l)

# LUN 1: verified jobs, one after another, until the error handling is over.
busy_loop() {
    local n=0
    while [ ! -e /tmp/eh.done ]; do
        n=$((n + 1))
        fio_verify busy-$n /dev/$BUSY --rw=randwrite --bs=16k --iodepth=4 --size=24M --offset=$(((n % 4) * 24))M
        echo $n >/tmp/busy.jobs
    done
}
busy_loop &
BUSY_PID=$!
sleep 2

step "reading the stalled range of /dev/$SLOW"
start=$(date +%s)
dd if=/dev/$SLOW of=/tmp/stalled.bin bs=4k count=1 skip=$((STALL_LBA / 8)) iflag=direct 2>/out/dd-stalled.log
rc=$?
took=$(($(date +%s) - start))
printf "\n" >>/out/dd-stalled.log
step "the read returned after ${took} s (status $rc)"
dmesg_since $mark >/out/dmesg-eh.log
sed 's/^/lab: kernel: /' /out/dmesg-eh.log | grep -i "abort\|reset\|conn error\|recovery\|timing out\|FAILED" | head -40
[ $rc -eq 0 ] || { cat /out/dd-stalled.log; fail "the read of the stalled range failed"; }
cmp -s /tmp/stalled.bin <(head -c 4096 /dev/zero) || fail "the read of the stalled range returned wrong data"
[ $took -ge $((2 * STALL_MS / 1000)) ] || fail "the read took ${took} s: the range did not stall twice"

grep -q "aborting \[sc" /out/dmesg-eh.log || fail "the kernel sent no ABORT TASK"
grep -q "abort success" /out/dmesg-eh.log || fail "the kernel's abort did not succeed"
grep -q "LU Reset \[sc" /out/dmesg-eh.log || fail "the kernel sent no LOGICAL UNIT RESET"
grep -q "dev reset result = SUCCESS" /out/dmesg-eh.log || fail "the kernel's LOGICAL UNIT RESET did not succeed"
! grep -q "detected conn error\|session recovery\|target reset\|host reset" /out/dmesg-eh.log ||
    fail "the error handler went past the LUN reset (connection error, target or host reset)"
grep -q "task management request: ABORT TASK" /out/ferrited.log || fail "ferrited logged no ABORT TASK"
grep -q "task management response to ABORT TASK: function complete" /out/ferrited.log ||
    fail "ferrited did not answer ABORT TASK with function complete"
grep -q "task management request: LOGICAL UNIT RESET" /out/ferrited.log || fail "ferrited logged no LOGICAL UNIT RESET"
grep -q "task management response to LOGICAL UNIT RESET: function complete" /out/ferrited.log ||
    fail "ferrited did not answer LOGICAL UNIT RESET with function complete"
grep "task management" /out/ferrited.log | sed 's/^/lab: ferrited: /'
# Nothing of this concerns LUN 1: no TMF for it, no abort or reset of it in
# the kernel log, no command of the session refused by ferrited (a Reject
# leaves the initiator's command hanging until its own timeout).
grep "task management request" /out/ferrited.log | grep -qv " lun=0 " &&
    fail "ferrited got a TMF for another LUN: $(grep "task management request" /out/ferrited.log | grep -v " lun=0 " | head -1)"
grep -E "\[$BUSY\]|$BUSY_HCTL: " /out/dmesg-eh.log | grep -qi "abort\|reset\|timing out\|fail" &&
    fail "the error handler touched LUN 1: $(grep -E "\[$BUSY\]|$BUSY_HCTL: " /out/dmesg-eh.log | grep -i "abort\|reset\|timing out\|fail" | head -1)"
grep -q "rejected" /out/dmesg-eh.log && fail "ferrited rejected a PDU: $(grep -m1 rejected /out/dmesg-eh.log)"
[ "$(grep -c "task management request: LOGICAL UNIT RESET" /out/ferrited.log)" -eq 1 ] ||
    fail "ferrited got $(grep -c "task management request: LOGICAL UNIT RESET" /out/ferrited.log) LUN resets, not one"
[ "$(cat "$SESSION/state")" = LOGGED_IN ] || fail "the session is $(cat "$SESSION/state")"
grep -q "Kernel reported iSCSI connection" /out/iscsid.log && fail "iscsid saw a connection error: $(grep -m1 'Kernel reported' /out/iscsid.log)"

step "/dev/$SLOW back in service"
[ "$(cat /sys/block/$SLOW/device/state)" = running ] || fail "/dev/$SLOW is $(cat /sys/block/$SLOW/device/state)"
dd if=/dev/urandom of=/tmp/pattern bs=1M count=4 2>/dev/null
dd if=/tmp/pattern of=/dev/$SLOW bs=1M seek=8 oflag=direct 2>/dev/null || fail "write to /dev/$SLOW after the reset"
dd if=/dev/$SLOW of=/tmp/back bs=1M skip=8 count=4 iflag=direct 2>/dev/null || fail "read from /dev/$SLOW after the reset"
cmp -s /tmp/pattern /tmp/back || fail "/dev/$SLOW returned other data after the reset"
timeout 60 dd if=/dev/$SLOW of=/dev/null bs=4k count=1 skip=$((STALL_LBA / 8)) iflag=direct 2>/dev/null ||
    fail "the stalled range cannot be read once its stalls are over"

step "sg_reset -d /dev/$SLOW"
resets_before=$(grep -c "task management response to LOGICAL UNIT RESET: function complete" /out/ferrited.log)
mark=$(dmesg | wc -l)
timeout 60 sg_reset -d /dev/$SLOW >/out/sg_reset.log 2>&1 || { cat /out/sg_reset.log; fail "sg_reset -d /dev/$SLOW"; }
for _ in $(seq 1 50); do
    [ "$(grep -c "task management response to LOGICAL UNIT RESET: function complete" /out/ferrited.log)" -gt "$resets_before" ] && break
    sleep 0.2
done
[ "$(grep -c "task management response to LOGICAL UNIT RESET: function complete" /out/ferrited.log)" -gt "$resets_before" ] ||
    fail "ferrited answered no LOGICAL UNIT RESET for sg_reset"
dmesg_since $mark | grep -q "dev reset result = SUCCESS" || { dmesg_since $mark | tail -20; fail "the kernel reports sg_reset's LUN reset as failed"; }
dd if=/dev/$SLOW of=/tmp/back bs=1M skip=8 count=4 iflag=direct 2>/dev/null || fail "read from /dev/$SLOW after sg_reset"
cmp -s /tmp/pattern /tmp/back || fail "/dev/$SLOW returned other data after sg_reset"

touch /tmp/eh.done
wait $BUSY_PID || fail "the verified jobs on LUN 1 failed during the error handling"
jobs=$(cat /tmp/busy.jobs 2>/dev/null || echo 0)
[ "$jobs" -ge 2 ] || fail "only $jobs verified job(s) on LUN 1 finished"
! dmesg | grep -q "\[$BUSY\].*\(FAILED\|I/O error\)\|I/O error, dev $BUSY" ||
    fail "the kernel reported errors on /dev/$BUSY"
! dmesg | grep -q "rejected" || fail "ferrited rejected a PDU: $(dmesg | grep -m1 rejected)"
[ "$(cat "$SESSION/state")" = LOGGED_IN ] || fail "the session is $(cat "$SESSION/state")"
step "LUN 1: $jobs verified jobs, no error; session $SID never recovered"
pass "ABORT TASK then LOGICAL UNIT RESET answered, disk back in service, the other LUN untouched; sg_reset answered"
