//! INQUIRY data (SPC-4 §6.6.2) and the vital product data pages (SPC-4 §7.8,
//! SBC-4 §6.6) this target reports. Builders append to a caller's `Vec` so
//! a buffer can be reused.

/// Peripheral device type: direct access block device (SBC).
pub const TYPE_DISK: u8 = 0x00;
/// Peripheral device type for "no device" with qualifier 011b.
pub const TYPE_UNKNOWN: u8 = 0x1f;
/// Peripheral qualifier 011b: the target cannot support a device at this LUN
/// (SPC-4 §6.6.2 table 141).
pub const QUALIFIER_NOT_SUPPORTED: u8 = 0x3;

/// VPD page codes.
pub mod vpd {
    pub const SUPPORTED_PAGES: u8 = 0x00;
    pub const UNIT_SERIAL_NUMBER: u8 = 0x80;
    pub const DEVICE_IDENTIFICATION: u8 = 0x83;
    pub const BLOCK_LIMITS: u8 = 0xb0;
    pub const BLOCK_DEVICE_CHARACTERISTICS: u8 = 0xb1;
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;
    /// Third-party Copy (SPC-4 §7.8.17), built by [`crate::xcopy::vpd_page`].
    pub const THIRD_PARTY_COPY: u8 = 0x8f;
}

/// Version descriptors (SPC-4 Annex E.9).
pub mod version {
    pub const SAM_5: u16 = 0x00a0;
    pub const SPC_4: u16 = 0x0460;
    /// SBC-3 (no version claimed): what initiators test for SBC-3 features.
    pub const SBC_3: u16 = 0x04c0;
}

/// What the standard INQUIRY data says about a logical unit.
#[derive(Clone, Copy, Debug)]
pub struct StandardInquiry<'a> {
    /// 0 (connected) or [`QUALIFIER_NOT_SUPPORTED`].
    pub qualifier: u8,
    pub device_type: u8,
    pub vendor: &'a str,
    pub product: &'a str,
    pub revision: &'a str,
    /// Vendor specific bytes 36..56, at most 20 ASCII characters (padded
    /// with spaces; all zeros when empty).
    pub vendor_specific: &'a str,
    /// TPGS field (0: no ALUA; 1: implicit).
    pub tpgs: u8,
    /// 3PC: the logical unit contains a copy manager (EXTENDED COPY).
    pub three_pc: bool,
    /// RMB: the medium is removable (START STOP UNIT with LOEJ, PREVENT
    /// ALLOW MEDIUM REMOVAL).
    pub rmb: bool,
}

fn put_ascii(out: &mut Vec<u8>, s: &str, width: usize) {
    // SPC-4 §4.3.1: ASCII data fields are left aligned and padded with spaces;
    // only 20h..7Eh are allowed.
    let mut n = 0;
    for c in s.bytes().filter(|c| (0x20..=0x7e).contains(c)).take(width) {
        out.push(c);
        n += 1;
    }
    out.extend(std::iter::repeat_n(b' ', width - n));
}

/// Standard INQUIRY data, 96 bytes (SPC-4 §6.6.2).
pub fn standard_inquiry(p: &StandardInquiry<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.push((p.qualifier << 5) | (p.device_type & 0x1f));
    // SPC-4 §6.6.2: RMB (bit 7), LU_CONG = 0.
    out.push(if p.rmb { 0x80 } else { 0 });
    out.push(0x06); // VERSION: SPC-4
    // NORMACA = 0, HISUP = 1, RESPONSE DATA FORMAT = 2.
    out.push(0x10 | 0x02);
    out.push(0); // ADDITIONAL LENGTH, set below
    // SCCS, ACC = 0, TPGS, 3PC, PROTECT = 0.
    out.push(((p.tpgs & 3) << 4) | if p.three_pc { 0x08 } else { 0 });
    out.push(0); // ENCSERV, MULTIP = 0
    out.push(0x02); // CMDQUE = 1 (SAM-5 full task management model)
    put_ascii(out, p.vendor, 8);
    put_ascii(out, p.product, 16);
    put_ascii(out, p.revision, 4);
    if p.vendor_specific.is_empty() {
        out.extend([0u8; 20]); // vendor specific (36..56)
    } else {
        put_ascii(out, p.vendor_specific, 20);
    }
    out.extend([0u8; 2]); // 56: clocking etc., 57 reserved
    for v in [version::SAM_5, version::SPC_4, version::SBC_3] {
        out.extend(v.to_be_bytes());
    }
    out.extend([0u8; 10]); // remaining version descriptors (58 + 16 = 74)
    out.extend([0u8; 22]); // reserved 74..96
    let len = out.len() - start;
    out[start + 4] = (len - 5) as u8;
}

