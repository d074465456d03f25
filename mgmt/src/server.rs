//! The control socket: a Unix socket serving the tree as JSON lines.
//!
//! Each request is one JSON object on one line; each answer is one line:
//!
//! ```text
//! {"op":"ls","path":"/devices"}                      -> {"ok":true,"entries":[...]}
//! {"op":"get","path":"/devices/disk0/size"}          -> {"ok":true,"value":{"value":"1073741824","key":true,...}}
//! {"op":"set","path":"...","value":"1"}              -> {"ok":true,"message":"..."}
//! {"op":"do","path":".../luns/mgmt","command":"add disk1 1"} -> {"ok":true,"message":"..."}
//! {"op":"save"} | {"op":"save","file":"/etc/ferrite.json"}   -> {"ok":true,"message":"saved to ..."}
//! {"op":"apply","config":{...}} | {"op":"diff","config":{...}} -> {"ok":true,"changes":["..."]}
//! {"op":"sessions"} -> {"ok":true,"sessions":[...]}   {"op":"stats"} -> {"ok":true,"stats":{...}}
//! {"op":"config"}   -> {"ok":true,"config":{...}}    (the running configuration)
//! anything else     -> {"ok":false,"error":"..."}
//! ```
//!
//! The socket file is mode 0600 in a directory created 0700, and a peer
//! whose SO_PEERCRED uid is neither root nor the server's own is refused
//! with an error line. One thread per client: this is the control path.
//!
//! Owns the socket and the protocol, not the tree's semantics ([`Tree`]).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::runtime::{Runtime, SessionInfo, Stats};
use crate::tree::{AttrValue, Entry, Tree};
use crate::view::ViewNode;

/// Longest request line accepted (an `apply` carries a whole configuration).
pub const MAX_REQUEST: u64 = 16 << 20;

/// The control socket's path as root.
pub const DEFAULT_SOCKET: &str = "/run/ferrite/ferrited.sock";

/// Where ferrited puts its control socket, and where ferritectl looks for
/// it, when neither is told: [`DEFAULT_SOCKET`] as root, else
/// `$XDG_RUNTIME_DIR/ferrite/ferrited.sock`, else
/// `$HOME/.local/state/ferrite/ferrited.sock`.
pub fn default_socket() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from(DEFAULT_SOCKET);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return Path::new(&d).join("ferrite/ferrited.sock");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return Path::new(&h).join(".local/state/ferrite/ferrited.sock");
    }
    PathBuf::from("/tmp/ferrite/ferrited.sock")
}

/// The socket's file name inside a state directory.
pub const STATE_DIR_SOCKET: &str = "ferrited.sock";

/// The control socket, as ferrited and ferritectl both choose it: `socket`
/// when given (`--socket`, `FERRITE_SOCKET`); else `ferrited.sock` in the
/// state directory when one is given (`--state-dir`, `FERRITE_STATE_DIR`),
/// so daemons with state directories of their own have sockets of their
/// own; else [`default_socket`].
pub fn socket_path(socket: Option<&Path>, state_dir: Option<&Path>) -> PathBuf {
    match (socket, state_dir) {
        (Some(s), _) => s.to_path_buf(),
        (None, Some(d)) => d.join(STATE_DIR_SOCKET),
        (None, None) => default_socket(),
    }
}

/// One request line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Ls {
        #[serde(default)]
        path: Option<String>,
    },
    Get {
        path: String,
    },
    Set {
        path: String,
        value: String,
    },
    Do {
        path: String,
        command: String,
    },
    Save {
        #[serde(default)]
        file: Option<PathBuf>,
    },
    Apply {
        config: Box<Config>,
    },
    Diff {
        config: Box<Config>,
    },
    Sessions,
    Stats,
    Config,
    /// The view of a subtree ([`crate::view`]).
    Tree {
        #[serde(default)]
        path: Option<String>,
    },
}

/// One answer line. `ok` false carries `error`; the other fields depend on
/// the request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<Vec<Entry>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<AttrValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<Vec<SessionInfo>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Box<Config>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<ViewNode>,
}

impl Response {
    fn ok() -> Response {
        Response {
            ok: true,
            ..Response::default()
        }
    }

    /// An error answer.
    pub fn err(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            ..Response::default()
        }
    }

    fn message(msg: String) -> Response {
        Response {
            message: Some(msg),
            ..Response::ok()
        }
    }

    /// The answer as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_else(|e| {
            format!("{{\"ok\":false,\"error\":\"cannot encode answer: {e}\"}}")
        });
        s.push('\n');
        s
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: a server is already listening there")]
    InUse(PathBuf),
    #[error("{0}: exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
}

