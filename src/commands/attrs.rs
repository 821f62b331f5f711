//! MEM.ATTRSET, MEM.ATTRGET, MEM.ATTRDEL: the seed document's other members
//! (`user_profile`, `context`, ...), kept with the session and returned at
//! the top level of `FORMAT JSON`, editable one by one instead of by
//! re-importing the whole session.

use std::sync::Arc;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use super::args::{self, Options};
use super::read::WORKER_REPLY_BYTES;
use super::reply::Reply;
use super::{finish_write, now_ms, Events, OpHeader, Propagate, SettingsOptions, Write};
use crate::config::Config;
use crate::declare::{entry, integer, key, option, optional, string, Access::*, CommandDecl};
use crate::error;
use crate::key::SessionKey;
use crate::offload::{self, can_block, refuse_large_where_blocking_is_impossible, Pass};
use crate::session::{check_attr_name, check_attr_value, Op};

/// The name argument, checked as ATTRSET/ATTRDEL require.
fn attr_name(arg: &RedisString) -> Result<&str, RedisError> {
    let name = args::utf8("name", arg)?;
    check_attr_name(name).map_err(error::bad_attr_name)?;
    args::name_chars("attribute name", name)?;
    Ok(name)
}

/// JSON values (ATTRSET values, META) of at least this many bytes are
/// walked by a worker: the walk runs at ~80 MB/s on its worst shapes (a
/// million `{}` or `0`: 11-14 ms per MB), so 256 KB stays near 3 ms.
pub const MAX_INLINE_JSON_BYTES: usize = 256 << 10;

/// Whether a large JSON value can go to a worker: refused in MULTI/EXEC and
/// scripts (which cannot wait for one), false where the client cannot
/// block otherwise (the caller walks it inline).
pub fn can_offload_json(ctx: &Context, len: usize) -> Result<bool, RedisError> {
    refuse_large_where_blocking_is_impossible(
        ctx,
        &format!("json of {len} bytes (256 KB or more) is checked"),
    )?;
    Ok(can_block(ctx))
}

/// Most attributes (distinct members) a session holds through MEM.ATTRSET.
pub use crate::session::MAX_ATTRS;

/// MEM.ATTRSET key name json [EX seconds]
pub fn attr_set(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    attr_set_checked(ctx, args, Pass::Fresh)
}

/// MEM.ATTRSET, resumed with its value checked off the main thread (the
/// verdict of a large value's JSON walk, and the value as stored, copied
/// there too).
fn attr_set_checked(
    ctx: &Context,
    args: Vec<RedisString>,
    pass: Pass<Result<Arc<str>, String>>,
) -> RedisResult {
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let keyname = &args[1];
    let name = attr_name(&args[2])?;
    // The attribute's own lifetime (the seed's 1 h session context).
    let ex = Options::parse(&args[4..], &ATTR_SET)?.seconds("EX", 1)?;
    let cfg = Config::current();
    // Limits as for META: the size first, so a huge value is not parsed.
    let len = args[3].len();
    args::check_size("json", len, cfg.max_message_bytes)?;
    let resumed = pass.is_resumed();
    let value = match pass.output() {
        Some(verdict) => verdict.map_err(error::bad_attr_value)?,
        None if !resumed && len >= MAX_INLINE_JSON_BYTES && can_offload_json(ctx, len)? => {
            // Checked (UTF-8 too) and copied by a worker; the command runs
            // again with the value.
            return offload::run(ctx, args, 1, 3, attr_set_checked, |bytes| {
                let value =
                    crate::utf8::str(bytes).ok_or_else(|| "json is not valid UTF-8".to_owned())?;
                check_attr_value(value)?;
                Ok(stored_value(value))
            });
        }
        None => {
            let value = args::utf8("json", &args[3])?;
            check_attr_value(value).map_err(error::bad_attr_value)?;
            stored_value(value)
        }
    };
    store_attr(ctx, keyname, (name, value, ex), &cfg)
}

/// A value as stored: as the client wrote it (numbers, key order and all),
/// without the whitespace around it.
fn stored_value(json: &str) -> Arc<str> {
    Arc::from(args::trim_json(json))
}

