//! Third-party copy bytes (SPC-4 §5.16, §6.4 EXTENDED COPY (LID1), §6.23
//! RECEIVE COPY RESULTS, §7.8.17 Third-party Copy VPD page): the
//! EXTENDED COPY parameter list decoded and checked (every error is a
//! [`Sense`] with the code SPC-4 prescribes), and the parameter data of
//! RECEIVE COPY RESULTS and of VPD page 8Fh.
//!
//! Which logical unit a target descriptor names, and the copy itself, are
//! the core's (`ferrite-core`'s `xcopy` module).

use crate::sense::Sense;

/// Segment descriptor type code: block device to block device (SPC-4
/// §6.4.6.5), the only segment type supported.
pub const SEG_BLOCK_TO_BLOCK: u8 = 0x02;
/// Target (CSCD) descriptor type code: identification descriptor (SPC-4
/// §6.4.5.6), the only target descriptor type supported.
pub const TGT_IDENTIFICATION: u8 = 0xe4;

/// Length of the parameter list header (SPC-4 §6.4.1 LID1).
pub const HEADER_LEN: usize = 16;
/// Length of a target descriptor (64 for the IPv6 and IP copy service ones).
pub const TARGET_DESC_LEN: usize = 32;
/// Length of a block to block segment descriptor.
pub const B2B_DESC_LEN: usize = 28;

/// MAXIMUM TARGET (CSCD) DESCRIPTOR COUNT this copy manager accepts.
pub const MAX_TARGET_DESCRIPTORS: u16 = 16;
/// MAXIMUM SEGMENT DESCRIPTOR COUNT.
pub const MAX_SEGMENT_DESCRIPTORS: u16 = 64;
/// MAXIMUM DESCRIPTOR LIST LENGTH (target and segment descriptors).
pub const MAX_DESCRIPTOR_LIST_LENGTH: u32 = 4096;
/// MAXIMUM SEGMENT LENGTH in bytes: 65535 blocks of 4096 bytes fit.
pub const MAX_SEGMENT_LENGTH: u32 = 1 << 28;
/// MAXIMUM INLINE DATA LENGTH: no segment type that reads inline data is
/// supported.
pub const MAX_INLINE_DATA_LENGTH: u32 = 0;
/// HELD DATA LIMIT: no segment type holds data.
pub const HELD_DATA_LIMIT: u32 = 0;
/// TOTAL CONCURRENT COPIES / MAXIMUM CONCURRENT COPIES the copy manager
/// reports (per I_T nexus; one command per list identifier).
pub const MAX_CONCURRENT_COPIES: u8 = 32;

/// Service actions of RECEIVE COPY RESULTS (SPC-4 table 127, LID1 ones).
pub mod rcr {
    pub const COPY_STATUS: u8 = 0x00;
    pub const RECEIVE_DATA: u8 = 0x01;
    pub const OPERATING_PARAMETERS: u8 = 0x03;
    pub const FAILED_SEGMENT_DETAILS: u8 = 0x04;
}

/// LIST ID USAGE (SPC-4 §6.4.1 table 121).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListIdUsage {
    /// 00b: the LIST IDENTIFIER is valid; hold data for RECEIVE COPY
    /// RESULTS.
    Hold,
    /// 10b: the LIST IDENTIFIER is valid; hold nothing.
    Discard,
    /// 11b: no list identifier (it must be zero).
    None,
}

/// A target descriptor: the identification descriptor (E4h), the only
/// kind decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetDescriptor {
    /// Offset of the descriptor in the parameter list (field pointers).
    pub at: usize,
    /// PERIPHERAL DEVICE TYPE.
    pub device_type: u8,
    /// CODE SET, ASSOCIATION, DESIGNATOR TYPE of the designator.
    pub code_set: u8,
    pub association: u8,
    pub designator_type: u8,
    /// DESIGNATOR LENGTH as given (may exceed the 20 bytes carried).
    pub designator_len: u8,
    /// The designator bytes carried (at most 20).
    pub designator: Vec<u8>,
    /// DISK BLOCK LENGTH of the block device type specific parameters.
    pub block_len: u32,
}

