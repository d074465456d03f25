//! The private data of an iSER connection's RDMA CM exchange.
//!
//! The initiator's connection request carries the iSER CM REQ: byte 0 holds
//! two flags, bytes 1-3 are reserved. Z (0x80) says the initiator does not
//! support zero-based virtual addressing, so the base offsets in its iSER
//! headers are virtual addresses; I (0x40) says it does not support Send
//! with Invalidate. The target's reply carries the iSER CM REP in the same
//! layout: Z (0x80) says the target does not use zero-based addressing, I
//! (0x40) that it will not send with invalidate. RDMA CM may deliver the
//! private data padded with zeroes (to 56 bytes over InfiniBand); only the
//! first 4 bytes mean anything.

/// Length of the iSER CM REQ and REP.
pub const CM_LEN: usize = 4;
/// REQ: zero-based virtual addressing not supported; REP: not used.
pub const FLAG_ZBVA: u8 = 0x80;
/// REQ: Send with Invalidate not supported; REP: not used.
pub const FLAG_NO_SEND_INV: u8 = 0x40;

/// Why a connection request is not an iSER one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    #[error(
        "connection request private data of {0} bytes is shorter than the {CM_LEN}-byte iSER CM REQ"
    )]
    Short(usize),
}

/// What the initiator's iSER CM REQ says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmRequest {
    /// The initiator accepts zero-based offsets in the target's view
    /// (Z clear).
    pub zero_based: bool,
    /// The initiator accepts Send with Invalidate of the STag it
    /// advertised for a command (I clear).
    pub send_invalidate: bool,
}

impl CmRequest {
    /// Reads the iSER CM REQ at the start of a connection request's private
    /// data; reserved bits and bytes and any padding are ignored.
    pub fn parse(private: &[u8]) -> Result<CmRequest, CmError> {
        let req = private.get(..CM_LEN).ok_or(CmError::Short(private.len()))?;
        let flags = req[0];
        Ok(CmRequest {
            zero_based: flags & FLAG_ZBVA == 0,
            send_invalidate: flags & FLAG_NO_SEND_INV == 0,
        })
    }

    /// The request's 4 bytes (the initiator side, for tests and tools).
    pub fn encode(&self) -> [u8; CM_LEN] {
        let mut b = [0u8; CM_LEN];
        if !self.zero_based {
            b[0] |= FLAG_ZBVA;
        }
        if !self.send_invalidate {
            b[0] |= FLAG_NO_SEND_INV;
        }
        b
    }
}

/// What the target answers in its iSER CM REP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmReply {
    /// The target addresses the initiator's buffers zero-based.
    pub zero_based: bool,
    /// The target completes commands with Send with Invalidate.
    pub send_invalidate: bool,
}

impl CmReply {
    /// The reply to `req` of a target that addresses buffers by the
    /// virtual addresses the headers give (never zero-based) and sends with
    /// invalidate where the initiator accepts it and `invalidate` allows.
    pub fn to(req: &CmRequest, invalidate: bool) -> CmReply {
        CmReply {
            zero_based: false,
            send_invalidate: invalidate && req.send_invalidate,
        }
    }

    /// The reply's 4 bytes (the REQ's layout).
    pub fn encode(&self) -> [u8; CM_LEN] {
        CmRequest {
            zero_based: self.zero_based,
            send_invalidate: self.send_invalidate,
        }
        .encode()
    }

    /// Reads a reply (the initiator side).
    pub fn parse(private: &[u8]) -> Result<CmReply, CmError> {
        let r = CmRequest::parse(private)?;
        Ok(CmReply {
            zero_based: r.zero_based,
            send_invalidate: r.send_invalidate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linux_initiators_request_padded_by_rdma_cm() {
        // Z set (it gives virtual addresses), I clear (it takes Send with
        // Invalidate), padded with zeroes as RDMA CM delivers it.
        let mut private = vec![0u8; 56];
        private[0] = FLAG_ZBVA;
        let req = CmRequest::parse(&private).unwrap();
        assert_eq!(
            req,
            CmRequest {
                zero_based: false,
                send_invalidate: true
            }
        );
        assert_eq!(&req.encode()[..], &private[..CM_LEN]);
        let rep = CmReply::to(&req, true);
        assert_eq!(rep.encode(), [FLAG_ZBVA, 0, 0, 0]);
        assert_eq!(CmReply::to(&req, false).encode(), [0xc0, 0, 0, 0]);
        assert_eq!(CmReply::parse(&rep.encode()), Ok(rep));
    }

    #[test]
    fn an_initiator_without_send_invalidate_never_gets_it() {
        let req = CmRequest::parse(&[0xc0, 0xff, 0xff, 0xff]).unwrap();
        assert!(!req.send_invalidate && !req.zero_based);
        assert!(!CmReply::to(&req, true).send_invalidate);
    }

    #[test]
    fn short_private_data_is_not_an_iser_request() {
        assert_eq!(CmRequest::parse(&[]), Err(CmError::Short(0)));
        assert_eq!(CmRequest::parse(&[0x80, 0, 0]), Err(CmError::Short(3)));
    }
}
