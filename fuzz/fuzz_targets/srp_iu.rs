//! Every SRP IU parser on arbitrary bytes: no panic, and what parses
//! re-encodes to bytes that parse to the same value (round trip).
#![no_main]

use ferrite_srp::iu;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((r, layout)) = iu::LoginReq::parse_layout(data) {
        // Either layout parses to one request, which both layouts carry.
        assert_eq!(iu::LoginReq::parse(&r.encode()), Ok(r.clone()));
        assert_eq!(iu::LoginReq::parse(&r.encode_rdma_cm()), Ok(r.clone()));
        assert_eq!(
            iu::LoginReq::parse_layout(&r.encode_as(layout)),
            Ok((r, layout))
        );
    }
    if let Ok(r) = iu::LoginRsp::parse(data) {
        assert_eq!(iu::LoginRsp::parse(&r.encode()), Ok(r));
    }
    if let Ok(r) = iu::LoginRej::parse(data) {
        assert_eq!(iu::LoginRej::parse(&r.encode()), Ok(r));
    }
    if let Ok(r) = iu::TskMgmt::parse(data) {
        assert_eq!(iu::TskMgmt::parse(&r.encode()), Ok(r));
    }
    if let Ok(r) = iu::Rsp::parse(data) {
        let again = iu::Rsp::parse(&r.encode()).expect("re-encoded SRP_RSP parses");
        assert_eq!(
            (again.tag, again.status, again.sense, again.resp_data),
            (r.tag, r.status, r.sense, r.resp_data)
        );
    }
    if let Ok(r) = iu::AerReq::parse(data) {
        assert_eq!(iu::AerReq::parse(&r.encode()), Ok(r));
    }
    if let Ok(c) = iu::Cmd::parse(data) {
        // Descriptors describe no more than the IU can carry.
        assert!(c.cdb.len() >= 16);
        let _ = (c.data_out.total(), c.data_in.total());
    }
    // With SRP-2 immediate data at Linux's offset: the data lies inside
    // the IU, after the descriptors.
    if let Ok(c) = iu::Cmd::parse_imm(data, Some(68))
        && let iu::DataBuf::Immediate { offset, len } = c.data_out
    {
        assert!(offset as usize + len as usize <= data.len());
    }
    let _ = iu::CredReq::parse(data);
    let _ = iu::t_logout_reason(data);
});
