//! MEM.APPENDBATCH: several messages appended in one atomic command, so an
//! agent step (an assistant tool call and its results) needs no MULTI/EXEC,
//! which cannot wait for a worker: a large batch is parsed and counted on
//! the pool like a large MEM.APPEND.

use std::collections::HashMap;
use std::sync::Arc;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::args::Options;
use super::reply::Reply;
use super::SETTINGS_OPTIONS;
use super::{
    finish_write, now_ms, session_thresholds, settings_thresholds, write_outcome, Events, OpHeader,
    Propagate, SettingsOptions,
};
use crate::config::Config;
use crate::declare::{entry, key, string, Access::*, CommandDecl};
use crate::key::SessionKey;
use crate::offload::{self, can_block, encoding_build, model_switch, Pass};
use crate::session::{
    check_tool_has_call, next_id, Message, Op, Outcome, Prepared, Recounted, Session, Settings,
    Snapshot, Thresholds, MAX_MESSAGE_TOKENS, MAX_ROLE_BYTES, MAX_TS, TOOL_ROLE,
};
use crate::stats;
use crate::tokenizer::{count_message, Counting};

/// Most messages one batch may carry.
pub const MAX_BATCH: usize = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Item<'a> {
    role: String,
    /// None: missing; Some(None): null, allowed on a turn that only calls
    /// tools (META's `tool_calls`), as MEM.IMPORT allows it.
    #[serde(default, deserialize_with = "present")]
    content: Option<Option<String>>,
    #[serde(default)]
    ts: Option<u64>,
    #[serde(default, borrow)]
    meta: Option<&'a RawValue>,
    #[serde(default)]
    msgid: Option<String>,
    /// The message's tokens as the client knows them (MEM.APPEND's TOKENS).
    #[serde(default)]
    tokens: Option<u64>,
}

/// A message's content as the string replication sends (`MEM._APPLY key
/// header content`), made by the worker for a large batch so the main
/// thread copies none of its bytes for replicas and the AOF.
struct Wire(RedisString);

// SAFETY: created without a context (RedisModule_CreateString with a NULL
// ctx only allocates through Redis's thread-safe allocator and copies);
// nothing else refers to it until the main thread passes it to replication;
// dropping it before then (a refcount decrement to zero, a free) is safe on
// any thread.
unsafe impl Send for Wire {}

/// A batch message, checked, with its tokens.
struct Counted {
    role: String,
    /// Shared as the session stores it, made on the worker for a large batch.
    content: Arc<str>,
    ts: Option<i64>,
    meta: Option<Arc<str>>,
    msgid: Option<String>,
    /// Given by the client: not counted.
    given: Option<u64>,
    tokens: u64,
    wire: Option<Wire>,
    /// A large message's stored bytes, laid out on the worker (as
    /// MEM.APPEND's).
    prepared: Option<Prepared>,
}

/// What a worker made of the batch: its messages counted under `encoding`,
/// or the reason the batch is refused.
struct Parsed {
    counting: Counting,
    messages: Result<Vec<Counted>, String>,
    /// The session's re-count, when the batch switches its tokenizer.
    recounted: Option<Recounted>,
}

/// The bounds a batch's items are checked against.
#[derive(Clone, Copy)]
struct Limits {
    message_bytes: u64,
    tokens: u64,
}

/// `on_worker`: the contents' replication strings are made here too.
fn parse(bytes: &[u8], counting: Counting, limits: Limits, on_worker: bool) -> Parsed {
    let messages = parse_items(bytes, limits)
        .map(|items| count(items, counting))
        .map(|mut items| {
            if on_worker {
                for m in &mut items {
                    m.wire = Some(Wire(RedisString::create_from_slice(
                        std::ptr::null_mut(),
                        m.content.as_bytes(),
                    )));
                    m.prepared = Prepared::of(&m.role, m.meta.as_deref(), &m.content);
                }
            }
            items
        });
    Parsed {
        counting,
        messages,
        recounted: None,
    }
}

/// A member that is there, null or not (a missing one stays None).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

fn parse_items(bytes: &[u8], limits: Limits) -> Result<Vec<Counted>, String> {
    let text = crate::utf8::str(bytes).ok_or_else(|| "messages is not valid UTF-8".to_owned())?;
    let items: Vec<Item> = serde_json::from_str(text).map_err(|e| {
        let shape = "messages must be a JSON array of {\"role\",\"content\",\"ts\"?,\"meta\"?,\"msgid\"?,\"tokens\"?} objects";
        match first_bad_item(text) {
            Some((i, why)) => format!("{shape}: messages[{i}]: {why}"),
            None => format!("{shape}: {e}"),
        }
    })?;
    if items.is_empty() || items.len() > MAX_BATCH {
        return Err(format!("a batch holds 1 to {MAX_BATCH} messages"));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| check(item, limits).map_err(|e| format!("messages[{i}]: {e}")))
        .collect()
}

