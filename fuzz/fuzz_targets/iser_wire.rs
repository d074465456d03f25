//! The iSER wire formats on arbitrary bytes: a received Send
//! (`header::split_send`, against a receive limit the first byte picks)
//! and RDMA CM private data (`cm::CmRequest`, `cm::CmReply`).
//!
//! Invariants: no panic; an accepted Send is at least a header and a BHS
//! long and no longer than the limit, its PDU is the bytes after the
//! header, and its header re-encodes to bytes that parse the same; an
//! accepted CM REQ round trips, and the target's reply never grants Send
//! with Invalidate to an initiator that refused it.
#![no_main]

use ferrite_iser::{cm, header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let limit = header::recv_size(usize::from(sel) * 4);
    match header::split_send(rest, limit) {
        Ok((h, pdu)) => {
            assert!(rest.len() >= header::HEADER_LEN + header::BHS_LEN);
            assert!(rest.len() <= limit);
            assert_eq!(pdu, &rest[header::HEADER_LEN..]);
            assert_eq!(header::Header::parse(&h.encode()), Ok(h));
        }
        Err(header::HeaderError::TooLong { len, limit: l }) => assert!(len > l),
        Err(_) => {}
    }
    if let Ok(req) = cm::CmRequest::parse(rest) {
        assert_eq!(cm::CmRequest::parse(&req.encode()), Ok(req));
        let rep = cm::CmReply::to(&req, sel & 1 != 0);
        assert!(req.send_invalidate || !rep.send_invalidate);
        assert_eq!(cm::CmReply::parse(&rep.encode()), Ok(rep));
    }
});
