# compare-iscsi.sh - ferrited beside the kernel's own target (LIO) and tgtd in
# one guest, on one kernel, so that what is compared is measured under the
# same conditions (absolute figures in a TCG guest mean nothing; ratios
# measured in one run do).
#
# The three targets, each with one 1 GiB thin file LU (512-byte blocks) in
# one tmpfs, all on loopback (H is 127.0.0.1):
#   LIO      H:3260  configured through configfs as targetcli would:
#            fileio (buffered), unit serial, emulate_tpu/tpws, explicit ACLs
#            for libiscsi's two initiator names and open-iscsi's, no auth
#   ferrited H:3261  vdisk_fileio, thin_provisioned
#   tgtd     H:3262  bstype rdwr on a sparse file, LUN 1
#
# With LAB_ISCSI_TRANSPORT=iser (lib.sh: iscsi_transport) the same runs go
# over iSER on rdma_rxe, H being 10.99.0.1 (rxe0): LIO's portal is marked
# iser (ib_isert), ferrited has an iser: portal beside its TCP one, open-iscsi
# logs in through its iser iface and libiscsi takes iser:// URLs. tgtd is
# left out (CU_TARGETS defaults to ferrited and LIO).
#
# Then, in this order (so that a target misbehaving late leaves everything
# earlier saved in /out):
#   1. fio over open-iscsi on ferrited and LIO, in rounds; in each round
#      each job runs on one target right after the other (which one first
#      alternates): 4 KiB random read and write at QD 1 and 32, 1 MiB
#      sequential read and write at QD 8, direct I/O, time-bounded, over a
#      region written once first (reads meet data, not holes). Terse v3 to
#      /out/fio/<target>-<job>-<round>.terse. The regions are then
#      discarded (libiscsi expects a fresh LU) and the sessions log out.
#   2. libiscsi's iscsi-test-cu -d -S, one process per suite of the same
#      list for all three, each bounded by `timeout`, the URL given once;
#      first ALL.MultipathIO with the URL given twice (two sessions;
#      CU_MULTIPATH=0 leaves it out). Raw
#      output per suite in /out/cu/<target>/<suite>.log, "suite rc seconds"
#      in runs.tsv. A suite whose iscsi-test-cu dies of a signal (libiscsi's
#      own iSER code crashes on some tests) is run again test by test, each
#      test a line of runs.tsv as if it were a suite; the crashed run's log
#      is kept as <suite>.crashed.log, and every run that died of a signal
#      is listed in crashed.tsv ("suite-or-test rc"); under iSER a run is
#      first made again up to CU_TRIES times (see cu_run).
#
# Environment (all optional): CU_SUITES (space-separated ALL.* suites;
# default every suite iscsi-test-cu -l lists), CU_SUITE_TIMEOUT_S (600),
# CU_TARGETS (ferrited tgtd lio: LIO, in the kernel, last; ferrited lio
# under iser), FIO_RUNTIME_S
# (4), FIO_SIZE_MB (256), FIO_REPS (5 rounds), SKIP_FIO / SKIP_CU (1 skips
# the phase), FERRITED_ARGS (more arguments for ferrited).
. "$(dirname "$0")/lib.sh"
iscsi_transport
case $ISCSI_TRANSPORT in
    tcp) H=127.0.0.1 SCHEME=iscsi TARGETS=${CU_TARGETS:-ferrited tgtd lio} ;;
    iser) H=10.99.0.1 SCHEME=iser TARGETS=${CU_TARGETS:-ferrited lio} ;;
esac
step "transport $ISCSI_TRANSPORT"
step "kernel $(uname -r)"
uname -r >/out/kernel.txt
{
    echo "kernel $(uname -r)"
    dpkg-query -W -f='${Package} ${Version}\n' libiscsi-bin tgt open-iscsi fio 2>/dev/null
    "$FERRITED" --version 2>/dev/null
} >/out/versions.txt

LU_SIZE=1073741824
LIO_IQN=iqn.2026-12.org.ferrite.lab:lio
FER_IQN=iqn.2026-12.org.ferrite.lab:ferrited
TGT_IQN=iqn.2026-12.org.ferrite.lab:tgtd
LIO_P=$H:3260 FER_P=$H:3261 TGT_P=$H:3262
# libiscsi's initiator names (-i and -I; ferrite_tests::CU_INITIATORS).
CU_I1=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test
CU_I2=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2

