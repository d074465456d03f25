# iser-verbs.sh - the project's iSER-over-verbs tests (tests/tests/iser_verbs.rs),
# which need a real RDMA device, run here on soft-RoCE: RDMA CM connection
# requests with the iSER CM REQ that never log in, more than a core takes;
# those beyond are rejected with a log line, and taken again once others
# went away. ISER_VERBS_TEST is the test binary's path.
. "$(dirname "$0")/lib.sh"
rxe_pair
[ -x "${ISER_VERBS_TEST:-}" ] || fail "no iser_verbs test binary (ISER_VERBS_TEST=${ISER_VERBS_TEST:-})"
FERRITE_ISER_VERBS=rxe0,10.99.0.1 FERRITED=$FERRITED RUST_BACKTRACE=1 \
    "$ISER_VERBS_TEST" --test-threads=1 --nocapture >/out/iser-verbs.log 2>&1
rc=$?
grep -E "^test |test result" /out/iser-verbs.log
[ $rc -eq 0 ] || { tail -n 60 /out/iser-verbs.log; fail "iser_verbs tests failed (status $rc)"; }
grep -q "skipping iSER over verbs" /out/iser-verbs.log && fail "the verbs tests skipped: no RDMA device seen"
n=$(sed -n "s/^test result: ok. \([0-9]*\) passed.*/\1/p" /out/iser-verbs.log)
[ "${n:-0}" -ge 1 ] || fail "only $n verbs tests ran"
pass "$n iSER-over-verbs tests passed on rxe0"
