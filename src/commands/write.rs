//! MEM.APPEND and MEM.SUMMARIZE.

use super::table;
use redis_module::{Context, RedisResult, RedisString};

use super::args::{self, Options};
use std::sync::Arc;

use super::attrs::{can_offload_json, MAX_INLINE_JSON_BYTES};
use super::model_switch;
use super::{
    arity, finish_write, now_ms, reply_duplicate, reply_outcome, session_thresholds, Events,
    Propagate, SettingsOptions, Write,
};
use crate::config::Config;
use crate::error;
use crate::key::SessionKey;
use crate::offload::{self, can_block, encoding_build, refuse_where_blocking_is_impossible, Pass};
use crate::session::{next_id, Message, Op, Recounted, Summary, MAX_MESSAGE_TOKENS, MAX_TS};
use crate::stats;
use crate::tokenizer::count_message;
use crate::tokenizer::{self, Encoding, SUMMARY_COUNTED_AS};

/// MEM.APPEND key role content [TS ms] [META json] [MODEL name] [TTL seconds]
///   [MAXTOKENS n] [MAXMSGS n] [MAXAGE seconds] [MSGID id] [TOKENS n]
pub fn append(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    append_counted(ctx, args, Pass::Fresh)
}

/// What a worker made of a message's content, for MEM.APPEND resumed.
#[derive(Debug)]
struct Counted {
    encoding: Encoding,
    /// The content, checked as UTF-8 and copied on the worker (so the main
    /// thread neither scans nor copies it), with its message's tokens. None:
    /// not counted (not UTF-8); the command checks and counts inline.
    content: Option<(Arc<str>, u64)>,
    /// The session's counts under `encoding`, when the write switches the
    /// session's tokenizer and the re-count was large enough for a worker.
    recounted: Option<Recounted>,
    /// A large META's check, made by the worker (None: checked inline).
    meta_checked: Option<Result<(), String>>,
}