# One tmpfs for the three LUs; a limit, not a reservation.
mkdir -p /lu && mount -t tmpfs -o size=3g tmpfs /lu || fail "tmpfs for the LUs"
for t in lio ferrited tgtd; do truncate -s $LU_SIZE /lu/$t.img || fail "create /lu/$t.img"; done

# open-iscsi's initiator name, which LIO's ACLs must list.
start_iscsid
OI_NAME=$(sed -n 's/^InitiatorName=//p' /etc/iscsi/initiatorname.iscsi | head -1)
[ -n "$OI_NAME" ] || fail "no InitiatorName in /etc/iscsi/initiatorname.iscsi"
step "open-iscsi initiator name $OI_NAME"

step "LIO on $LIO_P"
lio_fileio_lu iscsi_target_mod /lu/lio.img $LU_SIZE
B=$LIO_LU
T=$C/iscsi/$LIO_IQN/tpgt_1
mkdir -p $T/lun/lun_0 || fail "LIO: target portal group"
ln -s $B $T/lun/lun_0/lu0 || fail "LIO: LUN 0"
mkdir $T/np/$LIO_P || fail "LIO: portal $LIO_P"
if [ "$ISCSI_TRANSPORT" = iser ]; then
    modprobe_all ib_isert
    lio_w $T/np/$LIO_P/iser 1
fi
for n in $CU_I1 $CU_I2 $OI_NAME; do
    mkdir -p $T/acls/$n/lun_0 || fail "LIO: ACL $n"
    ln -s $T/lun/lun_0 $T/acls/$n/lun_0/map || fail "LIO: ACL $n LUN 0"
done
lio_w $T/attrib/authentication 0
lio_w $T/enable 1
wait_port $H 3260

step "ferrited on $FER_P"
FER_PORTALS="\"$FER_P\""
[ "$ISCSI_TRANSPORT" = iser ] && FER_PORTALS="$FER_PORTALS, \"iser:$FER_P\""
cat >/tmp/ferrited.json <<JSON
{ "iscsi": { "nop_in_interval_s": 30, "nop_in_timeout_s": 60 },
  "devices": [ { "name": "lu0", "handler": "vdisk_fileio", "filename": "/lu/ferrited.img",
                 "size": $LU_SIZE, "thin_provisioned": true } ],
  "targets": { "iscsi": [ { "name": "$FER_IQN", "portals": [$FER_PORTALS],
                            "luns": [ { "lun": 0, "device": "lu0" } ] } ] } }
JSON
# (The NOP-In timing is the host conformance run's: libiscsi's Sanitize.Reset
# sleeps 60 s without reading its socket.)
# shellcheck disable=SC2086
start_ferrited --config /tmp/ferrited.json ${FERRITED_ARGS:-}
wait_portal $FER_P

TGTD_PID=
case " $TARGETS " in *" tgtd "*)
[ "$ISCSI_TRANSPORT" = tcp ] || fail "tgtd runs only over TCP here"
step "tgtd on $TGT_P"
command -v tgtd >/dev/null || fail "tgtd missing: install tgt (tools/install-test-deps does)"
tgtd -f -C 7 --iscsi portal=$TGT_P >/out/tgtd.log 2>&1 &
TGTD_PID=$!
tadm() { tgtadm -C 7 --lld iscsi "$@"; }
for i in $(seq 1 100); do tadm --op show --mode target >/dev/null 2>&1 && break; sleep 0.2; done
kill -0 $TGTD_PID 2>/dev/null || { cat /out/tgtd.log; fail "tgtd exited at start"; }
check "tgtd: target" tadm --op new --mode target --tid 1 -T $TGT_IQN
check "tgtd: LUN 1" tadm --op new --mode logicalunit --tid 1 --lun 1 --bstype rdwr -b /lu/tgtd.img
check "tgtd: bind" tadm --op bind --mode target --tid 1 -I ALL
wait_port $H 3262
;; esac

