//! A model switch to another tokenizer re-counts the summary and every
//! message (the one case of re-tokenizing). A large session is counted on a
//! worker from a [`Snapshot`]: the message contents are shared (`Arc`), so
//! taking one copies no text. While the worker counts, the session may
//! change (appends, trims, a summary); the counts come back by id and
//! [`Session::recount_op`] counts what they do not cover. The result
//! replicates as one `Op::Recount` (the new counts), never the whole session.

use super::log::SameBytes;
use super::{MessageLog, Op, Session, SessionError};
use crate::tokenizer::{Encoding, SUMMARY_COUNTED_AS};

/// The texts of a session, to count off the main thread.
pub struct Snapshot {
    /// When the session was created: which lifetime of the key was counted.
    created: i64,
    /// (upto, ts, text) of the summary.
    summary: Option<(u64, i64, String)>,
    /// The messages: a copy of the log sharing its bytes.
    messages: MessageLog,
}

/// Counts of a [`Snapshot`] under `encoding`.
#[derive(Debug)]
pub struct Recounted {
    pub encoding: Encoding,
    /// The counted session's creation time (see [`Recounted::is_of`]).
    created: i64,
    /// (upto, ts, tokens) of the summary counted.
    summary: Option<(u64, i64, u64)>,
    /// (id, tokens) in id order (the snapshot's): looked up by walking it
    /// beside the session's messages, which are in id order too (a map of
    /// 100,000 ids, hashed four times over on the main thread, made a
    /// model switch hold it 10-30 ms).
    messages: Vec<(u64, u64)>,
    /// The messages counted (sharing the session's bytes then): a count
    /// stands for a message of the same id only if its bytes are these
    /// (a COPY ... REPLACE while the worker counted put other texts under
    /// the same ids and creation time, and they took the old counts).
    counted: MessageLog,
}

/// What a [`Recounted`] covers of a session as it is now (see
/// [`Session::coverage`]).
pub struct Coverage {
    encoding: Encoding,
    /// The summary's tokens, if counted unchanged.
    summary: Option<u64>,
    /// Each message's tokens, if counted from the same bytes.
    messages: Vec<Option<u64>>,
    uncovered_bytes: usize,
}

impl Coverage {
    /// Stored bytes [`Session::recount_op`] would count itself.
    pub fn uncovered_bytes(&self) -> usize {
        self.uncovered_bytes
    }
}

impl Recounted {
    /// Whether these are counts of `session`'s lifetime of the key: one
    /// deleted and made again while the worker counted has the same ids
    /// for other messages.
    pub fn is_of(&self, session: &Session) -> bool {
        self.created == session.created
    }

    /// A cursor over the counts, for the messages of `log` asked in
    /// increasing id order.
    fn cursor<'a>(&'a self, log: &'a MessageLog) -> Cursor<'a> {
        Cursor {
            counts: &self.messages,
            same: SameBytes::new(log, &self.counted),
            log,
            at: 0,
        }
    }
}

struct Cursor<'a> {
    counts: &'a [(u64, u64)],
    same: SameBytes<'a>,
    log: &'a MessageLog,
    at: usize,
}

impl Cursor<'_> {
    /// The tokens counted for message `i` of the log (asked in increasing
    /// id order), if counted from the same bytes.
    fn get(&mut self, i: usize) -> Option<u64> {
        let id = self.log.head(i)?.id;
        while self.counts.get(self.at).is_some_and(|(c, _)| *c < id) {
            self.at += 1;
        }
        let (c, tokens) = *self.counts.get(self.at)?;
        (c == id && self.same.check(i, self.at)).then_some(tokens)
    }
}

/// Counts a message: (encoding, role, content, meta).
type Count<'a> = &'a dyn Fn(Encoding, &str, &str, Option<&str>) -> u64;

impl Snapshot {
    /// Bytes it holds (stored bytes: a little above the texts' own).
    pub fn bytes(&self) -> usize {
        let summary = self.summary.as_ref().map_or(0, |(_, _, t)| t.len());
        summary + self.messages.stored_len()
    }

