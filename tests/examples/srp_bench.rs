//! SRP over the soft RDMA provider next to iSCSI over loopback TCP, against
//! one ferrited and one nullio `mem` LUN exported on both fabrics.
//!
//! `cargo build --release --bin ferrited && cargo run --release -p
//! ferrite-tests --example srp_bench [-- SECONDS_PER_CASE]`
//!
//! Prints, per fabric: queue-depth-1 latency of 4 KiB reads (mean, p50,
//! p99) and throughput of 128 KiB and 1 MiB reads and writes at queue depth
//! 1; for SRP also at queue depth 16 (the project's iSCSI initiator runs
//! one command at a time, so iSCSI has no deeper line). The soft provider
//! moves RDMA bytes through a Unix socket and helper threads: these numbers
//! measure the target's SRP path plus that emulation, not InfiniBand.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark driver: a failed step ends the run

use std::collections::VecDeque;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use ferrite_iscsi::initiator::{Command, Initiator as IscsiIni, InitiatorConfig as IscsiCfg};
use ferrite_rdma::soft::{SoftAddr, SoftCq, SoftDevice};
use ferrite_scsi::Lun;
use ferrite_srp::initiator::{self, Initiator, InitiatorConfig, Layout};
use ferrite_srp::iu;
use ferrite_tests::{Ferrited, Options, free_port};

const IQN: &str = "iqn.2026-11.org.ferrite:bench";
const PORT_ID: [u8; 16] = *b"ferrite bench p0";
const BS: u64 = 512;

fn cdb(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// One fabric's way of running a command synchronously.
trait Fabric {
    fn name(&self) -> &'static str;
    fn run(&mut self, write: bool, lba: u64, len: usize, buf: &[u8]);
}

struct Srp {
    ini: Initiator,
    _dev: SoftDevice,
}

impl Fabric for Srp {
    fn name(&self) -> &'static str {
        "SRP/soft"
    }
    fn run(&mut self, write: bool, lba: u64, len: usize, buf: &[u8]) {
        let blocks = (len as u64 / BS) as u32;
        let c = if write {
            self.ini.command(
                Lun(0),
                &cdb(0x8a, lba, blocks),
                Some(&buf[..len]),
                0,
                Layout::default(),
            )
        } else {
            self.ini.command(
                Lun(0),
                &cdb(0x88, lba, blocks),
                None,
                len as u32,
                Layout::default(),
            )
        }
        .unwrap();
        assert_eq!(c.rsp.status, 0);
    }
}

struct Iscsi {
    ini: IscsiIni<TcpStream>,
}

impl Fabric for Iscsi {
    fn name(&self) -> &'static str {
        "iSCSI/TCP"
    }
    fn run(&mut self, write: bool, lba: u64, len: usize, buf: &[u8]) {
        let blocks = (len as u64 / BS) as u32;
        let op = if write { 0x8a } else { 0x88 };
        let r = self
            .ini
            .command(&Command {
                cdb: &cdb(op, lba, blocks),
                read_len: if write { 0 } else { len as u32 },
                write: if write { &buf[..len] } else { &[] },
                attr: 1,
                ..Command::default()
            })
            .unwrap();
        assert_eq!(r.status, 0);
    }
}

fn srp_login(sock: &Path) -> Srp {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let dev = SoftDevice::new("bench");
        let pd = dev.alloc_pd();
        let cq = SoftCq::new().unwrap();
        let cfg = InitiatorConfig {
            initiator_port_id: [0x42; 16],
            target_port_id: PORT_ID,
            recv_count: 160,
            ..InitiatorConfig::default()
        };
        match initiator::connect_soft(&pd, &cq, &SoftAddr::Unix(sock.into()), cfg) {
            Ok(ini) => {
                let mut s = Srp { ini, _dev: dev };
                for _ in 0..8 {
                    let c = s
                        .ini
                        .command(Lun(0), &[0u8; 6], None, 0, Layout::default())
                        .unwrap();
                    if c.rsp.status == 0 {
                        break;
                    }
                }
                return s;
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("SRP login: {e}"),
        }
    }
}

fn iscsi_login(f: &Ferrited) -> Iscsi {
    let mut ini = ferrite_iscsi::initiator::connect(
        f.addr,
        IscsiCfg {
            target_name: Some(IQN.into()),
            ..IscsiCfg::default()
        },
    )
    .unwrap();
    for _ in 0..8 {
        let r = ini
            .command(&Command {
                cdb: &[0u8; 6],
                attr: 1,
                ..Command::default()
            })
            .unwrap();
        if r.status == 0 {
            break;
        }
    }
    Iscsi { ini }
}

