# lio-cutover.sh - a live move from LIO to ferrited under I/O: LIO set up with
# targetcli (one fileio LU, an ACL for open-iscsi), open-iscsi logged in with
# dm-multipath on top (no_path_retry queue: queue_if_no_path), a persistent
# reservation key registered with APTPL and a WRITE EXCLUSIVE reservation
# held by this initiator. saveconfig.json and the APTPL file are imported
# with `ferritectl import-lio`; then, while a verified fio job writes to the
# multipath map, LIO is cleared and ferrited starts on the same portal with
# the imported configuration and the same backing file. The map must never
# go away (checked all along), the job must finish with its verify passing
# (the writes go on through ferrited: the reservation holder is the same
# nexus), and the key and the reservation must still be there.
. "$(dirname "$0")/lib.sh"
iscsi_transport
command -v targetcli >/dev/null || fail "targetcli missing: install targetcli-fb (tools/install-test-deps does)"
IQN=iqn.2003-01.org.linux-iscsi.lab.x8664:sn.c07e0a11b2d4
KEY=0x7e57
REPLACEMENT_TIMEOUT=120 # the session waits this long for the target to come back

modprobe_all target_core_mod
mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config || fail "configfs"
mkdir -p /etc/target/pr /etc/rtslib-fb-target/pr || fail "LIO's dbroot"
modprobe_all target_core_file iscsi_target_mod
mkdir -p /lu && mount -t tmpfs -o size=256m tmpfs /lu || fail "tmpfs for the LU"
truncate -s 128M /lu/d1.img || fail "create /lu/d1.img"
mkdir -p /run/dbus && dbus-daemon --system --fork >/dev/null 2>&1 || fail "dbus-daemon (install dbus)"

mkdir -p /etc/multipath
cat >/etc/multipath.conf <<'CONF'
defaults {
    user_friendly_names no
    find_multipaths no
    path_checker tur
    polling_interval 2
    no_path_retry queue
}
blacklist {
    devnode "^(ram|loop|fd|md|dm-|sr|scd|st|nbd|zram|vd)"
}
CONF
start_udev
start_iscsid
modprobe_all dm_multipath dm_round_robin dm_service_time
multipathd -d -s >/out/multipathd.log 2>&1 &
OI_NAME=$(sed -n 's/^InitiatorName=//p' /etc/iscsi/initiatorname.iscsi | head -1)
[ -n "$OI_NAME" ] || fail "no InitiatorName in /etc/iscsi/initiatorname.iscsi"

step "LIO through targetcli"
tc() { targetcli "$@" >>/out/targetcli.log 2>&1 || { cat /out/targetcli.log; fail "targetcli $*"; }; }
tc /backstores/fileio create name=d1 file_or_dev=/lu/d1.img size=128M write_back=false
tc /iscsi create $IQN
tc /iscsi/$IQN/tpg1/luns create /backstores/fileio/d1
tc /iscsi/$IQN/tpg1/acls create $OI_NAME
ls /sys/kernel/config/target/iscsi/$IQN/tpgt_1/np/ | grep -q 3260 ||
    tc /iscsi/$IQN/tpg1/portals create 0.0.0.0 3260
wait_port 127.0.0.1 3260

discover
iscsiadm -m node -T $IQN -p $P -o update -n node.session.timeo.replacement_timeout -v $REPLACEMENT_TIMEOUT >/dev/null ||
    fail "iscsiadm: set replacement_timeout"
iscsiadm -m node -T $IQN -p $P --login >/dev/null || fail "login to LIO"
D=$(wait_disks $IQN 1) || fail "no disk from LIO"
MAP=
for _ in $(seq 1 150); do
    MAP=$(dmsetup ls --target multipath 2>/dev/null | grep -v "No devices" | awk '{ print $1 }' | head -1)
    [ -n "$MAP" ] && [ -b /dev/mapper/$MAP ] && break
    multipath -r >/dev/null 2>&1
    udevadm settle >/dev/null 2>&1
    sleep 0.4
