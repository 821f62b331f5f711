//! The session: messages, summary, settings, external ids and running totals,
//! with every rule of the spec that does not need Redis (append, trimming,
//! summarize thresholds, summary replacement, ext-id expiry, budget selection).
//!
//! Writes are expressed as [`Op`]s that carry everything the master decided
//! (ids, timestamps, token counts, settings). The master applies an op and
//! replicates the same op, so a replica or an AOF reload reaches the same state
//! without consulting its own clock, config or tokenizer.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::tokenizer::{Encoding, SUMMARY_COUNTED_AS};

/// The role whose messages must stay with the call that produced them.
pub const TOOL_ROLE: &str = "tool";
/// Latest accepted message time: 9999-12-31T23:59:59.999Z, the last instant
/// an ISO 8601 timestamp with a four-digit year can show.
pub const MAX_TS: i64 = 253_402_300_799_999;
/// Longest accepted role, in bytes.
pub const MAX_ROLE_BYTES: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub id: u64,
    /// Boxed strings, not `String`s: no spare capacity, 8 bytes less each.
    pub role: Box<str>,
    pub content: Box<str>,
    /// Unix time in milliseconds.
    pub ts: i64,
    pub tokens: u64,
    /// A JSON object, kept as the client sent it.
    pub meta: Option<Box<str>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub text: String,
    pub tokens: u64,
    /// Id of the newest message the summary covers.
    pub upto: u64,
    pub ts: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    pub model: String,
    pub encoding: Encoding,
    /// Sliding TTL in seconds; 0 = the key never expires.
    pub ttl: u64,
    pub max_tokens: u64,
    pub max_msgs: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalId {
    pub id: String,
    /// Unix time in milliseconds after which the id is gone.
    pub expires_at: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub messages: VecDeque<Message>,
    pub summary: Option<Summary>,
    pub settings: Settings,
    /// Orchestrator name -> its conversation id (ordered, so digests agree).
    pub external: BTreeMap<String, ExternalId>,
    /// The last id handed out; ids are never reused, even after eviction.
    pub last_id: u64,
    /// Sum of the summary's and the messages' tokens, kept incrementally.
    pub total_tokens: u64,
    pub created: i64,
    pub updated: i64,
    /// Other top-level members of an imported document (`user_profile`,
    /// `context`, ...), as the JSON text of an object.
    pub extra: Option<String>,
}

/// A change to a session, with every value the master decided made explicit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Append one message (creating the session when missing), after applying
    /// `settings`. The message's id is part of it so the replica agrees.
    Append {
        now: i64,
        settings: Settings,
        message: Message,
    },
    /// Replace the summary and every message with `id <= upto`.
    Summarize { now: i64, summary: Summary },
    /// Store an external conversation id.
    ExtSet {
        now: i64,
        settings: Settings,
        system: String,
        external: ExternalId,
    },
}

impl Op {
    /// The op without an appended message's content, which travels as its
    /// own argument (so a large content is not copied again to replicate it).
    pub fn header(&self) -> Op {
        match self {
            Op::Append { now, settings, message } => Op::Append {
                now: *now,
                settings: settings.clone(),
                message: Message {
                    content: Box::default(),
                    meta: message.meta.clone(),
                    role: message.role.clone(),
                    ..*message
                },
            },
            other => other.clone(),
        }
    }

    /// Puts back the content that [`Op::header`] left out.
    pub fn with_content(mut self, content: String) -> Op {
        if let Op::Append { message, .. } = &mut self {
            message.content = content.into();
        }
        self
    }

    /// The session an op starts from when its key does not exist yet.
    pub fn new_session(&self) -> Option<Session> {
        match self {
            Op::Append { now, settings, .. } | Op::ExtSet { now, settings, .. } => {
                Some(Session::new(settings.clone(), *now))
            }
            Op::Summarize { .. } => None,
        }
    }
}

