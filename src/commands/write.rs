//! MEM.APPEND and MEM.SUMMARIZE.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString};

use super::args::{self, Options};
use std::sync::Arc;

use super::attrs::{can_offload_json, MAX_INLINE_JSON_BYTES};
use super::SETTINGS_OPTIONS;
use super::{
    arity, finish_write, now_ms, reply_duplicate, reply_outcome, session_thresholds, Events,
    OpHeader, Propagate, SettingsOptions, Write,
};
use crate::config::Config;
use crate::declare::{entry, integer, key, option, string, unix_time, Access::*, CommandDecl};
use crate::error;
use crate::key::SessionKey;
use crate::offload::{
    self, can_block, encoding_build, model_switch, refuse_where_blocking_is_impossible, Pass,
};
use crate::session::{
    check_tool_has_call, next_id, Message, Op, Prepared, Recounted, Settings, Snapshot, Summary,
    MAX_MESSAGE_TOKENS, MAX_TS,
};
use crate::stats;
use crate::tokenizer::count_message;
use crate::tokenizer::{self, Counting, Encoding};

/// MEM.APPEND key role content [TS ms] [META json] [MODEL name] [TTL seconds]
///   [MAXTOKENS n] [MAXMSGS n] [MAXAGE seconds] [MSGID id] [TOKENS n]
pub fn append(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    append_counted(ctx, args, Pass::Fresh)
}

/// What a worker made of a message's content, for MEM.APPEND resumed.
#[derive(Debug)]
struct Counted {
    counting: Counting,
    /// The content, checked as UTF-8 and copied on the worker (so the main
    /// thread neither scans nor copies it), with its message's tokens. None:
    /// not counted (not UTF-8); the command checks and counts inline.
    content: Option<(Arc<str>, u64)>,
    /// The session's counts under `encoding`, when the write switches the
    /// session's tokenizer and the re-count was large enough for a worker.
    recounted: Option<Recounted>,
    /// A large META's check, made by the worker (None: checked inline).
    meta_checked: Option<Result<(), String>>,
    /// The worker's copy of META (the argument's bytes), for the op.
    meta: Option<Arc<str>>,
    /// A large message's stored bytes, laid out by the worker for the log
    /// to keep (role, META and content as above).
    prepared: Option<Prepared>,
}

/// MEM.APPEND, resumed with a count made off the main thread: parse, answer
/// a retry, hand the heavy part to a worker when there is one, count what is
/// left inline, commit.
fn append_counted(ctx: &Context, args: Vec<RedisString>, pass: Pass<Counted>) -> RedisResult {
    let resumed = pass.is_resumed();
    let counted = pass.output();
    let cfg = Config::current();
    let append = AppendArgs::parse(ctx, &args, resumed, counted.as_ref(), &cfg)?;
    let keyname = &args[1];
    let mut key = SessionKey::open(ctx, keyname, true)?;
    if let Some(reply) = append.retried(ctx, &key, &cfg) {
        return reply;
    }
    let settings = append.changes.merge(key.session(), &cfg);
    check_tool_has_call(key.session(), append.role, now_ms(), &settings, None)
        .map_err(error::session)?;
    let last_id = key.session().map_or(0, |s| s.last_id);
    let id = next_id(last_id).map_err(error::session)?;
    let encoding = settings.encoding;
    let counting = Counting::new(&settings.model, encoding);
    if let Some(job) = append.job(ctx, &key, counting, resumed, &cfg)? {
        drop(key);
        return offload::run(ctx, args, 1, 3, append_counted, move |bytes| job.run(bytes));
    }
    let (counted, laid_out) = match counted {
        Some(mut c) => {
            let laid_out = append.laid_out(c.meta.take(), c.prepared.take());
            (Some(c), laid_out)
        }
        None => (None, None),
    };
    let (content, tokens, recounted) = append.content(counted, counting, &cfg)?;
    let now = now_ms();
    let (meta, prepared) = laid_out.unwrap_or_default();
    let op = append.op(settings, id, (content, tokens), meta, now);
    // Everything is validated; from here on the write cannot fail.
    let session = key.session_or_create(|| op.new_session())?;
    // A new tokenizer: the session re-counted first (replicated as an op).
    model_switch::apply(ctx, keyname, session, now, counting, recounted.as_ref())?;
    let how = Propagate::Op(OpHeader::of(&op), Some(append.raw_content));
    let outcome = session
        .apply_prepared(op, prepared)
        .map_err(error::session)?;
    let summarize = session.meets(session_thresholds(session, &cfg));
    let expiry = session.key_expiry(now);
    let events = Events::appends(&[(outcome.clone(), summarize)]);
    finish_write(ctx, keyname, &key, how, expiry, &events);
    reply_outcome(ctx, &outcome, summarize)
}