/// A block device to block device segment descriptor (02h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Offset of the descriptor in the parameter list.
    pub at: usize,
    /// DC: NUMBER OF BLOCKS counts destination blocks (else source blocks).
    pub dc: bool,
    pub src_index: u16,
    pub dst_index: u16,
    pub blocks: u16,
    pub src_lba: u64,
    pub dst_lba: u64,
}

/// A decoded, checked EXTENDED COPY (LID1) parameter list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamList {
    pub list_id: u8,
    pub usage: ListIdUsage,
    pub priority: u8,
    pub targets: Vec<TargetDescriptor>,
    pub segments: Vec<Segment>,
}

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

/// The length of a target descriptor of type `code` (SPC-4 §6.4.5.1: 32
/// bytes, 64 for the IPv6 (EAh) and IP copy service (EBh) ones).
fn target_desc_len(code: u8) -> usize {
    match code {
        0xea | 0xeb => 64,
        _ => TARGET_DESC_LEN,
    }
}

/// Decodes and checks an EXTENDED COPY (LID1) parameter list, `data` being
/// the PARAMETER LIST LENGTH bytes the initiator sent. Errors detected here
/// are detected before any segment is processed: ILLEGAL REQUEST with the
/// code SPC-4 §6.4 gives each.
pub fn parse(data: &[u8]) -> Result<ParamList, Sense> {
    // SPC-4 §6.4.1: a parameter list that cannot hold its header, or is
    // shorter than the lengths it announces (truncation), is a PARAMETER
    // LIST LENGTH ERROR.
    if data.len() < HEADER_LEN {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let list_id = data[0];
    let usage = match (data[1] >> 3) & 0x03 {
        0 => ListIdUsage::Hold,
        2 => ListIdUsage::Discard,
        3 => ListIdUsage::None,
        _ => return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(1, Some(4))),
    };
    let priority = data[1] & 0x07;
    let tdl = be16(&data[2..4]) as usize;
    let sdl = be32(&data[8..12]) as usize;
    let idl = be32(&data[12..16]) as usize;
    if (HEADER_LEN as u64) + tdl as u64 + sdl as u64 + idl as u64 > data.len() as u64 {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    // SPC-4 §6.4.3.5: descriptors longer in all than MAXIMUM DESCRIPTOR
    // LIST LENGTH are a PARAMETER LIST LENGTH ERROR.
    if tdl as u64 + sdl as u64 > MAX_DESCRIPTOR_LIST_LENGTH as u64 {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    // SPC-4 §6.4.1: inline data beyond MAXIMUM INLINE DATA LENGTH.
    if idl as u64 > MAX_INLINE_DATA_LENGTH as u64 {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(12, None));
    }
    // SPC-4 §6.4.1 table 121: with no list identifier (11b) the LIST
    // IDENTIFIER field is zero.
    if usage == ListIdUsage::None && list_id != 0 {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(0, None));
    }

    // Target descriptors: count them first (SPC-4 §6.4.3.4 TOO MANY TARGET
    // DESCRIPTORS), then check each.
    let tlist = &data[HEADER_LEN..HEADER_LEN + tdl];
    let mut spans = Vec::new();
    let mut at = 0;
    while at < tlist.len() {
        let len = target_desc_len(tlist[at]);
        if at + len > tlist.len() {
            // A descriptor cut by the TARGET DESCRIPTOR LIST LENGTH.
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(2, None));
        }
        spans.push(at);
        at += len;
    }
    if spans.len() > MAX_TARGET_DESCRIPTORS as usize {
        return Err(Sense::TOO_MANY_TARGET_DESCRIPTORS);
    }
    let mut targets = Vec::with_capacity(spans.len());
    for at in spans {
        let d = &tlist[at..at + TARGET_DESC_LEN];
        let off = HEADER_LEN + at;
        // SPC-4 §6.4.5.1: a type code the copy manager does not support.
        if d[0] != TGT_IDENTIFICATION {
            return Err(Sense::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE);
        }
        // LU ID TYPE and NUL are not used by SPC-4 copy managers (the
        // descriptor names the logical unit itself); RELATIVE INITIATOR
        // PORT IDENTIFIER is a hint for a copy manager that is an
        // initiator elsewhere. Only block devices (type 00h) are copy
        // targets here.
        let device_type = d[1] & 0x1f;
        if device_type != 0 {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(off as u16 + 1, Some(4)));
        }
        let designator_len = d[7];
        let carried = (designator_len as usize).min(20);
        targets.push(TargetDescriptor {
            at: off,
            device_type,
            code_set: d[4] & 0x0f,
            association: (d[5] >> 4) & 0x03,
            designator_type: d[5] & 0x0f,
            designator_len,
            designator: d[8..8 + carried].to_vec(),
            block_len: u32::from_be_bytes([0, d[29], d[30], d[31]]),
        });
    }

    // Segment descriptors.
    let slist = &data[HEADER_LEN + tdl..HEADER_LEN + tdl + sdl];
    let mut spans = Vec::new();
    let mut at = 0;
    while at < slist.len() {
        if at + 4 > slist.len() {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(8, None));
        }
        let len = 4 + be16(&slist[at + 2..at + 4]) as usize;
        if at + len > slist.len() {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST
                .param_field((HEADER_LEN + tdl + at + 2) as u16, None));
        }
        spans.push((at, len));
        at += len;
    }
    // SPC-4 §6.4.3.5: TOO MANY SEGMENT DESCRIPTORS.
    if spans.len() > MAX_SEGMENT_DESCRIPTORS as usize {
        return Err(Sense::TOO_MANY_SEGMENT_DESCRIPTORS);
    }
    let mut segments = Vec::with_capacity(spans.len());
    for (at, len) in spans {
        let d = &slist[at..at + len];
        let off = HEADER_LEN + tdl + at;
        // SPC-4 §6.4.6.1: UNSUPPORTED SEGMENT DESCRIPTOR TYPE CODE.
        if d[0] != SEG_BLOCK_TO_BLOCK {
            return Err(Sense::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE);
        }
        // SPC-4 §6.4.6.5: DESCRIPTOR LENGTH 0018h.
        if len != B2B_DESC_LEN {
            return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(off as u16 + 2, None));
        }
        segments.push(Segment {
            at: off,
            dc: d[1] & 0x02 != 0,
            src_index: be16(&d[4..6]),
            dst_index: be16(&d[6..8]),
            blocks: be16(&d[10..12]),
            src_lba: be64(&d[12..20]),
            dst_lba: be64(&d[20..28]),
        });
    }
    Ok(ParamList {
        list_id,
        usage,
        priority,
        targets,
        segments,
    })
}

