# iser-io.sh - the Linux iSER initiator (open-iscsi with the iser transport,
# ib_iser) against ferrited's iSER portal over rdma_rxe: SendTargets over
# TCP reports the portal, a node with the iser iface logs in, a 16 MiB
# random-data round trip through dd compares identical, fio verifies 4 KiB
# random writes at QD 32 (crc32c), logout, and a second login reads the
# same data back.
. "$(dirname "$0")/lib.sh"
rxe_pair
modprobe_all ib_iser
P=10.99.0.1:3260
T=iqn.2026-12.org.ferrite.lab:iser
cat >/tmp/iser.json <<JSON
{ "devices": [
    { "name": "f0", "handler": "vdisk_fileio", "filename": "/tmp/iser0.img", "size": 134217728 } ],
  "targets": { "iscsi": [
    { "name": "$T", "portals": ["$P", "iser:$P"], "luns": [ { "lun": 0, "device": "f0" } ] } ] } }
JSON
start_ferrited --config /tmp/iser.json
wait_port 10.99.0.1 3260
grep -q "iSER portal listening" /out/ferrited.log || fail "ferrited did not bind the iSER portal"
start_iscsid

step "discovery (SendTargets over TCP)"
iscsiadm -m discovery -t sendtargets -p $P >/out/discovery.txt 2>&1 || { cat /out/discovery.txt; fail "SendTargets discovery"; }
cat /out/discovery.txt
grep -q "^$P,1 $T\$" /out/discovery.txt || fail "SendTargets did not report $P for $T"

step "iser iface and node"
# open-iscsi knows an "iser" iface of its own; make one only where it does not.
if ! iscsiadm -m iface -I iser 2>/dev/null | grep -q "iface.transport_name = iser"; then
    check "iface new" iscsiadm -m iface -I iser -o new
    check "iface transport" iscsiadm -m iface -I iser -o update -n iface.transport_name -v iser
fi
check "node new" iscsiadm -m node -o new -T $T -p $P -I iser

login() {
    iscsiadm -m node -T $T -p $P -I iser --login >/out/login.txt 2>&1 || { cat /out/login.txt; fail "iSER login"; }
    D=$(wait_disks $T 1) || fail "no SCSI disk appeared after the iSER login"
    D=$(echo "$D" | head -1)
    local tr
    tr=$(iscsiadm -m session -P 1 2>/dev/null | awk '/Iface Transport:/ {print $3; exit}')
    [ "$tr" = "iser" ] || fail "the session's transport is '$tr', not iser"
    step "logged in over iSER: /dev/$D"
}
logout() {
    iscsiadm -m node -T $T -p $P -I iser --logout >/out/logout.txt 2>&1 || { cat /out/logout.txt; fail "iSER logout"; }
    local i
    for i in $(seq 1 50); do
        [ -z "$(disks_of $T)" ] && return 0
        sleep 0.2
    done
    fail "the disk stayed after the logout"
}

login
ctl sessions >/out/sessions.txt 2>&1 || true
grep -q "iser:" /out/sessions.txt || { cat /out/sessions.txt; fail "ferritectl sessions does not show the iSER connection"; }

step "dd: 16 MiB of random data written and read back"
dd if=/dev/urandom of=/tmp/rand.bin bs=1M count=16 2>/dev/null
check "dd write" dd if=/tmp/rand.bin of=/dev/$D bs=1M count=16 oflag=direct 2>/dev/null
check "dd read" dd if=/dev/$D of=/tmp/back.bin bs=1M count=16 iflag=direct 2>/dev/null
cmp /tmp/rand.bin /tmp/back.bin || fail "the data read back over iSER differs from what was written"
step "dd: 16 MiB identical"

# The runtime bounds a hang; it must not cut the verify pass short, which
# reads back all 64 MiB (terse field 6: KiB read).
fio_verify rand4k-qd32 /dev/$D --rw=randwrite --bs=4k --iodepth=32 --size=64m --offset=32m --runtime=240
awk -F';' '$1=="3" && $6 != 65536 { exit 1 }' /out/fio-rand4k-qd32.log ||
    fail "fio verified less than the 64 MiB it wrote (runtime limit reached)"

logout
step "logged out"
login
check "dd read after re-login" dd if=/dev/$D of=/tmp/back2.bin bs=1M count=16 iflag=direct 2>/dev/null
cmp /tmp/rand.bin /tmp/back2.bin || fail "the data read after the second login differs"
logout
grep -q "iSER connection" /out/ferrited.log || fail "ferrited logged no iSER connection"
if grep -E "iSER: .*closing the connection|work request failed" /out/ferrited.log; then
    fail "ferrited reported an iSER protocol or transfer error"
fi
pass "iSER: discovery, login, 16 MiB dd round trip, fio verify QD 32, logout, login again"
