//! ferrite-bench: ferrited, tgtd and istgt side by side on one machine, on
//! loopback, under the same initiators, in one run; plus the loopback
//! ceiling, a latency model (setup + bytes / bandwidth) and ferrited's
//! memory. Prints one Markdown report and writes it, the raw runs and an
//! SVG plot to `--out`. It measures and reports; it never fails on a slow
//! machine. Every target process is stopped by PID at exit, on error and on
//! Ctrl-C.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use ferrite_tools::ceiling;
use ferrite_tools::iscsi_perf::{self, PerfRun};
use ferrite_tools::load::{self, LoadSpec, LunAddr};
use ferrite_tools::peers::{self, Kind, Layout, TargetProc};
use ferrite_tools::plot::{self, Series};
use ferrite_tools::procfs;
use ferrite_tools::stats::{self, Summary};

/// Side-by-side iSCSI benchmark: ferrited vs tgtd vs istgt on loopback.
#[derive(Parser, Debug)]
#[command(name = "ferrite-bench")]
struct Args {
    /// One 1-second run per cell, a shorter sweep and memory sample.
    #[arg(long)]
    quick: bool,
    /// Runs per cell (median and min-max are reported). Default 3, 1 with --quick.
    #[arg(long)]
    reps: Option<u32>,
    /// Seconds per run. Default 5, 1 with --quick.
    #[arg(long)]
    seconds: Option<u32>,
    /// Where results go (report.md, runs.tsv, latency-model.svg, logs).
    #[arg(long, default_value = "bench-out")]
    out: PathBuf,
    /// Also write the plot here (e.g. docs/bench-latency-model.svg).
    #[arg(long)]
    svg: Option<PathBuf>,
    /// The ferrited binary (default: next to this binary).
    #[arg(long)]
    ferrited: Option<PathBuf>,
    /// Extra ferrited argument (repeatable), e.g. --ferrited-arg=--cores=1.
    #[arg(long = "ferrited-arg", allow_hyphen_values = true)]
    ferrited_args: Vec<String>,
    /// Targets to run (comma separated: ferrited,tgtd,istgt).
    #[arg(long, value_delimiter = ',', default_value = "ferrited,tgtd,istgt")]
    targets: Vec<String>,
    /// First of three loopback ports (ferrited, tgtd, istgt).
    #[arg(long, default_value_t = 23260)]
    base_port: u16,
    /// Backing files directory (tmpfs).
    #[arg(long, default_value = "/dev/shm/ferrite-bench-luns")]
    data_dir: PathBuf,
    /// Size of the file and null LUNs in MiB.
    #[arg(long, default_value_t = 1024)]
    lun_mib: u64,
    /// Run only the workloads whose name starts or ends with one of these
    /// (comma separated), e.g. "QD 1" or "4 KiB random read".
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// LUNs to run: null, file or both.
    #[arg(long, value_delimiter = ',', default_value = "null,file")]
    luns: Vec<String>,
    /// Skip the block-size sweep.
    #[arg(long)]
    no_sweep: bool,
    /// Skip the memory report.
    #[arg(long)]
    no_memory: bool,
    /// Do not install missing Debian packages even as root.
    #[arg(long)]
    no_install: bool,
    /// A run during which the hypervisor took more than this share (percent)
    /// of the machine's CPU time ("steal" in /proc/stat) is measured again.
    #[arg(long, default_value_t = 10.0)]
    max_steal: f64,
    /// How many times one run is measured again for steal before it is kept
    /// as it is (and counted in the report).
    #[arg(long, default_value_t = 3)]
    steal_retries: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    IscsiPerf,
    Own,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    bytes: u32,
    qd: u32,
    read: bool,
    random: bool,
    tool: Tool,
}

const CASES: [Case; 8] = [
    Case {
        name: "4 KiB random read, QD 1",
        bytes: 4096,
        qd: 1,
        read: true,
        random: true,
        tool: Tool::IscsiPerf,
    },
    Case {
        name: "4 KiB random read, QD 1",
        bytes: 4096,
        qd: 1,
        read: true,
        random: true,
        tool: Tool::Own,
    },
    Case {
        name: "4 KiB random read, QD 32",
        bytes: 4096,
        qd: 32,
        read: true,
        random: true,
        tool: Tool::IscsiPerf,
    },
    Case {
        name: "4 KiB random read, QD 128",
        bytes: 4096,
        qd: 128,
        read: true,
        random: true,
        tool: Tool::IscsiPerf,
    },
    Case {
        name: "4 KiB random write, QD 32",
        bytes: 4096,
        qd: 32,
        read: false,
        random: true,
        tool: Tool::Own,
    },
    Case {
        name: "64 KiB random read, QD 32",
        bytes: 65536,
        qd: 32,
        read: true,
        random: true,
        tool: Tool::IscsiPerf,
    },
    Case {
        name: "1 MiB sequential read, QD 8",
        bytes: 1 << 20,
        qd: 8,
        read: true,
        random: false,
        tool: Tool::IscsiPerf,
    },
    Case {
        name: "1 MiB sequential write, QD 8",
        bytes: 1 << 20,
        qd: 8,
        read: false,
        random: false,
        tool: Tool::Own,
    },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum LunKind {
    Null,
    File,
}

impl LunKind {
    fn name(self) -> &'static str {
        match self {
            LunKind::Null => "null",
            LunKind::File => "file (tmpfs)",
        }
    }
}

