//! The iSER header (RFC 7145): 28 bytes in front of every message an iSER
//! connection sends with an RDMA Send.
//!
//! ```text
//! byte 0      opcode (high nibble) and flags (low nibble)
//! bytes 1-3   reserved
//! bytes 4-7   Write STag          } valid when W is set: the buffer of a
//! bytes 8-15  Write Base Offset   } SCSI write, which the target RDMA READs
//! bytes 16-19 Read STag           } valid when R is set: the buffer of a
//! bytes 20-27 Read Base Offset    } SCSI read, which the target RDMA WRITEs
//! ```
//!
//! The STags are named by the SCSI command they serve (RFC 7145 §9.2:
//! the Write STag with an iSCSI write, the Read STag with a read), as the
//! Linux iSER initiator and LIO's isert read them.
//!
//! Opcode 1 is an iSCSI control-type PDU, which follows the header: its BHS,
//! AHS and data segment, without digests. Opcodes 2 and 3 are the Hello and
//! HelloReply messages of iSER without a connection manager; over RDMA CM
//! they are never sent, and a target that receives one refuses it.
//! Multi-byte fields are big-endian.

/// Length of the iSER header.
pub const HEADER_LEN: usize = 28;
/// Length of an iSCSI Basic Header Segment.
pub const BHS_LEN: usize = 48;

/// Opcode of an iSCSI control-type PDU (high nibble of byte 0).
pub const OP_ISCSI_CTRL: u8 = 0x1;
/// Opcode of the iSER Hello message.
pub const OP_HELLO: u8 = 0x2;
/// Opcode of the iSER HelloReply message.
pub const OP_HELLO_REPLY: u8 = 0x3;
/// The Write STag and Write Base Offset are valid.
pub const FLAG_WSV: u8 = 0x08;
/// The Read STag and Read Base Offset are valid.
pub const FLAG_RSV: u8 = 0x04;

/// Why a received Send is not one an iSER target accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("Send of {0} bytes is shorter than the iSER header and a BHS ({min} bytes)", min = HEADER_LEN + BHS_LEN)]
    Short(usize),
    #[error("Send of {len} bytes exceeds the {limit} bytes the target advertised")]
    TooLong { len: usize, limit: usize },
    #[error("iSER opcode {0:#x} is not an iSCSI control-type PDU")]
    UnknownOpcode(u8),
    #[error("iSER Hello or HelloReply (opcode {0:#x}) on a connection set up through RDMA CM")]
    Hello(u8),
}

/// What the initiator's iSER header says about the data of one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Write STag and base offset: the write data, which the target RDMA
    /// READs (present with W).
    pub write: Option<Remote>,
    /// Read STag and base offset: where the target RDMA WRITEs the read
    /// data (present with R).
    pub read: Option<Remote>,
}

/// A buffer of the initiator: its STag (the remote key) and the base
/// offset the transfer starts at (a virtual address unless zero-based
/// addressing was agreed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    pub stag: u32,
    pub base: u64,
}

fn be32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

impl Header {
    /// Reads the header at the start of `b` (at least [`HEADER_LEN`]
    /// bytes). Reserved bits and bytes are ignored, as receivers must.
    pub fn parse(b: &[u8]) -> Result<Header, HeaderError> {
        let h = b.get(..HEADER_LEN).ok_or(HeaderError::Short(b.len()))?;
        let op = h[0] >> 4;
        match op {
            OP_ISCSI_CTRL => {}
            OP_HELLO | OP_HELLO_REPLY => return Err(HeaderError::Hello(op)),
            _ => return Err(HeaderError::UnknownOpcode(op)),
        }
        let remote = |valid: bool, at: usize| {
            valid.then(|| Remote {
                stag: be32(&h[at..]),
                base: be64(&h[at + 4..]),
            })
        };
        Ok(Header {
            write: remote(h[0] & FLAG_WSV != 0, 4),
            read: remote(h[0] & FLAG_RSV != 0, 16),
        })
    }

