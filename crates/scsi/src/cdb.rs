//! CDB decoding (SPC-4 §4.2, SBC-4 §5). Every decoder checks the CDB length
//! and the reserved or unsupported fields it knows about, and reports errors
//! as [`Sense`] values with the SPC-4 §4.5.2.4.2 field pointer set.

use crate::opcode::Opcode;
use crate::sense::Sense;

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn bad(byte: u16, bit: Option<u8>) -> Sense {
    Sense::INVALID_FIELD_IN_CDB.cdb_field(byte, bit)
}

/// Checks that `cdb` is at least as long as its group code says and that the
/// CONTROL byte asks for nothing this target does not do. Returns the CDB
/// length.
pub fn check_cdb(cdb: &[u8]) -> Result<usize, Sense> {
    let Some(&op) = cdb.first() else {
        return Err(bad(0, None));
    };
    let len = Opcode(op)
        .cdb_len()
        .ok_or(Sense::INVALID_COMMAND_OPERATION_CODE)?;
    if cdb.len() < len {
        return Err(bad(0, None));
    }
    // SAM-5 §5.11 / SPC-4 §4.3.6: NACA set while the device does not support
    // ACA (NormACA = 0) is an INVALID FIELD IN CDB in the CONTROL byte.
    if cdb[len - 1] & 0x04 != 0 {
        return Err(bad((len - 1) as u16, Some(2)));
    }
    Ok(len)
}

/// [`check_cdb`] for a decoder that reads a `layout`-byte CDB: a CDB of a
/// shorter group (another command's opcode) is not one it decodes.
pub fn check_cdb_layout(cdb: &[u8], layout: usize) -> Result<usize, Sense> {
    let len = check_cdb(cdb)?;
    if len < layout {
        return Err(Sense::INVALID_COMMAND_OPERATION_CODE);
    }
    Ok(len)
}

/// The LBA/transfer-length part of a block command (READ, WRITE, VERIFY,
/// WRITE SAME, SYNCHRONIZE CACHE, WRITE AND VERIFY in their 6/10/12/16-byte
/// forms), with the flag byte left for the caller to interpret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCdb {
    pub lba: u64,
    /// Transfer length in logical blocks (READ/WRITE 6: 0 means 256).
    pub blocks: u32,
    /// Byte 1 of the CDB (RDPROTECT/WRPROTECT, DPO, FUA, BYTCHK, ...); 0 for
    /// the 6-byte forms.
    pub flags: u8,
    /// Byte holding the GROUP NUMBER (unused by this target).
    pub group: u8,
}

impl BlockCdb {
    /// DPO bit (SBC-4 §5.11).
    pub fn dpo(&self) -> bool {
        self.flags & 0x10 != 0
    }
    /// FUA bit (SBC-4 §5.11).
    pub fn fua(&self) -> bool {
        self.flags & 0x08 != 0
    }
    /// RDPROTECT / WRPROTECT / VRPROTECT field (bits 7..5 of byte 1).
    pub fn protect(&self) -> u8 {
        self.flags >> 5
    }
    /// VERIFY's BYTCHK field (bits 2..1 of byte 1).
    pub fn bytchk(&self) -> u8 {
        (self.flags >> 1) & 3
    }

    /// Decodes the LBA and transfer length of any block command by the CDB
    /// layout its group code implies (SBC-4 §5.15-§5.16 and friends).
    pub fn decode(cdb: &[u8]) -> Result<BlockCdb, Sense> {
        let len = check_cdb(cdb)?;
        Ok(match len {
            6 => {
                // SBC-4 §5.15 READ (6): 21-bit LBA, 0 blocks means 256.
                let lba = (((cdb[1] & 0x1f) as u64) << 16) | be16(&cdb[2..]) as u64;
                let blocks = if cdb[4] == 0 { 256 } else { cdb[4] as u32 };
                BlockCdb {
                    lba,
                    blocks,
                    flags: 0,
                    group: 0,
                }
            }
            10 => BlockCdb {
                lba: be32(&cdb[2..]) as u64,
                blocks: be16(&cdb[7..]) as u32,
                flags: cdb[1],
                group: cdb[6],
            },
            12 => BlockCdb {
                lba: be32(&cdb[2..]) as u64,
                blocks: be32(&cdb[6..]),
                flags: cdb[1],
                group: cdb[10],
            },
            _ => BlockCdb {
                lba: be64(&cdb[2..]),
                blocks: be32(&cdb[10..]),
                flags: cdb[1],
                group: cdb[14],
            },
        })
    }

