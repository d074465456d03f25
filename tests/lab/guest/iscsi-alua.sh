# iscsi-alua.sh - ALUA with the Linux multipath stack: one ferrited, one
# device in a device group seen through two iSCSI targets, each its own
# target port group on its own portal (group 1 active/optimized, group 2
# active/non-optimized; neither preferred, since multipath's alua
# prioritizer ranks a preferred group above an optimized one). dm-multipath with `prio alua`
# and scsi_dh_alua must build two path groups, the optimized one active;
# sg_rtpg must report both groups with their states and ports. Under a
# verified fio job on the map, sg_stpg (explicit ALUA) through the second
# path makes group 2 optimized and group 1 non-optimized: the kernel logs
# the unit attention, scsi_dh_alua reads the new states, multipath switches
# its active path group, and the job finishes without an error. Then
# ferritectl sets group 1 standby (implicit): its path becomes a ghost, the
# standby port refuses reads with NOT READY, and the state is saved and
# survives a restart of ferrited.
. "$(dirname "$0")/lib.sh"
ip link set lo up
P1=127.0.0.1:3260
P2=127.0.0.1:3261
T1=iqn.2026-12.org.ferrite.lab:alua-a
T2=iqn.2026-12.org.ferrite.lab:alua-b
cat >/tmp/alua.json <<JSON
{ "devices": [ { "name": "a0", "handler": "vdisk_nullio", "mem": true, "size": 134217728 } ],
  "targets": { "iscsi": [
    { "name": "$T1", "portals": ["$P1"], "rel_tgt_id": 1, "luns": [ { "lun": 0, "device": "a0" } ] },
    { "name": "$T2", "portals": ["$P2"], "rel_tgt_id": 2, "luns": [ { "lun": 0, "device": "a0" } ] } ] },
  "device_groups": [
    { "name": "dg0", "devices": ["a0"],
      "target_groups": [
        { "name": "tg1", "group_id": 1, "state": "active", "targets": ["$T1"] },
        { "name": "tg2", "group_id": 2, "state": "nonoptimized", "targets": ["$T2"] } ] } ] }
JSON
start_ferrited --config /tmp/alua.json
wait_port 127.0.0.1 3260
wait_port 127.0.0.1 3261
start_udev
start_iscsid
alua_multipath

step "a session to each target, each through its own portal"
for tp in "$T1 $P1" "$T2 $P2"; do
    set -- $tp
    iscsiadm -m discovery -t sendtargets -p "$2" >/dev/null 2>&1 || fail "SendTargets discovery through $2"
    iscsiadm -m node -T "$1" -p "$2" --login >/dev/null || fail "login to $1 through $2"
done
wait_disks $T1 1 >/dev/null || fail "the disk of $T1 did not appear"
wait_disks $T2 1 >/dev/null || fail "the disk of $T2 did not appear"
D1=$(disks_of $T1 | head -1)
D2=$(disks_of $T2 | head -1)
[ -n "$D1" ] && [ -n "$D2" ] || fail "no disk for a target"
step "path 1: /dev/$D1 ($T1), path 2: /dev/$D2 ($T2)"

sg_inq /dev/$D1 >/out/inq.txt 2>&1 || fail "sg_inq"
grep -q "TPGS=3" /out/inq.txt || { cat /out/inq.txt; fail "INQUIRY does not report implicit and explicit ALUA (TPGS=3)"; }
# bytes: standard input as decimal bytes, one line.
bytes() { od -An -tu1 -v | tr -s ' \n' '  '; }
# vpd_port_group DISK: the target port group designator of VPD 83h.
vpd_port_group() {
    sg_vpd -p di -r /dev/$1 2>/dev/null | bytes | awk '{
        i = 5
        while (i + 3 <= NF) {
            if ($(i + 1) % 16 == 5 && int($(i + 1) / 16) % 4 == 1) { print $(i + 6) * 256 + $(i + 7); exit }
            i += 4 + $(i + 3)
        } }'
}
[ "$(vpd_port_group $D1)" = 1 ] || fail "VPD 83h through path 1 names target port group '$(vpd_port_group $D1)', not 1"
[ "$(vpd_port_group $D2)" = 2 ] || fail "VPD 83h through path 2 names target port group '$(vpd_port_group $D2)', not 2"

# rtpg_state DISK GROUP: GROUP's asymmetric access state in REPORT TARGET
# PORT GROUPS through DISK (ao, an, s, u, o, t), a + when preferred.
rtpg_state() {
    sg_rtpg -r /dev/$1 2>/dev/null | bytes | awk -v g="$2" 'BEGIN { split("ao an s u", n, " "); n[15] = "o"; n[16] = "t" }
        {
        i = 5
        while (i + 7 <= NF) {
            if ($(i + 2) * 256 + $(i + 3) == g) { print n[$i % 16 + 1] ($i >= 128 ? "+" : ""); exit }
            i += 8 + 4 * $(i + 7)
        } }'
}
sg_rtpg -d /dev/$D1 >/out/rtpg-start.txt 2>&1 || { cat /out/rtpg-start.txt; fail "sg_rtpg"; }
sed 's/^/lab: rtpg: /' /out/rtpg-start.txt
[ "$(rtpg_state $D1 1)" = "ao" ] || fail "group 1 is not active/optimized: $(rtpg_state $D1 1)"
[ "$(rtpg_state $D2 2)" = "an" ] || fail "group 2 is not active/non-optimized: $(rtpg_state $D2 2)"

for _ in $(seq 1 150); do
    [ "$(access_state $D1)" = active/optimized ] && [ "$(access_state $D2)" = active/non-optimized ] && break
    sleep 0.2
