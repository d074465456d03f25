//! SRP information units (T10 SRP r16a §5, byte layouts as Linux
//! `include/scsi/srp.h` has them): read-in-place views for what arrives and
//! builders for what is sent. Multi-byte fields are big-endian; tags are
//! opaque 8-byte values echoed as received.

use ferrite_rdma::RemoteSeg;
use smallvec::SmallVec;

/// IU type codes (SRP r16a §5.1, byte 0 of every IU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IuType(pub u8);

impl IuType {
    pub const LOGIN_REQ: IuType = IuType(0x00);
    pub const TSK_MGMT: IuType = IuType(0x01);
    pub const CMD: IuType = IuType(0x02);
    pub const I_LOGOUT: IuType = IuType(0x03);
    pub const LOGIN_RSP: IuType = IuType(0xc0);
    pub const RSP: IuType = IuType(0xc1);
    pub const LOGIN_REJ: IuType = IuType(0xc2);
    pub const T_LOGOUT: IuType = IuType(0x80);
    pub const CRED_REQ: IuType = IuType(0x81);
    pub const AER_REQ: IuType = IuType(0x82);
    pub const CRED_RSP: IuType = IuType(0x41);
    pub const AER_RSP: IuType = IuType(0x42);
}

/// Fixed sizes of the IUs.
pub const LOGIN_REQ_LEN: usize = 64;
pub const LOGIN_RSP_LEN: usize = 52;
pub const LOGIN_REJ_LEN: usize = 32;
pub const LOGOUT_LEN: usize = 16;
pub const TSK_MGMT_LEN: usize = 48;
pub const CMD_LEN: usize = 48;
pub const RSP_LEN: usize = 36;
pub const CRED_LEN: usize = 16;
pub const AER_REQ_LEN: usize = 36;
pub const AER_RSP_LEN: usize = 16;
/// A direct data buffer descriptor (SRP r16a §5.2.2): va, key, len.
pub const DIRECT_DESC_LEN: usize = 16;
/// The fixed part of an indirect descriptor (§5.2.3): table descriptor and
/// total length.
pub const INDIRECT_HDR_LEN: usize = 20;

/// Supported data buffer descriptor formats, as the login request and
/// response carry them (SRP r16a §6.2 REQUIRED/SUPPORTED BUFFER FORMATS).
pub const BUF_FORMAT_DIRECT: u16 = 1 << 1;
pub const BUF_FORMAT_INDIRECT: u16 = 1 << 2;

/// Multi-channel action of SRP_LOGIN_REQ (§6.2), bits 1:0 of REQ_FLAGS.
pub const MULTICHAN_SINGLE: u8 = 0;
pub const MULTICHAN_MULTI: u8 = 1;
/// Multi-channel result of SRP_LOGIN_RSP (§6.3), bits 1:0 of RSP_FLAGS.
pub const LOGIN_RSP_NO_CHANNEL: u8 = 0;
pub const LOGIN_RSP_TERMINATED: u8 = 1;
pub const LOGIN_RSP_MAINTAINED: u8 = 2;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Why bytes are not a valid IU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IuError {
    #[error("IU of {got} bytes is shorter than {need}")]
    Short { need: usize, got: usize },
    #[error("IU type {0:#04x} where another was expected")]
    WrongType(u8),
    #[error("data-out descriptor format {0} is not supported")]
    DataOutFormat(u8),
    #[error("data-in descriptor format {0} is not supported")]
    DataInFormat(u8),
    #[error("data-out descriptor count is invalid")]
    DataOutCount,
    #[error("data-in descriptor count is invalid")]
    DataInCount,
}

fn need(b: &[u8], n: usize, t: IuType) -> Result<(), IuError> {
    if b.len() < n {
        return Err(IuError::Short {
            need: n,
            got: b.len(),
        });
    }
    if b[0] != t.0 {
        return Err(IuError::WrongType(b[0]));
    }
    Ok(())
}

/// The type byte of any IU.
pub fn iu_type(b: &[u8]) -> Option<IuType> {
    b.first().map(|&t| IuType(t))
}

/// The tag of any IU (bytes 8..16), if it is long enough to carry one.
pub fn iu_tag(b: &[u8]) -> Option<u64> {
    (b.len() >= 16).then(|| be64(b, 8))
}

// ---------------------------------------------------------------- login

/// SRP_LOGIN_REQ (SRP r16a §6.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginReq {
    pub tag: u64,
    /// Largest initiator-to-target IU the initiator will send.
    pub req_it_iu_len: u32,
    pub req_buf_fmt: u16,
    pub req_flags: u8,
    pub initiator_port_id: [u8; 16],
    pub target_port_id: [u8; 16],
}