    /// Checks `[lba, lba+blocks)` against a capacity of `num_blocks`:
    /// SBC-4 §4.5: LOGICAL BLOCK ADDRESS OUT OF RANGE, also for a transfer
    /// length of zero that starts beyond the capacity.
    pub fn check_range(&self, num_blocks: u64) -> Result<(), Sense> {
        match self.lba.checked_add(self.blocks as u64) {
            Some(end) if end <= num_blocks => Ok(()),
            _ => Err(Sense::LBA_OUT_OF_RANGE),
        }
    }

    /// Rejects a non-zero protection field: SBC-4 §5.16: with protection
    /// information disabled, RDPROTECT/WRPROTECT other than 000b is an
    /// INVALID FIELD IN CDB.
    pub fn check_no_protect(&self) -> Result<(), Sense> {
        if self.protect() != 0 {
            return Err(bad(1, Some(7)));
        }
        Ok(())
    }
}

/// INQUIRY (SPC-4 §6.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InquiryCdb {
    pub evpd: bool,
    pub page: u8,
    pub alloc_len: u16,
}

impl InquiryCdb {
    pub fn decode(cdb: &[u8]) -> Result<InquiryCdb, Sense> {
        check_cdb(cdb)?;
        // SPC-4 §6.6.1: CMDDT is obsolete; a device that does not support it
        // reports INVALID FIELD IN CDB.
        if cdb[1] & 0x02 != 0 {
            return Err(bad(1, Some(1)));
        }
        let evpd = cdb[1] & 1 != 0;
        // SPC-4 §6.6.1: EVPD = 0 with a non-zero PAGE CODE is an error.
        if !evpd && cdb[2] != 0 {
            return Err(bad(2, None));
        }
        Ok(InquiryCdb {
            evpd,
            page: cdb[2],
            alloc_len: be16(&cdb[3..]),
        })
    }
}

/// Page control of MODE SENSE (SPC-4 §6.11.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageControl {
    Current,
    Changeable,
    Default,
    Saved,
}

/// MODE SENSE (6) and (10) (SPC-4 §6.11, §6.12).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeSenseCdb {
    /// True for MODE SENSE (10).
    pub ten: bool,
    pub dbd: bool,
    /// LLBAA (MODE SENSE (10) only).
    pub llbaa: bool,
    pub pc: PageControl,
    pub page: u8,
    pub subpage: u8,
    pub alloc_len: u16,
}

impl ModeSenseCdb {
    pub fn decode(cdb: &[u8]) -> Result<ModeSenseCdb, Sense> {
        let len = check_cdb(cdb)?;
        let ten = len == 10;
        let pc = match cdb[2] >> 6 {
            0 => PageControl::Current,
            1 => PageControl::Changeable,
            2 => PageControl::Default,
            _ => PageControl::Saved,
        };
        Ok(ModeSenseCdb {
            ten,
            dbd: cdb[1] & 0x08 != 0,
            llbaa: ten && cdb[1] & 0x10 != 0,
            pc,
            page: cdb[2] & 0x3f,
            subpage: cdb[3],
            alloc_len: if ten { be16(&cdb[7..]) } else { cdb[4] as u16 },
        })
    }
}

/// REPORT LUNS (SPC-4 §6.33).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportLunsCdb {
    pub select: u8,
    pub alloc_len: u32,
}

impl ReportLunsCdb {
    pub fn decode(cdb: &[u8]) -> Result<ReportLunsCdb, Sense> {
        check_cdb_layout(cdb, 12)?;
        let select = cdb[2];
        // SPC-4 §6.33: SELECT REPORT 00h (all but well-known), 01h (well-known
        // only), 02h (all); other values are reserved (or address-method
        // specific ones this target does not use).
        if select > 2 {
            return Err(bad(2, None));
        }
        let alloc_len = be32(&cdb[6..]);
        // SPC-4 §6.33: an ALLOCATION LENGTH below 16 is an INVALID FIELD IN
        // CDB.
        if alloc_len < 16 {
            return Err(bad(6, None));
        }
        Ok(ReportLunsCdb { select, alloc_len })
    }
}

/// REQUEST SENSE (SPC-4 §6.39).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestSenseCdb {
    /// DESC: descriptor-format sense data wanted.
    pub desc: bool,
    pub alloc_len: u8,
}

