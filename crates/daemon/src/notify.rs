//! The service manager's readiness protocol (sd_notify(3)), without
//! libsystemd: when systemd starts ferrited with `Type=notify` it sets
//! `NOTIFY_SOCKET` to a unix datagram socket (a path, or an abstract name
//! written with a leading `@`), and ferrited sends `READY=1` there once its
//! portals are bound and its control socket answers, and `STOPPING=1` when it
//! begins to shut down. Without `NOTIFY_SOCKET` nothing is sent.
//!
//! A message that cannot be sent is logged and dropped: the service manager
//! then times the start out, which says more than a daemon that refuses to run.

use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Where `NOTIFY_SOCKET` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyAddr {
    /// A socket file.
    Path(std::path::PathBuf),
    /// A Linux abstract socket name (`@name`, sent as `\0name`).
    Abstract(Vec<u8>),
}

impl NotifyAddr {
    /// Reads a `NOTIFY_SOCKET` value; None when it is empty or neither an
    /// absolute path nor `@name` (sd_notify(3) ignores those too).
    pub fn parse(v: &std::ffi::OsStr) -> Option<NotifyAddr> {
        use std::os::unix::ffi::OsStrExt;
        let b = v.as_bytes();
        match b.first() {
            Some(b'@') if b.len() > 1 => Some(NotifyAddr::Abstract(b[1..].to_vec())),
            Some(b'/') => Some(NotifyAddr::Path(std::path::PathBuf::from(v))),
            _ => None,
        }
    }

    fn socket_addr(&self) -> io::Result<SocketAddr> {
        match self {
            NotifyAddr::Path(p) => SocketAddr::from_pathname(p),
            NotifyAddr::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)
            }
        }
    }

    /// Sends one notification (`READY=1`, `STOPPING=1`, `STATUS=...`).
    pub fn send(&self, msg: &str) -> io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        let n = sock.send_to_addr(msg.as_bytes(), &self.socket_addr()?)?;
        if n != msg.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "notification sent in part",
            ));
        }
        Ok(())
    }
}

/// The service manager's socket, from the environment.
#[derive(Debug, Default)]
pub struct Notifier {
    addr: Option<NotifyAddr>,
}

impl Notifier {
    /// From `NOTIFY_SOCKET`, when set.
    pub fn from_env() -> Notifier {
        Notifier {
            addr: std::env::var_os("NOTIFY_SOCKET").and_then(|v| NotifyAddr::parse(&v)),
        }
    }

    /// Sends `msg` if a service manager listens; failures are logged.
    pub fn notify(&self, msg: &str) {
        if let Some(a) = &self.addr {
            match a.send(msg) {
                Ok(()) => tracing::debug!(message = msg, "service manager notified"),
                Err(e) => {
                    tracing::warn!(message = msg, error = %e, "cannot notify the service manager")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::time::Duration;

    #[test]
    fn notify_socket_values_are_a_path_or_an_abstract_name() {
        assert_eq!(
            NotifyAddr::parse(OsStr::new("/run/systemd/notify")),
            Some(NotifyAddr::Path("/run/systemd/notify".into()))
        );
        assert_eq!(
            NotifyAddr::parse(OsStr::new("@/org/freedesktop/systemd1/notify/1")),
            Some(NotifyAddr::Abstract(
                b"/org/freedesktop/systemd1/notify/1".to_vec()
            ))
        );
        assert_eq!(NotifyAddr::parse(OsStr::new("")), None);
        assert_eq!(NotifyAddr::parse(OsStr::new("@")), None);
        assert_eq!(NotifyAddr::parse(OsStr::new("relative/sock")), None);
    }

    #[test]
    fn a_notification_arrives_as_one_datagram_on_a_path_and_an_abstract_socket() {
        let dir = tempdir();
        let path = dir.join("notify");
        let rx = UnixDatagram::bind(&path).expect("bind");
        rx.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        NotifyAddr::Path(path.clone())
            .send("READY=1")
            .expect("send to path");
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("ferrite-notify-test-{}", std::process::id());
        let a = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract addr");
        let rx = UnixDatagram::bind_addr(&a).expect("bind abstract");
        rx.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        NotifyAddr::Abstract(name.into_bytes())
            .send("STOPPING=1")
            .expect("send to abstract");
        let n = rx.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"STOPPING=1");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn without_a_listener_a_notification_is_an_error_not_a_panic() {
        let dir = tempdir();
        assert!(
            NotifyAddr::Path(dir.join("nobody"))
                .send("READY=1")
                .is_err()
        );
        Notifier {
            addr: Some(NotifyAddr::Path(dir.join("nobody"))),
        }
        .notify("READY=1");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "ferrite-notify-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }
}
