//! The read-only commands: MEM.GET, MEM.SUMMARIZE_CHECK, MEM.INFO. None of
//! them touches the key's TTL.

use redis_module::{Context, RedisResult, RedisString, RedisValue};

use super::args::{self, Options};
use super::reply::Reply;
use super::{arity, default_settings, now_ms, thresholds};
use crate::config::Config;
use crate::declare::{
    entry, flag, integer, key, one_of, option, option_of, string, Access::*, Arg, CommandDecl,
};
use crate::json_format;
use crate::key::SessionKey;
use crate::offload;
use crate::session::{MessageLog, MessageRef, Selection, Session, SummarizeCheck, Thresholds};
use crate::tokenizer;

/// MEM.GET key [LAST n] [AFTER id] [BUDGET tokens] [FORMAT RESP|JSON]
pub fn get(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    arity(&args, 2)?;
    let opts = Options::parse(&args[2..], &GET)?;
    let sel = Selection {
        last: opts.u64("LAST", 0)?,
        after: opts.u64("AFTER", 0)?,
        budget: opts.u64("BUDGET", 0)?,
    };
    let json = match opts
        .get("FORMAT")
        .map(|f| f.as_slice().to_ascii_uppercase())
    {
        None => false,
        Some(f) if f == b"RESP" => false,
        Some(f) if f == b"JSON" => true,
        Some(_) => return Err(crate::error::invalid("FORMAT must be RESP or JSON")),
    };
    let key = SessionKey::open(ctx, &args[1], false)?;
    // Messages past the session's maxage are never shown, even before the
    // next write evicts them.
    let now = now_ms();
    let live = key.session().map(|s| s.live(now));
    let cfg = Config::current();
    // A large reply is written on a worker, from a copy of the session
    // sharing its bytes (a whole 53 MB session's held the main thread
    // 137-181 ms, 178-251 ms as JSON; LRANGE of the same list 70-81 ms).
    // The worker's context replies in the client's protocol (RESP2 arrays,
    // RESP3 maps) on every server tested.
    // FORMAT JSON writes the attributes too (4 of 4 MB held it 28-33 ms).
    let large = live.as_deref().is_some_and(|s| {
        let attrs = if json { s.extra.value_bytes() } else { 0 };
        s.select(sel).1.stored_len() + attrs >= WORKER_REPLY_BYTES
    });
    let live = match live {
        // The aged view is owned already: moved, not copied.
        Some(live) if large && offload::can_block(ctx) => {
            let owned = live.into_owned();
            let model = cfg.default_model.clone();
            return offload::reply_written_by_worker(ctx, move |reply_ctx| {
                write_get(reply_ctx, Some(&owned), sel, json, &model, now)
            });
        }
        live => live,
    };
    write_get(ctx, live.as_deref(), sel, json, &cfg.default_model, now);
    Ok(RedisValue::NoReply)
}

/// Stored bytes from which MEM.GET's reply is written on a worker (about 2
/// ms of the main thread's time inline).
pub const WORKER_REPLY_BYTES: usize = 1 << 20;

/// Stored bytes from which a FORMAT JSON document is built in the module's
/// region.
const JSON_IN_REGION_BYTES: usize = 64 << 10;

/// MEM.GET's reply of `sel` from `session` (none: an empty reply), written
/// to `ctx`.
fn write_get(
    ctx: &Context,
    session: Option<&Session>,
    sel: Selection,
    json: bool,
    default_model: &str,
    now: i64,
) {
    let empty = MessageLog::new();
    let (summary, messages) = match session {
        Some(s) => s.select(sel),
        None => (None, empty.iter()),
    };
    if json {
        // A large document is built in the module's region, out of
        // used_memory: it is copied into the reply at once and freed, and
        // charged to Redis it made a read of a 40 MB session hold 2.2x the
        // reply (hostile pass 49: 630 keys evicted under allkeys-lru).
        let size = messages.stored_len() + session.map_or(0, |s| s.extra.value_bytes());
        let render = || json_format::render(session, summary, messages, default_model, now);
        let doc = if size >= JSON_IN_REGION_BYTES {
            crate::module_memory::for_module(render)
        } else {
            render()
        };
        ctx.reply(Ok(RedisValue::StringBuffer(doc)));
        return;
    }
    let reply = Reply::new(ctx);
    reply.array(usize::from(summary.is_some()) + messages.len());
    if let Some(s) = summary {
        // `summary` 1: a field no message entry has, so a message whose role
        // is "summary" is never taken for the session's summary.
        reply
            .map(6)
            .field_int("summary", 1)
            .field_int("id", s.upto)
            .field_str("role", "summary")
            .field_str("content", &s.text)
            .bulk("ts")
            .signed(s.ts)
            .field_int("tokens", s.tokens);
    }
    for m in messages {
        reply_message(&reply, &m, session.and_then(|s| s.msgids.of(m.id)));
    }
}

