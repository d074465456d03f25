# lio-import.sh - moving a LUN from LIO to ferrited without the initiator
# noticing: LIO is configured with targetcli as an administrator leaves it
# (a fileio backstore, an iSCSI target, an ACL for open-iscsi, saveconfig),
# open-iscsi logs in and registers a persistent reservation key with APTPL
# and takes a WRITE EXCLUSIVE reservation; LIO's identity is recorded. LIO is
# cleared, `ferritectl import-lio` converts its saveconfig.json and APTPL file,
# ferrited serves the same backing file on the same portal, and the same
# initiator must see the same identity and the same reservation:
#   byte-identical `sg_vpd -p sn` and `sg_vpd -p di`, the same sysfs wwid,
#   the same scsi_id (dm-multipath's WWID), the same /dev/disk/by-id/wwn-*
#   names, the registered key (`sg_persist -k`) and the reservation (`-r`),
#   and the data written through LIO.
# `sg_inq` of both is kept in /out (LIO reports ALUA in TPGS and other
# version descriptors, so the standard INQUIRY data differs).
. "$(dirname "$0")/lib.sh"
iscsi_transport
command -v targetcli >/dev/null || fail "targetcli missing: install targetcli-fb (tools/install-test-deps does)"
IQN=iqn.2003-01.org.linux-iscsi.lab.x8664:sn.5a3c2e1f0b9d
H=127.0.0.1
KEY=0x4b1d

modprobe_all target_core_mod
mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config || fail "configfs"
# LIO's dbroot, where APTPL files go: rtslib sets it (Debian's rtslib to
# /etc/rtslib-fb-target, upstream's to /etc/target); its pr/ must exist.
mkdir -p /etc/target/pr /etc/rtslib-fb-target/pr || fail "LIO's dbroot"
modprobe_all target_core_file iscsi_target_mod
mkdir -p /lu && mount -t tmpfs -o size=256m tmpfs /lu || fail "tmpfs for the LU"
truncate -s 64M /lu/d1.img || fail "create /lu/d1.img"

start_udev
start_iscsid
OI_NAME=$(sed -n 's/^InitiatorName=//p' /etc/iscsi/initiatorname.iscsi | head -1)
[ -n "$OI_NAME" ] || fail "no InitiatorName in /etc/iscsi/initiatorname.iscsi"

step "LIO through targetcli"
# targetcli asks the system bus for tcmu-runner's backstores.
mkdir -p /run/dbus && dbus-daemon --system --fork >/dev/null 2>&1 || fail "dbus-daemon (install dbus)"
tc() { targetcli "$@" >>/out/targetcli.log 2>&1 || { cat /out/targetcli.log; fail "targetcli $*"; }; }
tc /backstores/fileio create name=d1 file_or_dev=/lu/d1.img size=64M write_back=false
tc /iscsi create $IQN
tc /iscsi/$IQN/tpg1/luns create /backstores/fileio/d1
tc /iscsi/$IQN/tpg1/acls create $OI_NAME
# Newer targetcli adds the 0.0.0.0:3260 portal itself; older needs it.
ls /sys/kernel/config/target/iscsi/$IQN/tpgt_1/np/ | grep -q 3260 ||
    tc /iscsi/$IQN/tpg1/portals create 0.0.0.0 3260
tc saveconfig /out/saveconfig.json
wait_port $H 3260

# record NAME: what the initiator sees of LUN 0 of $IQN, in /out/NAME-*.
record() {
    local d
    discover $P
    iscsiadm -m node -T $IQN -p $P --login >/dev/null || fail "$1: login"
    d=$(wait_disks $IQN 1) || fail "$1: no disk"
    udevadm settle >/dev/null 2>&1
    sg_inq /dev/$d >/out/$1-inq.txt 2>&1 || fail "$1: sg_inq"
    sg_vpd -p sn /dev/$d >/out/$1-sn.txt 2>&1 || fail "$1: sg_vpd -p sn"
    sg_vpd -p di /dev/$d >/out/$1-di.txt 2>&1 || fail "$1: sg_vpd -p di"
    cat /sys/block/$d/device/wwid >/out/$1-wwid.txt || fail "$1: sysfs wwid"
    /lib/udev/scsi_id -g -u -d /dev/$d >/out/$1-scsi_id.txt || fail "$1: scsi_id"
    ls /dev/disk/by-id/ | grep '^wwn-' | sort >/out/$1-by-id.txt
    DISK=$d
    step "$1: /dev/$d, wwid $(cat /out/$1-wwid.txt), multipath WWID $(cat /out/$1-scsi_id.txt)"
}

record lio
dd if=/dev/urandom of=/tmp/pattern bs=1M count=4 2>/dev/null
dd if=/tmp/pattern of=/dev/$DISK bs=1M oflag=direct 2>/dev/null || fail "write through LIO"
check "register through LIO" sg_persist --out --register --param-sark=$KEY --param-aptpl /dev/$DISK
check "reserve through LIO" sg_persist --out --reserve --param-rk=$KEY --prout-type=1 /dev/$DISK
DBROOT=$(cat /sys/kernel/config/target/dbroot)
ls $DBROOT/pr/ >/out/lio-pr.txt
iscsiadm -m node -T $IQN -p $P --logout >/dev/null || fail "logout from LIO"
iscsiadm -m node -o delete -T $IQN >/dev/null 2>&1
# The APTPL file stays behind when LIO goes, as after a reboot.
mkdir -p /out/pr && cp $DBROOT/pr/aptpl_* /out/pr/ || fail "LIO wrote no APTPL file in $DBROOT/pr"
tc clearconfig confirm=True
modprobe -r iscsi_target_mod 2>/dev/null

step "ferritectl import-lio"
"$FERRITECTL" import-lio /out/saveconfig.json -o /out/ferrite.json --pr-dir /out/pr \
    --state-dir "$LAB_STATE" >/out/import.log 2>&1 || { cat /out/import.log; fail "import-lio"; }
cat /out/import.log
start_ferrited --config /out/ferrite.json
wait_portal
record ferrited
for f in sn di wwid scsi_id by-id; do
    cmp -s /out/lio-$f.txt /out/ferrited-$f.txt ||
        { diff /out/lio-$f.txt /out/ferrited-$f.txt; fail "$f differs between LIO and ferrited"; }
    step "$f identical"
done
[ -s /out/lio-by-id.txt ] || fail "no wwn-* name in /dev/disk/by-id"
dd if=/dev/$DISK of=/tmp/back bs=1M count=4 iflag=direct 2>/dev/null || fail "read through ferrited"
cmp /tmp/pattern /tmp/back || fail "the data written through LIO differs through ferrited"
sg_persist --in --read-keys /dev/$DISK >/out/ferrited-keys.txt 2>&1 || fail "sg_persist -k"
grep -q "$KEY" /out/ferrited-keys.txt || { cat /out/ferrited-keys.txt; fail "the key registered through LIO is gone"; }
sg_persist --in --read-reservation /dev/$DISK >/out/ferrited-res.txt 2>&1 || fail "sg_persist -r"
grep -q "Key=$KEY" /out/ferrited-res.txt && grep -q "Write Exclusive" /out/ferrited-res.txt ||
    { cat /out/ferrited-res.txt; fail "the reservation taken through LIO is gone"; }
step "key and reservation carried"
diff /out/lio-inq.txt /out/ferrited-inq.txt >/out/inq.diff
iscsiadm -m node -T $IQN -p $P --logout >/dev/null || fail "logout from ferrited"
pass
