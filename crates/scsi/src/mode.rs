//! Mode parameter data (SPC-4 §7.5): headers, block descriptors, and the
//! Caching (SBC-4 §6.5.5) and Control (SPC-4 §7.5.7) pages.

use crate::cdb::{ModeSenseCdb, PageControl};
use crate::sense::Sense;

/// Mode page codes.
pub mod page {
    pub const CACHING: u8 = 0x08;
    pub const CONTROL: u8 = 0x0a;
    pub const ALL: u8 = 0x3f;
}

/// The device state the mode pages reflect.
#[derive(Clone, Copy, Debug, Default)]
pub struct ModeState {
    pub num_blocks: u64,
    pub block_size: u32,
    /// WP in the device-specific parameter (SBC-4 §6.5.1).
    pub write_protect: bool,
    /// Write cache enabled (Caching page WCE).
    pub write_cache: bool,
    /// D_SENSE in the Control page: descriptor-format sense data.
    pub d_sense: bool,
    /// SWP in the Control page: software write protect.
    pub swp: bool,
    /// DPOFUA in the device-specific parameter (SBC-4 §6.5.1): the device
    /// server honours the DPO and FUA bits of reads and writes.
    pub dpofua: bool,
}

fn caching_page(s: &ModeState, pc: PageControl, out: &mut Vec<u8>) {
    // SBC-4 §6.5.5: page 08h, length 12h.
    let mut p = [0u8; 20];
    p[0] = page::CACHING;
    p[1] = 0x12;
    if pc != PageControl::Changeable && s.write_cache {
        p[2] |= 0x04; // WCE
    }
    out.extend_from_slice(&p);
}

fn control_page(s: &ModeState, pc: PageControl, out: &mut Vec<u8>) {
    // SPC-4 §7.5.7: page 0Ah, length 0Ah.
    let mut p = [0u8; 12];
    p[0] = page::CONTROL;
    p[1] = 0x0a;
    if pc == PageControl::Changeable {
        // D_SENSE and SWP are changeable (MODE SELECT).
        p[2] = 0x04;
        p[4] = 0x08;
    } else {
        // TST = 001b: a task set per I_T nexus.
        p[2] = 0x20;
        if s.swp {
            p[4] |= 0x08;
        }
        if s.d_sense {
            p[2] |= 0x04;
        }
        // QUEUE ALGORITHM MODIFIER = 1 (unrestricted reordering allowed);
        // QERR = 00b: other tasks continue after a CHECK CONDITION.
        p[3] = 0x10;
        // BUSY TIMEOUT PERIOD: unlimited.
        p[8] = 0xff;
        p[9] = 0xff;
    }
    out.extend_from_slice(&p);
}

/// MODE SENSE (6) or (10) parameter data for `cdb`, before truncation to the
/// allocation length. Errors: saved values are not supported (SPC-4 §6.11:
/// SAVING PARAMETERS NOT SUPPORTED), unknown pages or subpages (INVALID
/// FIELD IN CDB).
pub fn mode_sense(cdb: &ModeSenseCdb, s: &ModeState, out: &mut Vec<u8>) -> Result<(), Sense> {
    if cdb.pc == PageControl::Saved {
        return Err(Sense::SAVING_PARAMETERS_NOT_SUPPORTED);
    }
    // Only subpage 00h exists here; FFh (all subpages) is accepted with the
    // all-pages request.
    let ok_subpage = cdb.subpage == 0 || (cdb.page == page::ALL && cdb.subpage == 0xff);
    if !ok_subpage {
        return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(3, None));
    }
    if !matches!(cdb.page, page::CACHING | page::CONTROL | page::ALL) {
        return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(2, Some(5)));
    }
    let start = out.len();
    let hdr = if cdb.ten { 8 } else { 4 };
    out.extend(std::iter::repeat_n(0u8, hdr));
    // SBC-4 §6.5.1: WP in bit 7, DPOFUA in bit 4 of the device-specific
    // parameter.
    let dsp = (u8::from(s.write_protect) << 7) | (u8::from(s.dpofua) << 4);
    out[start + if cdb.ten { 3 } else { 2 }] = dsp;
    if !cdb.dbd {
        let blocks = s.num_blocks;
        if cdb.llbaa {
            // SBC-4 §6.5.2.3 long LBA block descriptor.
            out[start + 4] |= 1; // LONGLBA
            out.extend(blocks.to_be_bytes());
            out.extend([0u8; 4]);
            out.extend(s.block_size.to_be_bytes());
        } else {
            // SBC-4 §6.5.2.2 short block descriptor: 0xFFFFFFFF if the
            // capacity does not fit.
            let n = u32::try_from(blocks).unwrap_or(u32::MAX);
            out.extend(n.to_be_bytes());
            out.push(0);
            out.extend(&s.block_size.to_be_bytes()[1..]);
        }
        let bdl = out.len() - start - hdr;
        if cdb.ten {
            out[start + 6..start + 8].copy_from_slice(&(bdl as u16).to_be_bytes());
        } else {
            out[start + 3] = bdl as u8;
        }
    }
    if matches!(cdb.page, page::CACHING | page::ALL) {
        caching_page(s, cdb.pc, out);
    }
    if matches!(cdb.page, page::CONTROL | page::ALL) {
        control_page(s, cdb.pc, out);
    }
    // MODE DATA LENGTH excludes itself.
    let len = out.len() - start;
    if cdb.ten {
        out[start..start + 2].copy_from_slice(&((len - 2) as u16).to_be_bytes());
    } else {
        out[start] = (len - 1).min(255) as u8;
    }
    Ok(())
}

