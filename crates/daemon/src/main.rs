//! ferrited: the composition root. Reads the configuration (or builds the
//! embedded default), opens backends, starts one reactor per core, listens on
//! the iSCSI portals and shuts down cleanly on SIGINT/SIGTERM. Under systemd
//! (`Type=notify`) it reports readiness and shutdown ([`notify`]).
#![forbid(unsafe_code)]

mod alua;
mod cluster;
mod iser;
mod notify;
mod origin;
mod runtime;
mod srp;
mod stats;
mod system;
mod worker;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use ferrite_mgmt::config::Config;
use ferrite_reactor::mailbox::mailbox;
use ferrite_reactor::ring::{self, ReactorConfig};

use crate::runtime::DaemonRuntime;
use crate::system::System;
use crate::worker::{CoreWorker, Msg};
use ferrite_iscsi::portal::Registry;

/// Ferrite: a userspace SCSI target (iSCSI over TCP).
#[derive(Parser, Debug)]
#[command(name = "ferrited", version)]
struct Args {
    /// Start from this JSON configuration. Without it: /etc/ferrite/ferrite.json
    /// when that file exists and no --state-dir is given, else the embedded
    /// default. `ferritectl save` writes the configuration back where it came
    /// from (the embedded default: to /etc/ferrite/ferrite.json as root when
    /// /etc/ferrite exists, else to ferrite.json in the state directory).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen on this portal instead of the configured ones (ADDR:PORT).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<SocketAddr>,
    /// Where the embedded default keeps its disk image and where state lives.
    /// Default: /var/lib/ferrite as root, else $XDG_STATE_HOME/ferrite.
    /// Given, it also holds the control socket (DIR/ferrited.sock) unless
    /// --socket says otherwise; `ferritectl --state-dir DIR` finds it there.
    #[arg(long, value_name = "DIR", env = "FERRITE_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// This node's name in the configuration's cluster (overrides
    /// `cluster.node`, so the nodes of an HA pair may share one file).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Number of reactor threads (default: from the configuration, else one per CPU).
    #[arg(long)]
    cores: Option<usize>,
    /// Busy-poll this many microseconds before a reactor sleeps.
    #[arg(long)]
    poll_us: Option<u32>,
    /// Poll this many microseconds before sleeping while the initiators on a
    /// reactor keep at most 2 commands outstanding (0: never).
    #[arg(long)]
    latency_poll_us: Option<u32>,
    /// MiB of memory for commands' data buffers, shared by all sessions
    /// (default: from the configuration, else an eighth of the machine's
    /// memory between 256 MiB and 4 GiB).
    #[arg(long, value_name = "MIB")]
    data_memory_mb: Option<u64>,
    /// Pin reactor threads to CPUs.
    #[arg(long)]
    pin: bool,
    /// Control socket for ferritectl. Default: DIR/ferrited.sock with
    /// --state-dir DIR, else /run/ferrite/ferrited.sock as root, else
    /// $XDG_RUNTIME_DIR/ferrite/ferrited.sock (or
    /// ~/.local/state/ferrite/ferrited.sock), where ferritectl looks too.
    #[arg(
        long,
        visible_alias = "control",
        value_name = "PATH",
        env = "FERRITE_SOCKET"
    )]
    socket: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (off by default).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    /// Print the manual page (roff) and exit; for packaging.
    #[arg(long, hide = true)]
    print_man: bool,
    /// Print a shell completion script and exit; for packaging.
    #[arg(long, hide = true, value_name = "SHELL")]
    print_completions: Option<clap_complete::Shell>,
}

/// ferrited(8): the options from the clap definition, and the files, the
/// environment and the service around them.
fn print_man() -> Result<()> {
    use ferrite_mgmt::manpage::Section;
    let files = [
        (
            origin::SYSTEM_CONFIG,
            "The configuration, read at start when it exists and no --config or \
             --state-dir is given; ferritectl save writes it.",
        ),
        (
            "/var/lib/ferrite",
            "The state directory as root: the embedded default's disk image \
             (disk0.img) and persistent reservations (devices/NAME/pr_state). \
             Not root: $XDG_STATE_HOME/ferrite.",
        ),
        (
            ferrite_mgmt::server::DEFAULT_SOCKET,
            "The control socket for ferritectl(1) as root.",
        ),
        (
            "/lib/systemd/system/ferrited.service",
            "The systemd unit of the Debian package (Type=notify).",
        ),
    ];
    let env = [
        ("FERRITE_SOCKET", "The control socket, as --socket."),
        ("FERRITE_STATE_DIR", "The state directory, as --state-dir."),
        (
            "NOTIFY_SOCKET",
            "Set by systemd for Type=notify: READY=1 is sent there once the \
             portals are bound and the control socket is ready, STOPPING=1 when \
             shutting down.",
        ),
        (
            "RUST_LOG",
            "Log filter (default info); logs go to standard error.",
        ),
    ];
    let signals = [(
        "SIGINT, SIGTERM",
        "Stop cleanly: sessions end, devices are flushed and closed.",
    )];
    let see = [(
        "",
        "ferritectl(1) manages the running daemon; docs/packaging.md and \
         docs/management.md in the source.",
    )];
    let sections = [
        Section {
            title: "FILES",
            items: &files,
        },
        Section {
            title: "ENVIRONMENT",
            items: &env,
        },
        Section {
            title: "SIGNALS",
            items: &signals,
        },
        Section {
            title: "SEE ALSO",
            items: &see,
        },
    ];
    let mut out = std::io::stdout().lock();
    ferrite_mgmt::manpage::render(
        <Args as clap::CommandFactory>::command(),
        "8",
        &sections,
        &mut out,
    )?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// Binds a portal. A listening socket of a process that was just killed can
/// outlive it briefly (its io_uring is torn down asynchronously), so "address
/// in use" is retried for a few seconds before it is an error.
fn bind_portal(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match listen_on(addr) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                tracing::info!(portal = %addr, "address in use; retrying");
                std::thread::sleep(Duration::from_millis(250));
            }
            r => return r,
        }
    }
}

