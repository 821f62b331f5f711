//! MEM.EXTSET and MEM.EXTGET: an orchestrator's own conversation id (Dify,
//! n8n, ...) kept with the session, each with its own expiry.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use super::args::{self, Options};
use super::{arity, finish_write, now_ms, Events, OpHeader, Propagate, SettingsOptions, Write};
use crate::config::Config;
use crate::declare::{entry, integer, key, option, string, Access::*, CommandDecl};
use crate::key::SessionKey;
use crate::session::{check_external_sizes, ExternalId, Op, MAX_EXTERNAL_SYSTEMS, MAX_TTL_SECS};

/// MEM.EXTSET key system conversation_id [EX seconds]
pub fn ext_set(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    arity(&args, 4)?;
    let keyname = &args[1];
    // Sizes first: a huge argument is refused before it is scanned.
    // EXTGET answers nil for no id; an empty one would read as neither.
    check_external_sizes(args[2].len(), args[3].len()).map_err(crate::error::invalid)?;
    let system = args::utf8("system", &args[2])?;
    let id = args::utf8("conversation_id", &args[3])?;
    args::name_chars("system", system)?;
    let opts = Options::parse(&args[4..], &EXT_SET)?;
    let cfg = Config::current();
    let ex = opts
        .seconds("EX", 1)?
        .unwrap_or(cfg.ext_ttl)
        .clamp(1, MAX_TTL_SECS);

    let mut key = SessionKey::open(ctx, keyname, true)?;
    let now = now_ms();
    let remaining = key.ttl_ms();
    let created = key.session().is_none();
    if key
        .session()
        .is_some_and(|s| !s.has_room_for_external(system, now))
    {
        return Err(crate::error::invalid(format!(
            "a session holds at most {MAX_EXTERNAL_SYSTEMS} external ids"
        )));
    }
    let settings = SettingsOptions::none().merge(key.session(), &cfg);
    let external = ExternalId {
        id: id.to_owned(),
        expires_at: now.saturating_add(ex as i64 * 1000),
    };
    let expires_at = external.expires_at;
    let op = Op::ExtSet {
        now,
        settings,
        system: system.to_owned(),
        external,
    };
    let session = key.session_or_create(|| op.new_session())?;
    let header = OpHeader::of(&op);
    let outcome = session.apply(op).map_err(crate::error::session)?;
    let expiry = match remaining {
        _ if created => session.key_expiry(now),
        remaining => kept_expiry(remaining, now, expires_at),
    };
    finish_write(
        ctx,
        keyname,
        &key,
        Propagate::Op(header, None),
        expiry,
        Events::default().add(Write::ExtSet, outcome.trimmed, false),
    );
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// The key never expires before an external id: a new session gets its
/// TTL (or the id's expiry if later); an existing expiry (`remaining` ms,
/// None: none) only moves later.
fn kept_expiry(remaining: Option<i64>, now: i64, expires_at: i64) -> Option<i64> {
    // A key PEXPIREd further than the documented maximum comes back to it,
    // so the expiry set here never nears what Redis can add its clock to.
    remaining.map(|ms| {
        now.saturating_add(ms.min(MAX_TTL_SECS as i64 * 1000))
            .max(expires_at)
    })
}

/// MEM.EXTGET key system
pub fn ext_get(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let system = args::utf8("system", &args[2])?;
    let key = SessionKey::open(ctx, &args[1], false)?;
    let id = key.session().and_then(|s| s.ext_get(system, now_ms()));
    Ok(id.map_or(RedisValue::Null, |id| RedisValue::BulkString(id.to_owned())))
}

pub static EXT_SET: CommandDecl = CommandDecl {
    name: "mem.extset",
    entry: entry!(ext_set),
    flags: "write deny-oom",
    acl: "mem",
    summary:
        "Stores an external orchestrator's conversation id for the session, with its own expiry.",
    complexity: "O(log N) for N external ids.",
    arity: -4,
    access: Update,
    args: &[
        key(),
        string("system"),
        string("conversation_id"),
        option("EX", integer("seconds")),
    ],
};
pub static EXT_GET: CommandDecl = CommandDecl {
    name: "mem.extget",
    entry: entry!(ext_get),
    flags: "readonly",
    acl: "mem",
    summary: "Returns an external orchestrator's conversation id, or nil when unknown or expired.",
    complexity: "O(log N) for N external ids.",
    arity: 3,
    access: Read,
    args: &[key(), string("system")],
};