    /// The header's 28 bytes: opcode 1 with W and R as the fields present.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = OP_ISCSI_CTRL << 4;
        if let Some(w) = self.write {
            h[0] |= FLAG_WSV;
            h[4..8].copy_from_slice(&w.stag.to_be_bytes());
            h[8..16].copy_from_slice(&w.base.to_be_bytes());
        }
        if let Some(r) = self.read {
            h[0] |= FLAG_RSV;
            h[16..20].copy_from_slice(&r.stag.to_be_bytes());
            h[20..28].copy_from_slice(&r.base.to_be_bytes());
        }
        h
    }

    /// The header of a target's own PDUs (SCSI Response, NOP-In, Async
    /// Message, login and text responses): a control-type PDU, no STag.
    pub fn target() -> [u8; HEADER_LEN] {
        Header::default().encode()
    }
}

/// One received Send checked and split: the iSER header and the iSCSI PDU
/// after it (BHS first). `limit` is the receive size the target advertised
/// for this phase (the login size before full feature phase, then the
/// negotiated receive data segment length plus headers); a Send longer
/// than it is a protocol error even if the buffer held it.
pub fn split_send(b: &[u8], limit: usize) -> Result<(Header, &[u8]), HeaderError> {
    if b.len() < HEADER_LEN + BHS_LEN {
        return Err(HeaderError::Short(b.len()));
    }
    if b.len() > limit {
        return Err(HeaderError::TooLong {
            len: b.len(),
            limit,
        });
    }
    let h = Header::parse(b)?;
    Ok((h, &b[HEADER_LEN..]))
}

/// The receive buffer a target posts for `data_len` bytes of data segment:
/// iSER header, BHS, and the data (iSER carries no digests and the target
/// accepts no AHS beyond what fits in the data allowance).
pub fn recv_size(data_len: usize) -> usize {
    HEADER_LEN + BHS_LEN + data_len
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read command's header as the Linux initiator sends it: W with the
    /// STag and address of the read buffer.
    fn read_cmd() -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + BHS_LEN];
        b[0] = 0x10 | FLAG_WSV;
        b[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        b[8..16].copy_from_slice(&0xffff_8800_0010_0000u64.to_be_bytes());
        b[HEADER_LEN] = 0x01; // SCSI Command
        b
    }

    #[test]
    fn a_read_command_names_where_the_data_in_goes() {
        let b = read_cmd();
        let (h, pdu) = split_send(&b, recv_size(8192)).unwrap();
        assert_eq!(
            h.write,
            Some(Remote {
                stag: 0x1234_5678,
                base: 0xffff_8800_0010_0000
            })
        );
        assert_eq!(h.read, None);
        assert_eq!(pdu.len(), BHS_LEN);
        assert_eq!(pdu[0], 0x01);
        // The encoding is the same bytes.
        assert_eq!(&h.encode()[..], &b[..HEADER_LEN]);
    }

    #[test]
    fn both_directions_and_reserved_bits() {
        let h = Header {
            write: Some(Remote { stag: 1, base: 2 }),
            read: Some(Remote { stag: 3, base: 4 }),
        };
        let mut b = h.encode().to_vec();
        assert_eq!(b[0], 0x1c);
        // Reserved bits and bytes are ignored.
        b[0] |= 0x03;
        b[1] = 0xff;
        assert_eq!(Header::parse(&b), Ok(h));
        assert_eq!(Header::target()[0], 0x10);
        assert!(Header::target()[1..].iter().all(|&x| x == 0));
    }

    #[test]
    fn malformed_sends_are_refused_with_their_reason() {
        let b = read_cmd();
        assert_eq!(split_send(&b[..50], 8192), Err(HeaderError::Short(50)));
        assert_eq!(
            split_send(&b, HEADER_LEN + BHS_LEN - 1),
            Err(HeaderError::TooLong {
                len: HEADER_LEN + BHS_LEN,
                limit: HEADER_LEN + BHS_LEN - 1
            })
        );
        for (op, err) in [
            (0x0, HeaderError::UnknownOpcode(0)),
            (0x2, HeaderError::Hello(2)),
            (0x3, HeaderError::Hello(3)),
            (0xf, HeaderError::UnknownOpcode(0xf)),
        ] {
            let mut x = b.clone();
            x[0] = op << 4;
            assert_eq!(split_send(&x, 8192), Err(err));
        }
        assert_eq!(Header::parse(&[0x10; 27]), Err(HeaderError::Short(27)));
    }
}
