//! Operation codes (SPC-4 Annex E, SBC-4 table 14) and service actions.

/// A SCSI operation code (the first byte of a CDB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

impl Opcode {
    pub const TEST_UNIT_READY: Opcode = Opcode(0x00);
    pub const REQUEST_SENSE: Opcode = Opcode(0x03);
    pub const READ_6: Opcode = Opcode(0x08);
    pub const WRITE_6: Opcode = Opcode(0x0a);
    pub const INQUIRY: Opcode = Opcode(0x12);
    pub const MODE_SELECT_6: Opcode = Opcode(0x15);
    pub const RESERVE_6: Opcode = Opcode(0x16);
    pub const RELEASE_6: Opcode = Opcode(0x17);
    pub const MODE_SENSE_6: Opcode = Opcode(0x1a);
    pub const START_STOP_UNIT: Opcode = Opcode(0x1b);
    pub const PREVENT_ALLOW_MEDIUM_REMOVAL: Opcode = Opcode(0x1e);
    pub const READ_CAPACITY_10: Opcode = Opcode(0x25);
    pub const READ_10: Opcode = Opcode(0x28);
    pub const WRITE_10: Opcode = Opcode(0x2a);
    pub const WRITE_AND_VERIFY_10: Opcode = Opcode(0x2e);
    pub const VERIFY_10: Opcode = Opcode(0x2f);
    pub const PRE_FETCH_10: Opcode = Opcode(0x34);
    pub const SYNCHRONIZE_CACHE_10: Opcode = Opcode(0x35);
    pub const READ_DEFECT_DATA_10: Opcode = Opcode(0x37);
    pub const WRITE_SAME_10: Opcode = Opcode(0x41);
    pub const UNMAP: Opcode = Opcode(0x42);
    pub const SANITIZE: Opcode = Opcode(0x48);
    pub const MODE_SELECT_10: Opcode = Opcode(0x55);
    pub const RESERVE_10: Opcode = Opcode(0x56);
    pub const RELEASE_10: Opcode = Opcode(0x57);
    pub const MODE_SENSE_10: Opcode = Opcode(0x5a);
    pub const PERSISTENT_RESERVE_IN: Opcode = Opcode(0x5e);
    pub const PERSISTENT_RESERVE_OUT: Opcode = Opcode(0x5f);
    pub const EXTENDED_COPY: Opcode = Opcode(0x83);
    pub const RECEIVE_COPY_RESULTS: Opcode = Opcode(0x84);
    pub const READ_16: Opcode = Opcode(0x88);
    pub const COMPARE_AND_WRITE: Opcode = Opcode(0x89);
    pub const WRITE_16: Opcode = Opcode(0x8a);
    pub const ORWRITE_16: Opcode = Opcode(0x8b);
    pub const WRITE_AND_VERIFY_16: Opcode = Opcode(0x8e);
    pub const VERIFY_16: Opcode = Opcode(0x8f);
    pub const PRE_FETCH_16: Opcode = Opcode(0x90);
    pub const SYNCHRONIZE_CACHE_16: Opcode = Opcode(0x91);
    pub const WRITE_SAME_16: Opcode = Opcode(0x93);
    /// SERVICE ACTION IN (16): READ CAPACITY (16), GET LBA STATUS.
    pub const WRITE_ATOMIC_16: Opcode = Opcode(0x9c);
    pub const SERVICE_ACTION_IN_16: Opcode = Opcode(0x9e);
    pub const REPORT_LUNS: Opcode = Opcode(0xa0);
    /// MAINTENANCE IN: REPORT TARGET PORT GROUPS, REPORT SUPPORTED OPCODES.
    pub const MAINTENANCE_IN: Opcode = Opcode(0xa3);
    /// MAINTENANCE OUT: SET TARGET PORT GROUPS.
    pub const MAINTENANCE_OUT: Opcode = Opcode(0xa4);
    pub const READ_12: Opcode = Opcode(0xa8);
    pub const WRITE_12: Opcode = Opcode(0xaa);
    pub const WRITE_AND_VERIFY_12: Opcode = Opcode(0xae);
    pub const VERIFY_12: Opcode = Opcode(0xaf);
    pub const READ_DEFECT_DATA_12: Opcode = Opcode(0xb7);

    /// Length of the CDB this opcode starts, from its group code (SPC-4
    /// §4.2.5.1). `None` for reserved groups and variable-length CDBs.
    pub fn cdb_len(self) -> Option<usize> {
        match self.0 >> 5 {
            0 => Some(6),
            1 | 2 => Some(10),
            4 => Some(16),
            5 => Some(12),
            _ => None,
        }
    }
}

/// Service actions of SERVICE ACTION IN (16) (SBC-4 table 15).
pub mod service_action_in_16 {
    pub const READ_CAPACITY_16: u8 = 0x10;
    pub const GET_LBA_STATUS: u8 = 0x12;
}

/// Service actions of MAINTENANCE IN (SPC-4 table 59).
pub mod maintenance_in {
    pub const REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
    pub const REPORT_SUPPORTED_OPERATION_CODES: u8 = 0x0c;
    pub const REPORT_SUPPORTED_TMFS: u8 = 0x0d;
}

/// Service actions of MAINTENANCE OUT (SPC-4 table 60).
pub mod maintenance_out {
    pub const SET_TARGET_PORT_GROUPS: u8 = 0x0a;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_code_lengths() {
        assert_eq!(Opcode::READ_6.cdb_len(), Some(6));
        assert_eq!(Opcode::READ_10.cdb_len(), Some(10));
        assert_eq!(Opcode::MODE_SENSE_10.cdb_len(), Some(10));
        assert_eq!(Opcode::READ_12.cdb_len(), Some(12));
        assert_eq!(Opcode::READ_16.cdb_len(), Some(16));
        assert_eq!(Opcode::SERVICE_ACTION_IN_16.cdb_len(), Some(16));
        assert_eq!(Opcode(0x7f).cdb_len(), None);
        assert_eq!(Opcode(0xc0).cdb_len(), None);
    }
}
