//! A small HTTP/1.1 client for etcd's JSON gateway: one `POST` per
//! connection (`Connection: close`), bounded by a deadline on connect, every
//! write and every read. Responses are framed by `Content-Length`, by chunked
//! transfer coding, or by the server closing the connection.
//!
//! The response parser ([`parse_response`]) does no I/O; [`post`] feeds it
//! the bytes read so far until it says the response is complete.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The largest response body accepted; etcd's answers here are small.
const MAX_RESPONSE: usize = 16 << 20;

/// A transport failure, before any HTTP status was read.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot resolve {0}")]
    Resolve(String),
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("i/o with {addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{addr} did not answer before the deadline")]
    Timeout { addr: String },
    #[error("malformed HTTP response from {addr}: {reason}")]
    Malformed { addr: String, reason: &'static str },
}

/// A complete HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// `host:port` of an endpoint given as `http://host:port[/]` or `host:port`.
pub fn authority(endpoint: &str) -> &str {
    let s = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    s.split('/').next().unwrap_or(s)
}

/// What [`parse_response`] makes of the bytes read so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse {
    /// More bytes are needed.
    Partial,
    Done(Response),
    Malformed(&'static str),
}

/// Parses `buf` as one HTTP/1.1 response; `eof` says the peer closed the
/// connection (which completes a response framed by neither
/// `Content-Length` nor chunked coding).
pub fn parse_response(buf: &[u8], eof: bool) -> Parse {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return if eof {
            Parse::Malformed("connection closed inside the header")
        } else {
            Parse::Partial
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..head_end]) else {
        return Parse::Malformed("header is not UTF-8");
    };
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Parse::Malformed("bad status line");
    };
    if !version.starts_with("HTTP/1.") {
        return Parse::Malformed("not HTTP/1.x");
    }
    let Ok(status) = code.parse::<u16>() else {
        return Parse::Malformed("bad status code");
    };
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Parse::Malformed("bad header line");
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            match value.parse::<usize>() {
                Ok(n) if n <= MAX_RESPONSE => length = Some(n),
                _ => return Parse::Malformed("bad Content-Length"),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("chunked"));
        }
    }
    let body = &buf[head_end + 4..];
    // RFC 9112 §6.3: chunked coding wins over Content-Length.
    if chunked {
        return parse_chunked(body, status, eof);
    }
    match length {
        Some(n) if body.len() >= n => Parse::Done(Response {
            status,
            body: body[..n].to_vec(),
        }),
        Some(_) if eof => Parse::Malformed("connection closed inside the body"),
        Some(_) => Parse::Partial,
        None if eof => Parse::Done(Response {
            status,
            body: body.to_vec(),
        }),
        None if body.len() > MAX_RESPONSE => Parse::Malformed("response too large"),
        None => Parse::Partial,
    }
}

fn parse_chunked(mut rest: &[u8], status: u16, eof: bool) -> Parse {
    let partial = if eof {
        Parse::Malformed("connection closed inside a chunk")
    } else {
        Parse::Partial
    };
    let mut body = Vec::new();
    loop {
        let Some(eol) = find(rest, b"\r\n") else {
            return partial;
        };
        let Ok(size_line) = std::str::from_utf8(&rest[..eol]) else {
            return Parse::Malformed("bad chunk size");
        };
        // RFC 9112 §7.1.1: chunk extensions follow a ';'.
        let size_hex = size_line.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_hex, 16) else {
            return Parse::Malformed("bad chunk size");
        };
        rest = &rest[eol + 2..];
        if size == 0 {
            // Trailer fields, then an empty line (RFC 9112 §7.1.2).
            loop {
                let Some(eol) = find(rest, b"\r\n") else {
                    return partial;
                };
                if eol == 0 {
                    return Parse::Done(Response { status, body });
                }
                rest = &rest[eol + 2..];
            }
        }
        if body.len() + size > MAX_RESPONSE {
            return Parse::Malformed("response too large");
        }
        if rest.len() < size + 2 {
            return partial;
        }
        if &rest[size..size + 2] != b"\r\n" {
            return Parse::Malformed("chunk not followed by CRLF");
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn remaining(deadline: Instant, addr: &str) -> Result<Duration, HttpError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HttpError::Timeout {
            addr: addr.to_string(),
        });
    }
    Ok(left)
}