    pub fn count(&self, encoding: Encoding, count: Count) -> Recounted {
        Recounted {
            encoding,
            created: self.created,
            summary: self.summary.as_ref().map(|(upto, ts, text)| {
                (*upto, *ts, count(encoding, SUMMARY_COUNTED_AS, text, None))
            }),
            messages: self
                .messages
                .iter()
                .map(|m| (m.id, count(encoding, m.role, m.content, m.meta)))
                .collect(),
            counted: self.messages.clone(),
        }
    }
}

impl Session {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            created: self.created,
            summary: self
                .summary
                .as_ref()
                .map(|s| (s.upto, s.ts, s.text.clone())),
            messages: self.messages.clone(),
        }
    }

    /// Bytes a re-count reads (to decide between inline and the pool): the
    /// stored bytes, a little above the texts' own, known without a pass.
    pub fn text_bytes(&self) -> usize {
        let summary = self.summary.as_ref().map_or(0, |s| s.text.len());
        summary + self.messages.stored_len()
    }

    /// What `done` (counted off the main thread) covers of the session
    /// under `encoding`: one walk, whose result both decides whether the
    /// rest may be counted here and gives the counts.
    pub fn coverage(&self, encoding: Encoding, done: Option<&Recounted>) -> Coverage {
        let done = done.filter(|d| d.encoding == encoding);
        let summary = self.summary.as_ref().and_then(|s| {
            done.and_then(|d| d.summary)
                .filter(|(upto, ts, _)| *upto == s.upto && *ts == s.ts)
                .map(|(_, _, tokens)| tokens)
        });
        let mut uncovered_bytes = match (&self.summary, summary) {
            (Some(s), None) => s.text.len(),
            _ => 0,
        };
        let mut cursor = done.map(|d| d.cursor(&self.messages));
        let messages = (0..self.messages.len())
            .map(|i| {
                let tokens = cursor.as_mut().and_then(|c| c.get(i));
                if tokens.is_none() {
                    uncovered_bytes += self.messages.stored_len_of(i);
                }
                tokens
            })
            .collect();
        Coverage {
            encoding,
            summary,
            messages,
            uncovered_bytes,
        }
    }

    /// The op that gives the session its counts under the coverage's
    /// encoding: taken from `coverage` (of this session as it is now) where
    /// it covers a message or the summary, counted with `count` otherwise
    /// (what changed meanwhile).
    pub fn recount_op(&self, now: i64, coverage: &Coverage, count: Count) -> Op {
        let encoding = coverage.encoding;
        let summary_tokens = self.summary.as_ref().map(|s| {
            coverage
                .summary
                .unwrap_or_else(|| count(encoding, SUMMARY_COUNTED_AS, &s.text, None))
        });
        let counts = (0..self.messages.len())
            .map(|i| {
                let id = self.messages.head(i).map_or(0, |h| h.id);
                match coverage.messages.get(i).copied().flatten() {
                    Some(tokens) => (id, tokens),
                    // Appended meanwhile: counted here (small: checked first).
                    None => (
                        id,
                        self.messages
                            .get(i)
                            .map_or(0, |m| count(encoding, m.role, m.content, m.meta)),
                    ),
                }
            })
            .collect();
        Op::Recount {
            now,
            encoding,
            summary_tokens,
            counts,
        }
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
        // A bound no count of a message's stored bytes (role, content and
        // META, read from the heads, no text decoded) can pass: a token per
        // byte of text plus the framing, and tool calls, which templates
        // render with special tokens and text around each (an empty call
        // `{},` is 3 bytes of META and 15 tokens under harmony or Llama 3:
        // 5 per byte, the most found), under eight per byte.
        let possible = |tokens: u64, bytes: usize| tokens <= 3 + 8 * bytes as u64;
        let summary_ok = match (&self.summary, summary_tokens) {
            (Some(s), Some(t)) => possible(t, SUMMARY_COUNTED_AS.len() + s.text.len()),
            (None, None) => true,
            _ => false,
        };
        let messages_ok = counts.len() == self.messages.len()
            && counts.iter().enumerate().all(|(i, &(id, tokens))| {
                self.messages.head(i).is_some_and(|h| h.id == id)
                    && possible(tokens, self.messages.stored_len_of(i))
            });
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
