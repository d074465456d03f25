//! The project's own iSCSI initiator, for tools and tests: login with
//! configurable keys and digests, SCSI commands with immediate data,
//! unsolicited data and R2T handling, NOP-Out, text, task management, logout,
//! and raw bytes for malformed-input tests.
//!
//! It runs over any blocking byte [`Transport`] (a `TcpStream`, or an
//! in-memory pair in tests) and reuses the target's codec ([`crate::pdu`],
//! [`crate::keys`]): there is no second one. It is a test instrument, not a
//! production initiator: one command at a time per connection, ERL 0.
//!
//! Several connections per session (MC/S): [`Initiator::add_connection`]
//! logs a further connection in to the session (its TSIH, a new CID, no
//! leading-only keys); the connections share one CmdSN counter, so each may
//! be driven from its own thread, and a command goes on whichever connection
//! the caller sends it on.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::keys::{encode_text, parse_text};
use crate::pdu::{
    BhsBuf, CmdSn, DataSn, LoginStatus, Opcode, Pdu, PduError, RESERVED_TAG, StatSn, flags,
};

/// A blocking byte pipe to a target.
pub trait Transport {
    fn send(&mut self, data: &[u8]) -> io::Result<()>;
    /// Reads some bytes; `Ok(0)` means the target closed the connection.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

impl Transport for TcpStream {
    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        self.write_all(data)
    }
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf)
    }
}

/// What the initiator offers at login.
#[derive(Clone, Debug)]
pub struct InitiatorConfig {
    pub initiator_name: String,
    /// None for a discovery session.
    pub target_name: Option<String>,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub cid: u16,
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    /// Further keys sent in the operational stage (or replacing ours).
    pub extra_keys: Vec<(String, String)>,
}

impl Default for InitiatorConfig {
    fn default() -> InitiatorConfig {
        InitiatorConfig {
            initiator_name: "iqn.2026-01.dev.ferrite:initiator".into(),
            target_name: None,
            isid: [0x80, 0x00, 0x00, 0x00, 0x00, 0x01],
            tsih: 0,
            cid: 0,
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 65_536,
            immediate_data: true,
            initial_r2t: false,
            extra_keys: Vec::new(),
        }
    }
}

/// Why an initiator operation failed.
#[derive(Debug, thiserror::Error)]
pub enum InitiatorError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("bad PDU from target: {0}")]
    Pdu(#[from] PduError),
    #[error("login failed with status {0:?}")]
    Login(LoginStatus),
    #[error("target rejected the PDU, reason {0:#04x}")]
    Rejected(u8),
    #[error("target closed the connection")]
    Closed,
    #[error("protocol: {0}")]
    Protocol(String),
}

/// The outcome of a SCSI command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScsiResult {
    pub status: u8,
    pub sense: Vec<u8>,
    /// Data-In received.
    pub data: Vec<u8>,
    /// Residual count and flags (U/O) as reported.
    pub residual: u32,
    pub flags: u8,
    /// Data-In PDUs and R2Ts seen.
    pub data_in_pdus: u32,
    pub r2ts: u32,
    /// The status arrived in the last Data-In (S bit).
    pub status_in_data_in: bool,
    /// ExpDataSN of the SCSI Response (R2Ts and Data-Ins the target counted).
    pub exp_data_sn: u32,
}

/// A SCSI command to send.
#[derive(Clone, Debug, Default)]
pub struct Command<'a> {
    pub lun: u64,
    pub cdb: &'a [u8],
    /// Bytes to read (Data-In expected).
    pub read_len: u32,
    /// Data to write.
    pub write: &'a [u8],
    /// Task attribute (RFC 7143 §11.3.1 ATTR), 1 = SIMPLE.
    pub attr: u8,
    pub immediate: bool,
}

/// One initiator connection.
#[derive(Debug)]
pub struct Initiator<T: Transport> {
    pub t: T,
    pub cfg: InitiatorConfig,
    pub cmd_sn: CmdSn,
    pub exp_stat_sn: StatSn,
    pub max_cmd_sn: CmdSn,
    next_itt: u32,
    rx: Vec<u8>,
    /// Digests in force (after login).
    pub hd: bool,
    pub dd: bool,
    /// Negotiated: what the target accepts per PDU.
    pub target_mrdsl: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub tsih: u16,
    /// Keys the target answered during login.
    pub login_keys: Vec<(String, String)>,
    /// Asynchronous Messages received while waiting for something else.
    pub async_msgs: Vec<Pdu>,
    /// NOP-In pings answered automatically.
    pub pings_answered: u32,
    /// The session's CmdSN counter when it has several connections
    /// (otherwise `cmd_sn` alone).
    shared_cmd_sn: Option<Arc<AtomicU32>>,
}

