//! Login key negotiation (RFC 7143 §6.2, §13): the first byte picks the
//! target's limits and the stage, the rest is login text, split into the
//! texts of successive requests at each `\n`. Every key set either ends
//! the login with a status of class 02h (initiator error), or gives
//! answers that are valid text for keys the initiator sent, and
//! parameters that stay inside RFC 7143's ranges and the target's limits.
#![no_main]

use ferrite_iscsi::keys::{
    AuthMethod, Digest, Limits, Negotiator, Params, Phase, SessionType, encode_text, parse_text,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        max_burst_length: if sel & 1 != 0 { 64 * 1024 } else { 1024 * 1024 },
        immediate_data: sel & 2 == 0,
        max_connections: if sel & 4 != 0 { 4 } else { 1 },
        digests: if sel & 8 != 0 {
            vec![Digest::Crc32c]
        } else {
            vec![Digest::Crc32c, Digest::None]
        },
        auth_methods: vec![AuthMethod::Chap, AuthMethod::None],
        ..Limits::default()
    };
    let mut neg = Negotiator::new(limits.clone());
    neg.leading = sel & 0x10 == 0;
    let mut phase = if sel & 0x20 != 0 {
        Phase::Operational
    } else {
        Phase::Security
    };
    for text in rest.split(|&b| b == b'\n') {
        let Ok(pairs) = parse_text(text) else {
            continue;
        };
        let out = match neg.apply_all(&pairs, phase) {
            Ok(out) => out,
            Err(status) => {
                assert_eq!(status.class, 2, "{status:?} for {pairs:?}");
                return;
            }
        };
        for (k, v) in &out {
            assert!(pairs.iter().any(|(n, _)| n == k), "answer {k} to no key");
            assert!(!v.is_empty() && !v.contains('\0'), "{k}={v:?}");
        }
        let mut answer = out.clone();
        answer.extend(neg.take_offers());
        let encoded = encode_text(&answer);
        let back = parse_text(&encoded).expect("answers encode to valid text");
        assert_eq!(back.len(), answer.len());
        check(&neg.params, &limits);
        phase = Phase::Operational;
    }
});

fn check(p: &Params, l: &Limits) {
    let d = Params::default();
    assert!((512..=0xff_ffff).contains(&p.max_xmit_data_segment_length));
    if p.session_type == SessionType::Normal {
        assert!((512..=l.max_burst_length.max(d.max_burst_length)).contains(&p.max_burst_length));
        assert!(p.first_burst_length <= p.max_burst_length, "{p:?}");
        assert!(p.max_connections >= 1 && p.max_connections <= l.max_connections.max(1));
        assert!(p.max_outstanding_r2t >= 1);
    }
    assert!(l.digests.contains(&p.header_digest) || p.header_digest == Digest::None);
    assert_eq!(p.error_recovery_level, 0);
    assert!(p.data_pdu_in_order && p.data_sequence_in_order);
    assert!(p.default_time2retain <= l.default_time2retain);
}
