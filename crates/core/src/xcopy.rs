//! The copy manager (SPC-4 §5.16): EXTENDED COPY (LID1) and RECEIVE COPY
//! RESULTS, copying between logical units of this target without moving
//! data over the fabric.
//!
//! Owns: planning both commands, naming copy targets (an identification
//! descriptor is matched against the logical unit designators our VPD page
//! 83h reports for the LUs the I_T nexus sees, on any device), checking
//! each copy target before any data moves (write protection, reservations,
//! capacity), the copy as a state machine ([`CopyRun`]: chunks read from
//! the source device's queue into pool buffers and written to the
//! destination's, at most [`DEPTH`] in flight), and the results held per
//! I_T nexus and list identifier for RECEIVE COPY RESULTS ([`Copies`]).
//! Does not own: the bytes of parameter lists and results
//! ([`ferrite_scsi::xcopy`]) or the backend queues, buffers and task
//! management the shard drives the copy with ([`crate::shard`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ferrite_reactor::buf::{BufPool, SgList};
use ferrite_scsi::xcopy::{self as tpc, ListIdUsage};
use ferrite_scsi::{Opcode, Sense};
use smallvec::SmallVec;

use crate::backend::{BlockError, BlockOp};
use crate::cmd::{DataDir, Residual};
use crate::device::{Device, LunEntry, LunMap};
use crate::emulate::{self, DataCtx, Plan};
use crate::pr::PrNexus;
use crate::shard::SessionId;

/// Bytes one chunk of a copy moves: read into one pool buffer list, then
/// written from it.
pub const CHUNK_BYTES: u64 = 1 << 20;

/// Chunks of one copy in flight at once (each a read or a write).
pub const DEPTH: usize = 8;

/// The largest parameter list fetched: the header, the longest descriptor
/// lists and no inline data (longer lists are refused before any data
/// moves).
const MAX_PARAM_LEN: u32 = 64 << 10;

/// Backend tags of copy operations: bit 30 set (a command's own tags
/// never set it: its slab key is below 2^20; sanitize operations use bit
/// 31), the chunk slot in bits 20..30, the slab key below, the command's
/// sequence number in the high half.
const TAG_BIT: u64 = 1 << 30;
const KEY_BITS: u32 = 20;

/// The backend tag of chunk `slot` of the copy of command `key`/`seq`.
pub(crate) fn tag(key: usize, seq: u32, slot: usize) -> u64 {
    ((seq as u64) << 32) | TAG_BIT | ((slot as u64) << KEY_BITS) | key as u64
}

/// `(key, seq, slot)` of a copy operation's tag; `None` for other tags.
pub(crate) fn untag(tag: u64) -> Option<(usize, u32, usize)> {
    if tag & TAG_BIT == 0 {
        return None;
    }
    if tag & (1 << 31) != 0 {
        return None;
    }
    let low = tag & (TAG_BIT - 1);
    Some((
        (low & ((1 << KEY_BITS) - 1)) as usize,
        (tag >> 32) as u32,
        (low >> KEY_BITS) as usize,
    ))
}

/// SPC-4 §6.4 EXTENDED COPY: the CDB's checks and the Data-Out rule.
pub(crate) fn plan_extended_copy(cdb: &[u8], expected_len: u32, dir: DataDir) -> Plan {
    // SPC-4 §6.4.1: service action 00h is EXTENDED COPY (LID1); LID4 is
    // not supported.
    if cdb[1] & 0x1f != 0 {
        return Plan::Fail(
            Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)),
            Residual::None,
        );
    }
    let param_len = u32::from_be_bytes([cdb[10], cdb[11], cdb[12], cdb[13]]);
    if param_len > MAX_PARAM_LEN {
        return Plan::Fail(Sense::PARAMETER_LIST_LENGTH_ERROR, Residual::None);
    }
    match emulate::data_out_residual(param_len as u64, emulate::data_out_len(expected_len, dir)) {
        // SPC-4 §6.4.1: a PARAMETER LIST LENGTH of zero copies nothing and
        // is not an error.
        Ok(residual) if param_len == 0 => Plan::Good(residual),
        Ok(residual) => Plan::ExtendedCopy {
            param_len,
            residual,
        },
        Err(p) => p,
    }
}

/// SPC-4 §6.23 RECEIVE COPY RESULTS: the LID1 service actions.
pub(crate) fn plan_receive_copy_results(cdb: &[u8]) -> Plan {
    match cdb[1] & 0x1f {
        tpc::rcr::COPY_STATUS
        | tpc::rcr::RECEIVE_DATA
        | tpc::rcr::OPERATING_PARAMETERS
        | tpc::rcr::FAILED_SEGMENT_DETAILS => Plan::CopyResults,
        _ => Plan::Fail(
            Sense::INVALID_FIELD_IN_CDB.cdb_field(1, Some(4)),
            Residual::None,
        ),
    }
}

/// Who asks for a copy: the I_T nexus, the LUs it sees, how reservations
/// name it.
pub(crate) struct Requester<'a> {
    pub luns: &'a LunMap,
    pub port: crate::emulate::PortIds<'a>,
    /// The SPC-2 reservation holder key of the nexus.
    pub spc2: &'a str,
    pub pr: &'a PrNexus,
}

/// Why a copy does not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Check(Sense),
    /// A copy target is reserved by another nexus (as a READ or WRITE from
    /// this nexus to it would be refused).
    Conflict,
}

/// A refused copy, with its list identifier once the header was read.
#[derive(Debug)]
pub(crate) struct Refused {
    pub list: Option<(u8, ListIdUsage)>,
    pub why: Refusal,
}

/// The logical unit designators (association 00b) VPD page 83h reports for
/// `e`: `(code set, designator type, designator)`.
fn lu_designators(e: &LunEntry, r: &Requester<'_>) -> Vec<(u8, u8, Vec<u8>)> {
    let cdb = [Opcode::INQUIRY.0, 0x01, 0x83, 0x10, 0x00, 0x00];
    let ctx = DataCtx {
        entry: Some(e),
        luns: r.luns,
        port: r.port,
        pending: None,
    };
    let mut page = Vec::new();
    if emulate::data_in(&cdb, &ctx, &mut page).is_err() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut at = 4;
    while at + 4 <= page.len() {
        let len = page[at + 3] as usize;
        let Some(body) = page.get(at + 4..at + 4 + len) else {
            break;
        };
        if (page[at + 1] >> 4) & 0x03 == 0 {
            out.push((page[at] & 0x0f, page[at + 1] & 0x0f, body.to_vec()));
        }
        at += 4 + len;
    }
    out
}

