//! ferrite-srp: the project's SRP initiator as a command. Logs in to an SRP
//! target port over the `soft` provider (a Unix socket path or ADDR:PORT)
//! or the `verbs` provider (RDMA CM ADDR:PORT), runs writes and reads of
//! one size at a queue depth with every read checked against what was
//! written, optionally sends a task management function, and logs out.
//! Prints what it measured; exits non-zero on a data mismatch or a failed
//! command.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use ferrite_rdma::soft::{SoftAddr, SoftCq, SoftDevice};
use ferrite_scsi::Lun;
use ferrite_srp::initiator::{self, Initiator, InitiatorConfig, Layout};
use ferrite_srp::iu;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Provider {
    /// Socket-backed test and development provider.
    Soft,
    /// libibverbs and RDMA CM (needs an HCA).
    Verbs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Tmf {
    AbortTaskSet,
    ClearTaskSet,
    LunReset,
    ClearAca,
}

/// SRP initiator: verified reads and writes at a queue depth.
#[derive(Parser, Debug)]
#[command(name = "ferrite-srp")]
struct Args {
    /// Target port: a Unix socket path or ADDR:PORT (soft), ADDR:PORT (verbs).
    #[arg(long)]
    connect: String,
    #[arg(long, value_enum, default_value_t = Provider::Soft)]
    provider: Provider,
    /// RDMA device for --provider verbs (default: the first one).
    #[arg(long)]
    device: Option<String>,
    /// SRP target port identifier, 32 hex digits.
    #[arg(long)]
    target_port_id: String,
    /// SRP initiator port identifier, 32 hex digits.
    #[arg(long, default_value = "0x00000000000000000000000000000001")]
    initiator_port_id: String,
    #[arg(long, default_value_t = 0)]
    lun: u16,
    /// Transfer size in bytes (K and M suffixes), a multiple of the block size.
    #[arg(long, default_value = "4K")]
    size: String,
    /// Commands in flight (at most the target's request limit).
    #[arg(long, default_value_t = 1)]
    qd: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Memory segments per data buffer (more than one: indirect descriptors).
    #[arg(long, default_value_t = 1)]
    segments: usize,
    /// Descriptors carried in the SRP_CMD; the rest the target fetches.
    #[arg(long, default_value_t = 16)]
    inline_descriptors: usize,
    /// Send this task management function to the LUN after the run.
    #[arg(long, value_enum)]
    tmf: Option<Tmf>,
    /// Ask to join the initiator port's existing channels (MULTI-CHANNEL ACTION 1).
    #[arg(long)]
    multi_channel: bool,
}

fn parse_id(s: &str) -> Result<[u8; 16]> {
    let h = s.strip_prefix("0x").unwrap_or(s);
    if h.len() != 32 {
        bail!("{s:?} is not 32 hex digits");
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16)
            .with_context(|| format!("{s:?} is not 32 hex digits"))?;
    }
    Ok(out)
}

fn parse_size(s: &str) -> Result<usize> {
    let (n, m) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let v: usize = n.parse().with_context(|| format!("{s:?} is not a size"))?;
    Ok(v * m)
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u64).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

