//! The session: messages, summary, settings, external ids and running totals,
//! with every rule of the spec that does not need Redis (append, trimming,
//! summarize thresholds, summary replacement, ext-id expiry, budget selection).
//!
//! Writes are expressed as [`Op`]s that carry everything the master decided
//! (ids, timestamps, token counts, settings). The master applies an op and
//! replicates the same op, so a replica or an AOF reload reaches the same state
//! without consulting its own clock, config or tokenizer.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::tokenizer::Encoding;

/// The role whose messages must stay with the call that produced them.
pub const TOOL_ROLE: &str = "tool";
/// Latest accepted message time: 9999-12-31T23:59:59.999Z, the last instant
/// an ISO 8601 timestamp with a four-digit year can show.
pub const MAX_TS: i64 = 253_402_300_799_999;
/// Longest accepted role, in bytes.
pub const MAX_ROLE_BYTES: usize = 64;
/// Containers serde_json (which MEM.IMPORT parses with) accepts nested in
/// one document: its recursion limit of 128 fails on the 128th.
pub const JSON_MAX_NESTING: usize = 127;
/// Longest accepted model name, in bytes (the model table's bound).
pub use crate::tokenizer::models::MAX_MODEL_BYTES;
/// Largest message id: 2^53 - 1, the largest integer every JSON parser
/// (JavaScript's too) reads exactly, so ids in `FORMAT JSON` round-trip.
pub const MAX_ID: u64 = (1 << 53) - 1;
/// Largest id a stored or replicated session may carry: earlier releases
/// imported ids up to 2^63-1 (they still fit a RESP integer); new ids stop
/// at [`MAX_ID`] (`next_id`).
pub const MAX_STORED_ID: u64 = i64::MAX as u64;
/// Longest TTL (session TTL, EX of an external id, `mem.ttl`, `mem.ext-ttl`):
/// 100 years. Redis 7.0 adds the clock to a relative expiry without an
/// overflow check, so an unbounded TTL could wrap and delete the key.
pub const MAX_TTL_SECS: u64 = 3_153_600_000;
/// Latest absolute expiry (ms) an external id can carry: MAX_TTL after the
/// latest clock a write can have. Far below i64::MAX, whatever Redis adds.
pub const MAX_EXPIRY_MS: i64 = MAX_TS + MAX_TTL_SECS as i64 * 1000;

/// The model-name rule shared by MODEL options, imports, `mem.default-model`
/// and load-time validation.
/// Most bytes of an external system's name (MEM.EXTSET), as an attribute's.
pub const MAX_SYSTEM_BYTES: usize = 64;
/// Most bytes of an external conversation id: an identifier (Dify's and
/// n8n's are UUIDs or short strings), not a document. Bounded so MEM.INFO
/// and FORMAT JSON, which write them on the main thread, stay quick.
pub const MAX_EXTERNAL_ID_BYTES: usize = 4096;
/// Most external systems a session holds at once (as its attributes).
pub const MAX_EXTERNAL_SYSTEMS: usize = 1024;

/// An external system's name and conversation id as MEM.EXTSET and
/// MEM.IMPORT accept them (checked where they come in, not on load).
pub fn check_external_input(system: &str, id: &str) -> Result<(), String> {
    check_external_sizes(system.len(), id.len())?;
    check_name_chars("system", system)
}

/// [`check_external_input`]'s sizes alone (checked before a huge argument
/// is scanned).
pub fn check_external_sizes(system: usize, id: usize) -> Result<(), String> {
    if system == 0 || system > MAX_SYSTEM_BYTES {
        return Err(format!("system must be 1 to {MAX_SYSTEM_BYTES} bytes"));
    }
    if id == 0 || id > MAX_EXTERNAL_ID_BYTES {
        return Err(format!(
            "conversation_id must be 1 to {MAX_EXTERNAL_ID_BYTES} bytes"
        ));
    }
    Ok(())
}

pub fn check_model(model: &str) -> Result<(), String> {
    if model.is_empty() || model.len() > MAX_MODEL_BYTES {
        return Err(format!("model name must be 1 to {MAX_MODEL_BYTES} bytes"));
    }
    Ok(())
}

