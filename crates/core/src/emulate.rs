//! The SPC-4/SBC-4 emulation: pure functions from a CDB and the device's
//! state to a plan ([`plan`]: what the command needs from the backend and the
//! transport) and to parameter data ([`data_in`]: INQUIRY, MODE SENSE, READ
//! CAPACITY, REPORT LUNS, REQUEST SENSE).
//!
//! Owns: which commands this target supports, their field checks, range
//! checks, write protection, residual rules. Does not own: ordering, unit
//! attentions or buffers (see [`crate::shard`]).

use ferrite_scsi::capacity::Capacity;
use ferrite_scsi::cdb::{
    BlockCdb, InquiryCdb, ModeSenseCdb, PreventAllowCdb, ReadCapacity10Cdb, ReportLunsCdb,
    RequestSenseCdb, ServiceActionIn16Cdb, StartStopCdb, check_cdb,
};
use ferrite_scsi::inquiry::{self, vpd};
use ferrite_scsi::mode::{self, ModeState};
use ferrite_scsi::opcode::{maintenance_in, service_action_in_16};
use ferrite_scsi::opcodes::{self, ReportOpcodesCdb, Supported};
use ferrite_scsi::{Opcode, Sense};

use crate::cmd::{DataDir, Residual};
use crate::device::{LunEntry, LunMap};

/// The largest data transfer of one READ or WRITE (reported in the Block
/// Limits VPD page as MAXIMUM TRANSFER LENGTH).
pub const MAX_TRANSFER_BYTES: u64 = 8 << 20;

/// The largest WRITE SAME, in logical blocks (MAXIMUM WRITE SAME LENGTH;
/// FFFFh as Linux LIO reports).
pub const MAX_WRITE_SAME_BLOCKS: u64 = 0xffff;

/// MAXIMUM UNMAP LBA COUNT (per descriptor and per command).
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 20;

/// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// What a command needs once the task set lets it run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Fails at once with this sense (and residual), before any ordering.
    Fail(Sense, Residual),
    /// GOOD without data or I/O.
    Good(Residual),
    /// Parameter data built by [`data_in`] at execution time.
    DataIn,
    /// Read `len` bytes at `offset` from the backend, send the first `xfer`.
    Read {
        offset: u64,
        len: u32,
        xfer: u32,
        residual: Residual,
    },
    /// Fetch `len` bytes of write data, write them at `offset`; `atomic`
    /// (WRITE ATOMIC (16)) holds the range like COMPARE AND WRITE.
    Write {
        offset: u64,
        len: u32,
        fua: bool,
        residual: Residual,
        atomic: bool,
    },
    /// Flush the backend's volatile cache.
    Flush(Residual),
    /// WRITE SAME: fetch one block (unless `ndob`), then write it over
    /// `[offset, offset+len)`, or unmap / zero the range when that is
    /// equivalent.
    WriteSame {
        offset: u64,
        len: u64,
        unmap: bool,
        ndob: bool,
        residual: Residual,
    },
    /// UNMAP: fetch the `param_len`-byte parameter list, then deallocate each
    /// range it names.
    Unmap { param_len: u32, residual: Residual },
    /// VERIFY with BYTCHK: fetch `data_len` bytes of Data-Out, read `len`
    /// bytes at `offset`, compare (a one-block Data-Out against every block).
    Compare {
        offset: u64,
        len: u32,
        data_len: u32,
        residual: Residual,
    },
    /// COMPARE AND WRITE and ORWRITE: fetch `data_len` bytes, hold
    /// `[offset, offset+len)` against every other writer on every core, read
    /// it, combine, write `len` bytes back.
    ReadModifyWrite {
        offset: u64,
        len: u32,
        data_len: u32,
        fua: bool,
        kind: Rmw,
        residual: Residual,
    },
    /// SPC-2 RESERVE (6)/(10) of the whole logical unit.
    Reserve,
    /// MODE SELECT (6)/(10): fetch the `param_len`-byte parameter list,
    /// then apply it.
    ModeSelect { param_len: u32, residual: Residual },
    /// PERSISTENT RESERVE OUT: fetch the `param_len`-byte parameter list,
    /// then run the service action.
    PrOut { param_len: u32, residual: Residual },
    /// SET TARGET PORT GROUPS: fetch the `param_len`-byte parameter list,
    /// then change the states of the device's device group.
    SetPortGroups { param_len: u32, residual: Residual },
    /// SPC-2 RELEASE (6)/(10).
    Release,
    /// EXTENDED COPY (LID1): fetch the `param_len`-byte parameter list,
    /// then copy inside the target ([`crate::xcopy`]).
    ExtendedCopy { param_len: u32, residual: Residual },
    /// RECEIVE COPY RESULTS: parameter data from the copies of this I_T
    /// nexus ([`crate::xcopy`]).
    CopyResults,
    /// SBC-4 §5.30 SANITIZE with the service action `sa` (see
    /// [`crate::sanitize`]): fetch the `param_len`-byte parameter list, then
    /// start the sanitize operation; answer at once with `immed`, else when
    /// it ends.
    Sanitize {
        sa: u8,
        immed: bool,
        ause: bool,
        param_len: u32,
        residual: Residual,
    },
    /// SBC-4 §5.13 PREVENT ALLOW MEDIUM REMOVAL on a removable device:
    /// set (`prevent`) or clear the issuing nexus's prevention.
    PreventAllow { prevent: bool, residual: Residual },
    /// SBC-4 §5.25 START STOP UNIT with LOEJ = 1 on a removable device:
    /// load (`load`, START = 1) or eject the medium unless a nexus
    /// prevents its removal.
    LoadEject { load: bool, residual: Residual },
}

/// How a [`Plan::ReadModifyWrite`] combines Data-Out with the medium.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rmw {
    /// SBC-4 §5.3 COMPARE AND WRITE: the first half of the Data-Out must
    /// equal the medium (else MISCOMPARE), the second half is written.
    CompareAndWrite,
    /// SBC-4 §5.10 ORWRITE (BMOP 000b): medium OR Data-Out is written.
    Or,
}

/// MAXIMUM ATOMIC TRANSFER LENGTH in blocks (VPD B0h): the largest
/// transfer. A WRITE ATOMIC (16) holds its range against every other writer
/// of this target for its whole write; whether the backend's single write
/// survives a power loss whole is the backend's (and its medium's) matter.
pub fn max_atomic_blocks(block_size: u32) -> u32 {
    (MAX_TRANSFER_BYTES / block_size.max(1) as u64).min(u16::MAX as u64) as u32
}

/// MAXIMUM COMPARE AND WRITE LENGTH in blocks (VPD B0h): what fits the
/// one-byte NUMBER OF LOGICAL BLOCKS and, twice over, the largest transfer.
pub fn max_compare_write_blocks(block_size: u32) -> u8 {
    let by_xfer = MAX_TRANSFER_BYTES / (2 * block_size.max(1) as u64);
    by_xfer.min(255) as u8
}

/// The first byte where `medium` differs from `data` (repeated if shorter,
/// for VERIFY with BYTCHK = 11b), as SBC-4 §5.34 reports it in the
/// INFORMATION field of a MISCOMPARE.
pub fn first_miscompare(data: &[u8], medium: &[u8]) -> Option<usize> {
    if data.is_empty() {
        return None;
    }
    medium
        .chunks(data.len())
        .enumerate()
        .find_map(|(i, chunk)| {
            chunk
                .iter()
                .zip(data)
                .position(|(a, b)| a != b)
                .map(|p| i * data.len() + p)
        })
}

/// The Data-In residual when the device server has `spdtl` bytes to send and
/// the transport expects `expected` (SAM-5 §5.4.3, RFC 7143 §11.4.5.2).
pub fn residual_in(spdtl: u64, expected: u32) -> (u32, Residual) {
    let exp = expected as u64;
    if spdtl < exp {
        (spdtl as u32, Residual::Underflow((exp - spdtl) as u32))
    } else if spdtl > exp {
        let over = u32::try_from(spdtl - exp).unwrap_or(u32::MAX);
        (expected, Residual::Overflow(over))
    } else {
        (expected, Residual::None)
    }
}

/// Residual for a command that transfers no data.
pub(crate) fn no_data(expected: u32) -> Residual {
    if expected > 0 {
        Residual::Underflow(expected)
    } else {
        Residual::None
    }
}

/// Byte of the TRANSFER LENGTH field, for field pointers.
fn xfer_len_byte(cdb_len: usize) -> u16 {
    match cdb_len {
        6 => 4,
        10 => 7,
        12 => 6,
        _ => 10,
    }
}

fn fail(s: Sense) -> Plan {
    Plan::Fail(s, Residual::None)
}

