//! CHAP (chap.rs): the key sets of successive Login Requests (login text,
//! one set per `\n`-separated piece) into one `ChapExchange`; `CHAP_R=auto`
//! gets the right response to the challenge from the harness. The first
//! byte picks the configuration (mutual CHAP allowed or not).
//!
//! Invariants: no panic; an error is an authentication failure (0201h) or
//! an initiator error (0200h); the exchange finishes only as the
//! configured user, and a mutual response it sends is the right one; every
//! challenge is as long as its digest; `decode_binary` reads back what
//! `encode_hex` writes.
#![no_main]

use ferrite_fuzz::{
    CHAP_SECRET, CHAP_TARGET_SECRET, CHAP_TARGET_USER, CHAP_USER, answer_chap, challenge,
};
use ferrite_iscsi::chap::{ChapAuth, ChapExchange, ChapRng, ChapUser, decode_binary, encode_hex};
use ferrite_iscsi::keys::parse_text;
use ferrite_iscsi::pdu::LoginStatus;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let outgoing = (sel & 1 == 0).then(|| ChapUser {
        user: CHAP_TARGET_USER.into(),
        secret: CHAP_TARGET_SECRET.to_vec(),
    });
    let mut x = ChapExchange::new(ChapAuth {
        incoming: vec![ChapUser {
            user: CHAP_USER.into(),
            secret: CHAP_SECRET.to_vec(),
        }],
        outgoing,
    });
    let mut rng = ChapRng::new(u64::from(sel));
    let mut chal = None;
    for piece in rest.split(|&b| b == b'\n') {
        // Any binary value the initiator may send decodes to at most what
        // it encodes, and hex reads back.
        if let Ok(s) = std::str::from_utf8(piece)
            && let Some(b) = decode_binary(s)
        {
            assert_eq!(decode_binary(&encode_hex(&b)), Some(b));
        }
        let text = answer_chap(piece, chal.as_ref());
        let Ok(keys) = parse_text(&text) else {
            continue;
        };
        match x.step(&keys, &mut rng) {
            Ok(step) => {
                if let Some(c) = challenge(&step.keys) {
                    assert_eq!(c.2.len(), c.0.digest_len());
                    chal = Some(c);
                }
                assert_eq!(step.done, x.is_done());
                if step.done {
                    assert_eq!(x.user(), Some(CHAP_USER));
                }
                let get = |k: &str| keys.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
                if let (Some(r), Some((alg, _, _))) =
                    (step.keys.iter().find(|(k, _)| k == "CHAP_R"), chal.as_ref())
                {
                    // Mutual CHAP: the target's response to the initiator's
                    // challenge, with the target's secret.
                    let id: u8 = get("CHAP_I")
                        .and_then(|i| i.trim().parse().ok())
                        .expect("CHAP_I");
                    let c = decode_binary(get("CHAP_C").expect("CHAP_C")).expect("CHAP_C value");
                    assert_eq!(r.1, encode_hex(&alg.response(id, CHAP_TARGET_SECRET, &c)));
                }
            }
            Err(e) => {
                assert!(
                    e.status == LoginStatus::AUTH_FAILURE
                        || e.status == LoginStatus::INITIATOR_ERROR,
                    "{e:?}"
                );
                return;
            }
        }
    }
});
