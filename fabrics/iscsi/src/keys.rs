//! Text keys (RFC 7143 §6, §13): parsing and encoding of NUL-separated
//! `key=value` pairs, and the target side of login/text negotiation,
//! iSER's keys (RFC 7145) included for connections whose datamover is RDMA.
//!
//! [`Negotiator`] takes the initiator's keys one at a time and answers each
//! with the value the target responds (or nothing for declarative keys it
//! just records), accumulating the operational [`Params`] of the connection
//! and session.

use crate::pdu::LoginStatus;

/// RFC 7143 §6.1: key names are at most 63 bytes.
pub const MAX_KEY_NAME: usize = 63;
/// Longest value accepted (RFC 7143 §6.1 allows 255 for most keys, 8192 for
/// some, e.g. CHAP values in base64/hex).
pub const MAX_VALUE: usize = 8192;
/// Longest text accumulated over C-bit continuation (login or text phase).
pub const MAX_TEXT: usize = 64 * 1024;

/// Malformed text (not a value problem): answered with a login reject
/// 0200h or a Reject PDU.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("text is not NUL-terminated")]
    Unterminated,
    #[error("pair without '='")]
    NoEquals,
    #[error("empty or over-long key name")]
    BadKey,
    #[error("over-long value")]
    ValueTooLong,
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("text longer than {MAX_TEXT} bytes")]
    TooLong,
}

/// RFC 7143 §6.1: the key name is made of letters, digits and `.-+@_`
/// (and `:` appears in practice in vendor keys).
fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= MAX_KEY_NAME
        && k.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b".-+@_:#".contains(&c))
}

/// Splits NUL-separated `key=value` pairs. Trailing NUL padding and empty
/// strings between pairs are tolerated.
pub fn parse_text(data: &[u8]) -> Result<Vec<(&str, &str)>, TextError> {
    if data.len() > MAX_TEXT {
        return Err(TextError::TooLong);
    }
    let mut out = Vec::new();
    let Some(last_nul) = data.iter().rposition(|&b| b == 0) else {
        return if data.is_empty() {
            Ok(out)
        } else {
            Err(TextError::Unterminated)
        };
    };
    // RFC 7143 §6.1: every pair ends with NUL; bytes after the last NUL are
    // an unterminated pair.
    if data[last_nul + 1..].iter().any(|&b| b != 0) {
        return Err(TextError::Unterminated);
    }
    for item in data[..last_nul].split(|&b| b == 0) {
        if item.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(item).map_err(|_| TextError::NotUtf8)?;
        let (k, v) = s.split_once('=').ok_or(TextError::NoEquals)?;
        if !valid_key(k) {
            return Err(TextError::BadKey);
        }
        if v.len() > MAX_VALUE {
            return Err(TextError::ValueTooLong);
        }
        out.push((k, v));
    }
    Ok(out)
}

/// Encodes pairs as `key=value\0...`.
pub fn encode_text<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref().as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_ref().as_bytes());
        out.push(0);
    }
    out
}

/// Session type (RFC 7143 §13.21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SessionType {
    #[default]
    Normal,
    Discovery,
}

/// Digest choice (RFC 7143 §13.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Digest {
    #[default]
    None,
    Crc32c,
}

impl Digest {
    pub fn name(self) -> &'static str {
        match self {
            Digest::None => "None",
            Digest::Crc32c => "CRC32C",
        }
    }
    fn parse(s: &str) -> Option<Digest> {
        match s {
            "None" => Some(Digest::None),
            "CRC32C" => Some(Digest::Crc32c),
            _ => None,
        }
    }
}

/// Authentication methods (RFC 7143 §12.1). CHAP is the next to come; the
/// security stage in `login` is an enum so it slots in there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    None,
    Chap,
}

impl AuthMethod {
    pub fn name(self) -> &'static str {
        match self {
            AuthMethod::None => "None",
            AuthMethod::Chap => "CHAP",
        }
    }
}

/// What the target offers and accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u32,
    pub max_connections: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    /// Digests accepted, in the target's order of preference.
    pub digests: Vec<Digest>,
    /// DataDigest values accepted when they differ from `digests` (which
    /// then applies to HeaderDigest only).
    pub data_digests: Option<Vec<Digest>>,
    /// Authentication methods accepted.
    pub auth_methods: Vec<AuthMethod>,
    /// The connection runs over an RDMA datamover (iSER, RFC 7145): its
    /// driver says so when it builds the connection. RDMAExtensions is
    /// answered Yes and must end Yes on a normal session, digests are None
    /// and the iSER keys apply; on TCP RDMAExtensions is No and the iSER
    /// keys are irrelevant.
    pub rdma: bool,
    /// The most unexpected PDUs (those not answering a target's request)
    /// the target takes from the initiator at once on an RDMA connection:
    /// its MaxOutstandingUnexpectedPDUs; 0 is no limit.
    pub max_outstanding_unexpected_pdus: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_recv_data_segment_length: 256 * 1024,
            max_burst_length: 1024 * 1024,
            first_burst_length: 64 * 1024,
            immediate_data: true,
            initial_r2t: true,
            max_outstanding_r2t: 1,
            max_connections: 1,
            default_time2wait: 2,
            default_time2retain: 0,
            digests: vec![Digest::Crc32c, Digest::None],
            data_digests: None,
            auth_methods: vec![AuthMethod::None],
            rdma: false,
            max_outstanding_unexpected_pdus: 0,
        }
    }
}