/// Decides what `cdb` needs. `entry` is `None` for a LUN that is not mapped;
/// the caller has already answered everything but INQUIRY, REPORT LUNS and
/// REQUEST SENSE for those.
pub fn plan(cdb: &[u8], entry: Option<&LunEntry>, expected_len: u32, dir: DataDir) -> Plan {
    let len = match check_cdb(cdb) {
        Ok(l) => l,
        Err(s) => return fail(s),
    };
    let op = Opcode(cdb[0]);
    match crate::ops::of(op.0).plan {
        Planner::Nexus(plan) => plan(cdb),
        Planner::Lu(plan) => {
            let Some(e) = entry else {
                return fail(Sense::LOGICAL_UNIT_NOT_SUPPORTED);
            };
            // SBC-4 §4.15, SPC-4 §5.x: with the medium ejected, TEST UNIT
            // READY and every command that reaches the medium get NOT READY,
            // MEDIUM NOT PRESENT (libiscsi's NoMedia.NoMediaSBC).
            let dev = &e.device;
            if dev.flags.removable && crate::ops::needs_medium(op.0) && !dev.shared.medium.present()
            {
                return fail(Sense::MEDIUM_NOT_PRESENT);
            }
            plan(&Req {
                op,
                cdb,
                len,
                e,
                expected_len,
                dir,
            })
        }
    }
}

/// A command as a planner of the op table ([`Planner::Lu`]) sees it: its
/// CDB, checked to be `len` bytes long, the logical unit it addresses, and
/// what the transport expects.
#[derive(Clone, Copy)]
pub(crate) struct Req<'a> {
    pub op: Opcode,
    pub cdb: &'a [u8],
    pub len: usize,
    pub e: &'a LunEntry,
    pub expected_len: u32,
    pub dir: DataDir,
}

/// How the op table plans a command: each row names its planner.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Planner {
    /// Served on any LUN, a logical unit behind it or not (INQUIRY,
    /// REPORT LUNS, REQUEST SENSE): the CDB alone decides.
    Nexus(fn(&[u8]) -> Plan),
    /// Needs a logical unit with its medium (where the row says so).
    Lu(fn(&Req<'_>) -> Plan),
}

/// TEST UNIT READY.
pub(crate) fn plan_test_unit_ready(r: &Req<'_>) -> Plan {
    let Req { expected_len, .. } = *r;
    Plan::Good(no_data(expected_len))
}

/// MODE SENSE (6) and (10).
pub(crate) fn plan_mode_sense(r: &Req<'_>) -> Plan {
    let Req { cdb, .. } = *r;
    match ModeSenseCdb::decode(cdb) {
        Ok(_) => Plan::DataIn,
        Err(s) => fail(s),
    }
}

/// READ CAPACITY (10).
pub(crate) fn plan_read_capacity_10(r: &Req<'_>) -> Plan {
    let Req { cdb, .. } = *r;
    match ReadCapacity10Cdb::decode(cdb) {
        Ok(_) => Plan::DataIn,
        Err(s) => fail(s),
    }
}

/// SERVICE ACTION IN (16): READ CAPACITY (16), GET LBA STATUS.
pub(crate) fn plan_service_action_in_16(r: &Req<'_>) -> Plan {
    let Req { cdb, e, .. } = *r;
    let geo = e.device.geometry();
    match ServiceActionIn16Cdb::decode(cdb) {
        Ok(c) if c.action == service_action_in_16::READ_CAPACITY_16 => Plan::DataIn,
        // SBC-4 §5.8: the STARTING LBA must be within the capacity.
        Ok(c) if c.action == service_action_in_16::GET_LBA_STATUS => {
            if c.lba >= geo.num_blocks {
                fail(Sense::LBA_OUT_OF_RANGE)
            } else {
                Plan::DataIn
            }
        }
        Ok(_) => fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4))),
        Err(s) => fail(s),
    }
}

/// MAINTENANCE IN: REPORT TARGET PORT GROUPS, REPORT SUPPORTED OPERATION
/// CODES, REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
pub(crate) fn plan_maintenance_in(r: &Req<'_>) -> Plan {
    let Req { cdb, len, .. } = *r;
    match cdb[1] & 0x1f {
        // SPC-4 §6.35; other MAINTENANCE IN service actions are reported as
        // unsupported operation codes, which initiators take as "skip".
        maintenance_in::REPORT_SUPPORTED_OPERATION_CODES => match ReportOpcodesCdb::decode(cdb) {
            Ok(_) => Plan::DataIn,
            Err(s) => fail(s),
        },
        // SPC-4 §6.27 REPORT TARGET PORT GROUPS: PARAMETER DATA FORMAT
        // 000b (length only) or 001b (extended header).
        maintenance_in::REPORT_TARGET_PORT_GROUPS => {
            if cdb[1] >> 5 > 1 {
                return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(7)));
            }
            Plan::DataIn
        }
        // SPC-4 §6.40 REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
        maintenance_in::REPORT_SUPPORTED_TMFS => {
            if len != 12 {
                return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(0, None));
            }
            Plan::DataIn
        }
        _ => fail(Sense::INVALID_COMMAND_OPERATION_CODE),
    }
}

/// MAINTENANCE OUT: SPC-4 §6.36 SET TARGET PORT GROUPS, on a device in an
/// ALUA device group (explicit ALUA); anywhere else it is not implemented.
pub(crate) fn plan_maintenance_out(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        e,
        expected_len,
        dir,
        ..
    } = *r;
    if cdb[1] & 0x1f != ferrite_scsi::opcode::maintenance_out::SET_TARGET_PORT_GROUPS {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)));
    }
    if !e.device.alua().is_some_and(|dg| dg.explicit()) {
        return fail(Sense::INVALID_COMMAND_OPERATION_CODE);
    }
    let param_len = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]);
    // Four bytes of header and four per target port group: anything longer
    // than every group of the device is refused before it is fetched.
    if param_len > MAX_SET_PORT_GROUPS_PARAMS {
        return fail(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    match data_out_residual(param_len as u64, data_out_len(expected_len, dir)) {
        Ok(residual) if param_len == 0 => Plan::Good(residual),
        Ok(residual) => Plan::SetPortGroups {
            param_len,
            residual,
        },
        Err(p) => p,
    }
}

/// The longest SET TARGET PORT GROUPS parameter list taken: a descriptor for
/// each of 1024 target port groups.
const MAX_SET_PORT_GROUPS_PARAMS: u32 = 4 + 4 * 1024;

/// START STOP UNIT.
pub(crate) fn plan_start_stop_unit(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        e,
        expected_len,
        ..
    } = *r;
    let dev = &e.device;
    match StartStopCdb::decode(cdb) {
        // SBC-4 §5.25: a POWER CONDITION other than 0h (START_VALID)
        // makes the device server ignore START and LOEJ; this device
        // has no power conditions to enter, so it is accepted as is
        // (libiscsi's StartStopUnit.PwrCnd). LOEJ = 1 loads (START = 1)
        // or ejects (START = 0) a removable medium; IMMED only says when
        // to answer, and both happen before the answer. Without LOEJ, or
        // on a medium that is not removable, there is nothing to move:
        // GOOD.
        Ok(c) if dev.flags.removable && c.loej && c.power_condition == 0 => Plan::LoadEject {
            load: c.start,
            residual: no_data(expected_len),
        },
        Ok(_) => Plan::Good(no_data(expected_len)),
        Err(s) => fail(s),
    }
}

/// PREVENT ALLOW MEDIUM REMOVAL.
pub(crate) fn plan_prevent_allow(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        e,
        expected_len,
        ..
    } = *r;
    let dev = &e.device;
    match PreventAllowCdb::decode(cdb) {
        // SBC-4 §5.13: PREVENT 00b allows removal, 01b prevents it for
        // this I_T nexus; 10b and 11b are obsolete and not supported.
        Ok(c) if dev.flags.removable => match c.prevent {
            0 | 1 => Plan::PreventAllow {
                prevent: c.prevent == 1,
                residual: no_data(expected_len),
            },
            _ => fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(4, Some(1))),
        },
        // A medium that is not removable: nothing to prevent.
        Ok(_) => Plan::Good(no_data(expected_len)),
        Err(s) => fail(s),
    }
}

/// READ (6), (10), (12), (16).
pub(crate) fn plan_read(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        len,
        e,
        expected_len,
        ..
    } = *r;
    let geo = e.device.geometry();
    let bs = geo.block_size as u64;

    let c = match BlockCdb::decode(cdb) {
        Ok(c) => c,
        Err(s) => return fail(s),
    };
    if let Err(s) = c.check_no_protect() {
        return fail(s);
    }
    if let Err(s) = c.check_range(geo.num_blocks) {
        return fail(s);
    }
    let spdtl = c.blocks as u64 * bs;
    if spdtl > MAX_TRANSFER_BYTES {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(xfer_len_byte(len), None));
    }
    // SAM-5 §5.4.3: transfer at most the expected length; read only the
    // blocks that cover it.
    let (xfer, residual) = residual_in(spdtl, expected_len);
    if xfer == 0 {
        return Plan::Good(residual);
    }
    let read = (xfer as u64).div_ceil(bs) * bs;
    Plan::Read {
        offset: c.lba * bs,
        len: read as u32,
        xfer,
        residual,
    }
}