/// The LU an identification descriptor names, among those the nexus sees.
fn find_target(t: &tpc::TargetDescriptor, r: &Requester<'_>) -> Option<LunEntry> {
    if t.association != 0 {
        return None;
    }
    r.luns
        .luns
        .values()
        .find(|e| {
            lu_designators(e, r).iter().any(|(cs, ty, body)| {
                *cs == t.code_set
                    && *ty == t.designator_type
                    && body.len() == t.designator_len as usize
                    && body.starts_with(&t.designator)
            })
        })
        .cloned()
}

/// True if a reservation another nexus holds on `e` refuses `op` from `r`
/// (SPC-2 §5.5.1 and SPC-4 §5.13.1 table 66, as for the command itself).
fn reserved_against(e: &LunEntry, r: &Requester<'_>, op: Opcode) -> bool {
    let shared = &e.device.shared;
    if shared.reserved_by_other(r.spc2) {
        return true;
    }
    shared
        .pr_reserved
        .load(std::sync::atomic::Ordering::Acquire)
        && shared.pr.lock().is_ok_and(|pr| pr.conflicts(r.pr, op.0))
}

/// One segment as the copy runs it: byte ranges on two devices.
struct Segment {
    src: Arc<Device>,
    dst: Arc<Device>,
    src_off: u64,
    dst_off: u64,
    len: u64,
    /// Source and destination overlap on one device: one chunk at a time,
    /// from the end when the destination lies above the source, so that
    /// no chunk reads what the copy already overwrote.
    serial: bool,
    backwards: bool,
}

/// Decodes the parameter list and names and checks every copy target and
/// segment (SPC-4 §6.4): nothing is copied unless all of it is valid.
pub(crate) fn prepare(params: &[u8], r: &Requester<'_>) -> Result<CopyRun, Refused> {
    let p = tpc::parse(params).map_err(|s| Refused {
        list: None,
        why: Refusal::Check(s),
    })?;
    let list = Some((p.list_id, p.usage));
    let refuse = |why| Refused { list, why };
    let mut targets = Vec::with_capacity(p.targets.len());
    for t in &p.targets {
        // SPC-4 §5.16.7.2: a copy target the copy manager cannot reach:
        // COPY ABORTED, COPY TARGET DEVICE NOT REACHABLE.
        let Some(e) = find_target(t, r) else {
            return Err(refuse(Refusal::Check(
                Sense::COPY_TARGET_DEVICE_NOT_REACHABLE,
            )));
        };
        // SPC-4 §6.4.5.2.1: DISK BLOCK LENGTH is the copy target's.
        if t.block_len != e.device.geometry().block_size {
            return Err(refuse(Refusal::Check(
                Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(t.at as u16 + 29, None),
            )));
        }
        targets.push(e);
    }
    let mut segs = Vec::with_capacity(p.segments.len());
    for s in &p.segments {
        // A descriptor index with no target descriptor: that copy target
        // cannot be reached (libiscsi's ExtendedCopy.ValidSegDescr).
        let (Some(src), Some(dst)) = (
            targets.get(s.src_index as usize),
            targets.get(s.dst_index as usize),
        ) else {
            return Err(refuse(Refusal::Check(
                Sense::COPY_TARGET_DEVICE_NOT_REACHABLE,
            )));
        };
        // A removable copy target whose medium is ejected cannot be read or
        // written (SBC-4 §4.x NOT READY, MEDIUM NOT PRESENT for a direct
        // command); for the copy manager it is not reachable.
        if !src.device.medium_present() || !dst.device.medium_present() {
            return Err(refuse(Refusal::Check(
                Sense::COPY_TARGET_DEVICE_NOT_REACHABLE,
            )));
        }
        let (sg, dg) = (src.device.geometry(), dst.device.geometry());
        let (sbs, dbs) = (sg.block_size as u64, dg.block_size as u64);
        // SPC-4 §6.4.6.5: NUMBER OF BLOCKS counts destination blocks with
        // DC set, source blocks otherwise; the bytes must be whole blocks
        // on both sides (no residue to pad or discard).
        let len = s.blocks as u64 * if s.dc { dbs } else { sbs };
        if !len.is_multiple_of(sbs) || !len.is_multiple_of(dbs) {
            return Err(refuse(Refusal::Check(Sense::COPY_ABORTED)));
        }
        // SPC-4 §5.16.7.3: a segment past a copy target's capacity ends
        // the copy with COPY ABORTED before it moves anything.
        let in_range = |lba: u64, bs: u64, blocks: u64| {
            lba.checked_add(len / bs).is_some_and(|end| end <= blocks)
        };
        if !in_range(s.src_lba, sbs, sg.num_blocks) || !in_range(s.dst_lba, dbs, dg.num_blocks) {
            return Err(refuse(Refusal::Check(Sense::COPY_ABORTED)));
        }
        // SBC-4 §4.11: the destination is written as a WRITE would write
        // it.
        if dst.write_protected() {
            return Err(refuse(Refusal::Check(Sense::WRITE_PROTECTED)));
        }
        if reserved_against(src, r, Opcode::READ_16) || reserved_against(dst, r, Opcode::WRITE_16) {
            return Err(refuse(Refusal::Conflict));
        }
        let (src_off, dst_off) = (s.src_lba * sbs, s.dst_lba * dbs);
        let overlap = src.device.id == dst.device.id
            && src_off < dst_off + len
            && dst_off < src_off + len
            && src_off != dst_off;
        if len > 0 && !(src.device.id == dst.device.id && src_off == dst_off) {
            segs.push(Segment {
                src: src.device.clone(),
                dst: dst.device.clone(),
                src_off,
                dst_off,
                len,
                serial: overlap,
                backwards: overlap && dst_off > src_off,
            });
        }
    }
    let n = p.segments.len() as u16;
    Ok(CopyRun::new(p.list_id, p.usage, segs, n))
}

/// A chunk's place in the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    /// Reading `len` bytes of segment `seg`; they go to `dst_off`.
    Reading {
        seg: usize,
        dst_off: u64,
    },
    /// Writing `len` bytes of segment `seg`.
    Writing {
        seg: usize,
        len: u64,
    },
}

/// One block operation of a copy, for the shard to submit to `dev`'s queue
/// with [`tag`]`(key, seq, slot)`.
pub(crate) struct Issue {
    pub slot: usize,
    pub dev: Arc<Device>,
    pub op: BlockOp,
}

