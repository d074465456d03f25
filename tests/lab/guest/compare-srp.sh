# compare-srp.sh - ferrited's SRP port beside LIO's SRP target (ib_srpt) in
# one guest, on the same soft-RoCE device (rxe0), with the Linux SRP
# initiator (ib_srp over RDMA/CM) logged in to both. Absolute figures in a
# TCG guest mean nothing; ratios measured in one run do.
#
# Each target gets the same LU: a 1 GiB thin file (512-byte blocks) in one
# tmpfs; ferrited through vdisk_fileio on its verbs provider (RDMA/CM on
# 10.99.0.1:5555), LIO through fileio (buffered), unit serial,
# emulate_tpu/tpws, an ACL for the initiator's port id (RDMA/CM port 5556).
# Both logins use the same add_target options (ib_srp's defaults but dest).
# The region the jobs use is written once on each (reads meet data, not
# holes); then, in rounds, every job runs on one target and right after on
# the other (which one first alternates), so that the two runs of a pair
# share the guest's conditions of the moment (a busy host slows the whole
# guest for minutes at a time):
#   - the fio jobs of compare-iscsi.sh: 4 KiB random read and write at QD 1
#     and 32, 1 MiB sequential read and write at QD 8;
#   - the latency model: QD 1 random reads and writes of 512 B, 1, 2, 4, 8,
#     16 and 32 KiB (time = setup + bytes / bandwidth is fitted from them);
# time-bounded, direct I/O, terse v3 to /out/fio/<target>-<job>-<round>.terse.
#
# With COMPARE_ISER=1, iSER joins in on the same rxe0: the same ferrited
# also serves an iSCSI target on its own LU with an iser: portal
# (10.99.0.1:3260), LIO serves one through isert (10.99.0.1:3261, TCP and
# iSER), and open-iscsi's iser iface logs in to both: four targets,
# ferrited, lio (SRP), ferrited-iser and lio-iser, each round running every
# job on all four (in the list's order in odd rounds, reversed in even ones).
#
# Environment (all optional): FIO_RUNTIME_S (4), FIO_LAT_RUNTIME_S (3),
# FIO_SIZE_MB (256), FIO_REPS (3 rounds), SKIP_FIO_JOBS (1: the latency
# model's jobs only), COMPARE_ISER (0), SRP_OPTS (more add_target options
# for both), FERRITED_ARGS (more arguments for ferrited).
. "$(dirname "$0")/lib.sh"
step "kernel $(uname -r)"
uname -r >/out/kernel.txt
{
    echo "kernel $(uname -r)"
    dpkg-query -W -f='${Package} ${Version}\n' fio rdma-core ibverbs-providers 2>/dev/null
    "$FERRITED" --version 2>/dev/null
} >/out/versions.txt
rxe_pair
modprobe_all ib_srp sd_mod
ISER=${COMPARE_ISER:-0}
NAMES="ferrited lio"
[ "$ISER" = 1 ] && NAMES="ferrited lio ferrited-iser lio-iser"
FER_IQN=iqn.2026-12.org.ferrite.lab:ferrited-iser
LIO_IQN=iqn.2026-12.org.ferrite.lab:lio-iser
FER_ISER_P=10.99.0.1:3260 LIO_ISER_P=10.99.0.1:3261

LU_SIZE=1073741824
FIO_RUNTIME_S=${FIO_RUNTIME_S:-4}
FIO_LAT_RUNTIME_S=${FIO_LAT_RUNTIME_S:-3}
FIO_SIZE_MB=${FIO_SIZE_MB:-256}
FIO_REPS=${FIO_REPS:-3}
mkdir -p /lu && mount -t tmpfs -o size=5g tmpfs /lu || fail "tmpfs for the LUs"
mkdir -p /out/fio

# name:fio arguments (the jobs of compare-iscsi.sh)
FIO_JOBS="rand4k-read-qd1:--rw=randread,--bs=4k,--iodepth=1
rand4k-read-qd32:--rw=randread,--bs=4k,--iodepth=32
rand4k-write-qd1:--rw=randwrite,--bs=4k,--iodepth=1
rand4k-write-qd32:--rw=randwrite,--bs=4k,--iodepth=32
seq1m-read-qd8:--rw=read,--bs=1m,--iodepth=8
seq1m-write-qd8:--rw=write,--bs=1m,--iodepth=8"
[ "${SKIP_FIO_JOBS:-0}" = 1 ] && FIO_JOBS=""
# The latency model's jobs: lat-<read|write>-<bytes>.
LAT_JOBS=$(for rw in read write; do for b in 512 1024 2048 4096 8192 16384 32768; do
    echo "lat-$rw-$b:--rw=rand$rw,--bs=$b,--iodepth=1"; done; done)