fn vpd_header(out: &mut Vec<u8>, pq_type: u8, page: u8) -> usize {
    let at = out.len();
    out.extend([pq_type, page, 0, 0]);
    at
}

fn vpd_finish(out: &mut [u8], at: usize) {
    let len = (out.len() - at - 4) as u16;
    out[at + 2..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// Supported VPD pages (SPC-4 §7.8.16); `pages` must be in ascending order.
pub fn supported_pages(pq_type: u8, pages: &[u8], out: &mut Vec<u8>) {
    let at = vpd_header(out, pq_type, vpd::SUPPORTED_PAGES);
    out.extend_from_slice(pages);
    vpd_finish(out, at);
}

/// Unit serial number (SPC-4 §7.8.17).
pub fn unit_serial(pq_type: u8, serial: &str, out: &mut Vec<u8>) {
    let at = vpd_header(out, pq_type, vpd::UNIT_SERIAL_NUMBER);
    let s: Vec<u8> = serial
        .bytes()
        .filter(|c| (0x20..=0x7e).contains(c))
        .take(252)
        .collect();
    out.extend_from_slice(&s);
    vpd_finish(out, at);
}

/// SCSI transport protocol identifiers (SPC-4 §7.6.1 table 477), carried
/// with PIV = 1 in the designators of a target port or target device.
pub mod protocol {
    /// SCSI RDMA Protocol.
    pub const SRP: u8 = 0x4;
    /// iSCSI (over TCP or iSER).
    pub const ISCSI: u8 = 0x5;
}

/// One designator of the device identification page (SPC-4 §7.8.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Designator<'a> {
    /// NAA (type 3) of the logical unit: 8 bytes (NAA 2, 3, 5) or 16
    /// bytes (NAA 6).
    Naa(&'a [u8]),
    /// T10 vendor ID based (type 1) of the logical unit: the vendor padded
    /// to 8 characters, then the vendor specific identifier.
    T10 { vendor: &'a str, id: &'a str },
    /// The same, ending in a NUL its length counts.
    T10Nul { vendor: &'a str, id: &'a str },
    /// EUI-64 based (type 2) of the logical unit: 8, 12 or 16 bytes.
    Eui64(&'a [u8]),
    /// SCSI name string (type 8) of the logical unit.
    LuName(&'a str),
    /// Relative target port (type 4) of the port the command came through.
    RelPort(u16),
    /// Target port group (type 5) of that port.
    PortGroup(u16),
    /// Logical unit group (type 6).
    LuGroup(u16),
    /// SCSI name string (type 8) of the target port (`iqn...,t,0x0001`).
    PortName(&'a str),
    /// SCSI name string (type 8) of the target device (its iSCSI name).
    TargetName(&'a str),
}

// SPC-4 §7.8.6.1 table 459: association and designator type.
const ASSOC_LU: u8 = 0x00;
const ASSOC_PORT: u8 = 0x10;
const ASSOC_TARGET: u8 = 0x20;
const PIV: u8 = 0x80;
const CODE_BINARY: u8 = 1;
const CODE_ASCII: u8 = 2;
const CODE_UTF8: u8 = 3;

/// A designator's header and body; a port or target device designator
/// names its protocol (PIV = 1) when `protocol` is known.
fn designator(out: &mut Vec<u8>, protocol: Option<u8>, code_set: u8, assoc_type: u8, body: &[u8]) {
    let (proto, piv) = match protocol {
        Some(p) if assoc_type & 0x30 != ASSOC_LU => (p << 4, PIV),
        _ => (0, 0),
    };
    out.extend([proto | code_set, piv | assoc_type, 0, body.len() as u8]);
    out.extend_from_slice(body);
}

/// A SCSI name string body (§7.8.6.11): UTF-8, null terminated, padded to
/// a multiple of four bytes, at most 256 bytes.
fn name_string(name: &str) -> Vec<u8> {
    let mut b = name.as_bytes()[..name.len().min(251)].to_vec();
    b.push(0);
    while !b.len().is_multiple_of(4) {
        b.push(0);
    }
    b
}

fn id16(v: u16) -> [u8; 4] {
    let mut b = [0u8; 4];
    b[2..].copy_from_slice(&v.to_be_bytes());
    b
}

/// Device identification (SPC-4 §7.8.6): the designators of `ids`, in that
/// order. `protocol` is the port's transport protocol (see [`protocol`]).
pub fn device_identification(
    pq_type: u8,
    protocol: Option<u8>,
    ids: &[Designator<'_>],
    out: &mut Vec<u8>,
) {
    let at = vpd_header(out, pq_type, vpd::DEVICE_IDENTIFICATION);
    for d in ids {
        let p = protocol;
        match *d {
            Designator::Naa(b) => designator(out, p, CODE_BINARY, ASSOC_LU | 3, b),
            Designator::T10 { vendor, id } | Designator::T10Nul { vendor, id } => {
                let mut t10 = Vec::with_capacity(9 + id.len());
                put_ascii(&mut t10, vendor, 8);
                t10.extend(id.bytes().filter(|c| (0x20..=0x7e).contains(c)).take(246));
                if matches!(d, Designator::T10Nul { .. }) {
                    t10.push(0);
                }
                designator(out, p, CODE_ASCII, ASSOC_LU | 1, &t10);
            }
            Designator::Eui64(b) => designator(out, p, CODE_BINARY, ASSOC_LU | 2, b),
            Designator::LuName(n) => designator(out, p, CODE_UTF8, ASSOC_LU | 8, &name_string(n)),
            Designator::RelPort(r) => designator(out, p, CODE_BINARY, ASSOC_PORT | 4, &id16(r)),
            Designator::PortGroup(g) => designator(out, p, CODE_BINARY, ASSOC_PORT | 5, &id16(g)),
            Designator::LuGroup(g) => designator(out, p, CODE_BINARY, ASSOC_LU | 6, &id16(g)),
            Designator::PortName(n) => {
                designator(out, p, CODE_UTF8, ASSOC_PORT | 8, &name_string(n))
            }
            Designator::TargetName(n) => {
                designator(out, p, CODE_UTF8, ASSOC_TARGET | 8, &name_string(n))
            }
        }
    }
    vpd_finish(out, at);
}

/// What the block limits page reports, in logical blocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockLimits {
    pub opt_granularity: u16,
    pub max_transfer: u32,
    pub opt_transfer: u32,
    /// 0 when UNMAP is not supported.
    pub max_unmap_lbas: u32,
    pub max_unmap_descriptors: u32,
    pub unmap_granularity: u32,
    pub max_write_same: u64,
    /// MAXIMUM COMPARE AND WRITE LENGTH (0: not supported).
    pub max_compare_write: u8,
    /// MAXIMUM ATOMIC TRANSFER LENGTH (0: WRITE ATOMIC not supported);
    /// alignment and granularity are reported as 1 when it is set.
    pub max_atomic: u32,
}

/// Block limits (SBC-4 §6.6.4), page length 3Ch.
pub fn block_limits(pq_type: u8, l: &BlockLimits, out: &mut Vec<u8>) {
    let at = vpd_header(out, pq_type, vpd::BLOCK_LIMITS);
    out.push(0); // WSNZ = 0
    out.push(l.max_compare_write); // MAXIMUM COMPARE AND WRITE LENGTH
    out.extend(l.opt_granularity.to_be_bytes());
    out.extend(l.max_transfer.to_be_bytes());
    out.extend(l.opt_transfer.to_be_bytes());
    out.extend(0u32.to_be_bytes()); // MAXIMUM PREFETCH LENGTH
    out.extend(l.max_unmap_lbas.to_be_bytes());
    out.extend(l.max_unmap_descriptors.to_be_bytes());
    out.extend(l.unmap_granularity.to_be_bytes());
    out.extend(0u32.to_be_bytes()); // UGAVALID = 0, alignment
    out.extend(l.max_write_same.to_be_bytes());
    // SBC-4 §6.6.4 bytes 44..64: MAXIMUM ATOMIC TRANSFER LENGTH, ATOMIC
    // ALIGNMENT, ATOMIC TRANSFER LENGTH GRANULARITY, then the atomic
    // boundary limits (zero: no boundaries).
    out.extend(l.max_atomic.to_be_bytes());
    let one = u32::from(l.max_atomic != 0);
    out.extend(one.to_be_bytes());
    out.extend(one.to_be_bytes());
    out.extend([0u8; 8]);
    vpd_finish(out, at);
}

/// Block device characteristics (SBC-4 §6.6.2), page length 3Ch: MEDIUM
/// ROTATION RATE 0001h for non-rotating media, 0000h (not reported)
/// otherwise; WABEREQ (byte 7 bits 7..6) as given: what reads of a block
/// after a SANITIZE BLOCK ERASE return (01b: GOOD; 00b: block erase is not
/// supported). WACEREQ is 00b: no cryptographic erase.
pub fn block_device_characteristics(pq_type: u8, rotational: bool, wabereq: u8, out: &mut Vec<u8>) {
    let at = vpd_header(out, pq_type, vpd::BLOCK_DEVICE_CHARACTERISTICS);
    let rate: u16 = if rotational { 0 } else { 1 };
    out.extend(rate.to_be_bytes());
    // PRODUCT TYPE, then WABEREQ | WACEREQ | NOMINAL FORM FACTOR.
    out.push(0);
    out.push((wabereq & 0x03) << 6);
    out.extend([0u8; 56]);
    vpd_finish(out, at);
}

/// What the logical block provisioning page reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct Provisioning {
    /// UNMAP is supported.
    pub lbpu: bool,
    /// WRITE SAME (16) with UNMAP is supported.
    pub lbpws: bool,
    /// WRITE SAME (10) with UNMAP is supported.
    pub lbpws10: bool,
    /// Unmapped blocks read as zero.
    pub lbprz: bool,
    /// Thin provisioned (PROVISIONING TYPE 010b) rather than full (000b).
    pub thin: bool,
}

/// Logical block provisioning (SBC-4 §6.6.6), page length 4.
pub fn logical_block_provisioning(pq_type: u8, p: &Provisioning, out: &mut Vec<u8>) {
    let at = vpd_header(out, pq_type, vpd::LOGICAL_BLOCK_PROVISIONING);
    out.push(0); // THRESHOLD EXPONENT
    let mut b = 0u8;
    if p.lbpu {
        b |= 0x80;
    }
    if p.lbpws {
        b |= 0x40;
    }
    if p.lbpws10 {
        b |= 0x20;
    }
    if p.lbprz {
        b |= 0x04; // LBPRZ field 001b
    }
    out.push(b);
    out.push(if p.thin { 0x02 } else { 0x00 });
    out.push(0);
    vpd_finish(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_layout() {
        let mut v = Vec::new();
        standard_inquiry(
            &StandardInquiry {
                qualifier: 0,
                device_type: TYPE_DISK,
                vendor: "FERRITE",
                product: "disk\u{7f}é1",
                revision: "0.1",
                vendor_specific: "",
                tpgs: 0,
                three_pc: false,
                rmb: false,
            },
            &mut v,
        );
        assert_eq!(v.len(), 96);
        assert_eq!(v[4] as usize, 96 - 5);
        assert_eq!((v[0], v[1], v[2], v[3], v[7]), (0, 0, 6, 0x12, 0x02));
        assert_eq!(&v[8..16], b"FERRITE ");
        assert_eq!(&v[16..32], b"disk1           ");
        assert_eq!(&v[32..36], b"0.1 ");
        assert_eq!(&v[58..64], &[0x00, 0xa0, 0x04, 0x60, 0x04, 0xc0]);
        let mut v = Vec::new();
        standard_inquiry(
            &StandardInquiry {
                qualifier: QUALIFIER_NOT_SUPPORTED,
                device_type: TYPE_UNKNOWN,
                vendor: "",
                product: "",
                revision: "",
                vendor_specific: "V",
                tpgs: 1,
                three_pc: true,
                rmb: true,
            },
            &mut v,
        );
        assert_eq!((v[0], v[1], v[5]), (0x7f, 0x80, 0x18));
        assert_eq!(&v[36..40], b"V   ");
    }

    #[test]
    fn vpd_pages() {
        let mut v = Vec::new();
        supported_pages(0, &[0x00, 0x80, 0x83], &mut v);
        assert_eq!(v, [0, 0, 0, 3, 0x00, 0x80, 0x83]);
        let mut v = Vec::new();
        unit_serial(0, "ab\ncd", &mut v);
        assert_eq!(v, [0, 0x80, 0, 4, b'a', b'b', b'c', b'd']);
        let mut v = Vec::new();
        block_limits(
            0,
            &BlockLimits {
                max_transfer: 2048,
                ..Default::default()
            },
            &mut v,
        );
        assert_eq!(v.len(), 64);
        assert_eq!(v[3], 0x3c);
        assert_eq!(&v[8..12], &2048u32.to_be_bytes());
        let mut v = Vec::new();
        block_device_characteristics(0, false, 1, &mut v);
        assert_eq!((v.len(), v[3], v[5], v[7]), (64, 0x3c, 1, 0x40));
        let mut v = Vec::new();
        logical_block_provisioning(
            0,
            &Provisioning {
                lbpu: true,
                lbprz: true,
                thin: true,
                ..Default::default()
            },
            &mut v,
        );
        assert_eq!(v, [0, 0xb2, 0, 4, 0, 0x84, 0x02, 0]);
    }

    #[test]
    fn device_identification_designators() {
        let mut v = Vec::new();
        let naa = 0x6001_4050_0000_0001u64.to_be_bytes();
        device_identification(
            0,
            Some(protocol::ISCSI),
            &[
                Designator::Naa(&naa),
                Designator::T10 {
                    vendor: "FERRITE",
                    id: "SN1",
                },
                Designator::RelPort(2),
                Designator::TargetName("iqn.x"),
                Designator::PortGroup(0),
            ],
            &mut v,
        );
        assert_eq!(v[1], 0x83);
        let total = u16::from_be_bytes([v[2], v[3]]) as usize;
        assert_eq!(total + 4, v.len());
        // NAA first: no protocol on a logical unit designator.
        assert_eq!(&v[4..8], &[1, 0x03, 0, 8]);
        assert_eq!(&v[8..16], &naa);
        // T10 vendor ID.
        assert_eq!(&v[16..20], &[2, 0x01, 0, 11]);
        assert_eq!(&v[20..31], b"FERRITE SN1");
        // Relative target port, iSCSI with PIV.
        assert_eq!(&v[31..39], &[0x51, 0x94, 0, 4, 0, 0, 0, 2]);
        // SCSI name string, padded to 8.
        assert_eq!(&v[39..43], &[0x53, 0xa8, 0, 8]);
        assert_eq!(&v[43..51], b"iqn.x\0\0\0");
        assert_eq!(&v[51..59], &[0x51, 0x95, 0, 4, 0, 0, 0, 0]);
        // Without a protocol, and a 16-byte NAA.
        let mut v = Vec::new();
        device_identification(
            0,
            None,
            &[Designator::Naa(&[0x60; 16]), Designator::RelPort(1)],
            &mut v,
        );
        assert_eq!(&v[4..8], &[1, 0x03, 0, 16]);
        assert_eq!(&v[24..28], &[1, 0x14, 0, 4]);
    }
}