/// COPY MANAGER STATUS values (SPC-4 §6.23.3 LID1 COPY STATUS).
pub mod copy_status {
    pub const IN_PROGRESS: u8 = 0x00;
    pub const COMPLETED_GOOD: u8 = 0x01;
    pub const COMPLETED_ERROR: u8 = 0x02;
}

/// RECEIVE COPY RESULTS COPY STATUS parameter data (SPC-4 §6.23.3): the
/// status, the segments processed and the bytes transferred (in bytes, or
/// in kibibytes when that does not fit).
pub fn copy_status_data(status: u8, segments: u16, bytes: u64, out: &mut Vec<u8>) {
    out.extend(8u32.to_be_bytes());
    out.push(status & 0x7f);
    out.extend(segments.to_be_bytes());
    let (units, count) = match u32::try_from(bytes) {
        Ok(n) => (0x00, n),
        Err(_) => (0x01, u32::try_from(bytes >> 10).unwrap_or(u32::MAX)),
    };
    out.push(units);
    out.extend(count.to_be_bytes());
}

/// RECEIVE COPY RESULTS RECEIVE DATA parameter data (SPC-4 §6.23.4): no
/// segment type this copy manager supports holds data.
pub fn receive_data(out: &mut Vec<u8>) {
    out.extend(0u32.to_be_bytes());
}