/// A running copy: what is issued, what is in flight, what is done.
/// Advanced by [`CopyRun::next`] (what to submit now) and
/// [`CopyRun::done`] (a chunk's operation completed); a refused submission
/// is handed back with [`CopyRun::stall`].
pub(crate) struct CopyRun {
    pub list_id: u8,
    pub usage: ListIdUsage,
    segs: Vec<Segment>,
    /// Segment descriptors of the parameter list (COPY STATUS counts them).
    seg_count: u16,
    /// The next segment to issue from, and bytes issued of it.
    seg: usize,
    pos: u64,
    slots: [Slot; DEPTH],
    /// Operations to submit before anything new: writes of chunks just
    /// read, and operations a full queue or a held range handed back.
    ready: VecDeque<Issue>,
    /// Bytes not yet written, per segment.
    left: Vec<u64>,
    bytes_done: u64,
    error: Option<Sense>,
}

impl CopyRun {
    fn new(list_id: u8, usage: ListIdUsage, segs: Vec<Segment>, seg_count: u16) -> CopyRun {
        let left = segs.iter().map(|s| s.len).collect();
        CopyRun {
            list_id,
            usage,
            segs,
            seg_count,
            seg: 0,
            pos: 0,
            slots: [Slot::Free; DEPTH],
            ready: VecDeque::new(),
            left,
            bytes_done: 0,
            error: None,
        }
    }

    /// The next operation to submit, if one may start now.
    pub(crate) fn next(&mut self, pool: &BufPool) -> Option<Issue> {
        if self.error.is_some() {
            self.drop_ready();
            return None;
        }
        if let Some(i) = self.ready.pop_front() {
            return Some(i);
        }
        let s = self.segs.get(self.seg)?;
        let busy = self.slots.iter().any(|x| *x != Slot::Free);
        // Segments are processed in order (SPC-4 §5.16.4): a segment starts
        // once the one before is written, so that it may read what that
        // one wrote; within a segment chunks overlap unless its source and
        // destination do.
        if busy && (s.serial || self.pos == 0) {
            return None;
        }
        let slot = self.slots.iter().position(|x| *x == Slot::Free)?;
        let n = (s.len - self.pos).min(CHUNK_BYTES);
        let at = if s.backwards {
            s.len - self.pos - n
        } else {
            self.pos
        };
        self.slots[slot] = Slot::Reading {
            seg: self.seg,
            dst_off: s.dst_off + at,
        };
        let issue = Issue {
            slot,
            dev: s.src.clone(),
            op: BlockOp::Read {
                offset: s.src_off + at,
                buf: pool.sg(n as usize),
            },
        };
        self.pos += n;
        if self.pos >= s.len {
            self.seg += 1;
            self.pos = 0;
        }
        Some(issue)
    }

    /// A submission refused for now: it goes first next time.
    pub(crate) fn stall(&mut self, i: Issue) {
        self.ready.push_front(i);
    }

    /// The operation of chunk `slot` completed with `result`; its buffer
    /// comes back in `buf`.
    pub(crate) fn done(
        &mut self,
        slot: usize,
        result: Result<(), BlockError>,
        buf: Option<SgList>,
    ) {
        let Some(state) = self.slots.get(slot).copied() else {
            return;
        };
        self.slots[slot] = Slot::Free;
        match (state, result) {
            (Slot::Free, _) => {}
            (Slot::Reading { seg, dst_off }, Ok(())) => {
                let (Some(s), Some(buf)) = (self.segs.get(seg), buf) else {
                    self.fail(Sense::INTERNAL_TARGET_FAILURE);
                    return;
                };
                if self.error.is_some() {
                    return;
                }
                self.slots[slot] = Slot::Writing {
                    seg,
                    len: buf.len() as u64,
                };
                self.ready.push_back(Issue {
                    slot,
                    dev: s.dst.clone(),
                    op: BlockOp::Write {
                        offset: dst_off,
                        buf,
                        fua: false,
                    },
                });
            }
            (Slot::Writing { seg, len }, Ok(())) => {
                self.bytes_done += len;
                if let Some(l) = self.left.get_mut(seg) {
                    *l = l.saturating_sub(len);
                }
            }
            // SPC-4 §5.16.7.3: a copy target's error ends the copy with
            // COPY ABORTED and the copy target's additional sense code.
            (Slot::Reading { .. }, Err(e)) => self.fail(copy_error(e, false)),
            (Slot::Writing { .. }, Err(e)) => self.fail(copy_error(e, true)),
        }
    }

    /// The operation of chunk `slot` could not be submitted at all: the
    /// copy ends with `sense`.
    pub(crate) fn abandon(&mut self, slot: usize, sense: Sense) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = Slot::Free;
        }
        self.fail(sense);
    }

    /// Ends the copy with `sense` once the operations in flight return.
    pub(crate) fn fail(&mut self, sense: Sense) {
        if self.error.is_none() {
            self.error = Some(sense);
        }
        self.drop_ready();
    }

    /// Drops the operations not yet submitted (their buffers go back to
    /// the pool) and frees their slots.
    fn drop_ready(&mut self) {
        for i in self.ready.drain(..) {
            if let Some(s) = self.slots.get_mut(i.slot) {
                *s = Slot::Free;
            }
        }
    }

    /// True if a segment of this copy reads or writes `dev`.
    pub(crate) fn touches(&self, dev: crate::device::DeviceId) -> bool {
        self.segs.iter().any(|s| s.src.id == dev || s.dst.id == dev)
    }

    /// Operations submitted and not yet completed.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        let busy = self.slots.iter().filter(|s| **s != Slot::Free).count();
        busy.saturating_sub(self.ready.len())
    }

    /// True once nothing is in flight and nothing is left (or it failed).
    pub(crate) fn finished(&self) -> bool {
        self.slots.iter().all(|s| *s == Slot::Free)
            && (self.error.is_some() || (self.seg >= self.segs.len() && self.ready.is_empty()))
    }

    /// The outcome, once [`CopyRun::finished`].
    pub(crate) fn outcome(&self) -> Result<(), Sense> {
        match self.error {
            Some(s) => Err(s),
            None => Ok(()),
        }
    }

    /// SEGMENTS PROCESSED: every segment once the copy succeeded, else the
    /// leading segments wholly written.
    pub(crate) fn segments_processed(&self) -> u16 {
        if self.error.is_none() && self.finished() {
            return self.seg_count;
        }
        self.left.iter().take_while(|l| **l == 0).count() as u16
    }

    /// Bytes written so far.
    pub(crate) fn bytes_done(&self) -> u64 {
        self.bytes_done
    }
}

/// The sense a failed block operation of a copy reports: COPY ABORTED with
/// the code the copy target would have given (SPC-4 Annex D).
fn copy_error(e: BlockError, write: bool) -> Sense {
    match e {
        BlockError::Io if write => Sense::COPY_ABORTED_WRITE_ERROR,
        BlockError::Io => Sense::COPY_ABORTED_READ_ERROR,
        BlockError::NoSpace => Sense::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        BlockError::Offline => Sense::COPY_TARGET_DEVICE_NOT_REACHABLE,
        BlockError::Unsupported | BlockError::Os(_) => Sense::COPY_ABORTED,
    }
}

