//! CHAP authentication for the login security stage (RFC 7143 §12.1.3,
//! RFC 1994), one-way and mutual, with MD5 (CHAP_A=5) and SHA-256
//! (CHAP_A=7, the algorithm list RFC 7143's update opened to the IANA PPP
//! authentication algorithms).
//!
//! Owns: credentials ([`ChapAuth`]), the target side of one exchange
//! ([`ChapExchange`]), binary value encoding (`0x` hex, `0b` base64,
//! RFC 7143 §6.1) and the challenge generator ([`ChapRng`], deterministic
//! from the seed the connection is given). Does not own: which targets need
//! CHAP (the login reads that from the configuration) or the per-address
//! backoff after failures (the daemon's portal).

use std::fmt;

use md5::Md5;
use sha2::{Digest as _, Sha256};

use crate::pdu::LoginStatus;

/// Shortest secret accepted (RFC 7143 §12.1.3 asks for at least 96 bits
/// when secrets are not random).
pub const MIN_SECRET: usize = 12;

/// Longest challenge or response accepted from an initiator, in bytes.
const MAX_BINARY: usize = 1024;

/// One CHAP name and secret. Debug output hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapUser {
    pub user: String,
    pub secret: Vec<u8>,
}

impl fmt::Debug for ChapUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapUser")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// What a target (or the discovery service) requires.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChapAuth {
    /// Initiators must authenticate as one of these; empty: no CHAP.
    pub incoming: Vec<ChapUser>,
    /// How the target answers an initiator that asks it to authenticate
    /// (mutual CHAP); None: mutual CHAP is refused.
    pub outgoing: Option<ChapUser>,
}

impl ChapAuth {
    /// Whether initiators must authenticate.
    pub fn required(&self) -> bool {
        !self.incoming.is_empty()
    }
}

/// CHAP_A values (IANA PPP authentication algorithms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChapAlg {
    Md5,
    Sha256,
}

impl ChapAlg {
    pub fn code(self) -> u32 {
        match self {
            ChapAlg::Md5 => 5,
            ChapAlg::Sha256 => 7,
        }
    }

    fn from_code(c: &str) -> Option<ChapAlg> {
        match c.trim() {
            "5" => Some(ChapAlg::Md5),
            "7" => Some(ChapAlg::Sha256),
            _ => None,
        }
    }

    /// Digest (and challenge) length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            ChapAlg::Md5 => 16,
            ChapAlg::Sha256 => 32,
        }
    }

    /// RFC 1994 §4.1: the response is H(identifier || secret || challenge).
    pub fn response(self, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        match self {
            ChapAlg::Md5 => {
                let mut h = Md5::new();
                h.update([id]);
                h.update(secret);
                h.update(challenge);
                h.finalize().to_vec()
            }
            ChapAlg::Sha256 => {
                let mut h = Sha256::new();
                h.update([id]);
                h.update(secret);
                h.update(challenge);
                h.finalize().to_vec()
            }
        }
    }
}

/// Challenge bytes: SHA-256 in counter mode over the connection's seed.
#[derive(Clone, Debug)]
pub struct ChapRng {
    seed: [u8; 8],
    counter: u64,
}

impl ChapRng {
    pub fn new(seed: u64) -> ChapRng {
        ChapRng {
            seed: seed.to_le_bytes(),
            counter: 0,
        }
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(32) {
            self.counter = self.counter.wrapping_add(1);
            let mut h = Sha256::new();
            h.update(b"ferrite-chap");
            h.update(self.seed);
            h.update(self.counter.to_le_bytes());
            let block = h.finalize();
            chunk.copy_from_slice(&block[..chunk.len()]);
        }
    }
}

/// RFC 7143 §6.1: binary values are `0x` hex or `0b` base64.
pub fn decode_binary(v: &str) -> Option<Vec<u8>> {
    let (prefix, body) = (v.get(..2)?, v.get(2..)?);
    let bytes = match prefix {
        "0x" | "0X" => {
            // An odd digit count has an implied leading zero.
            let padded;
            let digits = if body.len() % 2 == 1 {
                padded = format!("0{body}");
                padded.as_str()
            } else {
                body
            };
            let mut out = Vec::with_capacity(digits.len() / 2);
            let b = digits.as_bytes();
            for pair in b.chunks(2) {
                let hi = (pair[0] as char).to_digit(16)?;
                let lo = (pair[1] as char).to_digit(16)?;
                out.push((hi << 4 | lo) as u8);
            }
            out
        }
        "0b" | "0B" => decode_base64(body)?,
        _ => return None,
    };
    (!bytes.is_empty() && bytes.len() <= MAX_BINARY).then_some(bytes)
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = acc << 6 | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// `0x` followed by lowercase hex.
pub fn encode_hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + b.len() * 2);
    s.push_str("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Equality that takes the same time wherever the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Where an exchange stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Stage {
    /// AuthMethod=CHAP agreed: waiting for CHAP_A.
    Algorithm,
    /// Challenge sent: waiting for CHAP_N and CHAP_R.
    Response {
        alg: ChapAlg,
        id: u8,
        challenge: Vec<u8>,
    },
    /// The initiator authenticated (as this user).
    Done { user: String },
}

