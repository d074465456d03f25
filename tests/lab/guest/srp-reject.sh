# srp-reject.sh - logins ferrited's SRP port refuses, as the Linux SRP
# initiator reports them: another target port id (SRP_LOGIN_REJ reason
# 00010003h, unable to associate), an initiator-to-target IU length above the
# target's (00010002h, which ib_srp names), a disabled port (00010000h); each
# with a log line in ferrited. Then a login without immediate data (writes
# fetched by RDMA READ) carries verified I/O.
. "$(dirname "$0")/lib.sh"
rxe_pair
modprobe_all ib_srp sd_mod
srp_config /tmp/srp.json '{ "name": "mem0", "handler": "vdisk_nullio", "mem": true, "size": 268435456 }' \
    '{ "lun": 0, "device": "mem0" }'
start_ferrited --config /tmp/srp.json
wait_srp_listening
A=/sys/class/infiniband_srp/srp-rxe0-1/add_target
P=/sys/module/ib_srp/parameters
GOOD="id_ext=$SRP_ID_EXT,ioc_guid=$SRP_IOC_GUID,dest=$SRP_LISTEN"
refused() {  # refused WHAT DMESG-NEEDLE FERRITED-NEEDLE
    dmesg | grep -q "$2" || fail "$1: the kernel did not report \"$2\""
    grep -q "$3" /out/ferrited.log || fail "$1: ferrited logged no \"$3\""
    step "$1 refused: kernel \"$(dmesg | grep -m1 "$2" | cut -c16-110)\""
}
other=$(printf '%016x' $(( 0x$SRP_IOC_GUID ^ 1 )))
echo "id_ext=$SRP_ID_EXT,ioc_guid=$other,dest=$SRP_LISTEN" >$A 2>/dev/null && fail "a login naming another target port was accepted"
refused "another target port" "SRP LOGIN REJECTED, reason 0x00010003" "names another target port"
old=$(cat $P/max_imm_data)
echo 1048576 >$P/max_imm_data
echo "$GOOD" >$A 2>/dev/null && fail "a 1 MiB IU length was accepted"
refused "IU length" "requested max_it_iu_len too large" "is above"
echo "$old" >$P/max_imm_data
check "disable the port" ctl set /targets/srp/srp0/enabled 0
sleep 1
echo "$GOOD" >$A 2>/dev/null && fail "a disabled port accepted a login"
refused "disabled port" "SRP LOGIN REJECTED, reason 0x00010000" "SRP login rejected"
check "enable the port" ctl set /targets/srp/srp0/enabled 1
sleep 1
echo 0 >$P/use_imm_data
echo "$GOOD" >$A || fail "the good login was refused: $(dmesg | grep -i srp | tail -2)"
D=$(srp_disks 1) || fail "no disk after the good login"
dmesg | grep -q "using immediate data" && fail "immediate data used though the initiator did not ask for it"
dd if=/dev/urandom of=/tmp/pattern bs=1M count=16 2>/dev/null
check "16 MiB write" dd if=/tmp/pattern of=/dev/$D bs=1M oflag=direct
check "16 MiB read" dd if=/dev/$D of=/tmp/back bs=1M count=16 iflag=direct
cmp /tmp/pattern /tmp/back || fail "data read back differ"
fio_verify rdma-read /dev/$D --rw=randwrite --bs=4k --iodepth=16 --size=8m
grep "SRP login rejected" /out/ferrited.log | sed 's/^/ferrited: /' | cut -c1-160
pass "refused logins carry their SRP reasons; a login without immediate data works"
