//! What the `backend_*` end-to-end tests share: a configuration with one
//! target and one LUN per device, sessions of the project's initiator, the
//! SCSI commands the tests send, and a pipelined driver that keeps up to 32
//! commands in flight on one session (the initiator's own `command` is one
//! at a time).

#![allow(dead_code)] // each test file uses a part of it

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ferrite_iscsi::initiator::{Command, Initiator, ScsiResult};
use ferrite_iscsi::pdu::{BhsBuf, Opcode, Pdu, RESERVED_TAG, flags};
use ferrite_tests::{Config, Ferrited, Login, Options, Target, free_port};
pub use ferrite_tests::{Device, Rng};

pub const IQN: &str = "iqn.2026-11.org.ferrite:backends";

/// Writes a configuration with `devices`, LUN i mapping device i, into
/// `dir/ferrite.json`.
pub fn write_config(dir: &Path, port: u16, devices: &[Device]) -> PathBuf {
    let mut t = Target::new(IQN).portal(format!("127.0.0.1:{port}"));
    let mut c = Config::new();
    for (i, d) in devices.iter().enumerate() {
        t = t.lun(i as u64, &d.name());
        c = c.device(d.clone());
    }
    c.target(t).write(dir.join("ferrite.json"))
}

/// Starts ferrited on a free port with `devices` (see [`write_config`]).
pub fn start(dir: &Path, devices: &[Device]) -> Ferrited {
    let port = free_port();
    let cfg = write_config(dir, port, devices);
    start_with(dir, port, cfg)
}

/// Starts ferrited on `port` with the configuration file `cfg`.
pub fn start_with(dir: &Path, port: u16, cfg: PathBuf) -> Ferrited {
    Ferrited::start(
        dir,
        port,
        Options {
            config: Some(cfg),
            ..Options::default()
        },
    )
}

/// The 8-byte LUN field of LUN `n` (SAM-5 §4.7.3 peripheral addressing).
pub fn lun(n: u16) -> u64 {
    (n as u64) << 48
}

/// A session to the test target, with distinct ISIDs for distinct sessions.
pub fn login(addr: SocketAddr, name: &str, isid: u16) -> Initiator<TcpStream> {
    let i = Login::new(format!("iqn.2026-11.org.ferrite.test:{name}"), IQN)
        .isid([0x80, 0, 0, 0x61, (isid >> 8) as u8, isid as u8])
        .read_timeout(Duration::from_secs(60))
        .connect(addr);
    i.t.set_write_timeout(Some(Duration::from_secs(60)))
        .expect("write timeout");
    i
}

/// Sends TEST UNIT READY until it is GOOD (the first command of a nexus
/// reports POWER ON, RESET: SAM-5 §5.14); at most 4 tries.
pub fn clear_ua(i: &mut Initiator<TcpStream>, l: u64) {
    for _ in 0..4 {
        let r = run(i, l, &[0u8; 6], &[], 0);
        if r.status == 0 {
            return;
        }
        assert_eq!(r.status, 2, "TEST UNIT READY: {r:?}");
    }
    panic!("TEST UNIT READY never GOOD on LUN {}", l >> 48);
}

/// One command, waited for.
pub fn run(
    i: &mut Initiator<TcpStream>,
    l: u64,
    cdb: &[u8],
    write: &[u8],
    read_len: u32,
) -> ScsiResult {
    i.command(&Command {
        lun: l,
        cdb,
        write,
        read_len,
        attr: 1,
        immediate: false,
    })
    .unwrap_or_else(|e| panic!("command {:#04x}: {e}", cdb[0]))
}

/// Sense key, ASC, ASCQ of fixed or descriptor sense data.
pub fn sense_triple(sense: &[u8]) -> Option<(u8, u8, u8)> {
    match sense.first().map(|b| b & 0x7f) {
        Some(0x70 | 0x71) if sense.len() >= 14 => Some((sense[2] & 0x0f, sense[12], sense[13])),
        Some(0x72 | 0x73) if sense.len() >= 4 => Some((sense[1] & 0x0f, sense[2], sense[3])),
        _ => None,
    }
}

