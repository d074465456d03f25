//! For the core's unit tests: backends that do no I/O and report the
//! capabilities (and geometry) they are given, and a device over one.

use std::sync::Arc;

use crate::backend::{Backend, BackendError, BackendQueue, Caps, Geometry};
use crate::device::{Device, DeviceFlags, DeviceId, Identity};

/// 2048 blocks of 512 bytes, `caps` as given; opening a queue fails.
pub(crate) struct CapsOnly(pub Caps);

impl Backend for CapsOnly {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: 512,
            num_blocks: 2048,
            phys_exp: 0,
        }
    }
    fn caps(&self) -> Caps {
        self.0
    }
    fn open_queue(&self, _: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        Err(BackendError::Invalid("no I/O in this test".into()))
    }
}

/// `geometry` and `caps` as given; opening a queue fails.
pub(crate) struct Shaped(pub Geometry, pub Caps);

impl Backend for Shaped {
    fn geometry(&self) -> Geometry {
        self.0
    }
    fn caps(&self) -> Caps {
        self.1
    }
    fn open_queue(&self, _: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        Err(BackendError::Invalid("no I/O in this test".into()))
    }
}

/// Device `id` over [`CapsOnly`] with `caps` and `flags`.
pub(crate) fn device(id: u32, caps: Caps, flags: DeviceFlags) -> Device {
    Device::new(
        DeviceId(id),
        format!("d{id}"),
        Arc::new(CapsOnly(caps)),
        Identity {
            vendor: "FERRITE".into(),
            product: "disk".into(),
            revision: "0.1".into(),
            serial: format!("s{id}"),
            naa: u64::to_be_bytes(0x6001_4050_0000_0000 | u64::from(id)).to_vec(),
            eui64: Vec::new(),
            ..Identity::default()
        },
        flags,
    )
}
