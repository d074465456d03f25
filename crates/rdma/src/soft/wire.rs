//! The soft provider's framing: what one queue pair's socket carries.
//!
//! Every frame is `len: u32 BE` (bytes after this field), `kind: u8`, body.
//! Requests (SEND, SEND with Invalidate, WRITE, READ) go one at a time per direction and each is
//! answered (ACK, READ_RESP or NAK), which is how the provider keeps the
//! in-order, reliable-connected semantics of an RC QP.

use std::io::{self, Read, Write};

/// Frames larger than this are a protocol error (guards allocations).
pub const MAX_FRAME: u32 = 64 << 20;

/// NAK codes (the IB syndromes the provider models).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nak {
    /// Receiver not ready: no receive posted.
    Rnr,
    /// Remote access error: bad rkey, rights or bounds.
    RemoteAccess,
    /// Invalid request: the posted receive was too small.
    InvalidRequest,
    /// Remote operational error.
    RemoteOp,
}

impl Nak {
    fn code(self) -> u8 {
        match self {
            Nak::Rnr => 1,
            Nak::RemoteAccess => 2,
            Nak::InvalidRequest => 3,
            Nak::RemoteOp => 4,
        }
    }
    fn from_code(c: u8) -> Nak {
        match c {
            1 => Nak::Rnr,
            2 => Nak::RemoteAccess,
            3 => Nak::InvalidRequest,
            _ => Nak::RemoteOp,
        }
    }
}

/// One frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    ConnReq(Vec<u8>),
    ConnRep(Vec<u8>),
    ConnRej(Vec<u8>),
    Send(Vec<u8>),
    /// SEND with Invalidate: the data and the responder's rkey it
    /// invalidates.
    SendInv {
        rkey: u32,
        data: Vec<u8>,
    },
    Write {
        addr: u64,
        rkey: u32,
        data: Vec<u8>,
    },
    ReadReq {
        addr: u64,
        rkey: u32,
        len: u32,
    },
    Ack,
    ReadResp(Vec<u8>),
    Nak(Nak),
    Disconnect,
}

const K_CONN_REQ: u8 = 1;
const K_CONN_REP: u8 = 2;
const K_CONN_REJ: u8 = 3;
const K_SEND: u8 = 4;
const K_WRITE: u8 = 5;
const K_READ_REQ: u8 = 6;
const K_ACK: u8 = 7;
const K_READ_RESP: u8 = 8;
const K_NAK: u8 = 9;
const K_DISCONNECT: u8 = 10;
const K_SEND_INV: u8 = 11;

