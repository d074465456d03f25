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

/// The length of Linux's RDMA CM login layout (`struct srp_login_req_rdma`,
/// see [`LoginLayout::RdmaCm`]).
pub const LOGIN_REQ_RDMA_LEN: usize = 56;

/// REQ_FLAGS of SRP_LOGIN_REQ: MULTI-CHANNEL ACTION is bits 1:0 (SRP r16a
/// §6.2); SRP-2 adds IMMEDIATE DATA REQUESTED in bit 7.
pub const MULTICHAN_MASK: u8 = 0x03;
pub const LOGIN_REQ_IMMED_REQUESTED: u8 = 0x80;
/// RSP_FLAGS of SRP_LOGIN_RSP: SRP-2's IMMEDIATE DATA SUPPORTED, bit 7
/// (the multi-channel result is bits 1:0).
pub const LOGIN_RSP_IMMED_SUPP: u8 = 0x80;

/// How an SRP_LOGIN_REQ lies in the connection request's private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoginLayout {
    /// The 64-byte information unit of SRP r16a §6.2 (type byte first), as
    /// IB CM carries it and as the soft provider carries it.
    Iu,
    /// The 56-byte layout the Linux initiator sends over RDMA CM (`struct
    /// srp_login_req_rdma` of `include/scsi/srp.h`): an IB CM REQ carries 92
    /// bytes of private data and RDMA CM takes 36 of them for its own
    /// header, so the IU's reserved bytes are dropped and the fields
    /// reordered: tag (bytes 0..8), REQUIRED BUFFER FORMATS (8..10),
    /// REQ_FLAGS (10), the IU type (11), REQUESTED MAXIMUM INITIATOR TO
    /// TARGET IU LENGTH (12..16), the initiator port id (16..32), the target
    /// port id (32..48), the immediate data offset (48..50), 6 reserved
    /// bytes.
    RdmaCm,
}

/// SRP_LOGIN_REQ (SRP r16a §6.2, with SRP-2's immediate data offset), in
/// either layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginReq {
    /// Opaque: echoed in the response or the reject as received.
    pub tag: u64,
    /// Largest initiator-to-target IU the initiator will send.
    pub req_it_iu_len: u32,
    pub req_buf_fmt: u16,
    pub req_flags: u8,
    /// SRP-2: where immediate data starts in an SRP_CMD, when
    /// [`LOGIN_REQ_IMMED_REQUESTED`] is set.
    pub imm_data_offset: u16,
    pub initiator_port_id: [u8; 16],
    pub target_port_id: [u8; 16],
}

impl LoginReq {
    /// Parses either layout; the length tells them apart: 64 bytes or more
    /// is the IU, 56 to 63 the RDMA CM layout. (Over RDMA CM on InfiniBand
    /// and RoCE the private data is always exactly 56 bytes, so the IU
    /// cannot arrive there; over iWARP and the soft provider it arrives with
    /// the length it was sent with.)
    pub fn parse(b: &[u8]) -> Result<LoginReq, IuError> {
        Self::parse_layout(b).map(|(r, _)| r)
    }

    /// [`LoginReq::parse`], also telling which layout it was.
    pub fn parse_layout(b: &[u8]) -> Result<(LoginReq, LoginLayout), IuError> {
        if b.len() >= LOGIN_REQ_LEN {
            return Self::parse_iu(b).map(|r| (r, LoginLayout::Iu));
        }
        Self::parse_rdma_cm(b).map(|r| (r, LoginLayout::RdmaCm))
    }