/// One run's numbers.
#[derive(Clone, Debug)]
struct RunRes {
    iops: f64,
    mean_us: f64,
    /// Measured per command (own initiator) or derived (Little's law).
    mean_measured: bool,
    p99_us: Option<f64>,
    cpu_per_mio: Option<f64>,
    /// Share of the machine's CPU time the hypervisor took during the run.
    steal_pct: Option<f64>,
}

struct Ctx {
    args: Args,
    stop: Arc<AtomicBool>,
    reps: u32,
    secs: u32,
    geom: HashMap<(Kind, LunKind), (u32, u64)>,
    tsv: String,
    raw_dir: PathBuf,
    load_start: String,
    /// Steal of every kept run, and how many runs were measured again.
    steals: Vec<f64>,
    rerun_for_steal: u32,
    kept_over_steal: u32,
}

fn lun_of(t: &TargetProc, k: LunKind) -> &LunAddr {
    match k {
        LunKind::Null => &t.null_lun,
        LunKind::File => &t.file_lun,
    }
}

fn geometry(ctx: &mut Ctx, t: &TargetProc, k: LunKind) -> Result<(u32, u64)> {
    if let Some(g) = ctx.geom.get(&(t.kind, k)) {
        return Ok(*g);
    }
    let a = lun_of(t, k);
    let mut i = load::open(a, 1).with_context(|| format!("login to {}", a.url()))?;
    let g = load::capacity(&mut i, a.lun_field())
        .with_context(|| format!("capacity of {}", a.url()))?;
    let _ = i.logout(0);
    ctx.geom.insert((t.kind, k), g);
    Ok(g)
}

/// [`run_case`], measured again while the hypervisor took more than
/// `--max-steal` of the machine during it: on a shared host a run that lost
/// a third of its CPU to other guests measures them, not the target.
fn run_measured(ctx: &mut Ctx, t: &TargetProc, k: LunKind, c: &Case, rep: u32) -> Result<RunRes> {
    let mut again = 0;
    loop {
        let before = procfs::machine_steal();
        let mut r = run_case(ctx, t, k, c, rep);
        let steal = procfs::steal_pct(before, procfs::machine_steal());
        if let Ok(res) = &mut r {
            res.steal_pct = steal;
        }
        let over = steal.filter(|&p| p > ctx.args.max_steal);
        match (&r, over) {
            (Ok(_), Some(p))
                if again < ctx.args.steal_retries && !ctx.stop.load(Ordering::Relaxed) =>
            {
                again += 1;
                ctx.rerun_for_steal += 1;
                eprintln!(
                    "ferrite-bench: {} {} {} rep {}: the hypervisor took {p:.0}% of the CPUs (over {}%): measuring again",
                    t.kind.name(),
                    k.name(),
                    c.name,
                    rep + 1,
                    ctx.args.max_steal
                );
            }
            (Ok(res), _) => {
                if over.is_some() {
                    ctx.kept_over_steal += 1;
                }
                if let Some(p) = res.steal_pct {
                    ctx.steals.push(p);
                }
                return r;
            }
            (Err(_), _) => return r,
        }
    }
}

