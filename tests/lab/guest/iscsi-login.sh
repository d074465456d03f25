# iscsi-login.sh - open-iscsi (iscsid with iscsi_tcp, or ib_iser under
# LAB_ISCSI_TRANSPORT=iser) against ferrited: SendTargets discovery; login
# with CRC32C header and data digests (under iSER, which has no digests, a
# login asking for them ends with None); one-way CHAP (refused without
# credentials and with a wrong secret); mutual CHAP (refused when the
# target's answer does not match what the initiator expects); verified I/O
# on every session, each over the transport asked for.
. "$(dirname "$0")/lib.sh"
iscsi_transport
T_OPEN=iqn.2026-12.org.ferrite.lab:open
T_CHAP=iqn.2026-12.org.ferrite.lab:chap
T_MUTUAL=iqn.2026-12.org.ferrite.lab:mutual
cat >/tmp/login.json <<JSON
{ "devices": [
    { "name": "m0", "handler": "vdisk_nullio", "mem": true, "size": 67108864 },
    { "name": "m1", "handler": "vdisk_nullio", "mem": true, "size": 67108864 },
    { "name": "m2", "handler": "vdisk_nullio", "mem": true, "size": 67108864 } ],
  "targets": { "iscsi": [
    { "name": "$T_OPEN", "portals": [$PORTALS], "luns": [ { "lun": 0, "device": "m0" } ] },
    { "name": "$T_CHAP", "portals": [$PORTALS], "luns": [ { "lun": 0, "device": "m1" } ],
      "incoming_users": [ { "user": "alice", "secret": "alice-secret-12" } ] },
    { "name": "$T_MUTUAL", "portals": [$PORTALS], "luns": [ { "lun": 0, "device": "m2" } ],
      "incoming_users": [ { "user": "bob", "secret": "bob-secret-3456" } ],
      "outgoing_user": { "user": "ferrite-target", "secret": "target-secret-34" } } ] } }
JSON
start_ferrited --config /tmp/login.json
wait_portal
start_iscsid

step "discovery"
discover
cat /out/discovery.txt
for t in $T_OPEN $T_CHAP $T_MUTUAL; do grep -q " $t\$" /out/discovery.txt || fail "discovery did not report $t"; done

node() { iscsiadm -m node -T "$1" -p $P "${@:2}"; }
set_node() { node "$1" -o update -n "$2" -v "$3" >/dev/null || fail "iscsiadm update $1 $2"; }
# io_check TARGET: 8 MiB of random data written to its LUN 0 and read back.
io_check() {
    local d
    d=$(wait_disks "$1" 1) || fail "no disk appeared for $1"
    dd if=/dev/urandom of=/tmp/pattern bs=1M count=8 2>/dev/null
    dd if=/tmp/pattern of=/dev/$d bs=1M oflag=direct 2>/dev/null || fail "write to $d ($1)"
    dd if=/dev/$d of=/tmp/back bs=1M count=8 iflag=direct 2>/dev/null || fail "read from $d ($1)"
    cmp /tmp/pattern /tmp/back || fail "data read back from $1 differs"
    check_transport
    step "$1: 8 MiB written and read back on /dev/$d"
}

step "login asking for CRC32C header and data digests"
set_node $T_OPEN node.conn[0].iscsi.HeaderDigest CRC32C
set_node $T_OPEN node.conn[0].iscsi.DataDigest CRC32C
node $T_OPEN --login || fail "login to $T_OPEN"
iscsiadm -m session -P 2 >/out/session-open.txt 2>&1
digest=CRC32C
[ "$ISCSI_TRANSPORT" = iser ] && digest=None
grep -q "HeaderDigest: $digest" /out/session-open.txt || { cat /out/session-open.txt; fail "header digest is not $digest"; }
grep -q "DataDigest: $digest" /out/session-open.txt || { cat /out/session-open.txt; fail "data digest is not $digest"; }
step "digests negotiated: $digest"
io_check $T_OPEN
node $T_OPEN --logout >/dev/null || fail "logout from $T_OPEN"

step "one-way CHAP: refused without credentials"
node $T_CHAP --login >/out/chap-none.txt 2>&1 && fail "login to $T_CHAP without CHAP was accepted"
step "one-way CHAP: refused with a wrong secret"
set_node $T_CHAP node.session.auth.authmethod CHAP
set_node $T_CHAP node.session.auth.username alice
set_node $T_CHAP node.session.auth.password wrong-secret-123
node $T_CHAP --login >/out/chap-wrong.txt 2>&1 && fail "login to $T_CHAP with a wrong secret was accepted"
grep -qi "authorization failure\|auth" /out/chap-wrong.txt || { cat /out/chap-wrong.txt; fail "wrong secret: no authentication failure reported"; }
step "one-way CHAP: accepted with the right secret"
set_node $T_CHAP node.session.auth.password alice-secret-12
node $T_CHAP --login || fail "CHAP login to $T_CHAP"
io_check $T_CHAP
node $T_CHAP --logout >/dev/null || fail "logout from $T_CHAP"

step "mutual CHAP: the initiator refuses a target answering with another secret"
set_node $T_MUTUAL node.session.auth.authmethod CHAP
set_node $T_MUTUAL node.session.auth.username bob
set_node $T_MUTUAL node.session.auth.password bob-secret-3456
set_node $T_MUTUAL node.session.auth.username_in ferrite-target
set_node $T_MUTUAL node.session.auth.password_in not-the-target-secret
node $T_MUTUAL --login >/out/mutual-wrong.txt 2>&1 && fail "mutual CHAP with a wrong target secret was accepted"
step "mutual CHAP: accepted when both sides prove their secrets"
set_node $T_MUTUAL node.session.auth.password_in target-secret-34
node $T_MUTUAL --login || fail "mutual CHAP login to $T_MUTUAL"
io_check $T_MUTUAL
node $T_MUTUAL --logout >/dev/null || fail "logout from $T_MUTUAL"

grep -q "0201\|authentication" /out/ferrited.log || fail "ferrited logged no refused login"
pass "discovery, digests, one-way and mutual CHAP"
