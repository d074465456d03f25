//! Commands made of several block operations: WRITE SAME by writes,
//! UNMAP by ranges, COMPARE AND WRITE and ORWRITE (read, combine, write).

use super::*;

/// What a command made of several block operations still has to do once
/// the current one completes.
pub(super) enum Cont {
    None,
    /// WRITE SAME by writes: the pattern buffer comes back with each
    /// completion and is written again at `next`, until `end`.
    Fill {
        next: u64,
        end: u64,
    },
    /// UNMAP: byte ranges still to deallocate, last first.
    Unmap(Vec<(u64, u64)>),
    /// COMPARE AND WRITE / ORWRITE: the medium read completes; combine it
    /// with this Data-Out and write.
    Combine(SgList),
    /// VERIFY with BYTCHK: the medium read completes; compare it with this
    /// Data-Out.
    Verify(SgList),
    /// EXTENDED COPY: the copy runs its own chunks ([`crate::xcopy`]).
    Copy(Box<crate::xcopy::CopyRun>),
}

impl Shard {
    /// Carries out a WRITE SAME (SBC-4 §5.48, §5.49) with its one-block
    /// `pattern` (`None`: NDOB, zeroes): unmap if asked and the result reads
    /// as the pattern, write zeroes without a buffer if the backend can, or
    /// write the pattern in chunks of at most MAXIMUM TRANSFER LENGTH.
    pub(super) fn write_same(&mut self, key: usize, pattern: Option<SgList>) {
        let c = &self.cmds[key];
        let (
            Plan::WriteSame {
                offset, len, unmap, ..
            },
            Some(dev),
        ) = (c.plan, c.entry.as_ref().map(|e| e.device.clone()))
        else {
            return;
        };
        let caps = dev.backend.caps();
        let bs = dev.geometry().block_size as usize;
        let zero = pattern
            .as_ref()
            .is_none_or(|p| p.slices(0, p.len()).all(|s| s.iter().all(|&b| b == 0)));
        // SBC-4 §5.48 with LBPWS set: the UNMAP bit deallocates the range;
        // it then reads as LBPRZ says, whatever the Data-Out held (as Linux
        // LIO does, and libiscsi's WriteSame*.Unmap tests expect).
        if unmap && caps.unmap {
            self.submit_op(key, BlockOp::Unmap { offset, len });
            return;
        }
        if zero && caps.write_zeroes {
            self.submit_op(key, BlockOp::WriteZeroes { offset, len });
            return;
        }
        let mut block = vec![0u8; bs];
        if let Some(p) = &pattern {
            p.copy_out(0, &mut block);
        }
        let chunk = len.min(u64::from(WRITE_CHUNK));
        let mut buf = self.pool.sg(chunk as usize);
        let mut at = 0;
        while at < chunk as usize {
            at += buf.copy_in(at, &block).max(1);
        }
        self.cmds[key].cont = Cont::Fill {
            next: offset + chunk,
            end: offset + len,
        };
        self.submit_op(
            key,
            BlockOp::Write {
                offset,
                buf,
                fua: false,
            },
        );
    }

    /// Starts an UNMAP once its parameter list arrived.
    pub(super) fn unmap(&mut self, key: usize, list: SgList) {
        let c = &self.cmds[key];
        let (Plan::Unmap { residual, .. }, Some(dev)) =
            (c.plan, c.entry.as_ref().map(|e| e.device.clone()))
        else {
            return;
        };
        let g = dev.geometry();
        let mut ranges = Vec::new();
        match emulate::unmap_ranges(&list.to_vec(), g.num_blocks, g.block_size, &mut ranges) {
            Err(s) => self.respond(key, Response::check(s)),
            Ok(()) => {
                ranges.reverse();
                match ranges.pop() {
                    None => self.respond(key, good(residual)),
                    Some((offset, len)) => {
                        self.cmds[key].cont = Cont::Unmap(ranges);
                        self.submit_op(key, BlockOp::Unmap { offset, len });
                    }
                }
            }
        }
    }

    /// Submits the next operation of a multi-operation command, if any;
    /// hands the buffer back if there was nothing left to do.
    pub(super) fn continue_cmd(
        &mut self,
        key: usize,
        buf: Option<SgList>,
    ) -> Result<(), Option<SgList>> {
        let c = &mut self.cmds[key];
        match &mut c.cont {
            Cont::None => Err(buf),
            Cont::Fill { next, end } => {
                if *next >= *end {
                    return Err(buf);
                }
                let Some(mut buf) = buf else {
                    return Err(None);
                };
                let offset = *next;
                let n = (*end - *next).min(buf.len() as u64);
                buf.truncate(n as usize);
                *next += n;
                self.submit_op(
                    key,
                    BlockOp::Write {
                        offset,
                        buf,
                        fua: false,
                    },
                );
                Ok(())
            }
            Cont::Copy(_) => Err(buf),
            Cont::Combine(_) | Cont::Verify(_) => Err(buf),
            Cont::Unmap(ranges) => match ranges.pop() {
                None => Err(buf),
                Some((offset, len)) => {
                    self.submit_op(key, BlockOp::Unmap { offset, len });
                    Ok(())
                }
            },
        }
    }

    /// The owner token of a command in the device range locks: unique
    /// across cores.
    pub(super) fn owner(&self, key: usize) -> u64 {
        ((self.core as u64) << 32) | self.cmds[key].seq as u64
    }

    /// COMPARE AND WRITE / ORWRITE: the medium was read into `medium`;
    /// compare or OR with the Data-Out `data`, then write (the range stays
    /// held until the response).
    pub(super) fn combine(&mut self, key: usize, data: SgList, medium: Option<SgList>) {
        let c = &mut self.cmds[key];
        let Plan::ReadModifyWrite {
            offset,
            len,
            fua,
            kind,
            ..
        } = c.plan
        else {
            return;
        };
        let Some(mut medium) = medium else {
            self.respond(key, Response::check(Sense::INTERNAL_TARGET_FAILURE));
            return;
        };
        let len = len as usize;
        let mut d = vec![0u8; data.len()];
        data.copy_out(0, &mut d);
        let mut m = vec![0u8; len];
        medium.copy_out(0, &mut m);
        match kind {
            Rmw::CompareAndWrite => {
                // SBC-4 §5.3: MISCOMPARE with the offset of the first
                // differing byte in INFORMATION; nothing is written.
                if let Some(at) = emulate::first_miscompare(&d[..len], &m) {
                    self.respond(
                        key,
                        Response::check(Sense::MISCOMPARE_DURING_VERIFY.with_info(at as u64)),
                    );
                    return;
                }
                medium.copy_in(0, &d[len..]);
            }
            Rmw::Or => {
                for (a, b) in m.iter_mut().zip(&d) {
                    *a |= *b;
                }
                medium.copy_in(0, &m);
            }
        }
        medium.truncate(len);
        self.submit_op(
            key,
            BlockOp::Write {
                offset,
                buf: medium,
                fua,
            },
        );
    }
}