# ---- fio over open-iscsi: ferrited and LIO --------------------------------
FIO_RUNTIME_S=${FIO_RUNTIME_S:-4}
FIO_SIZE_MB=${FIO_SIZE_MB:-256}
FIO_REPS=${FIO_REPS:-5}
# name:fio arguments
FIO_JOBS="rand4k-read-qd1:--rw=randread,--bs=4k,--iodepth=1
rand4k-read-qd32:--rw=randread,--bs=4k,--iodepth=32
rand4k-write-qd1:--rw=randwrite,--bs=4k,--iodepth=1
rand4k-write-qd32:--rw=randwrite,--bs=4k,--iodepth=32
seq1m-read-qd8:--rw=read,--bs=1m,--iodepth=8
seq1m-write-qd8:--rw=write,--bs=1m,--iodepth=8"
if [ "${SKIP_FIO:-0}" != 1 ]; then
    mkdir -p /out/fio
    declare -A DISK
    # login NAME IQN PORTAL: an open-iscsi session; its disk in DISK[NAME].
    login() {
        discover "$3"
        check "login to $1" iscsiadm -m node -T "$2" -p "$3" --login >/dev/null
        local d; d=$(wait_disks "$2" 1) || fail "no disk for $1"
        DISK[$1]=$d
        # The same block layer settings for both: no scheduler in between.
        echo none >/sys/block/$d/queue/scheduler 2>/dev/null
        step "$1: /dev/$d, queue depth $(cat /sys/block/$d/device/queue_depth)"
    }
    login ferrited $FER_IQN $FER_P
    login lio $LIO_IQN $LIO_P
    iscsiadm -m session -P 3 >/out/fio/sessions.txt 2>&1
    check_transport
    for name in ferrited lio; do
        fio --name=fill --filename=/dev/${DISK[$name]} --direct=1 --ioengine=libaio --rw=write --bs=1m \
            --iodepth=8 --size=${FIO_SIZE_MB}m >/out/fio/$name-fill.log 2>&1 </dev/null ||
            { cat /out/fio/$name-fill.log; fail "fio: filling $name's region"; }
    done
    step "fio: ${FIO_SIZE_MB} MiB written on each; jobs of ${FIO_RUNTIME_S} s, $FIO_REPS rounds"
    for rep in $(seq 1 "$FIO_REPS"); do
        # Odd rounds run each job on ferrited first, even rounds on LIO
        # first, so that neither always goes first.
        order="ferrited lio"; [ $((rep % 2)) = 0 ] && order="lio ferrited"
        while IFS=: read -r job args; do
            for name in $order; do
                f=/out/fio/$name-$job-$rep.terse
                # shellcheck disable=SC2086
                fio --name="$job" --filename=/dev/${DISK[$name]} --direct=1 --ioengine=libaio \
                    --size=${FIO_SIZE_MB}m --runtime=$FIO_RUNTIME_S --time_based --norandommap \
                    --output-format=terse --terse-version=3 ${args//,/ } >"$f" 2>&1 </dev/null
                rc=$?
                awk -F';' -v n="$name $job #$rep" -v rc=$rc '$1=="3" { printf "lab: fio %s: rc=%s err=%s read %s KiB/s %s IOPS, write %s KiB/s %s IOPS\n", n, rc, $5, $7, $8, $48, $49 }' "$f"
                [ $rc = 0 ] || step "fio $name $job #$rep exited with $rc (kept in $f)"
            done
        done <<<"$FIO_JOBS"
    done
    # libiscsi's tests expect a fresh LU (MultipathIO.CompareAndWrite
    # compares a block it never wrote with zeroes, see below): deallocate
    # what fio wrote.
    for name in ferrited lio; do
        check "blkdiscard on $name" blkdiscard /dev/${DISK[$name]}
    done
    for name in ferrited lio; do
        cmp -n $((FIO_SIZE_MB << 20)) /dev/${DISK[$name]} /dev/zero >/dev/null ||
            fail "$name: the region fio wrote does not read back as zeroes after blkdiscard"
    done
    step "fio regions discarded: $(du -k /lu/ferrited.img /lu/lio.img | awk '{printf "%s %s KiB; ", $2, $1}')"
    iscsiadm -m node --logoutall=all >/dev/null 2>&1 || fail "open-iscsi logout"
fi

# ---- libiscsi: the same suites against each target ------------------------
if [ "${SKIP_CU:-0}" != 1 ]; then
    SUITES=${CU_SUITES:-$(iscsi-test-cu -l | awk -F. 'NF == 2 && $1 == "ALL" && $2 != "MultipathIO"')}
    echo "$SUITES" | tr ' ' '\n' | grep . >/out/cu-suites.txt
    step "libiscsi: $(wc -l </out/cu-suites.txt) suites per target"
    for t in $TARGETS; do
        case $t in
            ferrited) url=$SCHEME://$FER_P/$FER_IQN/0; pid=$FERRITED_PID ;;
            lio) url=$SCHEME://$LIO_P/$LIO_IQN/0; pid= ;;
            tgtd) url=$SCHEME://$TGT_P/$TGT_IQN/1; pid=$TGTD_PID ;;
            *) fail "unknown target $t in CU_TARGETS" ;;
        esac
        o=/out/cu/$t; mkdir -p "$o"; : >"$o/runs.tsv"; : >"$o/crashed.tsv"; : >"$o/retries.tsv"
        t0=$SECONDS
        # cu_run SUITE-OR-TEST URL...: one iscsi-test-cu run; its status in
        # rc, a line in runs.tsv unless it died of a signal. Under iSER,
        # libiscsi's own iSER code corrupts its heap now and then, against
        # every target (glibc aborts with "munmap_chunk(): invalid pointer"
        # or "corrupted double-linked list", or the login fails in its event
        # loop with "revents is not POLLIN"): a run that died of a signal,
        # or whose login failed so before any verdict, is made again, up to
        # CU_TRIES (3) times in all; each such run is kept as
        # <name>.try-N.log and listed in retries.tsv ("name try rc").
        cu_run() {
            local s=$1 s0=$SECONDS try=1; shift
            while :; do
                timeout -k 10 "${CU_SUITE_TIMEOUT_S:-600}" iscsi-test-cu -d -S -i $CU_I1 -I $CU_I2 -t "$s" "$@" \
                    >"$o/$s.log" 2>&1 </dev/null
                rc=$?
                [ "$ISCSI_TRANSPORT" = iser ] && [ $try -lt "${CU_TRIES:-3}" ] || break
                if ! died_of_signal $rc; then
                    grep -q "revents is not POLLIN" "$o/$s.log" && ! grep -q '^  Test: .*\.\.\.' "$o/$s.log" || break
                fi
                mv "$o/$s.log" "$o/$s.try-$try.log"
                printf '%s\t%s\t%s\n' "$s" $try $rc >>"$o/retries.tsv"
                try=$((try + 1))
            done
            if ! died_of_signal $rc; then
                printf '%s\t%s\t%s\n' "$s" $rc $((SECONDS - s0)) >>"$o/runs.tsv"
            fi
            [ $rc = 124 ] && step "$t: $s killed after ${CU_SUITE_TIMEOUT_S:-600} s"
            return 0
        }
        # died_of_signal RC: the status of a process killed by a signal
        # other than timeout's SIGKILL.
        died_of_signal() { [ "$1" -gt 128 ] && [ "$1" -lt 160 ] && [ "$1" != 137 ]; }
        # MultipathIO first, on the LU as fresh as it gets: in libiscsi
        # 1.19 its CompareAndWrite test compares blocks 0 to 256 with zeroes
        # after zeroing only 0 to 255 (fixed upstream after 1.19), so it
        # fails wherever an earlier suite left data in block 256.
        mp=ALL.MultipathIO
        [ "${CU_MULTIPATH:-1}" = 0 ] && mp=
        for s in $mp $(cat /out/cu-suites.txt); do
            urls=$url
            [ "$s" = ALL.MultipathIO ] && urls="$url $url"
            cu_run "$s" $urls
            if died_of_signal $rc; then
                # iscsi-test-cu itself died of a signal: the rest of the
                # suite, test by test.
                printf '%s\t%s\n' "$s" $rc >>"$o/crashed.tsv"
                mv "$o/$s.log" "$o/$s.crashed.log"
                step "$t: iscsi-test-cu died of signal $((rc - 128)) in $s; its tests one by one"
                for c in $(iscsi-test-cu -l | grep "^$s\.[^.]*\$"); do
                    # shellcheck disable=SC2086
                    cu_run "$c" $urls
                    if died_of_signal $rc; then
                        printf '%s\t%s\n' "$c" $rc >>"$o/crashed.tsv"
                        mv "$o/$c.log" "$o/$c.crashed.log"
                        step "$t: iscsi-test-cu died of signal $((rc - 128)) in $c"
                    fi
                done
            fi
            if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
                step "$t: the target died during $s"
                echo "died during $s" >"$o/died"
                break
            fi
        done
        secs=$((SECONDS - t0))
        echo $secs >"$o/seconds"
        step "libiscsi on $t: $(cat "$o"/*.log | grep -c '^  Test: ') tests in $secs s"
        sync
    done
fi
# libiscsi's iSER code may die mid-connection (see cu_run): ferrited's
# failed Sends to a vanished peer are expected then.
ISER_LOG_CHECK=0
pass "$(echo $TARGETS | sed 's/ /, /g') compared over $ISCSI_TRANSPORT on kernel $(uname -r)"
