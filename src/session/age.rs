//! Age truncation ("keep only the last N days"): the messages whose `ts` is
//! older than `now - maxage` leave the session on every write and are never
//! shown by a read, even before the next write.
//!
//! Writes evict with the op's own `now`, so a replica or an AOF replay
//! evicts exactly what the master did. Reads filter with the server's clock
//! through [`Session::live`], which leaves the session itself untouched (a
//! read-only command must not change what replicas hold).

use std::borrow::Cow;

use super::{Session, Settings};

impl Session {
    /// The earliest `ts` a message may have at `now` and stay, or `None`
    /// when the session has no age limit.
    pub fn age_cutoff(&self, now: i64) -> Option<i64> {
        self.settings.age_cutoff(now)
    }

    /// Which messages an eviction at `now` removes (true = evicted), or
    /// `None` when none goes. Tool groups (a message and the tool results
    /// right after it) leave together: a group goes when every message of
    /// it is older than the cutoff, wherever it is (timestamps may be mixed:
    /// TS option), so a result never ages out while its call is held, nor a
    /// call while a result is. When `protect_newest` (an append never evicts
    /// its own message) the newest group is spared; the next write takes it.
    pub(super) fn aged(&self, now: i64, protect_newest: bool) -> Option<Vec<bool>> {
        let cutoff = self.age_cutoff(now)?;
        // The common case, nothing old: one pass, no allocation.
        if !self.messages.heads().any(|h| h.ts < cutoff) {
            return None;
        }
        let len = self.messages.len();
        let spared_from = if protect_newest {
            len - self.newest_group_len()
        } else {
            len
        };
        let old: Vec<bool> = self.messages.heads().map(|h| h.ts < cutoff).collect();
        let young = old.iter().position(|o| !o).unwrap_or(len);
        if old[young..].iter().all(|o| !o) {
            return self.aged_prefix(young, spared_from);
        }
        self.aged_groups(&old, spared_from)
    }

    /// [`Session::aged`] when the old messages are the oldest `young` ones
    /// (the usual case: times in order): the groups wholly before the cut
    /// go, and only the roles of the tool results at the cut are read
    /// (reading every old message's role held the main thread 21-31 ms on
    /// 100,000 messages, a replica's MEM._APPLY up to 102 ms).
    pub(super) fn aged_prefix(&self, young: usize, spared_from: usize) -> Option<Vec<bool>> {
        let mut cut = young.min(spared_from);
        if cut < spared_from {
            // cut == young < len: the group holding it is not wholly old.
            while cut > 0 && self.messages.is_tool(cut) {
                cut -= 1;
            }
        }
        if cut == 0 {
            return None;
        }
        let mut gone = vec![false; self.messages.len()];
        gone[..cut].fill(true);
        Some(gone)
    }

    /// [`Session::aged`] group by group, for times out of order.
    pub(super) fn aged_groups(&self, old: &[bool], spared_from: usize) -> Option<Vec<bool>> {
        let mut gone = vec![false; old.len()];
        // Groups start at 0 and at every message that is not a tool result;
        // only a group whose start is old can go, so only old messages are
        // read for their role (each one a lookup in the bytes: every message
        // of a 100,000-message session held a read 20-40 ms).
        let mut i = 0;
        while i < spared_from {
            if !old[i] || (i > 0 && self.messages.is_tool(i)) {
                i += 1;
                continue;
            }
            // i < len, so group_len_at(i) is 1..=len - i: end <= len (old
            // and gone have len entries) and the loop advances.
            let end = i + self.group_len_at(i);
            if old[i..end].iter().all(|o| *o) {
                gone[i..end].iter_mut().for_each(|g| *g = true);
            }
            i = end;
        }
        gone.contains(&true).then_some(gone)
    }

    /// Evicts the newest message (a streaming import that finds it past
    /// `maxage`: its id stays used, as if it had been appended and evicted).
    pub fn evict_newest(&mut self) {
        if let Some((id, tokens)) = self.messages.pop_back() {
            self.total_tokens -= tokens;
            self.msgids.leave_id(id, tokens);
            self.history.evicted += 1;
        }
    }