/// MEM.APPEND's arguments, parsed and checked.
struct AppendArgs<'a> {
    role: &'a str,
    raw_content: &'a RedisString,
    /// The message's tokens as the client knows them (TOKENS): not counted.
    given: Option<u64>,
    ts: Option<u64>,
    meta: Option<&'a str>,
    /// A large META, checked by a worker on this pass.
    meta_on_worker: bool,
    changes: SettingsOptions<'a>,
    msgid: Option<&'a str>,
}

impl<'a> AppendArgs<'a> {
    /// The checks in the order their errors are reported.
    fn parse(
        ctx: &Context,
        args: &'a [RedisString],
        resumed: bool,
        counted: Option<&Counted>,
        cfg: &Config,
    ) -> Result<AppendArgs<'a>, RedisError> {
        arity(args, 4)?;
        let role = args::utf8("role", &args[2])?;
        args::check_role(role)?;
        let raw_content = &args[3];
        let opts = Options::parse(&args[4..], &APPEND)?;
        // Bounded as a session's cap is; stored in 32 bits, whatever the
        // limit allows.
        let given = opts.u64_at_most(
            "TOKENS",
            0,
            cfg.max_tokens_limit.min(MAX_MESSAGE_TOKENS),
            "mem.max-tokens-limit",
        )?;
        args::check_size("content", raw_content.len(), cfg.max_message_bytes)?;
        let ts = opts.u64("TS", 0)?;
        if ts.is_some_and(|t| t > MAX_TS as u64) {
            return Err(crate::error::invalid(format!(
                "TS must be at most {MAX_TS} (9999-12-31)"
            )));
        }
        let meta = opts.str("META")?.map(args::trim_json);
        let meta_on_worker = check_meta(ctx, meta, resumed, counted, cfg)?;
        let changes = SettingsOptions::parse(&opts, cfg)?;
        let msgid = opts.str("MSGID")?;
        if let Some(msgid) = msgid {
            args::check_msgid(msgid)?;
        }
        Ok(AppendArgs {
            role,
            raw_content,
            given,
            ts,
            meta,
            meta_on_worker,
            changes,
            msgid,
        })
    }

    /// A retry of an append already stored (or already evicted): answered
    /// as the original was, before anything is counted. A resumed large
    /// append checks again, so of two copies in flight at once only one is
    /// stored.
    fn retried(&self, ctx: &Context, key: &SessionKey, cfg: &Config) -> Option<RedisResult> {
        let session = key.session()?;
        let (id, tokens) = self.msgid.and_then(|m| session.find_msgid(m))?;
        // The session's totals as reads show them (past maxage left out).
        let live = session.live(now_ms());
        Some(reply_duplicate(
            ctx,
            &live,
            &live.duplicate_outcome(id, tokens),
            cfg,
        ))
    }

    /// The worker's part, when there is one: large content, a large session
    /// to re-count under a new tokenizer, an encoding not built yet (built
    /// by the worker that counts) or a large META. The client waits; the
    /// command runs again with the counts.
    fn job(
        &self,
        ctx: &Context,
        key: &SessionKey,
        counting: Counting,
        resumed: bool,
        cfg: &Config,
    ) -> Result<Option<AppendJob>, RedisError> {
        let encoding = counting.encoding;
        let counts =
            self.given.is_none() || model_switch::needed(key.session(), counting).is_some();
        let unbuilt = counts && !resumed && encoding_build::must_wait(ctx, encoding)?;
        if counts && resumed {
            encoding_build::require(ctx, encoding)?;
        }
        // Tool calls in META are counted with the content.
        let len = self.raw_content.len() + self.meta.map_or(0, str::len);
        let what = if self.meta.is_some() {
            "content with META"
        } else {
            "content"
        };
        let (large, snapshot) =
            offload::heavy_parts(ctx, key.session(), what, len, counting, resumed, cfg)?;
        let offload = large || unbuilt || snapshot.is_some() || self.meta_on_worker;
        if resumed || !offload || !can_block(ctx) {
            return Ok(None);
        }
        Ok(Some(AppendJob {
            counting,
            role: self.role.to_owned(),
            given: self.given,
            counts,
            snapshot,
            meta: self.meta.map(Arc::from),
            check_meta: self.meta_on_worker,
        }))
    }

    /// The content and its tokens, with the session's re-count: the
    /// worker's where it made them under this encoding, else counted here.
    fn content(
        &self,
        counted: Option<Counted>,
        counting: Counting,
        cfg: &Config,
    ) -> Result<(Arc<str>, u64, Option<Recounted>), RedisError> {
        // The worker's re-count stands only under the counting it used (a
        // model switched meanwhile makes it stale: counted again below).
        let (counted_content, recounted) = match counted {
            Some(c) => {
                let same = c.counting == counting;
                (
                    c.content.map(|ct| (c.counting, ct)),
                    c.recounted.filter(|_| same),
                )
            }
            None => (None, None),
        };
        let (content, tokens) = match counted_content {
            Some((_, (content, _))) if self.given.is_some() => (content, self.given.unwrap_or(0)),
            Some((c, (content, tokens))) if c == counting => (content, tokens),
            // Counted under another encoding (the model changed meanwhile).
            Some((c, (content, _))) => {
                let len = content.len() + self.meta.map_or(0, str::len);
                model_switch::recount_inline_allowed(c, counting, len, cfg)?;
                let tokens = count_message(counting, self.role, &content, self.meta);
                (content, tokens)
            }
            // Not counted yet (small content, or not UTF-8): here, inline.
            None => {
                let content = args::utf8("content", self.raw_content)?;
                let tokens = match self.given {
                    Some(n) => n,
                    None => count_message(counting, self.role, content, self.meta),
                };
                (Arc::from(content), tokens)
            }
        };
        Ok((content, tokens, recounted))
    }

    /// What the worker made of this command's META and message bytes, used
    /// only if its META is this command's (it is: the resumed command gets
    /// the arguments the worker read; the length is checked, not 4 MB of
    /// bytes on the main thread).
    fn laid_out(
        &self,
        meta: Option<Arc<str>>,
        prepared: Option<Prepared>,
    ) -> Option<(Option<Arc<str>>, Option<Prepared>)> {
        debug_assert_eq!(meta.as_deref(), self.meta);
        (meta.as_deref().map(str::len) == self.meta.map(str::len)).then_some((meta, prepared))
    }

    /// The append as the core applies it; `meta` the worker's copy of this
    /// command's META argument, else META is copied here.
    fn op(
        &self,
        settings: Settings,
        id: u64,
        counted: (Arc<str>, u64),
        meta: Option<Arc<str>>,
        now: i64,
    ) -> Op {
        let (content, tokens) = counted;
        let meta = meta.or_else(|| self.meta.map(Arc::from));
        let message = Message {
            id,
            role: self.role.into(),
            content,
            ts: self.ts.map_or(now, |t| t as i64),
            tokens,
            meta,
        };
        Op::Append {
            now,
            settings,
            message,
            msgid: self.msgid.map(Box::from),
        }
    }
}