/// WRITE (6), (10), (12), (16).
pub(crate) fn plan_write_blocks(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        len,
        e,
        expected_len,
        dir,
        ..
    } = *r;

    let c = match BlockCdb::decode(cdb) {
        Ok(c) => c,
        Err(s) => return fail(s),
    };
    plan_write(&c, len, e, expected_len, dir, c.fua())
}

/// WRITE AND VERIFY (10), (12), (16).
pub(crate) fn plan_write_and_verify(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        len,
        e,
        expected_len,
        dir,
        ..
    } = *r;

    let c = match BlockCdb::decode(cdb) {
        Ok(c) => c,
        Err(s) => return fail(s),
    };
    // SBC-4 §5.36: the data is verified on the medium after the write;
    // a write that is durable when it completes (FUA) is what reading
    // it back would prove. BYTCHK compares the Data-Out with what was
    // just written from it, which cannot differ.
    plan_write(&c, len, e, expected_len, dir, true)
}

/// VERIFY (10), (12), (16).
pub(crate) fn plan_verify(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        len,
        e,
        expected_len,
        dir,
        ..
    } = *r;
    let geo = e.device.geometry();
    let bs = geo.block_size as u64;

    let c = match BlockCdb::decode(cdb) {
        Ok(c) => c,
        Err(s) => return fail(s),
    };
    if let Err(s) = c.check_no_protect() {
        return fail(s);
    }
    if let Err(s) = c.check_range(geo.num_blocks) {
        return fail(s);
    }
    // SBC-4 §5.34: BYTCHK 00b verifies the medium only (nothing to do
    // here); 01b compares TRANSFER LENGTH blocks of Data-Out with the
    // medium; 11b compares one block of Data-Out with every block;
    // 10b is reserved.
    let spdtl = c.blocks as u64 * bs;
    let data_len = match c.bytchk() {
        0 => return Plan::Good(no_data(expected_len)),
        1 => spdtl,
        3 => bs,
        _ => return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(2))),
    };
    if spdtl > MAX_TRANSFER_BYTES {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(xfer_len_byte(len), None));
    }
    let residual = match data_out_residual(
        if c.blocks == 0 { 0 } else { data_len },
        data_out_len(expected_len, dir),
    ) {
        Ok(r) => r,
        Err(p) => return p,
    };
    if c.blocks == 0 {
        return Plan::Good(residual);
    }
    Plan::Compare {
        offset: c.lba * bs,
        len: spdtl as u32,
        data_len: data_len as u32,
        residual,
    }
}

/// PRE-FETCH (10) and (16).
pub(crate) fn plan_pre_fetch(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        e,
        expected_len,
        ..
    } = *r;
    let geo = e.device.geometry();

    let c = match BlockCdb::decode(cdb) {
        Ok(c) => c,
        Err(s) => return fail(s),
    };
    // SBC-4 §5.9: the range is checked; GOOD (not CONDITION MET)
    // says the blocks were not all placed in a cache, which is true:
    // this device server keeps none of its own.
    if let Err(s) = c.check_range(geo.num_blocks) {
        return fail(s);
    }
    Plan::Good(no_data(expected_len))
}

/// READ DEFECT DATA (10) and (12).
pub(crate) fn plan_read_defect_data(_: &Req<'_>) -> Plan {
    Plan::DataIn
}

/// RESERVE (6) and (10).
pub(crate) fn plan_reserve(r: &Req<'_>) -> Plan {
    let Req { op, cdb, .. } = *r;

    // SPC-2 §7.21: third-party and extent reservations (byte 1 bits
    // 4 and 0 of RESERVE (10), LONGID) are not supported.
    if op == Opcode::RESERVE_10 && cdb[1] & 0x13 != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, None));
    }
    Plan::Reserve
}

/// RELEASE (6) and (10).
pub(crate) fn plan_release(r: &Req<'_>) -> Plan {
    let Req { op, cdb, .. } = *r;

    if op == Opcode::RELEASE_10 && cdb[1] & 0x13 != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, None));
    }
    Plan::Release
}

/// ORWRITE (16).
pub(crate) fn plan_orwrite(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        len,
        e,
        expected_len,
        dir,
        ..
    } = *r;

    let c = match BlockCdb::decode(cdb) {
        Ok(c) => c,
        Err(s) => return fail(s),
    };
    // SBC-4 §5.10: BMOP (byte 14 bits 2..0) other than 000b is the
    // change-generation form, not supported.
    if cdb[14] & 0x07 != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(14, Some(0)));
    }
    match plan_write(&c, len, e, expected_len, dir, c.fua()) {
        Plan::Write {
            offset,
            len,
            fua,
            residual,
            ..
        } => Plan::ReadModifyWrite {
            offset,
            len,
            data_len: len,
            fua,
            kind: Rmw::Or,
            residual,
        },
        other => other,
    }
}

/// WRITE ATOMIC (16).
pub(crate) fn plan_write_atomic(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        len,
        e,
        expected_len,
        dir,
        ..
    } = *r;
    let geo = e.device.geometry();

    // SBC-4 §5.49: LBA in bytes 2..10, ATOMIC BOUNDARY 10..12 (no
    // boundaries: MAXIMUM ATOMIC BOUNDARY SIZE is zero), TRANSFER
    // LENGTH 12..14.
    let boundary = u16::from_be_bytes([cdb[10], cdb[11]]);
    if boundary != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(10, None));
    }
    let c = BlockCdb {
        lba: u64::from_be_bytes([
            cdb[2], cdb[3], cdb[4], cdb[5], cdb[6], cdb[7], cdb[8], cdb[9],
        ]),
        blocks: u16::from_be_bytes([cdb[12], cdb[13]]) as u32,
        flags: cdb[1],
        group: cdb[14],
    };
    if c.blocks as u64 > max_atomic_blocks(geo.block_size) as u64 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(12, None));
    }
    match plan_write(&c, len, e, expected_len, dir, c.fua()) {
        Plan::Write {
            offset,
            len,
            fua,
            residual,
            ..
        } => Plan::Write {
            offset,
            len,
            fua,
            residual,
            atomic: true,
        },
        other => other,
    }
}

/// MODE SELECT (6) and (10).
pub(crate) fn plan_mode_select(r: &Req<'_>) -> Plan {
    let Req {
        op,
        cdb,
        expected_len,
        dir,
        ..
    } = *r;

    // SPC-4 §6.9: PF must be one (SPC pages); SP: no page is
    // saveable.
    if cdb[1] & 0x01 != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(0)));
    }
    if cdb[1] & 0x10 == 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)));
    }
    let param_len = if op == Opcode::MODE_SELECT_6 {
        cdb[4] as u32
    } else {
        u16::from_be_bytes([cdb[7], cdb[8]]) as u32
    };
    match data_out_residual(param_len as u64, data_out_len(expected_len, dir)) {
        Ok(residual) if param_len == 0 => Plan::Good(residual),
        Ok(residual) => Plan::ModeSelect {
            param_len,
            residual,
        },
        Err(p) => p,
    }
}

/// PERSISTENT RESERVE IN.
pub(crate) fn plan_persistent_reserve_in(r: &Req<'_>) -> Plan {
    let Req { cdb, .. } = *r;
    // SPC-4 §6.16: service actions past READ FULL STATUS are invalid.

    if cdb[1] & 0x1f > crate::pr::in_sa::READ_FULL_STATUS {
        fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)))
    } else {
        Plan::DataIn
    }
}