/// A listening socket on `addr` whose accept queue is as deep as the system
/// allows (`net.core.somaxconn`), not the 128 of `TcpListener::bind`: when
/// many connections arrive at once (initiators reconnecting after a
/// restart, or a flood of idle ones), a full queue drops the next SYN and
/// the initiator retries only a second later.
pub(crate) fn listen_on(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr)?;
    // listen(2) again on a listening socket sets its backlog.
    nix::sys::socket::listen(&l, nix::sys::socket::Backlog::MAXCONN)?;
    Ok(l)
}

fn default_state_dir() -> PathBuf {
    if is_root() {
        return PathBuf::from("/var/lib/ferrite");
    }
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Path::new(&x).join("ferrite");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return Path::new(&h).join(".local/state/ferrite");
    }
    PathBuf::from("/tmp/ferrite-state")
}

/// Raises the soft limit on open descriptors to the hard limit: every
/// connection, listener, backend file and pipe is a descriptor, and the
/// usual soft limit (1024) is far below what a target serving many
/// initiators (or meeting a flood of idle connections) needs. A limit that
/// cannot be raised is logged and kept.
fn raise_nofile_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "open file limit raised"),
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "open file limit could not be raised")
            }
        },
        Ok((soft, _)) => tracing::info!(limit = soft, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "open file limit unknown"),
    }
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if args.print_man {
        return print_man();
    }
    if let Some(shell) = args.print_completions {
        let mut c = <Args as clap::CommandFactory>::command();
        clap_complete::generate(shell, &mut c, "ferrited", &mut std::io::stdout());
        return Ok(());
    }
    raise_nofile_limit();
    let state_dir = args.state_dir.clone().unwrap_or_else(default_state_dir);
    let default_listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 3260));
    let choice = origin::Facts::probe(
        args.config.as_deref(),
        args.state_dir.is_some(),
        &state_dir,
        is_root(),
    )
    .choose();
    let mut cfg = match &choice.origin {
        origin::Origin::File(p) => {
            tracing::info!(config = %p.display(), "configuration");
            Config::load(p).map_err(|e| anyhow::anyhow!("{e}"))?
        }
        origin::Origin::Embedded => {
            std::fs::create_dir_all(&state_dir)
                .with_context(|| format!("creating state directory {}", state_dir.display()))?;
            tracing::info!(state_dir = %state_dir.display(), "no configuration given: starting the embedded default");
            Config::embedded_default(&state_dir, args.listen.unwrap_or(default_listen))
        }
    };
    if let Some(l) = args.listen {
        for t in &mut cfg.targets.iscsi {
            t.portals = vec![l.to_string()];
        }
    }
    if let Some(n) = &args.node {
        let Some(c) = cfg.cluster.as_mut() else {
            anyhow::bail!("--node {n}: the configuration has no cluster");
        };
        c.node = n.clone();
    }
    if let Some(c) = args.cores {
        cfg.reactor.cores = Some(c);
    }
    if let Some(p) = args.poll_us {
        cfg.reactor.poll_us = p;
    }
    if let Some(p) = args.latency_poll_us {
        cfg.reactor.latency_poll_us = p;
    }
    if let Some(mb) = args.data_memory_mb {
        cfg.reactor.data_memory_mb = Some(mb);
    }
    let control =
        ferrite_mgmt::server::socket_path(args.socket.as_deref(), args.state_dir.as_deref());
    let save = choice.save;
    run(cfg, args.pin, &control, save, args.metrics, &state_dir)
}

