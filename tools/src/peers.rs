//! Starting and stopping the targets under test on loopback: ferrited,
//! STGT's tgtd and istgt, each with a null LUN and a file LUN of the same
//! size on /dev/shm. Every process is started in its own process group (so
//! a Ctrl-C at the terminal reaches only the benchmark), tracked by PID,
//! and stopped by PID (TERM, then KILL) when its [`TargetProc`] is dropped,
//! including on error and on unwinding.

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::load::LunAddr;

/// Which target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Ferrite,
    Tgtd,
    Istgt,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Ferrite, Kind::Tgtd, Kind::Istgt];
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ferrite => "ferrited",
            Kind::Tgtd => "tgtd",
            Kind::Istgt => "istgt",
        }
    }
}

/// Errors starting a target.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("{0} is not installed ({1})")]
    Missing(&'static str, String),
    #[error("port {0} is already in use")]
    PortBusy(u16),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} exited or did not listen within 20 s; see {1}")]
    NoListen(&'static str, String),
    #[error("{0} setup failed: {1}")]
    Setup(&'static str, String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PeerError {
    let what = what.into();
    move |source| PeerError::Io { what, source }
}

/// A running target and its two LUNs.
#[derive(Debug)]
pub struct TargetProc {
    pub kind: Kind,
    pub pid: u32,
    pub portal: SocketAddr,
    pub null_lun: LunAddr,
    pub file_lun: LunAddr,
    /// How it was started (for the report).
    pub command: String,
    pub log: PathBuf,
    child: Option<Child>,
    /// tgtd control port (its shutdown goes through tgtadm).
    tgtd_ctrl: Option<u16>,
    /// The file LUN's backing file, removed after the process stops.
    file_image: Option<PathBuf>,
}

/// Where the targets keep their files.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Configs and logs.
    pub state: PathBuf,
    /// Backing files (tmpfs).
    pub data: PathBuf,
    pub file_size: u64,
    pub ferrited: PathBuf,
    pub ferrited_args: Vec<String>,
}

fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn wait_listen(port: u16, child: &mut Child, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while Instant::now() < until {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Creates a fresh sparse backing file (what an earlier run wrote is
/// dropped, so every run starts from the same state).
pub fn backing_file(path: &Path, size: u64) -> Result<(), PeerError> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).map_err(io_err(format!("creating {}", d.display())))?;
    }
    let f = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    f.set_len(0)
        .and_then(|()| f.set_len(size))
        .map_err(io_err(format!("sizing {}", path.display())))?;
    Ok(())
}

