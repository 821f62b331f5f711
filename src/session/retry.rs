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

/// The msgids of the last messages that left, oldest first, at most
/// [`MAX_DEPARTED`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DepartedMsgids(pub VecDeque<Departed>);

impl DepartedMsgids {
    /// Remembers `m` (leaving the session) if it has a msgid, forgetting
    /// the oldest beyond [`MAX_DEPARTED`].
    pub fn remember(&mut self, m: Message) {
        if let Some(msgid) = m.msgid {
            if self.0.len() >= MAX_DEPARTED {
                self.0.pop_front();
            }
            self.0.push_back(Departed { msgid, id: m.id, tokens: m.tokens });
        }
    }

    pub fn mem_usage(&self) -> usize {
        self.0.capacity() * std::mem::size_of::<Departed>() + self.0.iter().map(|d| d.msgid.len()).sum::<usize>()
    }
}

impl Session {
    /// The `(id, tokens)` of the message named `msgid`, held or departed.
    /// Newest first: a retry is almost always of a recent message.
    pub fn find_msgid(&self, msgid: &str) -> Option<(u64, u64)> {
        let held = self.messages.iter().rev().find(|m| m.msgid.as_deref() == Some(msgid));
        if let Some(m) = held {
            return Some((m.id, m.tokens));
        }
        self.departed.0.iter().rev().find(|d| &*d.msgid == msgid).map(|d| (d.id, d.tokens))
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
        let s = self.summary.as_ref().filter(|s| s.upto == upto && s.text.as_bytes() == text)?;
        Some(self.duplicate_outcome(s.upto, s.tokens))
    }
}
