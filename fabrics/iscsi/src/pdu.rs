//! The iSCSI PDU codec (RFC 7143 §11): the Basic Header Segment read in place,
//! builders for every PDU the target sends, sequence numbers with RFC 1982
//! serial arithmetic, CRC32C digests and padding.
//!
//! A received BHS is never copied into a struct: [`Bhs`] is a view over the 48
//! bytes with named offsets. Outgoing headers are built in a [`BhsBuf`].

use std::cmp::Ordering;
use std::fmt;

/// Length of the Basic Header Segment (RFC 7143 §11.2.1).
pub const BHS_LEN: usize = 48;
/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// The reserved tag value (RFC 7143 §11.2.1.8: 0xffffffff is reserved).
pub const RESERVED_TAG: u32 = 0xffff_ffff;
/// RFC 7143 §11.2.1.5: DataSegmentLength is 24 bits.
pub const MAX_DATA_SEGMENT_LEN: u32 = 0x00ff_ffff;

/// PDU opcodes (RFC 7143 §11.2.1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

impl Opcode {
    // Initiator opcodes.
    pub const NOP_OUT: Opcode = Opcode(0x00);
    pub const SCSI_CMD: Opcode = Opcode(0x01);
    pub const TMF_REQ: Opcode = Opcode(0x02);
    pub const LOGIN_REQ: Opcode = Opcode(0x03);
    pub const TEXT_REQ: Opcode = Opcode(0x04);
    pub const DATA_OUT: Opcode = Opcode(0x05);
    pub const LOGOUT_REQ: Opcode = Opcode(0x06);
    pub const SNACK: Opcode = Opcode(0x10);
    // Target opcodes.
    pub const NOP_IN: Opcode = Opcode(0x20);
    pub const SCSI_RSP: Opcode = Opcode(0x21);
    pub const TMF_RSP: Opcode = Opcode(0x22);
    pub const LOGIN_RSP: Opcode = Opcode(0x23);
    pub const TEXT_RSP: Opcode = Opcode(0x24);
    pub const DATA_IN: Opcode = Opcode(0x25);
    pub const LOGOUT_RSP: Opcode = Opcode(0x26);
    pub const R2T: Opcode = Opcode(0x31);
    pub const ASYNC_MSG: Opcode = Opcode(0x32);
    pub const REJECT: Opcode = Opcode(0x3f);
}

/// Byte-1 flag bits shared by several PDUs.
pub mod flags {
    /// F (final) bit.
    pub const F: u8 = 0x80;
    /// SCSI Command R bit; Login T (transit) bit is also 0x80.
    pub const R: u8 = 0x40;
    /// SCSI Command W bit.
    pub const W: u8 = 0x20;
    /// Text/Login C (continue) bit.
    pub const C: u8 = 0x40;
    /// Login T (transit) bit.
    pub const T: u8 = 0x80;
    /// Data-In A (acknowledge) bit.
    pub const A: u8 = 0x40;
    /// Residual overflow (Data-In, SCSI Response).
    pub const O: u8 = 0x04;
    /// Residual underflow (Data-In, SCSI Response).
    pub const U: u8 = 0x02;
    /// Data-In S (status) bit.
    pub const S: u8 = 0x01;
    /// SCSI Response bidirectional read residual overflow.
    pub const BIDI_O: u8 = 0x10;
    /// SCSI Response bidirectional read residual underflow.
    pub const BIDI_U: u8 = 0x08;
}

/// RFC 7143 §11.17.1 Reject reason codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    DataDigestError = 0x02,
    SnackReject = 0x03,
    ProtocolError = 0x04,
    CommandNotSupported = 0x05,
    ImmediateCommandReject = 0x06,
    TaskInProgress = 0x07,
    InvalidDataAck = 0x08,
    InvalidPduField = 0x09,
    LongOpReject = 0x0a,
    WaitingForLogout = 0x0c,
}

