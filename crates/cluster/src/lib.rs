//! ferrite-cluster: the cluster state of an HA pair of `ferrited` nodes,
//! kept in etcd.
//!
//! Two nodes export the same devices from shared storage; each owns one
//! ALUA target port group. This crate owns what the pair must agree on and
//! how it is kept:
//!
//! - **liveness**: each node holds an etcd lease and, by the fencing rule,
//!   believes itself live only until `t_sent + ttl` of its last keepalive
//!   that succeeded, so it never believes it owns anything after etcd could
//!   have expired its lease ([`Node::is_live`], [`Event::Fenced`]);
//! - **device group ownership**: one owner key per device group, created
//!   with the owner's lease, first come first served ([`Event::Owner`]);
//! - **persistent reservation state**: one key per device, written before a
//!   PERSISTENT RESERVE OUT completes ([`Node::save`]) and reported to the
//!   other node when it changes ([`Event::Reservations`]);
//! - the etcd v3 client that does it ([`Etcd`]), over etcd's JSON gateway
//!   with a small HTTP/1.1 client on `std::net::TcpStream`: no async
//!   runtime, one background thread per [`Node`].
//!
//! It does not own what those states mean to SCSI: the daemon maps
//! ownership to ALUA access states (`ferrite-core`'s `alua`), encodes and
//! applies reservation state (`ferrite-core`'s `pr`), and decides what a
//! fenced node answers. It does not run or configure etcd. The layout of the
//! keys, the fencing rule and the failure cases are in `docs/cluster.md`.
#![forbid(unsafe_code)]

mod etcd;
mod fence;
mod http;
mod node;

pub use etcd::{Etcd, KeyValue, Lease, LeaseId, Revision};
pub use http::HttpError;
pub use node::{Event, Node, NodeConfig};

use std::time::Duration;

/// What can go wrong talking to etcd or running a [`Node`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint gave an answer within the call's timeout.
    #[error("etcd unavailable (no answer within {timeout:?})")]
    Unavailable {
        timeout: Duration,
        #[source]
        last: Box<Error>,
    },
    /// A transport failure with one endpoint.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// etcd answered with an error (`code` is the gRPC status code).
    #[error("etcd answered HTTP {status}, code {code}: {message}")]
    Etcd {
        status: u16,
        code: i64,
        message: String,
    },
    /// The lease expired or was revoked.
    #[error("etcd lease not found (expired or revoked)")]
    LeaseNotFound,
    /// An answer that is not what etcd's gateway sends.
    #[error("unexpected answer from etcd: {0}")]
    BadAnswer(String),
    #[error("JSON from etcd: {0}")]
    Json(#[source] serde_json::Error),
    /// Another node changed the device's reservation state since this node
    /// last read or wrote it; the new state arrives as
    /// [`Event::Reservations`].
    #[error("reservation state of {device} changed on another node")]
    Conflict { device: String },
    /// The state was written, but these live nodes did not say they applied
    /// it within a lease TTL; the command that changed it must fail.
    #[error("reservation state of {device} not applied by {nodes:?} in time")]
    NotApplied { device: String, nodes: Vec<String> },
    #[error("invalid cluster configuration: {0}")]
    Config(String),
}
