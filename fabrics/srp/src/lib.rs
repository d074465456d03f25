//! ferrite-srp: the SCSI RDMA Protocol target (T10 SRP r16a, the layouts of
//! Linux `include/scsi/srp.h`), what SCST's `ib_srpt` is.
//!
//! Owns: the SRP information units ([`iu`]: views and builders; the login
//! request in both layouts, the 64-byte IU and the 56 bytes Linux sends
//! over RDMA CM), the sans-IO channel state machine ([`channel`]: login
//! with every refusal's SRP_LOGIN_REJ reason, credits, SRP_CMD with direct,
//! indirect and fetched descriptor tables and SRP-2 immediate data,
//! SRP_TSK_MGMT, SRP_RSP with sense and residuals, SRP_CRED_REQ,
//! SRP_AER_REQ, logouts), a
//! provider-neutral driver that runs a channel on a queue pair ([`target`]),
//! the reactor driver that binds target ports, applies the login policy
//! (the shared access rule, LUN maps, multi-channel) and pumps every
//! channel of a core into its core sessions ([`driver`]), and an initiator
//! library over the same RDMA surface ([`initiator`]) used by the
//! end-to-end tests and tools.
//!
//! Does not own: SCSI semantics (the core answers every command; the channel
//! turns IUs into `CmdRequest`/`TmfRequest` and core `Action`s into RDMA
//! transfers and IUs), the RDMA providers (`ferrite-rdma`), the reactor loop,
//! the target tree (`/targets/srp/<port>/...` in `mgmt`), the messages
//! between cores or the configuration format (the daemon builds
//! [`driver::PortConfig`]s from it).
//!
//! # Driver-facing API (what [`driver`] does with a channel)
//!
//! One target port per HCA port: a listener (`ferrite_rdma::verbs::
//! VerbsListener`, or `soft::SoftListener` in tests) on the reactor that
//! owns the port. Per connection request:
//!
//! 1. `let login = channel::login(cfg, req.private_data())` — the private
//!    data is the SRP_LOGIN_REQ in either layout. [`channel::ChannelConfig`]
//!    carries the target port id, the request limit (`credits`), IU sizes,
//!    the receive reserve and whether immediate data may be granted.
//! 2. `Login::Reject { rej, why }`: `req.reject(&rej.encode())` and log
//!    `why` (a [`channel::LoginRefusal`], whose `reason()` is the wire
//!    code). The driver's own refusals (port disabled, no resources, too
//!    many channels) are `LoginRefusal`s too. Multi-channel policy
//!    (MULTI-CHANNEL ACTION: terminate the initiator port's other channels,
//!    or join them) is the driver's: it knows the other channels; it sets
//!    bits 1:0 of `rsp.rsp_flags` and keeps the others.
//! 3. `Login::Accept { channel, rsp, req, layout }`: create the QP for the
//!    request, build a [`target::RecvRing::for_config`] of
//!    `channel.config()` (the negotiated IU length) and `post_all` it,
//!    accept with `rsp.encode()` as private data, and wrap everything in
//!    [`target::TargetConn::new`]. Open the core session (the I_T nexus:
//!    `req.initiator_port_id`, this target port) on the same reactor.
//!
//! Then, from the reactor's poller, for each connection, until
//! [`target::TargetConn::finished`]:
//!
//! - `cq.poll_cq(&mut wcs)` and [`target::TargetConn::handle_completion`]
//!   for each completion of the connection's QP (the driver demultiplexes a
//!   shared CQ by `qp_num`); [`target::TargetConn::poll_conn_events`] after
//!   the CQ fd or the CM event fd woke the reactor.
//! - Drain [`target::TargetConn::poll_event`] into the core session:
//!   `Event::Submit(req)` -> `session.submit(now, req)`,
//!   `Event::TaskMgmt(t)` -> `session.task_mgmt(now, t)`,
//!   `Event::DataOut { id, result }` -> `session.data_out_done(id, result)`,
//!   `Event::ResponseSent(id)` -> `session.response_sent(id)`,
//!   `Event::Closed` -> end the session (the core aborts what it holds).
//! - Drain `session.poll_action()` into
//!   [`target::TargetConn::handle_action`] (every `Action` kind is handled:
//!   `FetchData` becomes RDMA READs into the given `SgList`, `Respond` an
//!   RDMA WRITE of the data and an SRP_RSP, `TmfDone` an SRP_RSP with
//!   response data, `Aen` an SRP_AER_REQ, `Close` an SRP_T_LOGOUT and a
//!   disconnect).
//! - [`target::TargetConn::pump`] to post what the channel produced; repeat
//!   the two drains until both are empty.
//!
//! The core must not send a response for a command it aborted on the same
//! nexus (SAM-5 §7.2); the channel forgets such commands when the TMF
//! completes. Nothing in this crate blocks, spawns or reads a clock except
//! the initiator, which is a blocking client by design.
#![forbid(unsafe_code)]

pub mod channel;
#[cfg(feature = "verbs")]
pub mod driver;
pub mod initiator;
pub mod iu;
pub mod target;