impl LoginReq {
    pub fn parse(b: &[u8]) -> Result<LoginReq, IuError> {
        need(b, LOGIN_REQ_LEN, IuType::LOGIN_REQ)?;
        let mut ini = [0u8; 16];
        ini.copy_from_slice(&b[32..48]);
        let mut tgt = [0u8; 16];
        tgt.copy_from_slice(&b[48..64]);
        Ok(LoginReq {
            tag: be64(b, 8),
            req_it_iu_len: be32(b, 16),
            req_buf_fmt: be16(b, 24),
            req_flags: b[26],
            initiator_port_id: ini,
            target_port_id: tgt,
        })
    }

    pub fn encode(&self) -> [u8; LOGIN_REQ_LEN] {
        let mut b = [0u8; LOGIN_REQ_LEN];
        b[0] = IuType::LOGIN_REQ.0;
        put64(&mut b, 8, self.tag);
        put32(&mut b, 16, self.req_it_iu_len);
        put16(&mut b, 24, self.req_buf_fmt);
        b[26] = self.req_flags;
        b[32..48].copy_from_slice(&self.initiator_port_id);
        b[48..64].copy_from_slice(&self.target_port_id);
        b
    }
}

/// SRP_LOGIN_RSP (SRP r16a §6.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginRsp {
    pub tag: u64,
    /// The initial request limit: credits the initiator starts with.
    pub req_lim_delta: u32,
    pub max_it_iu_len: u32,
    pub max_ti_iu_len: u32,
    pub buf_fmt: u16,
    pub rsp_flags: u8,
}

impl LoginRsp {
    pub fn parse(b: &[u8]) -> Result<LoginRsp, IuError> {
        need(b, LOGIN_RSP_LEN, IuType::LOGIN_RSP)?;
        Ok(LoginRsp {
            req_lim_delta: be32(b, 4),
            tag: be64(b, 8),
            max_it_iu_len: be32(b, 16),
            max_ti_iu_len: be32(b, 20),
            buf_fmt: be16(b, 24),
            rsp_flags: b[26],
        })
    }

    pub fn encode(&self) -> [u8; LOGIN_RSP_LEN] {
        let mut b = [0u8; LOGIN_RSP_LEN];
        b[0] = IuType::LOGIN_RSP.0;
        put32(&mut b, 4, self.req_lim_delta);
        put64(&mut b, 8, self.tag);
        put32(&mut b, 16, self.max_it_iu_len);
        put32(&mut b, 20, self.max_ti_iu_len);
        put16(&mut b, 24, self.buf_fmt);
        b[26] = self.rsp_flags;
        b
    }
}

/// SRP_LOGIN_REJ reason codes (SRP r16a §6.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginRejReason(pub u32);

impl LoginRejReason {
    pub const UNABLE_TO_ESTABLISH: LoginRejReason = LoginRejReason(0x0001_0000);
    pub const INSUFFICIENT_RESOURCES: LoginRejReason = LoginRejReason(0x0001_0001);
    pub const IT_IU_LENGTH_TOO_LARGE: LoginRejReason = LoginRejReason(0x0001_0002);
    pub const UNABLE_TO_ASSOCIATE: LoginRejReason = LoginRejReason(0x0001_0003);
    pub const UNSUPPORTED_DESCRIPTOR_FORMAT: LoginRejReason = LoginRejReason(0x0001_0004);
    pub const MULTI_CHANNEL_UNSUPPORTED: LoginRejReason = LoginRejReason(0x0001_0005);
    pub const CHANNEL_LIMIT_REACHED: LoginRejReason = LoginRejReason(0x0001_0006);
}

/// SRP_LOGIN_REJ (SRP r16a §6.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginRej {
    pub tag: u64,
    pub reason: LoginRejReason,
    /// The formats the target supports.
    pub buf_fmt: u16,
}

impl LoginRej {
    pub fn parse(b: &[u8]) -> Result<LoginRej, IuError> {
        need(b, LOGIN_REJ_LEN, IuType::LOGIN_REJ)?;
        Ok(LoginRej {
            reason: LoginRejReason(be32(b, 4)),
            tag: be64(b, 8),
            buf_fmt: be16(b, 24),
        })
    }

    pub fn encode(&self) -> [u8; LOGIN_REJ_LEN] {
        let mut b = [0u8; LOGIN_REJ_LEN];
        b[0] = IuType::LOGIN_REJ.0;
        put32(&mut b, 4, self.reason.0);
        put64(&mut b, 8, self.tag);
        put16(&mut b, 24, self.buf_fmt);
        b
    }
}

// ---------------------------------------------------------------- logout

/// SRP_I_LOGOUT (SRP r16a §6.5): 16 bytes, a type and a tag.
pub fn i_logout(tag: u64) -> [u8; LOGOUT_LEN] {
    let mut b = [0u8; LOGOUT_LEN];
    b[0] = IuType::I_LOGOUT.0;
    put64(&mut b, 8, tag);
    b
}

