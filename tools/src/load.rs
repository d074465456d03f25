//! The project's own load generator: READ(16)/WRITE(16) at a queue depth
//! over one iSCSI session of `ferrite_iscsi::initiator`, with the latency
//! of every command measured from sending its PDU to its status.
//!
//! Commands are pipelined within the target's CmdSN window (RFC 7143
//! §3.2.2.1: a command may be sent while CmdSN <= MaxCmdSN). Write data goes
//! as immediate data, unsolicited Data-Out up to FirstBurstLength, and
//! Data-Out answering R2Ts (RFC 7143 §11.8). Every load is bounded in time
//! and in count.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::{
    self, Command, Initiator, InitiatorConfig, InitiatorError, Transport,
};
use ferrite_iscsi::pdu::{BhsBuf, Opcode, Pdu, RESERVED_TAG, flags};

/// A TCP transport that cannot deadlock against a target that is itself
/// blocked sending: while a send would block, what the target sent is read
/// into a side buffer that `recv` hands out first. A receive that sees no
/// byte for `stall` fails, so a stalled target ends the run.
#[derive(Debug)]
pub struct BenchTcp {
    s: TcpStream,
    side: Vec<u8>,
    side_at: usize,
    stall: Duration,
}

impl BenchTcp {
    pub fn connect(addr: SocketAddr, stall: Duration) -> io::Result<BenchTcp> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        s.set_write_timeout(Some(Duration::from_millis(5)))?;
        s.set_read_timeout(Some(stall))?;
        Ok(BenchTcp {
            s,
            side: Vec::new(),
            side_at: 0,
            stall,
        })
    }

    fn drain_incoming(&mut self) -> io::Result<()> {
        self.s.set_nonblocking(true)?;
        let mut buf = [0u8; 65536];
        let r = loop {
            match self.s.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => self.side.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        self.s.set_nonblocking(false)?;
        r
    }
}

impl Transport for BenchTcp {
    fn send(&mut self, data: &[u8]) -> io::Result<()> {
        let mut off = 0;
        let start = Instant::now();
        while off < data.len() {
            match self.s.write(&data[off..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => off += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if start.elapsed() > self.stall {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "target stalled"));
                    }
                    self.drain_incoming()?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.side_at < self.side.len() {
            let n = (self.side.len() - self.side_at).min(buf.len());
            buf[..n].copy_from_slice(&self.side[self.side_at..self.side_at + n]);
            self.side_at += n;
            if self.side_at == self.side.len() {
                self.side.clear();
                self.side_at = 0;
            }
            return Ok(n);
        }
        loop {
            match self.s.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "target stalled"));
                }
                r => return r,
            }
        }
    }
}

/// A LUN to drive.
#[derive(Clone, Debug)]
pub struct LunAddr {
    pub portal: SocketAddr,
    pub iqn: String,
    pub lun: u16,
}

impl LunAddr {
    /// The 8-byte LUN field as the initiator's u64 (SAM-5 §4.7.3 peripheral
    /// device addressing for LUNs below 256, flat space above).
    pub fn lun_field(&self) -> u64 {
        let l = self.lun as u64;
        if l < 256 {
            l << 48
        } else {
            (0x4000 | (l & 0x3fff)) << 48
        }
    }

    pub fn url(&self) -> String {
        format!("iscsi://{}/{}/{}", self.portal, self.iqn, self.lun)
    }
}

/// Errors of the load generator.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Initiator(#[from] InitiatorError),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("SCSI status {status:#04x} on {what}")]
    Status { status: u8, what: &'static str },
    #[error("{0}")]
    Protocol(String),
}

/// Opens a session to a LUN with the given ISID tail (distinct ISIDs make
/// distinct sessions).
pub fn open(addr: &LunAddr, isid_tail: u16) -> Result<Initiator<BenchTcp>, LoadError> {
    let t = BenchTcp::connect(addr.portal, Duration::from_secs(10))?;
    let cfg = InitiatorConfig {
        initiator_name: "iqn.2026-11.org.ferrite:bench".into(),
        target_name: Some(addr.iqn.clone()),
        isid: [
            0x80,
            0x00,
            0x00,
            0x42,
            (isid_tail >> 8) as u8,
            isid_tail as u8,
        ],
        max_recv_data_segment_length: 262_144,
        max_burst_length: 1_048_576,
        first_burst_length: 65_536,
        immediate_data: true,
        initial_r2t: false,
        ..InitiatorConfig::default()
    };
    let mut i = Initiator::new(t, cfg);
    i.login()?;
    Ok(i)
}

/// Same as [`open`] over a plain `TcpStream` (idle sessions).
pub fn open_plain(addr: &LunAddr, isid_tail: u16) -> Result<Initiator<TcpStream>, LoadError> {
    let cfg = InitiatorConfig {
        initiator_name: "iqn.2026-11.org.ferrite:bench".into(),
        target_name: Some(addr.iqn.clone()),
        isid: [
            0x80,
            0x00,
            0x00,
            0x43,
            (isid_tail >> 8) as u8,
            isid_tail as u8,
        ],
        ..InitiatorConfig::default()
    };
    Ok(initiator::connect(addr.portal, cfg)?)
}