/// META's check: inline, or the worker's verdict on a resumed pass; true
/// when a worker is to walk it (attrs.rs: MAX_INLINE_JSON_BYTES).
fn check_meta(
    ctx: &Context,
    meta: Option<&str>,
    resumed: bool,
    counted: Option<&Counted>,
    cfg: &Config,
) -> Result<bool, RedisError> {
    let Some(meta) = meta else {
        return Ok(false);
    };
    let on_worker =
        !resumed && meta.len() >= MAX_INLINE_JSON_BYTES && can_offload_json(ctx, meta.len())?;
    args::check_size("META", meta.len(), cfg.max_message_bytes)?;
    match counted.and_then(|c| c.meta_checked.as_ref()) {
        Some(verdict) => verdict
            .clone()
            .map_err(|e| crate::error::invalid(e.to_string()))?,
        None if on_worker => {}
        None => args::check_meta(meta)?,
    }
    Ok(on_worker)
}

/// What a worker does for MEM.APPEND, all owned.
struct AppendJob {
    counting: Counting,
    role: String,
    given: Option<u64>,
    /// The write counts (no TOKENS, or a model switch re-counts).
    counts: bool,
    snapshot: Option<Snapshot>,
    /// The META, counted with the content.
    meta: Option<Arc<str>>,
    /// META is large: checked here too.
    check_meta: bool,
}

