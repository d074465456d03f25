//! Thin provisioning end to end on fileio: UNMAP of a written range gives the
//! space back (the image's st_blocks shrink), the range reads back as zeroes
//! (LBPRZ), the data around it is untouched, and GET LBA STATUS reports the
//! hole if the core implements it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod backend_util;

use std::path::Path;

use backend_util::*;

const MIB: u64 = 1 << 20;

fn thin_fileio(base: &Path, bs: u32) -> (Device, std::path::PathBuf) {
    let img = base.join(format!("thin{bs}.img"));
    (
        Device::fileio(&format!("thin{bs}"), &img, 32 * MIB)
            .set("blocksize", bs)
            .set("thin_provisioned", true),
        img,
    )
}

/// GET LBA STATUS (16) at `lba` (SBC-4 §5.8): the first descriptor's
/// (start, blocks, provisioning status), or None if the core refuses it.
fn get_lba_status(
    i: &mut ferrite_iscsi::initiator::Initiator<std::net::TcpStream>,
    l: u64,
    lba: u64,
) -> Option<(u64, u32, u8)> {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x12;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&64u32.to_be_bytes());
    let r = run(i, l, &c, &[], 64);
    if r.status == 2
        && sense_triple(&r.sense).is_some_and(|(k, asc, _)| k == 5 && (asc == 0x20 || asc == 0x24))
    {
        return None;
    }
    assert_eq!(r.status, 0, "GET LBA STATUS: {r:?}");
    assert!(r.data.len() >= 24, "GET LBA STATUS data {:02x?}", r.data);
    let d = &r.data[8..24];
    Some((
        u64::from_be_bytes(d[..8].try_into().unwrap()),
        u32::from_be_bytes(d[8..12].try_into().unwrap()),
        d[12] & 0x0f,
    ))
}

fn unmap_gives_space_back(bs: u32) {
    let dir = tempfile::tempdir().unwrap();
    let (dev, img) = thin_fileio(dir.path(), bs);
    let f = start(dir.path(), &[dev]);
    let l = lun(0);
    let mut i = login(f.addr, "thin", 1);
    let (got_bs, _) = geometry(&mut i, l);
    assert_eq!(got_bs, bs);
    let r = read_capacity(&mut i, l);
    let (_, _, lbpme, lbprz) = capacity_of(&r.data);
    assert!(lbpme && lbprz, "thin LUN must report LBPME and LBPRZ");

    // 8 MiB of data from LBA 0, in 256 KiB writes, then made durable so the
    // filesystem has allocated it.
    let per = 256 * 1024 / bs as u64;
    let total = 8 * MIB / bs as u64;
    for lba in (0..total).step_by(per as usize) {
        let r = run(
            &mut i,
            l,
            &rw16(true, lba, per as u32, false),
            &pattern(lba, per, bs, 1),
            0,
        );
        assert_eq!(r.status, 0, "WRITE (16): {r:?}");
    }
    assert_eq!(run(&mut i, l, &sync16(), &[], 0).status, 0);
    let before = allocated_bytes(&img);
    assert!(
        before >= 8 * MIB,
        "the image holds only {before} bytes after 8 MiB of writes"
    );

    // UNMAP 4 MiB in the middle (from 2 MiB).
    let hole = 2 * MIB / bs as u64;
    let hole_len = 4 * MIB / bs as u64;
    let r = unmap(&mut i, l, hole, hole_len as u32);
    assert_eq!(r.status, 0, "UNMAP: {r:?}");
    let after = allocated_bytes(&img);
    assert!(
        after + 4 * MIB <= before,
        "UNMAP of 4 MiB freed only {} bytes (st_blocks {} -> {})",
        before.saturating_sub(after),
        before / 512,
        after / 512
    );

    // GET LBA STATUS: mapped before the hole, deallocated in it.
    match get_lba_status(&mut i, l, hole) {
        None => eprintln!("GET LBA STATUS is not implemented by the core: hole not checked there"),
        Some((start, n, status)) => {
            assert_eq!(start, hole);
            assert_eq!(status, 1, "the unmapped range is not reported deallocated");
            assert!(n as u64 >= hole_len, "hole of {n} blocks, want {hole_len}");
            let (start, n, status) = get_lba_status(&mut i, l, 0).expect("answered once");
            assert_eq!((start, status), (0, 0), "written range not reported mapped");
            assert_eq!(n as u64, hole, "mapped extent should end at the hole");
        }
    }

    // Zeroes in the hole, the pattern around it.
    read_all(&mut i, l, bs, 0, total, per, |at, data| {
        for (k, got) in data.chunks(bs as usize).enumerate() {
            let lba = at + k as u64;
            if (hole..hole + hole_len).contains(&lba) {
                assert!(
                    got.iter().all(|&b| b == 0),
                    "LBA {lba} in the hole is not zero"
                );
            } else {
                assert!(
                    got == pattern(lba, 1, bs, 1),
                    "LBA {lba} outside the hole changed"
                );
            }
        }
    });
    i.logout(0).expect("logout");
}

#[test]
fn unmap_shrinks_the_image_and_reads_zeroes_512() {
    unmap_gives_space_back(512);
}

#[test]
fn unmap_shrinks_the_image_and_reads_zeroes_4096() {
    unmap_gives_space_back(4096);
}
