//! SRP login private data (channel.rs `login`, iu.rs `LoginReq`): arbitrary
//! bytes as the private data of a connection request, in either layout
//! (the 64-byte SRP_LOGIN_REQ IU or the 56-byte RDMA/CM form). The first
//! byte picks the target's limits.
//!
//! Invariants: no panic; a login is accepted or refused with an
//! SRP_LOGIN_REJ that round trips; an accepted login is one the bytes
//! parse to, re-encodes to a request that parses the same in its layout,
//! and is granted no larger IU and no more credit than the target allows.
#![no_main]

use ferrite_srp::channel::{self, ChannelConfig, Login};
use ferrite_srp::iu;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, private)) = data.split_first() else {
        return;
    };
    let mut cfg = ChannelConfig {
        immediate_data: sel & 1 != 0,
        ..ChannelConfig::default()
    };
    if sel & 2 != 0 {
        cfg.max_it_iu_len = 1024;
        cfg.credits = 4;
    }
    if sel & 4 != 0 {
        cfg.target_port_id = [0; 16];
    }
    match channel::login(cfg.clone(), private) {
        Login::Reject { rej, why } => {
            assert_eq!(iu::LoginRej::parse(&rej.encode()), Ok(rej), "{why:?}");
        }
        Login::Accept {
            channel,
            rsp,
            req,
            layout,
        } => {
            assert_eq!(
                iu::LoginReq::parse_layout(private),
                Ok((req.clone(), layout))
            );
            assert_eq!(
                iu::LoginReq::parse_layout(&req.encode_as(layout)),
                Ok((req.clone(), layout))
            );
            assert_eq!(iu::LoginRsp::parse(&rsp.encode()), Ok(rsp.clone()));
            assert_eq!(rsp.tag, req.tag);
            assert!(rsp.max_it_iu_len <= cfg.max_it_iu_len, "{rsp:?}");
            assert!(
                rsp.max_it_iu_len <= req.req_it_iu_len,
                "{rsp:?} for {req:?}"
            );
            assert!(rsp.req_lim_delta <= cfg.credits, "{rsp:?}");
            assert!(channel.credits_granted() <= cfg.credits);
        }
    }
});
