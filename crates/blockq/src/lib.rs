//! ferrite-blockq: the io_uring data plane the file and block backends
//! share, and the file probes both use.
//!
//! Owns: [`queue::UringQueue`], one io_uring per core over a descriptor the
//! backend's queues share (reads tried inline where that cannot block,
//! batched submissions, hole punching, discard, zeroing, a vanished backing
//! store taking the device offline), and the probes of a backing file: the
//! block size check, the physical block exponent, whether holes can be
//! punched, the `SEEK_DATA`/`SEEK_HOLE` mapping. Does not own: opening a
//! backing store or its capabilities (`ferrite-fileio`, `ferrite-blockio`),
//! the ring's unsafe plumbing (`ferrite_reactor::blockring`), anything SCSI.

#![forbid(unsafe_code)]

pub mod queue;

use std::fs::File;
use std::os::fd::AsFd;

use ferrite_core::backend::BackendError;
use ferrite_reactor::blockring;

/// Checks a configured block size.
pub fn check_block_size(bs: u32) -> Result<(), BackendError> {
    if bs.is_power_of_two() && (512..=65536).contains(&bs) {
        Ok(())
    } else {
        Err(BackendError::Invalid(format!(
            "block size {bs} is not a power of two between 512 and 65536"
        )))
    }
}

/// Physical-block exponent for a filesystem block of `fs_block` bytes under
/// logical blocks of `bs` bytes (capped at 4 KiB physical blocks).
pub fn phys_exp(fs_block: u64, bs: u32) -> u8 {
    let phys = fs_block.clamp(bs as u64, 4096.max(bs as u64));
    (phys / bs as u64).trailing_zeros() as u8
}

/// Whether holes can be punched in `file`: probed past its end (`size`),
/// where no data can be lost; `KEEP_SIZE` leaves the size alone.
pub fn probe_punch_hole(file: &File, size: u64, len: u32) -> bool {
    blockring::fallocate(
        file.as_fd(),
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        size,
        len as u64,
    )
    .is_ok()
}

/// `mapping()` for any file descriptor that knows `SEEK_DATA`/`SEEK_HOLE`:
/// `(mapped, bytes)` from `offset`, clipped to `capacity` and rounded to
/// whole blocks of `bs`.
pub fn seek_mapping(
    file: &File,
    capacity: u64,
    bs: u64,
    offset: u64,
    len: u64,
) -> Option<(bool, u64)> {
    let end = offset.checked_add(len)?.min(capacity);
    if offset >= end {
        return None;
    }
    let fd = file.as_fd();
    let (mapped, stop) = match blockring::seek_data(fd, offset).ok()? {
        None => (false, end),
        Some(d) if d > offset => (false, d.min(end)),
        Some(_) => {
            let h = blockring::seek_hole(fd, offset).ok()?.unwrap_or(end);
            (true, h.min(end))
        }
    };
    let mut n = stop - offset;
    if mapped {
        // A partly mapped block counts as mapped.
        n = n.next_multiple_of(bs).min(end - offset);
    } else {
        n = n / bs * bs;
        if n == 0 {
            // The hole ends inside this block: the block holds data.
            return Some((true, bs.min(end - offset)));
        }
    }
    Some((mapped, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phys_exp_from_fs_block() {
        assert_eq!(phys_exp(4096, 512), 3);
        assert_eq!(phys_exp(4096, 4096), 0);
        assert_eq!(phys_exp(65536, 512), 3);
        assert_eq!(phys_exp(512, 4096), 0);
    }
}