/// What a MODE SELECT may change: the Control page's D_SENSE and SWP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeChange {
    pub d_sense: bool,
    pub swp: bool,
}

/// Checks MODE SELECT (6)/(10) parameter data against the current state `s`
/// (SPC-4 §6.9, §7.5.2): a header with MODE DATA LENGTH zero, block
/// descriptors that repeat the current block length, then Caching and
/// Control pages in which only the changeable bits (D_SENSE, SWP) may
/// differ from the current values. Returns the new changeable values.
pub fn mode_select(ten: bool, data: &[u8], s: &ModeState) -> Result<ModeChange, Sense> {
    let bad = |at: usize| Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(at as u16, None));
    let hdr = if ten { 8 } else { 4 };
    if data.len() < hdr {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let mdl = if ten {
        u16::from_be_bytes([data[0], data[1]]) as usize
    } else {
        data[0] as usize
    };
    if mdl != 0 {
        return bad(0);
    }
    let bdl = if ten {
        u16::from_be_bytes([data[6], data[7]]) as usize
    } else {
        data[3] as usize
    };
    let mut at = hdr + bdl;
    if at > data.len() {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    // Block descriptors: the block length must be the current one.
    let desc = if ten && data[4] & 1 != 0 { 16 } else { 8 };
    let mut d = hdr;
    while d + desc <= hdr + bdl {
        let bl = &data[d + desc - 3..d + desc];
        let len = u32::from_be_bytes([0, bl[0], bl[1], bl[2]]);
        if len != 0 && len != s.block_size {
            return bad(d + desc - 3);
        }
        d += desc;
    }
    let mut change = ModeChange {
        d_sense: s.d_sense,
        swp: s.swp,
    };
    while at < data.len() {
        if at + 2 > data.len() {
            return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let code = data[at] & 0x3f;
        let spf = data[at] & 0x40 != 0;
        let plen = data[at + 1] as usize;
        if at + 2 + plen > data.len() {
            return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
        }
        let page = &data[at..at + 2 + plen];
        let mut cur = Vec::new();
        match (code, spf) {
            (page::CACHING, false) => caching_page(s, PageControl::Current, &mut cur),
            (page::CONTROL, false) => control_page(s, PageControl::Current, &mut cur),
            _ => return bad(at),
        }
        if cur.len() != page.len() {
            return bad(at + 1);
        }
        let mut mask = Vec::new();
        if code == page::CONTROL {
            control_page(s, PageControl::Changeable, &mut mask);
        } else {
            caching_page(s, PageControl::Changeable, &mut mask);
        }
        // The PS bit (byte 0 bit 7) is reserved in MODE SELECT data.
        for i in 2..page.len() {
            if (page[i] ^ cur[i]) & !mask[i] != 0 {
                return bad(at + i);
            }
        }
        if code == page::CONTROL {
            change.d_sense = page[2] & 0x04 != 0;
            change.swp = page[4] & 0x08 != 0;
        }
        at += 2 + plen;
    }
    Ok(change)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdb(ten: bool, dbd: bool, pc: PageControl, page: u8) -> ModeSenseCdb {
        ModeSenseCdb {
            ten,
            dbd,
            llbaa: false,
            pc,
            page,
            subpage: 0,
            alloc_len: 255,
        }
    }

    const S: ModeState = ModeState {
        num_blocks: 1000,
        block_size: 512,
        write_protect: true,
        write_cache: true,
        d_sense: false,
        swp: false,
        dpofua: true,
    };

    #[test]
    fn mode_select_changes_only_changeable_bits() {
        let mut cur = Vec::new();
        control_page(&S, PageControl::Current, &mut cur);
        let mut data = vec![0u8, 0, 0, 0];
        data.extend(&cur);
        data[4 + 2] |= 0x04;
        data[4 + 4] |= 0x08;
        let c = mode_select(false, &data, &S).unwrap();
        assert_eq!(
            c,
            ModeChange {
                d_sense: true,
                swp: true
            }
        );
        // A bit that is not changeable: QERR.
        data[4 + 3] |= 0x02;
        assert!(mode_select(false, &data, &S).is_err());
        // MODE SELECT (10) with a block descriptor of the current length.
        let mut d10 = vec![0u8, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 2, 0];
        d10.extend(&cur);
        assert_eq!(
            mode_select(true, &d10, &S).unwrap(),
            ModeChange {
                d_sense: false,
                swp: false
            }
        );
        d10[14] = 0x10;
        assert!(mode_select(true, &d10, &S).is_err());
        // An unknown page, a short list.
        assert!(mode_select(false, &[0, 0, 0, 0, 0x19, 0], &S).is_err());
        assert_eq!(
            mode_select(false, &[0, 0], &S),
            Err(Sense::PARAMETER_LIST_LENGTH_ERROR)
        );
    }

    #[test]
    fn all_pages_six() {
        let mut v = Vec::new();
        mode_sense(&cdb(false, false, PageControl::Current, 0x3f), &S, &mut v).unwrap();
        assert_eq!(v.len(), 4 + 8 + 20 + 12);
        assert_eq!(v[0] as usize, v.len() - 1);
        assert_eq!((v[2], v[3]), (0x90, 8));
        assert_eq!(&v[4..8], &1000u32.to_be_bytes());
        assert_eq!(&v[9..12], &[0, 2, 0]);
        assert_eq!((v[12], v[13], v[14]), (0x08, 0x12, 0x04));
        assert_eq!((v[32], v[33], v[34]), (0x0a, 0x0a, 0x20));
    }

    #[test]
    fn device_specific_parameter_has_wp_and_dpofua_as_the_state_says() {
        for (wp, dpofua, dsp) in [(true, true, 0x90), (false, true, 0x10), (true, false, 0x80)] {
            let s = ModeState {
                write_protect: wp,
                dpofua,
                ..S
            };
            let mut v = Vec::new();
            mode_sense(&cdb(false, true, PageControl::Current, 0x08), &s, &mut v).unwrap();
            assert_eq!(v[2], dsp);
            let mut v = Vec::new();
            mode_sense(&cdb(true, true, PageControl::Current, 0x08), &s, &mut v).unwrap();
            assert_eq!(v[3], dsp);
        }
    }

    #[test]
    fn ten_with_dbd_and_changeable() {
        let mut v = Vec::new();
        mode_sense(&cdb(true, true, PageControl::Changeable, 0x08), &S, &mut v).unwrap();
        assert_eq!(v.len(), 8 + 20);
        assert_eq!(u16::from_be_bytes([v[0], v[1]]) as usize, v.len() - 2);
        assert_eq!(&v[6..8], &[0, 0]);
        assert_eq!(v[10], 0); // WCE not changeable
    }

    #[test]
    fn long_lba_descriptor() {
        let mut c = cdb(true, false, PageControl::Current, 0x0a);
        c.llbaa = true;
        let s = ModeState {
            num_blocks: 1 << 33,
            ..S
        };
        let mut v = Vec::new();
        mode_sense(&c, &s, &mut v).unwrap();
        assert_eq!(v[4] & 1, 1);
        assert_eq!(&v[6..8], &[0, 16]);
        assert_eq!(&v[8..16], &(1u64 << 33).to_be_bytes());
        let mut v = Vec::new();
        mode_sense(&cdb(false, false, PageControl::Current, 0x0a), &s, &mut v).unwrap();
        assert_eq!(&v[4..8], &[0xff; 4]);
    }

    #[test]
    fn errors() {
        let mut v = Vec::new();
        assert_eq!(
            mode_sense(&cdb(false, false, PageControl::Saved, 0x3f), &S, &mut v),
            Err(Sense::SAVING_PARAMETERS_NOT_SUPPORTED)
        );
        assert!(mode_sense(&cdb(false, false, PageControl::Current, 0x19), &S, &mut v).is_err());
        let mut c = cdb(false, false, PageControl::Current, 0x08);
        c.subpage = 1;
        assert!(mode_sense(&c, &S, &mut v).is_err());
        c.page = 0x3f;
        c.subpage = 0xff;
        assert!(mode_sense(&c, &S, &mut v).is_ok());
    }
}
