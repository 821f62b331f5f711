//! Internal commands that carry a write's effect to replicas and the AOF:
//! `MEM._APPLY key op` (one op, as decided by the master) and
//! `MEM._PUT key session` (a whole session: AOF rewrite, import, re-count).
//! Both run only from the master link or while the AOF loads, and refuse
//! payloads that do not decode or break an invariant, changing nothing.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::declare::{entry, key, optional, string, Access::*, CommandDecl};
use crate::key::SessionKey;
use crate::persistence;

/// A client could otherwise write any session it can encode, bypassing
/// every rule the commands enforce (caps, id order, token counts).
fn internal_only(ctx: &Context, name: &str) -> Result<(), RedisError> {
    let flags = ctx.get_flags();
    if flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        return Ok(());
    }
    Err(crate::error::invalid(format!(
        "{name} is internal: it runs only from the master link or while loading the AOF"
    )))
}

/// MEM._APPLY key payload [content]
pub fn apply(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    internal_only(ctx, "MEM._APPLY")?;
    if args.len() != 3 && args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let mut op = persistence::decode_op(args[2].as_slice())
        .map_err(|e| crate::error::invalid(e.to_string()))?;
    let mut prepared = None;
    if let Some(content) = args.get(3) {
        let content = super::args::utf8("content", content)?;
        // A large message goes into the log as its stored bytes, its content
        // not copied into the op as well.
        prepared = op.laid_out(content);
        if prepared.is_none() {
            op = op.with_content(content);
        }
    }
    // Every check a load makes, from the master link too: a replica must
    // keep nothing its own RDB load would refuse (hostile pass 43: trusting
    // the master's JSON let a bad META in, and the node then failed DEBUG
    // RELOAD, its restart and every full sync it fed).
    op.validate()
        .map_err(|e| crate::error::invalid(format!("invalid op: {e}")))?;
    if let crate::session::Op::Lease { lease, .. } = &op {
        // A promoted replica (or a server after an AOF replay) grants above it.
        crate::session::note_issued(lease.token);
    }
    // An append's expiry is the op's to set (MEM.APPEND replicates no
    // PEXPIREAT beside it); an older master's PEXPIREAT that follows sets
    // the same time.
    let appended_at = match &op {
        crate::session::Op::Append { now, .. } => Some(*now),
        _ => None,
    };
    let event = replica_event(&op);
    let mut key = SessionKey::open(ctx, &args[1], true)?;
    let outcome = match key.session_mut() {
        // apply fails before changing anything.
        Some(session) => session
            .apply_prepared(op, prepared)
            .map_err(crate::error::session)?,
        None => {
            let Some(mut fresh) = op.new_session() else {
                return Err(crate::error::no_such_key());
            };
            let outcome = fresh
                .apply_prepared(op, prepared)
                .map_err(crate::error::session)?;
            key.put(fresh)?;
            outcome
        }
    };
    if let (Some(now), Some(session)) = (appended_at, key.session()) {
        key.set_abs_expiry(session.key_expiry(now));
    }
    super::signal_modified(ctx, &args[1]);
    ctx.replicate_verbatim();
    let trimmed = (outcome.trimmed > 0).then_some(c"mem.trim");
    for event in event.into_iter().chain(trimmed) {
        super::notify(ctx, event, &args[1]);
    }
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// The keyspace event a replica publishes for an op, as its master did for
/// the write (INFO's counters stay the master's). Not `mem.threshold`:
/// whether it was met is the master's settings' call, and summarizers
/// listen to the master. A whole session (`MEM._PUT`: an import, a model
/// switch, an AOF rewrite) publishes nothing.
fn replica_event(op: &crate::session::Op) -> Option<&'static std::ffi::CStr> {
    use crate::session::Op;
    match op {
        Op::Append { .. } => Some(c"mem.append"),
        Op::Summarize { .. } => Some(c"mem.summarize"),
        Op::ExtSet { .. } => Some(c"mem.extset"),
        Op::AttrSet { .. } => Some(c"mem.attrset"),
        Op::AttrDel { .. } => Some(c"mem.attrdel"),
        Op::Recount { .. } | Op::Lease { .. } => None,
    }
}

/// MEM._PUT key payload
pub fn put(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    internal_only(ctx, "MEM._PUT")?;
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let session = persistence::decode_session(args[2].as_slice())
        .map_err(|e| crate::error::invalid(e.to_string()))?;
    crate::session::note_issued(session.leases.last_token);
    let mut key = SessionKey::open(ctx, &args[1], true)?;
    key.put(session)?;
    super::signal_modified(ctx, &args[1]);
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// Internal: a master's write, as replicas and the AOF receive it.
pub static APPLY: CommandDecl = CommandDecl {
    name: "mem._apply",
    entry: entry!(apply),
    flags: "write",
    acl: "",
    summary: "Internal: applies one write as decided by the master (replication and AOF).",
    complexity: "O(N) in the size of the payload.",
    arity: -3,
    access: Update,
    args: &[key(), string("payload"), optional(string("content"))],
};
/// Internal: a whole session, as AOF rewrites and imports replicate it.
pub static PUT: CommandDecl = CommandDecl {
    name: "mem._put",
    entry: entry!(put),
    flags: "write",
    acl: "",
    summary: "Internal: stores a whole serialized session (AOF rewrite, replication of imports).",
    complexity: "O(N) in the size of the payload.",
    arity: 3,
    access: Overwrite,
    args: &[key(), string("payload")],
};
