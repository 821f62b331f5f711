//! A model switch to another tokenizer re-counts the summary and every
//! message (the one case of re-tokenizing). A large session is counted on a
//! worker from a [`Snapshot`]: the message contents are shared (`Arc`), so
//! taking one copies no text. While the worker counts, the session may
//! change (appends, trims, a summary); the counts come back by id and
//! [`Session::recount_op`] counts what they do not cover. The result
//! replicates as one `Op::Recount` (the new counts), never the whole session.

use std::collections::HashMap;
use super::{MessageLog, Op, Session, SessionError};
use crate::tokenizer::{Encoding, SUMMARY_COUNTED_AS};

/// The texts of a session, to count off the main thread.
pub struct Snapshot {
    /// (upto, ts, text) of the summary.
    summary: Option<(u64, i64, String)>,
    /// The messages: a copy of the log sharing its bytes.
    messages: MessageLog,
}

/// Counts of a [`Snapshot`] under `encoding`.
#[derive(Debug)]
pub struct Recounted {
    pub encoding: Encoding,
    /// (upto, ts, tokens) of the summary counted.
    summary: Option<(u64, i64, u64)>,
    /// id -> tokens.
    messages: HashMap<u64, u64>,
}

type Count<'a> = &'a dyn Fn(Encoding, &str, &str) -> u64;

impl Snapshot {
    /// Bytes of text it holds.
    pub fn bytes(&self) -> usize {
        let summary = self.summary.as_ref().map_or(0, |(_, _, t)| t.len());
        summary + self.messages.iter().map(|m| m.role.len() + m.content.len()).sum::<usize>()
    }

    pub fn count(&self, encoding: Encoding, count: Count) -> Recounted {
        Recounted {
            encoding,
            summary: self
                .summary
                .as_ref()
                .map(|(upto, ts, text)| (*upto, *ts, count(encoding, SUMMARY_COUNTED_AS, text))),
            messages: self
                .messages
                .iter()
                .map(|m| (m.id, count(encoding, m.role, m.content)))
                .collect(),
        }
    }
}

impl Session {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            summary: self.summary.as_ref().map(|s| (s.upto, s.ts, s.text.clone())),
            messages: self.messages.clone(),
        }
    }

    /// Bytes a re-count reads (to decide between inline and the pool).
    pub fn text_bytes(&self) -> usize {
        let summary = self.summary.as_ref().map_or(0, |s| s.text.len());
        summary + self.messages.iter().map(|m| m.role.len() + m.content.len()).sum::<usize>()
    }

    /// Bytes [`Session::recount_op`] would count itself: those `done` does
    /// not cover.
    pub fn uncovered_bytes(&self, encoding: Encoding, done: Option<&Recounted>) -> usize {
        let done = done.filter(|d| d.encoding == encoding);
        let summary = match (&self.summary, done.and_then(|d| d.summary)) {
            (Some(s), Some((upto, ts, _))) if upto == s.upto && ts == s.ts => 0,
            (Some(s), _) => s.text.len(),
            (None, _) => 0,
        };
        let covered = |id: &u64| done.is_some_and(|d| d.messages.contains_key(id));
        summary
            + self
                .messages
                .iter()
                .filter(|m| !covered(&m.id))
                .map(|m| m.role.len() + m.content.len())
                .sum::<usize>()
    }

    /// The op that gives the session its counts under `encoding`: taken from
    /// `done` (counted off the main thread under the same encoding) where it
    /// covers a message or the summary unchanged, counted with `count`
    /// otherwise (what changed meanwhile).
    pub fn recount_op(&self, now: i64, encoding: Encoding, done: Option<&Recounted>, count: Count) -> Op {
        let done = done.filter(|d| d.encoding == encoding);
        let summary_tokens = self.summary.as_ref().map(|s| {
            match done.and_then(|d| d.summary).filter(|(upto, ts, _)| *upto == s.upto && *ts == s.ts) {
                Some((_, _, tokens)) => tokens,
                None => count(encoding, SUMMARY_COUNTED_AS, &s.text),
            }
        });
        let counts = self
            .messages
            .iter()
            .map(|m| {
                let tokens = done.and_then(|d| d.messages.get(&m.id).copied());
                (m.id, tokens.unwrap_or_else(|| count(encoding, m.role, m.content)))
            })
            .collect();
        Op::Recount { now, encoding, summary_tokens, counts }
    }

    /// Applies a re-count: it must cover exactly the summary (if any) and
    /// every message, in order, with counts their texts can have (at most
    /// one token per byte plus the framing). Changes nothing on error.
    pub(super) fn apply_recount(
        &mut self,
        encoding: Encoding,
        summary_tokens: Option<u64>,
        counts: &[(u64, u64)],
    ) -> Result<(), SessionError> {
        let possible = |tokens: u64, role: &str, text: &str| tokens <= 3 + role.len() as u64 + text.len() as u64;
        let summary_ok = match (&self.summary, summary_tokens) {
            (Some(s), Some(t)) => possible(t, SUMMARY_COUNTED_AS, &s.text),
            (None, None) => true,
            _ => false,
        };
        let messages_ok = counts.len() == self.messages.len()
            && self
                .messages
                .iter()
                .zip(counts)
                .all(|(m, &(id, tokens))| m.id == id && possible(tokens, m.role, m.content));
        if !summary_ok || !messages_ok {
            return Err(SessionError::RecountMismatch);
        }
        let mut total = 0u64;
        if let (Some(s), Some(t)) = (self.summary.as_mut(), summary_tokens) {
            s.tokens = t;
            total += t;
        }
        for (i, &(_, tokens)) in counts.iter().enumerate() {
            self.messages.set_tokens(i, tokens);
            total += tokens;
        }
        self.total_tokens = total;
        self.settings.encoding = encoding;
        Ok(())
    }
}
