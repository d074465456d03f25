# lib.sh - sourced by every lab scenario; runs inside the guest as root.
#
# A scenario prints "lab: STEP" as it goes and ends with `pass`; the first
# failed check calls `fail REASON`, which dumps what explains it (ferrited's
# log tail, the kernel log) and exits non-zero. The harness
# (tests/src/lab.rs) reports the reason and the logs saved under /out.
#
# Variables from the harness: FERRITED, FERRITECTL (binaries built on the
# host, visible here through the 9p root).
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LAB_STATE=/tmp/ferrite
CTL_SOCK=$LAB_STATE/ferrited.sock
DEFAULT_IQN=iqn.2026-11.org.ferrite:default
FERRITED_PID=

step() { echo "lab: $*"; }
fail() {
    echo "lab: FAIL: $*"
    if [ -f /out/ferrited.log ]; then echo "--- ferrited.log (tail)"; tail -n 40 /out/ferrited.log; fi
    echo "--- dmesg (tail)"; dmesg | tail -n 40
    dmesg > /out/dmesg.log 2>/dev/null
    exit 1
}
# Under iSER a scenario passes only if ferrited logged no iSER protocol or
# transfer error (unless it sets ISER_LOG_CHECK=0: one whose initiators may
# die mid-connection, where a failed Send to the dead peer is expected).
pass() {
    dmesg > /out/dmesg.log 2>/dev/null
    if [ "${ISCSI_TRANSPORT:-}" = iser ] && [ "${ISER_LOG_CHECK:-1}" = 1 ] && grep -E "iSER: .*closing the connection|work request failed" /out/ferrited.log; then
        fail "ferrited reported an iSER protocol or transfer error"
    fi
    echo "lab: PASS${1:+: $*}"; exit 0
}
# check DESCRIPTION CMD...: run CMD, fail with DESCRIPTION when it fails.
check() { local what=$1; shift; "$@" || fail "$what (exit $?: $*)"; }

modprobe_all() { local m; for m in "$@"; do modprobe "$m" || fail "modprobe $m"; done; }

# start_ferrited [ARGS...]: ferrited with its state in $LAB_STATE, its log
# appended to /out/ferrited.log; returns once the control socket answers.
start_ferrited() {
    mkdir -p "$LAB_STATE"; rm -f "$CTL_SOCK"
    RUST_LOG=${FERRITE_LOG:-info} "$FERRITED" --state-dir "$LAB_STATE" --control "$CTL_SOCK" "$@" \
        >>/out/ferrited.log 2>&1 &
    FERRITED_PID=$!
    local i
    for i in $(seq 1 300); do
        if [ -S "$CTL_SOCK" ] && ctl ls / >/dev/null 2>&1; then return 0; fi
        kill -0 "$FERRITED_PID" 2>/dev/null || fail "ferrited exited at start"
        sleep 0.2
    done
    fail "ferrited's control socket never answered"
}
stop_ferrited() {
    [ -n "$FERRITED_PID" ] || return 0
    kill -TERM "$FERRITED_PID" 2>/dev/null; wait "$FERRITED_PID" 2>/dev/null; FERRITED_PID=
}
ctl() { "$FERRITECTL" --socket "$CTL_SOCK" "$@"; }

