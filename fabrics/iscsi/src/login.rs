//! The login phase (RFC 7143 §6.3, §11.12, §11.13): security and operational
//! stages, the T and C bits, CSG/NSG transitions, text spanning PDUs,
//! ISID/TSIH and version checks, for normal and discovery sessions.
//!
//! [`Login`] takes whole Login Request PDUs (the connection has already read
//! header and data) and answers each with a [`LoginStep`]. It does not build
//! PDUs or know sequence numbers: the connection does.

use std::sync::Arc;

use crate::chap::{ChapAuth, ChapExchange, ChapRng};
use crate::conn::{IscsiConfig, IscsiTarget};
use crate::keys::{
    AuthMethod, Limits, MAX_TEXT, Negotiator, Params, Phase, SessionType, encode_text, parse_text,
};
use crate::pdu::{Bhs, LoginStatus};

/// Login stage numbers (RFC 7143 §11.12.3).
pub const STAGE_SECURITY: u8 = 0;
pub const STAGE_OPERATIONAL: u8 = 1;
pub const STAGE_FULL_FEATURE: u8 = 3;

/// A successful Login Response to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginReply {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub itt: u32,
    /// Response text (`key=value\0...`).
    pub data: Vec<u8>,
    /// The TSIH to put in the response: the request's until the session is
    /// accepted (0 for a new session, RFC 7143 §11.13.4), then the driver's.
    pub tsih: u16,
    /// This reply enters the full feature phase.
    pub enters_full_feature: bool,
}

/// What the connection does after a Login Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoginStep {
    Reply(LoginReply),
    /// The initiator asks to leave the login phase: the driver decides
    /// (target, ACL, reinstatement, TSIH) and answers with
    /// [`Login::accept`] or [`Login::reject`].
    SessionRequest {
        initiator: String,
        isid: [u8; 6],
        tsih: u16,
        target: Option<String>,
        discovery: bool,
    },
    /// Send a Login Response with this status, then close (RFC 7143 §11.13.5).
    Fail {
        status: LoginStatus,
        itt: u32,
    },
}

/// Where the login stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for a request in stage `csg`.
    Stage(u8),
    /// SessionRequest emitted; waiting for the driver.
    AwaitingSession,
    /// Full feature phase reached.
    Done,
    /// Login failed.
    Failed,
}

/// The first request's identity, which later requests must repeat.
#[derive(Clone, Copy, Debug)]
struct Identity {
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
}

/// The target side of one connection's login.
#[derive(Debug)]
pub struct Login {
    neg: Negotiator,
    state: State,
    id: Option<Identity>,
    /// Text collected over C-bit continuations.
    text: Vec<u8>,
    /// Whether the first full request (names, session type) was checked.
    checked_first: bool,
    /// The reply held back until the driver accepts the session.
    held: Option<LoginReply>,
    /// Declarations the target makes once (TargetPortalGroupTag, alias).
    declared_target: bool,
    /// TargetRecvDataSegmentLength was declared (RDMA connections).
    declared_trdsl: bool,
    /// The targets a login may name (shared, not copied per connection).
    cfg: Arc<IscsiConfig>,
    /// Whether the credentials for this login were looked up (first text).
    auth_looked_up: bool,
    /// The credentials the target requires (None: no authentication).
    auth: Option<ChapAuth>,
    /// The CHAP exchange, once AuthMethod=CHAP is agreed.
    chap: Option<ChapExchange>,
    /// Challenge randomness, from the connection's seed.
    rng: ChapRng,
}

impl Login {
    pub fn new(limits: Limits, cfg: Arc<IscsiConfig>) -> Login {
        Login::with_rng(limits, cfg, ChapRng::new(0))
    }

    /// A login whose CHAP challenges come from `rng` (seeded by the
    /// connection).
    pub fn with_rng(limits: Limits, cfg: Arc<IscsiConfig>, rng: ChapRng) -> Login {
        Login {
            auth_looked_up: false,
            auth: None,
            chap: None,
            rng,
            neg: Negotiator::new(limits),
            state: State::Stage(STAGE_SECURITY),
            id: None,
            text: Vec::new(),
            checked_first: false,
            held: None,
            declared_target: false,
            declared_trdsl: false,
            cfg,
        }
    }

