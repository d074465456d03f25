//! REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35): the CDB and its
//! parameter data, built from a table of the commands a device server
//! supports and the CDB usage data of each.

use crate::cdb::check_cdb_layout;
use crate::sense::Sense;

/// One supported command: its opcode, service action (if the opcode has
/// service actions), and CDB usage data (SPC-4 §6.35.3: the opcode, the
/// service action in its place, then a bit map of the bits the device server
/// evaluates; its length is the CDB length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Supported {
    pub opcode: u8,
    pub sa: Option<u8>,
    pub usage: &'static [u8],
}

/// The REPORT SUPPORTED OPERATION CODES CDB (MAINTENANCE IN, 0Ch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportOpcodesCdb {
    /// RCTD: return command timeouts descriptors.
    pub rctd: bool,
    /// REPORTING OPTIONS.
    pub options: u8,
    pub opcode: u8,
    pub sa: u16,
    pub alloc_len: u32,
}

impl ReportOpcodesCdb {
    pub fn decode(cdb: &[u8]) -> Result<ReportOpcodesCdb, Sense> {
        check_cdb_layout(cdb, 12)?;
        let options = cdb[2] & 0x07;
        // SPC-4 §6.35.1 table 285: 000b..011b are defined.
        if options > 3 {
            return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(2, Some(2)));
        }
        Ok(ReportOpcodesCdb {
            rctd: cdb[2] & 0x80 != 0,
            options,
            opcode: cdb[3],
            sa: u16::from_be_bytes([cdb[4], cdb[5]]),
            alloc_len: u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]),
        })
    }
}

/// SPC-4 §6.35.4 command timeouts descriptor: no timeouts are specified.
fn timeouts(out: &mut Vec<u8>) {
    out.extend([0x00, 0x0a]);
    out.extend([0u8; 10]);
}

/// The parameter data for `c` over the supported commands `table`, before
/// truncation to the allocation length.
pub fn report_supported_opcodes(
    c: &ReportOpcodesCdb,
    table: &[Supported],
    out: &mut Vec<u8>,
) -> Result<(), Sense> {
    let start = out.len();
    if c.options == 0 {
        // §6.35.2: all commands, one descriptor each.
        out.extend([0u8; 4]);
        for s in table {
            out.push(s.opcode);
            out.push(0);
            out.extend((s.sa.unwrap_or(0) as u16).to_be_bytes());
            out.push(0);
            out.push(if c.rctd { 0x02 } else { 0 } | if s.sa.is_some() { 0x01 } else { 0 });
            out.extend((s.usage.len() as u16).to_be_bytes());
            if c.rctd {
                timeouts(out);
            }
        }
        let n = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&n.to_be_bytes());
        return Ok(());
    }
    let has_sa = table.iter().any(|s| s.opcode == c.opcode && s.sa.is_some());
    // §6.35.1: option 001b names an opcode without service actions, 010b one
    // with them; the other way round is an INVALID FIELD IN CDB.
    match c.options {
        1 if has_sa => return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(3, None)),
        2 if !has_sa => return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(3, None)),
        _ => {}
    }
    let found = table
        .iter()
        .find(|s| s.opcode == c.opcode && (!has_sa || s.sa.map(u16::from) == Some(c.sa)));
    // §6.35.3: SUPPORT 011b (supported as the standard says) or 001b (not
    // supported, no usage data).
    match found {
        Some(s) => {
            out.push(0);
            out.push(if c.rctd { 0x80 } else { 0 } | 0x03);
            out.extend((s.usage.len() as u16).to_be_bytes());
            out.extend_from_slice(s.usage);
            if c.rctd {
                timeouts(out);
            }
        }
        None => out.extend([0, 0x01, 0, 0]),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[Supported] = &[
        Supported {
            opcode: 0x00,
            sa: None,
            usage: &[0x00, 0, 0, 0, 0, 0x04],
        },
        Supported {
            opcode: 0x9e,
            sa: Some(0x10),
            usage: &[
                0x9e, 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0, 0x04,
            ],
        },
    ];

    fn cdb(rctd: bool, options: u8, opcode: u8, sa: u16) -> [u8; 12] {
        let s = sa.to_be_bytes();
        [
            0xa3,
            0x0c,
            (rctd as u8) << 7 | options,
            opcode,
            s[0],
            s[1],
            0,
            0,
            0xff,
            0xff,
            0,
            0,
        ]
    }

    #[test]
    fn all_commands() {
        let c = ReportOpcodesCdb::decode(&cdb(false, 0, 0, 0)).unwrap();
        assert_eq!(c.alloc_len, 0xffff);
        let mut v = Vec::new();
        report_supported_opcodes(&c, TABLE, &mut v).unwrap();
        assert_eq!(v.len(), 4 + 16);
        assert_eq!(&v[..4], &16u32.to_be_bytes());
        assert_eq!(&v[4..12], &[0x00, 0, 0, 0, 0, 0x00, 0, 6]);
        assert_eq!(&v[12..20], &[0x9e, 0, 0, 0x10, 0, 0x01, 0, 16]);
        let c = ReportOpcodesCdb::decode(&cdb(true, 0, 0, 0)).unwrap();
        let mut v = Vec::new();
        report_supported_opcodes(&c, TABLE, &mut v).unwrap();
        assert_eq!(v.len(), 4 + 2 * 20);
        assert_eq!(v[4 + 5], 0x02);
        assert_eq!(&v[12..14], &[0x00, 0x0a]);
    }

    #[test]
    fn one_command() {
        let mut v = Vec::new();
        let c = ReportOpcodesCdb::decode(&cdb(false, 1, 0x00, 0)).unwrap();
        report_supported_opcodes(&c, TABLE, &mut v).unwrap();
        assert_eq!(v, [0, 0x03, 0, 6, 0x00, 0, 0, 0, 0, 0x04]);
        // Option 001b on an opcode with service actions, 010b without.
        let c = ReportOpcodesCdb::decode(&cdb(false, 1, 0x9e, 0)).unwrap();
        assert!(report_supported_opcodes(&c, TABLE, &mut v).is_err());
        let c = ReportOpcodesCdb::decode(&cdb(false, 2, 0x00, 0)).unwrap();
        assert!(report_supported_opcodes(&c, TABLE, &mut v).is_err());
        let mut v = Vec::new();
        let c = ReportOpcodesCdb::decode(&cdb(true, 2, 0x9e, 0x10)).unwrap();
        report_supported_opcodes(&c, TABLE, &mut v).unwrap();
        assert_eq!((v[1], v.len()), (0x83, 4 + 16 + 12));
        // Unknown opcode or service action: not supported.
        let mut v = Vec::new();
        let c = ReportOpcodesCdb::decode(&cdb(false, 1, 0x55, 0)).unwrap();
        report_supported_opcodes(&c, TABLE, &mut v).unwrap();
        assert_eq!(v, [0, 0x01, 0, 0]);
        assert!(ReportOpcodesCdb::decode(&cdb(false, 5, 0, 0)).is_err());
    }
}
