//! Sessions of the project's own iSCSI initiator to a ferrited under test:
//! [`Login`] names the initiator, the target and whatever a test changes of
//! [`InitiatorConfig`], then connects over TCP and logs in.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ferrite_iscsi::initiator::{Initiator, InitiatorConfig, InitiatorError, connect};

/// A normal session's login: `InitiatorConfig::default()` with the
/// initiator and target names set, and the changes a test asks for.
#[derive(Clone, Debug)]
pub struct Login {
    cfg: InitiatorConfig,
    read_timeout: Option<Duration>,
}

impl Login {
    /// A login of `initiator` to `target`.
    pub fn new(initiator: impl Into<String>, target: impl Into<String>) -> Login {
        Login {
            cfg: InitiatorConfig {
                initiator_name: initiator.into(),
                target_name: Some(target.into()),
                ..InitiatorConfig::default()
            },
            read_timeout: None,
        }
    }

    /// A login to `target` under the initiator's default name.
    pub fn to(target: impl Into<String>) -> Login {
        Login {
            cfg: InitiatorConfig {
                target_name: Some(target.into()),
                ..InitiatorConfig::default()
            },
            read_timeout: None,
        }
    }

    /// A discovery session of `initiator` (no TargetName).
    pub fn discovery(initiator: impl Into<String>) -> Login {
        Login {
            cfg: InitiatorConfig {
                initiator_name: initiator.into(),
                target_name: None,
                ..InitiatorConfig::default()
            },
            read_timeout: None,
        }
    }

    /// The ISID (RFC 7143 §10.12.5), which tells sessions of one initiator
    /// apart.
    pub fn isid(mut self, isid: [u8; 6]) -> Login {
        self.cfg.isid = isid;
        self
    }

    /// Offers CRC32C header and data digests.
    pub fn digests(mut self) -> Login {
        self.cfg.header_digest = true;
        self.cfg.data_digest = true;
        self
    }

    /// One more key for the operational stage (or one replacing ours).
    pub fn key(mut self, key: &str, value: &str) -> Login {
        self.cfg.extra_keys.push((key.into(), value.into()));
        self
    }

    /// Any other change to the configuration.
    pub fn with(mut self, change: impl FnOnce(&mut InitiatorConfig)) -> Login {
        change(&mut self.cfg);
        self
    }

    /// Sets this read timeout on the socket once logged in (none: reads
    /// block).
    pub fn read_timeout(mut self, limit: Duration) -> Login {
        self.read_timeout = Some(limit);
        self
    }

    /// The initiator's configuration as it stands.
    pub fn config(&self) -> InitiatorConfig {
        self.cfg.clone()
    }

    /// Connects to `addr` and logs in; the login's error if it fails.
    pub fn try_connect(&self, addr: SocketAddr) -> Result<Initiator<TcpStream>, InitiatorError> {
        let i = connect(addr, self.cfg.clone())?;
        if let Some(limit) = self.read_timeout {
            i.t.set_read_timeout(Some(limit))?;
        }
        Ok(i)
    }

    /// Connects to `addr` and logs in; fails the test, naming both ends,
    /// if it cannot.
    pub fn connect(&self, addr: SocketAddr) -> Initiator<TcpStream> {
        self.try_connect(addr).unwrap_or_else(|e| {
            panic!(
                "login of {} to {:?} at {addr}: {e}",
                self.cfg.initiator_name, self.cfg.target_name
            )
        })
    }
}
