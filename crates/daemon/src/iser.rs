//! The iSER fabric composed into the daemon: the iSCSI targets' `iser:`
//! portals become `ferrite_iser::driver` portals, and the cores'
//! mailboxes are its [`Cores`]. The driver itself (RDMA CM listeners, the
//! CM exchange, connections and their pump) is `ferrite_iser::driver`;
//! logins go through the same `CorePortal` as iSCSI/TCP's, so iSER
//! sessions are in the iSCSI session list (their connections named
//! `iser:<peer>`).

use std::net::SocketAddr;

use ferrite_iser::driver::{Cores, DriverError};
use ferrite_mgmt::config::Config;
use ferrite_reactor::mailbox::MailboxTx;

pub use ferrite_iser::driver::{IserCore, IserMsg, IserPortal};

use crate::worker::Msg;

/// The iSER portal addresses of every iSCSI target, each once.
pub fn portal_addrs(cfg: &Config) -> Vec<SocketAddr> {
    let mut v: Vec<SocketAddr> = Vec::new();
    for a in cfg.targets.iscsi.iter().flat_map(|t| t.iser_portal_addrs()) {
        if !v.contains(&a) {
            v.push(a);
        }
    }
    v
}

/// Binds every configured iSER portal this machine can serve (start-up).
pub fn bind_portals(cfg: &Config) -> Result<Vec<IserPortal>, DriverError> {
    ferrite_iser::driver::bind_portals(&portal_addrs(cfg))
}

/// The cores' mailboxes as the iSER driver deals connections to them.
pub struct Peers<'a>(pub &'a [MailboxTx<Msg>]);

impl Cores for Peers<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }

    fn send(&self, core: usize, msg: IserMsg) -> bool {
        self.0
            .get(core)
            .is_some_and(|p| p.send(Msg::Iser(msg)).is_ok())
    }
}
