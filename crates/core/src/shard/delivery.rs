//! Delivery holds: reads whose data left as page-cache pages in a pipe,
//! and writes that wait until the initiator has them ([`Action::ConfirmDelivery`]).

use super::*;

/// Reads of a session whose data left as page-cache pages and that the
/// initiator has not yet shown it received ([`DeliveryHold`]).
#[derive(Debug, Default)]
pub(super) struct Deliveries {
    next: u64,
    open: std::collections::BTreeSet<u64>,
}

impl Shard {
    /// A pipe for a read of `len` bytes at `offset` that can travel as
    /// page-cache pages: large enough for the pipe to pay, sent whole, to a
    /// session that takes pipes, from a backend that fills them.
    pub(super) fn read_pipe(
        &mut self,
        key: usize,
        offset: u64,
        len: u32,
        xfer: u32,
    ) -> Option<Pipe> {
        if len < PIPE_READ_MIN || xfer != len {
            return None;
        }
        let c = &self.cmds[key];
        if !self.sessions.get(&c.session).is_some_and(|s| s.pipe_reads) {
            return None;
        }
        if !c.entry.as_ref()?.device.backend.caps().read_pipe {
            return None;
        }
        let pool = self
            .pipes
            .get_or_insert_with(|| PipePool::new(PIPES_IDLE, PIPES_LIVE))
            .as_ref()?;
        if !pool.fits(offset, len as usize) {
            return None;
        }
        pool.get()
    }

    /// A hold on the command's session until the initiator has the
    /// response's pipe data (see [`PipeData`]).
    pub(super) fn delivery_hold(&self, key: usize) -> Option<DeliveryHold> {
        let d = self
            .sessions
            .get(&self.cmds[key].session)?
            .deliveries
            .clone();
        let id = {
            let mut g = d.try_borrow_mut().ok()?;
            let id = g.next;
            g.next += 1;
            g.open.insert(id);
            id
        };
        Some(DeliveryHold::on_drop(move || {
            if let Ok(mut g) = d.try_borrow_mut() {
                g.open.remove(&id);
            }
        }))
    }

    /// Whether every response of the command's session that carried pipe
    /// data before the command started has been delivered. The first time
    /// it is not, the fabric is asked to find out
    /// ([`Action::ConfirmDelivery`]).
    pub(super) fn delivered(&mut self, key: usize) -> bool {
        let c = &mut self.cmds[key];
        let Some(s) = self.sessions.get_mut(&c.session) else {
            return true;
        };
        let Ok(d) = s.deliveries.try_borrow() else {
            return true;
        };
        let first = c.barrier.is_none();
        let barrier = *c.barrier.get_or_insert(d.next);
        let done = d.open.first().is_none_or(|&f| f >= barrier);
        drop(d);
        if !done && first {
            let sid = c.session;
            s.actions.push_back(Action::ConfirmDelivery);
            s.mark_ready(sid, &mut self.ready);
        }
        done
    }
}