impl RequestSenseCdb {
    pub fn decode(cdb: &[u8]) -> Result<RequestSenseCdb, Sense> {
        check_cdb(cdb)?;
        Ok(RequestSenseCdb {
            desc: cdb[1] & 1 != 0,
            alloc_len: cdb[4],
        })
    }
}

/// READ CAPACITY (10) (SBC-4 §5.20).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadCapacity10Cdb;

impl ReadCapacity10Cdb {
    pub fn decode(cdb: &[u8]) -> Result<ReadCapacity10Cdb, Sense> {
        check_cdb_layout(cdb, 10)?;
        // SBC-4 §5.20.1: LOGICAL BLOCK ADDRESS (obsolete) must be zero when
        // PMI (obsolete) is zero.
        if cdb[8] & 1 == 0 && be32(&cdb[2..]) != 0 {
            return Err(bad(2, None));
        }
        Ok(ReadCapacity10Cdb)
    }
}

/// SERVICE ACTION IN (16) with its service action and allocation length
/// (SBC-4 §5.21 READ CAPACITY (16), §5.8 GET LBA STATUS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceActionIn16Cdb {
    pub action: u8,
    pub lba: u64,
    pub alloc_len: u32,
}

impl ServiceActionIn16Cdb {
    pub fn decode(cdb: &[u8]) -> Result<ServiceActionIn16Cdb, Sense> {
        check_cdb_layout(cdb, 16)?;
        Ok(ServiceActionIn16Cdb {
            action: cdb[1] & 0x1f,
            lba: be64(&cdb[2..]),
            alloc_len: be32(&cdb[10..]),
        })
    }
}

/// START STOP UNIT (SBC-4 §5.25).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartStopCdb {
    pub immed: bool,
    pub power_condition: u8,
    pub loej: bool,
    pub start: bool,
}

impl StartStopCdb {
    pub fn decode(cdb: &[u8]) -> Result<StartStopCdb, Sense> {
        check_cdb(cdb)?;
        Ok(StartStopCdb {
            immed: cdb[1] & 1 != 0,
            power_condition: cdb[4] >> 4,
            loej: cdb[4] & 2 != 0,
            start: cdb[4] & 1 != 0,
        })
    }
}

/// PREVENT ALLOW MEDIUM REMOVAL (SBC-4 §5.13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreventAllowCdb {
    pub prevent: u8,
}

