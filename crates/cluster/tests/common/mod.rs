//! A real etcd on loopback for the tests: temp data dir, free ports, killed
//! at the end. Tests skip with a message when /usr/bin/etcd is missing.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferrite_cluster::{Etcd, Event};

pub const ETCD: &str = "/usr/bin/etcd";

pub struct EtcdProc {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub client: u16,
    pub peer: u16,
}

/// Two distinct free ports (both bound at once, then released).
fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").expect("bind");
    let b = TcpListener::bind("127.0.0.1:0").expect("bind");
    (
        a.local_addr().expect("addr").port(),
        b.local_addr().expect("addr").port(),
    )
}

impl EtcdProc {
    /// Starts etcd and waits until it answers; `None` (after saying why)
    /// when etcd is not installed.
    pub fn start(test: &str) -> Option<EtcdProc> {
        if !Path::new(ETCD).exists() {
            eprintln!(
                "SKIP {test}: {ETCD} not found (install etcd-server: tools/install-test-deps)"
            );
            return None;
        }
        // A port taken between picking and binding it: pick again.
        for _ in 0..3 {
            let (client, peer) = free_ports();
            let mut e = EtcdProc {
                child: None,
                dir: tempfile::tempdir().expect("tempdir"),
                client,
                peer,
            };
            if e.spawn() {
                return Some(e);
            }
        }
        panic!("etcd did not start on three pairs of free ports");
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }

    pub fn client(&self) -> Etcd {
        Etcd::new(&[self.endpoint()], Duration::from_secs(2)).expect("client")
    }

    /// Starts etcd and waits until it answers; false if it exited first.
    fn spawn(&mut self) -> bool {
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).expect("log");
        let child = Command::new(ETCD)
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.endpoint()])
            .args(["--advertise-client-urls", &self.endpoint()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let c = self.client();
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.get("/ready").is_err() {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                eprintln!("etcd exited ({st}): {}", self.log());
                self.child = None;
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not answer within 30 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        true
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let st = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig} {pid}");
    }

    /// SIGSTOP: etcd keeps its sockets but answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same data dir and ports.
    pub fn restart(&mut self) {
        self.kill();
        assert!(self.spawn(), "etcd did not restart: {}", self.log());
    }
}

impl Drop for EtcdProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every node's events on one channel, stamped on arrival, kept in order.
pub struct Recorder {
    tx: mpsc::Sender<(String, Instant, Event)>,
    rx: mpsc::Receiver<(String, Instant, Event)>,
    pub log: Vec<(String, Instant, Event)>,
}

impl Recorder {
    pub fn new() -> Recorder {
        let (tx, rx) = mpsc::channel();
        Recorder {
            tx,
            rx,
            log: Vec::new(),
        }
    }

    pub fn sink(&self, node: &str) -> impl Fn(Event) + Send + 'static {
        let tx = self.tx.clone();
        let node = node.to_string();
        move |ev| {
            let _ = tx.send((node.clone(), Instant::now(), ev));
        }
    }

    /// Where the events from now on start, for [`Recorder::wait`].
    pub fn mark(&mut self) -> usize {
        self.drain(Duration::ZERO);
        self.log.len()
    }

    /// Waits (at most `within`) for an event at or after `from` in the log
    /// that `pred` accepts.
    pub fn wait(
        &mut self,
        from: usize,
        within: Duration,
        what: &str,
        pred: impl Fn(&str, &Event) -> bool,
    ) -> (String, Instant, Event) {
        let deadline = Instant::now() + within;
        let mut i = from;
        loop {
            while i < self.log.len() {
                let rec = &self.log[i];
                if pred(&rec.0, &rec.2) {
                    return rec.clone();
                }
                i += 1;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(rec) => self.log.push(rec),
                Err(_) => panic!("no {what} within {within:?}; events: {:#?}", self.log),
            }
        }
    }

    /// Takes what arrived until `within` passes.
    pub fn drain(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while let Ok(rec) = self
            .rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.log.push(rec);
        }
    }

    /// The intervals in which each node believed it owned `group`: from an
    /// `Owner { me: true }` to the next `Owner { me: false }`, or to the
    /// fencing deadline a `Fenced` names; `open_until` closes what is still
    /// open.
    pub fn ownership(&self, group: &str, open_until: Instant) -> Vec<(String, Instant, Instant)> {
        let mut open: std::collections::HashMap<String, Instant> = Default::default();
        let mut out = Vec::new();
        for (node, t, ev) in &self.log {
            match ev {
                Event::Owner {
                    group: g, me: true, ..
                } if g == group => {
                    open.entry(node.clone()).or_insert(*t);
                }
                Event::Owner {
                    group: g,
                    me: false,
                    ..
                } if g == group => {
                    if let Some(start) = open.remove(node) {
                        out.push((node.clone(), start, *t));
                    }
                }
                Event::Fenced { since } => {
                    if let Some(start) = open.remove(node) {
                        out.push((node.clone(), start, *since));
                    }
                }
                _ => {}
            }
        }
        out.extend(open.into_iter().map(|(n, s)| (n, s, open_until)));
        out
    }

    /// Asserts no two nodes believed they owned `group` at the same time.
    pub fn assert_never_two_owners(&self, group: &str, open_until: Instant) {
        let iv = self.ownership(group, open_until);
        for a in &iv {
            for b in &iv {
                if a.0 != b.0 {
                    assert!(
                        a.2 <= b.1 || b.2 <= a.1,
                        "two owners of {group} at once: {a:?} and {b:?}; events: {:#?}",
                        self.log
                    );
                }
            }
        }
    }
}

/// `Owner { group, me: true }` of `node`.
pub fn owner_me(node: &'static str, group: &'static str) -> impl Fn(&str, &Event) -> bool {
    move |n, e| n == node && matches!(e, Event::Owner { group: g, me: true, .. } if g == group)
}