fn reply_message(reply: &Reply, m: &MessageRef<'_>, msgid: Option<&str>) {
    reply
        .map(5 + usize::from(m.meta.is_some()) + usize::from(msgid.is_some()))
        .field_int("id", m.id)
        .field_str("role", m.role)
        .field_str("content", m.content)
        .bulk("ts")
        .signed(m.ts)
        .field_int("tokens", m.tokens);
    if let Some(meta) = m.meta {
        reply.field_str("meta", meta);
    }
    if let Some(msgid) = msgid {
        reply.field_str("msgid", msgid);
    }
}

/// The options of MEM.SUMMARIZE_CHECK and MEM.SUMMARIZE_BEGIN:
/// `[MODEL name | CONTEXT tokens] [KEEP n]`.
pub struct CheckOptions<'a> {
    model: Option<&'a str>,
    context: Option<u64>,
    pub keep: u64,
}

impl<'a> CheckOptions<'a> {
    pub fn parse(
        opts: &Options<'a>,
        cfg: &Config,
    ) -> Result<CheckOptions<'a>, redis_module::RedisError> {
        if opts.has("MODEL") && opts.has("CONTEXT") {
            return Err(crate::error::invalid(
                "MODEL and CONTEXT options at the same time are not compatible",
            ));
        }
        let model = opts.str("MODEL")?;
        if let Some(m) = model {
            args::check_model(m)?;
        }
        // Windows are bounded as the model table bounds them (the
        // threshold's percentage of a larger one would saturate).
        let context = opts.u64_at_most(
            "CONTEXT",
            1,
            crate::tokenizer::models::MAX_WINDOW,
            "2^53 - 1, as a model's window",
        )?;
        let keep = opts.u64("KEEP", 0)?.unwrap_or(cfg.summarize_keep);
        Ok(CheckOptions {
            model,
            context,
            keep,
        })
    }

    /// The thresholds of `session` for the window these options name (the
    /// session's model's by default).
    pub fn thresholds(&self, session: &Session, cfg: &Config) -> Thresholds {
        let window = match (self.model, self.context) {
            (_, Some(tokens)) => Some(tokens),
            (Some(m), None) => tokenizer::context_window(m),
            (None, None) => tokenizer::context_window(&session.settings.model),
        };
        thresholds(&session.settings, cfg, window)
    }
}

/// The fields of the MEM.SUMMARIZE_CHECK map, after `map(n)` announced
/// them (MEM.SUMMARIZE_BEGIN adds its own after these).
pub const CHECK_FIELDS: usize = 8;

pub fn write_check(reply: &Reply, check: &SummarizeCheck) {
    reply
        .field_int("summarize", u64::from(check.summarize))
        .field_int("total_tokens", check.total_tokens)
        .field_int("messages", check.messages)
        .field_int("threshold_tokens", check.thresholds.tokens)
        .field_int("threshold_messages", check.thresholds.messages)
        .field_int("keep", check.keep)
        .field_int("upto", check.upto)
        .field_int("upto_tokens", check.upto_tokens);
}

/// MEM.SUMMARIZE_CHECK key [MODEL name | CONTEXT tokens] [KEEP n]
pub fn summarize_check(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    arity(&args, 2)?;
    let opts = Options::parse(&args[2..], &SUMMARIZE_CHECK)?;
    let cfg = Config::current();
    let options = CheckOptions::parse(&opts, &cfg)?;

    let key = SessionKey::open(ctx, &args[1], false)?;
    let empty;
    let live = key.session().map(|s| s.live(now_ms()));
    let session: &Session = match live.as_deref() {
        Some(s) => s,
        None => {
            empty = Session::new(default_settings(&cfg), now_ms());
            &empty
        }
    };
    let check = session.summarize_check(options.thresholds(session, &cfg), options.keep);
    let reply = Reply::new(ctx);
    reply.map(CHECK_FIELDS);
    write_check(&reply, &check);
    Ok(RedisValue::NoReply)
}

