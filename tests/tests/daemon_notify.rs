//! ferrited speaks the service manager's readiness protocol (sd_notify(3),
//! what `Type=notify` in ferrited.service relies on): started with
//! `NOTIFY_SOCKET` pointing to a unix datagram socket, it sends `READY=1`
//! only once its portal accepts connections and its control socket answers,
//! and `STOPPING=1` when SIGTERM stops it. Both a socket file and an
//! abstract name (`@name`, as systemd passes it) are tested.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use ferrite_tests::{Ferrited, control_request, ferrited_command, free_port};

/// ferrited on `port` with `NOTIFY_SOCKET=notify_socket`, not waited for:
/// the notifications are what the test waits for.
fn spawn(dir: &Path, port: u16, notify_socket: &str) -> Ferrited {
    let state = dir.join("state");
    let mut cmd = ferrited_command(&state);
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("NOTIFY_SOCKET", notify_socket)
        .env("RUST_LOG", "info");
    Ferrited::spawn(cmd, &state, SocketAddr::from(([127, 0, 0, 1], port)))
}

/// Waits up to `limit` for one datagram; fails the test if ferrited exits
/// first.
fn next_message(rx: &UnixDatagram, d: &mut Ferrited, limit: Duration) -> String {
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        match rx.recv(&mut buf) {
            Ok(n) => return String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("recv on the notify socket: {e}"),
        }
        if let Some(st) = d.try_wait() {
            panic!(
                "ferrited exited with {st} before notifying:\n{}",
                d.log_text()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no notification within {limit:?}:\n{}",
            d.log_text()
        );
    }
}

/// READY=1 comes once the portal and the control socket answer; SIGTERM
/// brings STOPPING=1 and a clean exit.
fn ready_then_stopping(rx: &UnixDatagram, notify_socket: &str, dir: &Path) {
    let port = free_port();
    let mut d = spawn(dir, port, notify_socket);
    let msg = next_message(rx, &mut d, Duration::from_secs(60));
    // Checked at once, before anything else can come up.
    let portal: SocketAddr = SocketAddr::from(([127, 0, 0, 1], port));
    let connected = TcpStream::connect_timeout(&portal, Duration::from_secs(2));
    let control = control_request(&dir.join("state/ferrited.sock"), r#"{"op":"config"}"#);
    assert_eq!(msg, "READY=1", "first notification:\n{}", d.log_text());
    assert!(
        connected.is_ok(),
        "READY=1 sent while the portal {portal} refuses connections: {:?}\n{}",
        connected.err(),
        d.log_text()
    );
    assert!(
        control.as_deref().is_ok_and(|r| r.contains("\"ok\":true")),
        "READY=1 sent before the control socket answers: {control:?}\n{}",
        d.log_text()
    );
    // The log reaches the test through a pipe and a reader thread: wait
    // for the line that comes last.
    let l = d.wait_log("control socket ready", 1);
    let ready_at = l.find("control socket ready").expect("logged");
    assert!(
        l.find("iSCSI portal listening")
            .is_some_and(|p| p < ready_at),
        "{l}"
    );
    drop(connected);

    d.terminate();
    let msg = next_message(rx, &mut d, Duration::from_secs(20));
    assert_eq!(msg, "STOPPING=1", "after SIGTERM:\n{}", d.log_text());
    let status = d
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("ferrited did not stop:\n{}", d.log_text()));
    assert!(
        status.success(),
        "ferrited exited with {status}:\n{}",
        d.log_text()
    );
    // Nothing after STOPPING=1.
    rx.set_nonblocking(true).expect("nonblocking");
    let mut buf = [0u8; 64];
    assert!(rx.recv(&mut buf).is_err(), "a message after STOPPING=1");
}

#[test]
fn ready_only_once_the_portal_and_control_socket_answer_on_a_socket_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify.sock");
    let rx = UnixDatagram::bind(&path).expect("bind notify socket");
    ready_then_stopping(&rx, path.to_str().expect("utf-8 path"), dir.path());
}

#[test]
fn ready_only_once_the_portal_and_control_socket_answer_on_an_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let name = format!("ferrite-test-notify-{}-{}", std::process::id(), free_port());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .expect("abstract address");
    let rx = UnixDatagram::bind_addr(&addr).expect("bind abstract notify socket");
    ready_then_stopping(&rx, &format!("@{name}"), dir.path());
}