fn run(
    cfg: Config,
    pin: bool,
    control: &Path,
    save: PathBuf,
    metrics: Option<SocketAddr>,
    state_dir: &Path,
) -> Result<()> {
    let system = System::build(&cfg, state_dir)?;
    // Before any portal listens: clustered device groups start fenced.
    let clustered = cluster::start(cfg.cluster.as_ref(), &system)?;
    let cores = cfg.reactor.effective_cores().max(1);
    let mut listeners = Vec::new();
    for p in &system.portals {
        let l = bind_portal(*p).with_context(|| format!("listening on {p}"))?;
        tracing::info!(portal = %p, "iSCSI portal listening");
        listeners.push(l);
    }
    for (name, t) in &system.snapshot.iscsi_targets {
        tracing::info!(target = %name, luns = t.luns.luns.len(), enabled = t.enabled, "target");
    }
    let mut srp_ports = Some(srp::bind_ports(&cfg.targets.srp)?);
    let mut iser_portals = Some(iser::bind_portals(&cfg)?);

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handler")?;
    }

    let registry = Arc::new(Registry::default());
    let mut txs = Vec::new();
    let mut rxs = Vec::new();
    for _ in 0..cores {
        let (tx, rx) = mailbox::<Msg>().context("creating mailbox")?;
        txs.push(tx);
        rxs.push(rx);
    }
    let rcfg = ReactorConfig {
        poll: Duration::from_micros(cfg.reactor.poll_us as u64),
        latency_poll: Duration::from_micros(cfg.reactor.latency_poll_us as u64),
        pin,
        ..ReactorConfig::default()
    };
    let stats_board = Arc::new(crate::stats::StatsBoard::default());
    let budget = Arc::new(ferrite_core::budget::DataBudget::new(
        cfg.reactor.data_memory_bytes(),
    ));
    tracing::info!(
        data_memory_mb = budget.limit() >> 20,
        "data buffers bounded by the data memory budget"
    );
    let mut handles = Vec::new();
    for (core, rx) in rxs.into_iter().enumerate() {
        let ls = if core == 0 {
            std::mem::take(&mut listeners)
        } else {
            Vec::new()
        };
        let srp_ports = if core == 0 {
            srp_ports.take().unwrap_or_default()
        } else {
            Vec::new()
        };
        let iser_portals = if core == 0 {
            iser_portals.take().unwrap_or_default()
        } else {
            Vec::new()
        };
        let (peers, snapshot, registry) = (txs.clone(), system.snapshot.clone(), registry.clone());
        let board = stats_board.clone();
        let budget = budget.clone();
        let h = std::thread::Builder::new()
            .name(format!("reactor-{core}"))
            .spawn(move || {
                // The worker is built on its own thread: backend queues and
                // sessions never leave the core that created them.
                let w = CoreWorker::new(core, ls, peers, snapshot, registry)
                    .with_srp_ports(srp_ports)
                    .with_iser_portals(iser_portals)
                    .with_stats(board)
                    .with_budget(budget);
                ring::run(core, rcfg, rx, w).map(|_| ())
            })
            .context("spawning reactor thread")?;
        handles.push(h);
    }
    let runtime = Arc::new(
        DaemonRuntime::new(&system, &cfg, txs.clone(), registry.clone())
            .with_stats(stats_board)
            .with_budget(budget.clone()),
    );
    if let Some(dir) = control.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let metrics = match metrics {
        Some(a) => Some(
            ferrite_mgmt::MetricsServer::start(a, runtime.clone())
                .with_context(|| format!("metrics listener on {a}"))?,
        ),
        None => None,
    };
    let server = ferrite_mgmt::serve(runtime, cfg.clone(), Some(save), control)
        .map_err(|e| anyhow::anyhow!("control socket {}: {e}", control.display()))?;
    tracing::info!(socket = %control.display(), "control socket ready");
    tracing::info!(cores, "ferrited running");
    // Portals and SRP ports are bound (listening: connections queue until a
    // reactor accepts them) and the control socket answers.
    let notifier = notify::Notifier::from_env();
    notifier.notify("READY=1");

    // The most data memory in use since the allocator last gave free memory
    // back: once a burst of buffers has passed, their memory leaves the
    // process instead of staying in its heaps.
    let mut high = 0u64;
    let mut tick = 0u32;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        tick = tick.wrapping_add(1);
        if tick.is_multiple_of(10) {
            let used = budget.stats().used;
            if high > used + (64 << 20) {
                ferrite_reactor::buf::release_free_memory();
                high = used;
            } else {
                high = high.max(used);
            }
        }
        if handles.iter().any(|h| h.is_finished()) {
            break;
        }
    }
    tracing::info!("shutting down");
    notifier.notify("STOPPING=1");
    server.shutdown();
    drop(metrics);
    for tx in &txs {
        let _ = tx.send(Msg::Stop);
    }
    let mut failed = false;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "reactor failed");
                failed = true;
            }
            Err(_) => {
                tracing::error!("reactor thread panicked");
                failed = true;
            }
        }
    }
    // The lease revoked: another node takes the device groups over at once.
    drop(clustered);
    drop(system);
    if failed {
        anyhow::bail!("a reactor failed");
    }
    tracing::info!("stopped");
    Ok(())
}