/// MEM.INFO key
pub fn info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 {
        return Err(redis_module::RedisError::WrongArity);
    }
    let key = SessionKey::open(ctx, &args[1], false)?;
    let now = now_ms();
    let Some(live) = key.session().map(|s| s.live(now)) else {
        return Ok(RedisValue::Null);
    };
    let s: &Session = &live;
    let live: Vec<(&String, i64)> = s
        .external
        .iter()
        .filter(|(_, e)| e.expires_at > now)
        .map(|(name, e)| (name, e.expires_at - now))
        .collect();
    let reply = Reply::new(ctx);
    reply
        .map(20)
        .field_int("messages", s.message_count())
        .field_int("total_tokens", s.total_tokens)
        .field_str("model", &s.settings.model)
        .field_str("encoding", s.settings.encoding.name())
        .field_int(
            "context_window",
            tokenizer::context_window(&s.settings.model).unwrap_or(0),
        )
        .field_int("maxtokens", s.settings.max_tokens)
        .field_int("maxmsgs", s.settings.max_msgs)
        .field_int("ttl", s.settings.ttl)
        .field_int("first_id", s.first_id())
        .field_int("last_id", s.last_id)
        .bulk("created")
        .signed(s.created)
        .bulk("updated")
        .signed(s.updated)
        .field_int("summary_upto", s.summary.as_ref().map_or(0, |x| x.upto))
        .bulk("external")
        .array(live.len());
    for (name, _) in &live {
        reply.bulk(name);
    }
    // Why it forgot (the doctor reads these): what left without a summary,
    // what summaries cover, when the last one was made.
    reply
        .field_int("evicted", s.history.evicted)
        .field_int("summarized", s.history.summarized)
        .field_int("summaries_dropped", s.history.summaries_dropped)
        .bulk("summary_ts")
        .signed(s.summary.as_ref().map_or(0, |x| x.ts))
        .bulk("external_ttl")
        .map(live.len());
    for (name, left_ms) in &live {
        reply.bulk(name).signed(*left_ms);
    }
    // A summarizer at work: the ms its lease has left (0: none).
    let lease_ms = s
        .leases
        .current
        .as_ref()
        .map_or(0, |l| (l.expires_at - now).max(0));
    reply.bulk("lease_ttl").signed(lease_ms);
    Ok(RedisValue::NoReply)
}

/// MEM.SUMMARIZE_CHECK's and MEM.SUMMARIZE_BEGIN's window and KEEP.
pub const WINDOW: Arg = one_of(
    "window",
    &[
        option("MODEL", string("name")),
        option("CONTEXT", integer("tokens")),
    ],
);
pub const KEEP: Arg = option("KEEP", integer("n"));

pub static GET: CommandDecl = CommandDecl {
    name: "mem.get",
    entry: entry!(get),
    flags: "readonly",
    acl: "mem",
    summary: "Returns the session's summary and messages, oldest first, optionally the newest, those after an id, or those fitting a token budget.",
    complexity: "O(N) for N messages returned.",
    arity: -2,
    access: Read,
    args: &[
        key(),
        option("LAST", integer("n")),
        option("AFTER", integer("id")),
        option("BUDGET", integer("tokens")),
        option_of("FORMAT", "format", &[flag("RESP"), flag("JSON")]),
    ],
};
pub static SUMMARIZE_CHECK: CommandDecl = CommandDecl {
    name: "mem.summarize_check",
    entry: entry!(summarize_check),
    flags: "readonly",
    acl: "mem",
    summary: "Reports whether the session meets its summarization threshold and which messages a summary should cover.",
    complexity: "O(N) for N messages.",
    arity: -2,
    access: Read,
    args: &[key(), WINDOW, KEEP],
};
pub static INFO: CommandDecl = CommandDecl {
    name: "mem.info",
    entry: entry!(info),
    flags: "readonly",
    acl: "mem",
    summary: "Returns the session's counts, settings and ids, what left it (evicted, summarized) and the external ids' time left, or nil when the key does not exist.",
    complexity: "O(1) (O(N) for N external ids).",
    arity: 2,
    access: Read,
    args: &[key()],
};