/// A view over a received 48-byte Basic Header Segment (RFC 7143 §11.2).
#[derive(Clone, Copy)]
pub struct Bhs<'a>(pub &'a [u8; BHS_LEN]);

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<'a> Bhs<'a> {
    /// The header at the start of `b`, if `b` holds at least 48 bytes.
    pub fn from_slice(b: &'a [u8]) -> Option<Bhs<'a>> {
        b.get(..BHS_LEN)
            .and_then(|s| <&[u8; BHS_LEN]>::try_from(s).ok())
            .map(Bhs)
    }
    pub fn bytes(&self) -> &'a [u8; BHS_LEN] {
        self.0
    }
    pub fn opcode(&self) -> Opcode {
        Opcode(self.0[0] & 0x3f)
    }
    /// I bit: immediate delivery (RFC 7143 §11.2.1.1).
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    pub fn final_bit(&self) -> bool {
        self.0[1] & flags::F != 0
    }
    /// TotalAHSLength in 4-byte words.
    pub fn total_ahs_len(&self) -> u8 {
        self.0[4]
    }
    pub fn data_segment_len(&self) -> u32 {
        u32::from_be_bytes([0, self.0[5], self.0[6], self.0[7]])
    }
    /// The raw 8-byte LUN field.
    pub fn lun(&self) -> [u8; 8] {
        let mut l = [0u8; 8];
        l.copy_from_slice(&self.0[8..16]);
        l
    }
    pub fn itt(&self) -> u32 {
        be32(self.0, 16)
    }
    /// Bytes 20..24: TTT (Data-Out, NOP-Out, Text), EDTL (SCSI Command),
    /// RefTaskTag (TMF).
    pub fn word20(&self) -> u32 {
        be32(self.0, 20)
    }
    pub fn ttt(&self) -> u32 {
        self.word20()
    }
    /// SCSI Command expected data transfer length.
    pub fn edtl(&self) -> u32 {
        self.word20()
    }
    pub fn cmd_sn(&self) -> CmdSn {
        CmdSn(be32(self.0, 24))
    }
    pub fn exp_stat_sn(&self) -> StatSn {
        StatSn(be32(self.0, 28))
    }
    /// SCSI Command CDB bytes (first 16).
    pub fn cdb(&self) -> &'a [u8] {
        &self.0[32..48]
    }
    pub fn data_sn(&self) -> DataSn {
        DataSn(be32(self.0, 36))
    }
    pub fn buffer_offset(&self) -> u32 {
        be32(self.0, 40)
    }
    pub fn word(&self, at: usize) -> u32 {
        be32(self.0, at)
    }
    pub fn half(&self, at: usize) -> u16 {
        be16(self.0, at)
    }
    // Login Request (RFC 7143 §11.12).
    pub fn login_transit(&self) -> bool {
        self.0[1] & flags::T != 0
    }
    pub fn login_continue(&self) -> bool {
        self.0[1] & flags::C != 0
    }
    pub fn login_csg(&self) -> u8 {
        (self.0[1] >> 2) & 3
    }
    pub fn login_nsg(&self) -> u8 {
        self.0[1] & 3
    }
    pub fn version_max(&self) -> u8 {
        self.0[2]
    }
    pub fn version_min(&self) -> u8 {
        self.0[3]
    }
    pub fn isid(&self) -> [u8; 6] {
        let mut i = [0u8; 6];
        i.copy_from_slice(&self.0[8..14]);
        i
    }
    pub fn tsih(&self) -> u16 {
        be16(self.0, 14)
    }
    /// Login/Logout CID.
    pub fn cid(&self) -> u16 {
        be16(self.0, 20)
    }
    /// TMF function / Logout reason: byte 1 without the F bit.
    pub fn function(&self) -> u8 {
        self.0[1] & 0x7f
    }
    /// Status class and detail (Login Response).
    pub fn login_status(&self) -> LoginStatus {
        LoginStatus {
            class: self.0[36],
            detail: self.0[37],
        }
    }
    /// StatSN of a target PDU.
    pub fn stat_sn(&self) -> StatSn {
        StatSn(be32(self.0, 24))
    }
    /// ExpCmdSN of a target PDU (at 28).
    pub fn exp_cmd_sn(&self) -> CmdSn {
        CmdSn(be32(self.0, 28))
    }
    /// MaxCmdSN of a target PDU (at 32).
    pub fn max_cmd_sn(&self) -> CmdSn {
        CmdSn(be32(self.0, 32))
    }
}

impl fmt::Debug for Bhs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Bhs(op={:#04x}, flags={:#04x}, itt={:#x}, dsl={})",
            self.opcode().0,
            self.flags(),
            self.itt(),
            self.data_segment_len()
        )
    }
}

/// An outgoing BHS under construction.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BhsBuf(pub [u8; BHS_LEN]);

impl fmt::Debug for BhsBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Bhs(&self.0).fmt(f)
    }
}

impl BhsBuf {
    pub fn new(op: Opcode, flags: u8) -> BhsBuf {
        let mut b = [0u8; BHS_LEN];
        b[0] = op.0;
        b[1] = flags;
        BhsBuf(b)
    }
    pub fn view(&self) -> Bhs<'_> {
        Bhs(&self.0)
    }
    pub fn set_u8(&mut self, at: usize, v: u8) -> &mut Self {
        self.0[at] = v;
        self
    }
    pub fn set_u16(&mut self, at: usize, v: u16) -> &mut Self {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes());
        self
    }
    pub fn set_u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes());
        self
    }
    pub fn set_immediate(&mut self) -> &mut Self {
        self.0[0] |= 0x40;
        self
    }
    pub fn set_data_len(&mut self, len: u32) -> &mut Self {
        let b = len.min(MAX_DATA_SEGMENT_LEN).to_be_bytes();
        self.0[5..8].copy_from_slice(&b[1..4]);
        self
    }
    pub fn set_ahs_len(&mut self, words: u8) -> &mut Self {
        self.0[4] = words;
        self
    }
    pub fn set_lun(&mut self, lun: [u8; 8]) -> &mut Self {
        self.0[8..16].copy_from_slice(&lun);
        self
    }
    pub fn set_itt(&mut self, itt: u32) -> &mut Self {
        self.set_u32(16, itt)
    }
    pub fn set_word20(&mut self, v: u32) -> &mut Self {
        self.set_u32(20, v)
    }
    /// StatSN, ExpCmdSN, MaxCmdSN at 24/28/32, as every target PDU carries.
    pub fn set_sns(&mut self, stat: StatSn, exp: CmdSn, max: CmdSn) -> &mut Self {
        self.set_u32(24, stat.0)
            .set_u32(28, exp.0)
            .set_u32(32, max.0)
    }
}

