//! Retried appends (MSGID). A client that times out and resends MEM.APPEND
//! (every Redis client library can be set to retry) must not store the
//! message twice: the LLM would then see the user say everything twice. The
//! client names each message (MSGID); an append whose msgid the session
//! holds, or one of the last [`MAX_DEPARTED`] msgids that left it (trimmed
//! or summarized: a retry can come after the original was already evicted),
//! is answered as the original was, and changes nothing.

use std::collections::VecDeque;

use super::{Message, Outcome, Session};

/// Longest accepted msgid, in bytes.
pub const MAX_MSGID_BYTES: usize = 128;
/// Msgids of departed messages a session remembers. A retry comes seconds
/// after its original; 128 covers more appends than any client retries over.
pub const MAX_DEPARTED: usize = 128;

/// The msgid rule shared by MSGID, MEM.APPENDBATCH items, imports and
/// load-time validation.
pub fn check_msgid(msgid: &str) -> Result<(), String> {
    if msgid.is_empty() || msgid.len() > MAX_MSGID_BYTES {
        return Err(format!("msgid must be 1 to {MAX_MSGID_BYTES} bytes"));
    }
    Ok(())
}

/// What a retry of a departed message is answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Departed {
    pub msgid: Box<str>,
    pub id: u64,
    pub tokens: u64,
}

/// A session's msgids. Kept beside the messages rather than in each one,
/// so that a message without a msgid costs nothing (most sessions written
/// before MSGID existed, or by clients that send none), and allocated
/// only once one has a msgid (the two empty lists took 64 B of every
/// session). Read through `Deref`; a write through `DerefMut` allocates.
#[derive(Clone, Debug, Default)]
pub struct Msgids(Option<Box<MsgidLists>>);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MsgidLists {
    /// `(message id, msgid)` of the held messages that have one, oldest
    /// first: ids strictly increasing, each the id of a held message.
    /// Messages leave from the front, so entries do too.
    pub held: VecDeque<(u64, Box<str>)>,
    /// The last messages with a msgid that left, oldest first, at most
    /// [`MAX_DEPARTED`].
    pub departed: VecDeque<Departed>,
}

static NO_MSGIDS: MsgidLists = MsgidLists {
    held: VecDeque::new(),
    departed: VecDeque::new(),
};

impl std::ops::Deref for Msgids {
    type Target = MsgidLists;
    fn deref(&self) -> &MsgidLists {
        self.0.as_deref().unwrap_or(&NO_MSGIDS)
    }
}

impl std::ops::DerefMut for Msgids {
    fn deref_mut(&mut self) -> &mut MsgidLists {
        self.0.get_or_insert_with(Box::default)
    }
}

impl PartialEq for Msgids {
    fn eq(&self, other: &Msgids) -> bool {
        **self == **other
    }
}

impl Eq for Msgids {}

impl Msgids {
    /// Gives the newest message, `id`, its msgid.
    pub fn attach(&mut self, id: u64, msgid: Box<str>) {
        self.held.push_back((id, msgid));
    }

    /// `m` (the oldest message) leaves the session: its msgid, if it has
    /// one, is remembered as departed, forgetting the oldest beyond
    /// [`MAX_DEPARTED`].
    pub fn leave(&mut self, m: &Message) {
        self.leave_id(m.id, m.tokens);
    }

    /// Whether any held message has a msgid (else leaving is a no-op).
    pub fn holds_any(&self) -> bool {
        self.0.as_ref().is_some_and(|l| !l.held.is_empty())
    }

    /// Message `id` (of `tokens`) leaves from anywhere in the session (by
    /// age, or the newest one): as [`Msgids::leave_ids`].
    pub fn leave_id(&mut self, id: u64, tokens: u64) {
        self.leave_ids(&[(id, tokens)]);
    }

    /// Messages leave at once (`gone`: their `(id, tokens)`, ids
    /// increasing): one pass over the held msgids (leaving one at a time
    /// moved the held list once per message: an age cut of 49,500 messages
    /// with msgids held the main thread 0.5 s). The departed stay in id
    /// order, at most [`MAX_DEPARTED`]: those that leave now are kept (the
    /// newest of them when more leave), and the older departed make room
    /// lowest id first. A message that left last is never the one
    /// forgotten: one with a low id (kept by a mixed-time MAXAGE) leaving
    /// after 128 others was dropped at once, and its retry appended twice.
    pub fn leave_ids(&mut self, gone: &[(u64, u64)]) {
        // Every eviction comes here: a session without msgids allocates none.
        let Some(lists) = self.0.as_deref_mut() else {
            return;
        };
        if lists.held.is_empty() || gone.is_empty() {
            return;
        }
        let mut left: Vec<Departed> = Vec::new();
        if let [(id, tokens)] = gone {
            let at = lists.held.partition_point(|(held, _)| held < id);
            if lists.held.get(at).is_some_and(|(held, _)| held == id) {
                if let Some((id, msgid)) = lists.held.remove(at) {
                    left.push(Departed {
                        msgid,
                        id,
                        tokens: *tokens,
                    });
                }
            }
        } else {
            let mut gone = gone.iter().peekable();
            let held = std::mem::take(&mut lists.held);
            let mut kept = VecDeque::with_capacity(held.len());
            for (id, msgid) in held {
                while gone.next_if(|(g, _)| *g < id).is_some() {}
                match gone.peek() {
                    Some((g, tokens)) if *g == id => left.push(Departed {
                        msgid,
                        id,
                        tokens: *tokens,
                    }),
                    _ => kept.push_back((id, msgid)),
                }
            }
            // Sized for all that were held: what stays gives the rest back
            // (20,000 msgids evicted to one kept 480 KB of list).
            if kept.capacity() > 2 * kept.len() + 8 {
                kept.shrink_to(kept.len());
            }
            lists.held = kept;
        }
        if left.is_empty() {
            return;
        }
        if let [_] = left[..] {
            // One (every append at the caps): in place, no allocation.
            if let Some(d) = left.pop() {
                let departed = &mut lists.departed;
                let at = departed.partition_point(|x| x.id < d.id);
                departed.insert(at, d);
                if departed.len() > MAX_DEPARTED {
                    departed.remove(usize::from(at == 0));
                }
            }
            return;
        }
        let new = left.split_off(left.len().saturating_sub(MAX_DEPARTED));
        // The rest are forgotten: many are freed off the main thread (an age
        // cut of 100,000 messages with msgids spent ~5 ms freeing them).
        if left.len() >= super::garbage::FREE_LATER_MSGIDS {
            super::garbage::discard(left);
        }
        let old = std::mem::take(&mut lists.departed);
        let skip = (old.len() + new.len()).saturating_sub(MAX_DEPARTED);
        let mut old = old.into_iter().skip(skip).peekable();
        let mut merged = VecDeque::with_capacity(MAX_DEPARTED);
        for d in new {
            while let Some(o) = old.next_if(|o| o.id < d.id) {
                merged.push_back(o);
            }
            merged.push_back(d);
        }
        merged.extend(old);
        lists.departed = merged;
    }

