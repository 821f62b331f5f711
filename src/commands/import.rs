//! MEM.IMPORT: a session from a JSON document, for migrating client-side
//! `user_memory_*` keys in one pass.

use redis_module::{Context, RedisError, RedisResult, RedisString};

use super::args::{self, err, Options};
use super::{finish_write, now_ms, reply_outcome, session_thresholds, Events, Propagate, SettingsOptions, Write};
use crate::config::Config;
use crate::json_format;
use crate::key::SessionKey;
use crate::stats::count_message;

/// MEM.IMPORT key json [REPLACE] [MODEL name] [TTL seconds]
pub fn import(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    super::arity(&args, 3)?;
    let keyname = &args[1];
    let text = args::utf8("json", &args[2])?;
    let opts = Options::parse(&args[3..], &["MODEL", "TTL"], &["REPLACE"])?;
    let cfg = Config::current();
    let mut changes = SettingsOptions::parse(&opts, &cfg)?;

    let mut key = SessionKey::open(ctx, keyname, true)?;
    if !key.is_empty() && !opts.has("REPLACE") {
        return Err(RedisError::Str("BUSYKEY Target key name already exists."));
    }
    let doc = json_format::parse_import(text).map_err(|e| err(format!("ERR invalid document: {e}")))?;
    for m in &doc.messages {
        args::check_size("content", m.content.len(), cfg.max_message_bytes)?;
    }
    // The document's model unless MODEL names another; a new session's
    // settings otherwise.
    if let Some(m) = doc.model.as_deref() {
        changes.default_model(m)?;
    }
    let settings = changes.merge(None, &cfg);
    let now = now_ms();
    let mut session = doc
        .into_session(settings, now, count_message)
        .map_err(|e| err(format!("ERR invalid document: {e}")))?;
    let trimmed = session.trim_imported();
    let summarize = session.meets(session_thresholds(&session, &cfg));
    let outcome = crate::session::Outcome {
        id: session.last_id,
        tokens: session.messages.back().map_or(0, |m| m.tokens),
        total_tokens: session.total_tokens,
        messages: session.message_count(),
        trimmed,
        duplicate: false,
    };
    let expiry = session.key_expiry(now);
    key.put(session)?;
    let mut events = Events::default();
    events.add(Write::Import, trimmed, summarize);
    finish_write(ctx, keyname, &key, Propagate::Session, expiry, now, &events);
    reply_outcome(ctx, &outcome, summarize)
}
