//! The gates a command passes before it is planned: a LUN with no logical
//! unit, a sanitize in progress, a pending unit attention, a reservation
//! another nexus holds.

use super::*;

impl SessionState {
    /// Raises the unit attentions device changes made pending for this
    /// nexus at `lun`, then answers in place of the device server if a gate
    /// stops a command of opcode `op`; `None` lets it through.
    pub(super) fn gate(
        &mut self,
        lun: Option<Lun>,
        entry: Option<&LunEntry>,
        op: u8,
    ) -> Option<Response> {
        let (Some(l), Some(e)) = (lun, entry) else {
            // SAM-5 (incorrect logical unit selection): a LUN with no
            // logical unit behind it answers LOGICAL UNIT NOT SUPPORTED.
            return (!crate::ops::serves_unmapped_lun(op))
                .then(|| Response::check(Sense::LOGICAL_UNIT_NOT_SUPPORTED));
        };
        let st = self.lus.entry(l).or_default();
        // SBC-4 §4.10: CAPACITY DATA HAS CHANGED once per nexus after a
        // resize.
        if changed(&mut st.generation, e.device.generation()) {
            st.raise(Sense::CAPACITY_DATA_HAS_CHANGED);
        }
        // SPC-4 §5.12: MODE PARAMETERS CHANGED for the nexuses that did
        // not change them.
        let shared = &e.device.shared;
        if changed(&mut st.mode_gen, shared.mode_gen.load(Ordering::Acquire)) {
            st.raise(Sense::MODE_PARAMETERS_CHANGED);
        }
        if changed(&mut st.reset_gen, shared.reset_gen.load(Ordering::Acquire)) {
            st.raise(Sense::BUS_DEVICE_RESET);
        }
        // SPC-4 §5.15.2.3: ASYMMETRIC ACCESS STATE CHANGED for the nexuses
        // that did not change it.
        let alua = e.device.alua();
        if let Some(dg) = alua
            && changed(&mut st.alua_gen, dg.generation())
        {
            st.raise(Sense::ASYMMETRIC_ACCESS_STATE_CHANGED);
        }
        // SBC-4 §4.15: a removable medium loaded by another nexus:
        // NOT READY TO READY CHANGE, MEDIUM MAY HAVE CHANGED.
        if e.device.flags.removable
            && changed(
                &mut st.medium_gen,
                shared.medium.load_gen.load(Ordering::Acquire),
            )
        {
            st.raise(Sense::NOT_READY_TO_READY_CHANGE);
        }
        // SPC-4 §5.13.11: unit attentions a PERSISTENT RESERVE OUT of
        // another nexus (on any core) raised for this one.
        let mut pr_ua = Vec::new();
        shared.take_pr_ua(&self.nexus.initiator_port, &self.nexus.target, &mut pr_ua);
        for ua in pr_ua {
            st.raise(ua);
        }
        // SBC-4 §4.11.1: while a sanitize runs (on any core) the device
        // server answers little else, and that before a unit attention
        // (libiscsi's Sanitize.Reset: the first command of a new nexus
        // meets SANITIZE IN PROGRESS); after a failed one, media access
        // meets MEDIUM FORMAT CORRUPTED.
        if let Some(sense) = shared.sanitize.gate(op) {
            return Some(Response::check(sense));
        }
        // SAM-5 §5.14: a pending unit attention fails the next command,
        // except INQUIRY, REPORT LUNS and REQUEST SENSE, and is cleared.
        if !crate::ops::passes_unit_attention(op)
            && let Some(ua) = st.ua.pop_front()
        {
            return Some(Response::check(ua));
        }
        // SPC-4 §5.15.2.4: the asymmetric access state of the target port
        // group this nexus's port is in, for this device's group.
        if let Some(dg) = alua
            && let Some(sense) = dg
                .state_of_port(self.nexus.rel_port_id)
                .refuses(crate::ops::served_by_alua(op))
        {
            return Some(Response::check(sense));
        }
        // SPC-4 §5.13.1 table 66: a persistent reservation another nexus
        // holds.
        if shared.pr_reserved.load(Ordering::Acquire)
            && shared
                .pr
                .lock()
                .is_ok_and(|pr| pr.conflicts(&pr_nexus(&self.nexus), op))
        {
            return Some(Response::status(ferrite_scsi::Status::RESERVATION_CONFLICT));
        }
        // SPC-2 §5.5.1: a logical unit reserved by another I_T nexus
        // answers RESERVATION CONFLICT to all but a few commands.
        if !crate::ops::passes_reservation(op)
            && shared.is_reserved()
            && shared.reserved_by_other(&nexus_key(&self.nexus))
        {
            return Some(Response::status(ferrite_scsi::Status::RESERVATION_CONFLICT));
        }
        None
    }
}
