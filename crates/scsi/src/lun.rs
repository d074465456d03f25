//! Logical unit numbers (SAM-5 §4.7).

/// A logical unit number as the target numbers it (0..16383, flat or
/// peripheral addressing). The 8-byte wire form is produced by [`Lun::encode`]
/// and read by [`Lun::decode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lun(pub u16);

impl Lun {
    /// SAM-5 §4.7.4: LUNs below 256 use peripheral device addressing (method
    /// 00b), others flat space addressing (method 01b).
    pub fn encode(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        if self.0 < 256 {
            b[1] = self.0 as u8;
        } else {
            b[0] = 0x40 | ((self.0 >> 8) as u8 & 0x3f);
            b[1] = self.0 as u8;
        }
        b
    }

    /// Decodes the first level of an 8-byte LUN. Returns `None` for addressing
    /// methods or levels this target never hands out, so the caller can answer
    /// LOGICAL UNIT NOT SUPPORTED.
    pub fn decode(b: [u8; 8]) -> Option<Lun> {
        if b[2..].iter().any(|&x| x != 0) {
            return None;
        }
        match b[0] >> 6 {
            0b00 if b[0] & 0x3f == 0 => Some(Lun(b[1] as u16)),
            0b01 => Some(Lun((((b[0] & 0x3f) as u16) << 8) | b[1] as u16)),
            _ => None,
        }
    }

    /// Decodes the big-endian u64 form that iSCSI and SRP carry.
    pub fn from_u64(v: u64) -> Option<Lun> {
        Lun::decode(v.to_be_bytes())
    }

    /// The big-endian u64 form of [`Lun::encode`].
    pub fn to_u64(self) -> u64 {
        u64::from_be_bytes(self.encode())
    }
}

/// REPORT LUNS parameter data (SPC-4 §6.33.2) for `select` (00h/02h: these
/// LUNs; 01h: well-known LUNs only, of which this target has none), before
/// truncation to the allocation length.
pub fn report_luns<I: IntoIterator<Item = Lun>>(select: u8, luns: I, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend([0u8; 8]);
    if select != 1 {
        for l in luns {
            out.extend(l.encode());
        }
    }
    let list_len = (out.len() - start - 8) as u32;
    out[start..start + 4].copy_from_slice(&list_len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_luns_list() {
        let mut v = Vec::new();
        report_luns(0, [Lun(0), Lun(300)], &mut v);
        assert_eq!(v.len(), 24);
        assert_eq!(&v[..4], &16u32.to_be_bytes());
        assert_eq!(&v[8..16], &Lun(0).encode());
        assert_eq!(&v[16..18], &[0x41, 0x2c]);
        let mut v = Vec::new();
        report_luns(1, [Lun(0)], &mut v);
        assert_eq!(v, [0u8; 8]);
    }

    #[test]
    fn round_trip() {
        for l in [0u16, 1, 255, 256, 1000, 16383] {
            assert_eq!(Lun::decode(Lun(l).encode()), Some(Lun(l)));
            assert_eq!(Lun::from_u64(Lun(l).to_u64()), Some(Lun(l)));
        }
        assert_eq!(Lun::decode([0, 0, 0, 0, 0, 0, 0, 1]), None);
        assert_eq!(Lun::decode([0xc0, 0, 0, 0, 0, 0, 0, 0]), None);
    }
}