/// SRP_T_LOGOUT reason codes (SRP r16a §6.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TLogoutReason(pub u32);

impl TLogoutReason {
    pub const NO_REASON: TLogoutReason = TLogoutReason(0);
    pub const INACTIVE_CHANNEL: TLogoutReason = TLogoutReason(1);
    pub const INVALID_IU_TYPE: TLogoutReason = TLogoutReason(2);
    pub const UNEXPECTED_RESPONSE: TLogoutReason = TLogoutReason(3);
    pub const MULTI_CHANNEL_ACTION: TLogoutReason = TLogoutReason(4);
    pub const UNSUPPORTED_DATA_OUT_FORMAT: TLogoutReason = TLogoutReason(6);
    pub const UNSUPPORTED_DATA_IN_FORMAT: TLogoutReason = TLogoutReason(7);
    pub const INVALID_DATA_OUT_COUNT: TLogoutReason = TLogoutReason(8);
    pub const INVALID_DATA_IN_COUNT: TLogoutReason = TLogoutReason(9);
}

/// SRP_T_LOGOUT (SRP r16a §6.6).
pub fn t_logout(tag: u64, reason: TLogoutReason) -> [u8; LOGOUT_LEN] {
    let mut b = [0u8; LOGOUT_LEN];
    b[0] = IuType::T_LOGOUT.0;
    put32(&mut b, 4, reason.0);
    put64(&mut b, 8, tag);
    b
}

/// The reason of an SRP_T_LOGOUT.
pub fn t_logout_reason(b: &[u8]) -> Result<TLogoutReason, IuError> {
    need(b, LOGOUT_LEN, IuType::T_LOGOUT)?;
    Ok(TLogoutReason(be32(b, 4)))
}

// ---------------------------------------------------------------- credits, AER

/// SRP_CRED_REQ (SRP r16a §6.10) or SRP_AER_REQ's common head: type, tag
/// and request limit delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CredReq {
    pub tag: u64,
    pub req_lim_delta: u32,
}

impl CredReq {
    pub fn parse(b: &[u8]) -> Result<CredReq, IuError> {
        need(b, CRED_LEN, IuType::CRED_REQ)?;
        Ok(CredReq {
            req_lim_delta: be32(b, 4),
            tag: be64(b, 8),
        })
    }

    pub fn encode(&self) -> [u8; CRED_LEN] {
        let mut b = [0u8; CRED_LEN];
        b[0] = IuType::CRED_REQ.0;
        put32(&mut b, 4, self.req_lim_delta);
        put64(&mut b, 8, self.tag);
        b
    }
}

/// SRP_CRED_RSP (§6.11) and SRP_AER_RSP (§6.13): 16 bytes, type and tag.
pub fn simple_rsp(t: IuType, tag: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = t.0;
    put64(&mut b, 8, tag);
    b
}

/// SRP_AER_REQ (SRP r16a §6.12): an asynchronous event with sense data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AerReq {
    pub tag: u64,
    pub req_lim_delta: u32,
    pub lun: u64,
    pub sense: Vec<u8>,
}

impl AerReq {
    pub fn parse(b: &[u8]) -> Result<AerReq, IuError> {
        need(b, AER_REQ_LEN, IuType::AER_REQ)?;
        let n = be32(b, 28) as usize;
        let sense = b
            .get(AER_REQ_LEN..AER_REQ_LEN.saturating_add(n))
            .ok_or(IuError::Short {
                need: AER_REQ_LEN.saturating_add(n),
                got: b.len(),
            })?;
        Ok(AerReq {
            req_lim_delta: be32(b, 4),
            tag: be64(b, 8),
            lun: be64(b, 20),
            sense: sense.to_vec(),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; AER_REQ_LEN + self.sense.len()];
        b[0] = IuType::AER_REQ.0;
        put32(&mut b, 4, self.req_lim_delta);
        put64(&mut b, 8, self.tag);
        put64(&mut b, 20, self.lun);
        put32(&mut b, 28, self.sense.len() as u32);
        b[AER_REQ_LEN..].copy_from_slice(&self.sense);
        b
    }
}

// ---------------------------------------------------------------- task management

/// SRP task management function codes (SRP r16a §6.7, table 21).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TskFunc(pub u8);

impl TskFunc {
    pub const ABORT_TASK: TskFunc = TskFunc(0x01);
    pub const ABORT_TASK_SET: TskFunc = TskFunc(0x02);
    pub const CLEAR_TASK_SET: TskFunc = TskFunc(0x04);
    pub const LUN_RESET: TskFunc = TskFunc(0x08);
    pub const CLEAR_ACA: TskFunc = TskFunc(0x40);
}

/// SRP_TSK_MGMT (SRP r16a §6.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TskMgmt {
    pub tag: u64,
    pub lun: [u8; 8],
    pub func: TskFunc,
    /// The task ABORT TASK refers to.
    pub task_tag: u64,
}

