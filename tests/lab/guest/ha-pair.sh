# ha-pair.sh - an HA pair of ferrited nodes with their cluster state in etcd,
# under open-iscsi and dm-multipath with ALUA. etcd runs in the guest; node
# a serves target A on 127.0.0.1:3260 (target port group 1), node b target B
# on 127.0.0.1:3261 (group 2); both export the same two devices from one
# backing file each (shared storage). Node b reaches etcd through a socat
# relay, so that cutting the relay partitions node b alone.
#  1. Node a starts first and owns the device group: group 1 active/optimized,
#     group 2 active/non-optimized, as both nodes and the kernel see it.
#  2. A key registered and WRITE EXCLUSIVE taken through node a (LUN 1) are
#     seen through node b (sg_persist -k, -r); a write through b gets
#     RESERVATION CONFLICT.
#  3. Under back-to-back verified fio jobs on LUN 0's map, node a is killed
#     with SIGKILL: node b takes over once a's lease ran out, multipath moves
#     to b's path, the jobs verify. Node a restarted joins as non-optimized.
#  4. Node b (now owner) is cut off from etcd: a reservation change through
#     it fails at once with a sense instead of hanging; once its lease ran
#     out it reports standby and refuses writes, while node a took over and
#     takes them; the relay back, b rejoins as non-optimized by itself.
#  5. The reservation of step 2 is still there through both nodes, and
#     every job verified.
. "$(dirname "$0")/lib.sh"
ip link set lo up
TA=iqn.2026-12.org.ferrite.lab:ha-a
TB=iqn.2026-12.org.ferrite.lab:ha-b
TTL=4
mkdir -p /tmp/ha
truncate -s 128M /tmp/ha/h0.img
truncate -s 16M /tmp/ha/p0.img

step "etcd in the guest; a relay for node b"
etcd --name lab --data-dir /tmp/ha/etcd --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster lab=http://127.0.0.1:2380 \
    >/out/etcd.log 2>&1 &
ETCD=$!
wait_port 127.0.0.1 2379
relay_up() { socat TCP-LISTEN:2479,bind=127.0.0.1,reuseaddr,fork TCP:127.0.0.1:2379 >/dev/null 2>&1 & RELAY=$!; wait_port 127.0.0.1 2479; }
relay_up

# node_config NODE MY_TARGET MY_PORTAL MY_REL ETCD_PORT: node NODE's file.
node_config() {
    local me=$1 t=$2 portal=$3 rel=$4 etcd=$5 tga tgb
    if [ "$me" = a ]; then
        tga="\"targets\": [\"$t\"]"; tgb="\"rel_tgt_ids\": [2]"
    else
        tga="\"rel_tgt_ids\": [1]"; tgb="\"targets\": [\"$t\"]"
    fi
    cat >/tmp/ha/$me.json <<JSON
{ "devices": [
    { "name": "h0", "handler": "vdisk_fileio", "filename": "/tmp/ha/h0.img", "serial": "ha0" },
    { "name": "p0", "handler": "vdisk_fileio", "filename": "/tmp/ha/p0.img", "serial": "hp0" } ],
  "targets": { "iscsi": [
    { "name": "$t", "portals": ["$portal"], "rel_tgt_id": $rel,
      "luns": [ { "lun": 0, "device": "h0" }, { "lun": 1, "device": "p0" } ] } ] },
  "device_groups": [
    { "name": "dg0", "devices": ["h0", "p0"],
      "target_groups": [
        { "name": "tga", "group_id": 1, "node": "a", $tga },
        { "name": "tgb", "group_id": 2, "node": "b", $tgb } ] } ],
  "cluster": { "node": "$me", "etcd": ["http://127.0.0.1:$etcd"], "prefix": "/ferrite/lab", "lease_ttl_s": $TTL } }
JSON
}
node_config a $TA 127.0.0.1:3260 1 2379
node_config b $TB 127.0.0.1:3261 2 2479

