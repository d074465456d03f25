//! Sense data (SPC-4 §4.5): keys, additional sense codes, and the fixed and
//! descriptor formats.

/// Sense key (SPC-4 table 48).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SenseKey(pub u8);

impl SenseKey {
    pub const NO_SENSE: SenseKey = SenseKey(0x0);
    pub const RECOVERED_ERROR: SenseKey = SenseKey(0x1);
    pub const NOT_READY: SenseKey = SenseKey(0x2);
    pub const MEDIUM_ERROR: SenseKey = SenseKey(0x3);
    pub const HARDWARE_ERROR: SenseKey = SenseKey(0x4);
    pub const ILLEGAL_REQUEST: SenseKey = SenseKey(0x5);
    pub const UNIT_ATTENTION: SenseKey = SenseKey(0x6);
    pub const DATA_PROTECT: SenseKey = SenseKey(0x7);
    pub const BLANK_CHECK: SenseKey = SenseKey(0x8);
    pub const COPY_ABORTED: SenseKey = SenseKey(0xa);
    pub const ABORTED_COMMAND: SenseKey = SenseKey(0xb);
    pub const MISCOMPARE: SenseKey = SenseKey(0xe);
}

/// One sense condition: key, ASC/ASCQ, and the optional sense-key-specific
/// field pointer and information field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sense {
    pub key: SenseKey,
    pub asc: u8,
    pub ascq: u8,
    /// SPC-4 §4.5.2.4.2 field pointer: (in CDB? , byte, bit) when SKSV is set.
    pub field: Option<FieldPointer>,
    /// The INFORMATION field (e.g. the first bad LBA), when VALID is set.
    pub info: Option<u64>,
    /// SPC-4 §4.5.2.4.4 PROGRESS INDICATION (SKSV set): the fraction done
    /// of a long operation in 65536ths, e.g. NOT READY while a sanitize
    /// runs. Ignored when `field` is set.
    pub progress: Option<u16>,
}

/// Sense-key-specific field pointer (SPC-4 §4.5.2.4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FieldPointer {
    /// C/D bit: true when the error is in the CDB, false in parameter data.
    pub in_cdb: bool,
    /// The byte in error.
    pub byte: u16,
    /// The bit in error (BPV set), if known.
    pub bit: Option<u8>,
}