/// What an append (or summary) did, for the command's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub id: u64,
    pub tokens: u64,
    pub total_tokens: u64,
    pub messages: u64,
    pub trimmed: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionError {
    /// SUMMARIZE's `upto` is not a message of the session.
    UnknownUpto(u64),
    /// An op whose message id is not above the session's last id.
    IdNotIncreasing { id: u64, last_id: u64 },
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::UnknownUpto(upto) => write!(
                f,
                "upto {upto} is not the id of a message in the session (already summarized or evicted?)"
            ),
            SessionError::IdNotIncreasing { id, last_id } => {
                write!(f, "message id {id} is not above the session's last id {last_id}")
            }
        }
    }
}

impl Session {
    pub fn new(settings: Settings, now: i64) -> Session {
        Session {
            messages: VecDeque::new(),
            summary: None,
            settings,
            external: BTreeMap::new(),
            last_id: 0,
            total_tokens: 0,
            created: now,
            updated: now,
            extra: None,
        }
    }

    pub fn message_count(&self) -> u64 {
        self.messages.len() as u64
    }

    pub fn first_id(&self) -> u64 {
        self.messages.front().map_or(0, |m| m.id)
    }

    pub fn summary_tokens(&self) -> u64 {
        self.summary.as_ref().map_or(0, |s| s.tokens)
    }

    /// Applies `op` (moving its message or summary in). Fails without
    /// changing anything.
    pub fn apply(&mut self, op: Op) -> Result<Outcome, SessionError> {
        match op {
            Op::Append {
                now,
                settings,
                message,
            } => self.append(now, settings, message),
            Op::Summarize { now, summary } => self.summarize(now, summary),
            Op::ExtSet {
                now,
                settings: _,
                system,
                external,
            } => {
                self.ext_set(now, system, external);
                Ok(self.outcome(0, 0, 0))
            }
        }
    }

    fn outcome(&self, id: u64, tokens: u64, trimmed: u64) -> Outcome {
        Outcome {
            id,
            tokens,
            total_tokens: self.total_tokens,
            messages: self.message_count(),
            trimmed,
        }
    }

    fn append(
        &mut self,
        now: i64,
        settings: Settings,
        message: Message,
    ) -> Result<Outcome, SessionError> {
        if message.id <= self.last_id {
            return Err(SessionError::IdNotIncreasing {
                id: message.id,
                last_id: self.last_id,
            });
        }
        self.settings = settings;
        self.last_id = message.id;
        self.total_tokens += message.tokens;
        let (id, tokens) = (message.id, message.tokens);
        self.messages.push_back(message);
        self.updated = now;
        self.purge_external(now);
        let trimmed = self.trim(true);
        Ok(self.outcome(id, tokens, trimmed))
    }

    /// Evicts the oldest messages until the session is within its caps.
    ///
    /// The newest message is spared when `protect_newest` (an append never
    /// evicts its own message). The summary goes only once no message can go
    /// instead. A `tool` message is never left as the oldest one: a tool
    /// result whose call was evicted goes with it. Returns the messages evicted.
    pub fn trim(&mut self, protect_newest: bool) -> u64 {
        let spared = usize::from(protect_newest);
        let max_msgs = self.settings.max_msgs;
        let max_tokens = self.settings.max_tokens;
        let mut evicted = 0u64;
        let over = |s: &Session| s.message_count() > max_msgs || s.total_tokens > max_tokens;
        while over(self) && self.messages.len() > spared {
            self.evict_oldest();
            evicted += 1;
        }
        if evicted > 0 {
            while self.messages.len() > spared
                && self.messages.front().is_some_and(|m| &*m.role == TOOL_ROLE)
            {
                self.evict_oldest();
                evicted += 1;
            }
        }
        if self.total_tokens > max_tokens {
            if let Some(summary) = self.summary.take() {
                self.total_tokens -= summary.tokens;
            }
        }
        evicted
    }

    fn evict_oldest(&mut self) {
        if let Some(m) = self.messages.pop_front() {
            self.total_tokens -= m.tokens;
        }
    }