impl PreventAllowCdb {
    pub fn decode(cdb: &[u8]) -> Result<PreventAllowCdb, Sense> {
        check_cdb(cdb)?;
        Ok(PreventAllowCdb {
            prevent: cdb[4] & 3,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::FieldPointer;

    /// A decoder given a CDB of a shorter group (found by the scsi_cdb fuzz
    /// target: REPORT LUNS's decoder read byte 6 of a 6-byte CDB).
    #[test]
    fn decoders_refuse_shorter_layouts() {
        let six = [0x1c, 0x6c, 0, 0, 0, 0];
        let op = Err(Sense::INVALID_COMMAND_OPERATION_CODE);
        assert_eq!(ReportLunsCdb::decode(&six).map(drop), op);
        assert_eq!(ReadCapacity10Cdb::decode(&six).map(drop), op);
        assert_eq!(
            ServiceActionIn16Cdb::decode(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]).map(drop),
            op
        );
        assert!(ReportLunsCdb::decode(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]).is_ok());
    }

    #[test]
    fn read6_zero_means_256() {
        let c = BlockCdb::decode(&[0x08, 0x1f, 0xff, 0xff, 0, 0]).unwrap();
        assert_eq!(c.lba, 0x1fffff);
        assert_eq!(c.blocks, 256);
        let c = BlockCdb::decode(&[0x08, 0, 0, 5, 7, 0]).unwrap();
        assert_eq!((c.lba, c.blocks), (5, 7));
    }

    #[test]
    fn read10_12_16_fields() {
        let c = BlockCdb::decode(&[0x28, 0x18, 0, 0, 1, 0, 0, 0, 2, 0]).unwrap();
        assert_eq!((c.lba, c.blocks, c.dpo(), c.fua()), (256, 2, true, true));
        let c = BlockCdb::decode(&[0xa8, 0x60, 0, 0, 0, 9, 0, 0, 1, 0, 0, 0]).unwrap();
        assert_eq!((c.lba, c.blocks, c.protect()), (9, 256, 3));
        assert_eq!(
            c.check_no_protect(),
            Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(7)))
        );
        let mut c16 = [0u8; 16];
        c16[0] = 0x88;
        c16[2..10].copy_from_slice(&u64::MAX.to_be_bytes());
        c16[13] = 1;
        let c = BlockCdb::decode(&c16).unwrap();
        assert_eq!((c.lba, c.blocks), (u64::MAX, 1));
        assert_eq!(c.check_range(100), Err(Sense::LBA_OUT_OF_RANGE));
    }

    #[test]
    fn range_checks() {
        let c = |lba, blocks| BlockCdb {
            lba,
            blocks,
            flags: 0,
            group: 0,
        };
        assert!(c(0, 100).check_range(100).is_ok());
        assert!(c(99, 1).check_range(100).is_ok());
        assert!(c(100, 0).check_range(100).is_ok());
        assert_eq!(c(101, 0).check_range(100), Err(Sense::LBA_OUT_OF_RANGE));
        assert_eq!(c(99, 2).check_range(100), Err(Sense::LBA_OUT_OF_RANGE));
        assert_eq!(
            c(u64::MAX, 2).check_range(100),
            Err(Sense::LBA_OUT_OF_RANGE)
        );
    }

    #[test]
    fn naca_and_short_cdbs_rejected() {
        let e = BlockCdb::decode(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0x04]).unwrap_err();
        assert_eq!(
            e.field,
            Some(FieldPointer {
                in_cdb: true,
                byte: 9,
                bit: Some(2)
            })
        );
        assert!(BlockCdb::decode(&[0x28, 0, 0]).is_err());
        assert_eq!(
            check_cdb(&[0x7f; 16]),
            Err(Sense::INVALID_COMMAND_OPERATION_CODE)
        );
    }

    #[test]
    fn inquiry_fields() {
        let c = InquiryCdb::decode(&[0x12, 1, 0x83, 1, 0, 0]).unwrap();
        assert_eq!((c.evpd, c.page, c.alloc_len), (true, 0x83, 256));
        let e = InquiryCdb::decode(&[0x12, 0, 1, 1, 0, 0]).unwrap_err();
        assert_eq!(e, Sense::INVALID_FIELD_IN_CDB.cdb_field(2, None));
        assert!(InquiryCdb::decode(&[0x12, 2, 0, 1, 0, 0]).is_err());
    }

    #[test]
    fn mode_sense_fields() {
        let c = ModeSenseCdb::decode(&[0x1a, 0x08, 0xbf, 0, 255, 0]).unwrap();
        assert!(!c.ten && c.dbd);
        assert_eq!(
            (c.pc, c.page, c.alloc_len),
            (PageControl::Default, 0x3f, 255)
        );
        let c = ModeSenseCdb::decode(&[0x5a, 0x10, 0xc8, 0, 0, 0, 0, 1, 0, 0]).unwrap();
        assert!(c.ten && c.llbaa && !c.dbd);
        assert_eq!((c.pc, c.page, c.alloc_len), (PageControl::Saved, 8, 256));
    }

    #[test]
    fn report_luns_fields() {
        let c = ReportLunsCdb::decode(&[0xa0, 0, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0]).unwrap();
        assert_eq!((c.select, c.alloc_len), (2, 256));
        assert!(ReportLunsCdb::decode(&[0xa0, 0, 3, 0, 0, 0, 0, 0, 1, 0, 0, 0]).is_err());
        assert_eq!(
            ReportLunsCdb::decode(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 0, 0]),
            Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(6, None))
        );
    }

    #[test]
    fn small_decoders() {
        let r = RequestSenseCdb::decode(&[0x03, 1, 0, 0, 252, 0]).unwrap();
        assert!(r.desc);
        assert_eq!(r.alloc_len, 252);
        assert!(ReadCapacity10Cdb::decode(&[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0]).is_err());
        assert!(ReadCapacity10Cdb::decode(&[0x25, 0, 0, 0, 0, 1, 0, 0, 1, 0]).is_ok());
        let mut c = [0u8; 16];
        c[0] = 0x9e;
        c[1] = 0x10;
        c[13] = 32;
        let s = ServiceActionIn16Cdb::decode(&c).unwrap();
        assert_eq!((s.action, s.alloc_len), (0x10, 32));
        let s = StartStopCdb::decode(&[0x1b, 1, 0, 0, 0x13, 0]).unwrap();
        assert!(s.immed && s.loej && s.start);
        assert_eq!(s.power_condition, 1);
        assert_eq!(
            PreventAllowCdb::decode(&[0x1e, 0, 0, 0, 1, 0])
                .unwrap()
                .prevent,
            1
        );
    }
}