/// PERSISTENT RESERVE OUT.
pub(crate) fn plan_persistent_reserve_out(r: &Req<'_>) -> Plan {
    let Req {
        op,
        cdb,
        expected_len,
        dir,
        ..
    } = *r;

    // SPC-4 §6.15.2: a service action this device server does not
    // implement is refused before its parameter list is fetched.
    if !crate::ops::lists(op.0, cdb[1] & 0x1f) {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)));
    }
    let param_len = u32::from_be_bytes([cdb[5], cdb[6], cdb[7], cdb[8]]);
    // A longer list than any this device server takes is refused
    // before a byte of it is fetched.
    if param_len > crate::pr::MAX_OUT_PARAMS {
        return fail(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    match data_out_residual(param_len as u64, data_out_len(expected_len, dir)) {
        Ok(residual) => Plan::PrOut {
            param_len,
            residual,
        },
        Err(p) => p,
    }
}

/// SYNCHRONIZE CACHE (10) and (16).
pub(crate) fn plan_synchronize_cache(r: &Req<'_>) -> Plan {
    let Req {
        cdb,
        e,
        expected_len,
        ..
    } = *r;
    let dev = &e.device;
    let geo = e.device.geometry();

    let c = match BlockCdb::decode(cdb) {
        Ok(c) => c,
        Err(s) => return fail(s),
    };
    // SBC-4 §5.26: the range is checked even though the whole cache is
    // flushed.
    if let Err(s) = c.check_range(geo.num_blocks) {
        return fail(s);
    }
    if dev.flags.nv_cache {
        Plan::Good(no_data(expected_len))
    } else {
        Plan::Flush(no_data(expected_len))
    }
}

/// WRITE SAME (10) and (16).
pub(crate) fn plan_write_same_cmd(r: &Req<'_>) -> Plan {
    plan_write_same(r.op, r.cdb, r.len, r.e, r.expected_len, r.dir)
}

/// UNMAP.
pub(crate) fn plan_unmap_cmd(r: &Req<'_>) -> Plan {
    plan_unmap(r.cdb, r.e, r.expected_len, r.dir)
}

/// COMPARE AND WRITE.
pub(crate) fn plan_compare_and_write_cmd(r: &Req<'_>) -> Plan {
    plan_compare_and_write(r.cdb, r.e, r.expected_len, r.dir)
}

/// SANITIZE ([`crate::sanitize::plan`]).
pub(crate) fn plan_sanitize(r: &Req<'_>) -> Plan {
    crate::sanitize::plan(r.cdb, r.e, r.expected_len, r.dir)
}

/// EXTENDED COPY ([`crate::xcopy`]).
pub(crate) fn plan_extended_copy(r: &Req<'_>) -> Plan {
    crate::xcopy::plan_extended_copy(r.cdb, r.expected_len, r.dir)
}

/// RECEIVE COPY RESULTS ([`crate::xcopy`]).
pub(crate) fn plan_receive_copy_results(r: &Req<'_>) -> Plan {
    crate::xcopy::plan_receive_copy_results(r.cdb)
}

/// An opcode the table does not list: not implemented.
pub(crate) fn plan_unlisted(_: &Req<'_>) -> Plan {
    fail(Sense::INVALID_COMMAND_OPERATION_CODE)
}

/// INQUIRY: served on any LUN.
pub(crate) fn plan_inquiry(cdb: &[u8]) -> Plan {
    match InquiryCdb::decode(cdb) {
        Ok(_) => Plan::DataIn,
        Err(s) => fail(s),
    }
}

/// REPORT LUNS: served on any LUN.
pub(crate) fn plan_report_luns(cdb: &[u8]) -> Plan {
    match ReportLunsCdb::decode(cdb) {
        Ok(_) => Plan::DataIn,
        Err(s) => fail(s),
    }
}

/// REQUEST SENSE: served on any LUN.
pub(crate) fn plan_request_sense(cdb: &[u8]) -> Plan {
    match RequestSenseCdb::decode(cdb) {
        Ok(_) => Plan::DataIn,
        Err(s) => fail(s),
    }
}

/// The planning WRITE and WRITE AND VERIFY share: checks, residuals, the
/// blocks to fetch and write.
fn plan_write(
    c: &BlockCdb,
    len: usize,
    e: &LunEntry,
    expected_len: u32,
    dir: DataDir,
    fua: bool,
) -> Plan {
    let dev = &e.device;
    let geo = dev.geometry();
    let bs = geo.block_size as u64;
    if let Err(s) = c.check_no_protect() {
        return fail(s);
    }
    if let Err(s) = c.check_range(geo.num_blocks) {
        return fail(s);
    }
    let spdtl = c.blocks as u64 * bs;
    if spdtl > MAX_TRANSFER_BYTES {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(xfer_len_byte(len), None));
    }
    // SBC-4 §4.11: writes to a write-protected medium fail with
    // DATA PROTECT, WRITE PROTECTED.
    if e.write_protected() {
        return fail(Sense::WRITE_PROTECTED);
    }
    // Write data can only arrive on a Data-Out transfer.
    let expected = match dir {
        DataDir::Write | DataDir::Bidi => expected_len,
        DataDir::None | DataDir::Read => 0,
    };
    if spdtl > expected as u64 {
        // FCP-4 §9.4.2 a), RFC 7143 §11.4.5.2 (what libiscsi 1.19's
        // iSCSIResiduals tests and open-iscsi expect): the initiator
        // sends less than the CDB asks for; process the command
        // normally for the whole blocks it does send, request nothing
        // beyond them, and report the overflow.
        let over = u32::try_from(spdtl - expected as u64).unwrap_or(u32::MAX);
        let whole = (expected as u64 / bs) * bs;
        if whole == 0 {
            return Plan::Good(Residual::Overflow(over));
        }
        return Plan::Write {
            offset: c.lba * bs,
            len: whole as u32,
            fua,
            residual: Residual::Overflow(over),
            atomic: false,
        };
    }
    let residual = no_data(expected - spdtl as u32);
    if spdtl == 0 {
        // SBC-4 §5.32: a TRANSFER LENGTH of zero writes nothing.
        return Plan::Good(residual);
    }
    Plan::Write {
        offset: c.lba * bs,
        len: spdtl as u32,
        fua,
        residual,
        atomic: false,
    }
}

/// SBC-4 §5.3 COMPARE AND WRITE.
fn plan_compare_and_write(cdb: &[u8], e: &LunEntry, expected_len: u32, dir: DataDir) -> Plan {
    let dev = &e.device;
    let geo = dev.geometry();
    let bs = geo.block_size as u64;
    let flags = cdb[1];
    let lba = u64::from_be_bytes([
        cdb[2], cdb[3], cdb[4], cdb[5], cdb[6], cdb[7], cdb[8], cdb[9],
    ]);
    let blocks = cdb[13] as u64;
    if flags >> 5 != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(7)));
    }
    // SBC-4 §5.3: more than MAXIMUM COMPARE AND WRITE LENGTH blocks is an
    // INVALID FIELD IN CDB.
    if blocks > max_compare_write_blocks(geo.block_size) as u64 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(13, None));
    }
    match lba.checked_add(blocks) {
        Some(end) if end <= geo.num_blocks => {}
        _ => return fail(Sense::LBA_OUT_OF_RANGE),
    }
    if e.write_protected() {
        return fail(Sense::WRITE_PROTECTED);
    }
    // The Data-Out is the verify instance and the write instance, exactly:
    // a transfer of another length cannot be split into the two (SBC-4
    // §5.3; what libiscsi's InvalidDataOutSize test and Linux LIO hold to).
    let need = 2 * blocks * bs;
    if need != data_out_len(expected_len, dir) as u64 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(13, None));
    }
    if blocks == 0 {
        return Plan::Good(Residual::None);
    }
    Plan::ReadModifyWrite {
        offset: lba * bs,
        len: (blocks * bs) as u32,
        data_len: need as u32,
        fua: flags & 0x08 != 0,
        kind: Rmw::CompareAndWrite,
        residual: Residual::None,
    }
}

/// The Data-Out expected length as the transport will deliver it.
pub(crate) fn data_out_len(expected_len: u32, dir: DataDir) -> u32 {
    match dir {
        DataDir::Write | DataDir::Bidi => expected_len,
        DataDir::None | DataDir::Read => 0,
    }
}

/// The Data-Out rule shared by commands that take a parameter list or data:
/// more wanted than the initiator sends is an overflow that fails the command
/// (FCP-4 §9.4.2 b)); less is an underflow residual.
pub(crate) fn data_out_residual(need: u64, expected: u32) -> Result<Residual, Plan> {
    if need > expected as u64 {
        let over = u32::try_from(need - expected as u64).unwrap_or(u32::MAX);
        return Err(Plan::Fail(
            Sense::INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT,
            Residual::Overflow(over),
        ));
    }
    Ok(no_data(expected - need as u32))
}