    /// The msgid of held message `id`, if it has one.
    pub fn of(&self, id: u64) -> Option<&str> {
        let at = self.held.partition_point(|(held, _)| *held < id);
        self.held
            .get(at)
            .filter(|(held, _)| *held == id)
            .map(|(_, m)| &**m)
    }

    pub fn mem_usage(&self) -> usize {
        if self.0.is_none() {
            return 0;
        }
        let held = self.held.capacity() * std::mem::size_of::<(u64, Box<str>)>()
            + self.held.iter().map(|(_, m)| m.len()).sum::<usize>();
        let departed = self.departed.capacity() * std::mem::size_of::<Departed>()
            + self.departed.iter().map(|d| d.msgid.len()).sum::<usize>();
        std::mem::size_of::<MsgidLists>() + held + departed
    }
}

impl Session {
    /// The `(id, tokens)` of the message named `msgid`, held or departed.
    /// Newest first: a retry is almost always of a recent message.
    pub fn find_msgid(&self, msgid: &str) -> Option<(u64, u64)> {
        if let Some((id, _)) = self.msgids.held.iter().rev().find(|(_, m)| &**m == msgid) {
            // Held: its tokens are the message's (a re-count may have moved them).
            let at = self.messages.position(*id)?;
            return self.messages.head(at).map(|h| (h.id, u64::from(h.tokens)));
        }
        self.msgids
            .departed
            .iter()
            .rev()
            .find(|d| &*d.msgid == msgid)
            .map(|d| (d.id, d.tokens))
    }

    /// `(id, tokens)` of message `id`, named `msgid`, while the session
    /// remembers it (held, or among the departed): what a retry of it is
    /// answered with. A look at one head and at most [`MAX_DEPARTED`]
    /// msgids, where [`Session::find_msgid`] scans the held ones.
    pub fn remembered(&self, msgid: &str, id: u64) -> Option<(u64, u64)> {
        if let Some(h) = self
            .messages
            .position(id)
            .and_then(|at| self.messages.head(at))
        {
            return Some((h.id, u64::from(h.tokens)));
        }
        self.msgids
            .departed
            .iter()
            .rev()
            .find(|d| d.id == id && &*d.msgid == msgid)
            .map(|d| (d.id, d.tokens))
    }

    /// Of the msgids `wanted`, those the session knows -> `(id, tokens)`,
    /// as [`Session::find_msgid`] answers each (held ones win over
    /// departed ones), in one pass over the held msgids: for a write that
    /// looks up many (a batch; indexing every msgid of a 99,000-message
    /// session for it held the main thread 17-25 ms).
    pub fn find_msgids<'s>(
        &'s self,
        wanted: &std::collections::HashSet<&str>,
    ) -> std::collections::HashMap<&'s str, (u64, u64)> {
        let mut found = std::collections::HashMap::new();
        for d in &self.msgids.departed {
            if wanted.contains(&*d.msgid) {
                found.insert(&*d.msgid, (d.id, d.tokens));
            }
        }
        for (id, msgid) in &self.msgids.held {
            if !wanted.contains(&**msgid) {
                continue;
            }
            if let Some(h) = self
                .messages
                .position(*id)
                .and_then(|at| self.messages.head(at))
            {
                found.insert(&**msgid, (h.id, u64::from(h.tokens)));
            }
        }
        found
    }

    /// The reply of a write recognised as a retry of one already applied:
    /// the original's `id` and `tokens`, the session's totals now.
    pub fn duplicate_outcome(&self, id: u64, tokens: u64) -> Outcome {
        Outcome {
            id,
            tokens,
            total_tokens: self.total_tokens,
            messages: self.message_count(),
            trimmed: 0,
            duplicate: true,
        }
    }

    /// The reply of a MEM.SUMMARIZE retried after it succeeded: the same
    /// summary (same `upto`, same text) is already the session's.
    pub fn summary_retried(&self, upto: u64, text: &[u8]) -> Option<Outcome> {
        let s = self
            .summary
            .as_ref()
            .filter(|s| s.upto == upto && s.text.as_bytes() == text)?;
        Some(self.duplicate_outcome(s.upto, s.tokens))
    }
}