fn latency(f: &mut dyn Fabric, secs: f64) {
    let buf = vec![0u8; 4096];
    let mut lat = Vec::new();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut lba = 0;
    while Instant::now() < end {
        let t = Instant::now();
        f.run(false, lba, 4096, &buf);
        lat.push(t.elapsed());
        lba = (lba + 8) % (1 << 20);
    }
    lat.sort();
    let mean = lat.iter().sum::<Duration>() / lat.len().max(1) as u32;
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    println!(
        "{:<10} 4 KiB read  QD1   latency mean {:>7.1} us  p50 {:>7.1} us  p99 {:>7.1} us  ({} I/Os)",
        f.name(),
        mean.as_secs_f64() * 1e6,
        p(0.5).as_secs_f64() * 1e6,
        p(0.99).as_secs_f64() * 1e6,
        lat.len()
    );
}

fn throughput(f: &mut dyn Fabric, write: bool, len: usize, secs: f64) {
    let buf = vec![0x5au8; len];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let (mut n, mut lba) = (0u64, 0u64);
    while Instant::now() < end {
        f.run(write, lba, len, &buf);
        n += 1;
        lba = (lba + len as u64 / BS) % (1 << 20);
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "{:<10} {:>4} KiB {} QD1   {:>8.1} MiB/s  {:>8.0} IOPS",
        f.name(),
        len / 1024,
        if write { "write" } else { "read " },
        (n * len as u64) as f64 / el / (1 << 20) as f64,
        n as f64 / el
    );
}

fn srp_deep(s: &mut Srp, write: bool, len: usize, qd: usize, secs: f64) {
    let buf = vec![0xa5u8; len];
    let blocks = (len as u64 / BS) as u32;
    let mut q = VecDeque::new();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let (mut n, mut lba) = (0u64, 0u64);
    while Instant::now() < end || !q.is_empty() {
        while q.len() < qd && Instant::now() < end {
            let tag = if write {
                s.ini.submit(
                    Lun(0),
                    &cdb(0x8a, lba, blocks),
                    Some(&buf),
                    0,
                    Layout::default(),
                    iu::TASK_ATTR_SIMPLE,
                )
            } else {
                s.ini.submit(
                    Lun(0),
                    &cdb(0x88, lba, blocks),
                    None,
                    len as u32,
                    Layout::default(),
                    iu::TASK_ATTR_SIMPLE,
                )
            }
            .unwrap();
            q.push_back(tag);
            lba = (lba + u64::from(blocks)) % (1 << 20);
        }
        if let Some(t) = q.pop_front() {
            assert_eq!(s.ini.wait(t).unwrap().rsp.status, 0);
            n += 1;
        }
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "{:<10} {:>4} KiB {} QD{qd:<3} {:>8.1} MiB/s  {:>8.0} IOPS",
        "SRP/soft",
        len / 1024,
        if write { "write" } else { "read " },
        (n * len as u64) as f64 / el / (1 << 20) as f64,
        n as f64 / el
    );
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3.0);
    let dir = tempfile::Builder::new()
        .prefix("fsrpb")
        .tempdir_in("/tmp")
        .unwrap();
    let sock = dir.path().join("srp.sock");
    let port = free_port();
    let pid: String = PORT_ID.iter().map(|b| format!("{b:02x}")).collect();
    let cfg = format!(
        r#"{{"devices": [{{"name": "m0", "handler": "vdisk_nullio", "mem": true, "size": 1073741824}}],
  "targets": {{"iscsi": [{{"name": "{IQN}", "portals": ["127.0.0.1:{port}"], "luns": [{{"lun": 0, "device": "m0"}}]}}],
              "srp": [{{"name": "bench0", "port_id": "{pid}", "provider": {{"kind": "soft", "listen": "{}"}},
                        "luns": [{{"lun": 0, "device": "m0"}}]}}]}}}}"#,
        sock.display()
    );
    let cfg_path = dir.path().join("ferrite.json");
    std::fs::write(&cfg_path, cfg).unwrap();
    let f = Ferrited::start(
        dir.path(),
        port,
        Options {
            config: Some(cfg_path),
            args: vec!["--cores".into(), "1".into()],
        },
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    println!("ferrited (1 reactor core), nullio mem LUN, initiator in this process");
    println!("machine: {model}, {cpus} CPUs; {secs} s per case");
    println!(
        "SRP: soft RDMA provider over a Unix socket (test and development provider, not InfiniBand)"
    );
    println!("iSCSI: the project's initiator over loopback TCP, one command at a time");
    println!();
    let mut srp = srp_login(&sock);
    let mut isc = iscsi_login(&f);
    let fabrics: [&mut dyn Fabric; 2] = [&mut srp, &mut isc];
    for fab in fabrics {
        latency(fab, secs);
    }
    println!();
    for (write, len) in [
        (false, 128 << 10),
        (true, 128 << 10),
        (false, 1 << 20),
        (true, 1 << 20),
    ] {
        throughput(&mut srp, write, len, secs);
        throughput(&mut isc, write, len, secs);
    }
    println!();
    for (write, len) in [(false, 128 << 10), (true, 128 << 10)] {
        srp_deep(&mut srp, write, len, 16, secs);
    }
    srp.ini.logout().unwrap();
}