fn plan_write_same(
    op: Opcode,
    cdb: &[u8],
    len: usize,
    e: &LunEntry,
    expected_len: u32,
    dir: DataDir,
) -> Plan {
    let geo = e.device.geometry();
    let bs = geo.block_size as u64;
    let c = match BlockCdb::decode(cdb) {
        Ok(c) => c,
        Err(s) => return fail(s),
    };
    if let Err(s) = c.check_no_protect() {
        return fail(s);
    }
    // SBC-4 §5.48: ANCHOR needs ANC_SUP (not reported); LBDATA and PBDATA
    // are obsolete and not supported.
    if c.flags & 0x10 != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)));
    }
    if c.flags & 0x06 != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(2)));
    }
    let unmap = c.flags & 0x08 != 0;
    let ndob = op == Opcode::WRITE_SAME_16 && c.flags & 0x01 != 0;
    // SBC-4 §6.6.6: UNMAP is allowed only where LBPWS/LBPWS10 say so.
    if unmap && !lbpme(e) {
        // SBC-4 §4.11: on a write-protected medium the write protection is
        // what the initiator needs to hear (libiscsi's ReadOnly suite).
        if e.write_protected() {
            return fail(Sense::WRITE_PROTECTED);
        }
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(3)));
    }
    // SBC-4 §5.48 with WSNZ = 0: a NUMBER OF LOGICAL BLOCKS of zero means
    // through the last LBA.
    let blocks = if c.blocks == 0 {
        if c.lba > geo.num_blocks {
            return fail(Sense::LBA_OUT_OF_RANGE);
        }
        geo.num_blocks - c.lba
    } else {
        c.blocks as u64
    };
    match c.lba.checked_add(blocks) {
        Some(end) if end <= geo.num_blocks => {}
        _ => return fail(Sense::LBA_OUT_OF_RANGE),
    }
    if blocks > MAX_WRITE_SAME_BLOCKS {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(xfer_len_byte(len), None));
    }
    if e.write_protected() {
        return fail(Sense::WRITE_PROTECTED);
    }
    let need = if ndob { 0 } else { bs };
    let sent = data_out_len(expected_len, dir);
    let residual = match data_out_residual(need, sent) {
        Ok(r) => r,
        Err(p) => return p,
    };
    // SBC-4 §5.48: the Data-Out buffer is exactly one logical block; a longer
    // one is not a WRITE SAME this target can make sense of.
    if sent as u64 > need {
        return Plan::Fail(
            Sense::INVALID_FIELD_IN_CDB.cdb_field(xfer_len_byte(len), None),
            residual,
        );
    }
    if blocks == 0 {
        return Plan::Good(residual);
    }
    Plan::WriteSame {
        offset: c.lba * bs,
        len: blocks * bs,
        unmap,
        ndob,
        residual,
    }
}

fn plan_unmap(cdb: &[u8], e: &LunEntry, expected_len: u32, dir: DataDir) -> Plan {
    // SBC-4 §5.31: UNMAP exists only on devices reporting LBPU.
    if !lbpme(e) {
        return fail(Sense::INVALID_COMMAND_OPERATION_CODE);
    }
    if cdb[1] & 0x01 != 0 {
        return fail(Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(0)));
    }
    if e.write_protected() {
        return fail(Sense::WRITE_PROTECTED);
    }
    let param_len = u16::from_be_bytes([cdb[7], cdb[8]]) as u32;
    let residual = match data_out_residual(param_len as u64, data_out_len(expected_len, dir)) {
        Ok(r) => r,
        Err(p) => return p,
    };
    // SBC-4 §5.31.1: a zero length is not an error; 1..7 cannot hold the
    // header.
    if param_len == 0 {
        return Plan::Good(residual);
    }
    if param_len < 8 {
        return fail(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    Plan::Unmap {
        param_len,
        residual,
    }
}

/// Parses an UNMAP parameter list (SBC-4 §5.31.2) into byte ranges, after
/// checking every descriptor: nothing is unmapped if any is bad.
pub fn unmap_ranges(
    data: &[u8],
    num_blocks: u64,
    block_size: u32,
    out: &mut Vec<(u64, u64)>,
) -> Result<(), Sense> {
    out.clear();
    if data.len() < 8 {
        return Err(Sense::PARAMETER_LIST_LENGTH_ERROR);
    }
    let bddl = u16::from_be_bytes([data[2], data[3]]) as usize;
    // A trailing partial descriptor is ignored (SBC-4 §5.31.2).
    let n = bddl.min(data.len() - 8) / 16;
    if n as u32 > MAX_UNMAP_DESCRIPTORS {
        return Err(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(2, None));
    }
    let bs = block_size as u64;
    for i in 0..n {
        let d = &data[8 + i * 16..8 + (i + 1) * 16];
        let mut lba = [0u8; 8];
        lba.copy_from_slice(&d[..8]);
        let lba = u64::from_be_bytes(lba);
        let count = u32::from_be_bytes([d[8], d[9], d[10], d[11]]);
        if count > MAX_UNMAP_BLOCKS {
            return Err(
                Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field((8 + i * 16 + 8) as u16, None)
            );
        }
        match lba.checked_add(count as u64) {
            Some(end) if end <= num_blocks => {}
            _ => return Err(Sense::LBA_OUT_OF_RANGE),
        }
        if count > 0 {
            out.push((lba * bs, count as u64 * bs));
        }
    }
    Ok(())
}

/// What VPD 83h says of the port a command came through.
#[derive(Clone, Copy, Debug)]
pub struct PortIds<'a> {
    /// Relative target port identifier.
    pub rel_port: u16,
    /// Target name (the target device's SCSI name string).
    pub target: &'a str,
    /// Target port name (the port's SCSI name string); empty for none.
    pub target_port: &'a str,
    /// SCSI transport protocol identifier (`ferrite_scsi::inquiry::protocol`).
    pub protocol: Option<u8>,
}

/// What [`data_in`] needs besides the CDB.
#[derive(Clone, Copy, Debug)]
pub struct DataCtx<'a> {
    pub entry: Option<&'a LunEntry>,
    pub luns: &'a LunMap,
    /// The port the command came through.
    pub port: PortIds<'a>,
    /// For REQUEST SENSE: the pending condition to report (a unit attention
    /// the caller has dequeued).
    pub pending: Option<Sense>,
}

/// The VPD pages this target reports, ascending (SPC-4 §7.8.16).
const VPD_PAGES: [u8; 7] = [
    vpd::SUPPORTED_PAGES,
    vpd::UNIT_SERIAL_NUMBER,
    vpd::DEVICE_IDENTIFICATION,
    vpd::THIRD_PARTY_COPY,
    vpd::BLOCK_LIMITS,
    vpd::BLOCK_DEVICE_CHARACTERISTICS,
    vpd::LOGICAL_BLOCK_PROVISIONING,
];