impl TskMgmt {
    pub fn parse(b: &[u8]) -> Result<TskMgmt, IuError> {
        need(b, TSK_MGMT_LEN, IuType::TSK_MGMT)?;
        let mut lun = [0u8; 8];
        lun.copy_from_slice(&b[20..28]);
        Ok(TskMgmt {
            tag: be64(b, 8),
            lun,
            func: TskFunc(b[30]),
            task_tag: be64(b, 32),
        })
    }

    pub fn encode(&self) -> [u8; TSK_MGMT_LEN] {
        let mut b = [0u8; TSK_MGMT_LEN];
        b[0] = IuType::TSK_MGMT.0;
        put64(&mut b, 8, self.tag);
        b[20..28].copy_from_slice(&self.lun);
        b[30] = self.func.0;
        put64(&mut b, 32, self.task_tag);
        b
    }
}

// ---------------------------------------------------------------- SRP_CMD

/// Data buffer descriptor formats of SRP_CMD (SRP r16a §6.8, table 24).
pub const DESC_NONE: u8 = 0;
pub const DESC_DIRECT: u8 = 1;
pub const DESC_INDIRECT: u8 = 2;

/// SRP_CMD task attribute codes (SRP r16a §6.8, TASK ATTRIBUTE, bits 2:0).
pub const TASK_ATTR_SIMPLE: u8 = 0;
pub const TASK_ATTR_HEAD_OF_QUEUE: u8 = 1;
pub const TASK_ATTR_ORDERED: u8 = 2;
pub const TASK_ATTR_ACA: u8 = 4;

/// One direction's data buffer, decoded from an SRP_CMD.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum DataBuf {
    /// No data in this direction.
    #[default]
    None,
    /// The complete descriptor list (direct, or indirect with every
    /// descriptor inline).
    Segs(SmallVec<[RemoteSeg; 4]>),
    /// An indirect buffer whose descriptor table is not (fully) inline: the
    /// table must be fetched from `table` by RDMA READ (§5.2.3). `total` is
    /// the total data length from the indirect header.
    Table { table: RemoteSeg, total: u32 },
}

impl DataBuf {
    /// Total bytes this buffer can hold.
    pub fn total(&self) -> u64 {
        match self {
            DataBuf::None => 0,
            DataBuf::Segs(s) => s.iter().map(|d| d.len as u64).sum(),
            DataBuf::Table { total, .. } => *total as u64,
        }
    }
}

/// Parses a direct descriptor (§5.2.2) at `b[..16]`.
pub fn direct_desc(b: &[u8]) -> RemoteSeg {
    RemoteSeg {
        addr: be64(b, 0),
        rkey: be32(b, 8),
        len: be32(b, 12),
    }
}

fn put_direct(b: &mut [u8], d: &RemoteSeg) {
    put64(b, 0, d.addr);
    put32(b, 8, d.rkey);
    put32(b, 12, d.len);
}

/// Parses a descriptor table fetched from the initiator (16 bytes each).
pub fn parse_table(b: &[u8]) -> SmallVec<[RemoteSeg; 4]> {
    b.chunks_exact(DIRECT_DESC_LEN).map(direct_desc).collect()
}

/// A parsed SRP_CMD (SRP r16a §6.8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cmd {
    pub tag: u64,
    pub lun: [u8; 8],
    pub task_attr: u8,
    /// CDB, 16 bytes plus the additional CDB.
    pub cdb: SmallVec<[u8; 16]>,
    pub data_out: DataBuf,
    pub data_in: DataBuf,
}

impl Cmd {
    /// Parses an SRP_CMD, descriptors included.
    pub fn parse(b: &[u8]) -> Result<Cmd, IuError> {
        need(b, CMD_LEN, IuType::CMD)?;
        let fmt = b[5];
        let (out_fmt, in_fmt) = (fmt >> 4, fmt & 0x0f);
        let (out_cnt, in_cnt) = (b[6] as usize, b[7] as usize);
        // §6.8: ADDITIONAL CDB LENGTH is in 4-byte words, bits 7:2.
        let add_cdb = (b[31] >> 2) as usize * 4;
        let mut at = CMD_LEN + add_cdb;
        let cdb_bytes = b.get(32..at).ok_or(IuError::Short {
            need: at,
            got: b.len(),
        })?;
        let mut lun = [0u8; 8];
        lun.copy_from_slice(&b[20..28]);
        let data_out = Self::desc(b, &mut at, out_fmt, out_cnt, true)?;
        let data_in = Self::desc(b, &mut at, in_fmt, in_cnt, false)?;
        Ok(Cmd {
            tag: be64(b, 8),
            lun,
            task_attr: b[29] & 0x07,
            cdb: SmallVec::from_slice(cdb_bytes),
            data_out,
            data_in,
        })
    }