fn spawn(mut cmd: Command, log: &Path) -> Result<Child, PeerError> {
    let out = fs::File::create(log).map_err(io_err(format!("creating {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io_err(format!("cloning {}", log.display())))?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    cmd.spawn()
        .map_err(io_err(format!("starting {:?}", cmd.get_program())))
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl TargetProc {
    fn finish_start(
        kind: Kind,
        mut child: Child,
        port: u16,
        command: String,
        log: PathBuf,
        luns: (LunAddr, LunAddr),
    ) -> Result<TargetProc, PeerError> {
        let pid = child.id();
        let mut ok = wait_listen(port, &mut child, Duration::from_secs(20));
        if ok {
            // a daemon can listen and still fail a later start-up step
            std::thread::sleep(Duration::from_millis(300));
            ok = matches!(child.try_wait(), Ok(None));
        }
        let t = TargetProc {
            kind,
            pid,
            portal: SocketAddr::from(([127, 0, 0, 1], port)),
            null_lun: luns.0,
            file_lun: luns.1,
            command,
            log: log.clone(),
            child: Some(child),
            tgtd_ctrl: None,
            file_image: None,
        };
        if !ok {
            // dropping `t` stops the process
            return Err(PeerError::NoListen(kind.name(), log.display().to_string()));
        }
        Ok(t)
    }

    /// Starts ferrited with a JSON configuration: one target, LUN 0 null,
    /// LUN 1 a fileio image.
    pub fn ferrited(l: &Layout, port: u16) -> Result<TargetProc, PeerError> {
        if !l.ferrited.exists() {
            return Err(PeerError::Missing(
                "ferrited",
                format!(
                    "{} not found: build it with `cargo build --release --bin ferrited` or pass --ferrited",
                    l.ferrited.display()
                ),
            ));
        }
        if !port_free(port) {
            return Err(PeerError::PortBusy(port));
        }
        let sd = l.state.join("ferrited");
        fs::create_dir_all(&sd).map_err(io_err(format!("creating {}", sd.display())))?;
        let img = l.data.join("ferrite-file.img");
        backing_file(&img, l.file_size)?;
        let iqn = "iqn.2026-11.org.ferrite:bench";
        let cfg = serde_json::json!({
            "devices": [
                { "name": "null0", "handler": "vdisk_nullio", "size": l.file_size },
                { "name": "file0", "handler": "vdisk_fileio", "filename": img, "size": l.file_size }
            ],
            "targets": { "iscsi": [
                { "name": iqn, "portals": [format!("127.0.0.1:{port}")],
                  "luns": [ { "lun": 0, "device": "null0" }, { "lun": 1, "device": "file0" } ] }
            ] }
        });
        let cfg_path = sd.join("ferrited.json");
        fs::write(
            &cfg_path,
            serde_json::to_vec_pretty(&cfg).unwrap_or_default(),
        )
        .map_err(io_err(format!("writing {}", cfg_path.display())))?;
        let mut cmd = Command::new(&l.ferrited);
        cmd.arg("--config")
            .arg(&cfg_path)
            .arg("--state-dir")
            .arg(&sd)
            .arg("--control")
            .arg(sd.join("ferrited.sock"))
            .args(&l.ferrited_args);
        let command = describe(&cmd);
        let log = sd.join("ferrited.log");
        let child = spawn(cmd, &log)?;
        let portal = SocketAddr::from(([127, 0, 0, 1], port));
        let lun = |n| LunAddr {
            portal,
            iqn: iqn.into(),
            lun: n,
        };
        let mut t =
            TargetProc::finish_start(Kind::Ferrite, child, port, command, log, (lun(0), lun(1)))?;
        t.file_image = Some(img);
        Ok(t)
    }

    /// Starts tgtd in the foreground on its own control port and configures
    /// two targets with tgtadm (LUN 0 of each is tgt's controller LU; the
    /// disk is LUN 1): bstype rdwr on the file, bstype null.
    pub fn tgtd(l: &Layout, port: u16) -> Result<TargetProc, PeerError> {
        if !have("tgtd") || !have("tgtadm") {
            return Err(PeerError::Missing("tgtd", "apt-get install tgt".into()));
        }
        if !port_free(port) {
            return Err(PeerError::PortBusy(port));
        }
        let sd = l.state.join("tgtd");
        fs::create_dir_all(&sd).map_err(io_err(format!("creating {}", sd.display())))?;
        let img = l.data.join("tgtd-file.img");
        backing_file(&img, l.file_size)?;
        let ctrl = port;
        let mut cmd = Command::new("tgtd");
        cmd.args(["-f", "-C", &ctrl.to_string(), "--iscsi"])
            .arg(format!("portal=127.0.0.1:{port}"));
        let command = describe(&cmd);
        let log = sd.join("tgtd.log");
        let child = spawn(cmd, &log)?;
        let portal = SocketAddr::from(([127, 0, 0, 1], port));
        let iqn_null = "iqn.2026-11.org.ferrite.peer:tgtd-null";
        let iqn_file = "iqn.2026-11.org.ferrite.peer:tgtd-file";
        let mut t = TargetProc::finish_start(
            Kind::Tgtd,
            child,
            port,
            command,
            log,
            (
                LunAddr {
                    portal,
                    iqn: iqn_null.into(),
                    lun: 1,
                },
                LunAddr {
                    portal,
                    iqn: iqn_file.into(),
                    lun: 1,
                },
            ),
        )?;
        t.tgtd_ctrl = Some(ctrl);
        t.file_image = Some(img.clone());
        let img_s = img.display().to_string();
        let steps: [Vec<&str>; 6] = [
            vec![
                "--op", "new", "--mode", "target", "--tid", "1", "-T", iqn_file,
            ],
            vec![
                "--op",
                "new",
                "--mode",
                "logicalunit",
                "--tid",
                "1",
                "--lun",
                "1",
                "--bstype",
                "rdwr",
                "-b",
                &img_s,
            ],
            vec![
                "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
            ],
            vec![
                "--op", "new", "--mode", "target", "--tid", "2", "-T", iqn_null,
            ],
            vec![
                "--op",
                "new",
                "--mode",
                "logicalunit",
                "--tid",
                "2",
                "--lun",
                "1",
                "--bstype",
                "null",
                "-b",
                "/dev/null",
            ],
            vec![
                "--op", "bind", "--mode", "target", "--tid", "2", "-I", "ALL",
            ],
        ];
        // the management socket may appear a little after the portal
        let until = Instant::now() + Duration::from_secs(5);
        while tgtadm(ctrl, &["--op", "show", "--mode", "target"]).is_err() && Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        for s in steps {
            tgtadm(ctrl, &s).map_err(|e| PeerError::Setup("tgtd", e))?;
        }
        Ok(t)
    }

    /// Starts istgt in the foreground with a generated configuration: two
    /// logical units (LUN 0 each), a file and /dev/zero (istgt has no null
    /// backend: reads return zeroes and the kernel discards writes).
    /// QueueDepth is set to 128: istgt's default of 0 disables queuing.
    pub fn istgt(l: &Layout, port: u16) -> Result<TargetProc, PeerError> {
        if !have("istgt") {
            return Err(PeerError::Missing("istgt", "apt-get install istgt".into()));
        }
        if !port_free(port) {
            return Err(PeerError::PortBusy(port));
        }
        let sd = l.state.join("istgt");
        fs::create_dir_all(sd.join("media"))
            .map_err(io_err(format!("creating {}", sd.display())))?;
        let img = l.data.join("istgt-file.img");
        backing_file(&img, l.file_size)?;
        let mb = l.file_size / (1 << 20);
        let base = "iqn.2026-11.org.ferrite.peer";
        let conf = format!(
            "[Global]\n  NodeBase \"{base}\"\n  PidFile {sd}/istgt.pid\n  AuthFile {sd}/auth.conf\n  MediaDirectory {sd}/media\n\
  LogFacility \"local7\"\n  Timeout 30\n  NopInInterval 20\n  DiscoveryAuthMethod None\n  MaxSessions 128\n  MaxConnections 4\n\
  MaxR2T 32\n  MaxOutstandingR2T 16\n  DefaultTime2Wait 2\n  DefaultTime2Retain 60\n  FirstBurstLength 65536\n\
  MaxBurstLength 1048576\n  MaxRecvDataSegmentLength 262144\n  InitialR2T Yes\n  ImmediateData Yes\n\
  DataPDUInOrder Yes\n  DataSequenceInOrder Yes\n  ErrorRecoveryLevel 0\n\n\
[UnitControl]\n  AuthMethod None\n\n\
[PortalGroup1]\n  Portal DA1 127.0.0.1:{port}\n\n\
[InitiatorGroup1]\n  InitiatorName \"ALL\"\n  Netmask 127.0.0.0/8\n\n\
[LogicalUnit1]\n  TargetName istgt-file\n  Mapping PortalGroup1 InitiatorGroup1\n  AuthMethod None\n  UseDigest Auto\n\
  UnitType Disk\n  QueueDepth 128\n  LUN0 Storage {img} {mb}MB\n\n\
[LogicalUnit2]\n  TargetName istgt-null\n  Mapping PortalGroup1 InitiatorGroup1\n  AuthMethod None\n  UseDigest Auto\n\
  UnitType Disk\n  QueueDepth 128\n  LUN0 Storage /dev/zero {mb}MB\n",
            sd = sd.display(),
            img = img.display(),
        );
        let conf_path = sd.join("istgt.conf");
        fs::write(&conf_path, conf).map_err(io_err(format!("writing {}", conf_path.display())))?;
        fs::File::create(sd.join("auth.conf")).map_err(io_err("creating auth.conf"))?;
        let mut cmd = Command::new("istgt");
        cmd.arg("-D")
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(sd.join("istgt.pid"));
        let command = describe(&cmd);
        let log = sd.join("istgt.log");
        let child = spawn(cmd, &log)?;
        let portal = SocketAddr::from(([127, 0, 0, 1], port));
        let mut t = TargetProc::finish_start(
            Kind::Istgt,
            child,
            port,
            command,
            log,
            (
                LunAddr {
                    portal,
                    iqn: format!("{base}:istgt-null"),
                    lun: 0,
                },
                LunAddr {
                    portal,
                    iqn: format!("{base}:istgt-file"),
                    lun: 0,
                },
            ),
        )?;
        t.file_image = Some(img);
        Ok(t)
    }

    pub fn start(kind: Kind, l: &Layout, port: u16) -> Result<TargetProc, PeerError> {
        match kind {
            Kind::Ferrite => TargetProc::ferrited(l, port),
            Kind::Tgtd => TargetProc::tgtd(l, port),
            Kind::Istgt => TargetProc::istgt(l, port),
        }
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stops the process by PID: tgtd through tgtadm first (it ignores
    /// SIGTERM while it has targets), then SIGTERM, then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(ctrl) = self.tgtd_ctrl {
            for tid in ["1", "2"] {
                let _ = tgtadm(
                    ctrl,
                    &[
                        "--op", "delete", "--mode", "target", "--tid", tid, "--force",
                    ],
                );
            }
            let _ = Command::new("tgtadm")
                .args([
                    "-C",
                    &ctrl.to_string(),
                    "--op",
                    "delete",
                    "--mode",
                    "system",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Ok(None) = child.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for TargetProc {
    fn drop(&mut self) {
        self.stop();
        // the file LUN lives in tmpfs: give the memory back
        if let Some(img) = &self.file_image {
            let _ = fs::remove_file(img);
        }
    }
}

fn tgtadm(ctrl: u16, args: &[&str]) -> Result<(), String> {
    let o = Command::new("tgtadm")
        .args(["-C", &ctrl.to_string(), "--lld", "iscsi"])
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "tgtadm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// `dpkg-query` version of a Debian package, if installed.
pub fn package_version(pkg: &str) -> Option<String> {
    let o = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", pkg])
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (o.status.success() && !v.is_empty()).then_some(v)
}

/// Installs missing Debian packages when running as root; otherwise says
/// what to install. Returns a note for the report.
pub fn ensure_packages(pkgs: &[(&str, &str)]) -> Vec<String> {
    let missing: Vec<&str> = pkgs
        .iter()
        .filter(|(_, prog)| !have(prog))
        .map(|(p, _)| *p)
        .collect();
    if missing.is_empty() {
        return Vec::new();
    }
    let root = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    let apt = have("apt-get");
    if root && apt {
        eprintln!(
            "ferrite-bench: installing missing packages: {}",
            missing.join(" ")
        );
        let ok = Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return vec![format!("installed {}", missing.join(" "))];
        }
        return vec![format!("apt-get install {} failed", missing.join(" "))];
    }
    vec![format!(
        "missing: {} (install with `apt-get install {}` as root)",
        missing.join(" "),
        missing.join(" ")
    )]
}