# wait_port HOST PORT: until something accepts TCP connections there.
wait_port() {
    local i
    for i in $(seq 1 150); do
        (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
        sleep 0.2
    done
    fail "nothing listens on $1:$2"
}

# iscsid wants its lock and database folders; the guest's /run is fresh.
start_iscsid() {
    mkdir -p /run/lock/iscsi /etc/iscsi /var/lib/iscsi/nodes /var/lib/iscsi/send_targets
    [ -s /etc/iscsi/initiatorname.iscsi ] ||
        echo "InitiatorName=iqn.2026-12.org.ferrite.lab:initiator" >/etc/iscsi/initiatorname.iscsi
    modprobe_all iscsi_tcp sd_mod
    iscsid -f >/out/iscsid.log 2>&1 &
    # iscsiadm exits 21 (no sessions) once iscsid answers, 20 before.
    local i rc
    for i in $(seq 1 100); do
        iscsiadm -m session >/dev/null 2>&1; rc=$?
        [ $rc -eq 0 ] || [ $rc -eq 21 ] && return 0
        sleep 0.1
    done
    fail "iscsid never answered"
}

# iscsi_transport: the iSCSI transport a scenario runs over, chosen by the
# harness through LAB_ISCSI_TRANSPORT: tcp (the default: iscsi_tcp on
# loopback) or iser (ib_iser over rdma_rxe, see rxe_pair). Sets P, the portal
# the initiator uses, and PORTALS, the portal list of a ferrited target in
# its JSON configuration (under iser a TCP portal for SendTargets and the
# iSER portal on the same address).
iscsi_transport() {
    ISCSI_TRANSPORT=${LAB_ISCSI_TRANSPORT:-tcp}
    case $ISCSI_TRANSPORT in
        tcp)
            ip link set lo up
            P=127.0.0.1:3260
            PORTALS='"127.0.0.1:3260"' ;;
        iser)
            rxe_pair
            modprobe_all ib_iser
            P=10.99.0.1:3260
            PORTALS='"10.99.0.1:3260", "iser:10.99.0.1:3260"' ;;
        *) fail "LAB_ISCSI_TRANSPORT is '$ISCSI_TRANSPORT', not tcp or iser" ;;
    esac
}
# wait_portal [PORTAL]: until ferrited accepts connections on PORTAL ($P by
# default) and, under iser, its iSER portal there listens on RDMA/CM.
wait_portal() {
    local p=${1:-$P}
    wait_port "${p%:*}" "${p##*:}"
    [ "$ISCSI_TRANSPORT" = iser ] || return 0
    local i
    for i in $(seq 1 100); do grep -q "iSER portal listening.*$p" /out/ferrited.log && return 0; sleep 0.2; done
    fail "ferrited's iSER portal on $p never listened"
}
# discover [PORTAL]: SendTargets discovery through PORTAL ($P by default),
# over TCP, its output in /out/discovery.txt. Under iser every node found is
# recorded again on open-iscsi's iser iface instead of the default (tcp)
# one, so the scenario's `iscsiadm -m node -T IQN -p PORTAL` commands log in
# over iSER.
discover() {
    local p=${1:-$P}
    iscsiadm -m discovery -t sendtargets -p "$p" >/out/discovery.txt 2>&1 ||
        { cat /out/discovery.txt; fail "SendTargets discovery through $p"; }
    [ "$ISCSI_TRANSPORT" = iser ] || return 0
    if ! iscsiadm -m iface -I iser 2>/dev/null | grep -q "iface.transport_name = iser"; then
        check "iface new" iscsiadm -m iface -I iser -o new
        check "iface transport" iscsiadm -m iface -I iser -o update -n iface.transport_name -v iser
    fi
    local iqn
    for iqn in $(awk -v p="$p" '$1 == p ",1" { print $2 }' /out/discovery.txt); do
        check "delete the tcp node of $iqn" iscsiadm -m node -o delete -T "$iqn" -p "$p"
        check "iser node for $iqn" iscsiadm -m node -o new -T "$iqn" -p "$p" -I iser
    done
}
# check_transport: every open-iscsi session runs over $ISCSI_TRANSPORT (and,
# under iser, ferritectl sessions shows an iSER connection).
check_transport() {
    local t
    t=$(iscsiadm -m session -P 1 2>/dev/null | awk '/Iface Transport:/ { print $3 }' | sort -u)
    [ -n "$t" ] || fail "no iSCSI session to check the transport of"
    [ "$t" = "$ISCSI_TRANSPORT" ] || fail "the sessions run over '$(echo $t)', not $ISCSI_TRANSPORT"
    [ "$ISCSI_TRANSPORT" = iser ] || return 0
    ctl sessions >/out/sessions.txt 2>&1 || true
    grep -q "iser:" /out/sessions.txt || { cat /out/sessions.txt; fail "ferritectl sessions shows no iSER connection"; }
}

# udev gives /dev/disk/by-*, and dm-multipath finds its paths through it.
start_udev() {
    /lib/systemd/systemd-udevd --daemon >/dev/null 2>&1 || fail "systemd-udevd"
    udevadm trigger >/dev/null 2>&1; udevadm settle >/dev/null 2>&1
}

