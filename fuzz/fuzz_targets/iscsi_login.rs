//! The login phase (login.rs with keys.rs and chap.rs behind it): a
//! stream of Login Request PDUs, framed as a connection frames them, into
//! one `Login`. Targets: one open, one that requires CHAP (mutual allowed);
//! a request whose text says `CHAP_R=auto` gets the right response from the
//! harness. The first byte picks whether the driver accepts the session.
//!
//! Invariants: no panic; a reply answers the request's ITT with valid text
//! in the request's stage, moving only forward; a failed login ends with a
//! status of class 01h-03h and fails every later request; a session is
//! asked for at most once and only then.
#![no_main]

use std::sync::Arc;

use ferrite_fuzz::{
    CHAP_SECRET, CHAP_TARGET_SECRET, CHAP_TARGET_USER, CHAP_USER, answer_chap, challenge, frames,
};
use ferrite_iscsi::chap::{ChapAuth, ChapUser};
use ferrite_iscsi::conn::{IscsiConfig, IscsiTarget};
use ferrite_iscsi::keys::{AuthMethod, Limits, parse_text};
use ferrite_iscsi::login::{Login, LoginStep};
use ferrite_iscsi::pdu::Bhs;
use libfuzzer_sys::fuzz_target;

fn config() -> IscsiConfig {
    let target = |name: &str, auth| IscsiTarget {
        name: name.into(),
        alias: Some("fuzz".into()),
        tpgt: 1,
        portals: vec![],
        auth,
    };
    let chap = ChapAuth {
        incoming: vec![ChapUser {
            user: CHAP_USER.into(),
            secret: CHAP_SECRET.to_vec(),
        }],
        outgoing: Some(ChapUser {
            user: CHAP_TARGET_USER.into(),
            secret: CHAP_TARGET_SECRET.to_vec(),
        }),
    };
    IscsiConfig {
        targets: vec![
            target("iqn.2026-01.dev.ferrite:open", ChapAuth::default()),
            target("iqn.2026-01.dev.ferrite:chap", chap),
        ],
        ..IscsiConfig::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, stream)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        auth_methods: vec![AuthMethod::Chap, AuthMethod::None],
        ..Limits::default()
    };
    let mut login = Login::new(limits, Arc::new(config()));
    let mut failed = false;
    let mut asked = false;
    let mut stage = 0u8;
    let mut chal = None;
    for (bhs, seg) in frames(stream) {
        let b = Bhs(bhs);
        let csg = (b.flags() >> 2) & 3;
        let seg = answer_chap(seg, chal.as_ref());
        match login.handle(b, &seg) {
            LoginStep::Reply(r) => {
                assert!(!failed && !asked, "a reply after the login ended");
                assert_eq!(r.itt, b.itt());
                assert_eq!(r.csg, csg);
                assert!(r.csg >= stage, "stage went back: {} after {stage}", r.csg);
                stage = r.csg;
                if r.transit {
                    assert!(r.nsg > r.csg && r.nsg != 2, "{r:?}");
                    stage = r.nsg;
                }
                let pairs = parse_text(&r.data).expect("reply text parses");
                let owned: Vec<(String, String)> = pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                if let Some(c) = challenge(&owned) {
                    chal = Some(c);
                }
                assert!(!r.enters_full_feature, "full feature before the session");
            }
            LoginStep::SessionRequest { .. } => {
                assert!(!failed && !asked, "a second session request");
                asked = true;
                if sel & 1 == 0 {
                    let r = login.accept(1).expect("the held reply");
                    assert!(r.enters_full_feature && r.transit && r.nsg == 3);
                    assert_eq!(r.tsih, 1);
                    assert!(login.is_done());
                } else {
                    let step = login.reject(ferrite_iscsi::pdu::LoginStatus::NOT_FOUND);
                    assert!(matches!(step, Some(LoginStep::Fail { .. })));
                    failed = true;
                }
            }
            LoginStep::Fail { status, .. } => {
                assert!((1..=3).contains(&status.class), "{status:?}");
                failed = true;
            }
        }
    }
});
