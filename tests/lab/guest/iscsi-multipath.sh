# iscsi-multipath.sh - dm-multipath over two portals of one target: one
# session through 127.0.0.1:3260, one through 127.0.0.1:3261, one map with
# both paths active. Under verified fio jobs on the map, the second portal is
# taken from the target with ferritectl: ferrited closes the session that came
# in through it, the path fails in `multipath -ll`, and I/O goes on through
# the first path without an error. The portal given back, open-iscsi logs in
# again and the path returns to the map and carries I/O.
. "$(dirname "$0")/lib.sh"
ip link set lo up
P1=127.0.0.1:3260
P2=127.0.0.1:3261
T=iqn.2026-12.org.ferrite.lab:multipath
REPLACEMENT_TIMEOUT=8   # how long I/O waits on a failed path before dm-multipath retries it elsewhere
cat >/tmp/mpath.json <<JSON
{ "devices": [ { "name": "m0", "handler": "vdisk_nullio", "mem": true, "size": 134217728 } ],
  "targets": { "iscsi": [
    { "name": "$T", "portals": ["$P1", "$P2"], "luns": [ { "lun": 0, "device": "m0" } ] } ] } }
JSON
mkdir -p /etc/multipath
cat >/etc/multipath.conf <<'CONF'
defaults {
    user_friendly_names no
    find_multipaths no
    path_grouping_policy multibus
    path_checker tur
    polling_interval 2
    no_path_retry queue
}
blacklist {
    devnode "^(ram|loop|fd|md|dm-|sr|scd|st|nbd|zram|vd)"
}
CONF
start_ferrited --config /tmp/mpath.json
wait_port 127.0.0.1 3260
wait_port 127.0.0.1 3261
start_udev
start_iscsid
modprobe_all dm_multipath dm_round_robin dm_service_time
multipathd -d -s >/out/multipathd.log 2>&1 &
MPATHD=$!

step "discovery and a session through each portal"
iscsiadm -m discovery -t sendtargets -p $P1 >/out/discovery.txt 2>&1 || { cat /out/discovery.txt; fail "SendTargets discovery"; }
for p in $P1 $P2; do
    grep -q "^$p,[0-9]* $T\$" /out/discovery.txt || { cat /out/discovery.txt; fail "SendTargets did not report $p"; }
    iscsiadm -m node -T $T -p $p -o update -n node.session.timeo.replacement_timeout -v $REPLACEMENT_TIMEOUT >/dev/null ||
        fail "iscsiadm: set replacement_timeout for $p"
    iscsiadm -m node -T $T -p $p --login >/dev/null || fail "login to $T through $p"
done
wait_disks $T 2 >/dev/null || fail "two disks did not appear"