fn lock(tree: &Mutex<Tree>) -> std::sync::MutexGuard<'_, Tree> {
    // A panic in another client's thread leaves the tree consistent: every
    // change adopts its new model in one assignment.
    tree.lock().unwrap_or_else(|e| e.into_inner())
}

/// Answers one request line. Never panics on any input.
pub fn handle_line(tree: &Mutex<Tree>, line: &str) -> Response {
    let req: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => {
            return Response::err(format!(
                "bad request: {e}; a request is one JSON object per line with \"op\" one of \
                 ls, get, set, do, save, apply, diff, sessions, stats, config, tree"
            ));
        }
    };
    handle(tree, req)
}

/// Answers one parsed request.
pub fn handle(tree: &Mutex<Tree>, req: Request) -> Response {
    let r = match req {
        Request::Ls { path } => lock(tree)
            .ls(path.as_deref().unwrap_or("/"))
            .map(|e| Response {
                entries: Some(e),
                ..Response::ok()
            }),
        Request::Get { path } => lock(tree).get(&path).map(|v| Response {
            value: Some(v),
            ..Response::ok()
        }),
        Request::Tree { path } => crate::view::view(&lock(tree), path.as_deref().unwrap_or("/"))
            .map(|v| Response {
                tree: Some(v),
                ..Response::ok()
            }),
        Request::Set { path, value } => lock(tree).set(&path, &value).map(Response::message),
        Request::Do { path, command } => lock(tree).run(&path, &command).map(Response::message),
        Request::Save { file } => lock(tree)
            .save(file.as_deref())
            .map(|p| Response::message(format!("saved to {}", p.display()))),
        Request::Apply { config } => lock(tree).apply(&config).map(|c| Response {
            changes: Some(c.iter().map(ToString::to_string).collect()),
            ..Response::ok()
        }),
        Request::Diff { config } => lock(tree).diff(&config).map(|c| Response {
            changes: Some(c.iter().map(ToString::to_string).collect()),
            ..Response::ok()
        }),
        Request::Sessions => {
            let rt = lock(tree).runtime().clone();
            Ok(Response {
                sessions: Some(rt.sessions()),
                ..Response::ok()
            })
        }
        Request::Stats => {
            let rt = lock(tree).runtime().clone();
            Ok(Response {
                stats: Some(rt.stats()),
                ..Response::ok()
            })
        }
        Request::Config => Ok(Response {
            // With the running system's ALUA states, as `save` writes it.
            config: Some(Box::new(lock(tree).live_config())),
            ..Response::ok()
        }),
    };
    r.unwrap_or_else(|e| Response::err(e.to_string()))
}

/// Whether a peer may manage: root, or the uid the server runs as.
fn peer_allowed(stream: &UnixStream) -> Result<(), String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let cred = getsockopt(stream, PeerCredentials).map_err(|e| format!("SO_PEERCRED: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if cred.uid() == 0 || cred.uid() == me {
        Ok(())
    } else {
        Err(format!(
            "permission denied: uid {} may not manage ferrited (root only)",
            cred.uid()
        ))
    }
}

/// Serves one client until it hangs up.
fn serve_client(tree: &Mutex<Tree>, stream: UnixStream) {
    let mut out = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("control socket: {e}");
            return;
        }
    };
    if let Err(msg) = peer_allowed(&stream) {
        tracing::warn!("control socket: {msg}");
        // Take the request line (bounded in size and time) before refusing,
        // so the peer reads the refusal instead of a broken pipe.
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let mut sink = Vec::new();
        let _ = BufReader::new(&stream)
            .take(64 << 10)
            .read_until(b'\n', &mut sink);
        let _ = out.write_all(Response::err(msg).to_line().as_bytes());
        return;
    }
    let mut reader = BufReader::new(stream);
    loop {
        let mut buf = Vec::new();
        match reader
            .by_ref()
            .take(MAX_REQUEST + 1)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::debug!("control socket read: {e}");
                return;
            }
        }
        if buf.len() as u64 > MAX_REQUEST {
            let _ = out.write_all(
                Response::err(format!("request longer than {MAX_REQUEST} bytes"))
                    .to_line()
                    .as_bytes(),
            );
            return;
        }
        let complete = buf.last() == Some(&b'\n');
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim();
        if line.is_empty() {
            if complete {
                continue;
            }
            return;
        }
        let rsp = handle_line(tree, line);
        if out.write_all(rsp.to_line().as_bytes()).is_err() {
            return;
        }
        if !complete {
            // A request cut short by the peer's hang-up was answered; the
            // stream has nothing more.
            return;
        }
    }
}