LIO_CM_PORT=5556

# host_of DISK: the SCSI host number of /dev/DISK.
host_of() { ls -d /sys/class/scsi_disk/*/device/block/$1 | sed 's#.*/scsi_disk/\([0-9]*\):.*#\1#'; }
# disk_of_id_ext ID_EXT: the disk of the ib_srp host logged in with that id_ext.
disk_of_id_ext() {
    local i b h
    for i in $(seq 1 100); do
        for b in $(ls -d /sys/class/scsi_disk/*/device/block/* 2>/dev/null | xargs -r -n1 basename); do
            h=$(host_of "$b")
            [ "$(cat /sys/class/scsi_host/host$h/id_ext 2>/dev/null)" = "0x$1" ] && { echo "$b"; return 0; }
        done
        sleep 0.2
    done
    return 1
}
# host_info NAME DISK: what ib_srp negotiated, saved for the report.
host_info() {
    local s=/sys/class/scsi_host/host$(host_of "$2")
    echo "$1: ch_count=$(cat $s/ch_count) req_lim=$(cat $s/req_lim) queue_depth=$(cat /sys/block/$2/device/queue_depth) max_sectors_kb=$(cat /sys/block/$2/queue/max_sectors_kb)" |
        tee -a /out/srp-hosts.txt | sed 's/^/lab: /'
}

step "ferrited: SRP port on rxe0, $SRP_LISTEN"
truncate -s $LU_SIZE /lu/ferrited.img || fail "create /lu/ferrited.img"
srp_config /tmp/srp.json \
    "{ \"name\": \"lu0\", \"handler\": \"vdisk_fileio\", \"filename\": \"/lu/ferrited.img\", \"size\": $LU_SIZE, \"thin_provisioned\": true }" \
    '{ "lun": 0, "device": "lu0" }'
if [ "$ISER" = 1 ]; then
    # The same ferrited: a second LU behind an iSCSI target with an iSER
    # portal beside its TCP one (SendTargets).
    truncate -s $LU_SIZE /lu/ferrited-iser.img || fail "create /lu/ferrited-iser.img"
    python3 - /tmp/srp.json <<PY || fail "the iSER part of ferrited's configuration"
import json, sys
c = json.load(open(sys.argv[1]))
c["devices"].append({"name": "lu1", "handler": "vdisk_fileio", "filename": "/lu/ferrited-iser.img",
                     "size": $LU_SIZE, "thin_provisioned": True})
c["targets"]["iscsi"] = [{"name": "$FER_IQN", "portals": ["$FER_ISER_P", "iser:$FER_ISER_P"],
                          "luns": [{"lun": 0, "device": "lu1"}]}]
json.dump(c, open(sys.argv[1], "w"))
PY
fi
# shellcheck disable=SC2086
start_ferrited --config /tmp/srp.json ${FERRITED_ARGS:-}
wait_srp_listening
if [ "$ISER" = 1 ]; then
    ISCSI_TRANSPORT=iser
    wait_portal $FER_ISER_P
fi

step "LIO: ib_srpt on rxe0, RDMA/CM port $LIO_CM_PORT"
lio_fileio_lu ib_srpt /lu/lio.img $LU_SIZE
B=$LIO_LU
# ib_srpt: the RDMA/CM port is global; the target port is named by the port
# GID, the ACL by the initiator port id (extension 0, then the initiator's
# port GUID: rxe0's own, the initiator logs in through it).
mkdir -p $C/srpt || fail "LIO: srpt"
lio_w $C/srpt/discovery_auth/rdma_cm_port $LIO_CM_PORT
GID=$(tr -d ':' </sys/class/infiniband/rxe0/ports/1/gids/0)
GUID=$(tr -d ':' </sys/class/infiniband/rxe0/node_guid)
T=$C/srpt/0x$GID/tpgt_1
mkdir -p $T/lun/lun_0 || fail "LIO: srpt target port 0x$GID"
ln -s $B $T/lun/lun_0/lu0 || fail "LIO: LUN 0"
A=$T/acls/0x0000000000000000$GUID
mkdir -p $A/lun_0 || fail "LIO: ACL"
ln -s $T/lun/lun_0 $A/lun_0/map || fail "LIO: ACL LUN 0"
lio_w $T/enable 1

if [ "$ISER" = 1 ]; then
    step "LIO: isert on $LIO_ISER_P"
    modprobe_all iscsi_target_mod ib_isert ib_iser
    lio_fileio_backstore lu1 /lu/lio-iser.img $LU_SIZE 6b2f1d9e-3c4a-4f7b-9e05-8d1c2a3b4e5f
    B1=$LIO_BS
    TI=$C/iscsi/$LIO_IQN/tpgt_1
    mkdir -p $TI/lun/lun_0 || fail "LIO: iSCSI target portal group"
    ln -s $B1 $TI/lun/lun_0/lu1 || fail "LIO: iSCSI LUN 0"
    mkdir $TI/np/$LIO_ISER_P || fail "LIO: portal $LIO_ISER_P"
    lio_w $TI/np/$LIO_ISER_P/iser 1
    for a in generate_node_acls:1 demo_mode_write_protect:0 authentication:0 cache_dynamic_acls:1; do
        lio_w $TI/attrib/${a%%:*} ${a#*:}
    done
    lio_w $TI/enable 1
    wait_port ${LIO_ISER_P%:*} ${LIO_ISER_P##*:}
fi

step "ib_srp logs in to both"
srp_login "${SRP_OPTS:-}"
echo "id_ext=$GUID,ioc_guid=$GUID,dest=${SRP_LISTEN%:*}:$LIO_CM_PORT${SRP_OPTS:+,$SRP_OPTS}" \
    >/sys/class/infiniband_srp/srp-rxe0-1/add_target ||
    fail "ib_srp add_target to LIO refused: $(dmesg | grep -i srp | tail -3)"
declare -A DISK
DISK[ferrited]=$(disk_of_id_ext $SRP_ID_EXT) || fail "no disk of ferrited's SRP port: $(dmesg | grep -i srp | tail -3)"
DISK[lio]=$(disk_of_id_ext $GUID) || fail "no disk of LIO's SRP port: $(dmesg | grep -i srp | tail -3)"
if [ "$ISER" = 1 ]; then
    step "open-iscsi logs in over iSER to both"
    start_iscsid
    for t in "$FER_IQN $FER_ISER_P" "$LIO_IQN $LIO_ISER_P"; do
        set -- $t
        discover "$2"
        check "iSER login to $1" iscsiadm -m node -T "$1" -p "$2" --login
    done
    check_transport
    DISK[ferrited-iser]=$(wait_disks $FER_IQN 1) || fail "no disk of ferrited's iSER target"
    DISK[lio-iser]=$(wait_disks $LIO_IQN 1) || fail "no disk of LIO's iSER target"
    iscsiadm -m session -P 2 >/out/iser-sessions.txt 2>&1
fi
for name in $NAMES; do
    # The same block layer settings for all: no scheduler in between.
    echo none >/sys/block/${DISK[$name]}/queue/scheduler 2>/dev/null
    case $name in *-iser) ;; *) host_info $name ${DISK[$name]} ;; esac
    fio --name=fill --filename=/dev/${DISK[$name]} --direct=1 --ioengine=libaio --rw=write --bs=1m \
        --iodepth=8 --size=${FIO_SIZE_MB}m >/out/fio/$name-fill.log 2>&1 </dev/null ||
        { cat /out/fio/$name-fill.log; fail "fio: filling $name's region"; }
done

step "fio: ${FIO_SIZE_MB} MiB written on each; $FIO_REPS rounds"
for rep in $(seq 1 "$FIO_REPS"); do
    order=$NAMES; [ $((rep % 2)) = 0 ] && order=$(echo $NAMES | tr ' ' '\n' | tac | tr '\n' ' ')
    while IFS=: read -r job args; do
        rt=$FIO_RUNTIME_S
        case $job in lat-*) rt=$FIO_LAT_RUNTIME_S ;; esac
        for name in $order; do
            f=/out/fio/$name-$job-$rep.terse
            # shellcheck disable=SC2086
            fio --name="$job" --filename=/dev/${DISK[$name]} --direct=1 --ioengine=libaio \
                --size=${FIO_SIZE_MB}m --runtime=$rt --time_based --norandommap \
                --output-format=terse --terse-version=3 ${args//,/ } >"$f" 2>&1 </dev/null
            rc=$?
            awk -F';' -v n="$name $job #$rep" -v rc=$rc '$1=="3" { printf "lab: fio %s: rc=%s err=%s read %s KiB/s %s IOPS, write %s KiB/s %s IOPS\n", n, rc, $5, $7, $8, $48, $49 }' "$f"
            [ $rc = 0 ] || step "fio $name $job #$rep exited with $rc (kept in $f)"
        done
    done < <(printf '%s\n%s\n' "$FIO_JOBS" "$LAT_JOBS" | grep .)
done
[ "$ISER" = 1 ] && { iscsiadm -m node --logoutall=all >/dev/null 2>&1 || fail "open-iscsi logout"; }
for p in /sys/class/srp_remote_ports/port-*; do [ -e "$p/delete" ] && echo 1 >"$p/delete"; done
pass "$(echo $NAMES | sed 's/ /, /g') on rxe0, kernel $(uname -r)"