    /// The parameters negotiated so far.
    pub fn params(&self) -> &Params {
        &self.neg.params
    }

    pub fn isid(&self) -> [u8; 6] {
        self.id.map_or([0; 6], |i| i.isid)
    }

    pub fn cid(&self) -> u16 {
        self.id.map_or(0, |i| i.cid)
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The CHAP name the initiator authenticated as, if it did.
    pub fn chap_user(&self) -> Option<&str> {
        self.chap.as_ref().and_then(|c| c.user())
    }

    /// The credentials a login names in its first text: the discovery
    /// service's or the target's.
    fn auth_for(&self, pairs: &[(&str, &str)]) -> ChapAuth {
        let get = |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        if get("SessionType") == Some("Discovery") {
            return self.cfg.discovery_auth.clone();
        }
        // The initiator's group may carry its own CHAP users.
        get("TargetName")
            .and_then(|n| {
                self.cfg
                    .target_auth(n, get("InitiatorName").unwrap_or_default())
            })
            .unwrap_or_default()
    }

    fn fail(&mut self, status: LoginStatus, itt: u32) -> LoginStep {
        self.state = State::Failed;
        LoginStep::Fail { status, itt }
    }

    /// Handles one Login Request.
    pub fn handle(&mut self, bhs: Bhs<'_>, data: &[u8]) -> LoginStep {
        let itt = bhs.itt();
        let csg_now = match self.state {
            State::Stage(s) => s,
            // RFC 7143 §6.3: one request at a time; a request while the
            // final response is pending, or after login, is a protocol error.
            _ => return self.fail(LoginStatus::INITIATOR_ERROR, itt),
        };
        // RFC 7143 §11.12.4: Version-min above what we support (0x00).
        if bhs.version_min() != 0 {
            return self.fail(LoginStatus::UNSUPPORTED_VERSION, itt);
        }
        let id = Identity {
            isid: bhs.isid(),
            tsih: bhs.tsih(),
            cid: bhs.cid(),
        };
        match self.id {
            None => {
                self.id = Some(id);
                // RFC 7143 §6.3.1: a nonzero TSIH adds this connection to an
                // existing session; the session's leading-only keys stand.
                self.neg.leading = id.tsih == 0;
            }
            Some(first) => {
                // RFC 7143 §11.12.5-7: ISID, TSIH and CID stay the same
                // throughout the login.
                if first.isid != id.isid || first.tsih != id.tsih || first.cid != id.cid {
                    return self.fail(LoginStatus::INITIATOR_ERROR, itt);
                }
            }
        }
        let (transit, cont, csg, nsg) = (
            bhs.login_transit(),
            bhs.login_continue(),
            bhs.login_csg(),
            bhs.login_nsg(),
        );
        // RFC 7143 §11.12.2: T and C must not both be set.
        if transit && cont {
            return self.fail(LoginStatus::INITIATOR_ERROR, itt);
        }
        // RFC 7143 §6.3: the first request may skip the security stage
        // (CSG=1) when the target needs no authentication (checked once the
        // text names the target).
        let skips_security = csg == STAGE_OPERATIONAL
            && csg_now == STAGE_SECURITY
            && self.neg.params.auth_method.is_none();
        if csg != csg_now && !skips_security {
            return self.fail(LoginStatus::INITIATOR_ERROR, itt);
        }
        // RFC 7143 §11.12.3: NSG 2 is reserved, and a transition goes forward.
        if transit && (nsg == 2 || nsg <= csg) {
            return self.fail(LoginStatus::INITIATOR_ERROR, itt);
        }
        if self.text.len() + data.len() > MAX_TEXT {
            return self.fail(LoginStatus::OUT_OF_RESOURCES, itt);
        }
        self.text.extend_from_slice(data);
        if cont {
            // RFC 7143 §6.1: answer a partial text with an empty response.
            self.state = State::Stage(csg);
            return LoginStep::Reply(LoginReply {
                transit: false,
                cont: false,
                csg,
                nsg: 0,
                itt,
                data: Vec::new(),
                tsih: id.tsih,
                enters_full_feature: false,
            });
        }
        let text = std::mem::take(&mut self.text);
        let pairs = match parse_text(&text) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("login text rejected: {e}");
                return self.fail(LoginStatus::INITIATOR_ERROR, itt);
            }
        };
        if !self.auth_looked_up {
            self.auth_looked_up = true;
            let auth = self.auth_for(&pairs);
            if auth.required() {
                // RFC 7143 §12: a target that requires CHAP offers nothing else.
                self.neg.limits.auth_methods = vec![AuthMethod::Chap];
                self.auth = Some(auth);
            }
        }
        if skips_security && !self.neg.limits.auth_methods.contains(&AuthMethod::None) {
            // RFC 7143 §6.3: skipping the security stage is only possible
            // when the target needs no authentication.
            tracing::warn!(
                initiator = self.initiator_for_log(&pairs),
                "login skipped the security stage of a target requiring CHAP"
            );
            return self.fail(LoginStatus::AUTH_FAILURE, itt);
        }
        type Pairs<'a> = Vec<(&'a str, &'a str)>;
        let (chap_keys, pairs): (Pairs<'_>, Pairs<'_>) =
            pairs.into_iter().partition(|(k, _)| k.starts_with("CHAP_"));
        let phase = if csg == STAGE_SECURITY {
            Phase::Security
        } else {
            Phase::Operational
        };
        let mut rsp = match self.neg.apply_all(&pairs, phase) {
            Ok(r) => r,
            Err(st) => return self.fail(st, itt),
        };
        if !self.checked_first {
            self.checked_first = true;
            if let Err(st) = self.check_first() {
                return self.fail(st, itt);
            }
        }
        let normal = self.neg.params.session_type == SessionType::Normal;
        if !self.declared_target && normal {
            self.declared_target = true;
            if let Some(t) = self.target() {
                // RFC 7143 §13.9: the target returns TargetPortalGroupTag in
                // the first Login Response of a normal session.
                rsp.push(("TargetPortalGroupTag".into(), t.tpgt.to_string()));
                if let Some(a) = &t.alias {
                    rsp.push(("TargetAlias".into(), a.clone()));
                }
            }
        }
        let mut transit = transit;
        let mut chap_done = false;
        if csg == STAGE_SECURITY && self.neg.params.auth_method == Some(AuthMethod::Chap) {
            let auth = self.auth.clone().unwrap_or_default();
            let x = self.chap.get_or_insert_with(|| ChapExchange::new(auth));
            match x.step(&chap_keys, &mut self.rng) {
                Ok(step) => {
                    rsp.extend(step.keys);
                    chap_done = step.done;
                }
                Err(e) => {
                    // RFC 7143 §11.13.5: 0201 authentication failure.
                    tracing::warn!(
                        initiator = self.neg.params.initiator_name.as_deref().unwrap_or("?"),
                        reason = e.why,
                        "CHAP authentication failed"
                    );
                    return self.fail(e.status, itt);
                }
            }
            // RFC 7143 §12.1.3: the security stage ends only after the
            // exchange; until then the target answers with T=0.
            if !chap_done {
                transit = false;
            }
        } else if !chap_keys.is_empty() {
            // CHAP keys without an agreed CHAP method, or outside the
            // security stage.
            return self.fail(LoginStatus::INITIATOR_ERROR, itt);
        }
        if csg == STAGE_SECURITY && transit {
            // RFC 7143 §12: leaving the security stage needs an agreed method.
            match self.neg.params.auth_method {
                Some(AuthMethod::None) => {}
                Some(AuthMethod::Chap) if chap_done => {}
                None if self.neg.limits.auth_methods.contains(&AuthMethod::None)
                    && !self.neg.seen("AuthMethod") =>
                {
                    self.neg.params.auth_method = Some(AuthMethod::None);
                }
                // CHAP exchanges would run here before the transit is agreed.
                _ => return self.fail(LoginStatus::AUTH_FAILURE, itt),
            }
        }
        if csg == STAGE_OPERATIONAL && !self.neg.declared_mrdsl {
            // RFC 7143 §13.12: declare what we accept.
            self.neg.declared_mrdsl = true;
            let n = self.neg.limits.max_recv_data_segment_length;
            self.neg.params.max_recv_data_segment_length = n;
            rsp.push(("MaxRecvDataSegmentLength".into(), n.to_string()));
        }
        if csg == STAGE_OPERATIONAL
            && self.neg.limits.rdma
            && normal
            && !self.neg.seen("TargetRecvDataSegmentLength")
            && !self.declared_trdsl
        {
            // On an iSER connection the target declares what it receives
            // in a control PDU when the initiator did not say (8192, the
            // default, would stand otherwise).
            self.declared_trdsl = true;
            let n = self.neg.limits.max_recv_data_segment_length;
            self.neg.params.target_recv_data_segment_length = n;
            rsp.push(("TargetRecvDataSegmentLength".into(), n.to_string()));
        }
        let mut nsg = nsg;
        if transit && nsg == STAGE_FULL_FEATURE && normal {
            if csg == STAGE_SECURITY && self.neg.has_offers() {
                // Operational keys wait for the operational stage: go there.
                nsg = STAGE_OPERATIONAL;
            } else if csg == STAGE_OPERATIONAL {
                let offers = self.neg.take_offers();
                if !offers.is_empty() {
                    // RFC 7143 §6.2: the target offers; the initiator answers
                    // before the stage ends, so no transit yet.
                    rsp.extend(offers);
                    transit = false;
                }
            }
        }
        let reply = LoginReply {
            transit,
            cont: false,
            csg,
            nsg: if transit { nsg } else { 0 },
            itt,
            data: encode_text(&rsp),
            tsih: id.tsih,
            enters_full_feature: transit && nsg == STAGE_FULL_FEATURE,
        };
        if reply.enters_full_feature {
            if let Err(st) = self.neg.settle() {
                tracing::warn!(
                    initiator = self.neg.params.initiator_name.as_deref().unwrap_or("?"),
                    "login on an RDMA connection without RDMAExtensions=Yes"
                );
                return self.fail(st, itt);
            }
            self.state = State::AwaitingSession;
            self.held = Some(reply);
            let p = &self.neg.params;
            return LoginStep::SessionRequest {
                initiator: p.initiator_name.clone().unwrap_or_default(),
                isid: id.isid,
                tsih: id.tsih,
                target: if normal { p.target_name.clone() } else { None },
                discovery: !normal,
            };
        }
        self.state = State::Stage(if transit { nsg } else { csg });
        LoginStep::Reply(reply)
    }

    fn initiator_for_log<'a>(&'a self, pairs: &[(&'a str, &'a str)]) -> &'a str {
        pairs
            .iter()
            .find(|(k, _)| *k == "InitiatorName")
            .map(|(_, v)| *v)
            .or(self.neg.params.initiator_name.as_deref())
            .unwrap_or("?")
    }

    fn target(&self) -> Option<&IscsiTarget> {
        let name = self.neg.params.target_name.as_deref()?;
        self.cfg.targets.iter().find(|t| t.name == name)
    }

    /// RFC 7143 §11.13.5: names and session type of the first request.
    fn check_first(&self) -> Result<(), LoginStatus> {
        let p = &self.neg.params;
        if p.initiator_name.is_none() {
            return Err(LoginStatus::MISSING_PARAMETER);
        }
        if p.session_type == SessionType::Normal {
            if p.target_name.is_none() {
                return Err(LoginStatus::MISSING_PARAMETER);
            }
            if self.target().is_none() {
                return Err(LoginStatus::NOT_FOUND);
            }
        }
        Ok(())
    }

    /// The driver accepted the session: the final reply, with the TSIH.
    pub fn accept(&mut self, tsih: u16) -> Option<LoginReply> {
        if self.state != State::AwaitingSession {
            return None;
        }
        self.state = State::Done;
        self.held.take().map(|mut r| {
            r.tsih = tsih;
            r
        })
    }

    /// The driver refused the session.
    pub fn reject(&mut self, status: LoginStatus) -> Option<LoginStep> {
        if self.state != State::AwaitingSession {
            return None;
        }
        let itt = self.held.take().map_or(0, |r| r.itt);
        Some(self.fail(status, itt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{BhsBuf, Opcode, flags};

    fn target() -> IscsiTarget {
        IscsiTarget {
            name: "iqn.2026-01.test:disk".into(),
            alias: Some("disk".into()),
            tpgt: 7,
            portals: vec![],
            auth: Default::default(),
        }
    }

    fn req(t: bool, c: bool, csg: u8, nsg: u8) -> BhsBuf {
        let mut f = (csg << 2) | nsg;
        if t {
            f |= flags::T;
        }
        if c {
            f |= flags::C;
        }
        let mut b = BhsBuf::new(Opcode::LOGIN_REQ, f);
        b.set_immediate();
        b.0[8..14].copy_from_slice(&[0x80, 1, 2, 3, 4, 5]);
        b.set_itt(0x11);
        b
    }

    fn cfg() -> Arc<IscsiConfig> {
        Arc::new(IscsiConfig {
            targets: vec![target()],
            ..IscsiConfig::default()
        })
    }

    fn login() -> Login {
        Login::new(Limits::default(), cfg())
    }

    fn text(keys: &[(&str, &str)]) -> Vec<u8> {
        encode_text(keys)
    }

    fn reply(s: LoginStep) -> LoginReply {
        match s {
            LoginStep::Reply(r) => r,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn security_then_operational_then_full_feature() {
        let mut l = login();
        let b = req(true, false, 0, 1);
        let r = reply(l.handle(
            b.view(),
            &text(&[
                ("InitiatorName", "iqn.i"),
                ("TargetName", "iqn.2026-01.test:disk"),
                ("SessionType", "Normal"),
                ("AuthMethod", "None"),
            ]),
        ));
        assert!(r.transit);
        assert_eq!((r.csg, r.nsg), (0, 1));
        let keys = parse_text(&r.data).unwrap();
        assert!(keys.contains(&("AuthMethod", "None")));
        assert!(keys.contains(&("TargetPortalGroupTag", "7")));
        assert!(keys.contains(&("TargetAlias", "disk")));

        let b = req(true, false, 1, 3);
        let s = l.handle(
            b.view(),
            &text(&[("MaxBurstLength", "65536"), ("ImmediateData", "Yes")]),
        );
        match s {
            LoginStep::SessionRequest {
                initiator,
                isid,
                tsih,
                target,
                discovery,
            } => {
                assert_eq!(initiator, "iqn.i");
                assert_eq!(isid, [0x80, 1, 2, 3, 4, 5]);
                assert_eq!(tsih, 0);
                assert_eq!(target.as_deref(), Some("iqn.2026-01.test:disk"));
                assert!(!discovery);
            }
            other => panic!("{other:?}"),
        }
        // A request while the decision is pending is an error.
        let r = l.accept(0x1234).unwrap();
        assert!(r.enters_full_feature);
        assert_eq!(r.tsih, 0x1234);
        assert_eq!((r.csg, r.nsg), (1, 3));
        let keys = parse_text(&r.data).unwrap();
        assert!(keys.contains(&("MaxBurstLength", "65536")));
        assert!(keys.contains(&("MaxRecvDataSegmentLength", "262144")));
        assert!(l.is_done());
        assert_eq!(l.params().max_burst_length, 65536);
    }

    #[test]
    fn target_offers_keys_the_initiator_left_at_defaults() {
        let limits = Limits {
            max_burst_length: 65536,
            immediate_data: false,
            ..Limits::default()
        };
        let mut l = Login::new(limits, cfg());
        // Straight from security to full feature: the target stops in the
        // operational stage first.
        let r = reply(l.handle(
            req(true, false, 0, 3).view(),
            &text(&[
                ("InitiatorName", "iqn.i"),
                ("TargetName", "iqn.2026-01.test:disk"),
            ]),
        ));
        assert!(r.transit);
        assert_eq!((r.csg, r.nsg), (0, 1));
        // The initiator proposes nothing: the target offers and does not transit.
        let r = reply(l.handle(req(true, false, 1, 3).view(), &[]));
        assert!(!r.transit);
        let keys = parse_text(&r.data).unwrap();
        assert!(keys.contains(&("MaxBurstLength", "65536")));
        assert!(keys.contains(&("ImmediateData", "No")));
        assert!(!keys.iter().any(|(k, _)| *k == "FirstBurstLength"));
        // The answers get no response; now the stage ends.
        let s = l.handle(
            req(true, false, 1, 3).view(),
            &text(&[("MaxBurstLength", "65536"), ("ImmediateData", "No")]),
        );
        assert!(matches!(s, LoginStep::SessionRequest { .. }), "{s:?}");
        let r = l.accept(1).unwrap();
        let keys = parse_text(&r.data).unwrap();
        assert!(
            !keys
                .iter()
                .any(|(k, _)| *k == "MaxBurstLength" || *k == "ImmediateData")
        );
        assert_eq!(l.params().max_burst_length, 65536);
        assert!(!l.params().immediate_data);
    }

    #[test]
    fn discovery_skipping_security() {
        let mut l = login();
        let b = req(true, false, 1, 3);
        let s = l.handle(
            b.view(),
            &text(&[("InitiatorName", "iqn.i"), ("SessionType", "Discovery")]),
        );
        assert!(matches!(
            s,
            LoginStep::SessionRequest {
                discovery: true,
                target: None,
                ..
            }
        ));
        assert_eq!(
            l.reject(LoginStatus::AUTHORIZATION_FAILURE),
            Some(LoginStep::Fail {
                status: LoginStatus::AUTHORIZATION_FAILURE,
                itt: 0x11
            })
        );
    }

    #[test]
    fn statuses_for_bad_logins() {
        let cases: Vec<(BhsBuf, Vec<u8>, LoginStatus)> = vec![
            // No InitiatorName.
            (
                req(true, false, 0, 1),
                text(&[("TargetName", "iqn.2026-01.test:disk")]),
                LoginStatus::MISSING_PARAMETER,
            ),
            // No TargetName on a normal session.
            (
                req(true, false, 0, 1),
                text(&[("InitiatorName", "iqn.i")]),
                LoginStatus::MISSING_PARAMETER,
            ),
            // Unknown target.
            (
                req(true, false, 0, 1),
                text(&[("InitiatorName", "iqn.i"), ("TargetName", "iqn.nope")]),
                LoginStatus::NOT_FOUND,
            ),
            // Garbage text.
            (
                req(true, false, 0, 1),
                b"InitiatorName\0garbage".to_vec(),
                LoginStatus::INITIATOR_ERROR,
            ),
            // Transit backwards.
            (
                req(true, false, 1, 0),
                text(&[("InitiatorName", "iqn.i")]),
                LoginStatus::INITIATOR_ERROR,
            ),
            // NSG 2 is reserved.
            (
                req(true, false, 0, 2),
                text(&[("InitiatorName", "iqn.i")]),
                LoginStatus::INITIATOR_ERROR,
            ),
            // T and C together.
            (
                req(true, true, 0, 1),
                text(&[("InitiatorName", "iqn.i")]),
                LoginStatus::INITIATOR_ERROR,
            ),
            // Only CHAP offered, we accept None only.
            (
                req(true, false, 0, 1),
                text(&[
                    ("InitiatorName", "iqn.i"),
                    ("SessionType", "Discovery"),
                    ("AuthMethod", "CHAP"),
                ]),
                LoginStatus::AUTH_FAILURE,
            ),
        ];
        for (i, (b, d, st)) in cases.into_iter().enumerate() {
            let mut l = login();
            assert_eq!(
                l.handle(b.view(), &d),
                LoginStep::Fail {
                    status: st,
                    itt: 0x11
                },
                "case {i}"
            );
        }
        let mut b = req(true, false, 0, 1);
        b.set_u8(3, 1);
        let mut l = login();
        assert_eq!(
            l.handle(b.view(), &text(&[("InitiatorName", "iqn.i")])),
            LoginStep::Fail {
                status: LoginStatus::UNSUPPORTED_VERSION,
                itt: 0x11
            }
        );
    }

    #[test]
    fn continued_text_spans_pdus() {
        let mut l = login();
        let all = text(&[("InitiatorName", "iqn.i"), ("SessionType", "Discovery")]);
        let (a, b) = all.split_at(10);
        let r = reply(l.handle(req(false, true, 0, 0).view(), a));
        assert!(!r.transit && !r.cont && r.data.is_empty());
        let r = reply(l.handle(req(true, false, 0, 1).view(), b));
        assert!(r.transit);
        assert_eq!(l.params().session_type, SessionType::Discovery);
    }

    #[test]
    fn identity_must_not_change() {
        let mut l = login();
        let _ = reply(l.handle(
            req(false, false, 0, 0).view(),
            &text(&[("InitiatorName", "iqn.i"), ("SessionType", "Discovery")]),
        ));
        let mut b = req(true, false, 0, 1);
        b.set_u16(14, 9);
        assert!(matches!(
            l.handle(b.view(), &[]),
            LoginStep::Fail {
                status: LoginStatus::INITIATOR_ERROR,
                ..
            }
        ));
    }

    /// A connection added to a session (TSIH != 0) may not negotiate the
    /// session's leading-only keys (RFC 7143 §13), and is offered none.
    #[test]
    fn leading_only_keys_refused_on_a_later_connection() {
        let names = [
            ("InitiatorName", "iqn.i"),
            ("TargetName", "iqn.2026-01.test:disk"),
            ("SessionType", "Normal"),
        ];
        let later = |keys: &[(&str, &str)]| {
            let mut l = Login::new(
                Limits {
                    max_burst_length: 65536,
                    ..Limits::default()
                },
                cfg(),
            );
            let mut b = req(true, false, 1, 3);
            b.set_u16(14, 0x42);
            let mut all = names.to_vec();
            all.extend_from_slice(keys);
            l.handle(b.view(), &text(&all))
        };
        for key in [
            ("MaxConnections", "4"),
            ("InitialR2T", "No"),
            ("MaxBurstLength", "4096"),
        ] {
            assert!(
                matches!(
                    later(&[key]),
                    LoginStep::Fail {
                        status: LoginStatus::INITIATOR_ERROR,
                        ..
                    }
                ),
                "{key:?} accepted on a later connection"
            );
        }
        // Per-connection keys are fine, and the target offers no LO key
        // (its smaller MaxBurstLength is not offered again).
        match later(&[
            ("HeaderDigest", "None"),
            ("MaxRecvDataSegmentLength", "8192"),
        ]) {
            LoginStep::SessionRequest { tsih, .. } => assert_eq!(tsih, 0x42),
            other => panic!("expected the session request, got {other:?}"),
        }
        // The same keys on a leading connection are negotiated.
        let mut l = login();
        let mut all = names.to_vec();
        all.push(("MaxConnections", "4"));
        assert!(matches!(
            l.handle(req(true, false, 1, 3).view(), &text(&all)),
            LoginStep::SessionRequest { tsih: 0, .. }
        ));
    }

    fn chap_login() -> Login {
        use crate::chap::ChapUser;
        let mut t = target();
        t.auth = ChapAuth {
            incoming: vec![ChapUser {
                user: "ini".into(),
                secret: b"initiator-secret".to_vec(),
            }],
            outgoing: Some(ChapUser {
                user: "tgt".into(),
                secret: b"target-secret-x".to_vec(),
            }),
        };
        let cfg = Arc::new(IscsiConfig {
            targets: vec![t],
            ..IscsiConfig::default()
        });
        Login::with_rng(Limits::default(), cfg, ChapRng::new(5))
    }

    fn first_chap_request(l: &mut Login) -> LoginReply {
        let b = req(true, false, 0, 1);
        reply(l.handle(
            b.view(),
            &text(&[
                ("InitiatorName", "iqn.i"),
                ("TargetName", "iqn.2026-01.test:disk"),
                ("AuthMethod", "CHAP,None"),
            ]),
        ))
    }

    /// CHAP_I and CHAP_C of a reply.
    fn challenge(r: &LoginReply) -> (u8, Vec<u8>) {
        let keys = parse_text(&r.data).unwrap();
        let i = keys.iter().find(|(k, _)| *k == "CHAP_I").unwrap().1;
        let c = keys.iter().find(|(k, _)| *k == "CHAP_C").unwrap().1;
        (i.parse().unwrap(), crate::chap::decode_binary(c).unwrap())
    }

    #[test]
    fn chap_target_holds_the_security_stage_until_the_response() {
        use crate::chap::{ChapAlg, encode_hex};
        let mut l = chap_login();
        let r = first_chap_request(&mut l);
        assert!(!r.transit, "no transit before CHAP");
        assert!(
            parse_text(&r.data)
                .unwrap()
                .contains(&("AuthMethod", "CHAP"))
        );
        let b = req(false, false, 0, 0);
        let r = reply(l.handle(b.view(), &text(&[("CHAP_A", "5")])));
        assert!(!r.transit);
        assert!(parse_text(&r.data).unwrap().contains(&("CHAP_A", "5")));
        let (id, c) = challenge(&r);
        let resp = encode_hex(&ChapAlg::Md5.response(id, b"initiator-secret", &c));
        let mine = [0x42u8; 16];
        let b = req(true, false, 0, 1);
        let r = reply(l.handle(
            b.view(),
            &text(&[
                ("CHAP_N", "ini"),
                ("CHAP_R", &resp),
                ("CHAP_I", "9"),
                ("CHAP_C", &encode_hex(&mine)),
            ]),
        ));
        assert!(r.transit);
        assert_eq!((r.csg, r.nsg), (0, 1));
        let want = encode_hex(&ChapAlg::Md5.response(9, b"target-secret-x", &mine));
        let keys = parse_text(&r.data).unwrap();
        assert!(keys.contains(&("CHAP_N", "tgt")));
        assert!(keys.contains(&("CHAP_R", want.as_str())));
        assert_eq!(l.chap_user(), Some("ini"));
    }

    #[test]
    fn chap_wrong_secret_is_0201() {
        use crate::chap::{ChapAlg, encode_hex};
        let mut l = chap_login();
        first_chap_request(&mut l);
        let b = req(false, false, 0, 0);
        let r = reply(l.handle(b.view(), &text(&[("CHAP_A", "7")])));
        let (id, c) = challenge(&r);
        let resp = encode_hex(&ChapAlg::Sha256.response(id, b"not-the-secret", &c));
        let b = req(true, false, 0, 1);
        let s = l.handle(b.view(), &text(&[("CHAP_N", "ini"), ("CHAP_R", &resp)]));
        assert!(matches!(
            s,
            LoginStep::Fail {
                status: LoginStatus::AUTH_FAILURE,
                ..
            }
        ));
    }

    #[test]
    fn chap_target_refuses_none_and_skipping_security() {
        let mut l = chap_login();
        let b = req(true, false, 0, 1);
        let s = l.handle(
            b.view(),
            &text(&[
                ("InitiatorName", "iqn.i"),
                ("TargetName", "iqn.2026-01.test:disk"),
                ("AuthMethod", "None"),
            ]),
        );
        assert!(matches!(
            s,
            LoginStep::Fail {
                status: LoginStatus::AUTH_FAILURE,
                ..
            }
        ));
        let mut l = chap_login();
        let b = req(true, false, 1, 3);
        let s = l.handle(
            b.view(),
            &text(&[
                ("InitiatorName", "iqn.i"),
                ("TargetName", "iqn.2026-01.test:disk"),
            ]),
        );
        assert!(matches!(
            s,
            LoginStep::Fail {
                status: LoginStatus::AUTH_FAILURE,
                ..
            }
        ));
    }
}