/// What RECEIVE COPY RESULTS reports of a finished copy (SPC-4 §6.23).
#[derive(Clone, Debug)]
struct Held {
    status: u8,
    segments: u16,
    bytes: u64,
    /// Sense data of a failed copy, until FAILED SEGMENT DETAILS reports it.
    sense: Option<SmallVec<[u8; 32]>>,
    status_reported: bool,
}

/// A running copy as RECEIVE COPY RESULTS sees it.
pub(crate) struct Running {
    pub segments: u16,
    pub bytes: u64,
}

/// The copy manager's per-shard state: copies waiting to be pumped again,
/// and results held per I_T nexus (session) and list identifier.
#[derive(Default)]
pub(crate) struct Copies {
    /// Copies (slab key, sequence number) with an operation handed back
    /// (full queue, held range): pumped again at the next poll.
    pub wait: Vec<(usize, u32)>,
    held: HashMap<(SessionId, u8), Held>,
}

impl Copies {
    /// Holds the outcome of a copy with LIST ID USAGE 00b (SPC-4 §6.4.1:
    /// the copy manager holds data for RECEIVE COPY RESULTS; a newer copy
    /// with the same list identifier replaces it).
    pub(crate) fn record(
        &mut self,
        sid: SessionId,
        list: Option<(u8, ListIdUsage)>,
        segments: u16,
        bytes: u64,
        sense: Option<SmallVec<[u8; 32]>>,
    ) {
        let Some((id, ListIdUsage::Hold)) = list else {
            return;
        };
        self.held.insert(
            (sid, id),
            Held {
                status: if sense.is_some() {
                    tpc::copy_status::COMPLETED_ERROR
                } else {
                    tpc::copy_status::COMPLETED_GOOD
                },
                segments,
                bytes,
                sense,
                status_reported: false,
            },
        );
    }

    /// Drops what was held for a session that ended (I_T nexus loss).
    pub(crate) fn forget(&mut self, sid: SessionId) {
        self.held.retain(|(s, _), _| *s != sid);
    }

    /// RECEIVE COPY RESULTS parameter data (SPC-4 §6.23) for `sid`, with
    /// `running` the copy of that list identifier still under way, if any.
    /// Returns the allocation length.
    pub(crate) fn results(
        &mut self,
        sid: SessionId,
        cdb: &[u8],
        running: Option<Running>,
        out: &mut Vec<u8>,
    ) -> Result<u32, Sense> {
        out.clear();
        let sa = cdb[1] & 0x1f;
        let list_id = cdb[2];
        let alloc = u32::from_be_bytes([cdb[10], cdb[11], cdb[12], cdb[13]]);
        if sa == tpc::rcr::OPERATING_PARAMETERS {
            tpc::operating_parameters(out);
            return Ok(alloc);
        }
        // SPC-4 §6.23.1: a list identifier with no copy in progress and
        // nothing held is an INVALID FIELD IN CDB.
        let unknown = Sense::INVALID_FIELD_IN_CDB.cdb_field(2, None);
        if let Some(r) = running {
            match sa {
                tpc::rcr::COPY_STATUS => {
                    tpc::copy_status_data(tpc::copy_status::IN_PROGRESS, r.segments, r.bytes, out)
                }
                tpc::rcr::RECEIVE_DATA => tpc::receive_data(out),
                _ => tpc::failed_segment_details(&[], out),
            }
            return Ok(alloc);
        }
        let key = (sid, list_id);
        let h = self.held.get_mut(&key).ok_or(unknown)?;
        match sa {
            tpc::rcr::COPY_STATUS => {
                tpc::copy_status_data(h.status, h.segments, h.bytes, out);
                h.status_reported = true;
            }
            tpc::rcr::RECEIVE_DATA => tpc::receive_data(out),
            _ => {
                let sense = h.sense.take().unwrap_or_default();
                tpc::failed_segment_details(&sense, out);
            }
        }
        // Held data is discarded once reported (SPC-4 §6.23.3, §6.23.6).
        if h.status_reported && h.sense.is_none() {
            self.held.remove(&key);
        }
        Ok(alloc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, BackendError, BackendQueue, Caps, Geometry};
    use crate::device::{DeviceFlags, DeviceId, Identity};
    use crate::testing::Shaped;
    use ferrite_scsi::Lun;

    fn dev(id: u32, naa: u64, bs: u32, blocks: u64) -> Arc<Device> {
        Arc::new(Device::new(
            DeviceId(id),
            format!("d{id}"),
            Arc::new(Shaped(
                Geometry {
                    block_size: bs,
                    num_blocks: blocks,
                    phys_exp: 0,
                },
                Caps::default(),
            )),
            Identity {
                vendor: "FERRITE".into(),
                product: "disk".into(),
                revision: "0.1".into(),
                serial: format!("s{id}"),
                naa: naa.to_be_bytes().to_vec(),
                eui64: Vec::new(),
                ..Identity::default()
            },
            DeviceFlags::default(),
        ))
    }

    fn map(devs: &[(u16, Arc<Device>, bool)]) -> LunMap {
        let mut m = LunMap::default();
        for (lun, d, ro) in devs {
            m.luns.insert(
                Lun(*lun),
                LunEntry {
                    device: d.clone(),
                    read_only: *ro,
                },
            );
        }
        m
    }

    fn ident(naa: u64, bs: u32) -> Vec<u8> {
        let mut d = vec![0u8; 32];
        d[0] = 0xe4;
        d[4] = 1;
        d[5] = 3;
        d[7] = 8;
        d[8..16].copy_from_slice(&naa.to_be_bytes());
        d[29..32].copy_from_slice(&bs.to_be_bytes()[1..]);
        d
    }

    fn params(targets: &[Vec<u8>], segs: &[(u16, u16, u16, u64, u64)], usage: u8) -> Vec<u8> {
        let mut v = vec![0u8; 16];
        v[0] = 7;
        v[1] = usage << 3;
        v[2..4].copy_from_slice(&((targets.len() * 32) as u16).to_be_bytes());
        v[8..12].copy_from_slice(&((segs.len() * 28) as u32).to_be_bytes());
        for t in targets {
            v.extend_from_slice(t);
        }
        for &(s, d, n, sl, dl) in segs {
            let mut b = vec![0u8; 28];
            b[0] = 2;
            b[3] = 0x18;
            b[4..6].copy_from_slice(&s.to_be_bytes());
            b[6..8].copy_from_slice(&d.to_be_bytes());
            b[10..12].copy_from_slice(&n.to_be_bytes());
            b[12..20].copy_from_slice(&sl.to_be_bytes());
            b[20..28].copy_from_slice(&dl.to_be_bytes());
            v.extend(b);
        }
        v
    }

    const A: u64 = 0x5001_4050_0000_00a1;
    const B: u64 = 0x5001_4050_0000_00b2;

    fn requester<'a>(luns: &'a LunMap, pr: &'a PrNexus) -> Requester<'a> {
        Requester {
            luns,
            port: crate::emulate::PortIds {
                rel_port: 1,
                target: "iqn.t",
                target_port: "",
                protocol: None,
            },
            spc2: "i|t",
            pr,
        }
    }

    fn pr() -> PrNexus {
        PrNexus {
            initiator_port: "i".into(),
            target: "t".into(),
            rel_port: 1,
        }
    }

    fn refusal(r: Result<CopyRun, Refused>) -> Refusal {
        match r {
            Ok(_) => panic!("copy accepted"),
            Err(e) => e.why,
        }
    }

    #[test]
    fn names_targets_by_designator_on_any_device() {
        let m = map(&[
            (0, dev(1, A, 512, 1000), false),
            (1, dev(2, B, 512, 1000), false),
        ]);
        let pr = pr();
        let r = requester(&m, &pr);
        let p = params(&[ident(A, 512), ident(B, 512)], &[(0, 1, 16, 0, 100)], 0);
        let run = prepare(&p, &r).unwrap();
        assert_eq!(run.segs.len(), 1);
        let s = &run.segs[0];
        assert_eq!((s.src.id, s.dst.id), (DeviceId(1), DeviceId(2)));
        assert_eq!((s.src_off, s.dst_off, s.len), (0, 51200, 8192));
        assert!(!s.serial);
        // A designator no LU of this nexus reports.
        let p = params(&[ident(A + 7, 512)], &[(0, 0, 1, 0, 1)], 0);
        assert_eq!(
            refusal(prepare(&p, &r)),
            Refusal::Check(Sense::COPY_TARGET_DEVICE_NOT_REACHABLE)
        );
        // A segment naming a descriptor that is not there.
        let p = params(&[ident(A, 512)], &[(0, 1, 1, 0, 1)], 0);
        assert_eq!(
            refusal(prepare(&p, &r)),
            Refusal::Check(Sense::COPY_TARGET_DEVICE_NOT_REACHABLE)
        );
        // A block length that is not the LU's.
        let p = params(&[ident(A, 4096)], &[(0, 0, 1, 0, 1)], 0);
        assert_eq!(
            refusal(prepare(&p, &r)),
            Refusal::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST.param_field(16 + 29, None))
        );
    }