/// The first item of a well-formed JSON array that is not a batch item, and
/// why: serde's error for the whole array names only a line and column
/// (hostile pass 54 F4). Only on the error path: the array is parsed again.
fn first_bad_item(text: &str) -> Option<(usize, serde_json::Error)> {
    let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
    items.iter().enumerate().find_map(|(i, raw)| {
        serde_json::from_str::<Item>(raw.get())
            .err()
            .map(|e| (i, e))
    })
}

fn check(item: Item, limits: Limits) -> Result<Counted, String> {
    let max_message_bytes = limits.message_bytes;
    if item.tokens.is_some_and(|n| n > limits.tokens) {
        return Err(format!(
            "tokens must be at most {} (mem.max-tokens-limit)",
            limits.tokens
        ));
    }
    if item.role.is_empty() || item.role.len() > MAX_ROLE_BYTES {
        return Err(format!("role must be 1 to {MAX_ROLE_BYTES} bytes"));
    }
    crate::session::check_name_chars("role", &item.role)?;
    let ts = match item.ts {
        Some(t) if t > MAX_TS as u64 => {
            return Err(format!("ts must be at most {MAX_TS} (9999-12-31)"))
        }
        t => t.map(|t| t as i64),
    };
    let meta = match item.meta {
        Some(raw) => {
            let text = raw.get();
            if text.len() as u64 > max_message_bytes {
                return Err("meta is above mem.max-message-bytes".to_owned());
            }
            crate::session::check_meta(text)?;
            Some(Arc::from(text))
        }
        None => None,
    };
    let content = match item.content {
        Some(Some(content)) => content,
        Some(None) if crate::session::meta_calls_tools(meta.as_deref()) => String::new(),
        Some(None) => {
            return Err(
                "content must be a string (null only on a message with tool calls)".to_owned(),
            )
        }
        None => return Err("missing field `content`".to_owned()),
    };
    if content.len() as u64 > max_message_bytes {
        return Err(format!(
            "content is {} bytes, above mem.max-message-bytes ({max_message_bytes})",
            content.len()
        ));
    }
    if let Some(msgid) = &item.msgid {
        crate::session::check_msgid(msgid)?;
        crate::session::check_name_chars("msgid", msgid)?;
    }
    Ok(Counted {
        role: item.role,
        content: Arc::from(content),
        ts,
        meta,
        msgid: item.msgid,
        given: item.tokens,
        tokens: 0,
        wire: None,
        prepared: None,
    })
}

fn count(mut messages: Vec<Counted>, counting: Counting) -> Vec<Counted> {
    for m in &mut messages {
        m.tokens = match m.given {
            Some(n) => n,
            None => count_message(counting, &m.role, &m.content, m.meta.as_deref()),
        };
    }
    messages
}

/// One message of a batch, ready to append. Whether it is a retry is
/// settled when its turn comes, as consecutive MEM.APPENDs would settle
/// it: an earlier message of the batch may evict the one its msgid names
/// and push that msgid out of the ones the session remembers.
struct Step {
    op: Op,
    wire: Option<Wire>,
    prepared: Option<Prepared>,
    /// What its msgid named when the batch was checked.
    retry_of: Option<RetryOf>,
}

/// The message a batch's message may be a retry of.
#[derive(Clone, Copy)]
enum RetryOf {
    /// The session's (held or departed), before the batch: `(id, tokens)`.
    Session(u64, u64),
    /// An earlier message of the batch.
    Earlier,
}