    /// Evicts the messages older than the session's `maxage` at `now` (see
    /// [`Session::aged`]), then any tool result left first. Returns the
    /// messages evicted.
    pub fn evict_aged(&mut self, now: i64, protect_newest: bool) -> u64 {
        match self.aged(now, protect_newest) {
            Some(gone) => self.evict_flagged(gone, protect_newest),
            None => 0,
        }
    }

    /// [`Session::evict_aged`] for an append (its own tool group spared)
    /// when every message before index `from` is known to stay at `now`: an
    /// earlier append of the same batch (same `now`, same MAXAGE) evicted
    /// then, and what it left before its newest tool group is in groups not
    /// wholly past the cutoff, which later appends do not change. Only the
    /// messages from `from` on are read and moved (a group starts there),
    /// and none of the newest `spared` (the append's own tool group).
    pub(super) fn evict_aged_after(&mut self, now: i64, from: usize, spared: usize) -> u64 {
        let Some(cutoff) = self.age_cutoff(now) else {
            return 0;
        };
        // `spared`: the newest tool group's length, which the append keeps.
        let len = self.messages.len();
        let spared_from = len.saturating_sub(spared);
        if spared_from <= from
            || !self
                .messages
                .heads_from(from)
                .take(spared_from - from)
                .any(|h| h.ts < cutoff)
        {
            return 0;
        }
        let mut gone = vec![false; len.saturating_sub(from)];
        let mut i = from;
        while i < spared_from {
            // i < len: the group is 1..=len - i messages, the loop advances.
            let end = i + self.group_len_at(i);
            let old = self
                .messages
                .heads_from(i)
                .take(end - i)
                .all(|h| h.ts < cutoff);
            if old {
                if let Some(g) = gone.get_mut(i - from..end - from) {
                    g.fill(true);
                }
            }
            i = end;
        }
        if !gone.contains(&true) {
            return 0;
        }
        self.evict_flagged_from(from, gone, true)
    }

    /// Evicts the messages `gone` flags (as [`Session::aged`] gave them),
    /// then any tool result left first. Returns the messages evicted.
    pub(super) fn evict_flagged(&mut self, gone: Vec<bool>, protect_newest: bool) -> u64 {
        self.evict_flagged_from(0, gone, protect_newest)
    }

    /// [`Session::evict_flagged`] where `gone` flags the messages from index
    /// `from` on (those before it stay).
    fn evict_flagged_from(&mut self, from: usize, gone: Vec<bool>, protect_newest: bool) -> u64 {
        let mut tokens = 0u64;
        let mut left = Vec::new();
        let mut flags = gone.into_iter();
        self.messages.retain_from(from, |h| {
            let go = flags.next().unwrap_or(false);
            if go {
                tokens += u64::from(h.tokens);
                left.push((h.id, u64::from(h.tokens)));
            }
            !go
        });
        self.total_tokens -= tokens;
        let evicted = left.len() as u64;
        self.history.evicted += evicted;
        self.msgids.leave_ids(&left);
        evicted + self.drop_orphan_tool_results(usize::from(protect_newest))
    }

    /// The messages a read at `now` hides (None: none): the groups past
    /// `maxage`, then the tool results they leave first (as evict_aged).
    fn hidden(&self, now: i64) -> Option<Vec<bool>> {
        let mut gone = self.aged(now, false)?;
        for (i, left) in gone.iter_mut().enumerate() {
            if *left {
                continue;
            }
            if !self.messages.is_tool(i) {
                break;
            }
            *left = true;
        }
        Some(gone)
    }