done
[ -n "$MAP" ] && [ -b /dev/mapper/$MAP ] ||
    { multipath -ll; dmsetup ls; ls -l /dev/mapper; fail "no multipath map over /dev/$D"; }
multipath -ll >/out/multipath-lio.txt 2>&1
step "map $MAP over /dev/$D (LIO)"
check "register through LIO" sg_persist --out --register --param-sark=$KEY --param-aptpl /dev/$D
check "reserve through LIO" sg_persist --out --reserve --param-rk=$KEY --prout-type=1 /dev/$D

step "ferritectl import-lio (before the cutover, as an operator would)"
tc saveconfig /out/saveconfig.json
DBROOT=$(cat /sys/kernel/config/target/dbroot)
mkdir -p /out/pr && cp $DBROOT/pr/aptpl_* /out/pr/ || fail "LIO wrote no APTPL file in $DBROOT/pr"
"$FERRITECTL" import-lio /out/saveconfig.json -o /out/ferrite.json --pr-dir /out/pr \
    --state-dir "$LAB_STATE" >/out/import.log 2>&1 || { cat /out/import.log; fail "import-lio"; }

# The map is watched all along: /tmp/map-gone records a moment it was not there.
watch_map() {
    while [ ! -e /tmp/cutover.done ]; do
        dmsetup info "$MAP" >/dev/null 2>&1 || { date +%s.%N >>/tmp/map-gone; }
        sleep 0.1
    done
}
watch_map &
WATCH=$!

step "verified fio on /dev/mapper/$MAP"
fio_verify cutover /dev/mapper/$MAP --rw=randwrite --bs=64k --iodepth=8 --size=64M \
    --verify_backlog=128 --time_based --runtime=${CUTOVER_RUNTIME_S:-30} &
FIO=$!
sleep 4
kill -0 $FIO 2>/dev/null || { wait $FIO; fail "fio ended before the cutover (status $?)"; }

step "cutover: LIO cleared, ferrited started on the same portal"
t0=$(date +%s)
tc clearconfig confirm=True
modprobe -r iscsi_target_mod 2>/dev/null
start_ferrited --config /out/ferrite.json
wait_portal
for _ in $(seq 1 600); do
    ctl sessions 2>/dev/null | grep -q "$OI_NAME" && break
    kill -0 $FIO 2>/dev/null || break
    sleep 0.2
done
step "ferrited serving $(($(date +%s) - t0)) s after LIO went"
wait $FIO || fail "fio failed across the cutover (status $?)"
touch /tmp/cutover.done
wait $WATCH
[ -e /tmp/map-gone ] && fail "the multipath map went away during the cutover: $(head -3 /tmp/map-gone)"
multipath -ll >/out/multipath-ferrited.txt 2>&1
head -1 /out/multipath-lio.txt | awk '{ print $1 }' >/tmp/wwid-lio
head -1 /out/multipath-ferrited.txt | awk '{ print $1 }' >/tmp/wwid-ferrited
cmp -s /tmp/wwid-lio /tmp/wwid-ferrited || { cat /out/multipath-lio.txt /out/multipath-ferrited.txt; fail "the map's WWID changed"; }
grep -q "active ready" /out/multipath-ferrited.txt || { cat /out/multipath-ferrited.txt; fail "the path is not active on ferrited"; }
step "map $MAP kept its WWID $(cat /tmp/wwid-lio) and its path; fio verified"
sg_persist --in --read-keys /dev/$D >/out/keys.txt 2>&1 || fail "sg_persist -k"
grep -q "$KEY" /out/keys.txt || { cat /out/keys.txt; fail "the key registered through LIO is gone"; }
sg_persist --in --read-reservation /dev/$D >/out/res.txt 2>&1 || fail "sg_persist -r"
grep -q "Key=$KEY" /out/res.txt && grep -q "Write Exclusive" /out/res.txt ||
    { cat /out/res.txt; fail "the reservation taken through LIO is gone"; }
step "key and reservation carried"
pass
