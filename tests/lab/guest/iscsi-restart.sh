# iscsi-restart.sh - ferrited killed with SIGKILL in the middle of a verified
# write job on a write-through fileio LUN, then restarted with the same
# configuration and state directory: open-iscsi reconnects within its
# replacement timeout, the job finishes without an error, and nothing the
# initiator saw acknowledged before the kill is lost: fio's verify pass reads
# back everything it wrote, and a second writer's acknowledged blocks are
# checked in the image file itself and through the LUN. The kernel logs the
# connection error, then meets the restarted target's POWER ON unit attention;
# iscsid logs the recovery.
# Runs over TCP, or over iSER with LAB_ISCSI_TRANSPORT=iser (lib.sh: iscsi_transport).
. "$(dirname "$0")/lib.sh"
iscsi_transport
T=iqn.2026-12.org.ferrite.lab:restart
IMG=/tmp/images/wt0.img
REPLACEMENT_TIMEOUT=90
FIO_MIB=160            # fio's region: [0, FIO_MIB) MiB
KILL_AT_MIB=40         # SIGKILL once this much was written to the disk
DOWN_S=5               # ferrited stays down this long
MARK_AT=3200           # the marker writer's region, in 64 KiB blocks (200 MiB)
MARK_MAX=400           # at most this many marker blocks (25 MiB)
mkdir -p /tmp/images
cat >/tmp/restart.json <<JSON
{ "devices": [
    { "name": "wt0", "handler": "vdisk_fileio", "filename": "$IMG",
      "size": 268435456, "write_through": true } ],
  "targets": { "iscsi": [
    { "name": "$T", "portals": [$PORTALS], "luns": [ { "lun": 0, "device": "wt0" } ] } ] } }
JSON
start_ferrited --config /tmp/restart.json
wait_portal
start_iscsid

step "login (replacement_timeout ${REPLACEMENT_TIMEOUT} s)"
discover
iscsiadm -m node -T $T -p $P -o update -n node.session.timeo.replacement_timeout -v $REPLACEMENT_TIMEOUT >/dev/null ||
    fail "iscsiadm: set replacement_timeout"
iscsiadm -m node -T $T -p $P --login >/dev/null || fail "login to $T"
check_transport
D=$(wait_disks $T 1) || fail "no disk appeared for $T"
SESSION=$(ls -d /sys/class/iscsi_session/session* | head -1)
[ "$(cat "$SESSION/recovery_tmo")" = $REPLACEMENT_TIMEOUT ] ||
    fail "the session's recovery_tmo is $(cat "$SESSION/recovery_tmo"), not $REPLACEMENT_TIMEOUT"
step "disk /dev/$D, session $(basename "$SESSION")"

# marks FROM TO: the content of marker blocks FROM..TO-1, 64 KiB each (a
# numbered line repeated).
marks() {
    awk -v from="$1" -v to="$2" 'BEGIN {
        for (i = from; i < to; i++) {
            line = "ferrite marker block " i " .\n"; b = line
            while (length(b) < 65536) b = b b
            printf "%s", substr(b, 1, 65536)
        } }'
}
# The marker writer: one 64 KiB direct write at a time, each logged in
# /tmp/marks.acked once dd has returned, i.e. once the initiator saw it
# acknowledged; stops at /tmp/marks.stop or after MARK_MAX blocks.
marker_writer() {
    local i=0
    while [ $i -lt $MARK_MAX ] && [ ! -e /tmp/marks.stop ]; do
        marks $i $((i + 1)) | dd of=/dev/$D bs=64k seek=$((MARK_AT + i)) count=1 iflag=fullblock oflag=direct status=none ||
            { echo "marker write $i failed" >/tmp/marks.err; return 1; }
        echo $i >>/tmp/marks.acked
        i=$((i + 1))
    done
}
: >/tmp/marks.acked

written_mib() { awk '{ print int($7 * 512 / 1048576) }' /sys/block/$D/stat; }
start_written=$(written_mib)
step "verified write job (${FIO_MIB} MiB, random 64 KiB writes at QD 8, then verify) and the marker writer"
(fio_verify restart /dev/$D --rw=randwrite --bs=64k --iodepth=8 --size=${FIO_MIB}M) &
FIO=$!
marker_writer &
MARKER=$!

for _ in $(seq 1 600); do
    [ $(($(written_mib) - start_written)) -ge $KILL_AT_MIB ] && break
    kill -0 $FIO 2>/dev/null || { wait $FIO; fail "the job ended before the kill (status $?)"; }
    sleep 0.1
done
[ $(($(written_mib) - start_written)) -ge $KILL_AT_MIB ] || fail "the job never wrote ${KILL_AT_MIB} MiB"
acked_before=$(grep -c . /tmp/marks.acked)
dmesg >/out/dmesg-before-kill.log
step "SIGKILL to ferrited after $(($(written_mib) - start_written)) MiB written, $acked_before marker blocks acknowledged"
kill -KILL "$FERRITED_PID"
wait "$FERRITED_PID" 2>/dev/null
FERRITED_PID=
killed=$(date +%s.%N)
[ "$acked_before" -gt 0 ] || fail "no marker block was acknowledged before the kill"
kill -0 $FIO 2>/dev/null || fail "the job ended before ferrited was killed"