/// MEM.ATTRSET's write, its value checked: the session created or updated,
/// its expiry slid, the op replicated.
fn store_attr(
    ctx: &Context,
    keyname: &RedisString,
    (name, value, ex): (&str, Arc<str>, Option<u64>),
    cfg: &Config,
) -> RedisResult {
    let mut key = SessionKey::open(ctx, keyname, true)?;
    let now = now_ms();
    // A bounded number of names, so an edit (which looks at every name)
    // stays cheap whatever a client does.
    if let Some(s) = key.session() {
        // Distinct names live now (expired ones go with this write; an
        // imported document's repeated name is one), counted only near the
        // cap: the members held bound them from above.
        let full = s.attr_count() >= MAX_ATTRS && s.extra.live_count(now) >= MAX_ATTRS;
        if full && !s.has_attr(name, now) {
            return Err(crate::error::invalid(format!(
                "a session holds at most {MAX_ATTRS} attributes"
            )));
        }
    }
    let settings = SettingsOptions::none().merge(key.session(), cfg);
    let op = Op::AttrSet {
        now,
        settings,
        name: name.to_owned(),
        value,
        // At most 100 years (seconds checks): far from overflow.
        expires_at: ex.map(|s| now + s as i64 * 1000),
    };
    let header = OpHeader::of(&op);
    let session = key.session_or_create(|| op.new_session())?;
    let outcome = session.apply(op).map_err(error::session)?;
    // Sliding expiry, as every turn of the seed's cache refreshed it.
    let expiry = session.key_expiry(now);
    let mut events = Events::default();
    events.add(Write::AttrSet, outcome.trimmed, false);
    finish_write(
        ctx,
        keyname,
        &key,
        Propagate::Op(header, None),
        expiry,
        &events,
    );
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// MEM.ATTRGET key [name]
pub fn attr_get(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 2 && args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let key = SessionKey::open(ctx, &args[1], false)?;
    let session = key.session();
    let now = now_ms();
    if let Some(arg) = args.get(2) {
        // Any name may be asked for; a name ATTRSET refuses is never set.
        let name = args::utf8("name", arg)?;
        match session.and_then(|s| s.attr(name, now)) {
            Some(value) => Reply::new(ctx).bulk(&value),
            None => return Ok(RedisValue::Null),
        };
        return Ok(RedisValue::NoReply);
    }
    let Some(session) = session else {
        Reply::new(ctx).map(0);
        return Ok(RedisValue::NoReply);
    };
    // Values of 1 MiB and more in all: the reply is written on a worker, from
    // the members (shared, not copied), as MEM.GET's (4 values of 4 MB held
    // the main thread 11-20 ms, 40 of them 1.5 s).
    if session.extra.value_bytes() >= WORKER_REPLY_BYTES && can_block(ctx) {
        let attrs = session.extra.clone();
        return offload::reply_written_by_worker(ctx, move |reply_ctx| {
            write_attrs(reply_ctx, &attrs.live(now));
        });
    }
    write_attrs(ctx, &session.attrs(now));
    Ok(RedisValue::NoReply)
}

/// MEM.ATTRGET's map of every attribute.
fn write_attrs(ctx: &Context, all: &[(String, std::sync::Arc<str>)]) {
    let reply = Reply::new(ctx);
    reply.map(all.len());
    for (name, value) in all {
        reply.field_str(name, value);
    }
}

/// MEM.ATTRDEL key name
pub fn attr_del(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let keyname = &args[1];
    // Any stored name can be removed (an import keeps members whose names
    // ATTRSET would refuse: empty, or over 64 bytes).
    let name = args::utf8("name", &args[2])?;
    let mut key = SessionKey::open(ctx, keyname, true)?;
    let now = now_ms();
    // Nothing to delete (or expired): no write, nothing replicated, no event.
    if !key.session().is_some_and(|s| s.has_attr(name, now)) {
        return Ok(RedisValue::Integer(0));
    }
    let Some(session) = key.session_mut() else {
        return Ok(RedisValue::Integer(0));
    };
    let op = Op::AttrDel {
        now,
        name: name.to_owned(),
    };
    let header = OpHeader::of(&op);
    let outcome = session.apply(op).map_err(error::session)?;
    let expiry = session.key_expiry(now);
    let mut events = Events::default();
    events.add(Write::AttrDel, outcome.trimmed, false);
    finish_write(
        ctx,
        keyname,
        &key,
        Propagate::Op(header, None),
        expiry,
        &events,
    );
    Ok(RedisValue::Integer(1))
}

pub static ATTR_SET: CommandDecl = CommandDecl {
    name: "mem.attrset",
    entry: entry!(attr_set),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Stores a JSON value under a name beside the history (user_profile, context, ...), returned at the top level of MEM.GET FORMAT JSON, with EX a lifetime of its own; creates the session and refreshes its TTL.",
    complexity: "O(N) in the size of the session's attributes.",
    arity: -4,
    access: Update,
    args: &[
        key(),
        string("name"),
        string("json"),
        option("EX", integer("seconds")),
    ],
};
pub static ATTR_GET: CommandDecl = CommandDecl {
    name: "mem.attrget",
    entry: entry!(attr_get),
    flags: "readonly",
    acl: "mem",
    summary: "Returns an attribute's JSON text (nil when absent), or without a name a map of every attribute.",
    complexity: "O(N) in the size of the session's attributes.",
    arity: -2,
    access: Read,
    args: &[key(), optional(string("name"))],
};
pub static ATTR_DEL: CommandDecl = CommandDecl {
    name: "mem.attrdel",
    entry: entry!(attr_del),
    flags: "write",
    acl: "mem",
    summary: "Removes an attribute; returns 1 when it was set, else 0.",
    complexity: "O(N) in the size of the session's attributes.",
    arity: 3,
    access: Delete,
    args: &[key(), string("name")],
};