/// A running control socket server.
pub struct ControlServer {
    path: PathBuf,
    tree: Arc<Mutex<Tree>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn bind(path: &Path) -> Result<UnixListener, ServerError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ServerError::Io { path: p, source }
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(dir))?;
    }
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(ServerError::InUse(path.to_path_buf()));
            }
            fs::remove_file(path).map_err(io(path))?;
        }
        Ok(_) => return Err(ServerError::NotASocket(path.to_path_buf())),
        Err(_) => {}
    }
    let l = UnixListener::bind(path).map_err(io(path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io(path))?;
    Ok(l)
}

impl ControlServer {
    /// Binds `socket` and serves `tree` on a background thread.
    pub fn start(socket: &Path, tree: Tree) -> Result<ControlServer, ServerError> {
        let listener = bind(socket)?;
        let tree = Arc::new(Mutex::new(tree));
        let stop = Arc::new(AtomicBool::new(false));
        let (t2, s2) = (tree.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("mgmt-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s2.load(Ordering::Acquire) {
                        break;
                    }
                    match conn {
                        Ok(stream) => {
                            let t = t2.clone();
                            let spawned = std::thread::Builder::new()
                                .name("mgmt-client".into())
                                .spawn(move || serve_client(&t, stream));
                            if let Err(e) = spawned {
                                tracing::warn!("control socket: cannot start a client thread: {e}");
                            }
                        }
                        Err(e) => tracing::warn!("control socket accept: {e}"),
                    }
                }
            })
            .map_err(|source| ServerError::Io {
                path: socket.to_path_buf(),
                source,
            })?;
        Ok(ControlServer {
            path: socket.to_path_buf(),
            tree,
            stop,
            thread: Some(thread),
        })
    }

    /// The tree, shared with the client threads.
    pub fn tree(&self) -> Arc<Mutex<Tree>> {
        self.tree.clone()
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting clients and removes the socket file. Clients already
    /// connected finish their current request.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Release);
            // Wake the accept loop.
            let _ = UnixStream::connect(&self.path);
            let _ = t.join();
            let _ = fs::remove_file(&self.path);
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// What the daemon calls: serves a tree over `config` (which `runtime`
/// already runs) on `socket`; `save` is where `save` with no file writes.
pub fn serve(
    runtime: Arc<dyn Runtime>,
    config: Config,
    save: Option<PathBuf>,
    socket: &Path,
) -> Result<ControlServer, ServerError> {
    ControlServer::start(socket, Tree::new(config, runtime, save))
}

/// A client: sends one request, reads one answer.
pub fn request(socket: &Path, req: &Request) -> std::io::Result<Response> {
    let mut s = UnixStream::connect(socket)?;
    let mut line = serde_json::to_string(req).map_err(std::io::Error::other)?;
    line.push('\n');
    // A server that refuses the peer may answer and close before reading
    // everything: its answer is still worth reading.
    let written = s.write_all(line.as_bytes());
    let mut answer = String::new();
    let read = BufReader::new(s).read_line(&mut answer);
    if answer.is_empty() {
        written?;
        read?;
    }
    serde_json::from_str(&answer).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad answer from ferrited: {e}: {answer:?}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::FakeRuntime;

    fn start() -> (tempfile::TempDir, ControlServer, Arc<FakeRuntime>) {
        let dir = tempfile::tempdir().unwrap();
        let rt = Arc::new(FakeRuntime::new());
        let cfg = Config::embedded_default(dir.path(), "127.0.0.1:3260".parse().unwrap());
        let srv = serve(
            rt.clone(),
            cfg,
            Some(dir.path().join("ferrite.json")),
            &dir.path().join("run/ctl.sock"),
        )
        .unwrap();
        (dir, srv, rt)
    }

    fn raw(path: &Path, bytes: &[u8], shut_write: bool) -> String {
        let mut s = UnixStream::connect(path).unwrap();
        s.write_all(bytes).unwrap();
        if shut_write {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        line
    }

    #[test]
    fn socket_mode_and_round_trips() {
        let (dir, srv, rt) = start();
        let sock = srv.path().to_path_buf();
        let mode = fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = fs::metadata(sock.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);

        let r = request(
            &sock,
            &Request::Ls {
                path: Some("/devices".into()),
            },
        )
        .unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(r.entries.unwrap()[0].name, "disk0");
        let r = request(
            &sock,
            &Request::Get {
                path: "/devices/disk0/size".into(),
            },
        )
        .unwrap();
        assert_eq!(r.value.unwrap().to_text(), "1073741824\n[key]");
        let r = request(
            &sock,
            &Request::Do {
                path: "/handlers/vdisk_nullio/mgmt".into(),
                command: "add_device n0 size=1M".into(),
            },
        )
        .unwrap();
        assert!(r.ok, "{r:?}");
        assert_eq!(rt.calls(), vec!["add_device n0 vdisk_nullio".to_string()]);
        let r = request(
            &sock,
            &Request::Set {
                path: "/devices/n0/read_only".into(),
                value: "x".into(),
            },
        )
        .unwrap();
        assert!(!r.ok);
        assert!(r.error.unwrap().contains("not a boolean"));
        let r = request(&sock, &Request::Save { file: None }).unwrap();
        assert!(r.ok, "{r:?}");
        let saved = Config::load(&dir.path().join("ferrite.json")).unwrap();
        assert!(saved.device("n0").is_some());
        // diff and apply of the saved file: nothing to do.
        let r = request(
            &sock,
            &Request::Diff {
                config: Box::new(saved.clone()),
            },
        )
        .unwrap();
        assert_eq!(r.changes.unwrap(), Vec::<String>::new());
        let mut next = saved.clone();
        next.devices.retain(|d| d.name != "n0");
        let r = request(
            &sock,
            &Request::Apply {
                config: Box::new(next),
            },
        )
        .unwrap();
        assert_eq!(
            r.changes.unwrap(),
            vec!["do /handlers/vdisk_nullio/mgmt \"del_device n0\"".to_string()]
        );
        let r = request(&sock, &Request::Sessions).unwrap();
        assert_eq!(r.sessions.unwrap(), vec![]);
        let r = request(&sock, &Request::Stats).unwrap();
        assert!(r.stats.is_some());
        let r = request(&sock, &Request::Config).unwrap();
        assert!(r.config.unwrap().device("n0").is_none());
        srv.shutdown();
        assert!(!sock.exists());
    }

    #[test]
    fn bad_requests_get_error_lines() {
        let (_dir, srv, _rt) = start();
        let sock = srv.path().to_path_buf();
        for (bytes, want) in [
            (&b"not json\n"[..], "bad request"),
            (b"{\"op\":\"ls\",\"path\":\"/dev", "bad request"),
            (b"{\"op\":\"launch\"}\n", "unknown variant"),
            (b"{\"op\":\"get\"}\n", "missing field `path`"),
            (
                b"{\"op\":\"get\",\"path\":\"/x\",\"extra\":1}\n",
                "unknown field",
            ),
            (b"[1,2]\n", "bad request"),
            (b"\xff\xfe\n", "bad request"),
            (b"{\"op\":\"get\",\"path\":\"/nope\"}\n", "no such object"),
        ] {
            let shut = !bytes.ends_with(b"\n");
            let line = raw(&sock, bytes, shut);
            let r: Response = serde_json::from_str(&line).unwrap();
            assert!(!r.ok, "{line}");
            let e = r.error.unwrap();
            assert!(
                e.contains(want),
                "{:?}: {e}",
                String::from_utf8_lossy(bytes)
            );
        }
        // Several requests on one connection, with a blank line between.
        let mut s = UnixStream::connect(&sock).unwrap();
        s.write_all(b"{\"op\":\"ls\"}\n\n{\"op\":\"get\",\"path\":\"/devices/disk0/blocksize\"}\n")
            .unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let lines: Vec<String> = BufReader::new(s).lines().map(Result::unwrap).collect();
        assert_eq!(lines.len(), 2);
        let r: Response = serde_json::from_str(&lines[1]).unwrap();
        assert_eq!(r.value.unwrap().value, "512");
        // The server still answers after all that.
        assert!(request(&sock, &Request::Ls { path: None }).unwrap().ok);
    }

    #[test]
    fn second_server_refused_stale_socket_replaced() {
        let (dir, srv, _rt) = start();
        let sock = srv.path().to_path_buf();
        let rt = Arc::new(FakeRuntime::new());
        let e = serve(rt.clone(), Config::default(), None, &sock).unwrap_err();
        assert!(matches!(e, ServerError::InUse(_)), "{e}");
        drop(srv);
        // A stale socket file (no listener) is replaced.
        let l = UnixListener::bind(&sock).unwrap();
        drop(l);
        assert!(sock.exists());
        let srv2 = serve(rt.clone(), Config::default(), None, &sock).unwrap();
        assert!(request(&sock, &Request::Ls { path: None }).unwrap().ok);
        drop(srv2);
        let file = dir.path().join("plain");
        fs::write(&file, "x").unwrap();
        assert!(matches!(
            serve(rt, Config::default(), None, &file),
            Err(ServerError::NotASocket(_))
        ));
    }

    #[test]
    fn handle_line_is_total() {
        let rt = Arc::new(FakeRuntime::new());
        let tree = Mutex::new(Tree::new(Config::default(), rt, None));
        for l in [
            "",
            "{",
            "null",
            "{\"op\":null}",
            "{\"op\":\"save\"}",
            "{\"op\":\"do\",\"path\":\"/\",\"command\":\"\"}",
        ] {
            assert!(!handle_line(&tree, l).ok, "{l}");
        }
    }
}