/// A name given by a client (model, role, msgid, external system,
/// attribute): no control characters (C0, DEL, C1) nor Unicode's line and
/// paragraph separators, which no such name needs and which would reach log
/// lines and terminals as they are. Checked where a name comes in, not on
/// load, so what earlier releases stored still loads.
pub fn check_name_chars(what: &str, name: &str) -> Result<(), String> {
    // ASCII first: names are short, and most are ASCII.
    if let Some(b) = name.bytes().find(u8::is_ascii_control) {
        return Err(format!(
            "{what} must not contain control characters (byte 0x{b:02x})"
        ));
    }
    if name.is_ascii() {
        return Ok(());
    }
    match name
        .chars()
        .find(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        Some(c) => Err(format!(
            "{what} must not contain control characters (U+{:04X})",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

/// A new message with `role` appended at `now` to `session` (None: a new
/// key) under `settings` (the session's as the write changes them): a tool
/// result needs a message before it that a read shows (an LLM API refuses a
/// tool result without its call; one past `maxage` would be kept alive by
/// it), past the MAXAGE the same write sets, as its eviction is
/// (`newest_group`: where the newest tool group starts, when known). The
/// commands check it before the op exists; an op already replicated or in
/// the AOF applies as it was.
pub fn check_tool_has_call(
    session: Option<&Session>,
    role: &str,
    now: i64,
    settings: &Settings,
    newest_group: Option<usize>,
) -> Result<(), SessionError> {
    let cutoff = settings.age_cutoff(now);
    if role == TOOL_ROLE && !session.is_some_and(|s| s.has_live(cutoff, newest_group)) {
        return Err(SessionError::ToolResultFirst);
    }
    Ok(())
}

/// The id after `last_id`, unless every id is used.
pub fn next_id(last_id: u64) -> Result<u64, SessionError> {
    match last_id.checked_add(1) {
        Some(id) if id <= MAX_ID => Ok(id),
        _ => Err(SessionError::IdsExhausted),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub id: u64,
    /// Boxed strings, not `String`s: no spare capacity, 8 bytes less each.
    pub role: Box<str>,
    /// Shared, so a re-count under another encoding can read the texts on
    /// a worker without copying them (see recount.rs).
    pub content: Arc<str>,
    /// Unix time in milliseconds.
    pub ts: i64,
    pub tokens: u64,
    /// A JSON object, kept as the client sent it. Shared, so replicating a
    /// large one takes no copy of it (commands::OpHeader).
    pub meta: Option<Arc<str>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    pub tokens: u64,
    /// Id of the newest message the summary covers.
    pub upto: u64,
    pub ts: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Boxed, not a `String`: no spare capacity, and 8 bytes less keep the
    /// session in the 256-byte class.
    pub model: Box<str>,
    pub encoding: Encoding,
    /// Sliding TTL in seconds; 0 = the key never expires.
    pub ttl: u64,
    pub max_tokens: u64,
    pub max_msgs: u64,
    /// Messages older than this many seconds are evicted by every write and
    /// hidden from every read ("keep only the last N days"); 0 = no limit.
    pub max_age: u64,
}

/// The caps a session is trimmed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub messages: u64,
    pub tokens: u64,
}

impl Settings {
    pub fn caps(&self) -> Caps {
        Caps {
            messages: self.max_msgs,
            tokens: self.max_tokens,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalId {
    pub id: String,
    /// Unix time in milliseconds after which the id is gone.
    pub expires_at: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The messages, oldest first, held compactly (log.rs).
    pub messages: MessageLog,
    pub summary: Option<Box<Summary>>,
    pub settings: Settings,
    /// Orchestrator name -> its conversation id (ordered, so digests agree).
    pub external: Sparse<BTreeMap<String, ExternalId>>,
    /// The last id handed out; ids are never reused, even after eviction.
    pub last_id: u64,
    /// Sum of the summary's and the messages' tokens, kept incrementally.
    pub total_tokens: u64,
    pub created: i64,
    pub updated: i64,
    /// Other top-level members of an imported document (`user_profile`,
    /// `context`, ...), as the JSON text of an object.
    pub extra: Attrs,
    /// The summarizer lease (MEM.SUMMARIZE_BEGIN) and the last token handed
    /// out (lease.rs).
    pub leases: Sparse<Leases>,
    /// The client's ids (MSGID) of the messages held and of the last that
    /// left (trimmed or summarized), so a retried append is recognised
    /// (retry.rs). Kept beside the messages, not in each: a message without
    /// one costs nothing.
    pub msgids: Msgids,
    /// What left the session since it was created (MEM.INFO).
    pub history: History,
}

/// Messages that left a session since it was created: evicted by the caps
/// or MAXAGE with no summary covering them, or covered by summaries. What
/// an operator asks first when an agent "forgot" (MEM.INFO, the doctor).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub evicted: u64,
    pub summarized: u64,
    /// Summaries the caps evicted (what they covered is gone).
    pub summaries_dropped: u64,
}

/// A change to a session, with every value the master decided made explicit.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Append one message (creating the session when missing), after applying
    /// `settings`. The message's id is part of it so the replica agrees.
    Append {
        now: i64,
        settings: Settings,
        message: Message,
        /// The client's id of the message (MSGID), if any.
        msgid: Option<Box<str>>,
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
    /// Every count under another encoding (a model switch): the summary's
    /// tokens and each message's, by id, as the master counted them.
    Recount {
        now: i64,
        encoding: Encoding,
        summary_tokens: Option<u64>,
        counts: Vec<(u64, u64)>,
    },
    /// Set an attribute (creating the session when missing, with `settings`).
    /// `value` is the JSON text the client gave, checked.
    AttrSet {
        now: i64,
        settings: Settings,
        name: String,
        /// Shared with the session that stores it (a value of up to
        /// `mem.max-message-bytes` is copied once, from the command).
        value: Arc<str>,
        /// Its own expiry (ms; MEM.ATTRSET ... EX), if any.
        expires_at: Option<i64>,
    },
    /// Remove every member of an attribute's name.
    AttrDel { now: i64, name: String },
    /// Grant a summarizer lease (MEM.SUMMARIZE_BEGIN): its token and expiry
    /// travel in the op, so replicas hold the same lease.
    Lease { now: i64, lease: Lease },
}

impl Op {
    /// The op without its large text (an appended message's content, a
    /// summary's text), which travels as its own argument: the client's own
    /// string, so a large text is not copied again to replicate it.
    pub fn header(&self) -> Op {
        match self {
            Op::Append {
                now,
                settings,
                message,
                msgid,
            } => Op::Append {
                now: *now,
                settings: settings.clone(),
                message: Message {
                    content: Arc::from(""),
                    meta: message.meta.clone(),
                    role: message.role.clone(),
                    ..*message
                },
                msgid: msgid.clone(),
            },
            Op::Summarize { now, summary } => Op::Summarize {
                now: *now,
                summary: Summary {
                    text: String::new(),
                    ..*summary
                },
            },
            other => other.clone(),
        }
    }

    /// The one text an op's header carries that may be large: an
    /// append's META, an attribute's value.
    pub fn header_text(&self) -> Option<&Arc<str>> {
        match self {
            Op::Append { message, .. } => message.meta.as_ref(),
            Op::AttrSet { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The text that [`Op::header`] leaves out (empty for other ops).
    pub fn content_bytes(&self) -> &[u8] {
        match self {
            Op::Append { message, .. } => message.content.as_bytes(),
            Op::Summarize { summary, .. } => summary.text.as_bytes(),
            _ => &[],
        }
    }

    /// An append's large message laid out from its header's role and META
    /// and `content`, the text [`Op::header`] left out: applied with the op
    /// ([`Session::apply_prepared`]), the content is copied once, into the
    /// log, instead of into the op and then the log (a replica's main
    /// thread). None for other ops and small messages.
    pub fn laid_out(&self, content: &str) -> Option<Prepared> {
        match self {
            Op::Append { message, .. } => {
                Prepared::of(&message.role, message.meta.as_deref(), content)
            }
            _ => None,
        }
    }

    /// Puts back the text that [`Op::header`] left out (copied once: a
    /// replica applies a 4 MB message on its main thread).
    pub fn with_content(mut self, content: &str) -> Op {
        match &mut self {
            Op::Append { message, .. } => message.content = content.into(),
            Op::Summarize { summary, .. } => summary.text = content.to_owned(),
            _ => {}
        }
        self
    }

    /// The session an op starts from when its key does not exist yet.
    pub fn new_session(&self) -> Option<Session> {
        match self {
            Op::Append { now, settings, .. }
            | Op::ExtSet { now, settings, .. }
            | Op::AttrSet { now, settings, .. } => Some(Session::new(settings.clone(), *now)),
            Op::Summarize { .. } | Op::Recount { .. } | Op::AttrDel { .. } | Op::Lease { .. } => {
                None
            }
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
    /// A retried write recognised (MSGID, or the same summary again):
    /// nothing changed, the reply is the original one's.
    pub duplicate: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionError {
    /// SUMMARIZE's `upto` is not a message of the session.
    UnknownUpto(u64),
    /// SUMMARIZE's `upto` is below the current summary's.
    UptoBelowSummary { upto: u64, current: u64 },
    /// The first message a summary would keep is a tool result.
    KeepsToolResult { upto: u64, id: u64 },
    /// The summary plus the messages it keeps exceed `maxtokens`.
    SummaryOverCap {
        tokens: u64,
        kept: u64,
        max_tokens: u64,
    },
    /// A message id (or summary upto) above [`MAX_ID`].
    IdAboveMax(u64),
    /// The session's last id is [`MAX_ID`]: no id is left for a message.
    IdsExhausted,
    /// An op whose message id is not above the session's last id.
    IdNotIncreasing { id: u64, last_id: u64 },
    /// A summary installed over messages it covers.
    SummaryOverMessages { upto: u64 },
    /// A re-count that does not cover exactly the session's summary and
    /// messages, or gives a count its text cannot have.
    RecountMismatch,
    /// An attribute op whose value is not JSON (commands check it first).
    BadAttrValue,
    /// Another summarizer's lease is live and the summary does not give its
    /// token.
    LeaseHeld { expires_in_ms: i64 },
    /// A summary's LEASE token is not the session's current lease (and no
    /// other lease is live).
    LeaseNotCurrent { token: u64 },
    /// A lease op whose token is not above the session's last token.
    LeaseNotIncreasing { token: u64, last: u64 },
    /// The session has handed out every lease token.
    LeasesExhausted,
    /// The session's messages would hold more than [`MAX_LOG_BYTES`].
    SessionFull,
    /// A message's tokens above [`MAX_MESSAGE_TOKENS`].
    TokensAboveMax(u64),
    /// A tool result the session holds no message before: its call was
    /// summarized, evicted or never appended.
    ToolResultFirst,
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::UnknownUpto(upto) => write!(
                f,
                "upto {upto} is not the id of a message in the session (already summarized or evicted?)"
            ),
            SessionError::UptoBelowSummary { upto, current } => {
                write!(f, "upto {upto} is below the current summary's ({current})")
            }
            SessionError::KeepsToolResult { upto, id } => write!(
                f,
                "the first message after upto {upto} (id {id}) is a tool result: it would be separated from its call"
            ),
            SessionError::SummaryOverCap { tokens, kept, max_tokens } => write!(
                f,
                "the summary ({tokens} tokens) plus the messages it keeps ({kept} tokens) exceed maxtokens ({max_tokens}): a summary never evicts a newer message"
            ),
            SessionError::IdAboveMax(id) => write!(f, "id {id} is above the largest id {MAX_STORED_ID}"),
            SessionError::RecountMismatch => {
                write!(f, "the re-count does not match the session's messages")
            }
            SessionError::IdsExhausted => write!(
                f,
                "the session has used every message id (up to {MAX_ID}): start a new session"
            ),
            SessionError::IdNotIncreasing { id, last_id } => {
                write!(f, "message id {id} is not above the session's last id {last_id}")
            }
            SessionError::BadAttrValue => write!(f, "the attribute value is not valid JSON"),
            SessionError::SummaryOverMessages { upto } => {
                write!(f, "a summary up to {upto} cannot be installed over the messages it covers")
            }
            SessionError::LeaseHeld { expires_in_ms } => write!(
                f,
                "another summarizer holds this session's lease for {expires_in_ms} ms more: give its token with LEASE, or wait for it to expire"
            ),
            SessionError::LeaseNotCurrent { token } => write!(
                f,
                "lease {token} is not this session's lease (a summary ended it, another worker took it over, or it was granted before the key was deleted or replaced): call MEM.SUMMARIZE_BEGIN again"
            ),
            SessionError::LeaseNotIncreasing { token, last } => {
                write!(f, "lease token {token} is not above the session's last token {last}")
            }
            SessionError::LeasesExhausted => write!(f, "the session has used every lease token"),
            SessionError::SessionFull => write!(
                f,
                "the session's messages would hold more than {MAX_LOG_BYTES} bytes: summarize or trim it first"
            ),
            SessionError::TokensAboveMax(tokens) => {
                write!(f, "a message of {tokens} tokens is above the largest {MAX_MESSAGE_TOKENS}")
            }
            SessionError::ToolResultFirst => write!(
                f,
                "a tool result cannot be the session's first message: its call is not in the session (summarized, evicted or never appended)"
            ),
        }
    }
}

impl Session {
    pub fn new(settings: Settings, now: i64) -> Session {
        Session {
            messages: MessageLog::new(),
            summary: None,
            settings,
            external: Sparse::default(),
            last_id: 0,
            total_tokens: 0,
            created: now,
            updated: now,
            extra: Attrs::default(),
            leases: Sparse::default(),
            msgids: Msgids::default(),
            history: History::default(),
        }
    }

    pub fn message_count(&self) -> u64 {
        self.messages.len() as u64
    }

    pub fn first_id(&self) -> u64 {
        self.messages.head(0).map_or(0, |h| h.id)
    }

    pub fn summary_tokens(&self) -> u64 {
        self.summary.as_ref().map_or(0, |s| s.tokens)
    }

    /// Applies `op` (moving its message or summary in). Fails without
    /// changing anything. Every op but a re-count (the first half of an
    /// append, which evicts) also evicts the messages older than `maxage`
    /// at the op's `now`, counted in the outcome's `trimmed`.
    pub fn apply(&mut self, op: Op) -> Result<Outcome, SessionError> {
        self.apply_prepared(op, None)
    }

    /// [`Session::apply`] of an append whose message's stored bytes were
    /// built ahead, off the main thread ([`Prepared`]).
    pub fn apply_prepared(
        &mut self,
        op: Op,
        prepared: Option<Prepared>,
    ) -> Result<Outcome, SessionError> {
        let outcome = self.apply_op(op, prepared);
        // The write has trimmed: the space it freed takes what it added.
        self.messages.settle();
        outcome
    }

    /// [`Session::apply`] for one op of several (a batch): the bytes settle
    /// once, after the last one ([`Session::settle`]). `stays_below`: an id
    /// below which every message stays past MAXAGE at the op's `now` (0 at
    /// a batch's first op), set here for the next: a batch's ops share
    /// `now` and settings, so what one append's eviction left before its
    /// tool group stays for the next, which reads only the messages after
    /// (each append read every head: 1,000 appends on a 100,000-message
    /// session held the main thread 0.1-2.6 s).
    pub fn apply_one_of_many(
        &mut self,
        op: Op,
        prepared: Option<Prepared>,
        stays_below: &mut u64,
    ) -> Result<Outcome, SessionError> {
        let Op::Append {
            now,
            settings,
            message,
            msgid,
        } = op
        else {
            *stays_below = 0;
            return self.apply_op(op, prepared);
        };
        // The newest tool group starts at `from`: this message joins it
        // when it is a tool result, else starts its own (no walk back over
        // a group of many results at every message: 1,000 results held a
        // batch 14-28 ms, after a group of 20,000 0.9 s).
        let group = (*stays_below != 0).then(|| {
            let from = self.messages.after_id(*stays_below - 1);
            (from, message.role.as_ref() == TOOL_ROLE)
        });
        let (outcome, group_len) = self.append(now, settings, message, msgid, prepared, group)?;
        let newest = self.messages.len() - group_len;
        *stays_below = self.messages.head(newest).map_or(0, |h| h.id);
        Ok(outcome)
    }

    /// After ops applied with [`Session::apply_one_of_many`].
    pub fn settle(&mut self) {
        self.messages.settle();
    }

    fn apply_op(&mut self, op: Op, prepared: Option<Prepared>) -> Result<Outcome, SessionError> {
        match op {
            Op::Append {
                now,
                settings,
                message,
                msgid,
            } => self
                .append(now, settings, message, msgid, prepared, None)
                .map(|(outcome, _)| outcome),
            Op::Summarize { now, summary } => self.summarize(now, summary),
            Op::ExtSet {
                now,
                settings: _,
                system,
                external,
            } => {
                let aged = self.evict_aged(now, false);
                self.ext_set(now, system, external);
                Ok(self.outcome(0, 0, aged))
            }
            Op::AttrSet {
                now,
                settings: _,
                name,
                value,
                expires_at,
            } => self.apply_attr_set(now, &name, value, expires_at),
            Op::AttrDel { now, name } => Ok(self.apply_attr_del(now, &name)),
            Op::Recount {
                now: _,
                encoding,
                summary_tokens,
                counts,
            } => {
                self.apply_recount(encoding, summary_tokens, &counts)?;
                Ok(self.outcome(0, 0, 0))
            }
            Op::Lease { now: _, lease } => {
                self.grant(lease)?;
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
            duplicate: false,
        }
    }

    fn append(
        &mut self,
        now: i64,
        settings: Settings,
        message: Message,
        msgid: Option<Box<str>>,
        prepared: Option<Prepared>,
        group: Option<(usize, bool)>,
    ) -> Result<(Outcome, usize), SessionError> {
        let (id, tokens) = (message.id, message.tokens);
        self.push_prepared(message, prepared)?;
        if let Some(msgid) = msgid {
            self.msgids.attach(id, msgid);
        }
        self.settings = settings;
        self.updated = now;
        self.purge_external(now);
        // After the settings: a MAXAGE given with this append applies to it.
        let (aged, spared) = match group {
            // The newest tool group started at `from` before this message,
            // which joins it when it is a tool result (see
            // [`Session::apply_one_of_many`]); walked back when not known.
            Some((from, joins)) => {
                let spared = match joins {
                    true => self.messages.len().saturating_sub(from).max(1),
                    false => 1,
                };
                (self.evict_aged_after(now, from, spared), spared)
            }
            None => (self.evict_aged(now, true), self.newest_group_len()),
        };
        // An eviction leaves the newest group whole, unless it is a run of
        // results at the start, which the orphans' drop shortens.
        let spared = spared.min(self.messages.len());
        let trimmed = aged + self.trim_sparing(self.settings.caps(), spared);
        // The newest group's length, as the trim left it (the same rule).
        let spared = spared.min(self.messages.len());
        Ok((self.outcome(id, tokens, trimmed), spared))
    }

    /// Adds `message` as the newest one, keeping `last_id` and the totals.
    /// Its id must be above the last id and at most [`MAX_STORED_ID`]; on
    /// error nothing changes.
    pub fn push_message(&mut self, message: Message) -> Result<(), SessionError> {
        self.push_prepared(message, None)
    }

    fn push_prepared(
        &mut self,
        message: Message,
        prepared: Option<Prepared>,
    ) -> Result<(), SessionError> {
        if message.id <= self.last_id {
            return Err(SessionError::IdNotIncreasing {
                id: message.id,
                last_id: self.last_id,
            });
        }
        if message.id > MAX_STORED_ID {
            return Err(SessionError::IdAboveMax(message.id));
        }
        self.messages
            .push_prepared(
                message.id,
                message.ts,
                message.tokens,
                &message.role,
                message.meta.as_deref(),
                &message.content,
                prepared,
            )
            .map_err(|e| match e {
                LogError::Full => SessionError::SessionFull,
                LogError::Tokens => SessionError::TokensAboveMax(message.tokens),
            })?;
        self.last_id = message.id;
        self.total_tokens = self.total_tokens.saturating_add(message.tokens);
        Ok(())
    }

    /// Makes `summary` the session's summary (replacing any), keeping the
    /// totals; `last_id` moves up to its `upto` (an import's summary may
    /// cover messages the session never held). It must cover no message
    /// still in the session; on error nothing changes.
    pub fn set_summary(&mut self, summary: Summary) -> Result<(), SessionError> {
        if summary.upto > MAX_STORED_ID {
            return Err(SessionError::IdAboveMax(summary.upto));
        }
        if self.messages.front().is_some_and(|m| m.id <= summary.upto) {
            return Err(SessionError::SummaryOverMessages { upto: summary.upto });
        }
        if let Some(old) = self.summary.take() {
            self.total_tokens -= old.tokens;
        }
        self.total_tokens = self.total_tokens.saturating_add(summary.tokens);
        self.last_id = self.last_id.max(summary.upto);
        self.summary = Some(Box::new(summary));
        Ok(())
    }

    /// Evicts the oldest messages until the session is within `caps`.
    ///
    /// The newest message is spared when `protect_newest` (an append never
    /// evicts its own message). The summary goes only once no message can go
    /// instead. A `tool` message is never left as the oldest one: a tool
    /// result whose call was evicted goes with it. Returns the messages evicted.
    pub fn trim(&mut self, caps: Caps, protect_newest: bool) -> u64 {
        // The newest message and, when it is a tool result, the rest of its
        // tool group: a group alone over a cap is held until a later write.
        let spared = if protect_newest {
            self.newest_group_len()
        } else {
            0
        };
        self.trim_sparing(caps, spared)
    }

    /// [`Session::trim`] sparing the newest `spared` messages.
    fn trim_sparing(&mut self, caps: Caps, spared: usize) -> u64 {
        let mut evicted = self.evict_over_caps(caps, spared);
        if evicted > 0 {
            evicted += self.drop_orphan_tool_results(spared);
        }
        if self.total_tokens > caps.tokens {
            if let Some(summary) = self.summary.take() {
                self.total_tokens -= summary.tokens;
                self.history.summaries_dropped += 1;
            }
        }
        evicted
    }

    /// Evicts the oldest messages while the session is over `caps` (the
    /// summary's tokens counted), sparing the newest `spared`; never touches
    /// the summary nor the tool rule (see [`Session::trim`]). An import
    /// streams its document through this after each message, so it holds at
    /// most the caps + 1 messages. Returns the messages evicted.
    pub fn evict_over_caps(&mut self, caps: Caps, spared: usize) -> u64 {
        // How many of the oldest must go, from the heads alone; then the cut
        // moves to where a tool group starts (a call and the results after
        // it leave together), never into the spared newest. Only the bytes
        // at the cut are read: reading every evicted message's role cost a
        // cache miss each (100,000 evicted by a lowered cap: 37-56 ms).
        let len = self.messages.len();
        let (mut count, mut total, mut need) = (len as u64, self.total_tokens, 0);
        for h in self.messages.heads() {
            if count <= caps.messages && total <= caps.tokens {
                break;
            }
            count -= 1;
            total = total.saturating_sub(u64::from(h.tokens));
            need += 1;
        }
        if need == 0 {
            return 0;
        }
        // A group starts at a message that is not a tool result (or at len).
        // Never into the spared newest: the walk stops at their start (a
        // walk over a group of 20,000 results held over the cap, at every
        // message of a batch, held the main thread 0.4 s).
        let limit = len.saturating_sub(spared);
        let mut cut = need;
        while cut <= limit && cut < len && self.messages.is_tool(cut) {
            cut += 1;
        }
        if cut > limit {
            cut = limit;
            while cut > 0 && self.messages.is_tool(cut) {
                cut -= 1;
            }
        }
        self.history.evicted += self.drop_front(cut);
        cut as u64
    }

    /// The messages of the tool group that starts at index `i`: the message
    /// and the tool results right after it (0 past the end).
    pub fn group_len_at(&self, i: usize) -> usize {
        let len = self.messages.len();
        if i >= len {
            return 0;
        }
        let mut end = i + 1;
        while end < len && self.messages.is_tool(end) {
            end += 1;
        }
        end - i
    }

    /// The session under another key name (COPY): the message segments
    /// shared, copied on write (log.rs), so a copy costs the heads, not the
    /// bytes; and no live lease. A lease is one worker's for one key: the
    /// copy's own workers may begin at once, and the original's token does
    /// not commit on it. The last token stays, so the copy's are above it.
    pub fn copy_for_key(&self) -> Session {
        let mut copy = self.clone();
        copy.messages = self.messages.copy_for_key();
        copy.leases.shrink(|l| l.current = None);
        copy
    }

    /// Bytes a summary up to `upto` would replace: the current summary's
    /// text and the stored bytes of the messages with `id <= upto`.
    pub fn bytes_up_to(&self, upto: u64) -> usize {
        let n = self.messages.after_id(upto);
        self.summary.as_ref().map_or(0, |s| s.text.len())
            + (0..n)
                .map(|i| self.messages.stored_len_of(i))
                .sum::<usize>()
    }

    /// The messages of the newest tool group: the newest message and, when it
    /// is a tool result, back to its call (1 for a message that is not).
    pub fn newest_group_len(&self) -> usize {
        let len = self.messages.len();
        let mut start = len.saturating_sub(1);
        while start > 0 && self.messages.is_tool(start) {
            start -= 1;
        }
        len - start
    }

    /// Trims an imported session: to its caps as an append does (the
    /// document's newest message is spared), then drops the tool results
    /// left first, whose call is not in the session (even the newest one:
    /// no append of its own protects it). Returns the messages dropped.
    pub fn trim_imported(&mut self) -> u64 {
        self.trim_imported_after(None)
    }

    /// As [`Session::trim_imported`], for the module's own document (FORMAT
    /// JSON) whose import evicted `evicted_before` while streaming: a tool
    /// result first stays unless something was evicted, as the session
    /// held it (one appended after the summary that covered its call; an
    /// export and import dropped it).
    pub fn trim_imported_own(&mut self, evicted_before: u64) -> u64 {
        self.trim_imported_after(Some(evicted_before))
    }

    /// `own_evicted`: what the module's own document evicted while
    /// streaming (None for another tool's document, whose leading tool
    /// results always go).
    fn trim_imported_after(&mut self, own_evicted: Option<u64>) -> u64 {
        let mut trimmed = self.trim(self.settings.caps(), true);
        if own_evicted.is_none_or(|before| before + trimmed > 0) {
            trimmed += self.drop_orphan_tool_results(0);
        }
        self.messages.settle();
        trimmed
    }

    /// Evicts tool results at the front (their call is gone), sparing the
    /// newest `spared` messages.
    fn drop_orphan_tool_results(&mut self, spared: usize) -> u64 {
        let mut evicted = 0;
        while self.messages.len() > spared && self.messages.is_tool(0) {
            self.evict_oldest();
            evicted += 1;
        }
        evicted
    }

    fn evict_oldest(&mut self) {
        if self.drop_oldest() {
            self.history.evicted += 1;
        }
    }

    /// Removes the oldest `n` messages (evicted, or covered by a summary)
    /// at once; returns how many went. Their msgids leave together, and
    /// only when the session has any.
    fn drop_front(&mut self, n: usize) -> u64 {
        let n = n.min(self.messages.len());
        if self.msgids.holds_any() {
            let left: Vec<(u64, u64)> = self
                .messages
                .heads()
                .take(n)
                .map(|h| (h.id, u64::from(h.tokens)))
                .collect();
            self.msgids.leave_ids(&left);
        }
        let tokens = self.messages.tokens_in(0..n);
        self.messages.drop_front(n);
        self.total_tokens = self.total_tokens.saturating_sub(tokens);
        n as u64
    }

    /// Removes the oldest message (evicted, or covered by a summary).
    fn drop_oldest(&mut self) -> bool {
        let Some((id, tokens)) = self.messages.pop_front() else {
            return false;
        };
        self.total_tokens -= tokens;
        self.msgids.leave_id(id, tokens);
        true
    }

    /// Why a summary up to `upto` cannot replace what it covers, whatever
    /// its text (so a command can refuse before counting the text); else
    /// the index of the `upto` message.
    pub fn check_summary_upto(&self, upto: u64) -> Result<usize, SessionError> {
        if let Some(current) = self.summary.as_ref().filter(|c| upto < c.upto) {
            return Err(SessionError::UptoBelowSummary {
                upto,
                current: current.upto,
            });
        }
        let Some(pos) = self.messages.position(upto) else {
            return Err(SessionError::UnknownUpto(upto));
        };
        if let Some(first) = self.messages.get(pos + 1).filter(|m| m.is_tool()) {
            return Err(SessionError::KeepsToolResult { upto, id: first.id });
        }
        Ok(pos)
    }

    /// Why `summary` cannot replace what it covers, if it cannot (spec
    /// MEM.SUMMARIZE); otherwise the index of its `upto` message.
    pub fn check_summary(&self, summary: &Summary) -> Result<usize, SessionError> {
        let pos = self.check_summary_upto(summary.upto)?;
        let kept_tokens = self.messages.tokens_in(pos + 1..self.messages.len());
        let max_tokens = self.settings.max_tokens;
        if summary.tokens.saturating_add(kept_tokens) > max_tokens {
            return Err(SessionError::SummaryOverCap {
                tokens: summary.tokens,
                kept: kept_tokens,
                max_tokens,
            });
        }
        Ok(pos)
    }

    /// Replaces the summary and every message with `id <= summary.upto`.
    /// Nothing else is evicted: a summary that does not fit is refused.
    fn summarize(&mut self, now: i64, summary: Summary) -> Result<Outcome, SessionError> {
        // Messages too old are gone before the summary is checked (an upto
        // among them is refused, as a read no longer shows it). Evicted on
        // a copy when any is old, so a refused summary changes nothing: a
        // copy evicted as a write evicts (a read's view is never written;
        // one installed as the session broke its bytes and its RDB).
        if let Some(gone) = self.aged(now, false) {
            let mut next = self.clone();
            let aged = next.evict_flagged(gone, false);
            let mut outcome = next.summarize_live(now, summary)?;
            outcome.trimmed = aged;
            *self = next;
            return Ok(outcome);
        }
        self.summarize_live(now, summary)
    }

    fn summarize_live(&mut self, now: i64, summary: Summary) -> Result<Outcome, SessionError> {
        let pos = self.check_summary(&summary)?;
        self.history.summarized += self.drop_front(pos + 1);
        let (upto, tokens) = (summary.upto, summary.tokens);
        self.set_summary(summary)?; // cannot fail: checked, covered messages gone
                                    // The work a lease was granted for is done: the session is free.
        self.leases.shrink(|l| l.current = None);
        self.updated = now;
        self.purge_external(now);
        Ok(self.outcome(upto, tokens, 0))
    }

    fn ext_set(&mut self, now: i64, system: String, external: ExternalId) {
        self.purge_external(now);
        self.external.insert(system, external);
    }

    /// Drops external ids whose time is up. `now` comes from the op, so the
    /// master and its replicas drop the same ones.
    fn purge_external(&mut self, now: i64) {
        self.external
            .shrink(|ext| ext.retain(|_, e| e.expires_at > now));
        self.extra.purge(now);
    }

    /// Whether an id for `system` can be set at `now`: it has one, or fewer
    /// than [`MAX_EXTERNAL_SYSTEMS`] live ones are held.
    pub fn has_room_for_external(&self, system: &str, now: i64) -> bool {
        self.external.get(system).is_some()
            || self
                .external
                .values()
                .filter(|e| e.expires_at > now)
                .count()
                < MAX_EXTERNAL_SYSTEMS
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
        // ttl <= MAX_TTL_SECS and external expiries <= MAX_EXPIRY_MS (both
        // validated), so the expiry stays far below what Redis can add its
        // clock to; min() only guards values that skipped validation.
        let ttl_ms = self.settings.ttl.min(MAX_TTL_SECS) as i64 * 1000;
        let sliding = now.saturating_add(ttl_ms);
        let latest_ext = self
            .external
            .values()
            .map(|e| e.expires_at)
            .chain(self.extra.latest_expiry())
            .map(|at| at.min(MAX_EXPIRY_MS))
            .max();
        Some(latest_ext.map_or(sliding, |ext| ext.max(sliding)))
    }

    /// Bytes held by the session, for MEMORY USAGE.
    pub fn mem_usage(&self) -> usize {
        let strings = |s: &String| s.capacity();
        let mut bytes = std::mem::size_of::<Session>()
            + self.messages.mem_usage()
            + self.settings.model.len()
            + self.leases.boxed_bytes()
            + self.external.boxed_bytes()
            + self.extra.mem_usage();
        bytes += self.msgids.mem_usage();
        if let Some(s) = &self.summary {
            bytes += std::mem::size_of::<Summary>() + strings(&s.text);
        }
        for (k, e) in &self.external {
            bytes += 48 + strings(k) + std::mem::size_of::<ExternalId>() + strings(&e.id);
        }
        bytes
    }
}

mod age;
mod attrs;
pub mod garbage;
mod heads;
mod lease;
mod log;
mod read;
mod recount;
mod retry;
mod sparse;
mod validate;
pub use attrs::{check_attr_name, Attrs, MAX_ATTRS, MAX_ATTR_NAME_BYTES, RESERVED_ATTR_NAMES};
pub use lease::{above_every_issued_token, note_issued, Lease, Leases, MAX_LEASE_MS};
pub use log::{
    decode_data, encode_data, LogError, MessageLog, MessageRef, Prepared, StoredLog, MAX_LOG_BYTES,
    MAX_MESSAGE_TOKENS,
};
pub use read::{Selection, SummarizeCheck, Thresholds};
pub use recount::{Coverage, Recounted, Snapshot};
pub use retry::{check_msgid, Departed, Msgids, MAX_DEPARTED, MAX_MSGID_BYTES};
pub use sparse::Sparse;
pub use validate::{
    check_attr_value, check_members, check_meta, meta_calls_tools, MAX_MEMBERS_DEPTH,
    MAX_META_DEPTH,
};

#[cfg(test)]
mod age_tests;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_retry;