/// Block size and block count of a LUN (READ CAPACITY (16), SBC-4 §5.20),
/// after TEST UNIT READY has consumed the power-on unit attention.
pub fn capacity<T: Transport>(i: &mut Initiator<T>, lun: u64) -> Result<(u32, u64), LoadError> {
    for _ in 0..3 {
        let tur = [0u8; 6];
        let r = i.command(&Command {
            lun,
            cdb: &tur,
            attr: 1,
            ..Command::default()
        })?;
        if r.status == 0 {
            break;
        }
    }
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9e;
    cdb[1] = 0x10;
    cdb[13] = 32;
    let r = i.command(&Command {
        lun,
        cdb: &cdb,
        read_len: 32,
        attr: 1,
        ..Command::default()
    })?;
    if r.status != 0 || r.data.len() < 12 {
        return Err(LoadError::Status {
            status: r.status,
            what: "READ CAPACITY (16)",
        });
    }
    let mut last = [0u8; 8];
    last.copy_from_slice(&r.data[..8]);
    let bs = u32::from_be_bytes([r.data[8], r.data[9], r.data[10], r.data[11]]);
    if bs == 0 {
        return Err(LoadError::Protocol("block length 0".into()));
    }
    Ok((bs, u64::from_be_bytes(last).saturating_add(1)))
}

/// What to run.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// Bytes per command (a multiple of the block size).
    pub bytes: u32,
    pub qd: u32,
    /// Percentage of reads (100: all reads, 0: all writes).
    pub read_pct: u8,
    pub random: bool,
    /// Measured time, after `warmup`.
    pub duration: Duration,
    pub warmup: Duration,
    /// Hard cap on commands completed in the measured window.
    pub max_ops: u64,
}

/// What a load measured (the measured window only).
#[derive(Clone, Debug, Default)]
pub struct LoadResult {
    pub ops: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    /// Per-command latency in nanoseconds, ascending.
    pub lat_ns: Vec<u64>,
    /// Target CPU ticks at the start and end of the window (if sampled).
    pub cpu_ticks: Option<(u64, u64)>,
    /// Commands that ended with a status other than GOOD.
    pub bad_status: u64,
}

impl LoadResult {
    pub fn iops(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 { self.ops as f64 / s } else { 0.0 }
    }
}

/// xorshift64*: a reproducible LBA stream without a dependency.
#[derive(Clone, Debug)]
pub struct Xorshift(u64);

