//! A logged-in channel fed a sequence of arbitrary IUs (split on a marker
//! byte), with every transmit completed: never panics, and the initiator's
//! credits never exceed the login grant.
#![no_main]

use ferrite_core::{Action, CmdId, DataDir, Response};
use ferrite_reactor::buf::SgList;
use ferrite_srp::channel::{self, ChannelConfig, Event, Login, Transmit};
use ferrite_srp::iu;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cfg = ChannelConfig::default();
    let req = iu::LoginReq {
        tag: 1,
        req_it_iu_len: 1024,
        req_buf_fmt: iu::BUF_FORMAT_DIRECT | iu::BUF_FORMAT_INDIRECT,
        // Immediate data granted, so SRP_CMDs carrying it are taken too.
        req_flags: iu::LOGIN_REQ_IMMED_REQUESTED,
        imm_data_offset: 68,
        initiator_port_id: [0; 16],
        target_port_id: cfg.target_port_id,
    };
    let Login::Accept { mut channel, .. } = channel::login(cfg.clone(), &req.encode()) else {
        return;
    };
    for chunk in data.split(|&b| b == 0xa5) {
        channel.handle_recv_owned(chunk.to_vec());
        channel.recv_reposted();
        while let Some(t) = channel.poll_transmit() {
            match t {
                Transmit::Send { op, .. } => channel.send_done(op, true),
                Transmit::RdmaRead { op, buf, .. } | Transmit::RdmaWrite { op, buf, .. } => {
                    channel.rdma_done(op, buf, true)
                }
                Transmit::Disconnect => {}
            }
        }
        while let Some(ev) = channel.poll_event() {
            if let Event::Submit(r) = ev {
                // Write data first (immediate data comes from the IU).
                if r.dir == DataDir::Write {
                    let len = r.expected_len.min(1 << 16);
                    channel.handle_action(Action::FetchData {
                        id: CmdId(1),
                        tag: r.tag,
                        buf: SgList::zeroed(len as usize),
                        offset: 0,
                        len,
                    });
                }
                channel.handle_action(Action::Respond {
                    id: CmdId(1),
                    tag: r.tag,
                    rsp: Response {
                        data: Some(SgList::zeroed(512)),
                        data_len: 512,
                        ..Response::good()
                    },
                });
            }
        }
        assert!(channel.credits_granted() <= cfg.credits);
    }
});