/// MEM.APPEND, resumed with a count made off the main thread.
fn append_counted(ctx: &Context, args: Vec<RedisString>, pass: Pass<Counted>) -> RedisResult {
    let resumed = pass.is_resumed();
    let counted = pass.output();
    arity(&args, 4)?;
    let keyname = &args[1];
    let role = args::utf8("role", &args[2])?;
    args::check_role(role)?;
    let raw_content = &args[3];
    let opts = Options::parse(&args[4..], &table::APPEND)?;
    let cfg = Config::current();
    // The message's tokens as the client knows them (a provider's usage):
    // not counted. Bounded as a session's cap is.
    // Stored in 32 bits, whatever the limit allows.
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
    let meta = opts.str("META")?;
    // A large META is walked by the worker (attrs.rs: MAX_INLINE_JSON_BYTES).
    let meta_on_worker = !resumed
        && meta.is_some_and(|m| m.len() >= MAX_INLINE_JSON_BYTES)
        && can_offload_json(ctx, meta.map_or(0, str::len))?;
    if let Some(meta) = meta {
        args::check_size("META", meta.len(), cfg.max_message_bytes)?;
        match counted.as_ref().and_then(|c| c.meta_checked.as_ref()) {
            Some(verdict) => verdict
                .clone()
                .map_err(|e| crate::error::invalid(e.to_string()))?,
            None if meta_on_worker => {}
            None => args::check_meta(meta)?,
        }
    }
    let meta_for_worker = if meta_on_worker {
        meta.map(str::to_owned)
    } else {
        None
    };
    let changes = SettingsOptions::parse(&opts, &cfg)?;
    let msgid = opts.str("MSGID")?;
    if let Some(msgid) = msgid {
        args::check_msgid(msgid)?;
    }

    let mut key = SessionKey::open(ctx, keyname, true)?;
    // A retry of an append already stored (or already evicted): answered as
    // the original was, before anything is counted. A resumed large append
    // checks again, so of two copies in flight at once only one is stored.
    if let Some(session) = key.session() {
        if let Some((id, tokens)) = msgid.and_then(|m| session.find_msgid(m)) {
            // The session's totals as reads show them (past maxage left out).
            let live = session.live(now_ms());
            return reply_duplicate(ctx, &live, &live.duplicate_outcome(id, tokens), &cfg);
        }
    }
    let settings = changes.merge(key.session(), &cfg);
    let last_id = key.session().map_or(0, |s| s.last_id);
    let id = next_id(last_id).map_err(error::session)?;
    let encoding = settings.encoding;
    // An encoding not built yet is built by the worker that counts.
    let counts = given.is_none() || model_switch::needed(key.session(), encoding).is_some();
    let unbuilt = counts && !resumed && encoding_build::must_wait(ctx, encoding)?;
    if counts && resumed {
        encoding_build::require(ctx, encoding)?;
    }

    // Large content, or a large session to re-count under a new tokenizer:
    // checked and counted by a worker while the client waits; this command
    // runs again with the counts.
    let large = raw_content.len() as u64 >= cfg.inline_limit(encoding);
    let snapshot = if resumed {
        None
    } else {
        model_switch::offload(key.session(), encoding, &cfg)
    };
    if !resumed && large {
        refuse_where_blocking_is_impossible(ctx, "content", raw_content.len())?;
    }
    if let Some(s) = snapshot.as_ref() {
        refuse_where_blocking_is_impossible(ctx, "the re-count of a model switch", s.bytes())?;
    }
    if !resumed && (large || unbuilt || snapshot.is_some() || meta_on_worker) && can_block(ctx) {
        drop(key);
        let role = role.to_owned();
        return offload::run(ctx, args, 1, 3, append_counted, move |bytes| {
            if given.is_some() && counts {
                // The session's re-count needs it (inline when small).
                let _ = tokenizer::load(encoding);
            }
            // Given tokens: the worker only checks and copies the content.
            let content = std::str::from_utf8(bytes).ok().map(|text| {
                let tokens = given.unwrap_or_else(|| count_message(encoding, &role, text));
                (Arc::from(text), tokens)
            });
            let recounted = model_switch::count(snapshot, encoding);
            let meta_checked = meta_for_worker.map(|m| crate::session::check_meta(&m));
            Counted {
                encoding,
                content,
                recounted,
                meta_checked,
            }
        });
    }
    let (counted_content, recounted) = match counted {
        Some(c) => (c.content.map(|ct| (c.encoding, ct)), c.recounted),
        None => (None, None),
    };
    let (content, tokens) = match counted_content {
        Some((_, (content, _))) if given.is_some() => (content, given.unwrap_or(0)),
        Some((e, (content, tokens))) if e == encoding => (content, tokens),
        // Counted under another encoding (the model changed meanwhile).
        Some((e, (content, _))) => {
            model_switch::recount_inline_allowed(e, encoding, content.len(), &cfg)?;
            let tokens = count_message(encoding, role, &content);
            (content, tokens)
        }
        // Not counted yet (small content, or not UTF-8): here, inline.
        None => {
            let content = args::utf8("content", raw_content)?;
            let tokens = match given {
                Some(n) => n,
                None => count_message(encoding, role, content),
            };
            (Arc::from(content), tokens)
        }
    };

    let now = now_ms();
    let message = Message {
        id,
        role: role.into(),
        content,
        ts: ts.map_or(now, |t| t as i64),
        tokens,
        meta: meta.map(Box::from),
    };
    let op = Op::Append {
        now,
        settings,
        message,
        msgid: msgid.map(Box::from),
    };

    // Everything is validated; from here on the write cannot fail.
    let session = key.session_or_create(|| op.new_session())?;
    // A new tokenizer: the session re-counted first (replicated as an op).
    model_switch::apply(ctx, keyname, session, now, encoding, recounted.as_ref())?;
    let how = Propagate::Op(op.header(), Some(raw_content));
    let outcome = session.apply(op).map_err(error::session)?;
    let summarize = session.meets(session_thresholds(session, &cfg));
    let expiry = session.key_expiry(now);
    let events = Events::appends(&[(outcome.clone(), summarize)]);
    finish_write(ctx, keyname, &key, how, expiry, now, &events);
    reply_outcome(ctx, &outcome, summarize)
}

/// MEM.SUMMARIZE key upto summary [LEASE token]
pub fn summarize(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    summarize_counted(ctx, args, Pass::Fresh)
}