fn run_case(ctx: &mut Ctx, t: &TargetProc, k: LunKind, c: &Case, rep: u32) -> Result<RunRes> {
    let (bs, _) = geometry(ctx, t, k)?;
    let a = lun_of(t, k).clone();
    match c.tool {
        Tool::IscsiPerf => {
            let url = a.url();
            let r = iscsi_perf::run(
                &PerfRun {
                    url: &url,
                    blocks: (c.bytes / bs).max(1),
                    qd: c.qd,
                    random: c.random,
                    seconds: ctx.secs.max(1),
                    target_pid: t.pid,
                },
                &ctx.stop,
            )?;
            let raw = ctx.raw_dir.join(format!(
                "{}-{}-{}-{}-r{rep}.log",
                t.kind.name(),
                if k == LunKind::Null { "null" } else { "file" },
                c.bytes,
                c.qd
            ));
            let _ = std::fs::write(raw, &r.raw);
            Ok(RunRes {
                iops: r.iops,
                mean_us: c.qd as f64 / r.iops * 1e6,
                mean_measured: false,
                p99_us: None,
                cpu_per_mio: (r.ios > 0.0 && r.target_cpu_s.is_finite())
                    .then(|| r.target_cpu_s / r.ios * 1e6),
                steal_pct: None,
            })
        }
        Tool::Own => {
            let g = geometry(ctx, t, k)?;
            let mut i =
                load::open(&a, 2 + rep as u16).with_context(|| format!("login to {}", a.url()))?;
            let warm = if ctx.args.quick { 0.2 } else { 1.0 };
            let spec = LoadSpec {
                bytes: c.bytes,
                qd: c.qd,
                read_pct: if c.read { 100 } else { 0 },
                random: c.random,
                duration: Duration::from_secs(ctx.secs.max(1) as u64),
                warmup: Duration::from_secs_f64(warm),
                max_ops: 50_000_000,
            };
            let r = load::run(&mut i, a.lun_field(), g, &spec, Some(t.pid), &ctx.stop)?;
            let _ = i.logout(0);
            if r.bad_status > 0 {
                anyhow::bail!(
                    "{} commands ended with a status other than GOOD",
                    r.bad_status
                );
            }
            if r.ops == 0 {
                anyhow::bail!("no command completed");
            }
            let tck = procfs::clk_tck() as f64;
            Ok(RunRes {
                iops: r.iops(),
                mean_us: stats::mean_u64(&r.lat_ns).unwrap_or(f64::NAN) / 1e3,
                mean_measured: true,
                p99_us: stats::percentile_sorted(&r.lat_ns, 99.0).map(|v| v as f64 / 1e3),
                cpu_per_mio: r
                    .cpu_ticks
                    .map(|(a, b)| b.saturating_sub(a) as f64 / tck / r.ops as f64 * 1e6),
                steal_pct: None,
            })
        }
    }
}

type Cell = (Vec<RunRes>, Vec<String>);

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn med(v: &[f64]) -> Option<Summary> {
    stats::summarize(v)
}

fn machine_header(ctx: &Ctx, notes: &[String], targets: &[TargetProc]) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| procfs::parse_cpu_model(&s))
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(0.0, |k| k / 1048576.0);
    let ver = |p: &str| peers::package_version(p).unwrap_or_else(|| "not installed".into());
    let git = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "- Machine: {cpu}, {cores} cores, {mem_gib:.0} GiB RAM; kernel {kernel}"
    );
    let _ = writeln!(
        s,
        "- Load average (1 min) at start {} and at end {}: anything above the load the benchmark itself adds is other work on the machine",
        ctx.load_start,
        loadavg()
    );
    let _ = writeln!(
        s,
        "- Peers: tgt {}, istgt {}; initiators: libiscsi-bin {} (iscsi-perf) and ferrite-iscsi's initiator (commit {git}); iperf3 {}",
        ver("tgt"),
        ver("istgt"),
        ver("libiscsi-bin"),
        ver("iperf3")
    );
    let _ = writeln!(
        s,
        "- Method: {} run(s) of {} s per cell, targets alternating between runs; cells are medians, IOPS with the min-max of the runs",
        ctx.reps, ctx.secs
    );
    for t in targets {
        let _ = writeln!(s, "- {}: `{}` (pid {})", t.kind.name(), t.command, t.pid);
    }
    for n in notes {
        let _ = writeln!(s, "- Note: {n}");
    }
    s
}