/// The steps of a batch, each message's retry looked up in the session
/// as it is before the batch (the ids of new messages are given when they
/// are appended).
fn steps(
    messages: Vec<Counted>,
    session: Option<&Session>,
    settings: &Settings,
    now: i64,
) -> Result<Vec<Step>, RedisError> {
    // The msgids of the batch's new messages (a batch holds up to
    // MAX_BATCH: a set, not a scan per item).
    let mut batch_msgids: std::collections::HashSet<String> = Default::default();
    let mut steps = Vec::with_capacity(messages.len());
    // The session's msgids, indexed once when the batch names several: a
    // scan of the held ones per item held the main thread ~2 us per held
    // msgid per batch (56 ms at 30,000).
    let named: std::collections::HashSet<&str> =
        messages.iter().filter_map(|m| m.msgid.as_deref()).collect();
    let held = session
        .filter(|_| named.len() > 8)
        .map(|s| s.find_msgids(&named));
    drop(named);
    let find = |msgid: &str| match &held {
        Some(index) => index.get(msgid).copied(),
        None => session.and_then(|s| s.find_msgid(msgid)),
    };
    // A tool result needs a message before it: once one of the batch is
    // new, the session is not looked at again. The first message appended
    // is the first that is not a retry here: nothing changes before it.
    let mut appended = false;
    for (i, m) in messages.into_iter().enumerate() {
        let retry_of = m
            .msgid
            .as_ref()
            .and_then(|msgid| match batch_msgids.contains(msgid) {
                true => Some(RetryOf::Earlier),
                false => find(msgid).map(|(id, tokens)| RetryOf::Session(id, tokens)),
            });
        if retry_of.is_none() {
            if !appended {
                check_tool_has_call(session, &m.role, now, settings, None)
                    .map_err(|e| crate::error::invalid(format!("messages[{i}]: {e}")))?;
                appended = true;
            }
            if let Some(msgid) = &m.msgid {
                batch_msgids.insert(msgid.clone());
            }
        }
        let message = Message {
            // Given when it is appended (Batch::commit).
            id: 0,
            role: m.role.into(),
            content: m.content,
            ts: m.ts.unwrap_or(now),
            tokens: m.tokens,
            meta: m.meta,
        };
        let msgid = m.msgid.map(Box::from);
        steps.push(Step {
            op: Op::Append {
                now,
                settings: settings.clone(),
                message,
                msgid,
            },
            wire: m.wire,
            prepared: m.prepared,
            retry_of,
        });
    }
    Ok(steps)
}

/// MEM.APPENDBATCH key messages [MODEL name] [TTL seconds] [MAXTOKENS n] [MAXMSGS n]
pub fn append_batch(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    batch_counted(ctx, args, Pass::Fresh)
}

/// MEM.APPENDBATCH, resumed with the batch parsed and counted off the main
/// thread: parse the options, hand a large batch to a worker, parse and
/// count what is left inline, check the whole batch, commit, reply.
fn batch_counted(ctx: &Context, args: Vec<RedisString>, pass: Pass<Parsed>) -> RedisResult {
    super::arity(&args, 3)?;
    let resumed = pass.is_resumed();
    let keyname = &args[1];
    let raw = &args[2];
    let opts = Options::parse(&args[3..], &APPEND_BATCH)?;
    let cfg = Config::current();
    let changes = SettingsOptions::parse(&opts, &cfg)?;
    check_batch_size(raw.len(), &cfg)?;
    let mut key = SessionKey::open(ctx, keyname, true)?;
    let settings = changes.merge(key.session(), &cfg);
    let encoding = settings.encoding;
    let counting = Counting::new(&settings.model, encoding);
    // A message's tokens are stored in 32 bits, whatever the limit allows.
    let limits = Limits {
        message_bytes: cfg.max_message_bytes,
        tokens: cfg.max_tokens_limit.min(MAX_MESSAGE_TOKENS),
    };
    if let Some(snapshot) = worker_needed(ctx, &key, raw.len(), counting, resumed, &cfg)? {
        drop(key);
        return offload::run(ctx, args, 1, 2, batch_counted, move |bytes| {
            let recounted = model_switch::count(snapshot, counting);
            Parsed {
                recounted,
                ..parse(bytes, counting, limits, true)
            }
        });
    }
    let parsed = match pass.output() {
        Some(p) => p,
        None => parse(raw.as_slice(), counting, limits, false),
    };
    // The worker's re-count stands only under the counting it used.
    let recounted = parsed.recounted.filter(|_| parsed.counting == counting);
    let messages = counted_under(parsed.messages, parsed.counting, counting, raw.len(), &cfg)?;
    let now = now_ms();
    let steps = steps(messages, key.session(), &settings, now)?;
    let outcomes = if steps.iter().all(|s| s.retry_of.is_some()) {
        retried_whole(key.session(), &steps, now, &cfg)
    } else {
        check_room(key.session(), &steps)?;
        // Every message may turn out new by its turn; when the ids left
        // are fewer than the messages, the batch is run on a copy first
        // (commit): only the messages new by their turn take one.
        let last_id = key.session().map_or(0, |s| s.last_id);
        let ids_short = (0..steps.len())
            .try_fold(last_id, |id, _| next_id(id))
            .is_err();
        let thresholds = settings_thresholds(&settings, &cfg);
        let batch = Batch {
            steps,
            now,
            counting,
            recounted,
            ids_short,
        };
        batch.commit(ctx, keyname, &mut key, thresholds, &cfg)?
    };
    let reply = Reply::new(ctx);
    reply.array(outcomes.len());
    for (outcome, summarize) in &outcomes {
        write_outcome(&reply, outcome, *summarize);
    }
    Ok(RedisValue::NoReply)
}

