//! CDB decoding (crates/scsi): the first 16 bytes as a CDB through every
//! decoder, the rest as MODE SELECT and EXTENDED COPY parameter data, and
//! the first 8 as a LUN.
//!
//! Invariants: no panic; a decoded CDB length is its group's and no more
//! than was given; every error is a sense that reports an error, with any
//! CDB field pointer inside the CDB; a 6-byte block CDB's LBA has 21 bits
//! and its transfer 1 to 256 blocks; a LUN that decodes encodes back to
//! the same bytes.
#![no_main]

use ferrite_fuzz::check_sense;
use ferrite_scsi::cdb::{
    BlockCdb, InquiryCdb, ModeSenseCdb, PreventAllowCdb, ReadCapacity10Cdb, ReportLunsCdb,
    RequestSenseCdb, ServiceActionIn16Cdb, StartStopCdb, check_cdb,
};
use ferrite_scsi::mode::{ModeState, mode_select};
use ferrite_scsi::opcodes::ReportOpcodesCdb;
use ferrite_scsi::{Lun, Opcode, Sense, xcopy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cdb = &data[..data.len().min(16)];
    let params = &data[cdb.len()..];
    let len = cdb.first().and_then(|&op| Opcode(op).cdb_len());
    let sense_ok = |r: Result<(), Sense>| {
        if let Err(s) = r {
            check_sense(&s, len.unwrap_or(cdb.len()).min(cdb.len().max(1)));
        }
    };
    match check_cdb(cdb) {
        Ok(n) => assert!(Some(n) == len && n <= cdb.len(), "{n} for {cdb:02x?}"),
        Err(s) => sense_ok(Err(s)),
    }
    match BlockCdb::decode(cdb) {
        Ok(b) => {
            if len == Some(6) {
                assert!(b.lba < 1 << 21 && (1..=256).contains(&b.blocks), "{b:?}");
            }
            for cap in [0, 1, 2048, u64::MAX] {
                sense_ok(b.check_range(cap));
            }
            sense_ok(b.check_no_protect());
        }
        Err(s) => sense_ok(Err(s)),
    }
    sense_ok(InquiryCdb::decode(cdb).map(drop));
    sense_ok(ModeSenseCdb::decode(cdb).map(drop));
    sense_ok(ReportLunsCdb::decode(cdb).map(drop));
    sense_ok(RequestSenseCdb::decode(cdb).map(drop));
    sense_ok(ReadCapacity10Cdb::decode(cdb).map(drop));
    sense_ok(ServiceActionIn16Cdb::decode(cdb).map(drop));
    sense_ok(StartStopCdb::decode(cdb).map(drop));
    sense_ok(PreventAllowCdb::decode(cdb).map(drop));
    sense_ok(ReportOpcodesCdb::decode(cdb).map(drop));

    let state = ModeState {
        num_blocks: 2048,
        block_size: 512,
        write_cache: true,
        ..ModeState::default()
    };
    for ten in [false, true] {
        sense_ok(mode_select(ten, params, &state).map(drop));
    }
    sense_ok(xcopy::parse(params).map(drop));

    if let Some(b) = data.first_chunk::<8>()
        && let Some(l) = Lun::decode(*b)
    {
        assert_eq!(Lun::decode(l.encode()), Some(l));
    }
});