    #[test]
    fn checks_capacity_protection_and_reservations() {
        let a = dev(1, A, 512, 1000);
        let m = map(&[(0, a.clone(), false), (1, dev(2, B, 512, 1000), true)]);
        let pr = pr();
        let r = requester(&m, &pr);
        let p = params(&[ident(A, 512)], &[(0, 0, 2048, 0, 999)], 0);
        assert_eq!(
            refusal(prepare(&p, &r)),
            Refusal::Check(Sense::COPY_ABORTED)
        );
        let p = params(&[ident(A, 512)], &[(0, 0, 10, 995, 0)], 0);
        assert_eq!(
            refusal(prepare(&p, &r)),
            Refusal::Check(Sense::COPY_ABORTED)
        );
        // Reading from a read-only LU is fine, writing to it is not.
        let p = params(&[ident(B, 512), ident(A, 512)], &[(0, 1, 10, 0, 0)], 0);
        assert!(prepare(&p, &r).is_ok());
        let p = params(&[ident(A, 512), ident(B, 512)], &[(0, 1, 10, 0, 0)], 0);
        assert_eq!(
            refusal(prepare(&p, &r)),
            Refusal::Check(Sense::WRITE_PROTECTED)
        );
        // An SPC-2 reservation of another nexus on a copy target.
        assert!(a.shared.reserve("other|t", &None));
        let p = params(&[ident(A, 512)], &[(0, 0, 10, 0, 100)], 0);
        assert_eq!(refusal(prepare(&p, &r)), Refusal::Conflict);
        a.shared.release(None);
        assert!(a.shared.reserve("i|t", &None));
        assert!(prepare(&p, &r).is_ok());
    }

    #[test]
    fn an_ejected_copy_target_is_not_reachable() {
        let d = Arc::new(Device::new(
            DeviceId(3),
            "r",
            Arc::new(Shaped(
                Geometry {
                    block_size: 512,
                    num_blocks: 1000,
                    phys_exp: 0,
                },
                Caps::default(),
            )),
            Identity {
                vendor: "FERRITE".into(),
                product: "disk".into(),
                revision: "0.1".into(),
                serial: "s3".into(),
                naa: A.to_be_bytes().to_vec(),
                eui64: Vec::new(),
                ..Identity::default()
            },
            DeviceFlags {
                removable: true,
                ..DeviceFlags::default()
            },
        ));
        let m = map(&[(0, d.clone(), false)]);
        let pr = pr();
        let r = requester(&m, &pr);
        let p = params(&[ident(A, 512)], &[(0, 0, 10, 0, 100)], 0);
        assert!(prepare(&p, &r).is_ok());
        assert_eq!(d.shared.medium.load_eject(false), Ok(false));
        assert_eq!(
            refusal(prepare(&p, &r)),
            Refusal::Check(Sense::COPY_TARGET_DEVICE_NOT_REACHABLE)
        );
        assert_eq!(d.shared.medium.load_eject(true), Ok(true));
        assert!(prepare(&p, &r).is_ok());
    }

    #[test]
    fn overlapping_ranges_copy_serially_from_the_right_end() {
        let m = map(&[(0, dev(1, A, 512, 100_000), false)]);
        let pr = pr();
        let r = requester(&m, &pr);
        let p = params(&[ident(A, 512)], &[(0, 0, 8192, 0, 4096)], 0);
        let mut run = prepare(&p, &r).unwrap();
        assert!(run.segs[0].serial && run.segs[0].backwards);
        let pool = BufPool::new(64 << 10, 64);
        let first = run.next(&pool).unwrap();
        // From the end: the last chunk of the 4 MiB source first.
        match &first.op {
            BlockOp::Read { offset, buf } => {
                assert_eq!(*offset, (8192 * 512) - CHUNK_BYTES);
                assert_eq!(buf.len() as u64, CHUNK_BYTES);
            }
            other => panic!("{other:?}"),
        }
        // Nothing else starts while it is in flight.
        assert!(run.next(&pool).is_none());
        let BlockOp::Read { buf, .. } = first.op else {
            panic!()
        };
        run.done(first.slot, Ok(()), Some(buf));
        let w = run.next(&pool).unwrap();
        match &w.op {
            BlockOp::Write { offset, .. } => {
                assert_eq!(*offset, 4096 * 512 + (8192 * 512) - CHUNK_BYTES)
            }
            other => panic!("{other:?}"),
        }
        assert!(run.next(&pool).is_none());
    }

