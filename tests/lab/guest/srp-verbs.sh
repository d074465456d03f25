# srp-verbs.sh - the project's SRP-over-verbs tests (tests/tests/srp_verbs.rs),
# which need a real RDMA device, run here on soft-RoCE: the project's
# initiator logging in to ferrited with the RDMA CM layout Linux sends,
# immediate data, direct, indirect and fetched descriptors, two channels, a
# channel lost mid-transfer beside the other, and refusals read from the CM
# reject's private data (cut short, another IU type, another target port, an IU
# length above the target's). SRP_VERBS_TEST is the test binary's path.
. "$(dirname "$0")/lib.sh"
rxe_pair
verbs_tests srp-verbs FERRITE_SRP_VERBS "${SRP_VERBS_TEST:-}" 3
pass "$N SRP-over-verbs tests passed on rxe0"