impl<T: Transport> Initiator<T> {
    pub fn new(t: T, cfg: InitiatorConfig) -> Initiator<T> {
        Initiator {
            t,
            cfg,
            cmd_sn: CmdSn(1),
            exp_stat_sn: StatSn(0),
            max_cmd_sn: CmdSn(1),
            next_itt: 0x100,
            rx: Vec::new(),
            hd: false,
            dd: false,
            target_mrdsl: 8192,
            max_burst: 262_144,
            first_burst: 65_536,
            immediate_data: true,
            initial_r2t: true,
            tsih: 0,
            login_keys: Vec::new(),
            async_msgs: Vec::new(),
            pings_answered: 0,
            shared_cmd_sn: None,
        }
    }

    /// The session's next CmdSN.
    fn current_cmd_sn(&self) -> CmdSn {
        match &self.shared_cmd_sn {
            Some(c) => CmdSn(c.load(Ordering::SeqCst)),
            None => self.cmd_sn,
        }
    }

    /// Logs a further connection in to this session (MC/S, RFC 7143
    /// §6.3.1): same initiator name and ISID, this session's TSIH, CID
    /// `cid`, only per-connection keys. From then on the connections share
    /// the session's CmdSN counter.
    pub fn add_connection(
        &mut self,
        addr: std::net::SocketAddr,
        cid: u16,
    ) -> Result<Initiator<TcpStream>, InitiatorError> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        self.join_on(s, cid)
    }

    /// [`Initiator::add_connection`] over a transport already connected.
    pub fn join_on<U: Transport>(
        &mut self,
        t: U,
        cid: u16,
    ) -> Result<Initiator<U>, InitiatorError> {
        let now = self.cmd_sn.0;
        let shared = self
            .shared_cmd_sn
            .get_or_insert_with(|| Arc::new(AtomicU32::new(now)))
            .clone();
        let mut cfg = InitiatorConfig {
            tsih: self.tsih,
            cid,
            ..self.cfg.clone()
        };
        cfg.extra_keys
            .retain(|(k, _)| !crate::keys::LEADING_ONLY_KEYS.contains(&k.as_str()));
        let mut i = Initiator::new(t, cfg);
        // RFC 7143 §11.2.1.8: ITTs are unique per session: each connection
        // draws from its own range.
        i.next_itt = u32::from(cid) << 20;
        i.shared_cmd_sn = Some(shared);
        i.cmd_sn = self.current_cmd_sn();
        i.login()?;
        // The session's negotiated values (leading-only keys).
        i.max_burst = self.max_burst;
        i.first_burst = self.first_burst;
        i.immediate_data = self.immediate_data;
        i.initial_r2t = self.initial_r2t;
        Ok(i)
    }

    pub fn new_itt(&mut self) -> u32 {
        self.next_itt = self.next_itt.wrapping_add(1);
        if self.next_itt == RESERVED_TAG {
            self.next_itt = 1;
        }
        self.next_itt
    }

    /// Encodes with the digests in force.
    pub fn encode(&self, pdu: &Pdu) -> Vec<u8> {
        pdu.encode(self.hd, self.dd)
    }

    pub fn send_pdu(&mut self, pdu: &Pdu) -> Result<(), InitiatorError> {
        let b = self.encode(pdu);
        self.t.send(&b)?;
        Ok(())
    }

    /// Sends bytes as they are (malformed-input tests).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), InitiatorError> {
        self.t.send(bytes)?;
        Ok(())
    }

    /// Reads the next PDU; tracks ExpStatSN and MaxCmdSN.
    pub fn recv_pdu(&mut self) -> Result<Pdu, InitiatorError> {
        loop {
            if let Some((pdu, n)) = Pdu::parse(&self.rx, self.hd, self.dd, 0x00ff_ffff)? {
                self.rx.drain(..n);
                self.track(&pdu);
                return Ok(pdu);
            }
            let mut buf = [0u8; 65536];
            let n = self.t.recv(&mut buf)?;
            if n == 0 {
                return Err(InitiatorError::Closed);
            }
            self.rx.extend_from_slice(&buf[..n]);
        }
    }

    fn track(&mut self, pdu: &Pdu) {
        let b = pdu.bhs();
        let op = b.opcode();
        let status_bearing = match op {
            Opcode::DATA_IN => b.flags() & flags::S != 0,
            Opcode::R2T => false,
            Opcode::NOP_IN => b.itt() != RESERVED_TAG,
            _ => true,
        };
        if status_bearing {
            self.exp_stat_sn = b.stat_sn().next();
        }
        if op != Opcode::LOGIN_RSP && b.max_cmd_sn().gt(self.max_cmd_sn) {
            self.max_cmd_sn = b.max_cmd_sn();
        }
    }

    /// A Login Request PDU.
    pub fn login_pdu(&mut self, transit: bool, csg: u8, nsg: u8, keys: &[(String, String)]) -> Pdu {
        let mut f = ((csg & 3) << 2) | (nsg & 3);
        if transit {
            f |= flags::T;
        }
        let mut b = BhsBuf::new(Opcode::LOGIN_REQ, f);
        b.set_immediate();
        b.0[8..14].copy_from_slice(&self.cfg.isid);
        b.set_u16(14, self.cfg.tsih)
            .set_itt(0)
            .set_u16(20, self.cfg.cid)
            .set_u32(24, self.current_cmd_sn().0)
            .set_u32(28, self.exp_stat_sn.0);
        Pdu::with_data(b, encode_text(keys))
    }

    fn login_step(
        &mut self,
        transit: bool,
        csg: u8,
        nsg: u8,
        keys: &[(String, String)],
    ) -> Result<Pdu, InitiatorError> {
        let p = self.login_pdu(transit, csg, nsg, keys);
        self.send_pdu(&p)?;
        let r = self.recv_pdu()?;
        if r.bhs().opcode() != Opcode::LOGIN_RSP {
            return Err(InitiatorError::Protocol(format!(
                "expected a login response, got {:?}",
                r.bhs()
            )));
        }
        let st = r.bhs().login_status();
        if st != LoginStatus::SUCCESS {
            return Err(InitiatorError::Login(st));
        }
        for (k, v) in parse_text(&r.data).map_err(|e| InitiatorError::Protocol(e.to_string()))? {
            self.login_keys.push((k.to_string(), v.to_string()));
        }
        Ok(r)
    }

    /// Logs in: security stage (AuthMethod=None), then operational stage,
    /// then full feature phase.
    pub fn login(&mut self) -> Result<(), InitiatorError> {
        let c = self.cfg.clone();
        let s = |k: &str, v: &str| (k.to_string(), v.to_string());
        let mut sec = vec![s("InitiatorName", &c.initiator_name)];
        match &c.target_name {
            Some(t) => {
                sec.push(s("TargetName", t));
                sec.push(s("SessionType", "Normal"));
            }
            None => sec.push(s("SessionType", "Discovery")),
        }
        sec.push(s("AuthMethod", "None"));
        let r = self.login_step(true, 0, 1, &sec)?;
        if !r.bhs().login_transit() {
            return Err(InitiatorError::Protocol(
                "target did not leave the security stage".into(),
            ));
        }
        let yn = |b: bool| if b { "Yes" } else { "No" };
        let dg = |b: bool| if b { "CRC32C,None" } else { "None" };
        let mut op = vec![
            s("HeaderDigest", dg(c.header_digest)),
            s("DataDigest", dg(c.data_digest)),
            s(
                "MaxRecvDataSegmentLength",
                &c.max_recv_data_segment_length.to_string(),
            ),
        ];
        // RFC 7143 §13: leading-only keys go on the session's first
        // connection only.
        if c.target_name.is_some() && c.tsih == 0 {
            op.extend([
                s("ErrorRecoveryLevel", "0"),
                s("InitialR2T", yn(c.initial_r2t)),
                s("ImmediateData", yn(c.immediate_data)),
                s("MaxBurstLength", &c.max_burst_length.to_string()),
                s("FirstBurstLength", &c.first_burst_length.to_string()),
                s("MaxOutstandingR2T", "1"),
                s("MaxConnections", "1"),
                s("DataPDUInOrder", "Yes"),
                s("DataSequenceInOrder", "Yes"),
                s("DefaultTime2Wait", "2"),
                s("DefaultTime2Retain", "0"),
            ]);
        }
        for (k, v) in &c.extra_keys {
            match op.iter_mut().find(|(ok, _)| ok == k) {
                Some(e) => e.1 = v.clone(),
                None => op.push((k.clone(), v.clone())),
            }
        }
        let r = self.login_step(true, 1, 3, &op)?;
        if !r.bhs().login_transit() || r.bhs().login_nsg() != 3 {
            return Err(InitiatorError::Protocol(
                "target did not enter full feature phase".into(),
            ));
        }
        if self.cfg.tsih != 0 && r.bhs().tsih() != self.cfg.tsih {
            return Err(InitiatorError::Protocol(format!(
                "joined session {:#x} but the target answered TSIH {:#x}",
                self.cfg.tsih,
                r.bhs().tsih()
            )));
        }
        self.tsih = r.bhs().tsih();
        self.max_cmd_sn = r.bhs().max_cmd_sn();
        for (k, v) in self.login_keys.clone() {
            let n = v.parse::<u32>().ok();
            match (k.as_str(), n) {
                ("MaxRecvDataSegmentLength", Some(n)) => self.target_mrdsl = n,
                ("MaxBurstLength", Some(n)) => self.max_burst = n,
                ("FirstBurstLength", Some(n)) => self.first_burst = n,
                ("ImmediateData", _) => self.immediate_data = v == "Yes",
                ("InitialR2T", _) => self.initial_r2t = v == "Yes",
                ("HeaderDigest", _) => self.hd = v == "CRC32C",
                ("DataDigest", _) => self.dd = v == "CRC32C",
                _ => {}
            }
        }
        Ok(())
    }

    /// Takes the next CmdSN for a non-immediate request.
    fn take_cmd_sn(&mut self, immediate: bool) -> CmdSn {
        if let Some(c) = &self.shared_cmd_sn {
            let sn = if immediate {
                CmdSn(c.load(Ordering::SeqCst))
            } else {
                CmdSn(c.fetch_add(1, Ordering::SeqCst))
            };
            self.cmd_sn = sn;
            return sn;
        }
        let sn = self.cmd_sn;
        if !immediate {
            self.cmd_sn = sn.next();
        }
        sn
    }

    /// A SCSI Command PDU (with the immediate data it can carry). Returns the
    /// PDU and how many write bytes it carries.
    pub fn command_pdu(&mut self, itt: u32, c: &Command<'_>) -> (Pdu, usize) {
        let mut f = flags::F | (c.attr & 7);
        if c.read_len > 0 {
            f |= flags::R;
        }
        if !c.write.is_empty() {
            f |= flags::W;
        }
        let mut b = BhsBuf::new(Opcode::SCSI_CMD, f);
        if c.immediate {
            b.set_immediate();
        }
        let edtl = if c.write.is_empty() {
            c.read_len
        } else {
            c.write.len() as u32
        };
        let sn = self.take_cmd_sn(c.immediate);
        b.set_lun(c.lun.to_be_bytes())
            .set_itt(itt)
            .set_word20(edtl)
            .set_u32(24, sn.0)
            .set_u32(28, self.exp_stat_sn.0);
        let n = c.cdb.len().min(16);
        b.0[32..32 + n].copy_from_slice(&c.cdb[..n]);
        let mut ahs = Vec::new();
        if c.cdb.len() > 16 {
            let rest = &c.cdb[16..];
            ahs.extend_from_slice(&((rest.len() + 1) as u16).to_be_bytes());
            ahs.push(1);
            ahs.push(0);
            ahs.extend_from_slice(rest);
            ahs.resize(ahs.len().next_multiple_of(4), 0);
        }
        if c.read_len > 0 && !c.write.is_empty() {
            ahs.extend_from_slice(&[0, 5, 2, 0]);
            ahs.extend_from_slice(&c.read_len.to_be_bytes());
        }
        let imm = if self.immediate_data {
            c.write
                .len()
                .min(self.first_burst as usize)
                .min(self.target_mrdsl as usize)
        } else {
            0
        };
        // RFC 7143 §11.3.1: F stays clear when unsolicited Data-Out follows.
        let unsol = c.write.len().min(self.first_burst as usize);
        if !self.initial_r2t && unsol > imm {
            b.0[1] &= !flags::F;
        }
        let mut p = Pdu::with_data(b, c.write[..imm].to_vec());
        p.ahs = ahs;
        (p, imm)
    }

    /// Data-Out PDUs for `data[offset..offset+len]` in target-MRDSL pieces,
    /// DataSN from 0, F on the last.
    pub fn data_out_pdus(
        &self,
        lun: u64,
        itt: u32,
        ttt: u32,
        data: &[u8],
        offset: usize,
        len: usize,
    ) -> Vec<Pdu> {
        let mut out = Vec::new();
        let step = self.target_mrdsl.max(512) as usize;
        let mut at = offset;
        let end = (offset + len).min(data.len());
        let mut sn = DataSn(0);
        while at < end {
            let n = (end - at).min(step);
            let fin = at + n == end;
            let mut b = BhsBuf::new(Opcode::DATA_OUT, if fin { flags::F } else { 0 });
            b.set_lun(lun.to_be_bytes())
                .set_itt(itt)
                .set_word20(ttt)
                .set_u32(28, self.exp_stat_sn.0)
                .set_u32(36, sn.0)
                .set_u32(40, at as u32);
            out.push(Pdu::with_data(b, data[at..at + n].to_vec()));
            sn = sn.next();
            at += n;
        }
        out
    }

    /// Runs a SCSI command to completion: immediate and unsolicited data,
    /// R2Ts, Data-In, status. NOP-In pings are answered on the way.
    pub fn command(&mut self, c: &Command<'_>) -> Result<ScsiResult, InitiatorError> {
        let itt = self.new_itt();
        let (p, imm) = self.command_pdu(itt, c);
        self.send_pdu(&p)?;
        if !c.write.is_empty() && !self.initial_r2t {
            let unsol = c.write.len().min(self.first_burst as usize);
            if unsol > imm {
                for d in self.data_out_pdus(c.lun, itt, RESERVED_TAG, c.write, imm, unsol - imm) {
                    self.send_pdu(&d)?;
                }
            }
        }
        self.finish_command(itt, c)
    }

    /// Waits for the end of command `itt` (sent by the caller).
    pub fn finish_command(
        &mut self,
        itt: u32,
        c: &Command<'_>,
    ) -> Result<ScsiResult, InitiatorError> {
        let mut res = ScsiResult {
            status: 0,
            sense: Vec::new(),
            data: vec![0; c.read_len as usize],
            residual: 0,
            flags: 0,
            data_in_pdus: 0,
            r2ts: 0,
            status_in_data_in: false,
            exp_data_sn: 0,
        };
        let mut max_read = 0usize;
        loop {
            let p = self.recv_pdu()?;
            let b = p.bhs();
            match b.opcode() {
                Opcode::DATA_IN if b.itt() == itt => {
                    res.data_in_pdus += 1;
                    let off = b.buffer_offset() as usize;
                    let end = (off + p.data.len()).min(res.data.len());
                    if off < end {
                        res.data[off..end].copy_from_slice(&p.data[..end - off]);
                    }
                    max_read = max_read.max(off + p.data.len());
                    if b.flags() & flags::S != 0 {
                        res.status = b.0[3];
                        res.residual = b.word(44);
                        res.flags = b.flags();
                        res.status_in_data_in = true;
                        res.data.truncate(max_read);
                        return Ok(res);
                    }
                }
                Opcode::R2T if b.itt() == itt => {
                    res.r2ts += 1;
                    let (off, len) = (b.buffer_offset() as usize, b.word(44) as usize);
                    for d in self.data_out_pdus(c.lun, itt, b.ttt(), c.write, off, len) {
                        self.send_pdu(&d)?;
                    }
                }
                Opcode::SCSI_RSP if b.itt() == itt => {
                    res.status = b.0[3];
                    res.exp_data_sn = b.data_sn().0;
                    res.residual = b.word(44);
                    res.flags = b.flags();
                    if p.data.len() >= 2 {
                        let n = u16::from_be_bytes([p.data[0], p.data[1]]) as usize;
                        res.sense = p.data[2..(2 + n).min(p.data.len())].to_vec();
                    }
                    res.data.truncate(max_read);
                    return Ok(res);
                }
                Opcode::REJECT => return Err(InitiatorError::Rejected(b.0[2])),
                _ => self.unsolicited(p)?,
            }
        }
    }

    /// Handles a PDU nobody waited for: pings are answered, async messages kept.
    fn unsolicited(&mut self, p: Pdu) -> Result<(), InitiatorError> {
        let b = p.bhs();
        match b.opcode() {
            Opcode::NOP_IN if b.itt() == RESERVED_TAG && b.ttt() != RESERVED_TAG => {
                let mut r = BhsBuf::new(Opcode::NOP_OUT, flags::F);
                r.set_immediate()
                    .set_itt(RESERVED_TAG)
                    .set_word20(b.ttt())
                    .set_u32(24, self.current_cmd_sn().0)
                    .set_u32(28, self.exp_stat_sn.0);
                self.send_pdu(&Pdu::new(r))?;
                self.pings_answered += 1;
            }
            Opcode::ASYNC_MSG => self.async_msgs.push(p),
            _ => {}
        }
        Ok(())
    }

    /// Waits for the response to request `itt` of opcode `op`.
    pub fn wait_for(&mut self, op: Opcode, itt: u32) -> Result<Pdu, InitiatorError> {
        loop {
            let p = self.recv_pdu()?;
            let b = p.bhs();
            if b.opcode() == op && b.itt() == itt {
                return Ok(p);
            }
            if b.opcode() == Opcode::REJECT {
                return Err(InitiatorError::Rejected(b.0[2]));
            }
            self.unsolicited(p)?;
        }
    }

    /// NOP-Out ping with data; returns the echoed data.
    pub fn nop(&mut self, data: &[u8], immediate: bool) -> Result<Vec<u8>, InitiatorError> {
        let itt = self.new_itt();
        let mut b = BhsBuf::new(Opcode::NOP_OUT, flags::F);
        if immediate {
            b.set_immediate();
        }
        let sn = self.take_cmd_sn(immediate);
        b.set_itt(itt)
            .set_word20(RESERVED_TAG)
            .set_u32(24, sn.0)
            .set_u32(28, self.exp_stat_sn.0);
        self.send_pdu(&Pdu::with_data(b, data.to_vec()))?;
        Ok(self.wait_for(Opcode::NOP_IN, itt)?.data)
    }

    /// A Text Request with `keys`; follows continuations. Returns the keys.
    pub fn text(&mut self, keys: &[(&str, &str)]) -> Result<Vec<(String, String)>, InitiatorError> {
        let itt = self.new_itt();
        let mut ttt = RESERVED_TAG;
        let mut data = encode_text(keys);
        let mut all = Vec::new();
        loop {
            let mut b = BhsBuf::new(Opcode::TEXT_REQ, flags::F);
            b.set_immediate()
                .set_itt(itt)
                .set_word20(ttt)
                .set_u32(24, self.current_cmd_sn().0)
                .set_u32(28, self.exp_stat_sn.0);
            self.send_pdu(&Pdu::with_data(b, std::mem::take(&mut data)))?;
            let r = self.wait_for(Opcode::TEXT_RSP, itt)?;
            all.extend_from_slice(&r.data);
            if r.bhs().final_bit() {
                break;
            }
            ttt = r.bhs().ttt();
        }
        let pairs = parse_text(&all).map_err(|e| InitiatorError::Protocol(e.to_string()))?;
        Ok(pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// Task management request; returns the response code.
    pub fn tmf(&mut self, function: u8, lun: u64, ref_itt: u32) -> Result<u8, InitiatorError> {
        let itt = self.new_itt();
        let mut b = BhsBuf::new(Opcode::TMF_REQ, flags::F | (function & 0x7f));
        b.set_immediate()
            .set_lun(lun.to_be_bytes())
            .set_itt(itt)
            .set_word20(ref_itt)
            .set_u32(24, self.current_cmd_sn().0)
            .set_u32(28, self.exp_stat_sn.0);
        self.send_pdu(&Pdu::new(b))?;
        Ok(self.wait_for(Opcode::TMF_RSP, itt)?.bhs().0[2])
    }

    /// Logout (reason 0: close the session); returns the response code.
    pub fn logout(&mut self, reason: u8) -> Result<u8, InitiatorError> {
        let cid = self.cfg.cid;
        self.logout_cid(reason, cid)
    }

    /// Logout with reason `reason` naming connection `cid` (RFC 7143
    /// §11.14.1: reason 1 may close another connection of the session);
    /// returns the response code.
    pub fn logout_cid(&mut self, reason: u8, cid: u16) -> Result<u8, InitiatorError> {
        let itt = self.new_itt();
        let mut b = BhsBuf::new(Opcode::LOGOUT_REQ, flags::F | (reason & 0x7f));
        b.set_immediate()
            .set_itt(itt)
            .set_u16(20, cid)
            .set_u32(24, self.current_cmd_sn().0)
            .set_u32(28, self.exp_stat_sn.0);
        self.send_pdu(&Pdu::new(b))?;
        Ok(self.wait_for(Opcode::LOGOUT_RSP, itt)?.bhs().0[2])
    }
}

/// Connects over TCP and logs in.
pub fn connect(
    addr: std::net::SocketAddr,
    cfg: InitiatorConfig,
) -> Result<Initiator<TcpStream>, InitiatorError> {
    let s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut i = Initiator::new(s, cfg);
    i.login()?;
    Ok(i)
}
