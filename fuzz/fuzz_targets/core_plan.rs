//! `ferrite_core::emulate::plan`, a pure function: arbitrary CDB bytes
//! against a device geometry and flags chosen by the first bytes, with an
//! arbitrary expected length and direction; then `data_in` for what is
//! answered from the emulation and `unmap_ranges` for the bytes after the
//! CDB as an UNMAP parameter list.
//!
//! Invariants: no panic; the result is a plan or a CHECK CONDITION whose
//! sense reports an error (field pointer inside the CDB); every block
//! operation lies inside the capacity, on block boundaries, within the
//! largest transfer, and never writes through a write-protected LUN; a
//! Data-In transfer is no longer than the initiator expects.
#![no_main]

use std::sync::Arc;

use ferrite_core::DataDir;
use ferrite_core::backend::{Backend, BackendError, BackendQueue, Caps, Geometry};
use ferrite_core::device::{Device, DeviceFlags, DeviceId, Identity, LunEntry, LunMap};
use ferrite_core::emulate::{self, DataCtx, MAX_TRANSFER_BYTES, Plan};
use ferrite_fuzz::check_sense;
use ferrite_scsi::Lun;
use libfuzzer_sys::fuzz_target;

/// A backend that is never read or written: plan only looks at its shape.
struct Shape {
    geometry: Geometry,
    caps: Caps,
}

impl Backend for Shape {
    fn geometry(&self) -> Geometry {
        self.geometry
    }
    fn caps(&self) -> Caps {
        self.caps
    }
    fn open_queue(&self, _depth: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
        Err(BackendError::Invalid("planning only".into()))
    }
}

const NUM_BLOCKS: [u64; 8] = [
    0,
    1,
    8,
    2048,
    1 << 31,
    (1 << 32) + 5,
    1 << 40,
    u64::MAX / 4096,
];

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<6>() else {
        return;
    };
    let [g, f, e0, e1, e2, e3] = *head;
    let block_size = if g & 1 != 0 { 4096 } else { 512 };
    let geometry = Geometry {
        block_size,
        num_blocks: NUM_BLOCKS[(g >> 1 & 7) as usize],
        phys_exp: g >> 4 & 3,
    };
    let caps = Caps {
        unmap: f & 1 != 0,
        write_zeroes: f & 2 != 0,
        fua: true,
        write_cache: f & 4 != 0,
        unmap_zeroes: f & 1 != 0,
        read_pipe: false,
    };
    let flags = DeviceFlags {
        read_only: f & 8 != 0,
        write_through: f & 4 == 0,
        thin_provisioned: f & 1 != 0,
        rotational: false,
        nv_cache: f & 0x10 != 0,
        removable: f & 0x20 != 0,
    };
    let device = Arc::new(Device::new(
        DeviceId(1),
        "fuzz0",
        Arc::new(Shape { geometry, caps }),
        Identity {
            vendor: "FERRITE".into(),
            product: "fuzz".into(),
            revision: "1".into(),
            serial: "fuzz0".into(),
            naa: u64::to_be_bytes(0x6001_4050_0000_0001).to_vec(),
            eui64: u64::to_be_bytes(0x0014_0500_0000_0001).to_vec(),
            ..Identity::default()
        },
        flags,
    ));
    let entry = LunEntry {
        device,
        read_only: f & 0x40 != 0,
    };
    let mut luns = LunMap::default();
    luns.luns.insert(Lun(0), entry.clone());
    let expected = u32::from_be_bytes([e0, e1, e2, e3]);
    let dir = match g >> 6 {
        0 => DataDir::None,
        1 => DataDir::Read,
        2 => DataDir::Write,
        _ => DataDir::Bidi,
    };
    let cut = rest.len().min(16);
    let (cdb, params) = rest.split_at(cut);
    if cdb.is_empty() {
        return;
    }
    let mapped = (f & 0x80 == 0).then_some(&entry);
    let cdb_len = ferrite_scsi::Opcode(cdb[0]).cdb_len().unwrap_or(cdb.len());
    let bs = u64::from(block_size);
    let cap = geometry.num_blocks * bs;
    let inside = |offset: u64, len: u64| {
        assert!(
            offset.is_multiple_of(bs) && len.is_multiple_of(bs),
            "{offset} {len} not in blocks"
        );
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= cap),
            "{offset}+{len} > {cap}"
        );
    };
    match emulate::plan(cdb, mapped, expected, dir) {
        Plan::Fail(s, _) => check_sense(&s, cdb_len.min(cdb.len())),
        Plan::Read {
            offset, len, xfer, ..
        } => {
            inside(offset, len.into());
            assert!(u64::from(len) <= MAX_TRANSFER_BYTES && xfer <= len && xfer <= expected);
        }
        Plan::Write { offset, len, .. } => {
            inside(offset, len.into());
            assert!(u64::from(len) <= MAX_TRANSFER_BYTES);
            assert!(!entry.write_protected(), "a write through a protected LUN");
        }
        Plan::WriteSame { offset, len, .. } => {
            inside(offset, len);
            assert!(!entry.write_protected(), "a write through a protected LUN");
        }
        Plan::Compare { offset, len, .. } => inside(offset, len.into()),
        Plan::ReadModifyWrite { offset, len, .. } => {
            inside(offset, len.into());
            assert!(!entry.write_protected(), "a write through a protected LUN");
        }
        Plan::DataIn => {
            let ctx = DataCtx {
                entry: mapped,
                luns: &luns,
                port: ferrite_core::emulate::PortIds {
                    rel_port: 1,
                    target: "iqn.2026-01.dev.ferrite:fuzz",
                    target_port: "iqn.2026-01.dev.ferrite:fuzz,t,0x0001",
                    protocol: Some(ferrite_scsi::inquiry::protocol::ISCSI),
                },
                pending: None,
            };
            let mut out = Vec::new();
            if let Err(s) = emulate::data_in(cdb, &ctx, &mut out) {
                check_sense(&s, cdb_len.min(cdb.len()));
            }
        }
        _ => {}
    }
    let mut ranges = Vec::new();
    match emulate::unmap_ranges(params, geometry.num_blocks, block_size, &mut ranges) {
        Ok(()) => {
            for (offset, len) in ranges {
                inside(offset, len);
            }
        }
        Err(s) => check_sense(&s, 0),
    }
});
