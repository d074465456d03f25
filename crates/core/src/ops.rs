//! One row per command the device server implements (opcode and service
//! action): its name, its CDB usage data, how it stands against unit
//! attentions, reservations, a missing medium, a sanitize and persistent
//! reservations, and the planner `emulate::plan` runs for it. REPORT
//! SUPPORTED OPERATION CODES is this table; every gate of the core asks it
//! (SCST keeps the same facts in one op table). A command not listed is not
//! implemented: `emulate::plan` answers it with INVALID COMMAND OPERATION
//! CODE, and a test checks that each row's planner accepts its command and
//! no other planner takes one the table does not list.

use ferrite_scsi::opcode::{maintenance_in, service_action_in_16};
use ferrite_scsi::opcodes::Supported;

use crate::emulate::{self, Planner};
use crate::sanitize::sa as sanitize;

/// Served while a unit attention is pending (SAM-5 §5.14, SPC-4 §5.12),
/// and on a LUN that is not mapped.
pub(crate) const UA: u16 = 1 << 0;
/// Served on a logical unit another nexus holds reserved (SPC-2 §5.5.1
/// table 9, kept by SPC-4 §5.13 for RESERVE/RELEASE).
pub(crate) const RESERVED: u16 = 1 << 1;
/// Served without the medium (SBC-4 §4.15): it describes or controls the
/// logical unit, not its blocks. The rest get NOT READY, MEDIUM NOT PRESENT
/// while a removable medium is ejected (READ CAPACITY and GET LBA STATUS
/// describe the medium and need it, as libiscsi's NoMedia.NoMediaSBC
/// expects).
pub(crate) const NO_MEDIUM: u16 = 1 << 2;
/// Served while a sanitize runs (SBC-4 §4.11.1); the rest get NOT READY,
/// SANITIZE IN PROGRESS.
pub(crate) const SANITIZING: u16 = 1 << 3;
/// Reads or writes logical blocks: after a failed sanitize it gets MEDIUM
/// FORMAT CORRUPTED (SBC-4 §4.11.1).
pub(crate) const BLOCKS: u16 = 1 << 4;
/// Listed only on a device reporting logical block provisioning (LBPME).
pub(crate) const THIN: u16 = 1 << 5;
/// Listed only where the backend offers a block erase.
pub(crate) const BLOCK_ERASE: u16 = 1 << 6;
/// Served through a target port in the standby asymmetric access state
/// (SPC-4 §5.15.2.4.4); the rest get NOT READY, LOGICAL UNIT NOT
/// ACCESSIBLE, TARGET PORT IN STANDBY STATE.
pub(crate) const ALUA_STANDBY: u16 = 1 << 7;
/// Served through a target port in the unavailable state (§5.15.2.4.5).
pub(crate) const ALUA_UNAVAILABLE: u16 = 1 << 8;
/// Served through a target port that is offline or transitioning
/// (§5.15.2.4.6, §5.15.2.4.7): what tells an initiator which port to use.
pub(crate) const ALUA_OFFLINE: u16 = 1 << 9;
/// Listed only on a device in an ALUA device group (explicit ALUA).
pub(crate) const ALUA_GROUP: u16 = 1 << 10;
/// Served in every asymmetric access state.
const ALUA_ANY: u16 = ALUA_STANDBY | ALUA_UNAVAILABLE | ALUA_OFFLINE;

/// How a command stands against a persistent reservation (SPC-4 table 66).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pr {
    /// Allowed whatever the reservation (INQUIRY, PRIN, TUR, ...).
    Always,
    /// Reads the medium: conflicts under the exclusive access types.
    Read,
    /// Writes the medium or changes the LU: conflicts under every type.
    Write,
}

/// One command.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub opcode: u8,
    /// The service action, for opcodes that have them.
    pub sa: Option<u8>,
    /// The command's name in SPC-4 or SBC-4: for the reader of the table
    /// and for test messages.
    #[cfg_attr(not(test), allow(dead_code))]
    pub name: &'static str,
    /// What `emulate::plan` runs for it: the opcode's planner (the first
    /// row's where it has service actions; each decodes and checks its
    /// service action itself).
    pub plan: Planner,
    pub flags: u16,
    pub pr: Pr,
    /// CDB usage data (SPC-4 §6.35.3): the opcode, the service action in
    /// its place, then a bit map of the bits the device server evaluates;
    /// as long as the CDB.
    pub usage: &'static [u8],
}