    #[test]
    fn pipelines_chunks_and_reports_progress() {
        let m = map(&[
            (0, dev(1, A, 512, 100_000), false),
            (1, dev(2, B, 512, 100_000), false),
        ]);
        let pr = pr();
        let r = requester(&m, &pr);
        // 3 MiB + 512 bytes: four chunks.
        let p = params(
            &[ident(A, 512), ident(B, 512)],
            &[(0, 1, 6145, 0, 0), (0, 1, 0, 0, 0)],
            0,
        );
        let mut run = prepare(&p, &r).unwrap();
        let pool = BufPool::new(64 << 10, 64);
        let mut reads = Vec::new();
        while let Some(i) = run.next(&pool) {
            reads.push(i);
        }
        assert_eq!(reads.len(), 4);
        assert_eq!(run.in_flight(), 4);
        assert!(!run.finished());
        for i in reads {
            let BlockOp::Read { buf, .. } = i.op else {
                panic!()
            };
            run.done(i.slot, Ok(()), Some(buf));
        }
        let mut writes = Vec::new();
        while let Some(i) = run.next(&pool) {
            assert!(matches!(i.op, BlockOp::Write { .. }));
            assert_eq!(i.dev.id, DeviceId(2));
            writes.push(i);
        }
        assert_eq!(writes.len(), 4);
        // One write refused by a full queue goes first next time.
        let last = writes.pop().unwrap();
        run.stall(last);
        let again = run.next(&pool).unwrap();
        writes.push(again);
        for i in writes {
            run.done(i.slot, Ok(()), None);
        }
        assert!(run.finished());
        assert_eq!(run.outcome(), Ok(()));
        assert_eq!(run.bytes_done(), 6145 * 512);
        assert_eq!(run.segments_processed(), 2);
    }

    #[test]
    fn a_failed_chunk_aborts_the_copy() {
        let m = map(&[
            (0, dev(1, A, 512, 100_000), false),
            (1, dev(2, B, 512, 100_000), false),
        ]);
        let pr = pr();
        let r = requester(&m, &pr);
        let p = params(&[ident(A, 512), ident(B, 512)], &[(0, 1, 4096, 0, 0)], 0);
        let mut run = prepare(&p, &r).unwrap();
        let pool = BufPool::new(64 << 10, 64);
        let a = run.next(&pool).unwrap();
        let b = run.next(&pool).unwrap();
        run.done(a.slot, Err(BlockError::Io), None);
        assert!(run.next(&pool).is_none());
        assert!(!run.finished());
        let BlockOp::Read { buf, .. } = b.op else {
            panic!()
        };
        run.done(b.slot, Ok(()), Some(buf));
        assert!(run.next(&pool).is_none());
        assert!(run.finished());
        assert_eq!(run.outcome(), Err(Sense::COPY_ABORTED_READ_ERROR));
        assert_eq!(run.segments_processed(), 0);
    }

    #[test]
    fn held_results_per_nexus_and_list() {
        let mut c = Copies::default();
        let cdb = |sa: u8, id: u8| {
            let mut v = [0u8; 16];
            v[0] = 0x84;
            v[1] = sa;
            v[2] = id;
            v[13] = 0xff;
            v
        };
        let mut out = Vec::new();
        let s1 = SessionId(1);
        assert_eq!(
            c.results(s1, &cdb(0, 1), None, &mut out),
            Err(Sense::INVALID_FIELD_IN_CDB.cdb_field(2, None))
        );
        // LIST ID USAGE 10b holds nothing.
        c.record(s1, Some((1, ListIdUsage::Discard)), 1, 512, None);
        assert!(c.results(s1, &cdb(0, 1), None, &mut out).is_err());
        c.record(s1, Some((1, ListIdUsage::Hold)), 1, 512, None);
        // Another nexus does not see it.
        assert!(c.results(SessionId(2), &cdb(0, 1), None, &mut out).is_err());
        assert_eq!(c.results(s1, &cdb(0, 1), None, &mut out), Ok(255));
        assert_eq!(out, [0, 0, 0, 8, 1, 0, 1, 0, 0, 0, 2, 0]);
        // Reported once, then discarded.
        assert!(c.results(s1, &cdb(0, 1), None, &mut out).is_err());
        // A failed copy keeps its sense for FAILED SEGMENT DETAILS.
        let sense = SmallVec::from_slice(&Sense::COPY_ABORTED.to_fixed());
        c.record(s1, Some((2, ListIdUsage::Hold)), 0, 0, Some(sense));
        c.results(s1, &cdb(0, 2), None, &mut out).unwrap();
        assert_eq!(out[4], 2);
        c.results(s1, &cdb(4, 2), None, &mut out).unwrap();
        assert_eq!(out.len(), 60 + 18);
        assert_eq!(out[60 + 2], 0x0a);
        assert!(c.results(s1, &cdb(0, 2), None, &mut out).is_err());
        // In progress.
        let r = Running {
            segments: 0,
            bytes: 1024,
        };
        c.results(s1, &cdb(0, 9), Some(r), &mut out).unwrap();
        assert_eq!(out[4], 0);
        c.results(s1, &cdb(3, 0), None, &mut out).unwrap();
        assert_eq!(out.len(), 46);
        c.record(s1, Some((3, ListIdUsage::Hold)), 1, 1, None);
        c.forget(s1);
        assert!(c.results(s1, &cdb(0, 3), None, &mut out).is_err());
    }

    // ----- through a shard, the way a fabric and a reactor drive it -----

    mod shard {
        use std::collections::VecDeque;
        use std::sync::Mutex;
        use std::time::Instant;

        use super::*;
        use crate::backend::{BlockDone, Busy};
        use crate::cmd::{
            Action, CmdRequest, Response, TaskAttr, TaskTag, TmfFunction, TmfRequest, TmfResponse,
        };
        use crate::shard::{Nexus, Shard};
        use ferrite_scsi::Status;

        /// Device memory plus what the test tells its queues: a depth past
        /// which submit is Busy, and whether completions are withheld.
        struct Ctl {
            data: Vec<u8>,
            depth: usize,
            hold: bool,
            busy: usize,
        }