# session_of_port PORT: the iscsi_session folder whose connection went to PORT.
session_of_port() {
    local s n
    for s in /sys/class/iscsi_session/session*; do
        n=${s##*session}
        [ "$(cat /sys/class/iscsi_connection/connection$n:*/persistent_port 2>/dev/null | head -1)" = "$1" ] && { echo "$s"; return 0; }
    done
    return 1
}
S1=$(session_of_port 3260) || fail "no session through port 3260"
S2=$(session_of_port 3261) || fail "no session through port 3261"
D1=$(basename "$(ls -d "$S1"/device/target*/*:*:*:0/block/* | head -1)")
D2=$(basename "$(ls -d "$S2"/device/target*/*:*:*:0/block/* | head -1)")
[ -n "$D1" ] && [ -n "$D2" ] || fail "no disk for a session"
step "path 1: /dev/$D1 through $P1 ($(basename "$S1")); path 2: /dev/$D2 through $P2 ($(basename "$S2"))"

# path_state DISK: the path's line in `multipath -ll`.
path_line() { multipath -ll 2>/dev/null | grep " $1 "; }
for _ in $(seq 1 150); do
    [ "$(multipath -ll 2>/dev/null | grep -c "active ready")" -ge 2 ] && break
    multipath -r >/dev/null 2>&1
    sleep 0.4
done
multipath -ll >/out/multipath-start.txt 2>&1
cat /out/multipath-start.txt | sed 's/^/lab: /'
path_line "$D1" | grep -q "active ready" || fail "path 1 (/dev/$D1) is not active in the map"
path_line "$D2" | grep -q "active ready" || fail "path 2 (/dev/$D2) is not active in the map"
[ "$(dmsetup ls --target multipath | grep -c .)" -eq 1 ] || { dmsetup ls --target multipath; fail "not exactly one multipath map"; }
MAP=$(dmsetup ls --target multipath | awk '{ print $1 }')
[ -b /dev/mapper/$MAP ] || fail "no /dev/mapper/$MAP"
step "map $MAP with two active paths"

verified_jobs mpath /dev/mapper/$MAP 32 3 &
IO=$!
# wait_written DISK SECTORS: until DISK has written that much more, or fail.
wait_written() {
    local from; from=$(written "$1")
    for _ in $(seq 1 300); do
        [ $(($(written "$1") - from)) -ge "$2" ] && return 0
        kill -0 $IO 2>/dev/null || { wait $IO; fail "the I/O on the map ended (status $?)"; }
        sleep 0.1
    done
    fail "/dev/$1 wrote fewer than $2 sectors in 30 s"
}
wait_written "$D1" 8192
wait_written "$D2" 8192
step "I/O on the map goes through both paths"

step "portal $P2 taken from the target"
check "ferritectl: portals $P1" ctl set /targets/iscsi/$T/portals "$P1" >/dev/null
t0=$(date +%s)
for _ in $(seq 1 $(((REPLACEMENT_TIMEOUT + 30) * 5))); do
    path_line "$D2" | grep -q "failed" && break
    sleep 0.2
done
path_line "$D2" | grep -q "failed" || { multipath -ll; fail "path 2 does not show failed in multipath -ll"; }
step "path 2 failed after $(($(date +%s) - t0)) s: $(path_line "$D2" | sed 's/^[ |`-]*//')"
[ "$(cat "$S2/state")" != LOGGED_IN ] || fail "the session through $P2 is still logged in"
grep -q "portal removed from the target" /out/ferrited.log || fail "ferrited did not log the closed session"
path_line "$D1" | grep -q "active ready" || { multipath -ll; fail "path 1 is not active while path 2 is down"; }
before2=$(written "$D2")
wait_written "$D1" 8192
[ "$(written "$D2")" = "$before2" ] || fail "the failed path 2 wrote meanwhile"
step "I/O goes on through path 1 alone"
multipath -ll >/out/multipath-failed.txt 2>&1

step "portal $P2 given back"
check "ferritectl: portals $P1 $P2" ctl set /targets/iscsi/$T/portals "$P1 $P2" >/dev/null
t0=$(date +%s)
for _ in $(seq 1 300); do
    [ "$(cat "$S2/state")" = LOGGED_IN ] && path_line "$D2" | grep -q "active ready" && break
    sleep 0.2
done
[ "$(cat "$S2/state")" = LOGGED_IN ] || fail "the session through $P2 did not log in again within 60 s"
path_line "$D2" | grep -q "active ready" || { multipath -ll; fail "path 2 did not come back in multipath -ll"; }
step "path 2 back after $(($(date +%s) - t0)) s: $(path_line "$D2" | sed 's/^[ |`-]*//')"
wait_written "$D2" 8192
step "path 2 carries I/O again"
multipath -ll >/out/multipath-end.txt 2>&1

touch /tmp/mpath.done
wait $IO || fail "the verified I/O on the map failed"
jobs=$(cat /tmp/mpath.jobs 2>/dev/null || echo 0)
dmesg >/out/dmesg.log
grep -q "multipath.*Failing path" /out/dmesg.log || fail "the kernel did not log the failing path"
grep -q "multipath.*Reinstating path" /out/dmesg.log || fail "the kernel did not log the path reinstated"
grep "multipath" /out/dmesg.log | grep -i "failing\|reinstating" | sed 's/^/lab: kernel: /'
! grep -q "I/O error, dev dm-\|Buffer I/O error on dev dm-" /out/dmesg.log || fail "the kernel reported I/O errors on the map"
kill $MPATHD 2>/dev/null
pass "path failed with its portal and came back with it; $jobs verified jobs on the map without an error"