    /// The 64-byte IU.
    pub fn parse_iu(b: &[u8]) -> Result<LoginReq, IuError> {
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
            imm_data_offset: be16(b, 28),
            initiator_port_id: ini,
            target_port_id: tgt,
        })
    }

    /// The 56-byte RDMA CM layout ([`LoginLayout::RdmaCm`]).
    pub fn parse_rdma_cm(b: &[u8]) -> Result<LoginReq, IuError> {
        if b.len() < LOGIN_REQ_RDMA_LEN {
            return Err(IuError::Short {
                need: LOGIN_REQ_RDMA_LEN,
                got: b.len(),
            });
        }
        if b[11] != IuType::LOGIN_REQ.0 {
            return Err(IuError::WrongType(b[11]));
        }
        let mut ini = [0u8; 16];
        ini.copy_from_slice(&b[16..32]);
        let mut tgt = [0u8; 16];
        tgt.copy_from_slice(&b[32..48]);
        Ok(LoginReq {
            tag: be64(b, 0),
            req_buf_fmt: be16(b, 8),
            req_flags: b[10],
            req_it_iu_len: be32(b, 12),
            imm_data_offset: be16(b, 48),
            initiator_port_id: ini,
            target_port_id: tgt,
        })
    }

    /// The 64-byte IU.
    pub fn encode(&self) -> [u8; LOGIN_REQ_LEN] {
        let mut b = [0u8; LOGIN_REQ_LEN];
        b[0] = IuType::LOGIN_REQ.0;
        put64(&mut b, 8, self.tag);
        put32(&mut b, 16, self.req_it_iu_len);
        put16(&mut b, 24, self.req_buf_fmt);
        b[26] = self.req_flags;
        put16(&mut b, 28, self.imm_data_offset);
        b[32..48].copy_from_slice(&self.initiator_port_id);
        b[48..64].copy_from_slice(&self.target_port_id);
        b
    }

    /// The 56-byte RDMA CM layout.
    pub fn encode_rdma_cm(&self) -> [u8; LOGIN_REQ_RDMA_LEN] {
        let mut b = [0u8; LOGIN_REQ_RDMA_LEN];
        put64(&mut b, 0, self.tag);
        put16(&mut b, 8, self.req_buf_fmt);
        b[10] = self.req_flags;
        b[11] = IuType::LOGIN_REQ.0;
        put32(&mut b, 12, self.req_it_iu_len);
        b[16..32].copy_from_slice(&self.initiator_port_id);
        b[32..48].copy_from_slice(&self.target_port_id);
        put16(&mut b, 48, self.imm_data_offset);
        b
    }

    /// Encodes in `layout`.
    pub fn encode_as(&self, layout: LoginLayout) -> Vec<u8> {
        match layout {
            LoginLayout::Iu => self.encode().to_vec(),
            LoginLayout::RdmaCm => self.encode_rdma_cm().to_vec(),
        }
    }

    /// MULTI-CHANNEL ACTION (§6.2): [`MULTICHAN_SINGLE`], [`MULTICHAN_MULTI`],
    /// or a reserved value.
    pub fn multi_channel_action(&self) -> u8 {
        self.req_flags & MULTICHAN_MASK
    }

    /// SRP-2: the initiator asks to send write data inside its SRP_CMDs.
    pub fn immediate_requested(&self) -> bool {
        self.req_flags & LOGIN_REQ_IMMED_REQUESTED != 0
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

/// Data buffer descriptor formats of SRP_CMD (SRP r16a §6.8, table 24;
/// SRP-2 adds the immediate data descriptor, 3).
pub const DESC_NONE: u8 = 0;
pub const DESC_DIRECT: u8 = 1;
pub const DESC_INDIRECT: u8 = 2;
pub const DESC_IMMEDIATE: u8 = 3;
/// An immediate data buffer descriptor (SRP-2): the data length, 4 bytes.
pub const IMM_DESC_LEN: usize = 4;

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
    /// SRP-2 immediate data (data-out only): `len` bytes inside the SRP_CMD
    /// itself, from byte `offset` (the login's immediate data offset).
    Immediate { offset: u32, len: u32 },
}