        struct Mem(Arc<Mutex<Ctl>>);
        struct MemQ(Arc<Mutex<Ctl>>, VecDeque<(u64, BlockOp)>);

        impl Backend for Mem {
            fn geometry(&self) -> Geometry {
                Geometry {
                    block_size: 512,
                    num_blocks: self.0.lock().unwrap().data.len() as u64 / 512,
                    phys_exp: 0,
                }
            }
            fn caps(&self) -> Caps {
                Caps::default()
            }
            fn open_queue(&self, _: u32) -> Result<Box<dyn BackendQueue>, BackendError> {
                Ok(Box::new(MemQ(self.0.clone(), VecDeque::new())))
            }
        }

        impl BackendQueue for MemQ {
            fn submit(&mut self, tag: u64, op: BlockOp) -> Result<(), Busy<BlockOp>> {
                let mut c = self.0.lock().unwrap();
                if self.1.len() >= c.depth {
                    c.busy += 1;
                    return Err(Busy(op));
                }
                self.1.push_back((tag, op));
                Ok(())
            }
            fn poll(&mut self, out: &mut Vec<BlockDone>) {
                let mut c = self.0.lock().unwrap();
                if c.hold {
                    return;
                }
                while let Some((tag, op)) = self.1.pop_front() {
                    let buf = match op {
                        BlockOp::Read { offset, mut buf } => {
                            let o = offset as usize;
                            let n = buf.len();
                            buf.copy_in(0, &c.data[o..o + n]);
                            Some(buf)
                        }
                        BlockOp::Write { offset, buf, .. } => {
                            let v = buf.to_vec();
                            let o = offset as usize;
                            c.data[o..o + v.len()].copy_from_slice(&v);
                            Some(buf)
                        }
                        _ => None,
                    };
                    out.push(BlockDone {
                        tag,
                        result: Ok(()),
                        buf,
                        pipe: None,
                    });
                }
            }
            fn in_flight(&self) -> usize {
                self.1.len()
            }
        }

        struct H {
            shard: Shard,
            sid: SessionId,
            now: Instant,
            ctl: [Arc<Mutex<Ctl>>; 2],
            next: u64,
        }

        fn mem_dev(id: u32, naa: u64, ctl: &Arc<Mutex<Ctl>>) -> Arc<Device> {
            Arc::new(Device::new(
                DeviceId(id),
                format!("m{id}"),
                Arc::new(Mem(ctl.clone())),
                Identity {
                    vendor: "FERRITE".into(),
                    product: "mem".into(),
                    revision: "0.1".into(),
                    serial: format!("m{id}"),
                    naa: naa.to_be_bytes().to_vec(),
                    eui64: Vec::new(),
                    ..Identity::default()
                },
                DeviceFlags::default(),
            ))
        }