impl Op {
    pub(crate) fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    pub(crate) fn supported(&self) -> Supported {
        Supported {
            opcode: self.opcode,
            sa: self.sa,
            usage: self.usage,
        }
    }
}

/// What a command the table does not list meets: every gate, and a write
/// against a persistent reservation; it is then refused as not implemented.
const UNLISTED: Op = Op {
    opcode: 0,
    sa: None,
    name: "(not implemented)",
    plan: Planner::Lu(emulate::plan_unlisted),
    flags: 0,
    pr: Pr::Write,
    usage: &[],
};

/// The row of opcode `op`: its first row where it has service actions
/// (the flags and PR class are the opcode's, the same for every service
/// action, which a test checks), [`UNLISTED`]'s facts where it has none.
pub(crate) fn of(op: u8) -> &'static Op {
    let i = OPS.partition_point(|r| r.opcode < op);
    match OPS.get(i) {
        Some(r) if r.opcode == op => r,
        _ => &UNLISTED,
    }
}

/// Whether the table lists service action `sa` of `op`.
pub(crate) fn lists(op: u8, sa: u8) -> bool {
    OPS.iter().any(|r| r.opcode == op && r.sa == Some(sa))
}

/// In which restricted asymmetric access states opcode `op` is served.
pub(crate) fn served_by_alua(op: u8) -> crate::alua::Served {
    let r = of(op);
    crate::alua::Served {
        standby: r.has(ALUA_STANDBY),
        unavailable: r.has(ALUA_UNAVAILABLE),
        offline: r.has(ALUA_OFFLINE),
    }
}

/// The gates' questions, by opcode.
pub(crate) fn passes_unit_attention(op: u8) -> bool {
    of(op).has(UA)
}

pub(crate) fn passes_reservation(op: u8) -> bool {
    of(op).has(RESERVED)
}

pub(crate) fn needs_medium(op: u8) -> bool {
    !of(op).has(NO_MEDIUM)
}

/// Planned without a logical unit ([`Planner::Nexus`]): served on a LUN
/// with none behind it.
pub(crate) fn serves_unmapped_lun(op: u8) -> bool {
    matches!(of(op).plan, Planner::Nexus(_))
}

