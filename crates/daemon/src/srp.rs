//! The SRP fabric composed into the daemon: configuration becomes
//! `ferrite_srp::driver` ports and targets, the cores' mailboxes are its
//! [`Cores`], and its nexuses are management's sessions. The driver itself
//! (listeners, login policy, channels and their pump) is `ferrite_srp::driver`.

use std::sync::Arc;

use ferrite_core::device::Target;
use ferrite_mgmt::config::{SrpProviderConfig, SrpTargetConfig};
use ferrite_mgmt::runtime::{Fabric, SessionInfo};
use ferrite_reactor::mailbox::MailboxTx;
use ferrite_srp::driver::{Cores, DriverError, PortConfig, PortListener, Provider};

pub use ferrite_srp::driver::{SrpCore, SrpMsg, SrpPort, SrpTarget};

use crate::worker::Msg;

/// What the driver needs of a port's configuration to bind it.
pub fn port_config(t: &SrpTargetConfig) -> PortConfig {
    PortConfig {
        name: t.name.clone(),
        port_id: t.port_id_bytes(),
        provider: match &t.provider {
            SrpProviderConfig::Soft { listen } => Provider::Soft {
                listen: listen.clone(),
            },
            SrpProviderConfig::Verbs {
                device,
                port,
                listen,
            } => Provider::Verbs {
                device: device.clone(),
                port: *port,
                listen: listen.clone(),
            },
        },
    }
}

/// Binds every configured port this machine can serve (start-up).
pub fn bind_ports(targets: &[SrpTargetConfig]) -> Result<Vec<SrpPort>, DriverError> {
    let ports: Vec<PortConfig> = targets.iter().map(port_config).collect();
    ferrite_srp::driver::bind_ports(&ports)
}

/// Binds one port while the daemon runs (management).
pub fn bind_port(t: &SrpTargetConfig) -> Result<Option<Arc<PortListener>>, DriverError> {
    ferrite_srp::driver::bind_port(&port_config(t))
}

/// The snapshot entry of a port configuration.
pub fn srp_target(t: &SrpTargetConfig, target: Arc<Target>) -> SrpTarget {
    SrpTarget::new(target, t.port_id_bytes(), t.credits)
}

/// The I_T nexuses of port `name`, one session each, with their channels
/// as connections.
pub fn sessions(name: &str, t: &SrpTarget) -> Vec<SessionInfo> {
    t.board
        .sessions()
        .into_iter()
        .map(|n| SessionInfo {
            fabric: Fabric::Srp,
            target: name.to_string(),
            initiator: n.initiator,
            group: n.group,
            lun_count: n.lun_count,
            connections: n.channels,
            active_commands: n.active_commands,
            ..SessionInfo::default()
        })
        .collect()
}

/// The cores' mailboxes as the SRP driver deals logins to them.
pub struct Peers<'a>(pub &'a [MailboxTx<Msg>]);

impl Cores for Peers<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }

    fn send(&self, core: usize, msg: SrpMsg) -> bool {
        self.0
            .get(core)
            .is_some_and(|p| p.send(Msg::Srp(msg)).is_ok())
    }
}