        fn h(depth: usize) -> H {
            let size = 8 << 20;
            let src: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4099) as u8).collect();
            let ctl = [
                Arc::new(Mutex::new(Ctl {
                    data: src,
                    depth,
                    hold: false,
                    busy: 0,
                })),
                Arc::new(Mutex::new(Ctl {
                    data: vec![0; size],
                    depth,
                    hold: false,
                    busy: 0,
                })),
            ];
            let m = map(&[
                (0, mem_dev(1, A, &ctl[0]), false),
                (1, mem_dev(2, B, &ctl[1]), false),
            ]);
            let now = Instant::now();
            let mut shard = Shard::new(0, BufPool::new(64 << 10, 256));
            let nexus = Nexus {
                initiator: "iqn.i".into(),
                initiator_port: "iqn.i,i,0x1".into(),
                target: "iqn.t".into(),
                rel_port_id: 1,
                target_port: String::new(),
                protocol: None,
            };
            let sid = shard.open_session(now, nexus, Arc::new(m), false);
            let mut h = H {
                shard,
                sid,
                now,
                ctl,
                next: 1,
            };
            // The power-on unit attention of LUN 1.
            h.submit(1, &[0; 6], &[]);
            let _ = h.wait();
            h
        }

        impl H {
            /// Submits `cdb` to `lun` with `data` as Data-Out.
            fn submit(&mut self, lun: u16, cdb: &[u8], data: &[u8]) -> TaskTag {
                let tag = TaskTag(self.next);
                self.next += 1;
                let req = CmdRequest {
                    lun: Lun(lun),
                    lun_raw: [0; 8],
                    tag,
                    cdb: crate::cmd::Cdb::from_slice(cdb),
                    attr: TaskAttr::Simple,
                    dir: if data.is_empty() {
                        DataDir::Read
                    } else {
                        DataDir::Write
                    },
                    expected_len: if data.is_empty() {
                        255
                    } else {
                        data.len() as u32
                    },
                    expected_read_len: 0,
                };
                let now = self.now;
                let mut s = self.shard.session(self.sid).unwrap();
                s.submit(now, req);
                if !data.is_empty() {
                    match s.poll_action() {
                        Some(Action::FetchData { id, mut buf, .. }) => {
                            buf.copy_in(0, data);
                            s.data_out_done(id, Ok(buf));
                        }
                        other => panic!("{other:?}"),
                    }
                }
                tag
            }

            /// Polls until an action comes out (or 10000 rounds pass).
            fn wait(&mut self) -> Option<Action> {
                for _ in 0..10_000 {
                    if let Some(a) = self.shard.session(self.sid).unwrap().poll_action() {
                        if let Action::Respond { id, .. } = &a {
                            self.shard.session(self.sid).unwrap().response_sent(*id);
                        }
                        return Some(a);
                    }
                    self.shard.poll(self.now);
                }
                None
            }

            fn response(&mut self) -> Response {
                match self.wait() {
                    Some(Action::Respond { rsp, .. }) => rsp,
                    other => panic!("{other:?}"),
                }
            }
        }

        fn xcopy_cdb(len: usize) -> [u8; 16] {
            let mut c = [0u8; 16];
            c[0] = 0x83;
            c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
            c
        }

        #[test]
        fn copies_between_devices_through_full_queues() {
            let mut h = h(2);
            // 3 MiB + 4 KiB from LBA 8 of device 1 to LBA 100 of device 2.
            let p = params(&[ident(A, 512), ident(B, 512)], &[(0, 1, 6152, 8, 100)], 0);
            h.submit(1, &xcopy_cdb(p.len()), &p);
            let rsp = h.response();
            assert_eq!(rsp.status, Status::GOOD, "{:?}", rsp.sense);
            let src = h.ctl[0].lock().unwrap().data[8 * 512..(8 + 6152) * 512].to_vec();
            let dst = h.ctl[1].lock().unwrap().data[100 * 512..(100 + 6152) * 512].to_vec();
            assert!(src == dst, "copied data differs");
            assert!(
                h.ctl[1].lock().unwrap().data[..100 * 512]
                    .iter()
                    .all(|&b| b == 0)
            );
            // A queue of two made the copy wait, not fail.
            assert!(h.ctl[0].lock().unwrap().busy + h.ctl[1].lock().unwrap().busy > 0);
            // RECEIVE COPY RESULTS, COPY STATUS of list 7.
            let mut rcr = [0u8; 16];
            rcr[0] = 0x84;
            rcr[2] = 7;
            rcr[13] = 12;
            h.submit(1, &rcr, &[]);
            let rsp = h.response();
            let data = rsp.data.unwrap().to_vec();
            assert_eq!(&data[4..12], &[1, 0, 1, 0, 0x00, 0x30, 0x10, 0x00]);
        }

        #[test]
        fn abort_task_waits_for_the_chunks_in_flight() {
            let mut h = h(64);
            h.ctl[0].lock().unwrap().hold = true;
            let p = params(&[ident(A, 512), ident(B, 512)], &[(0, 1, 8192, 0, 0)], 0);
            let tag = h.submit(1, &xcopy_cdb(p.len()), &p);
            for _ in 0..10 {
                h.shard.poll(h.now);
            }
            let now = h.now;
            h.shard.session(h.sid).unwrap().task_mgmt(
                now,
                TmfRequest {
                    func: TmfFunction::AbortTask { tag },
                    lun: Lun(1),
                    tag: TaskTag(999),
                },
            );
            // Nothing answers while the source's reads are held.
            for _ in 0..10 {
                h.shard.poll(h.now);
                assert!(h.shard.session(h.sid).unwrap().poll_action().is_none());
            }
            h.ctl[0].lock().unwrap().hold = false;
            match h.wait() {
                Some(Action::TmfDone { rsp, .. }) => assert_eq!(rsp, TmfResponse::Complete),
                other => panic!("{other:?}"),
            }
            // No status for the aborted copy, and nothing was written.
            for _ in 0..10 {
                h.shard.poll(h.now);
                assert!(h.shard.session(h.sid).unwrap().poll_action().is_none());
            }
            assert!(h.ctl[1].lock().unwrap().data.iter().all(|&b| b == 0));
        }

        #[test]
        fn a_reset_of_the_source_lu_aborts_the_copy() {
            let mut h = h(64);
            h.ctl[0].lock().unwrap().hold = true;
            let p = params(&[ident(A, 512), ident(B, 512)], &[(0, 1, 8192, 0, 0)], 0);
            h.submit(1, &xcopy_cdb(p.len()), &p);
            for _ in 0..10 {
                h.shard.poll(h.now);
            }
            // LOGICAL UNIT RESET of LUN 0, the copy's source (the copy
            // itself runs in LUN 1's task set).
            let now = h.now;
            h.shard.session(h.sid).unwrap().task_mgmt(
                now,
                TmfRequest {
                    func: TmfFunction::LogicalUnitReset,
                    lun: Lun(0),
                    tag: TaskTag(999),
                },
            );
            match h.wait() {
                Some(Action::TmfDone { rsp, .. }) => assert_eq!(rsp, TmfResponse::Complete),
                other => panic!("{other:?}"),
            }
            h.ctl[0].lock().unwrap().hold = false;
            let rsp = h.response();
            assert_eq!(rsp.status, Status::CHECK_CONDITION);
            assert_eq!(rsp.sense.as_deref().map(|s| s[2] & 0x0f), Some(0x0a));
            assert!(h.ctl[1].lock().unwrap().data.iter().all(|&b| b == 0));
        }

        #[test]
        fn copies_that_hold_nothing_may_share_a_list_id() {
            let mut h = h(64);
            h.ctl[0].lock().unwrap().hold = true;
            // LIST ID USAGE 10b, list identifier 1, twice (as QEMU sends).
            let p = params(&[ident(A, 512), ident(B, 512)], &[(0, 1, 64, 0, 0)], 2);
            h.submit(1, &xcopy_cdb(p.len()), &p);
            h.submit(1, &xcopy_cdb(p.len()), &p);
            h.ctl[0].lock().unwrap().hold = false;
            assert_eq!(h.response().status, Status::GOOD);
            assert_eq!(h.response().status, Status::GOOD);
        }

        #[test]
        fn a_second_copy_with_the_list_id_in_use_is_refused() {
            let mut h = h(64);
            h.ctl[0].lock().unwrap().hold = true;
            let p = params(&[ident(A, 512), ident(B, 512)], &[(0, 1, 64, 0, 0)], 0);
            h.submit(1, &xcopy_cdb(p.len()), &p);
            h.submit(1, &xcopy_cdb(p.len()), &p);
            let rsp = h.response();
            assert_eq!(
                rsp.sense.as_deref().map(|s| (s[2], s[12], s[13])),
                Some((0x05, 0x00, 0x16))
            );
            // COPY STATUS reports the first in progress.
            let mut rcr = [0u8; 16];
            rcr[0] = 0x84;
            rcr[2] = 7;
            rcr[13] = 12;
            h.submit(1, &rcr, &[]);
            let data = h.response().data.unwrap().to_vec();
            assert_eq!(data[4], 0);
            h.ctl[0].lock().unwrap().hold = false;
            assert_eq!(h.response().status, Status::GOOD);
        }
    }

    #[test]
    fn tags_round_trip() {
        let t = tag(0xf_ffff, 0xdead_beef, 7);
        assert_eq!(untag(t), Some((0xf_ffff, 0xdead_beef, 7)));
        assert_eq!(untag((5u64 << 32) | 3), None);
        assert_eq!(untag((5u64 << 32) | (1 << 31) | 3), None);
    }

    #[test]
    fn plans() {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x83;
        assert_eq!(
            plan_extended_copy(&cdb, 0, DataDir::None),
            Plan::Good(Residual::None)
        );
        cdb[13] = 76;
        assert_eq!(
            plan_extended_copy(&cdb, 76, DataDir::Write),
            Plan::ExtendedCopy {
                param_len: 76,
                residual: Residual::None
            }
        );
        cdb[1] = 1;
        assert!(matches!(
            plan_extended_copy(&cdb, 76, DataDir::Write),
            Plan::Fail(..)
        ));
        let mut r = [0u8; 16];
        r[0] = 0x84;
        r[1] = 3;
        assert_eq!(plan_receive_copy_results(&r), Plan::CopyResults);
        r[1] = 5;
        assert!(matches!(plan_receive_copy_results(&r), Plan::Fail(..)));
    }
}