fn selected(args: &Args, c: &Case) -> bool {
    args.only.is_empty()
        || args
            .only
            .iter()
            .any(|o| c.name.starts_with(o.as_str()) || c.name.ends_with(o.as_str()))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handler")?;
    }
    let reps = args.reps.unwrap_or(if args.quick { 1 } else { 3 }).max(1);
    let secs = args
        .seconds
        .unwrap_or(if args.quick { 1 } else { 5 })
        .max(1);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let raw_dir = args.out.join("raw");
    std::fs::create_dir_all(&raw_dir)?;

    let mut notes = Vec::new();
    if !args.no_install {
        notes.extend(peers::ensure_packages(&[
            ("tgt", "tgtd"),
            ("istgt", "istgt"),
            ("libiscsi-bin", "iscsi-perf"),
            ("iperf3", "iperf3"),
        ]));
    }
    let ferrited = match &args.ferrited {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("ferrited")))
            .unwrap_or_else(|| PathBuf::from("target/release/ferrited")),
    };
    let layout = Layout {
        state: args.out.join("state"),
        data: args.data_dir.clone(),
        file_size: args.lun_mib << 20,
        ferrited,
        ferrited_args: args.ferrited_args.clone(),
    };
    let mut ctx = Ctx {
        reps,
        secs,
        stop: Arc::clone(&stop),
        geom: HashMap::new(),
        tsv: "lun\tworkload\tinitiator\ttarget\trep\tiops\tmb_s\tmean_us\tp99_us\tcpu_s_per_mio\tsteal_pct\terror\n".into(),
        raw_dir,
        load_start: loadavg(),
        steals: Vec::new(),
        rerun_for_steal: 0,
        kept_over_steal: 0,
        args,
    };

    // Ceiling first, on a quiet machine.
    eprintln!("ferrite-bench: loopback ceiling");
    let bw_secs = if ctx.args.quick { 1 } else { 5 };
    // Measured again, like the runs, while the hypervisor takes too much.
    let mut bw = None;
    for attempt in 0..=ctx.args.steal_retries {
        let before = procfs::machine_steal();
        bw = ceiling::iperf3(ctx.args.base_port + 10, bw_secs)
            .or_else(|| ceiling::builtin_bandwidth(Duration::from_secs(bw_secs as u64)).ok());
        match procfs::steal_pct(before, procfs::machine_steal()) {
            Some(p) if p > ctx.args.max_steal && attempt < ctx.args.steal_retries => {
                eprintln!(
                    "ferrite-bench: the hypervisor took {p:.0}% of the CPUs during the bandwidth ceiling: measuring again"
                );
            }
            _ => break,
        }
    }
    let pp = if ctx.args.quick {
        ceiling::ping_pong(20_000, Duration::from_secs(1)).ok()
    } else {
        ceiling::ping_pong(100_000, Duration::from_secs(5)).ok()
    };

    // Start the targets.
    let mut targets: Vec<TargetProc> = Vec::new();
    let mut missing: Vec<(Kind, String)> = Vec::new();
    let mut idle_rss: HashMap<Kind, u64> = HashMap::new();
    for (n, kind) in Kind::ALL.into_iter().enumerate() {
        if !ctx.args.targets.iter().any(|t| t == kind.name()) {
            continue;
        }
        eprintln!("ferrite-bench: starting {}", kind.name());
        match TargetProc::start(kind, &layout, ctx.args.base_port + n as u16) {
            Ok(t) => {
                std::thread::sleep(Duration::from_millis(500));
                if let Some(r) = procfs::rss_kib(t.pid) {
                    idle_rss.insert(kind, r);
                }
                targets.push(t);
            }
            Err(e) => {
                eprintln!("ferrite-bench: {} cannot be started: {e}", kind.name());
                missing.push((kind, e.to_string()));
            }
        }
    }
    if targets.is_empty() {
        anyhow::bail!("no target could be started");
    }
    for t in &targets {
        for k in [LunKind::Null, LunKind::File] {
            if let Err(e) = geometry(&mut ctx, t, k) {
                eprintln!("ferrite-bench: {} {} LUN: {e:#}", t.kind.name(), k.name());
            }
        }
    }

    // The matrix.
    let mut cells: HashMap<(LunKind, usize, Kind), Cell> = HashMap::new();
    let started = Instant::now();
    'outer: for k in [LunKind::Null, LunKind::File] {
        if !ctx
            .args
            .luns
            .iter()
            .any(|l| k.name().starts_with(l.as_str()))
        {
            continue;
        }
        for (ci, c) in CASES.iter().enumerate() {
            if !selected(&ctx.args, c) {
                continue;
            }
            for rep in 0..ctx.reps {
                for j in 0..targets.len() {
                    if stop.load(Ordering::Relaxed) {
                        break 'outer;
                    }
                    // alternate the order between runs
                    let t = &targets[(j + rep as usize + ci) % targets.len()];
                    let r = run_measured(&mut ctx, t, k, c, rep);
                    let cell = cells.entry((k, ci, t.kind)).or_default();
                    let initiator = if c.tool == Tool::IscsiPerf {
                        "iscsi-perf"
                    } else {
                        "ferrite"
                    };
                    match r {
                        Ok(r) => {
                            eprintln!(
                                "[{:>5.0}s] {:<8} {:<12} {:<30} {:<10} rep {}: {:>9.0} IOPS, mean {:.1} us, CPU/M {}",
                                started.elapsed().as_secs_f64(),
                                t.kind.name(),
                                k.name(),
                                c.name,
                                initiator,
                                rep + 1,
                                r.iops,
                                r.mean_us,
                                r.cpu_per_mio.map_or("-".into(), fmt_num)
                            );
                            let _ = writeln!(
                                ctx.tsv,
                                "{}\t{}\t{initiator}\t{}\t{}\t{:.0}\t{:.1}\t{:.1}\t{}\t{}\t{}\t",
                                k.name(),
                                c.name,
                                t.kind.name(),
                                rep + 1,
                                r.iops,
                                r.iops * c.bytes as f64 / 1e6,
                                r.mean_us,
                                r.p99_us.map_or(String::new(), |v| format!("{v:.1}")),
                                r.cpu_per_mio.map_or(String::new(), |v| format!("{v:.2}")),
                                r.steal_pct.map_or(String::new(), |v| format!("{v:.1}")),
                            );
                            cell.0.push(r);
                        }
                        Err(e) => {
                            eprintln!(
                                "ferrite-bench: {} {} {} rep {}: {e:#}",
                                t.kind.name(),
                                k.name(),
                                c.name,
                                rep + 1
                            );
                            let _ = writeln!(
                                ctx.tsv,
                                "{}\t{}\t{initiator}\t{}\t{}\t\t\t\t\t\t\t{}",
                                k.name(),
                                c.name,
                                t.kind.name(),
                                rep + 1,
                                format!("{e:#}").replace(['\t', '\n'], " ")
                            );
                            cell.1.push(format!("{e:#}"));
                        }
                    }
                }
            }
        }
    }
    let _ = std::fs::write(ctx.args.out.join("runs.tsv"), &ctx.tsv);

    // Latency model: QD 1 sweep on the null LUNs.
    let mut sweep: HashMap<(Kind, bool), Vec<(f64, f64)>> = HashMap::new();
    if !ctx.args.no_sweep && !stop.load(Ordering::Relaxed) {
        eprintln!("ferrite-bench: block-size sweep at QD 1");
        let sizes: Vec<u32> = (9..=23).map(|p| 1u32 << p).collect();
        let (dur, warm) = if ctx.args.quick {
            (0.15, 0.03)
        } else {
            (0.6, 0.1)
        };
        let mut sessions = Vec::new();
        for t in &targets {
            let a = t.null_lun.clone();
            let g = geometry(&mut ctx, t, LunKind::Null).ok();
            match (g, load::open(&a, 100)) {
                (Some(g), Ok(i)) => sessions.push((t.kind, t.pid, a, g, i)),
                (_, Err(e)) => eprintln!("ferrite-bench: sweep on {}: {e}", t.kind.name()),
                (None, _) => {}
            }
        }
        // Each point: the median over `reps` passes of the mean latency of
        // one bounded QD 1 run; targets alternate within every pass.
        let mut passes: HashMap<(Kind, bool, u32), Vec<f64>> = HashMap::new();
        'sweep: for pass in 0..ctx.reps {
            for &size in &sizes {
                for write in [false, true] {
                    let n = sessions.len();
                    for j in 0..n {
                        let (kind, pid, a, g, i) = &mut sessions[(j + pass as usize) % n];
                        if stop.load(Ordering::Relaxed) {
                            break 'sweep;
                        }
                        if size < g.0 {
                            continue;
                        }
                        let spec = LoadSpec {
                            bytes: size,
                            qd: 1,
                            read_pct: if write { 0 } else { 100 },
                            random: false,
                            duration: Duration::from_secs_f64(dur),
                            warmup: Duration::from_secs_f64(warm),
                            max_ops: 20_000,
                        };
                        let dir = if write { "write" } else { "read" };
                        match load::run(i, a.lun_field(), *g, &spec, Some(*pid), &stop) {
                            Ok(r) if r.ops > 0 && r.bad_status == 0 => {
                                let m = stats::mean_u64(&r.lat_ns).unwrap_or(f64::NAN) / 1e3;
                                passes.entry((*kind, write, size)).or_default().push(m);
                            }
                            Ok(r) => eprintln!(
                                "ferrite-bench: sweep {} {dir} {size}: {} ops, {} bad status",
                                kind.name(),
                                r.ops,
                                r.bad_status
                            ),
                            Err(e) => {
                                eprintln!("ferrite-bench: sweep {} {dir} {size}: {e}", kind.name())
                            }
                        }
                    }
                }
            }
            eprintln!(
                "ferrite-bench: sweep pass {} of {} done",
                pass + 1,
                ctx.reps
            );
        }
        for &size in &sizes {
            for kind in Kind::ALL {
                for write in [false, true] {
                    if let Some(s) = passes
                        .get(&(kind, write, size))
                        .and_then(|v| stats::summarize(v))
                    {
                        sweep
                            .entry((kind, write))
                            .or_default()
                            .push((size as f64, s.median));
                    }
                }
            }
        }
        for (_, _, _, _, mut i) in sessions {
            let _ = i.logout(0);
        }
    }

    // Memory.
    let mut memory = String::new();
    if !ctx.args.no_memory && !stop.load(Ordering::Relaxed) {
        eprintln!("ferrite-bench: memory");
        let _ = writeln!(
            memory,
            "| target | RSS idle at start (MiB) | with 64 idle sessions (MiB) | under 4 KiB random read QD 128, sampled each second: min / median / max (MiB) | after the run (MiB) |"
        );
        let _ = writeln!(memory, "|---|---:|---:|---:|---:|");
        // A minute under load in a full run: long enough to see growth.
        let load_secs = if ctx.args.quick { 3 } else { 60 };
        for t in &targets {
            let mib =
                |k: Option<u64>| k.map_or("-".into(), |k| format!("{:.1}", k as f64 / 1024.0));
            let mut held = Vec::new();
            let mut err = None;
            for n in 0..64u16 {
                match load::open_plain(&t.null_lun, 0x100 + n) {
                    Ok(i) => held.push(i),
                    Err(e) => {
                        err = Some(format!("session {}: {e}", n + 1));
                        break;
                    }
                }
            }
            std::thread::sleep(Duration::from_secs(1));
            let with64 = procfs::rss_kib(t.pid);
            let with64 = if held.len() == 64 {
                mib(with64)
            } else {
                format!(
                    "{} ({} sessions; {})",
                    mib(with64),
                    held.len(),
                    err.unwrap_or_default()
                )
            };
            for mut i in held {
                let _ = i.logout(0);
            }
            let (bs, _) = ctx
                .geom
                .get(&(t.kind, LunKind::Null))
                .copied()
                .unwrap_or((512, 0));
            let url = t.null_lun.url();
            let r = iscsi_perf::run(
                &PerfRun {
                    url: &url,
                    blocks: (4096 / bs).max(1),
                    qd: 128,
                    random: true,
                    seconds: load_secs,
                    target_pid: t.pid,
                },
                &stop,
            );
            let under = match r {
                Ok(r) => {
                    let v: Vec<f64> = r.rss_kib.iter().map(|&k| k as f64 / 1024.0).collect();
                    match stats::summarize(&v) {
                        Some(s) => format!(
                            "{:.1} / {:.1} / {:.1} ({} samples)",
                            s.min, s.median, s.max, s.n
                        ),
                        None => "no samples".into(),
                    }
                }
                Err(e) => format!("failed: {e}"),
            };
            let _ = writeln!(
                memory,
                "| {} | {} | {} | {} | {} |",
                t.kind.name(),
                mib(idle_rss.get(&t.kind).copied()),
                with64,
                under,
                mib(procfs::rss_kib(t.pid))
            );
        }
    }

    // Report.
    let mut rep = String::new();
    let _ = writeln!(rep, "## ferrite-bench results\n");
    rep.push_str(&machine_header(&ctx, &notes, &targets));
    for (k, e) in &missing {
        let _ = writeln!(rep, "- **{} missing**: {e}", k.name());
    }
    let _ = writeln!(rep);
    let _ = writeln!(
        rep,
        "| LUN | workload | initiator | target | IOPS median (min-max) | MB/s | mean lat (us) | p99 lat (us) | target CPU s per 1M I/O |"
    );
    let _ = writeln!(rep, "|---|---|---|---|---:|---:|---:|---:|---:|");
    let mut ratios = String::new();
    let _ = writeln!(
        ratios,
        "| LUN | workload | IOPS ferrited / tgtd | IOPS ferrited / istgt | CPU per I/O ferrited / tgtd | CPU per I/O ferrited / istgt |"
    );
    let _ = writeln!(ratios, "|---|---|---:|---:|---:|---:|");
    for k in [LunKind::Null, LunKind::File] {
        if !ctx
            .args
            .luns
            .iter()
            .any(|l| k.name().starts_with(l.as_str()))
        {
            continue;
        }
        for (ci, c) in CASES.iter().enumerate() {
            if !selected(&ctx.args, c) {
                continue;
            }
            let initiator = if c.tool == Tool::IscsiPerf {
                "iscsi-perf"
            } else {
                "ferrite"
            };
            let mut by_target: HashMap<Kind, (f64, f64)> = HashMap::new();
            for kind in Kind::ALL {
                if !ctx.args.targets.iter().any(|t| t == kind.name()) {
                    continue;
                }
                let cell = cells.get(&(k, ci, kind));
                let runs = cell.map(|c| c.0.as_slice()).unwrap_or(&[]);
                let Some(iops) = med(&runs.iter().map(|r| r.iops).collect::<Vec<_>>()) else {
                    let why = cell
                        .and_then(|c| c.1.first().cloned())
                        .or_else(|| missing.iter().find(|m| m.0 == kind).map(|m| m.1.clone()))
                        .unwrap_or_else(|| "not run".into());
                    let _ = writeln!(
                        rep,
                        "| {} | {} | {initiator} | {} | missing: {} | | | | |",
                        k.name(),
                        c.name,
                        kind.name(),
                        why.replace('|', "/")
                    );
                    continue;
                };
                let mean = med(&runs.iter().map(|r| r.mean_us).collect::<Vec<_>>());
                let p99 = med(&runs.iter().filter_map(|r| r.p99_us).collect::<Vec<_>>());
                let cpu = med(&runs
                    .iter()
                    .filter_map(|r| r.cpu_per_mio)
                    .collect::<Vec<_>>());
                let measured = runs.iter().all(|r| r.mean_measured);
                let failed = cell.map_or(0, |c| c.1.len());
                by_target.insert(kind, (iops.median, cpu.map_or(f64::NAN, |c| c.median)));
                let _ = writeln!(
                    rep,
                    "| {} | {} | {initiator} | {} | {} ({}-{}){} | {} | {}{} | {} | {} |",
                    k.name(),
                    c.name,
                    kind.name(),
                    fmt_num(iops.median),
                    fmt_num(iops.min),
                    fmt_num(iops.max),
                    if failed > 0 {
                        format!(" [{failed} run(s) failed]")
                    } else {
                        String::new()
                    },
                    fmt_num(iops.median * c.bytes as f64 / 1e6),
                    if measured { "" } else { "~" },
                    mean.map_or("-".into(), |m| fmt_num(m.median)),
                    p99.map_or("-".into(), |m| fmt_num(m.median)),
                    cpu.map_or("-".into(), |m| fmt_num(m.median)),
                );
            }
            let f = by_target.get(&Kind::Ferrite);
            let ratio = |other: Kind, idx: usize| -> String {
                match (f, by_target.get(&other)) {
                    (Some(a), Some(b)) => {
                        let (x, y) = if idx == 0 { (a.0, b.0) } else { (a.1, b.1) };
                        if y > 0.0 && x.is_finite() && y.is_finite() {
                            format!("{:.2}", x / y)
                        } else {
                            "-".into()
                        }
                    }
                    _ => "-".into(),
                }
            };
            let _ = writeln!(
                ratios,
                "| {} | {} ({initiator}) | {} | {} | {} | {} |",
                k.name(),
                c.name,
                ratio(Kind::Tgtd, 0),
                ratio(Kind::Istgt, 0),
                ratio(Kind::Tgtd, 1),
                ratio(Kind::Istgt, 1)
            );
        }
    }
    let _ = writeln!(
        rep,
        "\n`~` mean latency derived by Little's law (QD / IOPS): iscsi-perf does not time single commands. \
         The ferrite initiator times every command from sending it to its status. MB/s = IOPS x size / 10^6.\n"
    );
    if !ctx.steals.is_empty() {
        let mut st = ctx.steals.clone();
        st.sort_by(f64::total_cmp);
        let _ = writeln!(
            rep,
            "Hypervisor steal during the kept runs: median {:.1}%, max {:.1}% of the machine's CPU time. \
             {} runs were measured again for taking more than {}%; {} were kept over it after {} tries.\n",
            st[st.len() / 2],
            st[st.len() - 1],
            ctx.rerun_for_steal,
            ctx.args.max_steal,
            ctx.kept_over_steal,
            ctx.args.steal_retries + 1
        );
    }
    let _ = writeln!(rep, "### Ratios (medians)\n\n{ratios}");

    // Ceiling line.
    let f1m = cells
        .get(&(LunKind::Null, 6, Kind::Ferrite))
        .and_then(|c| med(&c.0.iter().map(|r| r.iops).collect::<Vec<_>>()))
        .map(|s| s.median * (1u64 << 20) as f64 / 1e6);
    let _ = write!(rep, "### Ceiling\n\n");
    match &bw {
        Some(b) => {
            let _ = write!(
                rep,
                "Loopback TCP, one stream ({}): **{:.0} MB/s**",
                b.tool, b.mb_s
            );
        }
        None => {
            let _ = write!(rep, "Loopback TCP bandwidth: not measured");
        }
    }
    match &pp {
        Some(p) => {
            let _ = write!(
                rep,
                "; 48-byte TCP ping-pong between two threads: mean **{:.1} us**, p50 {:.1} us, p99 {:.1} us ({} round trips)",
                p.mean_us, p.p50_us, p.p99_us, p.iters
            );
        }
        None => {
            let _ = write!(rep, "; ping-pong: not measured");
        }
    }
    if let (Some(b), Some(f)) = (&bw, f1m) {
        let _ = write!(
            rep,
            "; ferrited 1 MiB sequential read (null LUN) {f:.0} MB/s = **{:.0}%** of the TCP stream",
            f / b.mb_s * 100.0
        );
    }
    let _ = writeln!(rep, ".\n");

    // Latency model.
    if !sweep.is_empty() {
        let _ = writeln!(
            rep,
            "### Latency model (QD 1, null LUN, ferrite initiator)\n\n\
             Fit of mean latency = setup + bytes / bandwidth by least squares over 512 B .. 32 KiB.\n"
        );
        let _ = writeln!(
            rep,
            "| target | direction | setup latency (us) | bandwidth (MB/s) | correlation r | points |"
        );
        let _ = writeln!(rep, "|---|---|---:|---:|---:|---:|");
        for kind in Kind::ALL {
            for write in [false, true] {
                let Some(pts) = sweep.get(&(kind, write)) else {
                    continue;
                };
                let small: Vec<&(f64, f64)> = pts.iter().filter(|p| p.0 <= 32768.0).collect();
                let xs: Vec<f64> = small.iter().map(|p| p.0).collect();
                let ys: Vec<f64> = small.iter().map(|p| p.1).collect();
                let dir = if write { "write" } else { "read" };
                match stats::least_squares(&xs, &ys) {
                    Some(f) => {
                        let bw = if f.slope > 0.0 {
                            format!("{:.0}", 1.0 / f.slope)
                        } else {
                            "-".into()
                        };
                        let _ = writeln!(
                            rep,
                            "| {} | {dir} | {:.1} | {bw} | {:.3} | {} |",
                            kind.name(),
                            f.intercept,
                            f.r,
                            f.n
                        );
                    }
                    None => {
                        let _ = writeln!(
                            rep,
                            "| {} | {dir} | - | - | - | {} |",
                            kind.name(),
                            xs.len()
                        );
                    }
                }
            }
        }
        let _ = writeln!(rep, "\nMean latency (us) per block size:\n");
        let mut hdr = String::from("| size |");
        let mut sep = String::from("|---:|");
        let mut cols = Vec::new();
        for kind in Kind::ALL {
            for write in [false, true] {
                if let Some(p) = sweep.get(&(kind, write)) {
                    let _ = write!(
                        hdr,
                        " {} {} |",
                        kind.name(),
                        if write { "write" } else { "read" }
                    );
                    sep.push_str("---:|");
                    cols.push(p);
                }
            }
        }
        let _ = writeln!(rep, "{hdr}\n{sep}");
        for p in 9..=23 {
            let size = (1u64 << p) as f64;
            let _ = write!(
                rep,
                "| {} |",
                if p >= 20 {
                    format!("{} MiB", 1 << (p - 20))
                } else if p >= 10 {
                    format!("{} KiB", 1 << (p - 10))
                } else {
                    "512 B".into()
                }
            );
            for c in &cols {
                let v = c
                    .iter()
                    .find(|q| q.0 == size)
                    .map_or("-".into(), |q| fmt_num(q.1));
                let _ = write!(rep, " {v} |");
            }
            let _ = writeln!(rep);
        }
        let colors = [
            (Kind::Ferrite, "#d62728"),
            (Kind::Tgtd, "#1f77b4"),
            (Kind::Istgt, "#2ca02c"),
        ];
        let mut thr = Vec::new();
        let mut lat = Vec::new();
        for (kind, color) in colors {
            for write in [false, true] {
                if let Some(p) = sweep.get(&(kind, write)) {
                    let label = format!("{} {}", kind.name(), if write { "write" } else { "read" });
                    thr.push(Series {
                        label: label.clone(),
                        color,
                        dashed: write,
                        points: p.iter().map(|&(b, us)| (b, b / us)).collect(),
                    });
                    lat.push(Series {
                        label,
                        color,
                        dashed: write,
                        points: p.clone(),
                    });
                }
            }
        }
        let svg = plot::latency_model_svg(
            "ferrited vs tgtd vs istgt: QD 1 on a null LUN over loopback",
            &format!(
                "ferrite initiator; each point the median over passes of the mean latency of one bounded run; {}",
                std::fs::read_to_string("/proc/cpuinfo")
                    .ok()
                    .and_then(|s| procfs::parse_cpu_model(&s))
                    .unwrap_or_default()
            ),
            &thr,
            &lat,
        );
        let p = ctx.args.out.join("latency-model.svg");
        std::fs::write(&p, &svg).with_context(|| format!("writing {}", p.display()))?;
        if let Some(extra) = &ctx.args.svg {
            std::fs::write(extra, &svg).with_context(|| format!("writing {}", extra.display()))?;
        }
        let _ = writeln!(rep, "\nPlot: `{}`\n", p.display());
    }

    if !memory.is_empty() {
        let _ = writeln!(rep, "### Memory (RSS)\n\n{memory}");
    }
    if stop.load(Ordering::Relaxed) {
        let _ = writeln!(rep, "**Interrupted: the results above are partial.**");
    }
    let path = ctx.args.out.join("report.md");
    std::fs::write(&path, &rep).with_context(|| format!("writing {}", path.display()))?;
    println!("{rep}");
    eprintln!(
        "ferrite-bench: report in {}; stopping targets",
        path.display()
    );
    for mut t in targets {
        t.stop();
        if t.alive() {
            eprintln!(
                "ferrite-bench: {} (pid {}) did not stop",
                t.kind.name(),
                t.pid
            );
        }
    }
    Ok(())
}