impl AppendJob {
    fn run(self, bytes: &[u8]) -> Counted {
        let encoding = self.counting.encoding;
        if self.given.is_some() && self.counts {
            // The session's re-count needs it (inline when small).
            let _ = tokenizer::load(encoding);
        }
        // Given tokens: the worker only checks and copies the content.
        let content = crate::utf8::str(bytes).map(|text| {
            let tokens = self.given.unwrap_or_else(|| {
                count_message(self.counting, &self.role, text, self.meta.as_deref())
            });
            (Arc::from(text), tokens)
        });
        let meta_checked = match (&self.meta, self.check_meta) {
            (Some(m), true) => Some(crate::session::check_meta(m)),
            _ => None,
        };
        let prepared = content
            .as_ref()
            .and_then(|(text, _)| Prepared::of(&self.role, self.meta.as_deref(), text));
        Counted {
            counting: self.counting,
            content,
            recounted: model_switch::count(self.snapshot, self.counting),
            meta_checked,
            meta: self.meta,
            prepared,
        }
    }
}

/// MEM.SUMMARIZE key upto summary [LEASE token]
pub fn summarize(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    summarize_counted(ctx, args, Pass::Fresh)
}

/// MEM.SUMMARIZE, resumed with the summary counted off the main thread:
/// parse, check against the session, hand a large text to a worker, count
/// what is left inline, commit.
fn summarize_counted(
    ctx: &Context,
    args: Vec<RedisString>,
    pass: Pass<CountedSummary>,
) -> RedisResult {
    arity(&args, 4)?;
    let lease = Options::parse(&args[4..], &SUMMARIZE)?.u64("LEASE", 1)?;
    let resumed = pass.is_resumed();
    let counted = pass.output();
    let keyname = &args[1];
    let upto = args::parse_u64("upto", &args[2], 1)?;
    let raw_text = &args[3];
    let cfg = Config::current();
    args::check_size("summary", raw_text.len(), cfg.max_message_bytes)?;
    // A blank summary would replace the messages with nothing. (The match
    // stops at the first visible character.)
    args::check_shows_something("summary", raw_text.as_slice())?;

    let mut key = SessionKey::open(ctx, keyname, true)?;
    let Some(session) = key.session_mut() else {
        return Err(error::no_such_key());
    };
    // A retry of a summary already committed (the reply was lost): the
    // same summary is in place; answered so, not refused as stale.
    if let Some(outcome) = session.summary_retried(upto, raw_text.as_slice()) {
        return reply_duplicate(ctx, session, &outcome, &cfg);
    }
    check_summary_allowed(session, lease, upto)?;
    // Not deny-oom: a summary is how a full server sheds a session's bytes
    // without losing its history. Out of memory, one that takes more than
    // it replaces is refused as Redis refuses a growing write. (One counted
    // on a worker is admitted on return as every resumed write is: not
    // while out of memory.)
    // A first summary also takes its own struct (hostile pass 30 F3: 8 B
    // replacing 11 B grew 50,000 sessions by 1.2 MB).
    let struct_bytes = if session.summary.is_none() {
        std::mem::size_of::<crate::session::Summary>() + 16
    } else {
        0
    };
    if ctx.get_flags().contains(ContextFlags::OOM)
        && raw_text.len() + struct_bytes > session.bytes_up_to(upto)
    {
        return Err(error::Error::OutOfMemory.into());
    }
    let encoding = session.settings.encoding;
    if summary_needs_worker(ctx, raw_text.len(), encoding, resumed, &cfg)? && can_block(ctx) {
        drop(key);
        // The worker checks, copies and counts the text (the main thread
        // touches none of its bytes).
        return offload::run(ctx, args, 1, 3, summarize_counted, move |bytes| {
            CountedSummary::count(encoding, bytes)
        });
    }
    let (text, tokens) = summary_counted(counted, raw_text, encoding, &cfg)?;
    let Some(session) = key.session_mut() else {
        return Err(error::no_such_key());
    };
    let now = now_ms();
    let summary = Summary {
        text,
        tokens,
        upto,
        ts: now,
    };
    let op = Op::Summarize { now, summary };
    let header = OpHeader::of(&op);
    // The core refuses (changing nothing) a summary over maxtokens, and
    // checks upto again.
    let outcome = session.apply(op).map_err(summary_rejected)?;
    let summarize = session.meets(session_thresholds(session, &cfg));
    let expiry = session.key_expiry(now);
    let mut events = Events::default();
    events.add(Write::Summarize, outcome.trimmed, false);
    // The text travels as the client's own argument (no copy).
    let how = Propagate::Op(header, Some(raw_text));
    finish_write(ctx, keyname, &key, how, expiry, &events);
    reply_outcome(ctx, &outcome, summarize)
}