    fn desc(b: &[u8], at: &mut usize, fmt: u8, cnt: usize, out: bool) -> Result<DataBuf, IuError> {
        let (bad_fmt, bad_cnt) = if out {
            (IuError::DataOutFormat(fmt), IuError::DataOutCount)
        } else {
            (IuError::DataInFormat(fmt), IuError::DataInCount)
        };
        let short = |need: usize| IuError::Short { need, got: b.len() };
        match fmt {
            DESC_NONE => Ok(DataBuf::None),
            DESC_DIRECT => {
                let d = b
                    .get(*at..*at + DIRECT_DESC_LEN)
                    .ok_or(short(*at + DIRECT_DESC_LEN))?;
                *at += DIRECT_DESC_LEN;
                Ok(DataBuf::Segs(smallvec::smallvec![direct_desc(d)]))
            }
            DESC_INDIRECT => {
                let h = b
                    .get(*at..*at + INDIRECT_HDR_LEN)
                    .ok_or(short(*at + INDIRECT_HDR_LEN))?;
                let table = direct_desc(&h[..16]);
                let total = be32(h, 16);
                *at += INDIRECT_HDR_LEN;
                // §5.2.3: the table holds table.len / 16 descriptors; the
                // IU carries the first `cnt` of them (the partial table).
                if !(table.len as usize).is_multiple_of(DIRECT_DESC_LEN) || table.len == 0 {
                    return Err(bad_cnt);
                }
                let full = table.len as usize / DIRECT_DESC_LEN;
                if cnt > full {
                    return Err(bad_cnt);
                }
                let inline = cnt * DIRECT_DESC_LEN;
                let list = b.get(*at..*at + inline).ok_or(short(*at + inline))?;
                *at += inline;
                if cnt == full {
                    let segs = parse_table(list);
                    let sum: u64 = segs.iter().map(|d| d.len as u64).sum();
                    if sum != total as u64 {
                        return Err(bad_cnt);
                    }
                    Ok(DataBuf::Segs(segs))
                } else {
                    Ok(DataBuf::Table { table, total })
                }
            }
            _ => Err(bad_fmt),
        }
    }
}

/// Builds an SRP_CMD. Buffers given as `Segs` with more than one descriptor
/// (or as `Table`) use the indirect format; `inline_max` limits how many
/// descriptors of an indirect list are copied into the IU (the rest must be
/// fetched from `table_addr`).
#[derive(Clone, Debug)]
pub struct CmdBuilder<'a> {
    pub tag: u64,
    pub lun: [u8; 8],
    pub task_attr: u8,
    pub cdb: &'a [u8],
    pub data_out: &'a [RemoteSeg],
    pub data_in: &'a [RemoteSeg],
    /// Where the initiator keeps the full descriptor table of each
    /// direction (used when a list has more than one entry).
    pub out_table: Option<RemoteSeg>,
    pub in_table: Option<RemoteSeg>,
    /// Descriptors copied inline per indirect list.
    pub inline_max: usize,
}

impl CmdBuilder<'_> {
    pub fn encode(&self) -> Vec<u8> {
        let add_cdb = self.cdb.len().saturating_sub(16).next_multiple_of(4);
        let mut b = vec![0u8; CMD_LEN + add_cdb];
        b[0] = IuType::CMD.0;
        put64(&mut b, 8, self.tag);
        b[20..28].copy_from_slice(&self.lun);
        b[29] = self.task_attr & 0x07;
        b[31] = ((add_cdb / 4) as u8) << 2;
        b[32..32 + self.cdb.len()].copy_from_slice(self.cdb);
        let (out_fmt, out_cnt) =
            Self::put_desc(&mut b, self.data_out, self.out_table, self.inline_max);
        let (in_fmt, in_cnt) = Self::put_desc(&mut b, self.data_in, self.in_table, self.inline_max);
        b[5] = (out_fmt << 4) | in_fmt;
        b[6] = out_cnt;
        b[7] = in_cnt;
        b
    }

    fn put_desc(
        b: &mut Vec<u8>,
        segs: &[RemoteSeg],
        table: Option<RemoteSeg>,
        inline_max: usize,
    ) -> (u8, u8) {
        match (segs, table) {
            ([], _) => (DESC_NONE, 0),
            ([one], None) => {
                let at = b.len();
                b.resize(at + DIRECT_DESC_LEN, 0);
                put_direct(&mut b[at..], one);
                (DESC_DIRECT, 0)
            }
            (many, table) => {
                let table = table.unwrap_or(RemoteSeg {
                    addr: 0,
                    rkey: 0,
                    len: (many.len() * DIRECT_DESC_LEN) as u32,
                });
                let n = many.len().min(inline_max).min(255);
                let at = b.len();
                b.resize(at + INDIRECT_HDR_LEN + n * DIRECT_DESC_LEN, 0);
                put_direct(&mut b[at..], &table);
                let total: u64 = many.iter().map(|d| d.len as u64).sum();
                put32(b, at + 16, total as u32);
                for (k, d) in many[..n].iter().enumerate() {
                    put_direct(&mut b[at + INDIRECT_HDR_LEN + k * DIRECT_DESC_LEN..], d);
                }
                (DESC_INDIRECT, n as u8)
            }
        }
    }
}

