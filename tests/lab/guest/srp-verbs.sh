# srp-verbs.sh - the project's SRP-over-verbs tests (tests/tests/srp_verbs.rs),
# which need a real RDMA device, run here on soft-RoCE: the project's
# initiator logging in to ferrited with the RDMA CM layout Linux sends,
# immediate data, direct, indirect and fetched descriptors, two channels, a
# channel lost mid-transfer beside the other, and refusals read from the CM
# reject's private data (cut short, another IU type, another target port, an IU
# length above the target's). SRP_VERBS_TEST is the test binary's path.
. "$(dirname "$0")/lib.sh"
rxe_pair
[ -x "${SRP_VERBS_TEST:-}" ] || fail "no srp_verbs test binary (SRP_VERBS_TEST=${SRP_VERBS_TEST:-})"
FERRITE_SRP_VERBS=rxe0,10.99.0.1 FERRITED=$FERRITED RUST_BACKTRACE=1 \
    "$SRP_VERBS_TEST" --test-threads=1 --nocapture >/out/srp-verbs.log 2>&1
rc=$?
grep -E "^test |test result" /out/srp-verbs.log
[ $rc -eq 0 ] || { tail -n 60 /out/srp-verbs.log; fail "srp_verbs tests failed (status $rc)"; }
grep -q "skipping SRP over verbs" /out/srp-verbs.log && fail "the verbs tests skipped: no RDMA device seen"
n=$(sed -n "s/^test result: ok. \([0-9]*\) passed.*/\1/p" /out/srp-verbs.log)
[ "${n:-0}" -ge 3 ] || fail "only $n verbs tests ran"
pass "$n SRP-over-verbs tests passed on rxe0"