nctl() { local n=$1; shift; "$FERRITECTL" --socket /tmp/ha/ctl-$n "$@"; }
# start_node NODE: ferrited for NODE, its pid in PID_NODE.
start_node() {
    local n=$1 i
    mkdir -p /tmp/ha/state-$n; rm -f /tmp/ha/ctl-$n
    RUST_LOG=info "$FERRITED" --config /tmp/ha/$n.json --state-dir /tmp/ha/state-$n --control /tmp/ha/ctl-$n \
        >>/out/ferrited-$n.log 2>&1 &
    eval "PID_$n=$!"
    for i in $(seq 1 300); do
        nctl $n ls / >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    fail "ferrited node $n never answered"
}
# tg_state NODE TG: the state NODE reports for target group TG.
tg_state() { nctl $1 get /device_groups/dg0/target_groups/$2/state 2>/dev/null | head -1; }
# wait_states NODE TGA_STATE TGB_STATE SECONDS WHY
wait_states() {
    local until=$((SECONDS + $4)) a b
    while [ $SECONDS -lt $until ]; do
        a=$(tg_state $1 tga); b=$(tg_state $1 tgb)
        echo "$(date +%T.%N) $1 $a $b (want $2 $3)" >>/out/states.log
        [ "$a" = "$2" ] && [ "$b" = "$3" ] && return 0
        sleep 0.2
    done
    fail "$5: node $1 reports tga $(tg_state $1 tga), tgb $(tg_state $1 tgb); expected $2, $3"
}

start_node a
wait_states a active nonoptimized 30 "node a alone"
start_node b
wait_states b active nonoptimized 30 "node b joining"
step "node a owns dg0: both nodes report group 1 active/optimized, group 2 active/non-optimized"

start_udev
start_iscsid
alua_multipath
for tp in "$TA 127.0.0.1:3260" "$TB 127.0.0.1:3261"; do
    set -- $tp
    iscsiadm -m discovery -t sendtargets -p "$2" >/dev/null 2>&1 || fail "SendTargets discovery through $2"
    iscsiadm -m node -T "$1" -p "$2" -o update -n node.session.timeo.replacement_timeout -v 10 >/dev/null
    iscsiadm -m node -T "$1" -p "$2" --login >/dev/null || fail "login to $1 through $2"
done
wait_disks $TA 2 >/dev/null || fail "the disks of node a did not appear"
wait_disks $TB 2 >/dev/null || fail "the disks of node b did not appear"
A0=$(disk_of_lun $TA 0); A1=$(disk_of_lun $TA 1)
B0=$(disk_of_lun $TB 0); B1=$(disk_of_lun $TB 1)
step "through node a: LUN 0 /dev/$A0, LUN 1 /dev/$A1; through node b: /dev/$B0, /dev/$B1"

multipath -r >/dev/null 2>&1
wait_active $A0 $B0 60 "at start"
[ "$(access_state $A0)" = active/optimized ] || fail "/dev/$A0 is $(access_state $A0)"
[ "$(access_state $B0)" = active/non-optimized ] || fail "/dev/$B0 is $(access_state $B0)"
[ "$(cat /sys/block/$A0/device/wwid)" = "$(cat /sys/block/$B0/device/wwid)" ] ||
    fail "the two nodes' LUN 0 have different WWIDs"
# map_of DISK: the multipath map DISK is a path of.
map_of() {
    local m
    for m in $(dmsetup ls --target multipath | awk '{ print $1 }'); do
        dmsetup deps -o devname "$m" | grep -q "($1)" && { echo "$m"; return 0; }
    done
    return 1
}
MAP=$(map_of $A0) || { multipath -ll; fail "no multipath map holds /dev/$A0"; }
[ "$(map_of $B0)" = "$MAP" ] || { multipath -ll; fail "/dev/$A0 and /dev/$B0 are not paths of one map"; }
multipath -ll >/out/multipath-start.txt 2>&1
step "map $MAP: node a's path active/optimized, node b's active/non-optimized"

step "reservations: register 0x1234 and WRITE EXCLUSIVE through node a"
check "register through a" sg_persist --out --register --param-sark=0x1234 /dev/$A1 >/dev/null
check "reserve through a" sg_persist --out --reserve --param-rk=0x1234 --prout-type=1 /dev/$A1 >/dev/null
# At once: PERSISTENT RESERVE IN reads the state from etcd.
sg_persist -k /dev/$B1 >/out/pr-keys-b.txt 2>&1
grep -q 0x1234 /out/pr-keys-b.txt || { cat /out/pr-keys-b.txt; fail "node b does not list the key registered through node a"; }
sg_persist -r /dev/$B1 >/out/pr-res-b.txt 2>&1
grep -qi "Write Exclusive" /out/pr-res-b.txt || { cat /out/pr-res-b.txt; fail "node b does not report the WRITE EXCLUSIVE reservation"; }
head -c 512 /dev/zero >/tmp/ha/zero
sg_raw -s 512 -i /tmp/ha/zero /dev/$B1 2a 00 00 00 00 08 00 00 01 00 >/out/pr-write-b.txt 2>&1 &&
    fail "a write through node b passed another nexus's WRITE EXCLUSIVE reservation"
