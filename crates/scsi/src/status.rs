//! SCSI status codes (SAM-5 §5.3).

/// A SCSI status byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status(pub u8);

impl Status {
    pub const GOOD: Status = Status(0x00);
    pub const CHECK_CONDITION: Status = Status(0x02);
    pub const CONDITION_MET: Status = Status(0x04);
    pub const BUSY: Status = Status(0x08);
    pub const RESERVATION_CONFLICT: Status = Status(0x18);
    pub const TASK_SET_FULL: Status = Status(0x28);
    pub const ACA_ACTIVE: Status = Status(0x30);
    pub const TASK_ABORTED: Status = Status(0x40);
}