impl DataBuf {
    /// Total bytes this buffer can hold.
    pub fn total(&self) -> u64 {
        match self {
            DataBuf::None => 0,
            DataBuf::Segs(s) => s.iter().map(|d| d.len as u64).sum(),
            DataBuf::Table { total, .. } => *total as u64,
            DataBuf::Immediate { len, .. } => *len as u64,
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
    /// Parses an SRP_CMD, descriptors included, on a channel without
    /// immediate data (the immediate data format is then unsupported).
    pub fn parse(b: &[u8]) -> Result<Cmd, IuError> {
        Self::parse_imm(b, None)
    }

    /// Parses an SRP_CMD on a channel whose login granted immediate data at
    /// `imm_data_offset` (SRP-2): a data-out descriptor of format 3 is then
    /// a 4-byte length, and the data lies in the IU from that offset. The
    /// descriptors must end at or before it, and the IU must hold all of
    /// the data.
    pub fn parse_imm(b: &[u8], imm_data_offset: Option<u16>) -> Result<Cmd, IuError> {
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
        let data_out = match (out_fmt, imm_data_offset) {
            (DESC_IMMEDIATE, Some(off)) => {
                let d = b.get(at..at + IMM_DESC_LEN).ok_or(IuError::Short {
                    need: at + IMM_DESC_LEN,
                    got: b.len(),
                })?;
                at += IMM_DESC_LEN;
                let len = be32(d, 0);
                let end = off as usize + len as usize;
                if b.len() < end {
                    return Err(IuError::Short {
                        need: end,
                        got: b.len(),
                    });
                }
                DataBuf::Immediate {
                    offset: off as u32,
                    len,
                }
            }
            _ => Self::desc(b, &mut at, out_fmt, out_cnt, true)?,
        };
        let data_in = Self::desc(b, &mut at, in_fmt, in_cnt, false)?;
        // SRP-2: immediate data follows every descriptor.
        if let DataBuf::Immediate { offset, .. } = &data_out
            && at > *offset as usize
        {
            return Err(IuError::DataOutCount);
        }
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

    /// Encodes with the write data as SRP-2 immediate data: an immediate
    /// data descriptor instead of `data_out`, and `data` from byte
    /// `imm_data_offset` of the IU. `None` when the descriptors do not end
    /// before that offset.
    pub fn encode_immediate(&self, imm_data_offset: u16, data: &[u8]) -> Option<Vec<u8>> {
        let mut b = CmdBuilder {
            data_out: &[],
            out_table: None,
            ..self.clone()
        }
        .encode();
        // The immediate descriptor comes first, before any data-in one.
        let at = CMD_LEN + (b[31] >> 2) as usize * 4;
        let mut len = [0u8; IMM_DESC_LEN];
        put32(&mut len, 0, u32::try_from(data.len()).ok()?);
        b.splice(at..at, len);
        let off = imm_data_offset as usize;
        if b.len() > off {
            return None;
        }
        b.resize(off, 0);
        b.extend_from_slice(data);
        b[5] = (DESC_IMMEDIATE << 4) | (b[5] & 0x0f);
        b[6] = 0;
        Some(b)
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
            imm_data_offset: 0,
            initiator_port_id: [1; 16],
            target_port_id: [2; 16],
        };
        let b = r.encode();
        assert_eq!(b.len(), 64);
        assert_eq!(&b[16..20], &[0, 0, 0x10, 0]);
        assert_eq!(&b[24..26], &[0, 6]);
        assert_eq!(LoginReq::parse(&b), Ok(r));
        assert!(matches!(
            LoginReq::parse_iu(&b[..63]),
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

    /// The bytes Linux's ib_srp puts in the RDMA CM private data
    /// (`srp_send_req`, `struct srp_login_req_rdma`): tag 0, direct and
    /// indirect formats, MULTI-CHANNEL ACTION 1 with immediate data asked
    /// for at offset 68, an IU length of 8260.
    fn linux_rdma_cm_login() -> [u8; 56] {
        let mut b = [0u8; 56];
        b[8..10].copy_from_slice(&[0x00, 0x06]);
        b[10] = 0x81;
        b[11] = 0x00;
        b[12..16].copy_from_slice(&8260u32.to_be_bytes());
        b[16..24].copy_from_slice(&[0; 8]); // initiator_ext
        b[24..32].copy_from_slice(&[0xfe, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56]);
        b[32..48].copy_from_slice(b"ferrite srp p0t0");
        b[48..50].copy_from_slice(&68u16.to_be_bytes());
        b
    }

    #[test]
    fn rdma_cm_login_layout_parses_into_the_same_request() {
        let b = linux_rdma_cm_login();
        let (r, layout) = LoginReq::parse_layout(&b).unwrap();
        assert_eq!(layout, LoginLayout::RdmaCm);
        assert_eq!(r.tag, 0);
        assert_eq!(r.req_buf_fmt, BUF_FORMAT_DIRECT | BUF_FORMAT_INDIRECT);
        assert_eq!(r.multi_channel_action(), MULTICHAN_MULTI);
        assert!(r.immediate_requested());
        assert_eq!(r.imm_data_offset, 68);
        assert_eq!(r.req_it_iu_len, 8260);
        assert_eq!(&r.target_port_id, b"ferrite srp p0t0");
        assert_eq!(r.initiator_port_id[8], 0xfe);
        // Both layouts of one request parse to it, each recognised.
        assert_eq!(r.encode_rdma_cm(), b);
        let (iu, layout) = LoginReq::parse_layout(&r.encode()).unwrap();
        assert_eq!(layout, LoginLayout::Iu);
        assert_eq!(iu, r);
        assert_eq!(&r.encode()[28..30], &[0, 68], "SRP-2 offset of the IU");
        assert_eq!(r.encode()[26], 0x81);
        assert_eq!(
            LoginReq::parse(&r.encode_as(LoginLayout::RdmaCm)),
            Ok(r.clone())
        );
        // A tag is echoed as its bytes, whichever layout carried it.
        let mut t = b;
        t[0..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let r = LoginReq::parse(&t).unwrap();
        assert_eq!(r.tag.to_be_bytes(), [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn login_layouts_are_told_apart_by_length_and_checked() {
        let b = linux_rdma_cm_login();
        assert_eq!(
            LoginReq::parse(&b[..55]),
            Err(IuError::Short { need: 56, got: 55 })
        );
        assert_eq!(
            LoginReq::parse(&[]),
            Err(IuError::Short { need: 56, got: 0 })
        );
        let mut bad = b;
        bad[11] = IuType::CMD.0;
        assert_eq!(LoginReq::parse(&bad), Err(IuError::WrongType(0x02)));
        // 57..63 bytes: still the RDMA CM layout (trailing bytes ignored).
        let mut long = b.to_vec();
        long.extend_from_slice(&[0xee; 7]);
        assert_eq!(
            LoginReq::parse_layout(&long).map(|(_, l)| l),
            Ok(LoginLayout::RdmaCm)
        );
        // 64 bytes and more: the IU, whose type byte comes first.
        let mut iu = LoginReq::parse(&b).unwrap().encode().to_vec();
        iu[0] = IuType::TSK_MGMT.0;
        assert_eq!(LoginReq::parse(&iu), Err(IuError::WrongType(0x01)));
        iu[0] = 0;
        iu.extend_from_slice(&[0; 28]); // IB CM's 92 bytes of private data
        assert!(LoginReq::parse(&iu).is_ok());
    }

    #[test]
    fn immediate_data_commands() {
        let data = pattern(4096);
        let bld = CmdBuilder {
            tag: 3,
            lun: [0; 8],
            task_attr: 0,
            cdb: &[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0],
            data_out: &[],
            data_in: &[],
            out_table: None,
            in_table: None,
            inline_max: 4,
        };
        let b = bld.encode_immediate(68, &data).unwrap();
        assert_eq!(b.len(), 68 + 4096);
        assert_eq!(b[5], 0x30, "data-out format 3, no data-in");
        assert_eq!(&b[48..52], &4096u32.to_be_bytes());
        let c = Cmd::parse_imm(&b, Some(68)).unwrap();
        assert_eq!(
            c.data_out,
            DataBuf::Immediate {
                offset: 68,
                len: 4096
            }
        );
        assert_eq!(c.data_out.total(), 4096);
        assert_eq!(&b[68..], &data[..]);
        // Without immediate data granted the format is unsupported.
        assert_eq!(Cmd::parse(&b), Err(IuError::DataOutFormat(3)));
        // The IU must hold all of the data.
        assert!(matches!(
            Cmd::parse_imm(&b[..68 + 4095], Some(68)),
            Err(IuError::Short { .. })
        ));
        // The data follows every descriptor: a 32-byte CDB puts the
        // immediate descriptor at 64..68, which an offset of 64 overlaps.
        let long_cdb = [0x7fu8; 32];
        let b = CmdBuilder {
            cdb: &long_cdb,
            ..bld.clone()
        };
        assert!(b.encode_immediate(64, &data).is_none());
        let ok = b.encode_immediate(68, &data).unwrap();
        assert!(Cmd::parse_imm(&ok, Some(68)).is_ok());
        assert_eq!(Cmd::parse_imm(&ok, Some(64)), Err(IuError::DataOutCount));
        // Immediate data is a data-out format only.
        let mut din = bld.encode_immediate(68, &data).unwrap();
        din[5] = 0x03;
        assert_eq!(
            Cmd::parse_imm(&din, Some(68)),
            Err(IuError::DataInFormat(3))
        );
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
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