grep -qi "reservation conflict" /out/pr-write-b.txt || { cat /out/pr-write-b.txt; fail "the write through node b did not get RESERVATION CONFLICT"; }
step "node b lists the key and the reservation, and refuses a write with RESERVATION CONFLICT"

verified_jobs ha /dev/mapper/$MAP 24 4 &
IO=$!
# wait_written DISK SECTORS SECONDS
wait_written() {
    local from until=$((SECONDS + $3)); from=$(written "$1")
    while [ $SECONDS -lt $until ]; do
        [ $(($(written "$1") - from)) -ge "$2" ] && return 0
        kill -0 $IO 2>/dev/null || { wait $IO; fail "the verified I/O on the map ended (status $?)"; }
        sleep 0.1
    done
    fail "/dev/$1 wrote fewer than $2 sectors in $3 s"
}
wait_written $A0 4096 60
step "verified jobs on the map write through node a"

step "node a killed (SIGKILL)"
t0=$(date +%s.%N)
kill -KILL $PID_a
wait_states b nonoptimized active $((TTL * 6)) "after node a died"
t1=$(date +%s.%N)
wait_active $B0 $A0 90 "after node a died"
wait_written $B0 4096 90
t2=$(date +%s.%N)
step "node b owns dg0 $(echo "$t1 - $t0" | bc) s after the kill (lease $TTL s); writes go through node b $(echo "$t2 - $t0" | bc) s after it"

step "node a restarted"
start_node a
wait_states a nonoptimized active 30 "node a restarted"
for i in $(seq 1 150); do
    timeout 5 sg_turs /dev/$A0 >/dev/null 2>&1
    [ "$(access_state $A0)" = active/non-optimized ] && break
    sleep 0.2
done
[ "$(access_state $A0)" = active/non-optimized ] || fail "node a's path is $(access_state $A0) after its restart"
step "node a joined as non-optimized"

step "node b cut off from etcd (owner)"
kill $RELAY; wait $RELAY 2>/dev/null
pkill -f "TCP-LISTEN:2479" 2>/dev/null
tc0=$(date +%s)
sg_persist --out --register --param-sark=0x77 /dev/$B1 >/out/pr-cut.txt 2>&1 &&
    fail "a reservation change through node b succeeded without etcd"
tc1=$(date +%s)
[ $((tc1 - tc0)) -le 30 ] || fail "the reservation change through node b took $((tc1 - tc0)) s to fail"
grep -qi "aborted command\|communication failure" /out/pr-cut.txt || { cat /out/pr-cut.txt; fail "the refused reservation change carries no sense"; }
step "a reservation change through node b fails at once: $(grep -i -m1 "aborted\|communication" /out/pr-cut.txt)"
# Fenced, node b sets its own group standby and knows nothing newer of the
# other; node a, live, takes the device group over once b's lease ran out.
wait_states b nonoptimized standby $((TTL * 6)) "node b fenced"
wait_states a active nonoptimized $((TTL * 6)) "node a taking over from the fenced node b"
wait_active $A0 $B0 90 "after node b was fenced"
sg_raw -s 512 -i /tmp/ha/zero /dev/$B0 2a 00 00 00 00 00 00 00 01 00 >/out/fenced-write.txt 2>&1 &&
    fail "the fenced node b took a write"
grep -qi "standby" /out/fenced-write.txt || { cat /out/fenced-write.txt; fail "the fenced node's refusal is not TARGET PORT IN STANDBY STATE"; }
wait_written $A0 4096 90
step "node b fenced refuses writes (standby) while node a took over and takes them"

step "node b's relay back"
relay_up
wait_states b active nonoptimized $((TTL * 10)) "node b back in touch with etcd"
step "node b rejoined as non-optimized"

touch /tmp/ha.done
wait $IO || fail "the verified I/O on the map failed"
jobs=$(cat /tmp/ha.jobs 2>/dev/null || echo 0)
for d in $A1 $B1; do
    sg_persist -k /dev/$d 2>/dev/null | grep -q 0x1234 || fail "the key is gone through /dev/$d"
    sg_persist -r /dev/$d 2>/dev/null | grep -qi "Write Exclusive" || fail "the reservation is gone through /dev/$d"
done
dmesg >/out/dmesg.log
! grep -q "I/O error, dev dm-\|Buffer I/O error on dev dm-" /out/dmesg.log || fail "the kernel reported I/O errors on the map"
multipath -ll >/out/multipath-end.txt 2>&1
kill $MPATHD $ETCD 2>/dev/null
pass "failover on SIGKILL and on a partition from etcd without split brain; $jobs verified jobs; the reservation kept through both"