/// RECEIVE COPY RESULTS OPERATING PARAMETERS (SPC-4 §6.23.5): the limits
/// [`parse`] enforces and the descriptor types it implements.
pub fn operating_parameters(out: &mut Vec<u8>) {
    let start = out.len();
    out.extend([0u8; 4]);
    out.push(0x01); // SNLID: LIST ID USAGE 11b is supported
    out.extend([0u8; 3]);
    out.extend(MAX_TARGET_DESCRIPTORS.to_be_bytes());
    out.extend(MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    out.extend(MAX_DESCRIPTOR_LIST_LENGTH.to_be_bytes());
    out.extend(MAX_SEGMENT_LENGTH.to_be_bytes());
    out.extend(MAX_INLINE_DATA_LENGTH.to_be_bytes());
    out.extend(HELD_DATA_LIMIT.to_be_bytes());
    out.extend(0u32.to_be_bytes()); // MAXIMUM STREAM DEVICE TRANSFER SIZE
    out.extend([0u8; 2]);
    out.extend((MAX_CONCURRENT_COPIES as u16).to_be_bytes()); // TOTAL CONCURRENT COPIES
    out.push(MAX_CONCURRENT_COPIES);
    out.push(9); // DATA SEGMENT GRANULARITY: 2^9 bytes (the smallest block)
    out.push(0); // INLINE DATA GRANULARITY
    out.push(0); // HELD DATA GRANULARITY
    out.extend([0u8; 3]);
    let codes = [SEG_BLOCK_TO_BLOCK, TGT_IDENTIFICATION];
    out.push(codes.len() as u8);
    out.extend(codes);
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// RECEIVE COPY RESULTS FAILED SEGMENT DETAILS (SPC-4 §6.23.6): the sense
/// data of the command that failed (empty: nothing failed; AVAILABLE DATA
/// is then zero).
pub fn failed_segment_details(sense: &[u8], out: &mut Vec<u8>) {
    if sense.is_empty() {
        out.extend(0u32.to_be_bytes());
        return;
    }
    let start = out.len();
    out.extend([0u8; 56]);
    out.push(0); // HDD: nothing held beyond this record
    out.push(0);
    out.extend((sense.len() as u16).to_be_bytes());
    out.extend_from_slice(sense);
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// Third-party Copy VPD page (SPC-4 §7.8.17) for a copy manager supporting
/// EXTENDED COPY (LID1) and RECEIVE COPY RESULTS (LID1 service actions):
/// Supported Commands, Parameter Data, Supported Descriptors, Supported
/// CSCD Descriptor IDs and General Copy Operations descriptors.
pub fn vpd_page(pq_type: u8, out: &mut Vec<u8>) {
    let at = out.len();
    out.extend([pq_type, 0x8f, 0, 0]);
    // Supported Commands (0001h).
    let mut cmds = vec![0u8];
    for (op, sas) in [
        (0x83u8, &[0x00u8][..]),
        (
            0x84,
            &[
                rcr::COPY_STATUS,
                rcr::RECEIVE_DATA,
                rcr::OPERATING_PARAMETERS,
                rcr::FAILED_SEGMENT_DETAILS,
            ][..],
        ),
    ] {
        cmds.push(op);
        cmds.push(sas.len() as u8);
        cmds.extend_from_slice(sas);
    }
    cmds[0] = (cmds.len() - 1) as u8;
    tpc_descriptor(out, 0x0001, &cmds);
    // Parameter Data (0004h).
    let mut p = vec![0u8; 4];
    p.extend(MAX_TARGET_DESCRIPTORS.to_be_bytes());
    p.extend(MAX_SEGMENT_DESCRIPTORS.to_be_bytes());
    p.extend(MAX_DESCRIPTOR_LIST_LENGTH.to_be_bytes());
    p.extend(MAX_INLINE_DATA_LENGTH.to_be_bytes());
    p.extend([0u8; 12]);
    tpc_descriptor(out, 0x0004, &p);
    // Supported Descriptors (0008h).
    tpc_descriptor(out, 0x0008, &[2, SEG_BLOCK_TO_BLOCK, TGT_IDENTIFICATION]);
    // Supported CSCD Descriptor IDs (000Ch): none beyond the descriptors.
    tpc_descriptor(out, 0x000c, &[0, 0]);
    // General Copy Operations (8001h).
    let mut g = Vec::new();
    g.extend((MAX_CONCURRENT_COPIES as u32).to_be_bytes());
    g.extend((MAX_CONCURRENT_COPIES as u32).to_be_bytes());
    g.extend(MAX_SEGMENT_LENGTH.to_be_bytes());
    g.push(9);
    g.push(0);
    g.extend([0u8; 14]);
    tpc_descriptor(out, 0x8001, &g);
    let len = (out.len() - at - 4) as u16;
    out[at + 2..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// One third-party copy descriptor: type, length, body padded to a
/// multiple of four bytes (SPC-4 §7.8.17.1).
fn tpc_descriptor(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
    let padded = body.len().div_ceil(4) * 4;
    out.extend(kind.to_be_bytes());
    out.extend((padded as u16).to_be_bytes());
    out.extend_from_slice(body);
    out.extend(std::iter::repeat_n(0u8, padded - body.len()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(list_id: u8, usage: u8, tdl: u16, sdl: u32) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_LEN];
        h[0] = list_id;
        h[1] = usage << 3;
        h[2..4].copy_from_slice(&tdl.to_be_bytes());
        h[8..12].copy_from_slice(&sdl.to_be_bytes());
        h
    }

    fn ident(naa: u64, block_len: u32) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0] = TGT_IDENTIFICATION;
        d[4] = 1;
        d[5] = 3;
        d[7] = 8;
        d[8..16].copy_from_slice(&naa.to_be_bytes());
        d[29..32].copy_from_slice(&block_len.to_be_bytes()[1..]);
        d
    }

    fn b2b(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
        let mut d = vec![0u8; 28];
        d[0] = SEG_BLOCK_TO_BLOCK;
        d[3] = 0x18;
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&src_lba.to_be_bytes());
        d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
        d
    }

    fn list(targets: usize, segments: usize) -> Vec<u8> {
        let mut v = header(1, 0, (targets * 32) as u16, (segments * 28) as u32);
        for _ in 0..targets {
            v.extend(ident(0x5001_4050_0000_0001, 512));
        }
        for _ in 0..segments {
            v.extend(b2b(0, 0, 8, 0, 100));
        }
        v
    }

    #[test]
    fn decodes_a_copy() {
        let p = parse(&list(1, 1)).unwrap();
        assert_eq!(p.list_id, 1);
        assert_eq!(p.usage, ListIdUsage::Hold);
        assert_eq!(p.targets.len(), 1);
        let t = &p.targets[0];
        assert_eq!((t.code_set, t.association, t.designator_type), (1, 0, 3));
        assert_eq!(t.designator, 0x5001_4050_0000_0001u64.to_be_bytes());
        assert_eq!((t.block_len, t.at), (512, 16));
        assert_eq!(
            p.segments,
            vec![Segment {
                at: 48,
                dc: false,
                src_index: 0,
                dst_index: 0,
                blocks: 8,
                src_lba: 0,
                dst_lba: 100
            }]
        );
    }

    #[test]
    fn header_errors() {
        let ok = list(1, 1);
        // Truncation inside either list.
        assert_eq!(parse(&ok[..47]), Err(Sense::PARAMETER_LIST_LENGTH_ERROR));
        assert_eq!(parse(&ok[..75]), Err(Sense::PARAMETER_LIST_LENGTH_ERROR));
        assert_eq!(parse(&ok[..10]), Err(Sense::PARAMETER_LIST_LENGTH_ERROR));
        // LIST ID USAGE 01b is reserved; 11b wants list id 0.
        let mut v = ok.clone();
        v[1] = 1 << 3;
        assert_eq!(
            parse(&v),
            Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(1, Some(4)))
        );
        v[1] = 3 << 3;
        assert_eq!(
            parse(&v),
            Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(0, None))
        );
        v[0] = 0;
        assert_eq!(parse(&v).unwrap().usage, ListIdUsage::None);
        // Inline data is not supported.
        let mut v = ok.clone();
        v[15] = 4;
        v.extend([0u8; 4]);
        assert_eq!(
            parse(&v),
            Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(12, None))
        );
    }

    #[test]
    fn descriptor_limits() {
        let n = MAX_TARGET_DESCRIPTORS as usize;
        assert!(parse(&list(n, 1)).is_ok());
        assert_eq!(
            parse(&list(n + 1, 1)),
            Err(Sense::TOO_MANY_TARGET_DESCRIPTORS)
        );
        let m = MAX_SEGMENT_DESCRIPTORS as usize;
        assert!(parse(&list(1, m)).is_ok());
        assert_eq!(
            parse(&list(1, m + 1)),
            Err(Sense::TOO_MANY_SEGMENT_DESCRIPTORS)
        );
        // Beyond MAXIMUM DESCRIPTOR LIST LENGTH, checked before the counts
        // (what libiscsi's ExtendedCopy.DescrLimits expects).
        let extra = (MAX_DESCRIPTOR_LIST_LENGTH as usize) / 28;
        assert_eq!(
            parse(&list(n + 1, extra)),
            Err(Sense::PARAMETER_LIST_LENGTH_ERROR)
        );
    }

    #[test]
    fn descriptor_types() {
        let mut v = list(1, 1);
        v[16] = 0xe0;
        assert_eq!(
            parse(&v),
            Err(Sense::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE)
        );
        let mut v = header(1, 0, 32, 20);
        v.extend(ident(1, 512));
        let mut s = vec![0u8; 20];
        s[0] = 0x03;
        s[3] = 16;
        v.extend(s);
        assert_eq!(
            parse(&v),
            Err(Sense::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE)
        );
        // A block device target only.
        let mut v = list(1, 1);
        v[17] = 0x01;
        assert_eq!(
            parse(&v),
            Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(17, Some(4)))
        );
    }

    #[test]
    fn results_data() {
        let mut v = Vec::new();
        copy_status_data(copy_status::COMPLETED_GOOD, 2, 1 << 20, &mut v);
        assert_eq!(v, [0, 0, 0, 8, 1, 0, 2, 0, 0, 0x10, 0, 0]);
        let mut v = Vec::new();
        copy_status_data(copy_status::COMPLETED_GOOD, 1, 1 << 33, &mut v);
        assert_eq!(&v[7..], &[1, 0, 0x80, 0, 0]);
        let mut v = Vec::new();
        operating_parameters(&mut v);
        assert_eq!(v.len(), 46);
        assert_eq!(be32(&v[0..4]), 42);
        assert_eq!(be16(&v[8..10]), MAX_TARGET_DESCRIPTORS);
        assert_eq!(be16(&v[10..12]), MAX_SEGMENT_DESCRIPTORS);
        assert_eq!(be32(&v[12..16]), MAX_DESCRIPTOR_LIST_LENGTH);
        assert_eq!((v[43], v[44], v[45]), (2, 0x02, 0xe4));
        let mut v = Vec::new();
        failed_segment_details(&[], &mut v);
        assert_eq!(v, [0, 0, 0, 0]);
        let mut v = Vec::new();
        failed_segment_details(&[0x70; 18], &mut v);
        assert_eq!(v.len(), 60 + 18);
        assert_eq!(be32(&v[0..4]), 74);
        assert_eq!(be16(&v[58..60]), 18);
    }

    #[test]
    fn third_party_copy_page() {
        let mut v = Vec::new();
        vpd_page(0, &mut v);
        assert_eq!(v[1], 0x8f);
        assert_eq!(be16(&v[2..4]) as usize, v.len() - 4);
        // Walk the descriptors: each a multiple of four bytes long.
        let mut at = 4;
        let mut kinds = Vec::new();
        while at < v.len() {
            let len = be16(&v[at + 2..at + 4]) as usize;
            assert_eq!(len % 4, 0);
            kinds.push(be16(&v[at..at + 2]));
            at += 4 + len;
        }
        assert_eq!(at, v.len());
        assert_eq!(kinds, [0x0001, 0x0004, 0x0008, 0x000c, 0x8001]);
        // Supported Commands: 83h with 00h, 84h with four service actions.
        assert_eq!(&v[8..17], &[9, 0x83, 1, 0x00, 0x84, 4, 0, 1, 3]);
    }
}