/// Encodes a descriptor table as it lies in the initiator's memory.
pub fn encode_table(segs: &[RemoteSeg]) -> Vec<u8> {
    let mut b = vec![0u8; segs.len() * DIRECT_DESC_LEN];
    for (k, d) in segs.iter().enumerate() {
        put_direct(&mut b[k * DIRECT_DESC_LEN..], d);
    }
    b
}

// ---------------------------------------------------------------- SRP_RSP

/// SRP_RSP flag bits (SRP r16a §6.9).
pub const RSP_FLAG_RSPVALID: u8 = 1 << 0;
pub const RSP_FLAG_SNSVALID: u8 = 1 << 1;
pub const RSP_FLAG_DOOVER: u8 = 1 << 2;
pub const RSP_FLAG_DOUNDER: u8 = 1 << 3;
pub const RSP_FLAG_DIOVER: u8 = 1 << 4;
pub const RSP_FLAG_DIUNDER: u8 = 1 << 5;

/// RSP_CODE values of SRP_RSP response data (SRP r16a §6.9, table 27;
/// 08h and 09h from SAM-5's service responses as SRP-2 adds them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RspCode(pub u8);

impl RspCode {
    pub const COMPLETE: RspCode = RspCode(0x00);
    pub const INVALID_FIELDS: RspCode = RspCode(0x02);
    pub const NOT_SUPPORTED: RspCode = RspCode(0x04);
    pub const FAILED: RspCode = RspCode(0x05);
    pub const SUCCEEDED: RspCode = RspCode(0x08);
    pub const INCORRECT_LUN: RspCode = RspCode(0x09);
}

/// SRP_RSP (SRP r16a §6.9).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Rsp {
    pub tag: u64,
    pub req_lim_delta: u32,
    pub flags: u8,
    pub status: u8,
    pub data_out_res_cnt: u32,
    pub data_in_res_cnt: u32,
    /// Response data (task management: four bytes, RSP_CODE in byte 3).
    pub resp_data: Vec<u8>,
    pub sense: Vec<u8>,
}

impl Rsp {
    pub fn parse(b: &[u8]) -> Result<Rsp, IuError> {
        need(b, RSP_LEN, IuType::RSP)?;
        let flags = b[18];
        let sense_len = if flags & RSP_FLAG_SNSVALID != 0 {
            be32(b, 28) as usize
        } else {
            0
        };
        let resp_len = if flags & RSP_FLAG_RSPVALID != 0 {
            be32(b, 32) as usize
        } else {
            0
        };
        let end = RSP_LEN.saturating_add(resp_len).saturating_add(sense_len);
        if b.len() < end {
            return Err(IuError::Short {
                need: end,
                got: b.len(),
            });
        }
        Ok(Rsp {
            req_lim_delta: be32(b, 4),
            tag: be64(b, 8),
            flags,
            status: b[19],
            data_out_res_cnt: be32(b, 20),
            data_in_res_cnt: be32(b, 24),
            resp_data: b[RSP_LEN..RSP_LEN + resp_len].to_vec(),
            sense: b[RSP_LEN + resp_len..end].to_vec(),
        })
    }