fn rw16(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// Keeps what the provider needs alive as long as the channel (held, never
/// read).
enum Keep {
    Soft(#[allow(dead_code)] SoftDevice),
    Verbs,
}

fn connect(a: &Args, cfg: InitiatorConfig) -> Result<(Initiator, Keep)> {
    match a.provider {
        Provider::Soft => {
            let dev = SoftDevice::new("ferrite-srp");
            let pd = dev.alloc_pd();
            let cq = SoftCq::new()?;
            let addr = if a.connect.starts_with('/') {
                SoftAddr::Unix(PathBuf::from(&a.connect))
            } else {
                SoftAddr::Tcp(a.connect.parse().context("--connect: ADDR:PORT")?)
            };
            let ini = initiator::connect_soft(&pd, &cq, &addr, cfg)?;
            Ok((ini, Keep::Soft(dev)))
        }
        Provider::Verbs => {
            use ferrite_rdma::verbs::Context as Dev;
            let devs = Dev::cm_devices()?;
            let dev = match &a.device {
                Some(n) => devs.into_iter().find(|d| &d.name() == n),
                None => devs.into_iter().next(),
            };
            let Some(dev) = dev else {
                bail!("no RDMA device found");
            };
            let pd = dev.alloc_pd()?;
            let cq = dev.create_cq(4096)?;
            let addr = a.connect.parse().context("--connect: ADDR:PORT")?;
            let ini = initiator::connect_verbs(&pd, &cq, &addr, cfg)?;
            Ok((ini, Keep::Verbs))
        }
    }
}

/// One queue slot's job: write its region, then read it back and compare.
struct Slot {
    lba: u64,
    seed: u64,
    tag: Option<(u64, bool, Instant)>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let size = parse_size(&a.size)?;
    let cfg = InitiatorConfig {
        initiator_port_id: parse_id(&a.initiator_port_id)?,
        target_port_id: parse_id(&a.target_port_id)?,
        recv_count: (a.qd as u32 + 8).max(72),
        multi_channel: a.multi_channel,
        ..InitiatorConfig::default()
    };
    let (mut ini, _keep) = connect(&a, cfg).context("SRP login")?;
    println!(
        "logged in: request limit {}, max target-to-initiator IU {}, multi-channel result {}",
        ini.login_rsp.req_lim_delta,
        ini.login_rsp.max_ti_iu_len,
        ini.login_rsp.rsp_flags & 3
    );
    let lun = Lun(a.lun);
    let layout = Layout {
        segments: a.segments,
        inline_max: a.inline_descriptors,
    };
    // Unit attentions of a new nexus, then READ CAPACITY (16).
    let mut cap = None;
    for _ in 0..8 {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x9e;
        cdb[1] = 0x10;
        cdb[13] = 32;
        let c = ini.command(lun, &cdb, None, 32, Layout::default())?;
        if c.rsp.status == 0 {
            let last = u64::from_be_bytes(c.data[0..8].try_into()?);
            let bs = u32::from_be_bytes(c.data[8..12].try_into()?) as usize;
            cap = Some((last + 1, bs));
            break;
        }
    }
    let Some((blocks, bs)) = cap else {
        bail!("READ CAPACITY (16) kept failing");
    };
    if size == 0 || !size.is_multiple_of(bs) {
        bail!("--size {size} is not a multiple of the {bs}-byte block");
    }
    let per = (size / bs) as u64;
    let qd = a.qd.clamp(1, ini.credits().max(1) as usize);
    if per * qd as u64 > blocks {
        bail!("{qd} regions of {size} bytes do not fit the LUN ({blocks} blocks)");
    }
    let mut slots: Vec<Slot> = (0..qd)
        .map(|i| Slot {
            lba: i as u64 * per,
            seed: i as u64,
            tag: None,
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(a.seconds);
    let (mut reads, mut writes, mut bad) = (0u64, 0u64, 0u64);
    let mut lat_us: Vec<u64> = Vec::new();
    let started = Instant::now();
    loop {
        let running = Instant::now() < end;
        for s in slots.iter_mut().filter(|s| s.tag.is_none() && running) {
            let data = pattern(s.seed, size);
            let tag = ini.submit(
                lun,
                &rw16(0x8a, s.lba, per as u32),
                Some(&data),
                0,
                layout,
                iu::TASK_ATTR_SIMPLE,
            )?;
            s.tag = Some((tag, true, Instant::now()));
        }
        if slots.iter().all(|s| s.tag.is_none()) {
            break;
        }
        let _ = ini.progress(Instant::now() + Duration::from_millis(10));
        for s in &mut slots {
            let Some((tag, is_write, t0)) = s.tag else {
                continue;
            };
            if !ini.has_response(tag) {
                continue;
            }
            let c = ini.wait(tag)?;
            lat_us.push(t0.elapsed().as_micros() as u64);
            s.tag = None;
            if c.rsp.status != 0 {
                bad += 1;
                eprintln!("LBA {}: status {:#x}", s.lba, c.rsp.status);
                continue;
            }
            if is_write {
                writes += 1;
                let tag = ini.submit(
                    lun,
                    &rw16(0x88, s.lba, per as u32),
                    None,
                    size as u32,
                    layout,
                    iu::TASK_ATTR_SIMPLE,
                )?;
                s.tag = Some((tag, false, Instant::now()));
            } else {
                reads += 1;
                if c.data != pattern(s.seed, size) {
                    bad += 1;
                    eprintln!("LBA {}: data read back differs from data written", s.lba);
                }
                s.seed = s.seed.wrapping_add(qd as u64);
            }
        }
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    lat_us.sort_unstable();
    let q = |p: f64| {
        lat_us
            .get(((lat_us.len() as f64 * p) as usize).min(lat_us.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let mib = ((reads + writes) * size as u64) as f64 / (1 << 20) as f64 / secs;
    println!(
        "{} bytes, QD {qd}, {:.1} s: {writes} writes, {reads} verified reads, {:.0} IOPS, {mib:.1} MiB/s, latency p50 {} us p99 {} us, {bad} failed",
        size,
        secs,
        (reads + writes) as f64 / secs,
        q(0.5),
        q(0.99)
    );
    if let Some(t) = a.tmf {
        let func = match t {
            Tmf::AbortTaskSet => iu::TskFunc::ABORT_TASK_SET,
            Tmf::ClearTaskSet => iu::TskFunc::CLEAR_TASK_SET,
            Tmf::LunReset => iu::TskFunc::LUN_RESET,
            Tmf::ClearAca => iu::TskFunc::CLEAR_ACA,
        };
        let r = ini.task_mgmt(lun, func, 0)?;
        // SRP r16a §6.9: RSP_CODE in byte 3 of the response data.
        println!("{t:?}: response code {:?}", r.resp_data.get(3));
    }
    ini.logout()?;
    if bad > 0 {
        bail!("{bad} commands failed or read back wrong data");
    }
    Ok(())
}