/// What one step of the exchange produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChapStep {
    /// Keys for the Login Response.
    pub keys: Vec<(String, String)>,
    /// The exchange finished with the initiator authenticated (and the
    /// target too, for mutual CHAP): the security stage may end.
    pub done: bool,
}

/// Why an exchange failed: the login status to answer with and a line for
/// the log (never a secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChapError {
    pub status: LoginStatus,
    pub why: &'static str,
}

fn auth_fail(why: &'static str) -> ChapError {
    ChapError {
        status: LoginStatus::AUTH_FAILURE,
        why,
    }
}

fn proto_fail(why: &'static str) -> ChapError {
    ChapError {
        status: LoginStatus::INITIATOR_ERROR,
        why,
    }
}

/// The target side of one CHAP exchange.
#[derive(Debug)]
pub struct ChapExchange {
    auth: ChapAuth,
    stage: Stage,
}

impl ChapExchange {
    pub fn new(auth: ChapAuth) -> ChapExchange {
        ChapExchange {
            auth,
            stage: Stage::Algorithm,
        }
    }

    /// The CHAP name the initiator authenticated as.
    pub fn user(&self) -> Option<&str> {
        match &self.stage {
            Stage::Done { user } => Some(user),
            _ => None,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Done { .. })
    }