impl Xorshift {
    pub fn new(seed: u64) -> Xorshift {
        Xorshift(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform-enough value in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// READ(16) or WRITE(16) CDB (SBC-4 §5.16, §5.40).
pub fn rw16_cdb(write: bool, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = if write { 0x8a } else { 0x88 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

struct InFlight {
    sent: Instant,
    write: bool,
    len: u32,
}

/// Runs a load on an open session. `target_pid` is sampled for CPU time at
/// the start and end of the measured window. Stops early (with what it has)
/// when `stop` is set.
pub fn run<T: Transport>(
    i: &mut Initiator<T>,
    lun: u64,
    geom: (u32, u64),
    spec: &LoadSpec,
    target_pid: Option<u32>,
    stop: &AtomicBool,
) -> Result<LoadResult, LoadError> {
    // SAM-5 §5.14: a new I_T nexus starts with a unit attention; TEST UNIT
    // READY takes it before the measured commands.
    for _ in 0..4 {
        let tur = [0u8; 6];
        let r = i.command(&Command {
            lun,
            cdb: &tur,
            attr: 1,
            ..Command::default()
        })?;
        if r.status == 0 {
            break;
        }
    }
    let (bs, nblocks) = geom;
    let per = (spec.bytes / bs).max(1);
    let slots = (nblocks / per as u64).max(1);
    let wbuf = vec![0x5au8; spec.bytes as usize];
    let mut rng = Xorshift::new(0x9e37_79b9_7f4a_7c15 ^ spec.bytes as u64 ^ (spec.qd as u64) << 32);
    let mut seq = 0u64;
    let mut inflight: HashMap<u32, InFlight> = HashMap::with_capacity(spec.qd as usize * 2);
    let mut res = LoadResult::default();
    let start = Instant::now();
    let measure_from = start + spec.warmup;
    let end = measure_from + spec.duration;
    let mut measuring = spec.warmup.is_zero();
    let mut window_start = start;
    let mut cpu_a = if measuring {
        target_pid.and_then(crate::procfs::cpu_ticks)
    } else {
        None
    };
    let mut lat = Vec::with_capacity(1 << 16);
    let mut sending = true;
    loop {
        let now = Instant::now();
        if !measuring && now >= measure_from {
            measuring = true;
            window_start = now;
            cpu_a = target_pid.and_then(crate::procfs::cpu_ticks);
        }
        if sending && (now >= end || res.ops >= spec.max_ops || stop.load(Ordering::Relaxed)) {
            sending = false;
            res.elapsed = now.duration_since(window_start);
            if let (Some(pid), Some(a)) = (target_pid, cpu_a) {
                res.cpu_ticks = crate::procfs::cpu_ticks(pid).map(|b| (a, b));
            }
        }
        // Fill the queue within the CmdSN window.
        while sending && inflight.len() < spec.qd as usize && !i.cmd_sn.gt(i.max_cmd_sn) {
            let write = spec.read_pct < 100
                && (spec.read_pct == 0 || (rng.below(100) as u8) >= spec.read_pct);
            let slot = if spec.random {
                rng.below(slots)
            } else {
                let s = seq % slots;
                seq += 1;
                s
            };
            let cdb = rw16_cdb(write, slot * per as u64, per);
            let c = Command {
                lun,
                cdb: &cdb,
                read_len: if write { 0 } else { spec.bytes },
                write: if write { &wbuf } else { &[] },
                attr: 1,
                immediate: false,
            };
            let itt = i.new_itt();
            let (p, imm) = i.command_pdu(itt, &c);
            let sent = Instant::now();
            i.send_pdu(&p)?;
            // RFC 7143 §13.10/§13.13: with InitialR2T=No the initiator may send
            // unsolicited Data-Out up to FirstBurstLength.
            if write && !i.initial_r2t {
                let unsol = (spec.bytes as usize).min(i.first_burst as usize);
                if unsol > imm {
                    for d in i.data_out_pdus(lun, itt, RESERVED_TAG, &wbuf, imm, unsol - imm) {
                        i.send_pdu(&d)?;
                    }
                }
            }
            inflight.insert(
                itt,
                InFlight {
                    sent,
                    write,
                    len: spec.bytes,
                },
            );
        }
        if inflight.is_empty() {
            break;
        }
        let p = i.recv_pdu()?;
        let b = p.bhs();
        let done = match b.opcode() {
            Opcode::DATA_IN if b.flags() & flags::S != 0 => Some((b.itt(), b.0[3])),
            Opcode::DATA_IN => None,
            Opcode::SCSI_RSP => Some((b.itt(), b.0[3])),
            Opcode::R2T => {
                let itt = b.itt();
                let (off, len) = (b.buffer_offset() as usize, b.word(44) as usize);
                if inflight.get(&itt).is_some_and(|f| f.write) {
                    for d in i.data_out_pdus(lun, itt, b.ttt(), &wbuf, off, len) {
                        i.send_pdu(&d)?;
                    }
                }
                None
            }
            Opcode::NOP_IN if b.itt() == RESERVED_TAG && b.ttt() != RESERVED_TAG => {
                // RFC 7143 §11.19: a target ping is answered with its TTT.
                let mut r = BhsBuf::new(Opcode::NOP_OUT, flags::F);
                r.set_immediate()
                    .set_itt(RESERVED_TAG)
                    .set_word20(b.ttt())
                    .set_u32(24, i.cmd_sn.0)
                    .set_u32(28, i.exp_stat_sn.0);
                i.send_pdu(&Pdu::new(r))?;
                None
            }
            Opcode::REJECT => {
                return Err(LoadError::Protocol(format!(
                    "target sent Reject, reason {:#04x}",
                    b.0[2]
                )));
            }
            _ => None,
        };
        if let Some(f) = done.and_then(|(itt, _)| inflight.remove(&itt)) {
            let status = done.map_or(0, |d| d.1);
            let t = Instant::now();
            if status != 0 {
                res.bad_status += 1;
            }
            if sending && measuring && f.sent >= window_start {
                res.ops += 1;
                res.bytes += f.len as u64;
                lat.push(t.duration_since(f.sent).as_nanos() as u64);
            }
        }
    }
    if sending {
        res.elapsed = Instant::now().duration_since(window_start);
    }
    lat.sort_unstable();
    res.lat_ns = lat;
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdbs_and_lun_fields() {
        let c = rw16_cdb(false, 0x0102_0304_0506_0708, 8);
        assert_eq!(c[0], 0x88);
        assert_eq!(&c[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&c[10..14], &[0, 0, 0, 8]);
        assert_eq!(rw16_cdb(true, 0, 1)[0], 0x8a);
        let a = LunAddr {
            portal: "127.0.0.1:3260".parse().unwrap(),
            iqn: "iqn.x:y".into(),
            lun: 1,
        };
        assert_eq!(a.lun_field().to_be_bytes(), [0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(a.url(), "iscsi://127.0.0.1:3260/iqn.x:y/1");
        let b = LunAddr { lun: 300, ..a };
        assert_eq!(b.lun_field().to_be_bytes(), [0x41, 0x2c, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn xorshift_stays_in_range_and_spreads() {
        let mut r = Xorshift::new(7);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let v = r.below(10);
            assert!(v < 10);
            seen[v as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }
}