/// MEM.SUMMARIZE, resumed with the summary counted off the main thread.
fn summarize_counted(
    ctx: &Context,
    args: Vec<RedisString>,
    pass: Pass<CountedSummary>,
) -> RedisResult {
    arity(&args, 4)?;
    let lease = Options::parse(&args[4..], &table::SUMMARIZE)?.u64("LEASE", 1)?;
    let resumed = pass.is_resumed();
    let counted = pass.output();
    let keyname = &args[1];
    let upto = args::parse_u64("upto", &args[2], 1)?;
    let raw_text = &args[3];
    let cfg = Config::current();
    args::check_size("summary", raw_text.len(), cfg.max_message_bytes)?;

    let mut key = SessionKey::open(ctx, keyname, true)?;
    let Some(session) = key.session_mut() else {
        return Err(error::no_such_key());
    };
    // A retry of a summary already committed (the reply was lost): the
    // same summary is in place; answered so, not refused as stale.
    if let Some(outcome) = session.summary_retried(upto, raw_text.as_slice()) {
        return reply_duplicate(ctx, session, &outcome, &cfg);
    }
    // Another worker's live lease: its summary is on the way.
    session.check_lease(lease, now_ms()).map_err(|e| {
        stats::add(&stats::SUMMARIES_REFUSED_LEASE, 1);
        error::session(e)
    })?;
    // Refused before the text is counted when upto alone rules it out.
    let refused = |e| {
        stats::add(&stats::SUMMARIES_REJECTED, 1);
        error::session(e)
    };
    // Against what a read shows: an upto past maxage is no longer a message.
    session
        .live(now_ms())
        .check_summary_upto(upto)
        .map_err(refused)?;
    let encoding = session.settings.encoding;
    // A large summary is checked and counted by a worker, as a large
    // message; so is one whose encoding is not built yet (the worker builds it).
    let large = raw_text.len() as u64 >= cfg.inline_limit(encoding);
    let unbuilt = !resumed && encoding_build::must_wait(ctx, encoding)?;
    if resumed {
        encoding_build::require(ctx, encoding)?;
    }
    if !resumed && (large || unbuilt) {
        if large {
            refuse_where_blocking_is_impossible(ctx, "summary", raw_text.len())?;
        }
        if can_block(ctx) {
            drop(key);
            // The worker checks, copies and counts the text (the main thread
            // touches none of its bytes).
            return offload::run(ctx, args, 1, 3, summarize_counted, move |bytes| {
                let text = std::str::from_utf8(bytes).ok().map(|text| {
                    (
                        text.to_owned(),
                        count_message(encoding, SUMMARY_COUNTED_AS, text),
                    )
                });
                CountedSummary { encoding, text }
            });
        }
    }
    let (text, tokens) = match counted.and_then(|c| c.text.map(|t| (c.encoding, t))) {
        Some((e, counted)) if e == encoding => counted,
        // Counted under another encoding (the model changed meanwhile), or
        // not counted yet (small, or not UTF-8): here, inline.
        Some((e, (text, _))) => {
            model_switch::recount_inline_allowed(e, encoding, text.len(), &cfg)?;
            let tokens = count_message(encoding, SUMMARY_COUNTED_AS, &text);
            (text, tokens)
        }
        None => {
            let text = args::utf8("summary", raw_text)?;
            (
                text.to_owned(),
                count_message(encoding, SUMMARY_COUNTED_AS, text),
            )
        }
    };
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
    let header = op.header();
    // The core refuses (changing nothing) a summary over maxtokens, and
    // checks upto again.
    let outcome = session.apply(op).map_err(refused)?;
    let summarize = session.meets(session_thresholds(session, &cfg));
    let expiry = session.key_expiry(now);
    let mut events = Events::default();
    events.add(Write::Summarize, outcome.trimmed, false);
    // The text travels as the client's own argument (no copy).
    finish_write(
        ctx,
        keyname,
        &key,
        Propagate::Op(header, Some(raw_text)),
        expiry,
        now,
        &events,
    );
    reply_outcome(ctx, &outcome, summarize)
}

/// What a worker made of a large summary: its text checked and copied, with
/// its tokens (None: not UTF-8; the command reports it).
struct CountedSummary {
    encoding: Encoding,
    text: Option<(String, u64)>,
}