# The initiator notices the dead connection and the session fails (the
# SCSI devices stay blocked, their commands queued, until it comes back).
for _ in $(seq 1 100); do
    [ "$(cat "$SESSION/state")" != LOGGED_IN ] && break
    sleep 0.1
done
state=$(cat "$SESSION/state")
[ "$state" != LOGGED_IN ] || fail "the session still says LOGGED_IN 10 s after ferrited died"
step "session state after the kill: $state"
sleep $DOWN_S
# A SIGKILLed process's listening socket can linger a moment (its io_uring
# is torn down asynchronously): wait until nothing listens on the port.
for _ in $(seq 1 150); do
    ss -Hltn 'sport = :3260' | grep -q . || break
    sleep 0.2
done
step "restarting ferrited (same configuration, same state directory)"
start_ferrited --config /tmp/restart.json
restarted=$(date +%s.%N)
for _ in $(seq 1 $((REPLACEMENT_TIMEOUT * 5))); do
    [ "$(cat "$SESSION/state")" = LOGGED_IN ] && break
    sleep 0.2
done
back=$(date +%s.%N)
[ "$(cat "$SESSION/state")" = LOGGED_IN ] || fail "the session did not come back within ${REPLACEMENT_TIMEOUT} s of the restart"
outage=$(awk -v a="$killed" -v b="$back" 'BEGIN { printf "%.1f", b - a }')
relogin=$(awk -v a="$restarted" -v b="$back" 'BEGIN { printf "%.1f", b - a }')
awk -v o="$outage" -v t=$REPLACEMENT_TIMEOUT 'BEGIN { exit !(o < t) }' ||
    fail "the session came back after ${outage} s, not within the replacement timeout (${REPLACEMENT_TIMEOUT} s)"
check_transport
step "session logged in again ${relogin} s after the restart, ${outage} s after the kill"

step "waiting for the job to finish its writes and its verify pass"
wait $FIO || fail "the verified write job failed across the restart"
touch /tmp/marks.stop
wait $MARKER || fail "the marker writer failed: $(cat /tmp/marks.err 2>/dev/null)"
acked=$(grep -c . /tmp/marks.acked)
[ "$acked" -gt "$acked_before" ] || fail "no marker block was acknowledged after the restart"

step "checking $acked acknowledged marker blocks ($acked_before before the kill) in the image and through the LUN"
[ "$(tail -n 1 /tmp/marks.acked)" = $((acked - 1)) ] || fail "the marker log is not blocks 0..$((acked - 1))"
marks 0 "$acked" >/tmp/marks.expected
dd if=$IMG bs=64k skip=$MARK_AT count=$acked status=none >/tmp/marks.image
if ! cmp /tmp/marks.expected /tmp/marks.image >/tmp/marks.cmp 2>&1; then
    at=$(grep -o 'byte [0-9]*' /tmp/marks.cmp | tr -dc 0-9)
    i=$(((${at:-1} - 1) / 65536))
    fail "marker block $i, acknowledged$([ "$i" -lt "$acked_before" ] && echo " before the kill"), is not in the image ($(cat /tmp/marks.cmp))"
fi
cmp <(dd if=/dev/$D bs=64k skip=$MARK_AT count=$acked iflag=direct status=none) \
    <(dd if=$IMG bs=64k skip=$MARK_AT count=$acked status=none) ||
    fail "the LUN and its image differ in the marker region"

dmesg >/out/dmesg.log
grep -q "connection[0-9:]*: detected conn error" /out/dmesg.log || fail "dmesg shows no connection error"
grep "detected conn error" /out/dmesg.log | sed 's/^/lab: dmesg: /'
# The restarted ferrited is a new target instance: the kernel's first command
# after the recovery meets its POWER ON unit attention (06/29/00).
sed -n '/detected conn error/,$p' /out/dmesg.log | grep -q "Power-on or device reset occurred" ||
    fail "dmesg shows no command reaching the restarted target (its POWER ON unit attention)"
sed -n '/detected conn error/,$p' /out/dmesg.log | grep -m1 "Power-on or device reset occurred" | sed 's/^/lab: dmesg: /'
! grep -qi "I/O error\|rejecting I/O\|session recovery timed out\|offline device" /out/dmesg.log ||
    { grep -i "I/O error\|rejecting I/O\|session recovery timed out\|offline device" /out/dmesg.log; fail "the kernel reported I/O errors"; }
grep -q "operational after recovery" /out/iscsid.log || { tail -20 /out/iscsid.log; fail "iscsid reported no recovery"; }
grep "operational after recovery" /out/iscsid.log | sed 's/^/lab: iscsid: /'
[ "$(grep -c "iSCSI portal listening" /out/ferrited.log)" -ge 2 ] || fail "ferrited's log shows no second start"
pass "SIGKILL under a verified write job: back in ${outage} s, no error, ${acked} acknowledged marker blocks intact"