/// A summary the session refuses (counted in INFO).
fn summary_rejected(e: crate::session::SessionError) -> RedisError {
    stats::add(&stats::SUMMARIES_REJECTED, 1);
    error::session(e)
}

/// Refused before the text is counted: another worker's live lease (its
/// summary is on the way), or an upto that alone rules it out.
fn check_summary_allowed(
    session: &crate::session::Session,
    lease: Option<u64>,
    upto: u64,
) -> Result<(), RedisError> {
    session.check_lease(lease, now_ms()).map_err(|e| {
        stats::add(&stats::SUMMARIES_REFUSED_LEASE, 1);
        error::session(e)
    })?;
    // Against what a read shows: an upto past maxage is no longer a message.
    session
        .live(now_ms())
        .check_summary_upto(upto)
        .map(|_| ())
        .map_err(summary_rejected)
}

/// Whether a fresh MEM.SUMMARIZE hands its text to a worker: a large
/// summary is checked and counted there, as a large message; so is one
/// whose encoding is not built yet (the worker builds it).
fn summary_needs_worker(
    ctx: &Context,
    len: usize,
    encoding: Encoding,
    resumed: bool,
    cfg: &Config,
) -> Result<bool, RedisError> {
    let limit = cfg.inline_limit(encoding);
    let large = len as u64 >= limit;
    let unbuilt = !resumed && encoding_build::must_wait(ctx, encoding)?;
    if resumed {
        encoding_build::require(ctx, encoding)?;
        return Ok(false);
    }
    if large {
        refuse_where_blocking_is_impossible(ctx, "summary", len, limit)?;
    }
    Ok(large || unbuilt)
}

/// The summary's text and tokens: the worker's where it counted them under
/// this encoding, else counted here (the model changed meanwhile, or the
/// text is small, or not UTF-8).
fn summary_counted(
    counted: Option<CountedSummary>,
    raw_text: &RedisString,
    encoding: Encoding,
    cfg: &Config,
) -> Result<(String, u64), RedisError> {
    Ok(
        match counted.and_then(|c| c.text.map(|t| (c.encoding, t))) {
            Some((e, counted)) if e == encoding => counted,
            Some((e, (text, _))) => {
                let (was, now) = (Counting::new("", e), Counting::new("", encoding));
                model_switch::recount_inline_allowed(was, now, text.len(), cfg)?;
                let tokens = tokenizer::count_summary(encoding, &text);
                (text, tokens)
            }
            None => {
                let text = args::utf8("summary", raw_text)?;
                (text.to_owned(), tokenizer::count_summary(encoding, text))
            }
        },
    )
}

/// What a worker made of a large summary: its text checked and copied, with
/// its tokens (None: not UTF-8; the command reports it).
struct CountedSummary {
    encoding: Encoding,
    text: Option<(String, u64)>,
}

impl CountedSummary {
    /// The worker's part of MEM.SUMMARIZE.
    fn count(encoding: Encoding, bytes: &[u8]) -> CountedSummary {
        let text = crate::utf8::str(bytes)
            .map(|text| (text.to_owned(), tokenizer::count_summary(encoding, text)));
        CountedSummary { encoding, text }
    }
}

pub static APPEND: CommandDecl = CommandDecl {
    name: "mem.append",
    entry: entry!(append),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Appends a message to a session, counts its tokens, trims to the caps, refreshes the TTL and reports whether to summarize.",
    complexity: "O(N) in the size of the content (tokenizing), plus O(M) for M evicted messages.",
    arity: -4,
    access: ReadUpdate,
    args: &[
        key(),
        string("role"),
        string("content"),
        option("TS", unix_time("ms")),
        option("META", string("json")),
        SETTINGS_OPTIONS[0],
        SETTINGS_OPTIONS[1],
        SETTINGS_OPTIONS[2],
        SETTINGS_OPTIONS[3],
        SETTINGS_OPTIONS[4],
        option("MSGID", string("id")),
        option("TOKENS", integer("n")),
    ],
};
pub static SUMMARIZE: CommandDecl = CommandDecl {
    name: "mem.summarize",
    entry: entry!(summarize),
    flags: "write",
    acl: "mem",
    summary: "Replaces the summary and every message up to an id with a new summary (refused while another worker's lease is live).",
    complexity: "O(N) in the size of the summary (tokenizing), plus O(M) for M replaced messages.",
    arity: -4,
    access: ReadUpdate,
    args: &[
        key(),
        integer("upto"),
        string("summary"),
        option("LEASE", integer("token")),
    ],
};