    /// Encodes; RSPVALID and SNSVALID are set from the data present.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; RSP_LEN + self.resp_data.len() + self.sense.len()];
        b[0] = IuType::RSP.0;
        put32(&mut b, 4, self.req_lim_delta);
        put64(&mut b, 8, self.tag);
        let mut flags = self.flags & !(RSP_FLAG_RSPVALID | RSP_FLAG_SNSVALID);
        if !self.resp_data.is_empty() {
            flags |= RSP_FLAG_RSPVALID;
        }
        if !self.sense.is_empty() {
            flags |= RSP_FLAG_SNSVALID;
        }
        b[18] = flags;
        b[19] = self.status;
        put32(&mut b, 20, self.data_out_res_cnt);
        put32(&mut b, 24, self.data_in_res_cnt);
        put32(&mut b, 28, self.sense.len() as u32);
        put32(&mut b, 32, self.resp_data.len() as u32);
        b[RSP_LEN..RSP_LEN + self.resp_data.len()].copy_from_slice(&self.resp_data);
        b[RSP_LEN + self.resp_data.len()..].copy_from_slice(&self.sense);
        b
    }

    /// The RSP_CODE, when response data is present.
    pub fn rsp_code(&self) -> Option<RspCode> {
        (self.resp_data.len() >= 4).then(|| RspCode(self.resp_data[3]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(a: u64, k: u32, l: u32) -> RemoteSeg {
        RemoteSeg {
            addr: a,
            rkey: k,
            len: l,
        }
    }

    #[test]
    fn login_round_trip_and_offsets() {
        let r = LoginReq {
            tag: 0x1122_3344_5566_7788,
            req_it_iu_len: 4096,
            req_buf_fmt: BUF_FORMAT_DIRECT | BUF_FORMAT_INDIRECT,
            req_flags: MULTICHAN_MULTI,
            initiator_port_id: [1; 16],
            target_port_id: [2; 16],
        };
        let b = r.encode();
        assert_eq!(b.len(), 64);
        assert_eq!(&b[16..20], &[0, 0, 0x10, 0]);
        assert_eq!(&b[24..26], &[0, 6]);
        assert_eq!(LoginReq::parse(&b), Ok(r));
        assert!(matches!(
            LoginReq::parse(&b[..63]),
            Err(IuError::Short { .. })
        ));
        let rsp = LoginRsp {
            tag: 5,
            req_lim_delta: 32,
            max_it_iu_len: 4096,
            max_ti_iu_len: 2048,
            buf_fmt: 6,
            rsp_flags: LOGIN_RSP_NO_CHANNEL,
        };
        let b = rsp.encode();
        assert_eq!(b.len(), 52);
        assert_eq!(b[0], 0xc0);
        assert_eq!(&b[4..8], &[0, 0, 0, 32]);
        assert_eq!(LoginRsp::parse(&b), Ok(rsp.clone()));
        let rej = LoginRej {
            tag: 5,
            reason: LoginRejReason::IT_IU_LENGTH_TOO_LARGE,
            buf_fmt: 6,
        };
        let b = rej.encode();
        assert_eq!(&b[4..8], &[0, 1, 0, 2]);
        assert_eq!(LoginRej::parse(&b), Ok(rej));
        assert_eq!(
            LoginRej::parse(&rsp.encode()),
            Err(IuError::WrongType(0xc0))
        );
    }

    #[test]
    fn cmd_direct_round_trip() {
        let cdb = [0x28u8, 0, 0, 0, 0, 8, 0, 0, 1, 0];
        let din = [seg(0xdead_beef_0000, 0x8000_0001, 512)];
        let b = CmdBuilder {
            tag: 7,
            lun: [0, 1, 0, 0, 0, 0, 0, 0],
            task_attr: TASK_ATTR_ORDERED,
            cdb: &cdb,
            data_out: &[],
            data_in: &din,
            out_table: None,
            in_table: None,
            inline_max: 16,
        }
        .encode();
        assert_eq!(b.len(), 48 + 16);
        assert_eq!(b[5], 0x01);
        let c = Cmd::parse(&b).unwrap();
        assert_eq!(c.tag, 7);
        assert_eq!(c.lun[1], 1);
        assert_eq!(c.task_attr, TASK_ATTR_ORDERED);
        assert_eq!(&c.cdb[..10], &cdb);
        assert_eq!(c.cdb.len(), 16);
        assert_eq!(c.data_out, DataBuf::None);
        assert_eq!(c.data_in, DataBuf::Segs(smallvec::smallvec![din[0]]));
    }

    #[test]
    fn cmd_indirect_inline_and_partial() {
        let segs = [
            seg(0x1000, 1, 100),
            seg(0x2000, 2, 200),
            seg(0x3000, 3, 300),
        ];
        let table = seg(0x9000, 9, 48);
        let mut bld = CmdBuilder {
            tag: 1,
            lun: [0; 8],
            task_attr: 0,
            cdb: &[0x2a; 10],
            data_out: &segs,
            data_in: &[],
            out_table: Some(table),
            in_table: None,
            inline_max: 16,
        };
        let c = Cmd::parse(&bld.encode()).unwrap();
        assert_eq!(c.data_out, DataBuf::Segs(SmallVec::from_slice(&segs)));
        assert_eq!(c.data_out.total(), 600);
        bld.inline_max = 1;
        let b = bld.encode();
        assert_eq!(b[5], 0x20);
        assert_eq!(b[6], 1);
        let c = Cmd::parse(&b).unwrap();
        assert_eq!(c.data_out, DataBuf::Table { table, total: 600 });
        assert_eq!(parse_table(&encode_table(&segs)).as_slice(), &segs);
    }

    #[test]
    fn cmd_rejects_bad_descriptors() {
        let mut b = CmdBuilder {
            tag: 1,
            lun: [0; 8],
            task_attr: 0,
            cdb: &[0; 10],
            data_out: &[seg(1, 1, 8)],
            data_in: &[],
            out_table: None,
            in_table: None,
            inline_max: 4,
        }
        .encode();
        assert!(Cmd::parse(&b).is_ok());
        assert!(matches!(Cmd::parse(&b[..60]), Err(IuError::Short { .. })));
        b[5] = 0x30;
        assert_eq!(Cmd::parse(&b), Err(IuError::DataOutFormat(3)));
        b[5] = 0x05;
        assert_eq!(Cmd::parse(&b), Err(IuError::DataInFormat(5)));
        // Indirect with more inline descriptors than the table holds.
        let segs = [seg(1, 1, 8), seg(2, 2, 8)];
        let mut b = CmdBuilder {
            tag: 1,
            lun: [0; 8],
            task_attr: 0,
            cdb: &[0; 10],
            data_out: &[],
            data_in: &segs,
            out_table: None,
            in_table: Some(seg(0, 0, 16)),
            inline_max: 4,
        }
        .encode();
        assert_eq!(Cmd::parse(&b), Err(IuError::DataInCount));
        // Indirect total that disagrees with the descriptors.
        b[48 + 8..48 + 12].copy_from_slice(&[0, 0, 0, 32]);
        b[48 + 16..48 + 20].copy_from_slice(&[0, 0, 0, 99]);
        assert_eq!(Cmd::parse(&b), Err(IuError::DataInCount));
    }

    #[test]
    fn additional_cdb() {
        let cdb = [0x7fu8; 32];
        let b = CmdBuilder {
            tag: 1,
            lun: [0; 8],
            task_attr: 0,
            cdb: &cdb,
            data_out: &[],
            data_in: &[],
            out_table: None,
            in_table: None,
            inline_max: 4,
        }
        .encode();
        assert_eq!(b[31], 4 << 2);
        assert_eq!(Cmd::parse(&b).unwrap().cdb.as_slice(), &cdb);
    }

    #[test]
    fn rsp_round_trip() {
        let r = Rsp {
            tag: 9,
            req_lim_delta: 3,
            flags: RSP_FLAG_DIUNDER,
            status: 2,
            data_out_res_cnt: 0,
            data_in_res_cnt: 512,
            resp_data: vec![],
            sense: vec![0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0],
        };
        let b = r.encode();
        assert_eq!(b.len(), 36 + 18);
        assert_eq!(b[18], RSP_FLAG_DIUNDER | RSP_FLAG_SNSVALID);
        let p = Rsp::parse(&b).unwrap();
        assert_eq!(p.sense, r.sense);
        assert_eq!(p.data_in_res_cnt, 512);
        assert_eq!(p.flags, RSP_FLAG_DIUNDER | RSP_FLAG_SNSVALID);
        let t = Rsp {
            tag: 1,
            resp_data: vec![0, 0, 0, RspCode::NOT_SUPPORTED.0],
            ..Rsp::default()
        };
        let p = Rsp::parse(&t.encode()).unwrap();
        assert_eq!(p.rsp_code(), Some(RspCode::NOT_SUPPORTED));
        let mut short = t.encode();
        short.truncate(38);
        assert!(Rsp::parse(&short).is_err());
    }

    #[test]
    fn tsk_mgmt_aer_cred_logout() {
        let t = TskMgmt {
            tag: 4,
            lun: [0, 3, 0, 0, 0, 0, 0, 0],
            func: TskFunc::ABORT_TASK,
            task_tag: 77,
        };
        let b = t.encode();
        assert_eq!(b[30], 1);
        assert_eq!(TskMgmt::parse(&b), Ok(t));
        let a = AerReq {
            tag: 1,
            req_lim_delta: 2,
            lun: 0x0001_0000_0000_0000,
            sense: vec![0x70, 0, 6],
        };
        assert_eq!(AerReq::parse(&a.encode()), Ok(a));
        let c = CredReq {
            tag: 3,
            req_lim_delta: 5,
        };
        assert_eq!(CredReq::parse(&c.encode()), Ok(c));
        let l = t_logout(8, TLogoutReason::INVALID_IU_TYPE);
        assert_eq!(t_logout_reason(&l), Ok(TLogoutReason::INVALID_IU_TYPE));
        assert_eq!(iu_tag(&i_logout(42)), Some(42));
        assert_eq!(
            iu_type(&simple_rsp(IuType::AER_RSP, 1)),
            Some(IuType::AER_RSP)
        );
    }
}