/// Status class and detail of a Login Response (RFC 7143 §11.13.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginStatus {
    pub class: u8,
    pub detail: u8,
}

impl LoginStatus {
    pub const SUCCESS: LoginStatus = LoginStatus::new(0, 0);
    pub const TARGET_MOVED_TEMP: LoginStatus = LoginStatus::new(1, 1);
    pub const TARGET_MOVED_PERM: LoginStatus = LoginStatus::new(1, 2);
    pub const INITIATOR_ERROR: LoginStatus = LoginStatus::new(2, 0);
    pub const AUTH_FAILURE: LoginStatus = LoginStatus::new(2, 1);
    pub const AUTHORIZATION_FAILURE: LoginStatus = LoginStatus::new(2, 2);
    pub const NOT_FOUND: LoginStatus = LoginStatus::new(2, 3);
    pub const TARGET_REMOVED: LoginStatus = LoginStatus::new(2, 4);
    pub const UNSUPPORTED_VERSION: LoginStatus = LoginStatus::new(2, 5);
    pub const TOO_MANY_CONNECTIONS: LoginStatus = LoginStatus::new(2, 6);
    pub const MISSING_PARAMETER: LoginStatus = LoginStatus::new(2, 7);
    pub const CANT_INCLUDE_IN_SESSION: LoginStatus = LoginStatus::new(2, 8);
    pub const SESSION_TYPE_NOT_SUPPORTED: LoginStatus = LoginStatus::new(2, 9);
    pub const SESSION_DOES_NOT_EXIST: LoginStatus = LoginStatus::new(2, 0x0a);
    pub const INVALID_DURING_LOGIN: LoginStatus = LoginStatus::new(2, 0x0b);
    pub const TARGET_ERROR: LoginStatus = LoginStatus::new(3, 0);
    pub const SERVICE_UNAVAILABLE: LoginStatus = LoginStatus::new(3, 1);
    pub const OUT_OF_RESOURCES: LoginStatus = LoginStatus::new(3, 2);

    pub const fn new(class: u8, detail: u8) -> LoginStatus {
        LoginStatus { class, detail }
    }
}

macro_rules! serial_number {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            /// The next number (wrapping).
            pub fn next(self) -> $name {
                $name(self.0.wrapping_add(1))
            }
            /// `self + n` (wrapping).
            pub fn plus(self, n: u32) -> $name {
                $name(self.0.wrapping_add(n))
            }
            /// `self - other` as a signed distance, RFC 1982 style.
            pub fn diff(self, other: $name) -> i32 {
                self.0.wrapping_sub(other.0) as i32
            }
            /// RFC 1982 §3.2 comparison; `None` when undefined (distance 2^31).
            pub fn serial_cmp(self, other: $name) -> Option<Ordering> {
                let d = self.0.wrapping_sub(other.0);
                if d == 0 {
                    Some(Ordering::Equal)
                } else if d == 0x8000_0000 {
                    None
                } else if d < 0x8000_0000 {
                    Some(Ordering::Greater)
                } else {
                    Some(Ordering::Less)
                }
            }
            pub fn lt(self, other: $name) -> bool {
                self.serial_cmp(other) == Some(Ordering::Less)
            }
            pub fn gt(self, other: $name) -> bool {
                self.serial_cmp(other) == Some(Ordering::Greater)
            }
        }
    };
}

serial_number!(
    /// Command sequence number (RFC 7143 §4.2.2.1).
    CmdSn
);
serial_number!(
    /// Status sequence number (RFC 7143 §4.2.2.2).
    StatSn
);
serial_number!(
    /// Data sequence number (RFC 7143 §4.2.2.3).
    DataSn
);
serial_number!(
    /// R2T sequence number (RFC 7143 §11.8.5).
    R2tSn
);

