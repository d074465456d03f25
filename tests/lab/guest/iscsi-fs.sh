# iscsi-fs.sh - filesystems on a ferrited fileio LUN through open-iscsi: ext4
# and xfs in turn (FS_TYPES), on each: mkfs, FS_FILES (16) files of 16 MiB
# and 200 small ones written with their checksums, unmounted, logged out and
# in again, remounted, every checksum matching, and the filesystem checker
# finding nothing to repair.
# Runs over TCP, or over iSER with LAB_ISCSI_TRANSPORT=iser (lib.sh: iscsi_transport).
. "$(dirname "$0")/lib.sh"
iscsi_transport
IQN=iqn.2026-12.org.ferrite.lab:fs
cat >/tmp/fs.json <<JSON
{ "devices": [ { "name": "f0", "handler": "vdisk_fileio", "filename": "/tmp/fs.img", "size": 1073741824, "thin_provisioned": true } ],
  "targets": { "iscsi": [ { "name": "$IQN", "portals": [$PORTALS], "luns": [ { "lun": 0, "device": "f0" } ] } ] } }
JSON
modprobe_all ext4 xfs
start_ferrited --config /tmp/fs.json
wait_portal
start_iscsid
discover
login() { iscsiadm -m node -T $IQN -p $P --login >/dev/null || fail "login"; D=$(wait_disks $IQN 1) || fail "no disk"; check_transport; }
logout() { iscsiadm -m node -T $IQN -p $P --logout >/dev/null || fail "logout"; }
FS_TYPES=${FS_TYPES:-ext4 xfs}
FS_FILES=${FS_FILES:-16}
mkdir -p /mnt/t
for fs in $FS_TYPES; do
    login
    step "$fs: mkfs on /dev/$D"
    case $fs in
        ext4) check "mkfs.ext4" mkfs.ext4 -q -F /dev/$D ;;
        xfs) check "mkfs.xfs" mkfs.xfs -q -f /dev/$D ;;
    esac
    check "mount $fs" mount /dev/$D /mnt/t
    : >/tmp/sums
    for i in $(seq 1 "$FS_FILES"); do
        dd if=/dev/urandom bs=1M count=16 2>/dev/null | tee /mnt/t/file$i | sha256sum | sed "s#-#/mnt/t/file$i#" >>/tmp/sums
    done
    mkdir -p /mnt/t/dir; for i in $(seq 1 200); do echo "small $i" >/mnt/t/dir/s$i; done
    ( cd /mnt/t/dir && cat s* | sha256sum ) >/tmp/small.sum
    used=$(du -sm /mnt/t | cut -f1)
    [ "$used" -ge $((FS_FILES * 16)) ] || fail "$fs: only $used MiB written"
    check "umount $fs" umount /mnt/t
    logout
    step "$fs: $used MiB written, unmounted, logged out"
    login
    check "remount $fs" mount /dev/$D /mnt/t
    sha256sum -c --quiet /tmp/sums || fail "$fs: a file's checksum changed after the remount"
    ( cd /mnt/t/dir && cat s* | sha256sum ) | cmp -s - /tmp/small.sum || fail "$fs: small files changed"
    check "umount $fs" umount /mnt/t
    case $fs in
        ext4) e2fsck -f -n /dev/$D >/out/fsck-ext4.log 2>&1 || { cat /out/fsck-ext4.log; fail "e2fsck found errors"; } ;;
        xfs) xfs_repair -n /dev/$D >/out/fsck-xfs.log 2>&1 || { cat /out/fsck-xfs.log; fail "xfs_repair -n found errors"; } ;;
    esac
    step "$fs: checksums match after the remount, fsck clean"
    logout
done
pass "$(echo $FS_TYPES | sed 's/ / and /g'): $((FS_FILES * 16)) MiB written, remounted, checksums and fsck clean"
