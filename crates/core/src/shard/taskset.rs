//! Task-set ordering (SAM-5 §8.6): one task set per I_T nexus and LU;
//! HEAD OF QUEUE, ORDERED and SIMPLE tasks.

use super::*;

impl LuState {
    pub(super) fn raise(&mut self, s: Sense) {
        if self.ua.contains(&s) {
            return;
        }
        if self.ua.len() >= UA_QUEUE_MAX {
            self.ua.pop_front();
        }
        self.ua.push_back(s);
    }

    /// SAM-5 §8.6 for task `key` of attribute `attr`, already in `tasks`,
    /// where this set alone decides: HEAD OF QUEUE at once, ORDERED when
    /// first, SIMPLE when no ORDERED task is in the set. `None`: a SIMPLE
    /// task with ORDERED ones in the set, which runs only if none is older.
    pub(super) fn admits(&self, key: usize, attr: TaskAttr) -> Option<bool> {
        match attr {
            TaskAttr::HeadOfQueue => Some(true),
            TaskAttr::Ordered => Some(self.tasks.front() == Some(&key)),
            TaskAttr::Simple | TaskAttr::Aca => (self.ordered == 0).then_some(true),
        }
    }
}

impl Shard {
    pub(super) fn lu_mut(&mut self, key: usize) -> Option<&mut LuState> {
        let c = self.cmds.get(key)?;
        let (sid, lun) = (c.session, c.lun);
        self.sessions.get_mut(&sid)?.lus.get_mut(&lun)
    }

    /// SAM-5 §8.6: may this task start? HEAD OF QUEUE at once; SIMPLE when no
    /// older ORDERED task is active; ORDERED when no older task is active.
    pub(super) fn may_start(&self, key: usize) -> bool {
        let Some(c) = self.cmds.get(key) else {
            return false;
        };
        if !c.in_task_set {
            return true;
        }
        let Some(st) = self
            .sessions
            .get(&c.session)
            .and_then(|s| s.lus.get(&c.lun))
        else {
            return true;
        };
        if let Some(decided) = st.admits(key, c.attr) {
            return decided;
        }
        // A SIMPLE task among ORDERED ones: it runs if none is older.
        for &k in &st.tasks {
            if k == key {
                return true;
            }
            if self
                .cmds
                .get(k)
                .is_some_and(|o| o.attr == TaskAttr::Ordered)
            {
                return false;
            }
        }
        true
    }

    pub(super) fn leave_task_set(&mut self, key: usize) {
        let Some(c) = self.cmds.get_mut(key) else {
            return;
        };
        if !c.in_task_set {
            return;
        }
        c.in_task_set = false;
        let ordered = c.attr == TaskAttr::Ordered;
        let (sid, lun) = (c.session, c.lun);
        let Some(st) = self
            .sessions
            .get_mut(&sid)
            .and_then(|s| s.lus.get_mut(&lun))
        else {
            return;
        };
        if let Some(pos) = st.tasks.iter().position(|&k| k == key) {
            st.tasks.remove(pos);
        }
        if ordered {
            st.ordered = st.ordered.saturating_sub(1);
        } else if st.ordered == 0 {
            // Only an ORDERED task in the set blocks others (`may_start`):
            // with none there before this one left, none waits.
            return;
        }
        // Unblock younger tasks that may now run.
        let cmds = &self.cmds;
        let blocked: SmallVec<[usize; 16]> = st
            .tasks
            .iter()
            .copied()
            .filter(|&k| {
                cmds.get(k)
                    .is_some_and(|c| matches!(c.state, CmdState::Blocked))
            })
            .collect();
        for k in blocked {
            self.admit(k);
        }
    }

    /// Starts a `New` or `Blocked` command if its task set lets it (SAM-5
    /// §8.6), or leaves it `Blocked` until an older task leaves the set.
    pub(super) fn admit(&mut self, key: usize) {
        let Some(c) = self.cmds.get(key) else {
            return;
        };
        if !matches!(c.state, CmdState::New | CmdState::Blocked) {
            return;
        }
        if !self.may_start(key) {
            self.advance(key, CmdState::Blocked);
            return;
        }
        self.start(key);
    }
}