done
[ "$(access_state $D1)" = active/optimized ] || fail "scsi_dh_alua: /dev/$D1 is $(access_state $D1)"
[ "$(access_state $D2)" = active/non-optimized ] || fail "scsi_dh_alua: /dev/$D2 is $(access_state $D2)"
multipath -r >/dev/null 2>&1
wait_active $D1 $D2 60 "at start"
[ "$(dmsetup ls --target multipath | grep -c .)" -eq 1 ] || { dmsetup ls --target multipath; fail "not exactly one multipath map"; }
MAP=$(dmsetup ls --target multipath | awk '{ print $1 }')
multipath -ll >/out/multipath-start.txt 2>&1
sed 's/^/lab: /' /out/multipath-start.txt
[ "$(grep -c "policy=" /out/multipath-start.txt)" -eq 2 ] || fail "multipath did not make two path groups"
step "map $MAP: /dev/$D1 optimized in the active group, /dev/$D2 non-optimized in the other"

verified_jobs alua /dev/mapper/$MAP 32 3 &
IO=$!
sleep 2
kill -0 $IO 2>/dev/null || { wait $IO; fail "the verified jobs on the map ended early (status $?)"; }
w2=$(written $D2)

step "sg_stpg through path 2: group 2 active/optimized, group 1 active/non-optimized"
dmesg -c >/dev/null
sg_stpg --tp=2,1 --state=ao,an /dev/$D2 >/out/stpg.txt 2>&1 || { cat /out/stpg.txt; fail "sg_stpg"; }
[ "$(rtpg_state $D1 2)" = ao ] || fail "group 2 is $(rtpg_state $D1 2), not active/optimized, after sg_stpg"
[ "$(rtpg_state $D2 1)" = an ] || fail "group 1 is $(rtpg_state $D2 1), not active/non-optimized, after sg_stpg"
for _ in $(seq 1 150); do
    [ "$(access_state $D2)" = active/optimized ] && [ "$(access_state $D1)" = active/non-optimized ] && break
    # Path 1 learns of the change from the unit attention on its next command.
    sg_turs /dev/$D1 >/dev/null 2>&1
    sleep 0.2
done
[ "$(access_state $D2)" = active/optimized ] || fail "scsi_dh_alua: /dev/$D2 is $(access_state $D2) after sg_stpg"
[ "$(access_state $D1)" = active/non-optimized ] || fail "scsi_dh_alua: /dev/$D1 is $(access_state $D1) after sg_stpg"
wait_active $D2 $D1 60 "after sg_stpg"
step "multipath follows: /dev/$D2 in the active group"
for _ in $(seq 1 300); do
    [ $(($(written $D2) - w2)) -ge 8192 ] && break
    kill -0 $IO 2>/dev/null || break
    sleep 0.1
done
touch /tmp/alua.done
dmesg >/out/dmesg-stpg.log
grep -qi "Asymmetric access state changed\|alua: port group 01 state N\|alua: port group 0001 state N" /out/dmesg-stpg.log ||
    { cat /out/dmesg-stpg.log | tail -30; fail "the kernel did not log the asymmetric access state change"; }
grep -i "asymmetric\|alua" /out/dmesg-stpg.log | sed 's/^/lab: kernel: /'
wait $IO || fail "a verified job failed across the change"
[ $(($(written $D2) - w2)) -gt 0 ] || fail "path 2 wrote nothing after it became optimized"
step "$(cat /tmp/alua.jobs) verified jobs finished without an error; path 2 carried writes once optimized"

step "ferritectl: group 1 standby (implicit)"
check "ferritectl set state" ctl set /device_groups/dg0/target_groups/tg1/state standby >/dev/null
[ "$(ctl get /device_groups/dg0/target_groups/tg1/state 2>/dev/null | head -1)" = standby ] ||
    fail "ferritectl does not read the standby state back"
for _ in $(seq 1 150); do
    sg_turs /dev/$D1 >/dev/null 2>&1
    [ "$(access_state $D1)" = standby ] && break
    sleep 0.2
done
[ "$(access_state $D1)" = standby ] || fail "scsi_dh_alua: /dev/$D1 is $(access_state $D1), not standby"
# READ (10) of one block straight to the port (SG_IO: scsi_dh_alua would
# refuse a file system read on a standby path itself).
sg_raw -r 512 /dev/$D1 28 00 00 00 00 00 00 00 01 00 >/out/standby-read.txt 2>&1 &&
    fail "a read through the standby port succeeded"
grep -qi "standby" /out/standby-read.txt || { cat /out/standby-read.txt; fail "the standby port's refusal is not NOT READY, TARGET PORT IN STANDBY STATE"; }
step "the standby port refuses reads: $(grep -i -m1 "standby" /out/standby-read.txt)"

step "ferrited restarted: the states come back"
stop_ferrited
start_ferrited --config /tmp/alua.json
wait_port 127.0.0.1 3260
wait_port 127.0.0.1 3261
for _ in $(seq 1 300); do
    s=$(rtpg_state $D2 1)
    [ -n "$s" ] && break
    sleep 0.2
done
[ "$(rtpg_state $D2 1)" = s ] || fail "group 1 is $(rtpg_state $D2 1) after a restart, not standby"
[ "$(rtpg_state $D2 2)" = ao ] || fail "group 2 is $(rtpg_state $D2 2) after a restart, not active/optimized"
dd if=/dev/mapper/$MAP of=/dev/null bs=1M count=8 iflag=direct 2>/dev/null || fail "the map does not read after the restart"
multipath -ll >/out/multipath-end.txt 2>&1
kill $MPATHD 2>/dev/null
pass "two path groups by ALUA priority; sg_stpg moved the optimized group and multipath followed under verified I/O; standby refuses reads; states survive a restart"
