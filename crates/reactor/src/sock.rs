//! Socket state the kernel knows before a reactor reads it.

use std::os::fd::{AsFd, AsRawFd};

/// `TCP_ESTABLISHED` in `struct tcp_info`'s `tcpi_state` (linux/tcp.h).
const TCP_ESTABLISHED: u8 = 1;

/// True once a TCP connection has left the established state: the peer
/// closed or reset it (CLOSE_WAIT, CLOSE, LAST_ACK) or this side began to
/// close it. Asks the kernel (`TCP_INFO`), so it holds even while the
/// reactor that owns the socket has not yet read the end of the stream.
/// False if the state cannot be read.
pub fn tcp_left_established(sock: &impl AsFd) -> bool {
    // tcpi_state is the first byte of struct tcp_info; the kernel copies at
    // most the length asked for.
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` is a writable buffer of `len` bytes that outlives the
    // call, `len` points to a valid socklen_t, and the descriptor is
    // borrowed, so it stays open for the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    rc == 0 && len >= 1 && info[0] != TCP_ESTABLISHED
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{Shutdown, TcpListener, TcpStream};

    #[test]
    fn a_closed_peer_is_seen_before_reading() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s, _) = l.accept().expect("accept");
        assert!(!tcp_left_established(&s));
        assert!(!tcp_left_established(&c));
        c.shutdown(Shutdown::Write).expect("shutdown");
        // Wait for the FIN without consuming it: the end of the stream is
        // still unread when the state is asked.
        let mut buf = [0u8; 1];
        assert_eq!(s.peek(&mut buf).expect("peek"), 0);
        assert!(tcp_left_established(&s));
        let mut s = s;
        assert_eq!(s.read(&mut buf).expect("read"), 0);
        drop(c);
        assert!(tcp_left_established(&s));
    }

    #[test]
    fn not_a_tcp_socket_reads_as_established() {
        let f = std::fs::File::open("/dev/null").expect("open");
        assert!(!tcp_left_established(&f));
    }
}