/// The parsed messages, counted under `encoding`: again here when the
/// session's model changed while the worker counted (refused when large).
fn counted_under(
    messages: Result<Vec<Counted>, String>,
    counted_as: Counting,
    counting: Counting,
    len: usize,
    cfg: &Config,
) -> Result<Vec<Counted>, RedisError> {
    let messages = messages.map_err(|e| crate::error::invalid(e.to_string()))?;
    if counted_as == counting {
        return Ok(messages);
    }
    model_switch::recount_inline_allowed(counted_as, counting, len, cfg)?;
    Ok(count(messages, counting))
}

/// A batch holds at most four messages' worth of bytes.
fn check_batch_size(len: usize, cfg: &Config) -> Result<(), RedisError> {
    let max_batch_bytes = cfg.max_message_bytes.saturating_mul(4);
    if len as u64 > max_batch_bytes {
        return Err(crate::error::invalid(format!(
            "messages is {len} bytes, above 4 x mem.max-message-bytes ({max_batch_bytes})"
        )));
    }
    Ok(())
}

/// Whether a fresh batch goes to a worker (`Some`, with the session's
/// snapshot to re-count when the write switches its tokenizer): a large
/// batch, an encoding not built yet (the worker that counts builds it), a
/// large session to re-count.
fn worker_needed(
    ctx: &Context,
    key: &SessionKey,
    len: usize,
    counting: Counting,
    resumed: bool,
    cfg: &Config,
) -> Result<Option<Option<Snapshot>>, RedisError> {
    let encoding = counting.encoding;
    let unbuilt = !resumed && encoding_build::must_wait(ctx, encoding)?;
    if resumed {
        encoding_build::require(ctx, encoding)?;
    }
    let (large, snapshot) =
        offload::heavy_parts(ctx, key.session(), "messages", len, counting, resumed, cfg)?;
    let offload = large || unbuilt || snapshot.is_some();
    Ok((!resumed && offload && can_block(ctx)).then_some(snapshot))
}

/// Every limit is checked before the first message goes in: a batch
/// applies whole or not at all (its ops replicate only at the end). Its
/// retries count too: one may be new by its turn.
fn check_room(session: Option<&Session>, steps: &[Step]) -> Result<(), RedisError> {
    let Some(session) = session else {
        return Ok(());
    };
    let added = steps.iter().filter_map(|s| match &s.op {
        Op::Append { message, .. } => {
            Some((&*message.role, message.meta.as_deref(), &*message.content))
        }
        _ => None,
    });
    if session.messages.has_room_for(added) {
        Ok(())
    } else {
        Err(crate::error::session(
            crate::session::SessionError::SessionFull,
        ))
    }
}

/// A batch retried whole: nothing changes, nothing is replicated; each
/// message answered as its original was.
fn retried_whole(
    session: Option<&Session>,
    steps: &[Step],
    now: i64,
    cfg: &Config,
) -> Vec<(Outcome, bool)> {
    let mut outcomes = Vec::with_capacity(steps.len());
    if let Some(session) = session {
        let totals = retry_totals(session, now, cfg);
        // All retries of the session's: an earlier message of the batch
        // would have been new.
        for step in steps {
            if let Some(RetryOf::Session(id, tokens)) = step.retry_of {
                outcomes.push(retry_outcome(&totals, id, tokens));
            }
        }
        stats::add(&stats::DUPLICATES, outcomes.len() as u64);
    }
    outcomes
}

/// What a retry's reply takes from the session, as MEM.APPEND's: its
/// totals as reads show them (past maxage left out) and whether it meets
/// its own thresholds (`id` and `tokens` are the retried message's).
fn retry_totals(session: &Session, now: i64, cfg: &Config) -> (Outcome, bool) {
    let live = session.live(now);
    let summarize = live.meets(session_thresholds(&live, cfg));
    (live.duplicate_outcome(0, 0), summarize)
}