/// Asserts CHECK CONDITION with this sense key/ASC/ASCQ.
pub fn assert_check(r: &ScsiResult, key: u8, asc: u8, ascq: u8, what: &str) {
    assert_eq!(r.status, 2, "{what}: expected CHECK CONDITION, got {r:?}");
    assert_eq!(
        sense_triple(&r.sense),
        Some((key, asc, ascq)),
        "{what}: sense {:02x?}",
        r.sense
    );
}

/// READ (16) / WRITE (16) CDB (SBC-4 §5.16, §5.40), FUA in byte 1 bit 3.
pub fn rw16(write: bool, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = if write { 0x8a } else { 0x88 };
    if fua {
        c[1] = 0x08;
    }
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// SYNCHRONIZE CACHE (16) of the whole device (SBC-4 §5.27).
pub fn sync16() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x91;
    c
}

/// READ CAPACITY (16): (block size, number of blocks, LBPME, LBPRZ).
pub fn read_capacity(i: &mut Initiator<TcpStream>, l: u64) -> ScsiResult {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[13] = 32;
    run(i, l, &c, &[], 32)
}

/// Parses READ CAPACITY (16) data: (block size, blocks, LBPME, LBPRZ).
pub fn capacity_of(data: &[u8]) -> (u32, u64, bool, bool) {
    assert!(
        data.len() >= 16,
        "short READ CAPACITY (16) data {data:02x?}"
    );
    let last = u64::from_be_bytes(data[..8].try_into().expect("8 bytes"));
    let bs = u32::from_be_bytes(data[8..12].try_into().expect("4 bytes"));
    (bs, last + 1, data[14] & 0x80 != 0, data[14] & 0x40 != 0)
}

/// Block size and block count, the unit attention taken first.
pub fn geometry(i: &mut Initiator<TcpStream>, l: u64) -> (u32, u64) {
    clear_ua(i, l);
    let r = read_capacity(i, l);
    assert_eq!(r.status, 0, "READ CAPACITY (16): {r:?}");
    let (bs, n, _, _) = capacity_of(&r.data);
    (bs, n)
}

/// UNMAP of one range (SBC-4 §5.31), parameter list of one descriptor.
pub fn unmap(i: &mut Initiator<TcpStream>, l: u64, lba: u64, blocks: u32) -> ScsiResult {
    let mut p = vec![0u8; 24];
    p[0..2].copy_from_slice(&22u16.to_be_bytes());
    p[2..4].copy_from_slice(&16u16.to_be_bytes());
    p[8..16].copy_from_slice(&lba.to_be_bytes());
    p[16..20].copy_from_slice(&blocks.to_be_bytes());
    let mut c = [0u8; 10];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&(p.len() as u16).to_be_bytes());
    run(i, l, &c, &p, 0)
}

/// Fills one block with the pattern of (`lba`, `stamp`): the LBA and stamp
/// first, then bytes derived from both, so misplaced, stale or torn data
/// is told apart from the right data.
pub fn fill_block(b: &mut [u8], lba: u64, stamp: u64) {
    let mut x = Rng::from_state((lba.rotate_left(29) ^ stamp ^ 0x9e37_79b9_7f4a_7c15) | 1);
    for (k, chunk) in b.chunks_mut(8).enumerate() {
        let v = match k {
            0 => lba,
            1 => stamp,
            _ => x.next_u64(),
        };
        chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
    }
}

/// `blocks` blocks of pattern starting at `lba`, all with `stamp`.
pub fn pattern(lba: u64, blocks: u64, bs: u32, stamp: u64) -> Vec<u8> {
    let mut v = vec![0u8; (blocks * bs as u64) as usize];
    for (k, b) in v.chunks_mut(bs as usize).enumerate() {
        fill_block(b, lba + k as u64, stamp);
    }
    v
}