/// The operational parameters in force, starting from the RFC 7143 §13
/// defaults and updated by negotiation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub session_type: SessionType,
    pub initiator_name: Option<String>,
    pub initiator_alias: Option<String>,
    pub target_name: Option<String>,
    pub auth_method: Option<AuthMethod>,
    pub header_digest: Digest,
    pub data_digest: Digest,
    /// The largest data segment the target accepts (what it declared).
    pub max_recv_data_segment_length: u32,
    /// The largest data segment the target may send (the initiator's
    /// declared MaxRecvDataSegmentLength).
    pub max_xmit_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u32,
    pub max_connections: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub error_recovery_level: u8,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    /// RDMAExtensions=Yes: the connection is in iSER-assisted mode (RFC
    /// 7145).
    pub rdma_extensions: bool,
    /// TargetRecvDataSegmentLength (iSER): the largest data segment of a
    /// control PDU the initiator sends the target. With RDMAExtensions=Yes
    /// it is also `max_recv_data_segment_length`.
    pub target_recv_data_segment_length: u32,
    /// InitiatorRecvDataSegmentLength (iSER): the largest data segment of a
    /// control PDU the target sends the initiator. With RDMAExtensions=Yes
    /// it is also `max_xmit_data_segment_length`.
    pub initiator_recv_data_segment_length: u32,
    /// MaxOutstandingUnexpectedPDUs (iSER): how many unexpected PDUs the
    /// initiator may have outstanding; 0 is no limit.
    pub max_outstanding_unexpected_pdus: u32,
}

impl Default for Params {
    /// RFC 7143 §13 defaults.
    fn default() -> Params {
        Params {
            session_type: SessionType::Normal,
            initiator_name: None,
            initiator_alias: None,
            target_name: None,
            auth_method: None,
            header_digest: Digest::None,
            data_digest: Digest::None,
            max_recv_data_segment_length: 8192,
            max_xmit_data_segment_length: 8192,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            immediate_data: true,
            initial_r2t: true,
            max_outstanding_r2t: 1,
            max_connections: 1,
            default_time2wait: 2,
            default_time2retain: 20,
            error_recovery_level: 0,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            rdma_extensions: false,
            target_recv_data_segment_length: 8192,
            initiator_recv_data_segment_length: 8192,
            max_outstanding_unexpected_pdus: 0,
        }
    }
}

/// Keys of RFC 7143 §12-§13 and RFC 7145's iSER keys this module knows.
pub const KNOWN_KEYS: &[&str] = &[
    "AuthMethod",
    "HeaderDigest",
    "DataDigest",
    "MaxConnections",
    "SendTargets",
    "TargetName",
    "InitiatorName",
    "TargetAlias",
    "InitiatorAlias",
    "TargetAddress",
    "TargetPortalGroupTag",
    "InitialR2T",
    "ImmediateData",
    "MaxRecvDataSegmentLength",
    "MaxBurstLength",
    "FirstBurstLength",
    "DefaultTime2Wait",
    "DefaultTime2Retain",
    "MaxOutstandingR2T",
    "DataPDUInOrder",
    "DataSequenceInOrder",
    "ErrorRecoveryLevel",
    "SessionType",
    "IFMarker",
    "OFMarker",
    "IFMarkInt",
    "OFMarkInt",
    "RDMAExtensions",
    "TargetRecvDataSegmentLength",
    "InitiatorRecvDataSegmentLength",
    "MaxOutstandingUnexpectedPDUs",
];

/// RFC 7143 §13: keys whose "Use" is LO (leading only): they belong to the
/// session and may only be negotiated on its first connection. A later
/// connection of the session (MC/S, TSIH != 0) inherits them.
pub const LEADING_ONLY_KEYS: &[&str] = &[
    "SessionType",
    "MaxConnections",
    "InitialR2T",
    "ImmediateData",
    "MaxBurstLength",
    "FirstBurstLength",
    "DefaultTime2Wait",
    "DefaultTime2Retain",
    "MaxOutstandingR2T",
    "DataPDUInOrder",
    "DataSequenceInOrder",
    "ErrorRecoveryLevel",
];

/// Login stage a key arrived in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Security,
    Operational,
    FullFeature,
}

/// The target side of a negotiation.
#[derive(Clone, Debug)]
pub struct Negotiator {
    pub limits: Limits,
    pub params: Params,
    seen: Vec<String>,
    /// Keys the target offered; the initiator's values for them are answers
    /// and get no response.
    offered: Vec<String>,
    /// Whether our MaxRecvDataSegmentLength was declared.
    pub declared_mrdsl: bool,
    /// This login opens a session (TSIH 0); false for a connection added to
    /// an existing session, where leading-only keys are refused.
    pub leading: bool,
}