    /// Replaces the summary and every message with `id <= summary.upto`.
    fn summarize(&mut self, now: i64, summary: Summary) -> Result<Outcome, SessionError> {
        let upto = summary.upto;
        let Some(pos) = self.messages.iter().position(|m| m.id == upto) else {
            return Err(SessionError::UnknownUpto(upto));
        };
        for m in self.messages.drain(..=pos) {
            self.total_tokens -= m.tokens;
        }
        if let Some(old) = self.summary.take() {
            self.total_tokens -= old.tokens;
        }
        let tokens = summary.tokens;
        self.total_tokens += tokens;
        self.summary = Some(summary);
        self.updated = now;
        self.purge_external(now);
        // The new summary stays; messages make room for it if a cap requires.
        let trimmed = self.trim_keeping_summary();
        Ok(self.outcome(upto, tokens, trimmed))
    }

    fn trim_keeping_summary(&mut self) -> u64 {
        let summary = self.summary.take();
        let summary_tokens = summary.as_ref().map_or(0, |s| s.tokens);
        self.total_tokens -= summary_tokens;
        let saved_cap = self.settings.max_tokens;
        self.settings.max_tokens = saved_cap.saturating_sub(summary_tokens);
        let trimmed = self.trim(false);
        self.settings.max_tokens = saved_cap;
        self.total_tokens += summary_tokens;
        self.summary = summary;
        trimmed
    }

    /// Re-counts the summary and every message under `encoding` (the one case
    /// of re-tokenizing: the session's model moved to another tokenizer).
    pub fn recount(&mut self, encoding: Encoding, count: impl Fn(Encoding, &str, &str) -> u64) {
        let mut total = 0;
        if let Some(s) = self.summary.as_mut() {
            s.tokens = count(encoding, SUMMARY_COUNTED_AS, &s.text);
            total += s.tokens;
        }
        for m in self.messages.iter_mut() {
            m.tokens = count(encoding, &m.role, &m.content);
            total += m.tokens;
        }
        self.total_tokens = total;
        self.settings.encoding = encoding;
    }

    fn ext_set(&mut self, now: i64, system: String, external: ExternalId) {
        self.purge_external(now);
        self.external.insert(system, external);
    }

    /// Drops external ids whose time is up. `now` comes from the op, so the
    /// master and its replicas drop the same ones.
    fn purge_external(&mut self, now: i64) {
        self.external.retain(|_, e| e.expires_at > now);
    }

    /// The external id of `system`, unless it expired.
    pub fn ext_get(&self, system: &str, now: i64) -> Option<&str> {
        self.external
            .get(system)
            .filter(|e| e.expires_at > now)
            .map(|e| e.id.as_str())
    }

    /// The absolute expiry (ms) the key should have after a write at `now`:
    /// the sliding TTL, never earlier than a live external id. `None`: no
    /// expiry (TTL 0).
    pub fn key_expiry(&self, now: i64) -> Option<i64> {
        if self.settings.ttl == 0 {
            return None;
        }
        let ttl_ms = i64::try_from(self.settings.ttl.saturating_mul(1000)).unwrap_or(i64::MAX);
        let sliding = now.saturating_add(ttl_ms);
        let latest_ext = self.external.values().map(|e| e.expires_at).max();
        Some(latest_ext.map_or(sliding, |ext| ext.max(sliding)))
    }

    /// Bytes held by the session, for MEMORY USAGE.
    pub fn mem_usage(&self) -> usize {
        let strings = |s: &String| s.capacity();
        let mut bytes = std::mem::size_of::<Session>()
            + self.messages.capacity() * std::mem::size_of::<Message>()
            + strings(&self.settings.model)
            + self.extra.as_ref().map_or(0, strings);
        for m in &self.messages {
            bytes += m.role.len() + m.content.len() + m.meta.as_ref().map_or(0, |x| x.len());
        }
        if let Some(s) = &self.summary {
            bytes += std::mem::size_of::<Summary>() + strings(&s.text);
        }
        for (k, e) in &self.external {
            bytes += 48 + strings(k) + std::mem::size_of::<ExternalId>() + strings(&e.id);
        }
        bytes
    }
}

mod read;
mod validate;
pub use read::{Selection, SummarizeCheck, Thresholds};
pub use validate::check_json_object;

#[cfg(test)]
pub(crate) mod tests;
