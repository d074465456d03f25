# iser-verbs.sh - the project's iSER-over-verbs tests (tests/tests/iser_verbs.rs),
# which need a real RDMA device, run here on soft-RoCE: RDMA CM connection
# requests with the iSER CM REQ that never log in, more than a core takes;
# those beyond are rejected with a log line, and taken again once others
# went away. ISER_VERBS_TEST is the test binary's path.
. "$(dirname "$0")/lib.sh"
rxe_pair
verbs_tests iser-verbs FERRITE_ISER_VERBS "${ISER_VERBS_TEST:-}" 1
pass "$N iSER-over-verbs tests passed on rxe0"