/// Builds the parameter data of a [`Plan::DataIn`] command into `out`
/// (cleared first). Returns the allocation length to truncate it to.
pub fn data_in(cdb: &[u8], ctx: &DataCtx<'_>, out: &mut Vec<u8>) -> Result<u32, Sense> {
    out.clear();
    match Opcode(cdb[0]) {
        Opcode::INQUIRY => {
            let c = InquiryCdb::decode(cdb)?;
            inquiry_data(&c, ctx, out)?;
            Ok(c.alloc_len as u32)
        }
        Opcode::REPORT_LUNS => {
            let c = ReportLunsCdb::decode(cdb)?;
            ferrite_scsi::lun::report_luns(c.select, ctx.luns.luns.keys().copied(), out);
            Ok(c.alloc_len)
        }
        Opcode::REQUEST_SENSE => {
            let c = RequestSenseCdb::decode(cdb)?;
            // SPC-4 §6.39: report a pending unit attention (and clear it, done
            // by the caller); for an unmapped LUN, LOGICAL UNIT NOT SUPPORTED;
            // else NO SENSE. Status is GOOD in every case.
            let s = match (ctx.pending, ctx.entry) {
                (Some(s), _) => s,
                (None, None) => Sense::LOGICAL_UNIT_NOT_SUPPORTED,
                (None, Some(_)) => Sense::NO_SENSE,
            };
            out.extend_from_slice(&s.encode(c.desc));
            Ok(c.alloc_len as u32)
        }
        Opcode::MODE_SENSE_6 | Opcode::MODE_SENSE_10 => {
            let e = ctx.entry.ok_or(Sense::LOGICAL_UNIT_NOT_SUPPORTED)?;
            let c = ModeSenseCdb::decode(cdb)?;
            let g = e.device.geometry();
            let st = ModeState {
                num_blocks: g.num_blocks,
                block_size: g.block_size,
                write_protect: e.write_protected(),
                write_cache: e.device.write_cache_enabled(),
                d_sense: e.device.d_sense(),
                swp: e.device.swp(),
                // The backend makes a FUA write durable before it completes.
                dpofua: e.device.backend.caps().fua,
            };
            mode::mode_sense(&c, &st, out)?;
            Ok(c.alloc_len as u32)
        }
        Opcode::READ_CAPACITY_10 => {
            let e = ctx.entry.ok_or(Sense::LOGICAL_UNIT_NOT_SUPPORTED)?;
            out.extend_from_slice(&capacity(e).read_capacity_10());
            Ok(8)
        }
        Opcode::PERSISTENT_RESERVE_IN => {
            let e = ctx.entry.ok_or(Sense::LOGICAL_UNIT_NOT_SUPPORTED)?;
            let pr = e
                .device
                .shared
                .pr
                .lock()
                .map_err(|_| Sense::INTERNAL_TARGET_FAILURE)?;
            pr.data_in(cdb, out)
        }
        // SBC-4 §5.19/§5.20: no defects are known. The header echoes the
        // lists and format asked for, each list empty.
        Opcode::READ_DEFECT_DATA_10 => {
            let lists = cdb[2] & 0x1f;
            out.extend([0, lists, 0, 0]);
            Ok(u16::from_be_bytes([cdb[7], cdb[8]]) as u32)
        }
        Opcode::READ_DEFECT_DATA_12 => {
            let lists = cdb[1] & 0x1f;
            out.extend([0, lists, 0, 0, 0, 0, 0, 0]);
            Ok(u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]))
        }
        Opcode::SERVICE_ACTION_IN_16 => {
            let e = ctx.entry.ok_or(Sense::LOGICAL_UNIT_NOT_SUPPORTED)?;
            let c = ServiceActionIn16Cdb::decode(cdb)?;
            if c.action == service_action_in_16::GET_LBA_STATUS {
                lba_status(e, c.lba, c.alloc_len, out);
            } else {
                out.extend_from_slice(&capacity(e).read_capacity_16());
            }
            Ok(c.alloc_len)
        }
        Opcode::MAINTENANCE_IN if cdb[1] & 0x1f == maintenance_in::REPORT_TARGET_PORT_GROUPS => {
            let e = ctx.entry.ok_or(Sense::LOGICAL_UNIT_NOT_SUPPORTED)?;
            target_port_groups(e, &ctx.port, cdb[1] >> 5 == 1, out);
            Ok(u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]))
        }
        Opcode::MAINTENANCE_IN if cdb[1] & 0x1f == maintenance_in::REPORT_SUPPORTED_TMFS => {
            // ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT
            // RESET, QUERY TASK, TARGET RESET; QUERY ASYNCHRONOUS EVENT,
            // QUERY TASK SET, I_T NEXUS RESET. CLEAR ACA is not (NormACA = 0).
            let repd = cdb[2] & 0x80 != 0;
            out.extend([
                0x80 | 0x40 | 0x10 | 0x08 | 0x04 | 0x02,
                0x04 | 0x02 | 0x01,
                0,
            ]);
            if repd {
                // Extended parameter data: ADDITIONAL DATA LENGTH 0Ch; no
                // timeouts reported (TMFTMOV = 0).
                out.push(0x0c);
                out.extend([0u8; 12]);
            } else {
                out.push(0);
            }
            Ok(u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]))
        }
        Opcode::MAINTENANCE_IN => {
            let e = ctx.entry.ok_or(Sense::LOGICAL_UNIT_NOT_SUPPORTED)?;
            let c = ReportOpcodesCdb::decode(cdb)?;
            let thin = lbpme(e);
            let block_erase = crate::sanitize::block_erase_supported(e);
            let table: Vec<Supported> = crate::ops::OPS
                .iter()
                .filter(|r| thin || !r.has(crate::ops::THIN))
                .filter(|r| block_erase || !r.has(crate::ops::BLOCK_ERASE))
                .filter(|r| {
                    e.device.alua().is_some_and(|dg| dg.explicit())
                        || !r.has(crate::ops::ALUA_GROUP)
                })
                .map(crate::ops::Op::supported)
                .collect();
            opcodes::report_supported_opcodes(&c, &table, out)?;
            Ok(c.alloc_len)
        }
        _ => Err(Sense::INVALID_COMMAND_OPERATION_CODE),
    }
}

/// The target port group a device reports (its VPD 83h layout's
/// `port_group`), if any: the device then reports implicit ALUA (TPGS 01b)
/// with that one group active/optimized.
pub(crate) fn port_group(e: &LunEntry) -> Option<u16> {
    e.device.identity.layout.iter().find_map(|l| match l {
        crate::device::Vpd83::PortGroup(g) => Some(*g),
        _ => None,
    })
}

/// The IMPLICIT TRANSITION TIME reported: state changes are atomic here,
/// but a cluster takes over within seconds.
const IMPLICIT_TRANSITION_SECS: u8 = 10;

/// REPORT TARGET PORT GROUPS parameter data (SPC-4 §6.27.2). A device in no
/// device group reports its one group, active/optimized (the only state it
/// supports), holding the port the command came through.
fn target_port_groups(e: &LunEntry, port: &PortIds<'_>, extended: bool, out: &mut Vec<u8>) {
    // SPC-4 §6.27: a device in a device group reports every target port
    // group of it, with their states.
    if let Some(dg) = e.device.alua() {
        dg.report(extended, IMPLICIT_TRANSITION_SECS, out);
        return;
    }
    let group = port_group(e).unwrap_or(0);
    out.extend([0u8; 4]);
    if extended {
        // FORMAT TYPE 001b, IMPLICIT TRANSITION TIME 0.
        out.extend([0x10, 0, 0, 0]);
    }
    // PREF 0, ASYMMETRIC ACCESS STATE 0h (active/optimized); AO_SUP.
    out.extend([0x00, 0x01]);
    out.extend(group.to_be_bytes());
    out.extend([0, 0, 0, 1]);
    out.extend([0, 0]);
    out.extend(port.rel_port.to_be_bytes());
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_be_bytes());
}

/// Whether this device reports logical block provisioning management
/// (LBPME, LBPU, LBPWS, LBPWS10): a thin-provisioned device whose backend
/// can deallocate.
pub(crate) fn lbpme(e: &LunEntry) -> bool {
    e.device.flags.thin_provisioned && e.device.backend.caps().unmap
}

/// GET LBA STATUS parameter data (SBC-4 §5.8.2): LBA status descriptors from
/// `lba` on, as many as the allocation length holds (at least one), from the
/// backend's mapping; a backend that cannot tell reports everything mapped.
fn lba_status(e: &LunEntry, lba: u64, alloc_len: u32, out: &mut Vec<u8>) {
    let g = e.device.geometry();
    let bs = g.block_size.max(1) as u64;
    let end = g.num_blocks * bs;
    let max = (alloc_len.saturating_sub(8) / 16).clamp(1, 64);
    out.extend([0u8; 8]);
    let mut off = lba * bs;
    let mut n = 0;
    while n < max && off < end {
        let (mapped, len) = match e.device.backend.mapping(off, end - off) {
            Some((m, len)) if len > 0 => (m, len.min(end - off)),
            _ => (true, end - off),
        };
        // Whole blocks, at least one, at most what the 4-byte field holds.
        let blocks = (len / bs).clamp(1, u32::MAX as u64);
        out.extend((off / bs).to_be_bytes());
        out.extend((blocks as u32).to_be_bytes());
        // PROVISIONING STATUS: 0 mapped, 1 deallocated.
        out.push(if mapped { 0 } else { 1 });
        out.extend([0u8; 3]);
        off += blocks * bs;
        n += 1;
    }
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_be_bytes());
}

fn capacity(e: &LunEntry) -> Capacity {
    let g = e.device.geometry();
    Capacity {
        num_blocks: g.num_blocks,
        block_size: g.block_size,
        phys_exp: g.phys_exp,
        lbpme: lbpme(e),
        lbprz: lbpme(e) && e.device.backend.caps().unmap_zeroes,
    }
}

/// The VPD 83h designators of `e` seen through `port`, in the device's
/// layout; a designator whose value is not set is left out.
fn designators<'a>(e: &'a LunEntry, port: &PortIds<'a>) -> Vec<inquiry::Designator<'a>> {
    use crate::device::Vpd83;
    use inquiry::Designator as D;
    let id = &e.device.identity;
    let layout: &[Vpd83] = if id.layout.is_empty() {
        &Vpd83::DEFAULT
    } else {
        &id.layout
    };
    // SPC-4 §7.8.6.1: with ALUA the page names the target port group of the
    // port the command came through; a layout that names none gets it after
    // the relative target port.
    let alua_group = e
        .device
        .alua()
        .and_then(|dg| dg.group_of_port(port.rel_port))
        .map(|g| g.id);
    let mut extended;
    let layout = match alua_group {
        Some(_) if !layout.iter().any(|l| matches!(l, Vpd83::PortGroup(_))) => {
            extended = layout.to_vec();
            let at = extended
                .iter()
                .position(|l| *l == Vpd83::RelPort)
                .map_or(extended.len(), |i| i + 1);
            extended.insert(at, Vpd83::PortGroup(0));
            &extended[..]
        }
        _ => layout,
    };
    let t10 = if !id.t10_id.is_empty() {
        &id.t10_id
    } else if !id.serial.is_empty() {
        &id.serial
    } else {
        &e.device.name
    };
    layout
        .iter()
        .filter_map(|l| match *l {
            // SPC-4 §7.8.6.6.1: 8 bytes are NAA 2, 3 or 5, 16 bytes NAA 6;
            // anything else configured is not reported as NAA.
            Vpd83::Naa => match (id.naa.len(), id.naa.first().map(|b| b >> 4)) {
                (8, Some(2 | 3 | 5)) | (16, Some(6)) => Some(D::Naa(&id.naa)),
                _ => None,
            },
            Vpd83::T10 => Some(D::T10 {
                vendor: &id.vendor,
                id: t10,
            }),
            Vpd83::T10Nul => Some(D::T10Nul {
                vendor: &id.vendor,
                id: t10,
            }),
            Vpd83::NoPiv => None,
            Vpd83::Eui64 => matches!(id.eui64.len(), 8 | 12 | 16).then(|| D::Eui64(&id.eui64)),
            Vpd83::LuName => (!id.lu_name.is_empty()).then(|| D::LuName(&id.lu_name)),
            Vpd83::RelPort => (port.rel_port != 0).then_some(D::RelPort(port.rel_port)),
            Vpd83::PortGroup(g) => Some(D::PortGroup(alua_group.unwrap_or(g))),
            Vpd83::LuGroup(g) => Some(D::LuGroup(g)),
            Vpd83::PortName => {
                (!port.target_port.is_empty()).then_some(D::PortName(port.target_port))
            }
            Vpd83::TargetName => (!port.target.is_empty()).then_some(D::TargetName(port.target)),
        })
        .collect()
}