/// A command of a [`Pipe`].
pub struct PipeCmd {
    pub cdb: Vec<u8>,
    pub write: Vec<u8>,
    pub read_len: u32,
}

struct Slot {
    id: u64,
    cmd: PipeCmd,
    data: Vec<u8>,
}

/// Up to `qd` commands in flight on one session, within the target's CmdSN
/// window (RFC 7143 §3.2.2.1); write data as immediate data, unsolicited
/// Data-Out up to FirstBurstLength (InitialR2T=No) and Data-Out for R2Ts
/// (§11.8).
pub struct Pipe<'a> {
    pub i: &'a mut Initiator<TcpStream>,
    pub lun: u64,
    pub qd: usize,
    inflight: HashMap<u32, Slot>,
}

impl<'a> Pipe<'a> {
    pub fn new(i: &'a mut Initiator<TcpStream>, lun: u64, qd: usize) -> Pipe<'a> {
        Pipe {
            i,
            lun,
            qd,
            inflight: HashMap::new(),
        }
    }

    /// Commands sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Whether another command may be sent now.
    pub fn has_room(&self) -> bool {
        self.inflight.len() < self.qd && !self.i.cmd_sn.gt(self.i.max_cmd_sn)
    }

    /// Sends a command; `id` comes back with its result.
    pub fn send(&mut self, id: u64, cmd: PipeCmd) {
        let itt = self.i.new_itt();
        let c = Command {
            lun: self.lun,
            cdb: &cmd.cdb,
            write: &cmd.write,
            read_len: cmd.read_len,
            attr: 1,
            immediate: false,
        };
        let (p, imm) = self.i.command_pdu(itt, &c);
        self.i.send_pdu(&p).expect("send command");
        if !cmd.write.is_empty() && !self.i.initial_r2t {
            let unsol = cmd.write.len().min(self.i.first_burst as usize);
            if unsol > imm {
                for d in
                    self.i
                        .data_out_pdus(self.lun, itt, RESERVED_TAG, &cmd.write, imm, unsol - imm)
                {
                    self.i.send_pdu(&d).expect("send unsolicited Data-Out");
                }
            }
        }
        let data = vec![0u8; cmd.read_len as usize];
        self.inflight.insert(itt, Slot { id, cmd, data });
    }

    /// Waits for the next command to finish: its id and result.
    pub fn next_done(&mut self) -> (u64, ScsiResult) {
        assert!(!self.inflight.is_empty(), "nothing in flight");
        loop {
            let p = self.i.recv_pdu().expect("receive");
            let b = p.bhs();
            let itt = b.itt();
            match b.opcode() {
                Opcode::DATA_IN => {
                    let Some(s) = self.inflight.get_mut(&itt) else {
                        panic!("Data-In for unknown ITT {itt:#x}");
                    };
                    let off = b.buffer_offset() as usize;
                    let end = off + p.data.len();
                    assert!(end <= s.data.len(), "Data-In beyond the expected length");
                    s.data[off..end].copy_from_slice(&p.data);
                    if b.flags() & flags::S != 0 {
                        let s = self.inflight.remove(&itt).expect("present");
                        return (
                            s.id,
                            result(b.0[3], Vec::new(), s.data, b.word(44), b.flags()),
                        );
                    }
                }
                Opcode::R2T => {
                    let (off, len) = (b.buffer_offset() as usize, b.word(44) as usize);
                    let Some(s) = self.inflight.get(&itt) else {
                        panic!("R2T for unknown ITT {itt:#x}");
                    };
                    let pdus = self
                        .i
                        .data_out_pdus(self.lun, itt, b.ttt(), &s.cmd.write, off, len);
                    for d in pdus {
                        self.i.send_pdu(&d).expect("send Data-Out");
                    }
                }
                Opcode::SCSI_RSP => {
                    let Some(s) = self.inflight.remove(&itt) else {
                        panic!("response for unknown ITT {itt:#x}");
                    };
                    let sense = if p.data.len() >= 2 {
                        let n = u16::from_be_bytes([p.data[0], p.data[1]]) as usize;
                        p.data[2..(2 + n).min(p.data.len())].to_vec()
                    } else {
                        Vec::new()
                    };
                    return (s.id, result(b.0[3], sense, s.data, b.word(44), b.flags()));
                }
                Opcode::NOP_IN if itt == RESERVED_TAG && b.ttt() != RESERVED_TAG => {
                    // RFC 7143 §11.19: a target ping is answered with its TTT.
                    let mut r = BhsBuf::new(Opcode::NOP_OUT, flags::F);
                    r.set_immediate()
                        .set_itt(RESERVED_TAG)
                        .set_word20(b.ttt())
                        .set_u32(24, self.i.cmd_sn.0)
                        .set_u32(28, self.i.exp_stat_sn.0);
                    self.i.send_pdu(&Pdu::new(r)).expect("answer NOP-In");
                }
                Opcode::REJECT => panic!("target sent Reject, reason {:#04x}", b.0[2]),
                _ => {}
            }
        }
    }
}

fn result(status: u8, sense: Vec<u8>, data: Vec<u8>, residual: u32, fl: u8) -> ScsiResult {
    ScsiResult {
        status,
        sense,
        data,
        residual,
        flags: fl,
        data_in_pdus: 0,
        r2ts: 0,
        status_in_data_in: false,
        exp_data_sn: 0,
    }
}

/// Reads `[lba, lba+blocks)` at queue depth 32 in pieces of at most
/// `max_blocks`; calls `check(lba_of_piece, data)` for each piece.
pub fn read_all(
    i: &mut Initiator<TcpStream>,
    l: u64,
    bs: u32,
    lba: u64,
    blocks: u64,
    max_blocks: u64,
    mut check: impl FnMut(u64, &[u8]),
) {
    let mut pipe = Pipe::new(i, l, 32);
    let mut next = lba;
    let end = lba + blocks;
    while next < end || pipe.in_flight() > 0 {
        while next < end && pipe.has_room() {
            let n = (end - next).min(max_blocks);
            pipe.send(
                next,
                PipeCmd {
                    cdb: rw16(false, next, n as u32, false).to_vec(),
                    write: Vec::new(),
                    read_len: (n * bs as u64) as u32,
                },
            );
            next += n;
        }
        let (at, r) = pipe.next_done();
        assert_eq!(r.status, 0, "READ (16) at {at}: {r:?}");
        check(at, &r.data);
    }
}

/// Blocks the file at `path` occupies on disk, in bytes (st_blocks * 512).
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("stat").blocks() * 512
}

/// A directory on a filesystem that accepts O_DIRECT (the temp dir on disk,
/// else /dev/shm on kernels that allow it there), or None.
pub fn direct_io_dir() -> Option<tempfile::TempDir> {
    use std::os::unix::fs::OpenOptionsExt;
    for base in [
        std::env::temp_dir(),
        PathBuf::from("/var/tmp"),
        PathBuf::from("/dev/shm"),
    ] {
        let Ok(dir) = tempfile::tempdir_in(&base) else {
            continue;
        };
        let p = dir.path().join("probe");
        let ok = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc_o_direct())
            .open(&p)
            .is_ok();
        let _ = std::fs::remove_file(&p);
        if ok {
            return Some(dir);
        }
    }
    None
}

/// `O_DIRECT` on Linux (x86-64 and aarch64 differ; the tests crate has no
/// libc dependency).
fn libc_o_direct() -> i32 {
    if cfg!(any(target_arch = "aarch64", target_arch = "arm")) {
        0o200000
    } else {
        0o40000
    }
}
