//! ferrite-fuzz: what several fuzz targets share. Owns the harness side of
//! the targets in `fuzz_targets/` (framing a byte stream into requests,
//! answering a CHAP challenge, the checks every sense must pass); owns no
//! parser, and nothing here runs outside a fuzz target.
#![forbid(unsafe_code)]

use ferrite_iscsi::chap::{ChapAlg, decode_binary, encode_hex};
use ferrite_iscsi::keys::{encode_text, parse_text};
use ferrite_scsi::{Sense, SenseKey};

/// The CHAP user and secret the targets configure.
pub const CHAP_USER: &str = "fuzz-initiator";
pub const CHAP_SECRET: &[u8] = b"initiator-secret-1";
/// The target's secret for mutual CHAP.
pub const CHAP_TARGET_USER: &str = "fuzz-target";
pub const CHAP_TARGET_SECRET: &[u8] = b"target-secret-12345";

/// The value a fuzz input writes for CHAP_R to have the harness compute
/// the right response to the last challenge (a fuzzer cannot invert MD5).
pub const CHAP_R_AUTO: &str = "auto";

/// The challenge of a target's CHAP_A/CHAP_I/CHAP_C keys, if they hold one.
pub fn challenge(keys: &[(String, String)]) -> Option<(ChapAlg, u8, Vec<u8>)> {
    let get = |k: &str| keys.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let alg = match get("CHAP_A")? {
        "5" => ChapAlg::Md5,
        "7" => ChapAlg::Sha256,
        _ => return None,
    };
    let id = get("CHAP_I")?.parse().ok()?;
    Some((alg, id, decode_binary(get("CHAP_C")?)?))
}

/// `text` with a `CHAP_R=auto` pair replaced by the right response to
/// `chal` for [`CHAP_SECRET`]; other text is returned as it is.
pub fn answer_chap(text: &[u8], chal: Option<&(ChapAlg, u8, Vec<u8>)>) -> Vec<u8> {
    let (Some((alg, id, c)), Ok(pairs)) = (chal, parse_text(text)) else {
        return text.to_vec();
    };
    if !pairs
        .iter()
        .any(|(k, v)| *k == "CHAP_R" && *v == CHAP_R_AUTO)
    {
        return text.to_vec();
    }
    let r = encode_hex(&alg.response(*id, CHAP_SECRET, c));
    let pairs: Vec<(&str, &str)> = pairs
        .into_iter()
        .map(|(k, v)| {
            if k == "CHAP_R" {
                (k, r.as_str())
            } else {
                (k, v)
            }
        })
        .collect();
    encode_text(&pairs)
}

/// Splits a byte stream into iSCSI PDUs as a connection frames them: a
/// 48-byte header, AHS, then DataSegmentLength bytes and padding (what the
/// stream holds of them). Yields each header with its data segment.
pub fn frames(mut data: &[u8]) -> impl Iterator<Item = (&[u8; 48], &[u8])> {
    std::iter::from_fn(move || {
        let (bhs, rest) = data.split_first_chunk::<48>()?;
        let ahs = bhs[4] as usize * 4;
        let len = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
        let rest = rest.get(ahs..).unwrap_or_default();
        let seg = &rest[..len.min(rest.len())];
        data = rest.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((bhs, seg))
    })
}

/// What every sense a target returns must be: a sense key that reports an
/// error, an additional sense code, and a field pointer, if any, inside a
/// CDB of `cdb_len` bytes. Both encodings carry the key, ASC and ASCQ.
pub fn check_sense(s: &Sense, cdb_len: usize) {
    assert_ne!(s.key, SenseKey::NO_SENSE, "{s:?}");
    assert_ne!((s.asc, s.ascq), (0, 0), "{s:?}");
    if let Some(f) = s.field
        && f.in_cdb
    {
        assert!(
            (f.byte as usize) < cdb_len.max(1),
            "{s:?} for a {cdb_len}-byte CDB"
        );
        assert!(f.bit.is_none_or(|b| b < 8), "{s:?}");
    }
    let fixed = s.to_fixed();
    assert_eq!(fixed[0] & 0x7f, 0x70);
    assert_eq!(
        (fixed[2] & 0x0f, fixed[12], fixed[13]),
        (s.key.0, s.asc, s.ascq)
    );
    let d = s.to_descriptor();
    assert_eq!(d[0], 0x72);
    assert_eq!((d[1], d[2], d[3]), (s.key.0, s.asc, s.ascq));
    assert_eq!(d.len(), 8 + d[7] as usize);
}