fn inquiry_data(c: &InquiryCdb, ctx: &DataCtx<'_>, out: &mut Vec<u8>) -> Result<(), Sense> {
    let Some(e) = ctx.entry else {
        if c.evpd {
            return Err(Sense::LOGICAL_UNIT_NOT_SUPPORTED);
        }
        // SPC-4 §6.6.2: peripheral qualifier 011b, device type 1Fh for a LUN
        // the target cannot support.
        inquiry::standard_inquiry(
            &inquiry::StandardInquiry {
                qualifier: inquiry::QUALIFIER_NOT_SUPPORTED,
                device_type: inquiry::TYPE_UNKNOWN,
                vendor: "",
                product: "",
                revision: "",
                vendor_specific: "",
                tpgs: 0,
                three_pc: false,
                rmb: false,
            },
            out,
        );
        return Ok(());
    };
    let id = &e.device.identity;
    let pq = inquiry::TYPE_DISK;
    if !c.evpd {
        inquiry::standard_inquiry(
            &inquiry::StandardInquiry {
                qualifier: 0,
                device_type: inquiry::TYPE_DISK,
                vendor: &id.vendor,
                product: &id.product,
                revision: &id.revision,
                vendor_specific: &id.vendor_specific,
                // SPC-4 §6.6.2: implicit and explicit ALUA for a device in
                // a device group (implicit only where a cluster decides the
                // states); implicit only when the device just names its
                // target port group (see `target_port_groups`).
                tpgs: if let Some(dg) = e.device.alua() {
                    if dg.explicit() { 3 } else { 1 }
                } else {
                    u8::from(port_group(e).is_some())
                },
                // SPC-4 §6.6.2: the copy manager of [`crate::xcopy`].
                three_pc: true,
                rmb: e.device.flags.removable,
            },
            out,
        );
        return Ok(());
    }
    let g = e.device.geometry();
    let bs = g.block_size.max(1) as u64;
    match c.page {
        vpd::SUPPORTED_PAGES => inquiry::supported_pages(pq, &VPD_PAGES, out),
        vpd::UNIT_SERIAL_NUMBER => inquiry::unit_serial(pq, &id.serial, out),
        vpd::DEVICE_IDENTIFICATION => {
            let ids = designators(e, &ctx.port);
            let no_piv = e
                .device
                .identity
                .layout
                .contains(&crate::device::Vpd83::NoPiv);
            let protocol = ctx.port.protocol.filter(|_| !no_piv);
            inquiry::device_identification(pq, protocol, &ids, out)
        }
        vpd::THIRD_PARTY_COPY => ferrite_scsi::xcopy::vpd_page(pq, out),
        vpd::BLOCK_LIMITS => {
            let max = (MAX_TRANSFER_BYTES / bs) as u32;
            let thin = lbpme(e);
            inquiry::block_limits(
                pq,
                &inquiry::BlockLimits {
                    opt_granularity: 1u16 << g.phys_exp.min(15),
                    max_transfer: max,
                    opt_transfer: max,
                    // SBC-4 §6.6.4: zero when UNMAP is not supported.
                    max_unmap_lbas: if thin { MAX_UNMAP_BLOCKS } else { 0 },
                    max_unmap_descriptors: if thin { MAX_UNMAP_DESCRIPTORS } else { 0 },
                    unmap_granularity: if thin { 1 << g.phys_exp.min(15) } else { 0 },
                    max_write_same: MAX_WRITE_SAME_BLOCKS,
                    max_compare_write: max_compare_write_blocks(g.block_size),
                    max_atomic: max_atomic_blocks(g.block_size),
                },
                out,
            )
        }
        vpd::BLOCK_DEVICE_CHARACTERISTICS => {
            // WABEREQ 01b where BLOCK ERASE is offered: reads after it
            // complete (returning what LBPRZ says).
            inquiry::block_device_characteristics(
                pq,
                e.device.flags.rotational,
                u8::from(crate::sanitize::block_erase_supported(e)),
                out,
            )
        }
        vpd::LOGICAL_BLOCK_PROVISIONING => inquiry::logical_block_provisioning(
            pq,
            &inquiry::Provisioning {
                lbpu: lbpme(e),
                lbpws: lbpme(e),
                lbpws10: lbpme(e),
                lbprz: lbpme(e) && e.device.backend.caps().unmap_zeroes,
                thin: e.device.flags.thin_provisioned,
            },
            out,
        ),
        // SPC-4 §6.6.1: an unsupported VPD page is an INVALID FIELD IN CDB.
        _ => return Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(2, None)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_rules() {
        assert_eq!(residual_in(512, 10000), (512, Residual::Underflow(9488)));
        assert_eq!(residual_in(512, 200), (200, Residual::Overflow(312)));
        assert_eq!(residual_in(512, 0), (0, Residual::Overflow(512)));
        assert_eq!(residual_in(512, 512), (512, Residual::None));
    }

    #[test]
    fn unmap_parameter_list() {
        let mut v = Vec::new();
        let mut data = vec![0u8, 38, 0, 32, 0, 0, 0, 0];
        for (lba, n) in [(10u64, 2u32), (20, 0)] {
            data.extend(lba.to_be_bytes());
            data.extend(n.to_be_bytes());
            data.extend([0u8; 4]);
        }
        unmap_ranges(&data, 100, 512, &mut v).unwrap();
        assert_eq!(v, vec![(5120, 1024)]);
        // A trailing partial descriptor is ignored.
        data[3] = 40;
        data.extend([0u8; 8]);
        unmap_ranges(&data, 100, 512, &mut v).unwrap();
        assert_eq!(v.len(), 1);
        // One bad descriptor fails the whole list.
        data[8 + 16 + 7] = 99;
        data[8 + 16 + 11] = 2;
        assert_eq!(
            unmap_ranges(&data, 100, 512, &mut v),
            Err(Sense::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            unmap_ranges(&data[..4], 100, 512, &mut v),
            Err(Sense::PARAMETER_LIST_LENGTH_ERROR)
        );
    }

    #[test]
    fn miscompare_offsets() {
        assert_eq!(first_miscompare(&[1, 2, 3, 4], &[1, 2, 3, 4]), None);
        assert_eq!(first_miscompare(&[1, 2, 3, 4], &[1, 2, 9, 4]), Some(2));
        assert_eq!(first_miscompare(&[1, 2], &[1, 2, 1, 2, 1, 0]), Some(5));
        assert_eq!(first_miscompare(&[], &[1]), None);
    }

    /// A thin 1 MiB device that can deallocate: every command the table
    /// lists, UNMAP and BLOCK ERASE among them, is offered on it.
    fn thin_entry() -> LunEntry {
        use crate::backend::Caps;
        use crate::device::DeviceFlags;
        LunEntry {
            device: std::sync::Arc::new(crate::testing::device(
                1,
                Caps {
                    unmap: true,
                    ..Caps::default()
                },
                DeviceFlags {
                    thin_provisioned: true,
                    ..DeviceFlags::default()
                },
            )),
            read_only: false,
        }
    }

    /// VPD 83h of `identity` seen through `port`.
    fn vpd83(identity: crate::device::Identity, port: PortIds<'_>) -> Vec<u8> {
        use crate::backend::Caps;
        let flags = crate::device::DeviceFlags::default();
        let mut d = crate::testing::device(1, Caps::default(), flags);
        d.identity = identity;
        let e = LunEntry {
            device: std::sync::Arc::new(d),
            read_only: false,
        };
        let luns = LunMap::default();
        let ctx = DataCtx {
            entry: Some(&e),
            luns: &luns,
            port,
            pending: None,
        };
        let mut out = Vec::new();
        data_in(&[0x12, 0x01, 0x83, 0, 255, 0], &ctx, &mut out).unwrap();
        out
    }

    fn hex(s: &str) -> Vec<u8> {
        let d: String = s.split_whitespace().collect();
        (0..d.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&d[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn report_target_port_groups_and_tpgs() {
        use crate::backend::Caps;
        use crate::device::{Identity, Vpd83};
        let entry = |layout: Vec<Vpd83>| {
            let flags = crate::device::DeviceFlags::default();
            let mut d = crate::testing::device(1, Caps::default(), flags);
            d.identity = Identity {
                layout,
                ..d.identity.clone()
            };
            LunEntry {
                device: std::sync::Arc::new(d),
                read_only: false,
            }
        };
        let luns = LunMap::default();
        let port = PortIds {
            rel_port: 3,
            target: "iqn.t",
            target_port: "",
            protocol: None,
        };
        let run = |e: &LunEntry, cdb: &[u8]| {
            let ctx = DataCtx {
                entry: Some(e),
                luns: &luns,
                port,
                pending: None,
            };
            let mut out = Vec::new();
            data_in(cdb, &ctx, &mut out).map(|_| out)
        };
        let grouped = entry(vec![Vpd83::Naa, Vpd83::RelPort, Vpd83::PortGroup(7)]);
        let inq = run(&grouped, &[0x12, 0, 0, 0, 96, 0]).unwrap();
        assert_eq!(inq[5] & 0x30, 0x10, "implicit ALUA");
        let plain = entry(Vec::new());
        assert_eq!(run(&plain, &[0x12, 0, 0, 0, 96, 0]).unwrap()[5] & 0x30, 0);
        // Length-only format: one group 7, active/optimized, port 3.
        let r = run(&grouped, &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]).unwrap();
        assert_eq!(r, [0, 0, 0, 12, 0, 0x01, 0, 7, 0, 0, 0, 1, 0, 0, 0, 3]);
        // Extended header.
        let r = run(&grouped, &[0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]).unwrap();
        assert_eq!(&r[..8], &[0, 0, 0, 16, 0x10, 0, 0, 0]);
        assert_eq!(&r[8..12], &[0, 0x01, 0, 7]);
        assert_eq!(r.len(), 20);
        // Another PARAMETER DATA FORMAT is refused in planning.
        assert!(planned(
            &[0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            &grouped
        ));
    }

    #[test]
    fn vpd83_layouts_of_scst_and_lio() {
        use crate::device::{Identity, Vpd83};
        // SCST vdisk `disk1` with its derived ids (scst_vdisk.c
        // vdisk_dev_id_vpd): T10, relative port 1, the compat EUI-64; no
        // protocol identifiers.
        let scst = Identity {
            vendor: "SCST_FIO".into(),
            serial: "b8fdbd32".into(),
            t10_id: "b8fdbd32-disk1".into(),
            eui64: b"b8fdbd32".to_vec(),
            layout: vec![
                Vpd83::T10,
                Vpd83::RelPort,
                Vpd83::Eui64,
                Vpd83::Naa,
                Vpd83::NoPiv,
            ],
            ..Identity::default()
        };
        let port = PortIds {
            rel_port: 1,
            target: "iqn.t",
            target_port: "iqn.t,t,0x0001",
            protocol: Some(ferrite_scsi::inquiry::protocol::ISCSI),
        };
        let mut want = hex("00 83 00 2e 02 01 00 16");
        want.extend(b"SCST_FIOb8fdbd32-disk1");
        want.extend(hex("01 14 00 04 00 00 00 01 01 02 00 08"));
        want.extend(b"b8fdbd32");
        assert_eq!(vpd83(scst, port), want);
        // LIO fileio (target_core_spc.c spc_emulate_evpd_83): NAA 6, T10
        // with its NUL, relative port, port group 0, LU group 0, port name,
        // target name, with iSCSI's protocol identifier.
        let lio = Identity {
            vendor: "LIO-ORG".into(),
            t10_id: "FILEIO:1b5c6b8e".into(),
            naa: hex("60014051b5c6b8e00000000000000000"),
            layout: vec![
                Vpd83::Naa,
                Vpd83::T10Nul,
                Vpd83::RelPort,
                Vpd83::PortGroup(0),
                Vpd83::LuGroup(0),
                Vpd83::PortName,
                Vpd83::TargetName,
            ],
            ..Identity::default()
        };
        let mut want = hex("00 83 00 68 01 03 00 10 60014051b5c6b8e00000000000000000 02 01 00 18");
        want.extend(b"LIO-ORG FILEIO:1b5c6b8e\0");
        want.extend(hex(
            "51 94 00 04 00 00 00 01 51 95 00 04 00 00 00 00 01 06 00 04 00 00 00 00",
        ));
        want.extend(hex("53 98 00 10"));
        want.extend(b"iqn.t,t,0x0001\0\0");
        want.extend(hex("53 a8 00 08"));
        want.extend(b"iqn.t\0\0\0");
        assert_eq!(vpd83(lio, port), want);
    }

    #[test]
    fn mode_sense_reports_dpofua_where_the_backend_honours_fua() {
        use crate::backend::Caps;
        use crate::device::DeviceFlags;
        for fua in [true, false] {
            let e = LunEntry {
                device: std::sync::Arc::new(crate::testing::device(
                    1,
                    Caps {
                        fua,
                        ..Caps::default()
                    },
                    DeviceFlags::default(),
                )),
                read_only: false,
            };
            let luns = LunMap::default();
            let ctx = DataCtx {
                entry: Some(&e),
                luns: &luns,
                port: PortIds {
                    rel_port: 1,
                    target: "t",
                    target_port: "t,t,0x1",
                    protocol: None,
                },
                pending: None,
            };
            // MODE SENSE (6), DBD, Caching page; MODE SENSE (10) likewise.
            let mut out = Vec::new();
            data_in(&[0x1a, 0x08, 0x08, 0, 255, 0], &ctx, &mut out).unwrap();
            assert_eq!(out[2] & 0x10 != 0, fua);
            let mut out = Vec::new();
            data_in(&[0x5a, 0x08, 0x08, 0, 0, 0, 0, 0, 255, 0], &ctx, &mut out).unwrap();
            assert_eq!(out[3] & 0x10 != 0, fua);
        }
    }

    /// Whether `plan` knows the command `cdb` starts: anything but INVALID
    /// COMMAND OPERATION CODE, or, for an opcode with service actions, an
    /// INVALID FIELD IN CDB at the SERVICE ACTION field.
    fn planned(cdb: &[u8], e: &LunEntry) -> bool {
        let sa_field = Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4));
        let has_sa = crate::ops::OPS
            .iter()
            .any(|r| r.opcode == cdb[0] && r.sa.is_some());
        !matches!(
            plan(cdb, Some(e), 0, DataDir::None),
            Plan::Fail(s, _) if s == Sense::INVALID_COMMAND_OPERATION_CODE || (has_sa && s == sa_field)
        )
    }

    /// [`thin_entry`] in an ALUA device group: every command is offered.
    fn alua_entry() -> LunEntry {
        use crate::alua::{AccessState, DeviceGroup, PortGroup};
        let e = thin_entry();
        let dg = DeviceGroup::new(
            "dg",
            vec![
                PortGroup::new("a", 1, vec![1], AccessState::ActiveOptimized, true),
                PortGroup::new("b", 2, vec![2], AccessState::Standby, false),
            ],
        );
        let d = e
            .device
            .reconfigured(e.device.identity.clone(), e.device.flags)
            .with_alua(Some(std::sync::Arc::new(dg)));
        LunEntry {
            device: std::sync::Arc::new(d),
            read_only: false,
        }
    }

    #[test]
    fn every_listed_command_is_planned_and_every_planned_one_listed() {
        let e = alua_entry();
        for op in 0..=255u8 {
            let Some(len) = Opcode(op).cdb_len() else {
                continue;
            };
            for sa in 0..32u8 {
                let mut cdb = vec![0u8; len];
                cdb[0] = op;
                cdb[1] = sa;
                let row = crate::ops::OPS
                    .iter()
                    .find(|r| r.opcode == op && r.sa.is_none_or(|x| x == sa));
                assert_eq!(
                    planned(&cdb, &e),
                    row.is_some(),
                    "opcode {op:#04x} service action {sa:#04x} ({}): planned and listed disagree",
                    row.map_or("not listed", |r| r.name)
                );
            }
        }
    }
}