    /// Handles the CHAP_* keys of one Login Request.
    pub fn step(
        &mut self,
        keys: &[(&str, &str)],
        rng: &mut ChapRng,
    ) -> Result<ChapStep, ChapError> {
        let get = |k: &str| keys.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        match &self.stage {
            Stage::Algorithm => {
                if keys.is_empty() {
                    // AuthMethod=CHAP was just agreed; the initiator sends
                    // CHAP_A next.
                    return Ok(ChapStep {
                        keys: Vec::new(),
                        done: false,
                    });
                }
                let Some(list) = get("CHAP_A") else {
                    return Err(proto_fail("CHAP keys before CHAP_A"));
                };
                if keys.len() != 1 {
                    return Err(proto_fail("CHAP_A must come alone"));
                }
                // RFC 7143 §12.1.3: the initiator lists algorithms in order
                // of preference; the target picks the first it supports.
                let Some(alg) = list.split(',').find_map(ChapAlg::from_code) else {
                    return Err(auth_fail("no CHAP algorithm in common"));
                };
                let mut id = [0u8; 1];
                rng.fill(&mut id);
                // A challenge as long as the digest (at least 16 bytes).
                let mut challenge = vec![0u8; alg.digest_len()];
                rng.fill(&mut challenge);
                let keys = vec![
                    ("CHAP_A".to_string(), alg.code().to_string()),
                    ("CHAP_I".to_string(), id[0].to_string()),
                    ("CHAP_C".to_string(), encode_hex(&challenge)),
                ];
                self.stage = Stage::Response {
                    alg,
                    id: id[0],
                    challenge,
                };
                Ok(ChapStep { keys, done: false })
            }
            Stage::Response { alg, id, challenge } => {
                let (alg, id) = (*alg, *id);
                let (Some(name), Some(resp)) = (get("CHAP_N"), get("CHAP_R")) else {
                    return Err(proto_fail("CHAP_N and CHAP_R expected"));
                };
                let Some(resp) = decode_binary(resp) else {
                    return Err(proto_fail("CHAP_R is not a binary value"));
                };
                let Some(user) = self.auth.incoming.iter().find(|u| u.user == name) else {
                    return Err(auth_fail("unknown CHAP name"));
                };
                // RFC 7143 §12.1.3: short secrets fall to a dictionary
                // attack on one captured exchange; they are never accepted
                // (the configuration refuses them too).
                if user.secret.len() < MIN_SECRET {
                    return Err(auth_fail("the configured secret is shorter than 12 bytes"));
                }
                let want = alg.response(id, &user.secret, challenge);
                if !same(&want, &resp) {
                    return Err(auth_fail("wrong CHAP response"));
                }
                let mut out = Vec::new();
                match (get("CHAP_I"), get("CHAP_C")) {
                    (None, None) => {}
                    (Some(i), Some(c)) => {
                        // Mutual CHAP: the target proves it knows its secret.
                        let Some(out_user) = self
                            .auth
                            .outgoing
                            .as_ref()
                            .filter(|u| u.secret.len() >= MIN_SECRET)
                        else {
                            return Err(auth_fail("mutual CHAP asked, no usable target secret"));
                        };
                        let Ok(their_id) = i.trim().parse::<u8>() else {
                            return Err(proto_fail("CHAP_I is not 0..255"));
                        };
                        let Some(their_c) = decode_binary(c) else {
                            return Err(proto_fail("CHAP_C is not a binary value"));
                        };
                        // RFC 7143 §12.1.3: a challenge equal to the one the
                        // target sent is a reflection attack.
                        if same(&their_c, challenge) {
                            return Err(auth_fail("initiator reflected the target's challenge"));
                        }
                        // Secrets equal in both directions would let a
                        // reflected exchange pass.
                        if same(&out_user.secret, &user.secret) {
                            return Err(auth_fail("target and initiator secrets are equal"));
                        }
                        let r = alg.response(their_id, &out_user.secret, &their_c);
                        out.push(("CHAP_N".to_string(), out_user.user.clone()));
                        out.push(("CHAP_R".to_string(), encode_hex(&r)));
                    }
                    _ => return Err(proto_fail("CHAP_I and CHAP_C go together")),
                }
                self.stage = Stage::Done {
                    user: user.user.clone(),
                };
                Ok(ChapStep {
                    keys: out,
                    done: true,
                })
            }
            Stage::Done { .. } => {
                if keys.is_empty() {
                    Ok(ChapStep {
                        keys: Vec::new(),
                        done: true,
                    })
                } else {
                    Err(proto_fail("CHAP keys after the exchange ended"))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(n: &str, s: &str) -> ChapUser {
        ChapUser {
            user: n.into(),
            secret: s.as_bytes().to_vec(),
        }
    }

    fn auth() -> ChapAuth {
        ChapAuth {
            incoming: vec![user("alice", "alice-secret-123")],
            outgoing: Some(user("target", "target-secret-456")),
        }
    }

    fn challenge_of(step: &ChapStep) -> (u8, Vec<u8>) {
        let id = step.keys.iter().find(|(k, _)| k == "CHAP_I").unwrap();
        let c = step.keys.iter().find(|(k, _)| k == "CHAP_C").unwrap();
        (id.1.parse().unwrap(), decode_binary(&c.1).unwrap())
    }

    #[test]
    fn md5_matches_rfc1994_construction() {
        // MD5(0x01 || "secret" || 0x00..0x0f), computed independently.
        let c: Vec<u8> = (0u8..16).collect();
        let r = ChapAlg::Md5.response(1, b"secret", &c);
        let mut h = Md5::new();
        h.update([1u8]);
        h.update(b"secret");
        h.update(&c);
        assert_eq!(r, h.finalize().to_vec());
        assert_eq!(r.len(), 16);
        assert_eq!(ChapAlg::Sha256.response(1, b"secret", &c).len(), 32);
    }

    #[test]
    fn one_way_exchange() {
        let mut rng = ChapRng::new(42);
        let mut x = ChapExchange::new(auth());
        assert!(!x.step(&[], &mut rng).unwrap().done);
        let s = x.step(&[("CHAP_A", "7,5")], &mut rng).unwrap();
        assert!(s.keys.contains(&("CHAP_A".into(), "7".into())));
        let (id, c) = challenge_of(&s);
        assert_eq!(c.len(), 32);
        let r = encode_hex(&ChapAlg::Sha256.response(id, b"alice-secret-123", &c));
        let s = x
            .step(&[("CHAP_N", "alice"), ("CHAP_R", &r)], &mut rng)
            .unwrap();
        assert!(s.done);
        assert!(s.keys.is_empty());
        assert_eq!(x.user(), Some("alice"));
    }

    #[test]
    fn wrong_secret_and_unknown_name_fail_0201() {
        for (name, secret) in [("alice", "wrong-secret-123"), ("bob", "alice-secret-123")] {
            let mut rng = ChapRng::new(1);
            let mut x = ChapExchange::new(auth());
            let s = x.step(&[("CHAP_A", "5")], &mut rng).unwrap();
            let (id, c) = challenge_of(&s);
            let r = encode_hex(&ChapAlg::Md5.response(id, secret.as_bytes(), &c));
            let e = x
                .step(&[("CHAP_N", name), ("CHAP_R", &r)], &mut rng)
                .unwrap_err();
            assert_eq!(e.status, LoginStatus::AUTH_FAILURE);
            assert!(!x.is_done());
        }
    }

    #[test]
    fn mutual_exchange_answers_with_target_credentials() {
        let mut rng = ChapRng::new(7);
        let mut x = ChapExchange::new(auth());
        let s = x.step(&[("CHAP_A", "5")], &mut rng).unwrap();
        let (id, c) = challenge_of(&s);
        let r = encode_hex(&ChapAlg::Md5.response(id, b"alice-secret-123", &c));
        let my_c = [9u8; 16];
        let s = x
            .step(
                &[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &r),
                    ("CHAP_I", "77"),
                    ("CHAP_C", &encode_hex(&my_c)),
                ],
                &mut rng,
            )
            .unwrap();
        assert!(s.done);
        let want = encode_hex(&ChapAlg::Md5.response(77, b"target-secret-456", &my_c));
        assert!(s.keys.contains(&("CHAP_N".into(), "target".into())));
        assert!(s.keys.contains(&("CHAP_R".into(), want)));
    }

    #[test]
    fn reflected_challenge_and_missing_target_secret_fail() {
        let mut rng = ChapRng::new(7);
        let mut x = ChapExchange::new(auth());
        let s = x.step(&[("CHAP_A", "5")], &mut rng).unwrap();
        let (id, c) = challenge_of(&s);
        let r = encode_hex(&ChapAlg::Md5.response(id, b"alice-secret-123", &c));
        let e = x
            .step(
                &[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &r),
                    ("CHAP_I", "1"),
                    ("CHAP_C", &encode_hex(&c)),
                ],
                &mut rng,
            )
            .unwrap_err();
        assert_eq!(e.status, LoginStatus::AUTH_FAILURE);

        let mut a = auth();
        a.outgoing = None;
        let mut x = ChapExchange::new(a);
        let s = x.step(&[("CHAP_A", "5")], &mut rng).unwrap();
        let (id, c) = challenge_of(&s);
        let r = encode_hex(&ChapAlg::Md5.response(id, b"alice-secret-123", &c));
        let e = x
            .step(
                &[
                    ("CHAP_N", "alice"),
                    ("CHAP_R", &r),
                    ("CHAP_I", "1"),
                    ("CHAP_C", "0x0102030405060708090a0b0c0d0e0f10"),
                ],
                &mut rng,
            )
            .unwrap_err();
        assert_eq!(e.status, LoginStatus::AUTH_FAILURE);
    }

    #[test]
    fn short_secrets_are_never_accepted() {
        let mut rng = ChapRng::new(9);
        let mut x = ChapExchange::new(ChapAuth {
            incoming: vec![user("shorty", "short")],
            outgoing: None,
        });
        let s = x.step(&[("CHAP_A", "5")], &mut rng).unwrap();
        let (id, c) = challenge_of(&s);
        let r = encode_hex(&ChapAlg::Md5.response(id, b"short", &c));
        let e = x
            .step(&[("CHAP_N", "shorty"), ("CHAP_R", &r)], &mut rng)
            .unwrap_err();
        assert_eq!(e.status, LoginStatus::AUTH_FAILURE);
    }

    #[test]
    fn unsupported_algorithm_fails() {
        let mut rng = ChapRng::new(3);
        let mut x = ChapExchange::new(auth());
        let e = x.step(&[("CHAP_A", "6")], &mut rng).unwrap_err();
        assert_eq!(e.status, LoginStatus::AUTH_FAILURE);
    }

    #[test]
    fn challenges_depend_on_the_seed() {
        let (mut a, mut b, mut c) = (ChapRng::new(1), ChapRng::new(1), ChapRng::new(2));
        let (mut x, mut y, mut z) = ([0u8; 40], [0u8; 40], [0u8; 40]);
        a.fill(&mut x);
        b.fill(&mut y);
        c.fill(&mut z);
        assert_eq!(x, y);
        assert_ne!(x, z);
        let mut x2 = [0u8; 40];
        a.fill(&mut x2);
        assert_ne!(x, x2);
    }

    #[test]
    fn binary_values() {
        assert_eq!(decode_binary("0x0aFF"), Some(vec![0x0a, 0xff]));
        assert_eq!(decode_binary("0xabc"), Some(vec![0x0a, 0xbc]));
        assert_eq!(decode_binary("0bAQID"), Some(vec![1, 2, 3]));
        assert_eq!(decode_binary("0bAQI="), Some(vec![1, 2]));
        assert_eq!(decode_binary("0x"), None);
        assert_eq!(decode_binary("0xzz"), None);
        assert_eq!(decode_binary("1234"), None);
        assert_eq!(encode_hex(&[0, 0xab]), "0x00ab");
    }
}