/// The reply to a retry of message `id`, which carries `tokens`.
fn retry_outcome((totals, summarize): &(Outcome, bool), id: u64, tokens: u64) -> (Outcome, bool) {
    let outcome = Outcome {
        id,
        tokens,
        ..totals.clone()
    };
    (outcome, *summarize)
}

/// A checked batch with something new in it, ready to commit.
struct Batch {
    steps: Vec<Step>,
    now: i64,
    counting: Counting,
    /// The session's counts under `encoding`, counted by the worker.
    recounted: Option<Recounted>,
    /// The session has fewer ids left than the batch has messages.
    ids_short: bool,
}

impl Batch {
    /// Applies every step, replicates the ops, sets the expiry; the
    /// outcome of each message and whether the session then meets its
    /// summarization threshold.
    fn commit(
        self,
        ctx: &Context,
        keyname: &RedisString,
        key: &mut SessionKey,
        thresholds: Thresholds,
        cfg: &Config,
    ) -> Result<Vec<(Outcome, bool)>, RedisError> {
        self.check_on_copy(key.session(), thresholds, cfg)?;
        // Everything is validated; from here on the write cannot fail (an
        // op is refused only for an id that is not increasing, checked above).
        let first = self.first_session();
        let (now, counting) = (self.now, self.counting);
        let recounted = self.recounted;
        let session = key.session_or_create(|| first)?;
        let mut wires = Vec::with_capacity(self.steps.len());
        let steps = self.steps.into_iter().map(|s| {
            let wire = s.wire;
            (s.op, s.prepared, s.retry_of, wire)
        });
        // A new tokenizer: the session re-counted (replicated as an op)
        // before the first message appended, as a MEM.APPEND's would be.
        let recount = |s: &mut Session| {
            model_switch::apply(ctx, keyname, s, now, counting, recounted.as_ref())
        };
        let outcomes = replay(
            session,
            steps,
            now,
            thresholds,
            cfg,
            recount,
            |_, _, op, wire, _| {
                // MEM._APPLY key header content: the content's string the
                // worker made for a large batch, or one made here.
                let content = match wire {
                    Some(Wire(s)) => s,
                    None => RedisString::create_from_slice(ctx.ctx, op.content_bytes()),
                };
                wires.push((OpHeader::of(op), content));
                Ok(())
            },
        )?;
        let retries = outcomes.iter().filter(|(o, _)| o.duplicate).count();
        stats::add(&stats::DUPLICATES, retries as u64);
        let how = Propagate::Ops(wires);
        session.settle();
        let expiry = session.key_expiry(now);
        let events = Events::appends(&outcomes);
        finish_write(ctx, keyname, key, how, expiry, &events);
        Ok(outcomes)
    }

    /// The session a batch to a missing key creates.
    fn first_session(&self) -> Option<Session> {
        self.steps
            .iter()
            .find(|s| s.retry_of.is_none())
            .and_then(|s| s.op.new_session())
    }

    /// What only running the batch settles, settled on a copy of the
    /// session before the batch changes anything. A tool result needs a
    /// message a read shows before it, as each MEM.APPEND checks
    /// (`check_tool_has_call`): every message of a batch is read at `now`,
    /// so one appended before a tool result shows, unless its TS is already
    /// past MAXAGE (then a message that ages out may take others with it).
    /// And when the session has fewer ids left than the batch has messages,
    /// only those new by their turn (not retries) take one. Rare: any other
    /// batch is not copied.
    fn check_on_copy(
        &self,
        session: Option<&Session>,
        thresholds: Thresholds,
        cfg: &Config,
    ) -> Result<(), RedisError> {
        // From the last message back: one pass, whatever the batch's size.
        let mut tool_after = false;
        let aged_then_tool = self.steps.iter().rev().any(|s| match &s.op {
            Op::Append {
                settings, message, ..
            } => {
                let aged = settings
                    .age_cutoff(self.now)
                    .is_some_and(|cutoff| message.ts < cutoff);
                let found = aged && tool_after;
                tool_after |= message.role.as_ref() == TOOL_ROLE;
                found
            }
            _ => false,
        });
        if !aged_then_tool && !self.ids_short {
            return Ok(());
        }
        let mut copy = match session {
            Some(s) => s.clone(),
            None => self.first_session().ok_or_else(crate::error::no_such_key)?,
        };
        let now = self.now;
        let steps = self
            .steps
            .iter()
            .map(|s| (s.op.clone(), None, s.retry_of, ()));
        let recount = |s: &mut Session| {
            let op = model_switch::recount_op(s, now, self.counting, self.recounted.as_ref())?;
            match op {
                Some(op) => s.apply(op).map(drop).map_err(crate::error::session),
                None => Ok(()),
            }
        };
        replay(
            &mut copy,
            steps,
            now,
            thresholds,
            cfg,
            recount,
            |i, s, op, (), group| match op {
                Op::Append {
                    message, settings, ..
                } => check_tool_has_call(Some(s), &message.role, now, settings, group)
                    .map_err(|e| crate::error::invalid(format!("messages[{i}]: {e}"))),
                _ => Ok(()),
            },
        )
        .map(drop)
    }
}

