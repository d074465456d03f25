//! ferritectl: manage a running ferrited through its control socket, and
//! convert SCST configurations offline.
#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser, Subcommand};
use ferrite_mgmt::config::Config;
use ferrite_mgmt::server::{Request, Response, request, socket_path};
use ferrite_mgmt::tree::EntryKind;

#[derive(Parser, Debug)]
#[command(
    name = "ferritectl",
    version,
    about = "Manage ferrited: the SCST-shaped object tree over its control socket"
)]
struct Cli {
    /// Control socket of ferrited. Default: DIR/ferrited.sock with
    /// --state-dir DIR, else where ferrited puts it (/run/ferrite/ferrited.sock
    /// as root).
    #[arg(
        long,
        global = true,
        visible_alias = "control",
        value_name = "PATH",
        env = "FERRITE_SOCKET"
    )]
    socket: Option<PathBuf>,
    /// The state directory ferrited was started with (--state-dir): its
    /// control socket is there.
    #[arg(long, global = true, value_name = "DIR", env = "FERRITE_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Print ferrited's JSON answer as is.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List a directory of the tree (default /).
    Ls {
        path: Option<String>,
        /// One line per entry with its kind, access and description.
        #[arg(short, long)]
        long: bool,
    },
    /// Show a subtree (default /) one object per line with its key values:
    /// targets with their portals, LUNs with device and size, sessions.
    Tree { path: Option<String> },
    /// Read an attribute; on a mgmt leaf, print its commands.
    Get { path: String },
    /// Write an attribute.
    Set {
        path: String,
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Run an SCST command on a mgmt leaf, e.g.
    /// `ferritectl do /targets/iscsi/IQN/luns/mgmt add disk1 1 read_only=1`.
    Do {
        path: String,
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Save the running configuration (to ferrited's file, or FILE).
    Save { file: Option<PathBuf> },
    /// Make the running system match FILE (objects, then attributes and LUNs,
    /// then enable).
    Apply { file: PathBuf },
    /// Show what `apply FILE` would change.
    Diff { file: PathBuf },
    /// List sessions.
    Sessions,
    /// Show I/O counters.
    Stats,
    /// Print the running configuration as JSON.
    Config,
    /// Check a configuration file without ferrited.
    Check { file: PathBuf },
    /// Convert an SCST scst.conf to a ferrite configuration (JSON).
    ImportScst {
        file: PathBuf,
        /// Write here (atomically) instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Where SCST keeps its saved reservations (a file per device
        /// name); by default /var/lib/scst/pr.
        #[arg(long)]
        pr_dir: Option<PathBuf>,
        /// ferrited's state directory: saved reservations go to
        /// DIR/devices/NAME/pr_state. Without it, a device with saved
        /// reservations is named and nothing is written.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Convert LIO's targetcli saveconfig.json (and its APTPL reservation
    /// files) to a ferrite configuration (JSON).
    ImportLio {
        file: PathBuf,
        /// Write here (atomically) instead of standard output.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Where LIO keeps its APTPL files (`aptpl_<unit serial>`); by
        /// default /etc/rtslib-fb-target/pr (Debian), /etc/target/pr, then
        /// /var/target/pr.
        #[arg(long)]
        pr_dir: Option<PathBuf>,
        /// ferrited's state directory: saved reservations go to
        /// DIR/devices/NAME/pr_state. Without it, a device with saved
        /// reservations is named and nothing is written.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Print a shell completion script.
    Completions { shell: clap_complete::Shell },
    /// Print this manual page (roff), for packaging.
    #[command(hide = true)]
    Man,
}

/// ferritectl(1)'s sections beyond the options and commands.
fn print_man() -> Result<()> {
    let files = [
        (
            ferrite_mgmt::server::DEFAULT_SOCKET,
            "The control socket of the system's ferrited (ferrited.service), \
             where ferritectl run as root looks when neither --socket nor \
             --state-dir is given.",
        ),
        (
            "/etc/ferrite/ferrite.json",
            "The configuration the system's ferrited starts from when it \
             exists, and where ferritectl save writes it back.",
        ),
    ];
    let env = [
        ("FERRITE_SOCKET", "The control socket, as --socket."),
        ("FERRITE_STATE_DIR", "The state directory, as --state-dir."),
    ];
    let see = [(
        "",
        "ferrited(8), the Ferrite documentation: docs/management.md in the source.",
    )];
    let sections = [
        ferrite_mgmt::manpage::Section {
            title: "FILES",
            items: &files,
        },
        ferrite_mgmt::manpage::Section {
            title: "ENVIRONMENT",
            items: &env,
        },
        ferrite_mgmt::manpage::Section {
            title: "SEE ALSO",
            items: &see,
        },
    ];
    let mut out = std::io::stdout().lock();
    ferrite_mgmt::manpage::render(Cli::command(), "1", &sections, &mut out)?;
    out.flush()?;
    Ok(())
}

fn load_for_send(file: &Path) -> Result<Config> {
    Ok(Config::load(file)?)
}

fn call(socket: &Path, req: &Request) -> Result<Response> {
    request(socket, req).with_context(|| format!("cannot talk to ferrited at {}", socket.display()))
}

fn print_response(cmd: &Cmd, rsp: &Response) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if let Some(e) = &rsp.error {
        bail!("{e}");
    }
    match cmd {
        Cmd::Ls { long, .. } => {
            for e in rsp.entries.iter().flatten() {
                let name = if e.kind == EntryKind::Dir {
                    format!("{}/", e.name)
                } else {
                    e.name.clone()
                };
                if *long {
                    let kind = match e.kind {
                        EntryKind::Dir => "dir ",
                        EntryKind::Attr => "attr",
                        EntryKind::Mgmt => "mgmt",
                        EntryKind::Link => "link",
                    };
                    let rw = if e.writable { "rw" } else { "r-" };
                    writeln!(out, "{kind} {rw} {name:<32} {}", e.description)?;
                } else {
                    writeln!(out, "{name}")?;
                }
            }
        }
        Cmd::Tree { .. } => {
            if let Some(v) = &rsp.tree {
                write!(out, "{}", ferrite_mgmt::view::render(v))?;
            }
        }
        Cmd::Get { .. } => {
            if let Some(v) = &rsp.value {
                writeln!(out, "{}", v.to_text())?;
            }
        }
        Cmd::Apply { .. } | Cmd::Diff { .. } => {
            let changes = rsp.changes.as_deref().unwrap_or_default();
            if changes.is_empty() {
                writeln!(out, "no changes")?;
            }
            for c in changes {
                writeln!(out, "{c}")?;
            }
        }
        Cmd::Sessions => {
            let ss = rsp.sessions.as_deref().unwrap_or_default();
            if ss.is_empty() {
                writeln!(out, "no sessions")?;
            }
            for s in ss {
                match s.fabric {
                    ferrite_mgmt::runtime::Fabric::Iscsi => writeln!(
                        out,
                        "iscsi {} {} isid=0x{:012x} tsih={} group={} luns={} connections={} active={}",
                        s.target,
                        s.initiator,
                        s.isid,
                        s.tsih,
                        s.group.as_deref().unwrap_or("-"),
                        s.lun_count,
                        s.connections.join(","),
                        s.active_commands
                    )?,
                    // SRP: the I_T nexus is (initiator port id, target
                    // port); its RDMA channels are the connections.
                    ferrite_mgmt::runtime::Fabric::Srp => writeln!(
                        out,
                        "srp {} {} group={} luns={} channels={} [{}] active={}",
                        s.target,
                        s.initiator,
                        s.group.as_deref().unwrap_or("-"),
                        s.lun_count,
                        s.connections.len(),
                        s.connections.join(", "),
                        s.active_commands
                    )?,
                }
            }
        }
        Cmd::Stats => {
            if let Some(st) = &rsp.stats {
                if st.devices.is_empty() && st.targets.is_empty() {
                    writeln!(out, "no counters")?;
                }
                for (dev, hs) in &st.latency {
                    for h in hs {
                        let q = |q: f64| {
                            h.percentile(q)
                                .map_or_else(|| "-".to_string(), |us| format!("<={us}us"))
                        };
                        writeln!(
                            out,
                            "latency {dev} {} {}: count={} p50={} p99={} p999={}",
                            h.dir.as_str(),
                            h.size_class,
                            h.count(),
                            q(0.5),
                            q(0.99),
                            q(0.999)
                        )?;
                    }
                }
                for (kind, map) in [("device", &st.devices), ("target", &st.targets)] {
                    for (name, s) in map {
                        writeln!(
                            out,
                            "{kind} {name}: read_cmds={} write_cmds={} other_cmds={} read_bytes={} write_bytes={} errors={}",
                            s.read_cmds,
                            s.write_cmds,
                            s.other_cmds,
                            s.read_bytes,
                            s.write_bytes,
                            s.errors
                        )?;
                    }
                }
            }
        }
        Cmd::Config => {
            if let Some(c) = &rsp.config {
                writeln!(out, "{}", c.to_json())?;
            }
        }
        _ => {
            if let Some(m) = &rsp.message {
                writeln!(out, "{m}")?;
            }
        }
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    let req = match &cli.cmd {
        Cmd::Completions { shell } => {
            let mut c = Cli::command();
            clap_complete::generate(*shell, &mut c, "ferritectl", &mut std::io::stdout());
            return Ok(());
        }
        Cmd::Man => return print_man(),
        Cmd::Check { file } => {
            load_for_send(file)?;
            println!("{}: valid", file.display());
            return Ok(());
        }
        Cmd::ImportScst {
            file,
            output,
            pr_dir,
            state_dir,
        } => {
            let text =
                std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
            let imp = ferrite_mgmt::scst::import_scst(&text)
                .with_context(|| format!("{}", file.display()))?;
            let dir = pr_dir.clone().unwrap_or_else(|| "/var/lib/scst/pr".into());
            let target_of = |rel: u16| {
                let t = imp.config.targets.iscsi.iter();
                t.clone()
                    .find(|t| t.rel_port_id() == rel)
                    .map(|t| t.name.clone())
            };
            // Every file is read and checked before anything is written.
            let mut saved = Vec::new();
            for d in &imp.config.devices {
                let f = dir.join(&d.name);
                if !f.exists() {
                    continue;
                }
                let bytes = std::fs::read(&f).with_context(|| format!("{}", f.display()))?;
                let pr = ferrite_mgmt::scst::import_scst_pr(&bytes, &f, target_of)?;
                if !pr.is_empty() {
                    saved.push((d.name.clone(), f, pr));
                }
            }
            for w in &imp.warnings {
                eprintln!("warning: {}: {w}", file.display());
            }
            carry_reservations(&saved, state_dir.as_deref())?;
            match output {
                Some(o) => {
                    imp.config.save_atomic(o)?;
                    eprintln!("wrote {}", o.display());
                }
                None => println!("{}", imp.config.to_json()),
            }
            return Ok(());
        }
        Cmd::ImportLio {
            file,
            output,
            pr_dir,
            state_dir,
        } => {
            let text =
                std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
            let imp = ferrite_mgmt::lio::import_lio(&text)
                .with_context(|| format!("{}", file.display()))?;
            let dirs: Vec<PathBuf> = match pr_dir {
                Some(d) => vec![d.clone()],
                None => vec![
                    "/etc/rtslib-fb-target/pr".into(),
                    "/etc/target/pr".into(),
                    "/var/target/pr".into(),
                ],
            };
            // Every file is read and checked before anything is written.
            let mut saved = Vec::new();
            for d in &imp.config.devices {
                let Some(serial) = &d.serial else { continue };
                let Some(f) = dirs
                    .iter()
                    .map(|dir| dir.join(format!("aptpl_{serial}")))
                    .find(|f| f.exists())
                else {
                    continue;
                };
                let text =
                    std::fs::read_to_string(&f).with_context(|| format!("{}", f.display()))?;
                let bytes = ferrite_mgmt::lio::import_lio_aptpl(&text, &f)?;
                if !bytes.is_empty() {
                    saved.push((d.name.clone(), f, bytes));
                }
            }
            for w in &imp.warnings {
                eprintln!("warning: {}: {w}", file.display());
            }
            carry_reservations(&saved, state_dir.as_deref())?;
            match output {
                Some(o) => {
                    imp.config.save_atomic(o)?;
                    eprintln!("wrote {}", o.display());
                }
                None => println!("{}", imp.config.to_json()),
            }
            return Ok(());
        }
        Cmd::Ls { path, .. } => Request::Ls { path: path.clone() },
        Cmd::Tree { path } => Request::Tree { path: path.clone() },
        Cmd::Get { path } => Request::Get { path: path.clone() },
        Cmd::Set { path, value } => Request::Set {
            path: path.clone(),
            value: value.clone(),
        },
        Cmd::Do { path, command } => Request::Do {
            path: path.clone(),
            command: command.join(" "),
        },
        Cmd::Save { file } => Request::Save {
            // ferrited writes the file: make a relative name mean the
            // caller's directory.
            file: match file {
                Some(f) if f.is_relative() => Some(std::env::current_dir()?.join(f)),
                other => other.clone(),
            },
        },
        Cmd::Apply { file } => Request::Apply {
            config: Box::new(load_for_send(file)?),
        },
        Cmd::Diff { file } => Request::Diff {
            config: Box::new(load_for_send(file)?),
        },
        Cmd::Sessions => Request::Sessions,
        Cmd::Stats => Request::Stats,
        Cmd::Config => Request::Config,
    };
    let socket = socket_path(cli.socket.as_deref(), cli.state_dir.as_deref());
    let rsp = call(&socket, &req)?;
    if cli.json {
        print!("{}", rsp.to_line());
        if !rsp.ok {
            bail!("{}", rsp.error.as_deref().unwrap_or("request failed"));
        }
        return Ok(());
    }
    print_response(&cli.cmd, &rsp)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let kind = e.kind();
            let _ = e.print();
            if matches!(
                kind,
                ErrorKind::InvalidSubcommand
                    | ErrorKind::MissingSubcommand
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let names: Vec<String> = Cli::command()
                    .get_subcommands()
                    .filter(|c| !c.is_hide_set())
                    .map(|c| c.get_name().to_string())
                    .collect();
                eprintln!("valid commands: {}", names.join(", "));
            }
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferritectl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes imported reservations (device name, the file they came from,
/// ferrite's saved state) into ferrited's state directory, or names them
/// when there is none.
fn carry_reservations(
    saved: &[(String, PathBuf, Vec<u8>)],
    state_dir: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    for (name, f, bytes) in saved {
        match state_dir {
            Some(s) => {
                let store = ferrite_core::pr::DirStore {
                    dir: s.join("devices").join(name),
                };
                ferrite_core::pr::PrStore::save(&store, bytes)
                    .with_context(|| format!("{}", store.path().display()))?;
                eprintln!(
                    "reservations of {name} from {} written to {}",
                    f.display(),
                    store.path().display()
                );
            }
            None => eprintln!(
                "warning: {}: device {name} has saved reservations; pass --state-dir to carry them",
                f.display()
            ),
        }
    }
    Ok(())
}