# disks_of TARGET_IQN: the block devices (sda ...) of the open-iscsi sessions
# to TARGET_IQN, in LUN order.
disks_of() {
    local s
    for s in /sys/class/iscsi_session/session*; do
        [ "$(cat "$s/targetname" 2>/dev/null)" = "$1" ] || continue
        ls -d "$s"/device/target*/*:*:*:*/block/* 2>/dev/null | sort -t: -k4 -n | xargs -r -n1 basename
    done
}
# wait_disks TARGET_IQN N: until N disks of TARGET_IQN are there; prints them.
wait_disks() {
    local i d
    for i in $(seq 1 100); do
        d=$(disks_of "$1")
        [ "$(echo "$d" | grep -c .)" -ge "$2" ] && { echo "$d"; return 0; }
        sleep 0.2
    done
    return 1
}
# disk_of_lun TARGET_IQN LUN: the block device of that LUN.
disk_of_lun() {
    local s
    for s in /sys/class/iscsi_session/session*; do
        [ "$(cat "$s/targetname" 2>/dev/null)" = "$1" ] || continue
        ls -d "$s"/device/target*/*:*:*:"$2"/block/* 2>/dev/null | head -1 | xargs -r basename
    done
}

# fio_verify NAME DEVICE FIO-ARGS...: a fio job that verifies what it wrote
# (crc32c); fails the scenario on any error or verify mismatch.
fio_verify() {
    local name=$1 dev=$2; shift 2
    fio --name="$name" --filename="$dev" --direct=1 --ioengine=libaio --verify=crc32c \
        --verify_fatal=1 --output-format=terse --terse-version=3 "$@" >"/out/fio-$name.log" 2>&1 ||
        { cat "/out/fio-$name.log"; fail "fio $name"; }
    # terse v3: field 5 is the error code; 6, 7, 8 read KiB moved, KiB/s and IOPS; 47, 48, 49 the same for writes
    awk -F';' -v n="$name" '$1=="3" { printf "lab: fio %s: err=%s read %s KiB at %s KiB/s (%s IOPS), write %s KiB at %s KiB/s (%s IOPS)\n", n, $5, $6, $7, $8, $47, $48, $49; if ($5 != 0) exit 1 }' \
        "/out/fio-$name.log" || fail "fio $name reported an error"
}

# written DISK: sectors written to DISK so far.
written() { awk '{ print $7 }' /sys/block/$1/stat; }

# verified_jobs NAME DEVICE SIZE_MB SLOTS: back-to-back verified random
# write jobs (fio_verify NAME-1, NAME-2, ...) of SIZE_MB each over SLOTS
# slots of DEVICE, until /tmp/NAME.done exists; the number of jobs done so
# far in /tmp/NAME.jobs. Run it in the background; its status is the
# first failed job's.
verified_jobs() {
    local name=$1 dev=$2 size=$3 slots=$4 n=0
    while [ ! -e /tmp/$name.done ]; do
        n=$((n + 1))
        fio_verify $name-$n "$dev" --rw=randwrite --bs=64k --iodepth=8 --size=${size}M \
            --offset=$(((n % slots) * size))M
        echo $n >/tmp/$name.jobs
    done
}

# rxe_pair: two soft-RoCE devices on a veth pair, rxe0 on veth0 (10.99.0.1)
# and rxe1 on veth1 (10.99.0.2). Both addresses are the guest's own, so an
# RDMA/CM connection to 10.99.0.1 resolves to rxe0 and rxe carries it
# through its loopback: the SRP initiator logs in through srp-rxe0-1.
rxe_pair() {
    modprobe_all rdma_rxe ib_uverbs rdma_ucm
    ip link set lo up
    ip link add veth0 type veth peer name veth1 || fail "veth pair"
    ip addr add 10.99.0.1/24 dev veth0; ip addr add 10.99.0.2/24 dev veth1
    ip link set veth0 up; ip link set veth1 up
    rdma link add rxe0 type rxe netdev veth0 || fail "rdma link add rxe0"
    rdma link add rxe1 type rxe netdev veth1 || fail "rdma link add rxe1"
}

# SRP port id of the lab's SRP targets, and the halves ib_srp names it by.
SRP_PORT_ID=0x66657272697465206c61622070307430
SRP_ID_EXT=${SRP_PORT_ID:2:16}
SRP_IOC_GUID=${SRP_PORT_ID:18:16}
SRP_LISTEN=10.99.0.1:5555

# srp_config FILE DEVICES-JSON LUNS-JSON: a configuration with one SRP port on
# rxe0 (verbs provider, RDMA/CM on $SRP_LISTEN) and no iSCSI target.
srp_config() {
    cat >"$1" <<JSON
{ "devices": [ $2 ],
  "targets": { "iscsi": [], "srp": [
    { "name": "srp0", "port_id": "$SRP_PORT_ID",
      "provider": { "kind": "verbs", "device": "rxe0", "port": 1, "listen": "$SRP_LISTEN" },
      "luns": [ $3 ] } ] } }
JSON
}

# wait_srp_listening: until ferrited's SRP port listens on RDMA/CM (a login
# sent before gets a plain CM reject, without an SRP reason).
wait_srp_listening() {
    local i
    for i in $(seq 1 100); do grep -q "SRP target port listening" /out/ferrited.log && return 0; sleep 0.2; done
    fail "ferrited's SRP port never listened"
}

# srp_login [EXTRA]: ib_srp logs in to the lab's SRP port over RDMA/CM
# (EXTRA: more add_target options, e.g. ch_count=2).
srp_login() {
    local opts="id_ext=$SRP_ID_EXT,ioc_guid=$SRP_IOC_GUID,dest=$SRP_LISTEN${1:+,$1}"
    echo "$opts" >/sys/class/infiniband_srp/srp-rxe0-1/add_target ||
        fail "ib_srp add_target $opts refused: $(dmesg | grep -i srp | tail -3)"
}
# srp_disks N: the first N SCSI disks (the lab guest has no others), in
# LUN order, after waiting for them.
srp_disks() {
    local i d
    for i in $(seq 1 100); do
        d=$(ls -d /sys/class/scsi_disk/*/device/block/* 2>/dev/null | sort -t: -k4 -n | xargs -r -n1 basename)
        [ "$(echo "$d" | grep -c .)" -ge "$1" ] && { echo "$d" | head -n "$1"; return 0; }
        sleep 0.2
    done
    return 1
}

# lio_w FILE VALUE: one configfs write for LIO, checked.
lio_w() { echo "$2" >"$1" || fail "LIO: write '$2' to $1"; }

# lio_fileio_lu FABRIC-MODULE IMAGE SIZE: the kernel's target LIO with one
# thin fileio LU on IMAGE (SIZE bytes, created if missing), configured through
# configfs as targetcli would, and FABRIC-MODULE (iscsi_target_mod, ib_srpt)
# loaded. Sets C (LIO's configfs root) and LIO_LU (the backstore).
lio_fileio_lu() {
    modprobe_all target_core_mod
    mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config || fail "configfs"
    C=/sys/kernel/config/target
    [ -d $C ] || fail "no $C after loading target_core_mod"
    # Where LIO keeps persistent reservation (APTPL) and ALUA state; without
    # its pr/ folder every PERSISTENT RESERVE OUT that would save state fails
    # with NOT READY. targetcli points it at /etc/target; it can be set only
    # before a fabric module registers.
    mkdir -p /etc/target/pr /etc/target/alua || fail "LIO: /etc/target"
    lio_w $C/dbroot /etc/target
    modprobe_all target_core_file "$1"
    lio_fileio_backstore lu0 "$2" "$3" 3f1c2b7e-0d4a-4e59-8a6b-5c9e2d71f0a3
    LIO_LU=$LIO_BS
}

# lio_fileio_backstore NAME IMAGE SIZE SERIAL: one more thin fileio
# backstore of LIO (after lio_fileio_lu) on IMAGE (SIZE bytes, created if
# missing), enabled, with that unit serial; sets LIO_BS to its configfs
# folder.
lio_fileio_backstore() {
    local b=$C/core/fileio_0/$1
    [ -e "$2" ] || truncate -s "$3" "$2" || fail "create $2"
    mkdir -p $b || fail "LIO: backstore $1"
    # targetcli's fileio default is write-back (buffered), as ferrited's fileio is.
    lio_w $b/control "fd_dev_name=$2,fd_dev_size=$3,fd_buffered_io=1"
    # The unit serial names the LU in VPD pages 80h/83h and names LIO's
    # persistent reservation file (dbroot/pr/aptpl_<serial>).
    lio_w $b/wwn/vpd_unit_serial $4
    lio_w $b/enable 1
    # Thin provisioning (UNMAP and WRITE SAME with UNMAP); LIO takes them only
    # once the device is enabled.
    lio_w $b/attrib/emulate_tpu 1
    lio_w $b/attrib/emulate_tpws 1
    LIO_BS=$b
}

# verbs_tests LABEL ENV BIN MIN: runs the project's test binary BIN (its
# RDMA tests, which skip without a device) with ENV=rxe0,10.99.0.1 on the
# guest's soft-RoCE device, its output in /out/LABEL.log; fails unless at
# least MIN tests ran and passed.
verbs_tests() {
    local label=$1 env=$2 bin=$3 min=$4 rc n
    [ -x "$bin" ] || fail "no $label test binary ($bin)"
    env "$env=rxe0,10.99.0.1" FERRITED="$FERRITED" RUST_BACKTRACE=1 \
        "$bin" --test-threads=1 --nocapture >"/out/$label.log" 2>&1
    rc=$?
    grep -E "^test |test result" "/out/$label.log"
    [ $rc -eq 0 ] || { tail -n 60 "/out/$label.log"; fail "$label tests failed (status $rc)"; }
    grep -q "skipping .* over verbs" "/out/$label.log" && fail "the $label tests skipped: no RDMA device seen"
    n=$(sed -n "s/^test result: ok. \([0-9]*\) passed.*/\1/p" "/out/$label.log")
    [ "${n:-0}" -ge "$min" ] || fail "only $n $label tests ran"
    N=$n
}