impl Sense {
    /// A sense condition without field pointer or information.
    pub const fn new(key: SenseKey, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            field: None,
            info: None,
            progress: None,
        }
    }

    /// This condition with a progress indication (`done` in 65536ths).
    pub const fn with_progress(mut self, done: u16) -> Sense {
        self.progress = Some(done);
        self
    }

    /// This condition, pointing at a field of the CDB.
    pub const fn cdb_field(mut self, byte: u16, bit: Option<u8>) -> Sense {
        self.field = Some(FieldPointer {
            in_cdb: true,
            byte,
            bit,
        });
        self
    }

    /// This condition, pointing at a field of the parameter data.
    pub const fn param_field(mut self, byte: u16, bit: Option<u8>) -> Sense {
        self.field = Some(FieldPointer {
            in_cdb: false,
            byte,
            bit,
        });
        self
    }

    /// This condition with the INFORMATION field set.
    pub const fn with_info(mut self, info: u64) -> Sense {
        self.info = Some(info);
        self
    }

    /// Fixed-format sense data (SPC-4 §4.5.3), response code 70h, 18 bytes.
    pub fn to_fixed(&self) -> [u8; 18] {
        let mut b = [0u8; 18];
        b[0] = 0x70;
        b[2] = self.key.0 & 0x0f;
        if let Some(info) = self.info {
            b[0] |= 0x80;
            b[3..7].copy_from_slice(&(info as u32).to_be_bytes());
        }
        b[7] = 10;
        b[12] = self.asc;
        b[13] = self.ascq;
        if let Some(f) = self.field {
            b[15] = 0x80 | if f.in_cdb { 0x40 } else { 0 };
            if let Some(bit) = f.bit {
                b[15] |= 0x08 | (bit & 7);
            }
            b[16..18].copy_from_slice(&f.byte.to_be_bytes());
        } else if let Some(p) = self.progress {
            b[15] = 0x80;
            b[16..18].copy_from_slice(&p.to_be_bytes());
        }
        b
    }

    /// Descriptor-format sense data (SPC-4 §4.5.2), response code 72h: the
    /// header, then an information descriptor (§4.5.2.2) if INFORMATION is
    /// set and a sense-key specific descriptor (§4.5.2.3) if a field pointer
    /// is set.
    pub fn to_descriptor(&self) -> SenseData {
        let mut d = SenseData {
            bytes: [0; SENSE_DATA_MAX],
            len: 8,
        };
        let b = &mut d.bytes;
        b[0] = 0x72;
        b[1] = self.key.0 & 0x0f;
        b[2] = self.asc;
        b[3] = self.ascq;
        let mut n = 8;
        if let Some(info) = self.info {
            b[n] = 0x00;
            b[n + 1] = 0x0a;
            b[n + 2] = 0x80;
            b[n + 4..n + 12].copy_from_slice(&info.to_be_bytes());
            n += 12;
        }
        if self.field.is_some() || self.progress.is_some() {
            b[n] = 0x02;
            b[n + 1] = 0x06;
            let f = self.to_fixed();
            b[n + 4..n + 7].copy_from_slice(&f[15..18]);
            n += 8;
        }
        b[7] = (n - 8) as u8;
        d.len = n as u8;
        d
    }

    /// Fixed-format sense data as a [`SenseData`].
    pub fn to_fixed_data(&self) -> SenseData {
        let mut d = SenseData {
            bytes: [0; SENSE_DATA_MAX],
            len: 18,
        };
        d.bytes[..18].copy_from_slice(&self.to_fixed());
        d
    }

    /// Sense data in the format a device with D_SENSE = `descriptor` uses
    /// (SPC-4 §7.5.7 Control mode page).
    pub fn encode(&self, descriptor: bool) -> SenseData {
        if descriptor {
            self.to_descriptor()
        } else {
            self.to_fixed_data()
        }
    }
}

/// The longest sense data this target produces.
pub const SENSE_DATA_MAX: usize = 32;

/// Encoded sense data (fixed or descriptor format), at most
/// [`SENSE_DATA_MAX`] bytes, without allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SenseData {
    bytes: [u8; SENSE_DATA_MAX],
    len: u8,
}

impl std::fmt::Debug for SenseData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SenseData({:02x?})", &self.bytes[..self.len as usize])
    }
}

impl std::ops::Deref for SenseData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

macro_rules! sense_consts {
    ($($name:ident = $key:ident, $asc:expr, $ascq:expr;)*) => {
        impl Sense {
            $(pub const $name: Sense = Sense::new(SenseKey::$key, $asc, $ascq);)*
        }
    };
}

