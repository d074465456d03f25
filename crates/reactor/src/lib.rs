//! ferrite-reactor: thread-per-core, run-to-completion reactors.
//!
//! Owns: the reactor loop (io_uring per core, pollers, poll-then-sleep),
//! mailboxes between cores, and per-core buffer pools (whose memory can
//! carry a device registration for its life, `buf::Attachment`). `unsafe`
//! lives here (and in `ferrite-rdma`) only, each block with a `SAFETY:`
//! comment.
//! Does not own: any protocol or SCSI knowledge.

pub mod blockring;
pub mod buf;
pub mod mailbox;
pub mod pipe;
pub mod ring;
pub mod sock;