/// Every command, ascending by opcode and service action.
pub(crate) const OPS: &[Op] = &[
    Op {
        opcode: 0x00,
        sa: None,
        name: "TEST UNIT READY",
        plan: Planner::Lu(emulate::plan_test_unit_ready),
        flags: 0,
        pr: Pr::Always,
        usage: &[0x00, 0, 0, 0, 0, 0x04],
    },
    Op {
        opcode: 0x03,
        sa: None,
        name: "REQUEST SENSE",
        plan: Planner::Nexus(emulate::plan_request_sense),
        flags: UA | RESERVED | NO_MEDIUM | SANITIZING | ALUA_ANY,
        pr: Pr::Always,
        usage: &[0x03, 0x01, 0, 0, 0xff, 0x04],
    },
    Op {
        opcode: 0x08,
        sa: None,
        name: "READ (6)",
        plan: Planner::Lu(emulate::plan_read),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[0x08, 0x1f, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x0a,
        sa: None,
        name: "WRITE (6)",
        plan: Planner::Lu(emulate::plan_write_blocks),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x12,
        sa: None,
        name: "INQUIRY",
        plan: Planner::Nexus(emulate::plan_inquiry),
        flags: UA | RESERVED | NO_MEDIUM | SANITIZING | ALUA_ANY,
        pr: Pr::Always,
        usage: &[0x12, 0x03, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x15,
        sa: None,
        name: "MODE SELECT (6)",
        plan: Planner::Lu(emulate::plan_mode_select),
        flags: NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Write,
        usage: &[0x15, 0x11, 0, 0, 0xff, 0x04],
    },
    Op {
        opcode: 0x16,
        sa: None,
        name: "RESERVE (6)",
        plan: Planner::Lu(emulate::plan_reserve),
        flags: NO_MEDIUM,
        pr: Pr::Write,
        usage: &[0x16, 0, 0, 0, 0, 0x04],
    },
    Op {
        opcode: 0x17,
        sa: None,
        name: "RELEASE (6)",
        plan: Planner::Lu(emulate::plan_release),
        flags: RESERVED | NO_MEDIUM,
        pr: Pr::Write,
        usage: &[0x17, 0, 0, 0, 0, 0x04],
    },
    Op {
        opcode: 0x1a,
        sa: None,
        name: "MODE SENSE (6)",
        plan: Planner::Lu(emulate::plan_mode_sense),
        flags: NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Read,
        usage: &[0x1a, 0x08, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x1b,
        sa: None,
        name: "START STOP UNIT",
        plan: Planner::Lu(emulate::plan_start_stop_unit),
        flags: NO_MEDIUM,
        pr: Pr::Write,
        usage: &[0x1b, 0x01, 0, 0, 0xf3, 0x04],
    },
    Op {
        opcode: 0x1e,
        sa: None,
        name: "PREVENT ALLOW MEDIUM REMOVAL",
        plan: Planner::Lu(emulate::plan_prevent_allow),
        flags: NO_MEDIUM,
        pr: Pr::Write,
        usage: &[0x1e, 0, 0, 0, 0x03, 0x04],
    },
    Op {
        opcode: 0x25,
        sa: None,
        name: "READ CAPACITY (10)",
        plan: Planner::Lu(emulate::plan_read_capacity_10),
        flags: 0,
        pr: Pr::Always,
        usage: &[0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0x04],
    },
    Op {
        opcode: 0x28,
        sa: None,
        name: "READ (10)",
        plan: Planner::Lu(emulate::plan_read),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[0x28, 0xfa, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x2a,
        sa: None,
        name: "WRITE (10)",
        plan: Planner::Lu(emulate::plan_write_blocks),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[0x2a, 0xfa, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x2e,
        sa: None,
        name: "WRITE AND VERIFY (10)",
        plan: Planner::Lu(emulate::plan_write_and_verify),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[0x2e, 0xf2, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x2f,
        sa: None,
        name: "VERIFY (10)",
        plan: Planner::Lu(emulate::plan_verify),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[0x2f, 0xf6, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x34,
        sa: None,
        name: "PRE-FETCH (10)",
        plan: Planner::Lu(emulate::plan_pre_fetch),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0x3f, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x35,
        sa: None,
        name: "SYNCHRONIZE CACHE (10)",
        plan: Planner::Lu(emulate::plan_synchronize_cache),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[0x35, 0, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x37,
        sa: None,
        name: "READ DEFECT DATA (10)",
        plan: Planner::Lu(emulate::plan_read_defect_data),
        flags: 0,
        pr: Pr::Read,
        usage: &[0x37, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x41,
        sa: None,
        name: "WRITE SAME (10)",
        plan: Planner::Lu(emulate::plan_write_same_cmd),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[0x41, 0xfe, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x42,
        sa: None,
        name: "UNMAP",
        plan: Planner::Lu(emulate::plan_unmap_cmd),
        flags: BLOCKS | THIN,
        pr: Pr::Write,
        usage: &[0x42, 0x01, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x48,
        sa: Some(sanitize::OVERWRITE),
        name: "SANITIZE OVERWRITE",
        plan: Planner::Lu(emulate::plan_sanitize),
        flags: 0,
        pr: Pr::Write,
        usage: &[0x48, 0xa1, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x48,
        sa: Some(sanitize::BLOCK_ERASE),
        name: "SANITIZE BLOCK ERASE",
        plan: Planner::Lu(emulate::plan_sanitize),
        flags: BLOCK_ERASE,
        pr: Pr::Write,
        usage: &[0x48, 0xa2, 0, 0, 0, 0, 0, 0, 0, 0x04],
    },
    Op {
        opcode: 0x48,
        sa: Some(sanitize::EXIT_FAILURE_MODE),
        name: "SANITIZE EXIT FAILURE MODE",
        plan: Planner::Lu(emulate::plan_sanitize),
        flags: 0,
        pr: Pr::Write,
        usage: &[0x48, 0xbf, 0, 0, 0, 0, 0, 0, 0, 0x04],
    },
    Op {
        opcode: 0x55,
        sa: None,
        name: "MODE SELECT (10)",
        plan: Planner::Lu(emulate::plan_mode_select),
        flags: NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Write,
        usage: &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x56,
        sa: None,
        name: "RESERVE (10)",
        plan: Planner::Lu(emulate::plan_reserve),
        flags: NO_MEDIUM,
        pr: Pr::Write,
        usage: &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0x04],
    },
    Op {
        opcode: 0x57,
        sa: None,
        name: "RELEASE (10)",
        plan: Planner::Lu(emulate::plan_release),
        flags: RESERVED | NO_MEDIUM,
        pr: Pr::Write,
        usage: &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0x04],
    },
    Op {
        opcode: 0x5a,
        sa: None,
        name: "MODE SENSE (10)",
        plan: Planner::Lu(emulate::plan_mode_sense),
        flags: NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Read,
        usage: &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5e,
        sa: Some(0),
        name: "PERSISTENT RESERVE IN READ KEYS",
        plan: Planner::Lu(emulate::plan_persistent_reserve_in),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5e, 0x00, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5e,
        sa: Some(1),
        name: "PERSISTENT RESERVE IN READ RESERVATION",
        plan: Planner::Lu(emulate::plan_persistent_reserve_in),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5e, 0x01, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5e,
        sa: Some(2),
        name: "PERSISTENT RESERVE IN REPORT CAPABILITIES",
        plan: Planner::Lu(emulate::plan_persistent_reserve_in),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5e, 0x02, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5e,
        sa: Some(3),
        name: "PERSISTENT RESERVE IN READ FULL STATUS",
        plan: Planner::Lu(emulate::plan_persistent_reserve_in),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5e, 0x03, 0, 0, 0, 0, 0, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5f,
        sa: Some(0),
        name: "PERSISTENT RESERVE OUT REGISTER",
        plan: Planner::Lu(emulate::plan_persistent_reserve_out),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5f, 0x00, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5f,
        sa: Some(1),
        name: "PERSISTENT RESERVE OUT RESERVE",
        plan: Planner::Lu(emulate::plan_persistent_reserve_out),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5f, 0x01, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5f,
        sa: Some(2),
        name: "PERSISTENT RESERVE OUT RELEASE",
        plan: Planner::Lu(emulate::plan_persistent_reserve_out),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5f, 0x02, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5f,
        sa: Some(3),
        name: "PERSISTENT RESERVE OUT CLEAR",
        plan: Planner::Lu(emulate::plan_persistent_reserve_out),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5f, 0x03, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5f,
        sa: Some(4),
        name: "PERSISTENT RESERVE OUT PREEMPT",
        plan: Planner::Lu(emulate::plan_persistent_reserve_out),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5f, 0x04, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5f,
        sa: Some(5),
        name: "PERSISTENT RESERVE OUT PREEMPT AND ABORT",
        plan: Planner::Lu(emulate::plan_persistent_reserve_out),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5f, 0x05, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5f,
        sa: Some(6),
        name: "PERSISTENT RESERVE OUT REGISTER AND IGNORE EXISTING KEY",
        plan: Planner::Lu(emulate::plan_persistent_reserve_out),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5f, 0x06, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x5f,
        sa: Some(7),
        name: "PERSISTENT RESERVE OUT REGISTER AND MOVE",
        plan: Planner::Lu(emulate::plan_persistent_reserve_out),
        flags: RESERVED | NO_MEDIUM | ALUA_STANDBY,
        pr: Pr::Always,
        usage: &[0x5f, 0x07, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x04],
    },
    Op {
        opcode: 0x83,
        sa: Some(0x00),
        name: "EXTENDED COPY (LID1)",
        plan: Planner::Lu(emulate::plan_extended_copy),
        flags: 0,
        pr: Pr::Write,
        usage: &[
            0x83, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0x84,
        sa: Some(0x00),
        name: "RECEIVE COPY STATUS (LID1)",
        plan: Planner::Lu(emulate::plan_receive_copy_results),
        flags: NO_MEDIUM,
        pr: Pr::Read,
        usage: &[
            0x84, 0x00, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0x84,
        sa: Some(0x01),
        name: "RECEIVE COPY DATA (LID1)",
        plan: Planner::Lu(emulate::plan_receive_copy_results),
        flags: NO_MEDIUM,
        pr: Pr::Read,
        usage: &[
            0x84, 0x01, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0x84,
        sa: Some(0x03),
        name: "RECEIVE COPY OPERATING PARAMETERS",
        plan: Planner::Lu(emulate::plan_receive_copy_results),
        flags: NO_MEDIUM,
        pr: Pr::Read,
        usage: &[
            0x84, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0x84,
        sa: Some(0x04),
        name: "RECEIVE COPY FAILURE DETAILS (LID1)",
        plan: Planner::Lu(emulate::plan_receive_copy_results),
        flags: NO_MEDIUM,
        pr: Pr::Read,
        usage: &[
            0x84, 0x04, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0x88,
        sa: None,
        name: "READ (16)",
        plan: Planner::Lu(emulate::plan_read),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[
            0x88, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x04,
        ],
    },
    Op {
        opcode: 0x89,
        sa: None,
        name: "COMPARE AND WRITE",
        plan: Planner::Lu(emulate::plan_compare_and_write_cmd),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0x89, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x3f, 0x04,
        ],
    },
    Op {
        opcode: 0x8a,
        sa: None,
        name: "WRITE (16)",
        plan: Planner::Lu(emulate::plan_write_blocks),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0x8a, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x04,
        ],
    },
    Op {
        opcode: 0x8b,
        sa: None,
        name: "ORWRITE (16)",
        plan: Planner::Lu(emulate::plan_orwrite),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0x8b, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x04,
        ],
    },
    Op {
        opcode: 0x8e,
        sa: None,
        name: "WRITE AND VERIFY (16)",
        plan: Planner::Lu(emulate::plan_write_and_verify),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0x8e, 0xf2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x04,
        ],
    },
    Op {
        opcode: 0x8f,
        sa: None,
        name: "VERIFY (16)",
        plan: Planner::Lu(emulate::plan_verify),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[
            0x8f, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x04,
        ],
    },
    Op {
        opcode: 0x90,
        sa: None,
        name: "PRE-FETCH (16)",
        plan: Planner::Lu(emulate::plan_pre_fetch),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[
            0x90, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x04,
        ],
    },
    Op {
        opcode: 0x91,
        sa: None,
        name: "SYNCHRONIZE CACHE (16)",
        plan: Planner::Lu(emulate::plan_synchronize_cache),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0x91, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x04,
        ],
    },
    Op {
        opcode: 0x93,
        sa: None,
        name: "WRITE SAME (16)",
        plan: Planner::Lu(emulate::plan_write_same_cmd),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0x93, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x04,
        ],
    },
    Op {
        opcode: 0x9c,
        sa: None,
        name: "WRITE ATOMIC (16)",
        plan: Planner::Lu(emulate::plan_write_atomic),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0x9c, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x3f, 0x04,
        ],
    },
    Op {
        opcode: 0x9e,
        sa: Some(service_action_in_16::READ_CAPACITY_16),
        name: "READ CAPACITY (16)",
        plan: Planner::Lu(emulate::plan_service_action_in_16),
        flags: 0,
        pr: Pr::Always,
        usage: &[
            0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0x9e,
        sa: Some(service_action_in_16::GET_LBA_STATUS),
        name: "GET LBA STATUS",
        plan: Planner::Lu(emulate::plan_service_action_in_16),
        flags: 0,
        pr: Pr::Always,
        usage: &[
            0x9e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x04,
        ],
    },
    Op {
        opcode: 0xa0,
        sa: None,
        name: "REPORT LUNS",
        plan: Planner::Nexus(emulate::plan_report_luns),
        flags: UA | RESERVED | NO_MEDIUM | SANITIZING | ALUA_ANY,
        pr: Pr::Always,
        usage: &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04],
    },
    Op {
        opcode: 0xa3,
        sa: Some(maintenance_in::REPORT_TARGET_PORT_GROUPS),
        name: "REPORT TARGET PORT GROUPS",
        plan: Planner::Lu(emulate::plan_maintenance_in),
        flags: RESERVED | NO_MEDIUM | SANITIZING | ALUA_ANY,
        pr: Pr::Always,
        usage: &[0xa3, 0xea, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04],
    },
    Op {
        opcode: 0xa3,
        sa: Some(maintenance_in::REPORT_SUPPORTED_OPERATION_CODES),
        name: "REPORT SUPPORTED OPERATION CODES",
        plan: Planner::Lu(emulate::plan_maintenance_in),
        flags: RESERVED | NO_MEDIUM | SANITIZING | ALUA_ANY,
        pr: Pr::Always,
        usage: &[
            0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0xa3,
        sa: Some(maintenance_in::REPORT_SUPPORTED_TMFS),
        name: "REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS",
        plan: Planner::Lu(emulate::plan_maintenance_in),
        flags: RESERVED | NO_MEDIUM | SANITIZING | ALUA_ANY,
        pr: Pr::Always,
        usage: &[0xa3, 0x0d, 0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04],
    },
    Op {
        opcode: 0xa4,
        sa: Some(ferrite_scsi::opcode::maintenance_out::SET_TARGET_PORT_GROUPS),
        name: "SET TARGET PORT GROUPS",
        plan: Planner::Lu(emulate::plan_maintenance_out),
        flags: NO_MEDIUM | ALUA_STANDBY | ALUA_UNAVAILABLE | ALUA_GROUP,
        pr: Pr::Write,
        usage: &[0xa4, 0x0a, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04],
    },
    Op {
        opcode: 0xa8,
        sa: None,
        name: "READ (12)",
        plan: Planner::Lu(emulate::plan_read),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[
            0xa8, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0xaa,
        sa: None,
        name: "WRITE (12)",
        plan: Planner::Lu(emulate::plan_write_blocks),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0xaa, 0xfa, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0xae,
        sa: None,
        name: "WRITE AND VERIFY (12)",
        plan: Planner::Lu(emulate::plan_write_and_verify),
        flags: BLOCKS,
        pr: Pr::Write,
        usage: &[
            0xae, 0xf2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0xaf,
        sa: None,
        name: "VERIFY (12)",
        plan: Planner::Lu(emulate::plan_verify),
        flags: BLOCKS,
        pr: Pr::Read,
        usage: &[
            0xaf, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x04,
        ],
    },
    Op {
        opcode: 0xb7,
        sa: None,
        name: "READ DEFECT DATA (12)",
        plan: Planner::Lu(emulate::plan_read_defect_data),
        flags: 0,
        pr: Pr::Read,
        usage: &[0xb7, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x04],
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_scsi::opcode::Opcode;

    #[test]
    fn the_table_is_sorted_and_its_usage_data_well_formed() {
        assert!(
            OPS.windows(2)
                .all(|w| (w[0].opcode, w[0].sa) < (w[1].opcode, w[1].sa))
        );
        for r in OPS {
            assert_eq!(Opcode(r.opcode).cdb_len(), Some(r.usage.len()), "{r:?}");
            assert_eq!(r.usage[0], r.opcode, "{r:?}");
            if let Some(sa) = r.sa {
                assert_eq!(r.usage[1] & 0x1f, sa, "{r:?}");
            }
            // The CONTROL byte: NACA is not supported, the rest vendor
            // specific; usage data shows the LINK bit only.
            assert_eq!(r.usage[r.usage.len() - 1], 0x04, "{r:?}");
        }
    }

    #[test]
    fn an_opcode_has_one_set_of_facts_for_all_its_service_actions() {
        for w in OPS.windows(2) {
            if w[0].opcode == w[1].opcode {
                let (a, b) = (&w[0], &w[1]);
                let mask = !(THIN | BLOCK_ERASE | ALUA_GROUP);
                assert_eq!(a.flags & mask, b.flags & mask, "{a:?} / {b:?}");
                assert_eq!(a.pr, b.pr, "{a:?} / {b:?}");
                assert!(a.sa.is_some() && b.sa.is_some(), "{a:?} / {b:?}");
            }
        }
    }

    #[test]
    fn lookups_find_each_opcode_and_refuse_the_rest() {
        for r in OPS {
            assert_eq!(of(r.opcode).opcode, r.opcode);
            assert!(of(r.opcode).sa <= r.sa);
        }
        assert_eq!(of(0x5f).sa, Some(0));
        assert_eq!(of(0xff).name, UNLISTED.name);
        assert_eq!(of(0x01).pr, Pr::Write);
        // The exemptions SAM-5 and SPC-4 name.
        for op in [0x12, 0xa0, 0x03] {
            assert!(passes_unit_attention(op) && serves_unmapped_lun(op));
        }
        assert!(!passes_unit_attention(0x00));
        assert!(!serves_unmapped_lun(0x28));
        // What needs no logical unit also passes a unit attention.
        for r in OPS {
            assert!(!serves_unmapped_lun(r.opcode) || r.has(UA), "{}", r.name);
        }
        assert!(needs_medium(0x00) && needs_medium(0x25) && needs_medium(0x9e));
        assert!(needs_medium(0x42) && needs_medium(0x35) && needs_medium(0x01));
        assert!(!needs_medium(0x1b) && !needs_medium(0x1e) && !needs_medium(0x5a));
        assert!(passes_reservation(0x17) && !passes_reservation(0x16));
    }
}