/// Bytes of padding after `len` data bytes (RFC 7143 §11.2.3: segments are
/// padded to a multiple of 4).
pub fn pad_len(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// CRC32C (RFC 7143 §12.1 / Appendix B) over `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continues a CRC32C over more bytes.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// RFC 7143 §11.2.1.6: a digest is sent in the byte order CRC32C produces,
/// least significant byte first on the wire.
pub fn digest_bytes(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// Reads a digest from the wire.
pub fn digest_from(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

/// A complete PDU held in memory: header, AHS and data segment. Used for
/// control PDUs and by the initiator; the target's data path never builds one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: BhsBuf,
    /// Additional header segments, already padded to 4 bytes.
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
}

/// Why a byte stream does not hold a valid PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("header digest mismatch")]
    HeaderDigest,
    #[error("data digest mismatch")]
    DataDigest,
    #[error("data segment of {0} bytes exceeds the limit")]
    TooLong(u32),
}

impl Pdu {
    pub fn new(bhs: BhsBuf) -> Pdu {
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    pub fn with_data(mut bhs: BhsBuf, data: Vec<u8>) -> Pdu {
        bhs.set_data_len(data.len() as u32);
        Pdu {
            bhs,
            ahs: Vec::new(),
            data,
        }
    }

    pub fn bhs(&self) -> Bhs<'_> {
        Bhs(&self.bhs.0)
    }

    /// Wire form with optional digests. TotalAHSLength and DataSegmentLength
    /// are set from the fields.
    pub fn encode(&self, header_digest: bool, data_digest: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(BHS_LEN + self.ahs.len() + self.data.len() + 12);
        encode_header(
            &self.bhs,
            &self.ahs,
            self.data.len() as u32,
            header_digest,
            &mut out,
        );
        if !self.data.is_empty() {
            out.extend_from_slice(&self.data);
            out.resize(out.len() + pad_len(self.data.len()), 0);
            if data_digest {
                let crc = crc32c(&out[out.len() - self.data.len() - pad_len(self.data.len())..]);
                out.extend_from_slice(&digest_bytes(crc));
            }
        }
        out
    }

    /// Parses one PDU from the front of `buf`. `Ok(None)` when more bytes are
    /// needed; otherwise the PDU and the bytes it took. Data segments longer
    /// than `max_data` are refused before anything is allocated.
    pub fn parse(
        buf: &[u8],
        header_digest: bool,
        data_digest: bool,
        max_data: u32,
    ) -> Result<Option<(Pdu, usize)>, PduError> {
        let Some(bhs) = Bhs::from_slice(buf) else {
            return Ok(None);
        };
        let ahs_len = bhs.total_ahs_len() as usize * 4;
        let hd = if header_digest { DIGEST_LEN } else { 0 };
        let dlen = bhs.data_segment_len();
        if dlen > max_data {
            return Err(PduError::TooLong(dlen));
        }
        let dlen = dlen as usize;
        let dd = if data_digest && dlen > 0 {
            DIGEST_LEN
        } else {
            0
        };
        let hdr_total = BHS_LEN + ahs_len + hd;
        let total = hdr_total + dlen + pad_len(dlen) + dd;
        if buf.len() < total {
            return Ok(None);
        }
        if header_digest {
            let crc = crc32c(&buf[..BHS_LEN + ahs_len]);
            let got = digest_from([
                buf[BHS_LEN + ahs_len],
                buf[BHS_LEN + ahs_len + 1],
                buf[BHS_LEN + ahs_len + 2],
                buf[BHS_LEN + ahs_len + 3],
            ]);
            if crc != got {
                return Err(PduError::HeaderDigest);
            }
        }
        if dd > 0 {
            let seg = &buf[hdr_total..hdr_total + dlen + pad_len(dlen)];
            let at = hdr_total + dlen + pad_len(dlen);
            let got = digest_from([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
            if crc32c(seg) != got {
                return Err(PduError::DataDigest);
            }
        }
        let mut hdr = [0u8; BHS_LEN];
        hdr.copy_from_slice(&buf[..BHS_LEN]);
        Ok(Some((
            Pdu {
                bhs: BhsBuf(hdr),
                ahs: buf[BHS_LEN..BHS_LEN + ahs_len].to_vec(),
                data: buf[hdr_total..hdr_total + dlen].to_vec(),
            },
            total,
        )))
    }
}

/// Appends BHS (+AHS) (+header digest) to `out`, filling in the lengths.
pub fn encode_header(
    bhs: &BhsBuf,
    ahs: &[u8],
    data_len: u32,
    header_digest: bool,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    let mut b = *bhs;
    b.set_data_len(data_len);
    b.set_ahs_len((ahs.len() / 4).min(255) as u8);
    out.extend_from_slice(&b.0);
    out.extend_from_slice(ahs);
    if header_digest {
        let crc = crc32c(&out[start..]);
        out.extend_from_slice(&digest_bytes(crc));
    }
}

// ---- Builders for the PDUs the target sends ----

/// The sequence numbers every target PDU carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sns {
    pub stat_sn: StatSn,
    pub exp_cmd_sn: CmdSn,
    pub max_cmd_sn: CmdSn,
}

/// Login Response (RFC 7143 §11.13).
#[allow(clippy::too_many_arguments)]
pub fn login_response(
    transit: bool,
    cont: bool,
    csg: u8,
    nsg: u8,
    isid: [u8; 6],
    tsih: u16,
    itt: u32,
    sns: Sns,
    status: LoginStatus,
) -> BhsBuf {
    let mut f = ((csg & 3) << 2) | (nsg & 3);
    if transit {
        f |= flags::T;
    }
    if cont {
        f |= flags::C;
    }
    let mut b = BhsBuf::new(Opcode::LOGIN_RSP, f);
    // Version-max and Version-active: 0x00 (RFC 7143 §11.13.2, §11.13.3).
    b.0[8..14].copy_from_slice(&isid);
    b.set_u16(14, tsih)
        .set_itt(itt)
        .set_sns(sns.stat_sn, sns.exp_cmd_sn, sns.max_cmd_sn)
        .set_u8(36, status.class)
        .set_u8(37, status.detail);
    b
}

/// Text Response (RFC 7143 §11.11).
pub fn text_response(
    final_: bool,
    cont: bool,
    lun: [u8; 8],
    itt: u32,
    ttt: u32,
    sns: Sns,
) -> BhsBuf {
    let mut f = 0;
    if final_ {
        f |= flags::F;
    }
    if cont {
        f |= flags::C;
    }
    let mut b = BhsBuf::new(Opcode::TEXT_RSP, f);
    b.set_lun(lun).set_itt(itt).set_word20(ttt).set_sns(
        sns.stat_sn,
        sns.exp_cmd_sn,
        sns.max_cmd_sn,
    );
    b
}

fn residual_bits(res: ferrite_core::Residual) -> (u8, u32) {
    match res {
        ferrite_core::Residual::None => (0, 0),
        ferrite_core::Residual::Underflow(n) => (flags::U, n),
        ferrite_core::Residual::Overflow(n) => (flags::O, n),
    }
}

/// SCSI Response (RFC 7143 §11.4); the data segment (SenseLength + sense) is
/// built by [`sense_segment`].
pub fn scsi_response(
    itt: u32,
    status: u8,
    residual: ferrite_core::Residual,
    bidi_residual: ferrite_core::Residual,
    exp_data_sn: DataSn,
    sns: Sns,
) -> BhsBuf {
    let (rf, rc) = residual_bits(residual);
    let (bf, bc) = residual_bits(bidi_residual);
    // Bidi read residual flags sit two bits higher (o = 0x10, u = 0x08).
    let bflags =
        ((bf & flags::O != 0) as u8 * flags::BIDI_O) | ((bf & flags::U != 0) as u8 * flags::BIDI_U);
    let mut b = BhsBuf::new(Opcode::SCSI_RSP, flags::F | rf | bflags);
    // Response 0x00: command completed at target (§11.4.3).
    b.set_u8(3, status)
        .set_itt(itt)
        .set_sns(sns.stat_sn, sns.exp_cmd_sn, sns.max_cmd_sn)
        .set_u32(36, exp_data_sn.0)
        .set_u32(40, bc)
        .set_u32(44, rc);
    b
}

/// RFC 7143 §11.4.7.2: SenseLength (2 bytes) followed by the sense data.
pub fn sense_segment(sense: &[u8]) -> Vec<u8> {
    let n = sense.len().min(u16::MAX as usize);
    let mut v = Vec::with_capacity(2 + n);
    v.extend_from_slice(&(n as u16).to_be_bytes());
    v.extend_from_slice(&sense[..n]);
    v
}

/// SCSI Data-In (RFC 7143 §11.7). With `status`, the S bit is set together
/// with F, the status byte and the residual.
#[allow(clippy::too_many_arguments)]
pub fn data_in(
    itt: u32,
    final_: bool,
    status: Option<(u8, ferrite_core::Residual)>,
    data_sn: DataSn,
    offset: u32,
    len: u32,
    sns: Sns,
) -> BhsBuf {
    let mut f = if final_ { flags::F } else { 0 };
    let mut rc = 0;
    if let Some((_, res)) = status {
        let (rf, c) = residual_bits(res);
        // RFC 7143 §11.7.1: S implies F.
        f |= flags::F | flags::S | rf;
        rc = c;
    }
    let mut b = BhsBuf::new(Opcode::DATA_IN, f);
    b.set_u8(3, status.map_or(0, |s| s.0))
        .set_data_len(len)
        .set_itt(itt)
        .set_word20(RESERVED_TAG)
        .set_u32(28, sns.exp_cmd_sn.0)
        .set_u32(32, sns.max_cmd_sn.0)
        .set_u32(36, data_sn.0)
        .set_u32(40, offset)
        .set_u32(44, rc);
    // StatSN is only meaningful with S (§11.7.4).
    if status.is_some() {
        b.set_u32(24, sns.stat_sn.0);
    }
    b
}

/// Ready To Transfer (RFC 7143 §11.8).
#[allow(clippy::too_many_arguments)]
pub fn r2t(
    lun: [u8; 8],
    itt: u32,
    ttt: u32,
    r2t_sn: R2tSn,
    offset: u32,
    len: u32,
    sns: Sns,
) -> BhsBuf {
    let mut b = BhsBuf::new(Opcode::R2T, flags::F);
    b.set_lun(lun)
        .set_itt(itt)
        .set_word20(ttt)
        .set_sns(sns.stat_sn, sns.exp_cmd_sn, sns.max_cmd_sn)
        .set_u32(36, r2t_sn.0)
        .set_u32(40, offset)
        .set_u32(44, len);
    b
}

/// NOP-In (RFC 7143 §11.19).
pub fn nop_in(lun: [u8; 8], itt: u32, ttt: u32, sns: Sns) -> BhsBuf {
    let mut b = BhsBuf::new(Opcode::NOP_IN, flags::F);
    b.set_lun(lun).set_itt(itt).set_word20(ttt).set_sns(
        sns.stat_sn,
        sns.exp_cmd_sn,
        sns.max_cmd_sn,
    );
    b
}

/// Logout Response (RFC 7143 §11.15).
pub fn logout_response(
    itt: u32,
    response: u8,
    time2wait: u16,
    time2retain: u16,
    sns: Sns,
) -> BhsBuf {
    let mut b = BhsBuf::new(Opcode::LOGOUT_RSP, flags::F);
    b.set_u8(2, response)
        .set_itt(itt)
        .set_sns(sns.stat_sn, sns.exp_cmd_sn, sns.max_cmd_sn)
        .set_u16(40, time2wait)
        .set_u16(42, time2retain);
    b
}

/// Reject (RFC 7143 §11.17); the data segment is the rejected header.
pub fn reject(reason: RejectReason, sns: Sns) -> BhsBuf {
    let mut b = BhsBuf::new(Opcode::REJECT, flags::F);
    b.set_u8(2, reason as u8).set_itt(RESERVED_TAG).set_sns(
        sns.stat_sn,
        sns.exp_cmd_sn,
        sns.max_cmd_sn,
    );
    b
}

/// Task Management Function Response (RFC 7143 §11.6).
pub fn tmf_response(itt: u32, response: u8, sns: Sns) -> BhsBuf {
    let mut b = BhsBuf::new(Opcode::TMF_RSP, flags::F);
    b.set_u8(2, response)
        .set_itt(itt)
        .set_sns(sns.stat_sn, sns.exp_cmd_sn, sns.max_cmd_sn);
    b
}

/// Asynchronous Message (RFC 7143 §11.9).
pub fn async_message(lun: [u8; 8], event: u8, params: [u16; 3], sns: Sns) -> BhsBuf {
    let mut b = BhsBuf::new(Opcode::ASYNC_MSG, flags::F);
    b.set_lun(lun)
        .set_itt(RESERVED_TAG)
        .set_word20(RESERVED_TAG)
        .set_sns(sns.stat_sn, sns.exp_cmd_sn, sns.max_cmd_sn)
        .set_u8(36, event)
        .set_u16(38, params[0])
        .set_u16(40, params[1])
        .set_u16(42, params[2]);
    b
}

/// RFC 7143 §11.6.1 TMF response codes.
pub mod tmf_rsp {
    pub const COMPLETE: u8 = 0;
    pub const TASK_DOES_NOT_EXIST: u8 = 1;
    pub const LUN_DOES_NOT_EXIST: u8 = 2;
    pub const TASK_STILL_ALLEGIANT: u8 = 3;
    pub const REASSIGN_NOT_SUPPORTED: u8 = 4;
    pub const NOT_SUPPORTED: u8 = 5;
    pub const AUTHORIZATION_FAILED: u8 = 6;
    /// RFC 7144 §4.2: the queried task or event exists.
    pub const SUCCEEDED: u8 = 7;
    pub const REJECTED: u8 = 255;

    /// The response's meaning in RFC 7143 §11.6.1, for logs.
    pub fn name(code: u8) -> &'static str {
        match code {
            COMPLETE => "function complete",
            TASK_DOES_NOT_EXIST => "task does not exist",
            LUN_DOES_NOT_EXIST => "LUN does not exist",
            TASK_STILL_ALLEGIANT => "task still allegiant",
            REASSIGN_NOT_SUPPORTED => "task allegiance reassignment not supported",
            NOT_SUPPORTED => "task management function not supported",
            AUTHORIZATION_FAILED => "function authorization failed",
            SUCCEEDED => "function succeeded",
            REJECTED => "function rejected",
            _ => "unknown response",
        }
    }
}

/// RFC 7143 §11.5.1 TMF function codes (and RFC 7144 §4 additions).
pub mod tmf_fn {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LUN_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;
    pub const QUERY_TASK: u8 = 9;
    pub const QUERY_TASK_SET: u8 = 10;
    pub const I_T_NEXUS_RESET: u8 = 11;
    pub const QUERY_ASYNC_EVENT: u8 = 12;

    /// The function's name in RFC 7143 §11.5.1 (RFC 7144 §4), for logs.
    pub fn name(code: u8) -> &'static str {
        match code {
            ABORT_TASK => "ABORT TASK",
            ABORT_TASK_SET => "ABORT TASK SET",
            CLEAR_ACA => "CLEAR ACA",
            CLEAR_TASK_SET => "CLEAR TASK SET",
            LUN_RESET => "LOGICAL UNIT RESET",
            TARGET_WARM_RESET => "TARGET WARM RESET",
            TARGET_COLD_RESET => "TARGET COLD RESET",
            TASK_REASSIGN => "TASK REASSIGN",
            QUERY_TASK => "QUERY TASK",
            QUERY_TASK_SET => "QUERY TASK SET",
            I_T_NEXUS_RESET => "I_T NEXUS RESET",
            QUERY_ASYNC_EVENT => "QUERY ASYNCHRONOUS EVENT",
            _ => "unknown function",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_arithmetic_wraps() {
        let a = CmdSn(0xffff_fffe);
        assert!(a.lt(a.plus(3)));
        assert!(a.plus(3).gt(a));
        assert_eq!(a.plus(3), CmdSn(1));
        assert_eq!(CmdSn(1).diff(a), 3);
        assert_eq!(CmdSn(0).serial_cmp(CmdSn(0x8000_0000)), None);
        assert!(!CmdSn(5).lt(CmdSn(5)));
    }

    #[test]
    fn pad_and_digest() {
        assert_eq!(pad_len(0), 0);
        assert_eq!(pad_len(1), 3);
        assert_eq!(pad_len(4), 0);
        assert_eq!(pad_len(7), 1);
        // RFC 7143 Appendix B.4 / RFC 3720 B.4: 32 bytes of zeros -> 0x8a9136aa.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        assert_eq!(crc32c_append(crc32c(&[0u8; 16]), &[0u8; 16]), 0x8a91_36aa);
    }

    #[test]
    fn bhs_view_reads_fields() {
        let mut b = BhsBuf::new(Opcode::SCSI_CMD, flags::F | flags::W | 1);
        b.set_immediate()
            .set_data_len(0x012345)
            .set_lun([0, 3, 0, 0, 0, 0, 0, 0])
            .set_itt(0xdead_beef)
            .set_word20(4096)
            .set_u32(24, 7)
            .set_u32(28, 9)
            .set_ahs_len(2);
        let v = b.view();
        assert_eq!(v.opcode(), Opcode::SCSI_CMD);
        assert!(v.immediate());
        assert!(v.final_bit());
        assert_eq!(v.data_segment_len(), 0x012345);
        assert_eq!(v.total_ahs_len(), 2);
        assert_eq!(v.lun(), [0, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(v.itt(), 0xdead_beef);
        assert_eq!(v.edtl(), 4096);
        assert_eq!(v.cmd_sn(), CmdSn(7));
        assert_eq!(v.exp_stat_sn(), StatSn(9));
        assert!(Bhs::from_slice(&[0u8; 47]).is_none());
    }

    #[test]
    fn pdu_round_trip_with_digests() {
        let p = Pdu::with_data(
            nop_in([0; 8], 5, RESERVED_TAG, Sns::default()),
            b"hello".to_vec(),
        );
        for (hd, dd) in [(false, false), (true, false), (false, true), (true, true)] {
            let wire = p.encode(hd, dd);
            assert_eq!(wire.len() % 4, 0);
            // Incomplete input asks for more.
            assert_eq!(Pdu::parse(&wire[..wire.len() - 1], hd, dd, 8192), Ok(None));
            let (q, n) = Pdu::parse(&wire, hd, dd, 8192).unwrap().unwrap();
            assert_eq!(n, wire.len());
            assert_eq!(q.data, b"hello");
            assert_eq!(q.bhs().itt(), 5);
            if hd {
                let mut bad = wire.clone();
                bad[3] ^= 1;
                assert_eq!(Pdu::parse(&bad, hd, dd, 8192), Err(PduError::HeaderDigest));
            }
            if dd {
                let mut bad = wire.clone();
                bad[BHS_LEN + if hd { 4 } else { 0 }] ^= 1;
                assert_eq!(Pdu::parse(&bad, hd, dd, 8192), Err(PduError::DataDigest));
            }
        }
        assert_eq!(
            Pdu::parse(&p.encode(false, false), false, false, 4),
            Err(PduError::TooLong(5))
        );
    }

    #[test]
    fn data_in_status_bits() {
        let sns = Sns {
            stat_sn: StatSn(10),
            exp_cmd_sn: CmdSn(3),
            max_cmd_sn: CmdSn(66),
        };
        let b = data_in(
            1,
            true,
            Some((0, ferrite_core::Residual::Underflow(512))),
            DataSn(2),
            1024,
            512,
            sns,
        );
        let v = b.view();
        assert_eq!(v.flags(), flags::F | flags::S | flags::U);
        assert_eq!(v.stat_sn(), StatSn(10));
        assert_eq!(v.word(44), 512);
        assert_eq!(v.data_sn(), DataSn(2));
        assert_eq!(v.buffer_offset(), 1024);
        let b = data_in(1, false, None, DataSn(0), 0, 512, sns);
        assert_eq!(b.view().flags(), 0);
        assert_eq!(b.view().stat_sn(), StatSn(0));
    }

    #[test]
    fn scsi_response_residuals() {
        let b = scsi_response(
            9,
            2,
            ferrite_core::Residual::Overflow(4),
            ferrite_core::Residual::Underflow(8),
            DataSn(0),
            Sns::default(),
        );
        let v = b.view();
        assert_eq!(v.flags(), flags::F | flags::O | flags::BIDI_U);
        assert_eq!(v.word(44), 4);
        assert_eq!(v.word(40), 8);
        assert_eq!(v.0[3], 2);
        assert_eq!(sense_segment(&[0x70, 0, 5]), vec![0, 3, 0x70, 0, 5]);
    }

    #[test]
    fn target_pdu_layouts() {
        let sns = Sns {
            stat_sn: StatSn(0x11),
            exp_cmd_sn: CmdSn(0x22),
            max_cmd_sn: CmdSn(0x33),
        };
        let check_sns = |b: &BhsBuf| {
            let v = b.view();
            assert_eq!(
                (v.stat_sn(), v.exp_cmd_sn(), v.max_cmd_sn()),
                (sns.stat_sn, sns.exp_cmd_sn, sns.max_cmd_sn)
            );
        };
        // RFC 7143 §11.13: Login Response.
        let b = login_response(
            true,
            false,
            1,
            3,
            [1, 2, 3, 4, 5, 6],
            0x0102,
            7,
            sns,
            LoginStatus::NOT_FOUND,
        );
        assert_eq!(b.0[0], 0x23);
        assert_eq!(b.0[1], 0x80 | (1 << 2) | 3);
        assert_eq!(&b.0[8..14], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(b.view().tsih(), 0x0102);
        assert_eq!((b.0[36], b.0[37]), (2, 3));
        check_sns(&b);
        // §11.8: R2T.
        let b = r2t([0, 1, 0, 0, 0, 0, 0, 0], 5, 6, R2tSn(2), 4096, 8192, sns);
        assert_eq!((b.0[0], b.0[1]), (0x31, 0x80));
        assert_eq!((b.view().itt(), b.view().ttt()), (5, 6));
        assert_eq!(
            (b.view().word(36), b.view().word(40), b.view().word(44)),
            (2, 4096, 8192)
        );
        assert_eq!(b.view().lun()[1], 1);
        check_sns(&b);
        // §11.15: Logout Response.
        let b = logout_response(9, 2, 3, 4, sns);
        assert_eq!((b.0[0], b.0[2]), (0x26, 2));
        assert_eq!((b.view().half(40), b.view().half(42)), (3, 4));
        check_sns(&b);
        // §11.17: Reject, ITT reserved.
        let b = reject(RejectReason::CommandNotSupported, sns);
        assert_eq!((b.0[0], b.0[2]), (0x3f, 0x05));
        assert_eq!(b.view().itt(), RESERVED_TAG);
        check_sns(&b);
        // §11.6: TMF Response.
        let b = tmf_response(8, tmf_rsp::REASSIGN_NOT_SUPPORTED, sns);
        assert_eq!((b.0[0], b.0[2], b.view().itt()), (0x22, 4, 8));
        // §11.9: Asynchronous Message.
        let b = async_message([0, 2, 0, 0, 0, 0, 0, 0], 1, [0, 0, 5], sns);
        assert_eq!((b.0[0], b.0[36], b.view().half(42)), (0x32, 1, 5));
        assert_eq!(b.view().itt(), RESERVED_TAG);
        check_sns(&b);
        // §11.19: NOP-In; §11.11: Text Response.
        let b = nop_in([0; 8], RESERVED_TAG, 0x77, sns);
        assert_eq!((b.0[0], b.view().ttt()), (0x20, 0x77));
        let b = text_response(false, true, [0; 8], 3, 0x99, sns);
        assert_eq!((b.0[0], b.0[1], b.view().ttt()), (0x24, 0x40, 0x99));
    }
}