# alua_multipath: dm-multipath for ALUA targets: paths grouped by the
# priority `prio alua` reads from REPORT TARGET PORT GROUPS, scsi_dh_alua
# attached, failback to the best group at once; multipathd running (its
# pid in MPATHD).
alua_multipath() {
    mkdir -p /etc/multipath
    cat >/etc/multipath.conf <<'CONF'
defaults {
    user_friendly_names no
    find_multipaths no
    polling_interval 2
    no_path_retry queue
}
devices {
    device {
        vendor "FERRITE"
        product ".*"
        path_grouping_policy group_by_prio
        prio alua
        hardware_handler "1 alua"
        path_checker tur
        failback immediate
    }
}
blacklist {
    devnode "^(ram|loop|fd|md|dm-|sr|scd|st|nbd|zram|vd)"
}
CONF
    modprobe_all scsi_dh_alua dm_multipath dm_round_robin dm_service_time
    multipathd -d -s >/out/multipathd.log 2>&1 &
    MPATHD=$!
}
# access_state DISK: what scsi_dh_alua made of the path.
access_state() { cat /sys/block/$1/device/access_state 2>/dev/null; }
# group_of DISK: the `status=` of the multipath path group DISK is in.
group_of() {
    multipath -ll 2>/dev/null | awk -v d=" $1 " '
        /policy=/ { st = $0; sub(/.*status=/, "", st); sub(/ .*/, "", st) }
        index($0, d) { print st; exit }'
}
# wait_active DISK OTHER SECONDS WHY: until DISK's multipath path group is
# the active one and OTHER's is not (or OTHER failed); each look is logged
# in /out/paths.log.
wait_active() {
    local until=$((SECONDS + $3)) g1 g2
    while [ $SECONDS -lt $until ]; do
        g1=$(group_of $1); g2=$(group_of $2)
        echo "$(date +%T) /dev/$1 $g1 ($(access_state $1)), /dev/$2 $g2 ($(access_state $2))" >>/out/paths.log
        # OTHER out of the active group, or failed in it (multipathd keeps
        # a dead path's last priority, so it may stay grouped with DISK).
        [ "$g1" = active ] && [ -n "$g2" ] &&
            { [ "$g2" != active ] || multipath -ll 2>/dev/null | grep " $2 " | grep -q failed; } && return 0
        # A command on the path that should become active brings its unit
        # attention; the other path may lead to a dead node: left alone.
        timeout 5 sg_turs /dev/$1 >/dev/null 2>&1
        sleep 0.2
    done
    multipath -ll
    fail "$4: /dev/$1's path group is '$(group_of $1)', /dev/$2's '$(group_of $2)'"
}