/// Parses an RFC 7143 §6.2 numerical value: decimal or `0x` hex.
fn parse_num(v: &str) -> Option<u64> {
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        if h.is_empty() || h.len() > 16 {
            return None;
        }
        u64::from_str_radix(h, 16).ok()
    } else if !v.is_empty() && v.len() <= 20 && v.bytes().all(|b| b.is_ascii_digit()) {
        v.parse().ok()
    } else {
        None
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yes_no(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

/// The smaller of two limits where 0 is none.
fn min_limit(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

const REJECT: &str = "Reject";
const IRRELEVANT: &str = "Irrelevant";
const NOT_UNDERSTOOD: &str = "NotUnderstood";

impl Negotiator {
    pub fn new(limits: Limits) -> Negotiator {
        let mut params = Params::default();
        params.default_time2retain = limits.default_time2retain.min(params.default_time2retain);
        Negotiator {
            limits,
            params,
            seen: Vec::new(),
            offered: Vec::new(),
            declared_mrdsl: false,
            leading: true,
        }
    }

    fn discovery(&self) -> bool {
        self.params.session_type == SessionType::Discovery
    }

    /// Handles one key from the initiator. `Ok(Some(value))` is the response
    /// to send for `key`; `Ok(None)` means none (declarative keys); `Err` ends
    /// the login with that status (RFC 7143 §11.13.5).
    pub fn apply(
        &mut self,
        key: &str,
        value: &str,
        phase: Phase,
    ) -> Result<Option<String>, LoginStatus> {
        // RFC 7143 §6.1: a key is negotiated at most once; a repetition is a
        // protocol error.
        if self.seen.iter().any(|k| k == key) {
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        self.seen.push(key.to_string());
        if !self.leading && LEADING_ONLY_KEYS.contains(&key) && key != "SessionType" {
            // RFC 7143 §13: an LO key "can only be used in the leading
            // connection"; on a later connection of the session it is an
            // initiator error (the session's value stands).
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        let p = &mut self.params;
        let l = &self.limits;
        let irrelevant_in_discovery = matches!(
            key,
            "InitialR2T"
                | "ImmediateData"
                | "MaxBurstLength"
                | "FirstBurstLength"
                | "MaxOutstandingR2T"
                | "DataPDUInOrder"
                | "DataSequenceInOrder"
                | "MaxConnections"
        );
        if irrelevant_in_discovery && p.session_type == SessionType::Discovery {
            // RFC 7143 §13: "Irrelevant when: SessionType=Discovery".
            return Ok(Some(IRRELEVANT.into()));
        }
        let iser_only = matches!(
            key,
            "TargetRecvDataSegmentLength"
                | "InitiatorRecvDataSegmentLength"
                | "MaxOutstandingUnexpectedPDUs"
        );
        if iser_only && !l.rdma {
            // RFC 7145: irrelevant when RDMAExtensions=No, which a TCP
            // connection always ends with.
            return Ok(Some(IRRELEVANT.into()));
        }
        let num = |lo: u64, hi: u64| parse_num(value).filter(|n| (lo..=hi).contains(n));
        let rsp = match key {
            "InitiatorName" => {
                // RFC 7143 §13.6: iSCSI names are at most 223 bytes.
                if value.is_empty() || value.len() > 223 {
                    return Err(LoginStatus::INITIATOR_ERROR);
                }
                p.initiator_name = Some(value.to_string());
                None
            }
            "InitiatorAlias" => {
                p.initiator_alias = Some(value.to_string());
                None
            }
            "TargetName" => {
                if value.is_empty() || value.len() > 223 {
                    return Err(LoginStatus::INITIATOR_ERROR);
                }
                p.target_name = Some(value.to_string());
                None
            }
            "SessionType" => {
                p.session_type = match value {
                    "Normal" => SessionType::Normal,
                    "Discovery" => SessionType::Discovery,
                    _ => return Err(LoginStatus::SESSION_TYPE_NOT_SUPPORTED),
                };
                None
            }
            "AuthMethod" => {
                if phase != Phase::Security {
                    // RFC 7143 §12.1: AuthMethod belongs to the security stage.
                    return Err(LoginStatus::INITIATOR_ERROR);
                }
                // RFC 7143 §6.2.1 list negotiation: first of the initiator's
                // choices that we accept.
                let pick = value.split(',').find_map(|m| {
                    l.auth_methods
                        .iter()
                        .copied()
                        .find(|a| a.name().eq_ignore_ascii_case(m))
                });
                match pick {
                    Some(a) => {
                        p.auth_method = Some(a);
                        Some(a.name().to_string())
                    }
                    None => Some(REJECT.into()),
                }
            }
            "HeaderDigest" | "DataDigest" if l.rdma => {
                // RFC 7145: the iSER layer carries no iSCSI digests; whatever
                // is offered, the answer is None.
                if key == "HeaderDigest" {
                    p.header_digest = Digest::None;
                } else {
                    p.data_digest = Digest::None;
                }
                Some(Digest::None.name().to_string())
            }
            "HeaderDigest" | "DataDigest" => {
                // RFC 7143 §13.1: each key is negotiated on its own list.
                let accepted = match (&l.data_digests, key) {
                    (Some(d), "DataDigest") => d,
                    _ => &l.digests,
                };
                let pick = value
                    .split(',')
                    .filter_map(Digest::parse)
                    .find(|d| accepted.contains(d));
                match pick {
                    Some(d) => {
                        if key == "HeaderDigest" {
                            p.header_digest = d;
                        } else {
                            p.data_digest = d;
                        }
                        Some(d.name().to_string())
                    }
                    // RFC 7143 §6.2.1: no common value leaves the key at its
                    // default, None. A target that does not accept None for
                    // it ends the login rather than run without the digest
                    // it requires.
                    None if !accepted.contains(&Digest::None) => {
                        return Err(LoginStatus::INITIATOR_ERROR);
                    }
                    None => Some(REJECT.into()),
                }
            }
            "MaxRecvDataSegmentLength" => match num(512, 0xff_ffff) {
                // RFC 7143 §13.12: declarative; the initiator's value limits
                // what we send.
                Some(n) => {
                    p.max_xmit_data_segment_length = n as u32;
                    self.declared_mrdsl = true;
                    p.max_recv_data_segment_length = l.max_recv_data_segment_length;
                    Some(l.max_recv_data_segment_length.to_string())
                }
                None => Some(REJECT.into()),
            },
            "MaxBurstLength" => match num(512, 0xff_ffff) {
                Some(n) => {
                    p.max_burst_length = (n as u32).min(l.max_burst_length);
                    Some(p.max_burst_length.to_string())
                }
                None => Some(REJECT.into()),
            },
            "FirstBurstLength" => match num(512, 0xff_ffff) {
                Some(n) => {
                    p.first_burst_length = (n as u32).min(l.first_burst_length);
                    Some(p.first_burst_length.to_string())
                }
                None => Some(REJECT.into()),
            },
            "MaxConnections" => match num(1, 65535) {
                Some(n) => {
                    p.max_connections = (n as u16).min(l.max_connections.max(1));
                    Some(p.max_connections.to_string())
                }
                None => Some(REJECT.into()),
            },
            "MaxOutstandingR2T" => match num(1, 65535) {
                Some(n) => {
                    p.max_outstanding_r2t = (n as u32).min(l.max_outstanding_r2t.max(1));
                    Some(p.max_outstanding_r2t.to_string())
                }
                None => Some(REJECT.into()),
            },
            "DefaultTime2Wait" => match num(0, 3600) {
                // RFC 7143 §13.15: the result is the maximum.
                Some(n) => {
                    p.default_time2wait = (n as u16).max(l.default_time2wait);
                    Some(p.default_time2wait.to_string())
                }
                None => Some(REJECT.into()),
            },
            "DefaultTime2Retain" => match num(0, 3600) {
                // RFC 7143 §13.16: the result is the minimum.
                Some(n) => {
                    p.default_time2retain = (n as u16).min(l.default_time2retain);
                    Some(p.default_time2retain.to_string())
                }
                None => Some(REJECT.into()),
            },
            "ErrorRecoveryLevel" => match num(0, 2) {
                // RFC 7143 §13.20: minimum; we offer 0.
                Some(_) => {
                    p.error_recovery_level = 0;
                    Some("0".into())
                }
                None => Some(REJECT.into()),
            },
            "InitialR2T" => match parse_bool(value) {
                // RFC 7143 §13.10: OR.
                Some(b) => {
                    p.initial_r2t = b || l.initial_r2t;
                    Some(yes_no(p.initial_r2t))
                }
                None => Some(REJECT.into()),
            },
            "ImmediateData" => match parse_bool(value) {
                // RFC 7143 §13.11: AND.
                Some(b) => {
                    p.immediate_data = b && l.immediate_data;
                    Some(yes_no(p.immediate_data))
                }
                None => Some(REJECT.into()),
            },
            "DataPDUInOrder" | "DataSequenceInOrder" => match parse_bool(value) {
                // RFC 7143 §13.18, §13.19: OR; this target only supports Yes.
                Some(_) => {
                    if key == "DataPDUInOrder" {
                        p.data_pdu_in_order = true;
                    } else {
                        p.data_sequence_in_order = true;
                    }
                    Some("Yes".into())
                }
                None => Some(REJECT.into()),
            },
            "IFMarker" | "OFMarker" => match parse_bool(value) {
                // Markers (RFC 3720 Appendix A, obsolete in RFC 7143): AND;
                // this target says No.
                Some(_) => Some("No".into()),
                None => Some(REJECT.into()),
            },
            "RDMAExtensions" => match parse_bool(value) {
                // RFC 7145: AND; Yes only on an RDMA connection (TCP says No).
                Some(b) => {
                    p.rdma_extensions = b && l.rdma;
                    Some(yes_no(p.rdma_extensions))
                }
                None => Some(REJECT.into()),
            },
            "TargetRecvDataSegmentLength" => match num(512, 0xff_ffff) {
                // RFC 7145: what the target receives in a control PDU; the
                // target answers with what it takes, at most its own
                // MaxRecvDataSegmentLength.
                Some(n) => {
                    p.target_recv_data_segment_length =
                        (n as u32).min(l.max_recv_data_segment_length);
                    Some(p.target_recv_data_segment_length.to_string())
                }
                None => Some(REJECT.into()),
            },
            "InitiatorRecvDataSegmentLength" => match num(512, 0xff_ffff) {
                // RFC 7145: declared by the initiator, it limits the control
                // PDUs the target sends; the answer repeats it, as LIO's does.
                Some(n) => {
                    p.initiator_recv_data_segment_length = n as u32;
                    Some(p.initiator_recv_data_segment_length.to_string())
                }
                None => Some(REJECT.into()),
            },
            "MaxOutstandingUnexpectedPDUs" => match parse_num(value)
                .filter(|&n| n == 0 || (2..=u64::from(u32::MAX)).contains(&n))
            {
                // RFC 7145: 0 (no limit) or 2 to 2^32-1; the result is the
                // smaller limit, 0 on both sides being no limit.
                Some(n) => {
                    p.max_outstanding_unexpected_pdus =
                        min_limit(n as u32, l.max_outstanding_unexpected_pdus);
                    Some(p.max_outstanding_unexpected_pdus.to_string())
                }
                None => Some(REJECT.into()),
            },
            "IFMarkInt" | "OFMarkInt" => Some(IRRELEVANT.into()),
            // Keys only the target declares.
            "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => Some(REJECT.into()),
            "SendTargets" => {
                if phase == Phase::FullFeature {
                    // Handled by the text phase, not here.
                    None
                } else {
                    Some(REJECT.into())
                }
            }
            _ => Some(NOT_UNDERSTOOD.into()),
        };
        Ok(rsp)
    }

    /// Applies a whole set of pairs and returns the response pairs, then
    /// enforces the cross-key rules.
    pub fn apply_all(
        &mut self,
        pairs: &[(&str, &str)],
        phase: Phase,
    ) -> Result<Vec<(String, String)>, LoginStatus> {
        let mut out = Vec::new();
        for (k, v) in pairs {
            let answer = self.offered.iter().any(|o| o == k);
            if let Some(r) = self.apply(k, v, phase)?
                && !answer
            {
                out.push((k.to_string(), r));
            }
        }
        self.finish(&mut out);
        Ok(out)
    }

    /// RFC 7143 §13.14: FirstBurstLength MUST NOT exceed MaxBurstLength.
    /// Corrects the responses already produced.
    pub fn finish(&mut self, out: &mut [(String, String)]) {
        if self.discovery() {
            return;
        }
        let p = &mut self.params;
        if p.first_burst_length > p.max_burst_length {
            p.first_burst_length = p.max_burst_length;
            for (k, v) in out.iter_mut() {
                if k == "FirstBurstLength" {
                    *v = p.first_burst_length.to_string();
                }
            }
        }
    }

    /// RFC 7143 §6.2: keys the initiator left at their defaults where the
    /// target needs less (a normal session's MaxBurstLength,
    /// FirstBurstLength, ImmediateData): the target offers its own values.
    /// Each is offered once; the initiator answers before leaving the stage.
    pub fn take_offers(&mut self) -> Vec<(String, String)> {
        if self.discovery() || !self.leading {
            return Vec::new();
        }
        let d = Params::default();
        let l = &self.limits;
        let mut want: Vec<(&str, String)> = Vec::new();
        if l.max_burst_length < d.max_burst_length {
            want.push(("MaxBurstLength", l.max_burst_length.to_string()));
        }
        if l.first_burst_length < d.first_burst_length {
            want.push(("FirstBurstLength", l.first_burst_length.to_string()));
        }
        if !l.immediate_data {
            want.push(("ImmediateData", "No".into()));
        }
        if l.rdma {
            // RFC 7145: an iSER connection runs with RDMAExtensions=Yes; an
            // initiator that did not offer it is asked.
            want.push(("RDMAExtensions", "Yes".into()));
        }
        let mut out = Vec::new();
        for (k, v) in want {
            if !self.seen(k) && !self.offered.iter().any(|o| o == k) {
                self.offered.push(k.to_string());
                out.push((k.to_string(), v));
            }
        }
        out
    }

    /// The login is about to enter the full feature phase: checks that a
    /// normal session on an RDMA connection agreed RDMAExtensions=Yes, and
    /// with it puts the iSER lengths in the place of
    /// MaxRecvDataSegmentLength's (RFC 7145: iSER control PDUs are sized
    /// by TargetRecvDataSegmentLength and InitiatorRecvDataSegmentLength).
    pub fn settle(&mut self) -> Result<(), LoginStatus> {
        let p = &mut self.params;
        if self.limits.rdma && p.session_type == SessionType::Normal && !p.rdma_extensions {
            return Err(LoginStatus::INITIATOR_ERROR);
        }
        if p.rdma_extensions {
            p.header_digest = Digest::None;
            p.data_digest = Digest::None;
            p.max_recv_data_segment_length = p.target_recv_data_segment_length;
            p.max_xmit_data_segment_length = p.initiator_recv_data_segment_length;
        }
        Ok(())
    }

    /// Whether [`Negotiator::take_offers`] would offer anything.
    pub fn has_offers(&self) -> bool {
        !self.clone().take_offers().is_empty()
    }

    /// Whether `key` was already negotiated.
    pub fn seen(&self, key: &str) -> bool {
        self.seen.iter().any(|k| k == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn neg() -> Negotiator {
        Negotiator::new(Limits::default())
    }

    #[test]
    fn parse_and_encode() {
        let t = encode_text(&[("A", "1"), ("Bb", "x=y")]);
        assert_eq!(t, b"A=1\0Bb=x=y\0");
        assert_eq!(parse_text(&t).unwrap(), vec![("A", "1"), ("Bb", "x=y")]);
        // Padding NULs are fine.
        assert_eq!(parse_text(b"A=1\0\0\0\0").unwrap(), vec![("A", "1")]);
        assert_eq!(parse_text(b"").unwrap(), vec![]);
        assert_eq!(parse_text(b"A=1"), Err(TextError::Unterminated));
        assert_eq!(parse_text(b"A=1\0B"), Err(TextError::Unterminated));
        assert_eq!(parse_text(b"A\0"), Err(TextError::NoEquals));
        assert_eq!(parse_text(b"=1\0"), Err(TextError::BadKey));
        assert_eq!(parse_text(b"a b=1\0"), Err(TextError::BadKey));
        assert_eq!(parse_text(b"A=\xff\0"), Err(TextError::NotUtf8));
        let long = format!("{}=1\0", "k".repeat(64));
        assert_eq!(parse_text(long.as_bytes()), Err(TextError::BadKey));
        let long = format!("K={}\0", "v".repeat(MAX_VALUE + 1));
        assert_eq!(parse_text(long.as_bytes()), Err(TextError::ValueTooLong));
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_num("512"), Some(512));
        assert_eq!(parse_num("0x200"), Some(512));
        assert_eq!(parse_num("-1"), None);
        assert_eq!(parse_num("12a"), None);
        assert_eq!(parse_num(""), None);
        assert_eq!(parse_num("0x"), None);
    }

    #[test]
    fn mrdsl_is_declarative_per_direction() {
        let mut n = neg();
        let r = n.apply("MaxRecvDataSegmentLength", "4096", Phase::Operational);
        assert_eq!(r, Ok(Some("262144".into())));
        assert_eq!(n.params.max_xmit_data_segment_length, 4096);
        assert_eq!(n.params.max_recv_data_segment_length, 262144);
        let mut n = neg();
        assert_eq!(
            n.apply("MaxRecvDataSegmentLength", "100", Phase::Operational),
            Ok(Some("Reject".into()))
        );
        assert_eq!(n.params.max_xmit_data_segment_length, 8192);
    }

    #[test]
    fn burst_lengths_are_minimum_and_ordered() {
        let mut n = neg();
        let out = n
            .apply_all(
                &[
                    ("FirstBurstLength", "16777215"),
                    ("MaxBurstLength", "32768"),
                ],
                Phase::Operational,
            )
            .unwrap();
        assert_eq!(
            out,
            vec![
                ("FirstBurstLength".to_string(), "32768".to_string()),
                ("MaxBurstLength".to_string(), "32768".to_string())
            ]
        );
        assert_eq!(n.params.first_burst_length, 32768);
        let mut n = neg();
        assert_eq!(
            n.apply("MaxBurstLength", "4194304", Phase::Operational),
            Ok(Some("1048576".into()))
        );
        assert_eq!(
            n.apply("FirstBurstLength", "511", Phase::Operational),
            Ok(Some("Reject".into()))
        );
    }

    #[test]
    fn booleans_and_or() {
        let mut n = neg();
        assert_eq!(
            n.apply("ImmediateData", "No", Phase::Operational),
            Ok(Some("No".into()))
        );
        assert!(!n.params.immediate_data);
        assert_eq!(
            n.apply("InitialR2T", "No", Phase::Operational),
            Ok(Some("Yes".into()))
        );
        assert!(n.params.initial_r2t);
        let mut n = Negotiator::new(Limits {
            initial_r2t: false,
            immediate_data: false,
            ..Limits::default()
        });
        assert_eq!(
            n.apply("InitialR2T", "No", Phase::Operational),
            Ok(Some("No".into()))
        );
        assert_eq!(
            n.apply("ImmediateData", "Yes", Phase::Operational),
            Ok(Some("No".into()))
        );
        assert_eq!(
            n.apply("DataPDUInOrder", "maybe", Phase::Operational),
            Ok(Some("Reject".into()))
        );
        assert_eq!(
            n.apply("IFMarker", "Yes", Phase::Operational),
            Ok(Some("No".into()))
        );
    }

    #[test]
    fn digests_lists() {
        let mut n = neg();
        assert_eq!(
            n.apply("HeaderDigest", "CRC32C,None", Phase::Operational),
            Ok(Some("CRC32C".into()))
        );
        assert_eq!(
            n.apply("DataDigest", "None,CRC32C", Phase::Operational),
            Ok(Some("None".into()))
        );
        assert_eq!(n.params.header_digest, Digest::Crc32c);
        assert_eq!(n.params.data_digest, Digest::None);
        let mut n = neg();
        assert_eq!(
            n.apply("HeaderDigest", "MD5", Phase::Operational),
            Ok(Some("Reject".into()))
        );
    }

    #[test]
    fn header_and_data_digests_negotiate_on_their_own_lists() {
        // RFC 7143 §13.1: headers must carry CRC32C, data must not.
        let mut n = Negotiator::new(Limits {
            digests: vec![Digest::Crc32c],
            data_digests: Some(vec![Digest::None]),
            ..Limits::default()
        });
        assert_eq!(
            n.apply("HeaderDigest", "None,CRC32C", Phase::Operational),
            Ok(Some("CRC32C".into()))
        );
        assert_eq!(
            n.apply("DataDigest", "CRC32C,None", Phase::Operational),
            Ok(Some("None".into()))
        );
        assert_eq!(n.params.header_digest, Digest::Crc32c);
        assert_eq!(n.params.data_digest, Digest::None);
        let mut n = Negotiator::new(Limits {
            digests: vec![Digest::None],
            data_digests: Some(vec![Digest::Crc32c]),
            ..Limits::default()
        });
        assert_eq!(
            n.apply("HeaderDigest", "CRC32C,None", Phase::Operational),
            Ok(Some("None".into()))
        );
        // Data digests required, the initiator offers none: no session
        // without them.
        assert_eq!(
            n.apply("DataDigest", "None", Phase::Operational),
            Err(LoginStatus::INITIATOR_ERROR)
        );
        // A value nobody knows, where None is allowed: Reject, as before.
        let mut n = neg();
        assert_eq!(
            n.apply("DataDigest", "MD5", Phase::Operational),
            Ok(Some("Reject".into()))
        );
    }

    #[test]
    fn other_numeric_keys() {
        let mut n = neg();
        assert_eq!(
            n.apply("ErrorRecoveryLevel", "2", Phase::Operational),
            Ok(Some("0".into()))
        );
        assert_eq!(
            n.apply("MaxOutstandingR2T", "8", Phase::Operational),
            Ok(Some("1".into()))
        );
        assert_eq!(
            n.apply("MaxConnections", "0", Phase::Operational),
            Ok(Some("Reject".into()))
        );
        assert_eq!(
            n.apply("DefaultTime2Wait", "0", Phase::Operational),
            Ok(Some("2".into()))
        );
        assert_eq!(
            n.apply("DefaultTime2Retain", "20", Phase::Operational),
            Ok(Some("0".into()))
        );
    }

    #[test]
    fn declarative_and_unknown_keys() {
        let mut n = neg();
        assert_eq!(n.apply("InitiatorName", "iqn.x", Phase::Security), Ok(None));
        assert_eq!(
            n.apply("SessionType", "Discovery", Phase::Security),
            Ok(None)
        );
        assert_eq!(n.params.session_type, SessionType::Discovery);
        assert_eq!(
            n.apply("X-com.example.Foo", "1", Phase::Security),
            Ok(Some("NotUnderstood".into()))
        );
        assert_eq!(
            n.apply("MaxBurstLength", "512", Phase::Operational),
            Ok(Some("Irrelevant".into()))
        );
        assert_eq!(
            n.apply("TargetAlias", "x", Phase::Operational),
            Ok(Some("Reject".into()))
        );
        // Repeating a key is a protocol error.
        assert_eq!(
            n.apply("InitiatorName", "iqn.y", Phase::Security),
            Err(LoginStatus::INITIATOR_ERROR)
        );
        let mut n = neg();
        assert_eq!(
            n.apply("SessionType", "Weird", Phase::Security),
            Err(LoginStatus::SESSION_TYPE_NOT_SUPPORTED)
        );
    }

    #[test]
    fn auth_method() {
        let mut n = neg();
        assert_eq!(
            n.apply("AuthMethod", "CHAP,None", Phase::Security),
            Ok(Some("None".into()))
        );
        assert_eq!(n.params.auth_method, Some(AuthMethod::None));
        let mut n = neg();
        assert_eq!(
            n.apply("AuthMethod", "CHAP", Phase::Security),
            Ok(Some("Reject".into()))
        );
        assert_eq!(n.params.auth_method, None);
        let mut n = neg();
        assert_eq!(
            n.apply("AuthMethod", "None", Phase::Operational),
            Err(LoginStatus::INITIATOR_ERROR)
        );
    }

    fn rdma() -> Negotiator {
        Negotiator::new(Limits {
            rdma: true,
            ..Limits::default()
        })
    }

    #[test]
    fn iser_keys_on_an_rdma_connection() {
        let mut n = rdma();
        let out = n
            .apply_all(
                &[
                    ("InitiatorRecvDataSegmentLength", "262144"),
                    ("TargetRecvDataSegmentLength", "262144"),
                    ("RDMAExtensions", "Yes"),
                ],
                Phase::Operational,
            )
            .unwrap();
        assert_eq!(
            out,
            vec![
                (
                    "InitiatorRecvDataSegmentLength".to_string(),
                    "262144".to_string()
                ),
                (
                    "TargetRecvDataSegmentLength".to_string(),
                    "262144".to_string()
                ),
                ("RDMAExtensions".to_string(), "Yes".to_string()),
            ]
        );
        assert!(n.params.rdma_extensions);
        assert_eq!(n.settle(), Ok(()));
        assert_eq!(n.params.max_recv_data_segment_length, 262_144);
        assert_eq!(n.params.max_xmit_data_segment_length, 262_144);
        // What the target receives is at most its MaxRecvDataSegmentLength.
        let mut n = Negotiator::new(Limits {
            rdma: true,
            max_recv_data_segment_length: 8192,
            ..Limits::default()
        });
        assert_eq!(
            n.apply("TargetRecvDataSegmentLength", "0x40000", Phase::Operational),
            Ok(Some("8192".into()))
        );
        assert_eq!(
            n.apply("InitiatorRecvDataSegmentLength", "512", Phase::Operational),
            Ok(Some("512".into()))
        );
        assert_eq!(n.params.target_recv_data_segment_length, 8192);
        assert_eq!(n.params.initiator_recv_data_segment_length, 512);
    }

    #[test]
    fn iser_keys_on_a_tcp_connection() {
        let mut n = neg();
        assert_eq!(
            n.apply("RDMAExtensions", "Yes", Phase::Operational),
            Ok(Some("No".into()))
        );
        for k in [
            "TargetRecvDataSegmentLength",
            "InitiatorRecvDataSegmentLength",
            "MaxOutstandingUnexpectedPDUs",
        ] {
            assert_eq!(
                n.apply(k, "262144", Phase::Operational),
                Ok(Some("Irrelevant".into()))
            );
        }
        assert_eq!(n.settle(), Ok(()));
        assert_eq!(
            n.params,
            Params {
                default_time2retain: 0,
                ..Params::default()
            }
        );
    }

    #[test]
    fn bad_iser_values_are_rejected() {
        let mut n = rdma();
        assert_eq!(
            n.apply("RDMAExtensions", "maybe", Phase::Operational),
            Ok(Some("Reject".into()))
        );
        for (k, v) in [
            ("TargetRecvDataSegmentLength", "511"),
            ("InitiatorRecvDataSegmentLength", "16777216"),
            ("MaxOutstandingUnexpectedPDUs", "1"),
        ] {
            assert_eq!(
                n.apply(k, v, Phase::Operational),
                Ok(Some("Reject".into())),
                "{k}={v}"
            );
        }
        let mut n = rdma();
        for (k, v) in [
            ("TargetRecvDataSegmentLength", "lots"),
            ("InitiatorRecvDataSegmentLength", "-1"),
            ("MaxOutstandingUnexpectedPDUs", "4294967296"),
        ] {
            assert_eq!(
                n.apply(k, v, Phase::Operational),
                Ok(Some("Reject".into())),
                "{k}={v}"
            );
        }
        assert_eq!(n.params.target_recv_data_segment_length, 8192);
        assert_eq!(n.params.initiator_recv_data_segment_length, 8192);
        assert_eq!(n.params.max_outstanding_unexpected_pdus, 0);
        // A rejected RDMAExtensions leaves it No: no normal session.
        let mut n = rdma();
        n.apply("RDMAExtensions", "maybe", Phase::Operational)
            .unwrap();
        assert_eq!(n.settle(), Err(LoginStatus::INITIATOR_ERROR));
    }

    #[test]
    fn max_outstanding_unexpected_pdus_is_the_smaller_limit() {
        let with = |limit| {
            Negotiator::new(Limits {
                rdma: true,
                max_outstanding_unexpected_pdus: limit,
                ..Limits::default()
            })
        };
        for (limit, offer, result) in [
            (0, "0", "0"),
            (0, "8", "8"),
            (16, "0", "16"),
            (16, "8", "8"),
            (4, "4294967295", "4"),
            (0, "2", "2"),
        ] {
            let mut n = with(limit);
            assert_eq!(
                n.apply("MaxOutstandingUnexpectedPDUs", offer, Phase::Operational),
                Ok(Some(result.into())),
                "limit {limit}, offer {offer}"
            );
            assert_eq!(n.params.max_outstanding_unexpected_pdus.to_string(), result);
        }
    }

    #[test]
    fn digests_are_none_on_an_rdma_connection() {
        // Even where TCP would require CRC32C.
        let mut n = Negotiator::new(Limits {
            rdma: true,
            digests: vec![Digest::Crc32c],
            ..Limits::default()
        });
        assert_eq!(
            n.apply("HeaderDigest", "CRC32C", Phase::Operational),
            Ok(Some("None".into()))
        );
        assert_eq!(
            n.apply("DataDigest", "CRC32C,None", Phase::Operational),
            Ok(Some("None".into()))
        );
        assert_eq!(n.params.header_digest, Digest::None);
        assert_eq!(n.params.data_digest, Digest::None);
    }

    #[test]
    fn an_rdma_connection_offers_rdma_extensions() {
        let mut n = rdma();
        assert_eq!(
            n.take_offers(),
            vec![("RDMAExtensions".to_string(), "Yes".to_string())]
        );
        // The initiator's answer gets no response of its own.
        let out = n
            .apply_all(&[("RDMAExtensions", "Yes")], Phase::Operational)
            .unwrap();
        assert!(out.is_empty());
        assert!(n.params.rdma_extensions);
        assert!(n.take_offers().is_empty());
        // TCP offers nothing of the kind.
        assert!(neg().take_offers().is_empty());
        // A discovery session over RDMA needs no RDMAExtensions.
        let mut n = rdma();
        n.apply("SessionType", "Discovery", Phase::Security)
            .unwrap();
        assert!(n.take_offers().is_empty());
        assert_eq!(n.settle(), Ok(()));
    }
}