/// Runs a batch's steps on `session` as consecutive MEM.APPENDs would: a
/// retry answered while the session still remembers what it retries,
/// `recount` run just before the first message appended, ids given as
/// messages go in. `appending` sees each new message (its index, the
/// session before it, its op, `W`, where the newest tool group starts when
/// known) before it is applied. The outcome of
/// each message and whether the session then meets `thresholds`.
fn replay<W>(
    session: &mut Session,
    steps: impl Iterator<Item = (Op, Option<Prepared>, Option<RetryOf>, W)>,
    now: i64,
    thresholds: Thresholds,
    cfg: &Config,
    mut recount: impl FnMut(&mut Session) -> Result<(), RedisError>,
    mut appending: impl FnMut(usize, &Session, &Op, W, Option<usize>) -> Result<(), RedisError>,
) -> Result<Vec<(Outcome, bool)>, RedisError> {
    let mut outcomes = Vec::with_capacity(steps.size_hint().0);
    // msgid -> id of the batch's messages appended so far.
    let mut appended: HashMap<Box<str>, u64> = HashMap::new();
    // A retry's reply (`retry_totals`), taken once for a run of retries:
    // an aged session's view is a pass over its heads.
    let mut retry_reply: Option<(Outcome, bool)> = None;
    let mut switched = false;
    // Below this id, no message goes by MAXAGE at this batch's `now`
    // (Session::apply_one_of_many).
    let mut stays_below = 0;
    for (i, (mut op, prepared, retry_of, w)) in steps.enumerate() {
        // A retry while the session still remembers what it retries.
        let msgid = match &op {
            Op::Append { msgid, .. } => msgid.clone(),
            _ => None,
        };
        let original = msgid.as_deref().and_then(|m| {
            let id = match (appended.get(m), retry_of) {
                (Some(id), _) => *id,
                (None, Some(RetryOf::Session(id, _))) => id,
                _ => return None,
            };
            session.remembered(m, id)
        });
        if let Some((id, tokens)) = original {
            let totals = retry_reply.get_or_insert_with(|| retry_totals(session, now, cfg));
            outcomes.push(retry_outcome(totals, id, tokens));
            continue;
        }
        retry_reply = None;
        if !switched {
            // The retries before it change nothing.
            recount(session)?;
            switched = true;
        }
        let id = next_id(session.last_id).map_err(crate::error::session)?;
        if let Op::Append { message, .. } = &mut op {
            message.id = id;
        }
        // Where the newest tool group starts, once an append said so.
        let group = (stays_below != 0).then(|| session.messages.after_id(stays_below - 1));
        appending(i, session, &op, w, group)?;
        let outcome = session
            .apply_one_of_many(op, prepared, &mut stays_below)
            .map_err(crate::error::session)?;
        if let Some(m) = msgid {
            appended.insert(m, id);
        }
        outcomes.push((outcome, session.meets(thresholds)));
    }
    Ok(outcomes)
}

pub static APPEND_BATCH: CommandDecl = CommandDecl {
    name: "mem.appendbatch",
    entry: entry!(append_batch),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Appends several messages (a JSON array of {role, content, ts?, meta?, msgid?, tokens?}) in one atomic step, as consecutive MEM.APPENDs.",
    complexity: "O(N) in the size of the contents (tokenizing), plus O(M) for M evicted messages.",
    arity: -3,
    access: ReadUpdate,
    args: &[
        key(),
        string("messages"),
        SETTINGS_OPTIONS[0],
        SETTINGS_OPTIONS[1],
        SETTINGS_OPTIONS[2],
        SETTINGS_OPTIONS[3],
        SETTINGS_OPTIONS[4],
    ],
};