// SPC-4 Annex D: the additional sense codes this target reports.
sense_consts! {
    NO_SENSE = NO_SENSE, 0x00, 0x00;
    INVALID_COMMAND_OPERATION_CODE = ILLEGAL_REQUEST, 0x20, 0x00;
    LBA_OUT_OF_RANGE = ILLEGAL_REQUEST, 0x21, 0x00;
    INVALID_FIELD_IN_CDB = ILLEGAL_REQUEST, 0x24, 0x00;
    INVALID_FIELD_IN_COMMAND_INFORMATION_UNIT = ILLEGAL_REQUEST, 0x0e, 0x03;
    LOGICAL_UNIT_NOT_SUPPORTED = ILLEGAL_REQUEST, 0x25, 0x00;
    INVALID_FIELD_IN_PARAMETER_LIST = ILLEGAL_REQUEST, 0x26, 0x00;
    PARAMETER_LIST_LENGTH_ERROR = ILLEGAL_REQUEST, 0x1a, 0x00;
    SAVING_PARAMETERS_NOT_SUPPORTED = ILLEGAL_REQUEST, 0x39, 0x00;
    INVALID_RELEASE_OF_PR = ILLEGAL_REQUEST, 0x26, 0x04;
    POWER_ON_RESET = UNIT_ATTENTION, 0x29, 0x00;
    BUS_DEVICE_RESET = UNIT_ATTENTION, 0x29, 0x03;
    I_T_NEXUS_LOSS = UNIT_ATTENTION, 0x29, 0x07;
    MODE_PARAMETERS_CHANGED = UNIT_ATTENTION, 0x2a, 0x01;
    RESERVATIONS_PREEMPTED = UNIT_ATTENTION, 0x2a, 0x03;
    RESERVATIONS_RELEASED = UNIT_ATTENTION, 0x2a, 0x04;
    REGISTRATIONS_PREEMPTED = UNIT_ATTENTION, 0x2a, 0x05;
    CAPACITY_DATA_HAS_CHANGED = UNIT_ATTENTION, 0x2a, 0x09;
    COMMANDS_CLEARED_BY_ANOTHER_INITIATOR = UNIT_ATTENTION, 0x2f, 0x00;
    INQUIRY_DATA_HAS_CHANGED = UNIT_ATTENTION, 0x3f, 0x03;
    REPORTED_LUNS_DATA_HAS_CHANGED = UNIT_ATTENTION, 0x3f, 0x0e;
    WRITE_PROTECTED = DATA_PROTECT, 0x27, 0x00;
    SPACE_ALLOCATION_FAILED_WRITE_PROTECT = DATA_PROTECT, 0x27, 0x07;
    UNRECOVERED_READ_ERROR = MEDIUM_ERROR, 0x11, 0x00;
    WRITE_ERROR = MEDIUM_ERROR, 0x0c, 0x00;
    MISCOMPARE_DURING_VERIFY = MISCOMPARE, 0x1d, 0x00;
    LOGICAL_UNIT_NOT_READY_CAUSE_NOT_REPORTABLE = NOT_READY, 0x04, 0x00;
    LOGICAL_UNIT_NOT_READY_OFFLINE = NOT_READY, 0x04, 0x12;
    // SPC-4 §5.15.2.4 asymmetric access states.
    ASYMMETRIC_ACCESS_STATE_TRANSITION = NOT_READY, 0x04, 0x0a;
    TARGET_PORT_IN_STANDBY_STATE = NOT_READY, 0x04, 0x0b;
    TARGET_PORT_IN_UNAVAILABLE_STATE = NOT_READY, 0x04, 0x0c;
    ASYMMETRIC_ACCESS_STATE_CHANGED = UNIT_ATTENTION, 0x2a, 0x06;
    SET_TARGET_PORT_GROUPS_COMMAND_FAILED = HARDWARE_ERROR, 0x67, 0x0a;
    LOGICAL_UNIT_COMMUNICATION_FAILURE = ABORTED_COMMAND, 0x08, 0x00;
    INTERNAL_TARGET_FAILURE = HARDWARE_ERROR, 0x44, 0x00;
    INITIATOR_DETECTED_ERROR = ABORTED_COMMAND, 0x48, 0x00;
    DATA_PHASE_ERROR = ABORTED_COMMAND, 0x4b, 0x00;
    PROTOCOL_SERVICE_CRC_ERROR = ABORTED_COMMAND, 0x47, 0x05;
    OVERLAPPED_COMMANDS_ATTEMPTED = ABORTED_COMMAND, 0x4e, 0x00;
    SCSI_BUS_RESET = UNIT_ATTENTION, 0x29, 0x02;
    // SBC-4 §4.15 removable media: START STOP UNIT with LOEJ, PREVENT ALLOW
    // MEDIUM REMOVAL.
    MEDIUM_NOT_PRESENT = NOT_READY, 0x3a, 0x00;
    MEDIUM_REMOVAL_PREVENTED = ILLEGAL_REQUEST, 0x53, 0x02;
    NOT_READY_TO_READY_CHANGE = UNIT_ATTENTION, 0x28, 0x00;
    // SBC-4 §4.11 sanitize operations.
    SANITIZE_IN_PROGRESS = NOT_READY, 0x04, 0x1b;
    MEDIUM_FORMAT_CORRUPTED = MEDIUM_ERROR, 0x31, 0x00;
    SANITIZE_COMMAND_FAILED = MEDIUM_ERROR, 0x31, 0x03;
    // SPC-4 §6.4 EXTENDED COPY and §6.23 RECEIVE COPY RESULTS.
    TOO_MANY_TARGET_DESCRIPTORS = ILLEGAL_REQUEST, 0x26, 0x06;
    UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE = ILLEGAL_REQUEST, 0x26, 0x07;
    TOO_MANY_SEGMENT_DESCRIPTORS = ILLEGAL_REQUEST, 0x26, 0x08;
    UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE = ILLEGAL_REQUEST, 0x26, 0x09;
    OPERATION_IN_PROGRESS = ILLEGAL_REQUEST, 0x00, 0x16;
    COPY_ABORTED = COPY_ABORTED, 0x00, 0x00;
    COPY_TARGET_DEVICE_NOT_REACHABLE = COPY_ABORTED, 0x0d, 0x02;
    COPY_ABORTED_READ_ERROR = COPY_ABORTED, 0x11, 0x00;
    COPY_ABORTED_WRITE_ERROR = COPY_ABORTED, 0x0c, 0x00;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_field_pointer() {
        let b = Sense::INVALID_FIELD_IN_CDB.cdb_field(2, Some(3)).to_fixed();
        assert_eq!(b[0], 0x70);
        assert_eq!(b[2], 0x05);
        assert_eq!(b[7], 10);
        assert_eq!((b[12], b[13]), (0x24, 0x00));
        assert_eq!(b[15], 0x80 | 0x40 | 0x08 | 3);
        assert_eq!(u16::from_be_bytes([b[16], b[17]]), 2);
    }

    #[test]
    fn descriptor_format() {
        let d = Sense::LBA_OUT_OF_RANGE.to_descriptor();
        assert_eq!(&d[..], &[0x72, 0x05, 0x21, 0x00, 0, 0, 0, 0]);
        let d = Sense::INVALID_FIELD_IN_CDB
            .cdb_field(8, None)
            .with_info(0x1_0000_0001)
            .encode(true);
        assert_eq!(d.len(), 8 + 12 + 8);
        assert_eq!(d[7], 20);
        assert_eq!(&d[8..12], &[0x00, 0x0a, 0x80, 0x00]);
        assert_eq!(&d[12..20], &0x1_0000_0001u64.to_be_bytes());
        assert_eq!(&d[20..28], &[0x02, 0x06, 0, 0, 0xc0, 0, 8, 0]);
        let f = Sense::WRITE_PROTECTED.encode(false);
        assert_eq!(f.len(), 18);
        assert_eq!((f[2], f[12]), (0x07, 0x27));
    }

    #[test]
    fn progress_indication() {
        let s = Sense::SANITIZE_IN_PROGRESS.with_progress(0x8000);
        let f = s.to_fixed();
        assert_eq!((f[2], f[12], f[13]), (0x02, 0x04, 0x1b));
        assert_eq!(&f[15..18], &[0x80, 0x80, 0x00]);
        let d = s.to_descriptor();
        assert_eq!(&d[8..16], &[0x02, 0x06, 0, 0, 0x80, 0x80, 0, 0]);
        assert_eq!(Sense::SANITIZE_IN_PROGRESS.to_fixed()[15], 0);
    }
}