    /// Whether a read shows any message at `cutoff` (the earliest `ts`
    /// that stays: `live_count(now) > 0` at the session's own). A group not
    /// wholly past the cutoff shows when it starts with a message that is
    /// not a tool result; a run of results the session starts with shows
    /// only when no group is past the cutoff (the results an eviction
    /// leaves first are hidden). Answered from the newest messages back,
    /// by their times, and reading roles only at a young one and the
    /// session's start (`live_count` reads every head; a walk back over a
    /// group of 20,000 results, at every result of a batch, held 0.35 s).
    ///
    /// `newest_group`: where the newest tool group starts, when known (a
    /// batch's results, one by one).
    pub fn has_live(&self, cutoff: Option<i64>, newest_group: Option<usize>) -> bool {
        let Some(cutoff) = cutoff else {
            return !self.messages.is_empty();
        };
        // A young message in the newest group shows it: the group starts
        // with a call, or it is the only group.
        if self
            .messages
            .heads()
            .next_back()
            .is_some_and(|h| h.ts >= cutoff)
        {
            return true;
        }
        let len = self.messages.len();
        let mut end = len;
        if let Some(start) = newest_group.filter(|s| *s < end) {
            if self.messages.heads_from(start).any(|h| h.ts >= cutoff) {
                return true;
            }
            end = start;
        }
        // The last young message before `end`: its group is not wholly
        // past the cutoff (none: every group there is, or there is none).
        let Some(young) = (0..end)
            .rev()
            .find(|&i| self.messages.head(i).is_some_and(|h| h.ts >= cutoff))
        else {
            return false;
        };
        // It shows when its group starts with a message that is not a tool
        // result: groups start at 0 and at every such message.
        if !self.messages.is_tool(young) || !self.messages.is_tool(0) {
            return true;
        }
        let run = (0..len).find(|&i| !self.messages.is_tool(i)).unwrap_or(len);
        // In the run of results the session starts with, it shows only when
        // no group is wholly past the cutoff: every message after it, up to
        // `end`, is (it is the last young one), so only when the run is all.
        young >= run || run == len
    }

    /// `live(now).message_count()` without building the view.
    pub fn live_count(&self, now: i64) -> u64 {
        match self.hidden(now) {
            None => self.message_count(),
            Some(gone) => gone.iter().filter(|g| !**g).count() as u64,
        }
    }

    /// The session as a read at `now` must show it: without the messages a
    /// write at `now` would evict by age. Borrowed (no copy) unless some
    /// message is old, which lasts only until the session's next write.
    pub fn live(&self, now: i64) -> Cow<'_, Session> {
        // Attributes past their own expiry stay until the next write; every
        // read of them filters by `now` (nothing is copied for it).
        let Some(gone) = self.hidden(now) else {
            return Cow::Borrowed(self);
        };
        // The view shares the stored bytes (nothing is copied); the rest of
        // the session is small beside them.
        let mut view = Session {
            messages: self.messages.view_without(&gone),
            summary: self.summary.clone(),
            settings: self.settings.clone(),
            external: self.external.clone(),
            last_id: self.last_id,
            total_tokens: self.total_tokens,
            created: self.created,
            updated: self.updated,
            // Shared, not copied (copy on write).
            extra: self.extra.clone(),
            leases: self.leases.clone(),
            msgids: self.msgids.clone(),
            history: self.history,
        };
        let mut left = Vec::new();
        for (h, _) in self.messages.heads().zip(&gone).filter(|(_, g)| **g) {
            view.history.evicted += 1;
            view.total_tokens -= u64::from(h.tokens);
            left.push((h.id, u64::from(h.tokens)));
        }
        view.msgids.leave_ids(&left);
        Cow::Owned(view)
    }
}

impl Settings {
    /// The earliest `ts` a message may have at `now` and stay under these
    /// settings, or `None` when they set no age limit.
    pub fn age_cutoff(&self, now: i64) -> Option<i64> {
        if self.max_age == 0 {
            return None;
        }
        // max_age is bounded (100 years from clients; loaded values are
        // clamped here), so the product cannot overflow.
        let age_ms = i64::try_from(self.max_age)
            .unwrap_or(i64::MAX)
            .saturating_mul(1000);
        Some(now.saturating_sub(age_ms))
    }
}