impl Frame {
    /// Encodes the frame, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4];
        match self {
            Frame::ConnReq(p) => {
                b.push(K_CONN_REQ);
                b.extend_from_slice(p);
            }
            Frame::ConnRep(p) => {
                b.push(K_CONN_REP);
                b.extend_from_slice(p);
            }
            Frame::ConnRej(p) => {
                b.push(K_CONN_REJ);
                b.extend_from_slice(p);
            }
            Frame::Send(p) => {
                b.push(K_SEND);
                b.extend_from_slice(p);
            }
            Frame::SendInv { rkey, data } => {
                b.push(K_SEND_INV);
                b.extend_from_slice(&rkey.to_be_bytes());
                b.extend_from_slice(data);
            }
            Frame::Write { addr, rkey, data } => {
                b.push(K_WRITE);
                b.extend_from_slice(&addr.to_be_bytes());
                b.extend_from_slice(&rkey.to_be_bytes());
                b.extend_from_slice(data);
            }
            Frame::ReadReq { addr, rkey, len } => {
                b.push(K_READ_REQ);
                b.extend_from_slice(&addr.to_be_bytes());
                b.extend_from_slice(&rkey.to_be_bytes());
                b.extend_from_slice(&len.to_be_bytes());
            }
            Frame::Ack => b.push(K_ACK),
            Frame::ReadResp(p) => {
                b.push(K_READ_RESP);
                b.extend_from_slice(p);
            }
            Frame::Nak(n) => {
                b.push(K_NAK);
                b.push(n.code());
            }
            Frame::Disconnect => b.push(K_DISCONNECT),
        }
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        b
    }

    /// Decodes a frame body (everything after the length prefix).
    pub fn decode(body: &[u8]) -> io::Result<Frame> {
        let bad = |m: &'static str| io::Error::new(io::ErrorKind::InvalidData, m);
        let (&kind, rest) = body.split_first().ok_or_else(|| bad("empty frame"))?;
        let addr_key = |r: &[u8]| -> io::Result<(u64, u32)> {
            if r.len() < 12 {
                return Err(bad("short rdma header"));
            }
            let mut a = [0u8; 8];
            a.copy_from_slice(&r[..8]);
            let mut k = [0u8; 4];
            k.copy_from_slice(&r[8..12]);
            Ok((u64::from_be_bytes(a), u32::from_be_bytes(k)))
        };
        Ok(match kind {
            K_CONN_REQ => Frame::ConnReq(rest.to_vec()),
            K_CONN_REP => Frame::ConnRep(rest.to_vec()),
            K_CONN_REJ => Frame::ConnRej(rest.to_vec()),
            K_SEND => Frame::Send(rest.to_vec()),
            K_SEND_INV => {
                let k: [u8; 4] = rest
                    .get(..4)
                    .and_then(|k| k.try_into().ok())
                    .ok_or_else(|| bad("short send-with-invalidate header"))?;
                Frame::SendInv {
                    rkey: u32::from_be_bytes(k),
                    data: rest[4..].to_vec(),
                }
            }
            K_WRITE => {
                let (addr, rkey) = addr_key(rest)?;
                Frame::Write {
                    addr,
                    rkey,
                    data: rest[12..].to_vec(),
                }
            }
            K_READ_REQ => {
                let (addr, rkey) = addr_key(rest)?;
                if rest.len() != 16 {
                    return Err(bad("bad read request"));
                }
                let mut l = [0u8; 4];
                l.copy_from_slice(&rest[12..16]);
                Frame::ReadReq {
                    addr,
                    rkey,
                    len: u32::from_be_bytes(l),
                }
            }
            K_ACK => Frame::Ack,
            K_READ_RESP => Frame::ReadResp(rest.to_vec()),
            K_NAK => Frame::Nak(Nak::from_code(
                *rest.first().ok_or_else(|| bad("short nak"))?,
            )),
            K_DISCONNECT => Frame::Disconnect,
            _ => return Err(bad("unknown frame kind")),
        })
    }

    /// Reads one frame. `Ok(None)` on a clean end of stream.
    pub fn read_from(r: &mut impl Read) -> io::Result<Option<Frame>> {
        let mut len = [0u8; 4];
        match r.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes(len);
        if len == 0 || len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bad frame length",
            ));
        }
        let mut body = vec![0u8; len as usize];
        r.read_exact(&mut body)?;
        Frame::decode(&body).map(Some)
    }

    /// Writes one frame.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())?;
        w.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let frames = [
            Frame::ConnReq(b"hello".to_vec()),
            Frame::ConnRep(vec![]),
            Frame::ConnRej(vec![1, 2]),
            Frame::Send(vec![9; 100]),
            Frame::SendInv {
                rkey: 0x8000_0003,
                data: vec![4; 20],
            },
            Frame::SendInv {
                rkey: 1,
                data: vec![],
            },
            Frame::Write {
                addr: 0x1234_5678_9abc,
                rkey: 77,
                data: vec![5; 10],
            },
            Frame::ReadReq {
                addr: 42,
                rkey: 3,
                len: 4096,
            },
            Frame::Ack,
            Frame::ReadResp(vec![1; 3]),
            Frame::Nak(Nak::Rnr),
            Frame::Nak(Nak::RemoteAccess),
            Frame::Disconnect,
        ];
        let mut buf = Vec::new();
        for f in &frames {
            f.write_to(&mut buf).unwrap();
        }
        let mut r = &buf[..];
        for f in &frames {
            assert_eq!(Frame::read_from(&mut r).unwrap().as_ref(), Some(f));
        }
        assert_eq!(Frame::read_from(&mut r).unwrap(), None);
    }

    #[test]
    fn rejects_garbage() {
        assert!(Frame::decode(&[]).is_err());
        assert!(Frame::decode(&[99]).is_err());
        assert!(Frame::decode(&[K_WRITE, 1, 2]).is_err());
        assert!(Frame::decode(&[K_SEND_INV, 1, 2, 3]).is_err());
        let mut r: &[u8] = &[0, 0, 0, 0];
        assert!(Frame::read_from(&mut r).is_err());
        let mut r: &[u8] = &[0xff, 0xff, 0xff, 0xff];
        assert!(Frame::read_from(&mut r).is_err());
    }
}