fn io_err(addr: &str, e: std::io::Error) -> HttpError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => HttpError::Timeout {
            addr: addr.to_string(),
        },
        _ => HttpError::Io {
            addr: addr.to_string(),
            source: e,
        },
    }
}

/// `POST`s `body` as JSON to `path` on `addr` (`host:port`) and returns the
/// response, or fails by `deadline`.
pub fn post(addr: &str, path: &str, body: &[u8], deadline: Instant) -> Result<Response, HttpError> {
    let sockaddrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|_| HttpError::Resolve(addr.to_string()))?
        .collect();
    let mut last = HttpError::Resolve(addr.to_string());
    let mut stream = None;
    for sa in sockaddrs {
        let left = remaining(deadline, addr)?;
        match TcpStream::connect_timeout(&sa, left) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                last = HttpError::Timeout {
                    addr: addr.to_string(),
                }
            }
            Err(e) => {
                last = HttpError::Connect {
                    addr: addr.to_string(),
                    source: e,
                }
            }
        }
    }
    let Some(mut stream) = stream else {
        return Err(last);
    };
    let _ = stream.set_nodelay(true);
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    stream
        .set_write_timeout(Some(remaining(deadline, addr)?))
        .map_err(|e| io_err(addr, e))?;
    stream.write_all(&req).map_err(|e| io_err(addr, e))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        stream
            .set_read_timeout(Some(remaining(deadline, addr)?))
            .map_err(|e| io_err(addr, e))?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(addr, e)),
        };
        buf.extend_from_slice(&chunk[..n]);
        match parse_response(&buf, n == 0) {
            Parse::Done(r) => return Ok(r),
            Parse::Malformed(reason) => {
                return Err(HttpError::Malformed {
                    addr: addr.to_string(),
                    reason,
                });
            }
            Parse::Partial if buf.len() > MAX_RESPONSE + 64 * 1024 => {
                return Err(HttpError::Malformed {
                    addr: addr.to_string(),
                    reason: "response too large",
                });
            }
            Parse::Partial => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(status: u16, body: &[u8]) -> Parse {
        Parse::Done(Response {
            status,
            body: body.to_vec(),
        })
    }

    #[test]
    fn content_length() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(parse_response(r, false), done(200, b"hello"));
        assert_eq!(parse_response(&r[..r.len() - 1], false), Parse::Partial);
        assert!(matches!(
            parse_response(&r[..r.len() - 1], true),
            Parse::Malformed(_)
        ));
    }

    #[test]
    fn chunked_with_trailer_and_every_prefix() {
        let r = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n\
                  3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nGrpc-Trailer: x\r\n\r\n";
        assert_eq!(parse_response(r, false), done(404, b"abcde"));
        for cut in 0..r.len() {
            assert_eq!(
                parse_response(&r[..cut], false),
                Parse::Partial,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn close_delimited_and_malformed() {
        let r = b"HTTP/1.0 200 OK\r\n\r\nabc";
        assert_eq!(parse_response(r, false), Parse::Partial);
        assert_eq!(parse_response(r, true), done(200, b"abc"));
        assert!(matches!(
            parse_response(b"SSH-2.0\r\n\r\n", false),
            Parse::Malformed(_)
        ));
        assert!(matches!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                false
            ),
            Parse::Malformed(_)
        ));
    }

    #[test]
    fn authority_strips_scheme_and_path() {
        assert_eq!(authority("http://127.0.0.1:2379/"), "127.0.0.1:2379");
        assert_eq!(authority("10.0.0.1:2379"), "10.0.0.1:2379");
    }
}
