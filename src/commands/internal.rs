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
    let last = LAST_APPEND.take();
    let outcome = match key.session_mut() {
        // apply fails before changing anything.
        Some(session) if appended_at.is_some() => {
            let mut stays_below = last
                .filter(|l| l.is_of(&args[1], session, &op))
                .map_or(0, |l| l.stays_below);
            let outcome = session
                .apply_one_of_many(op, prepared, &mut stays_below)
                .map_err(crate::error::session)?;
            session.settle();
            LAST_APPEND.set(Some(LastAppend::of(&args[1], session, stays_below)));
            outcome
        }
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

/// What the last `MEM._APPLY` append left: a master's MEM.APPENDBATCH
/// reaches replicas and the AOF as one op a message (in MULTI/EXEC), and
/// each read every head for MAXAGE (1,000 ops on a 100,000-message session
/// held a replica's EXEC 0.13-2.1 s, where the master took 1-3 ms). The
/// next op of the same batch (same `now`, same MAXAGE) on the same session,
/// unchanged since, reads only what follows (`Session::apply_one_of_many`).
/// Compared, never dereferenced: the key's name, the session's address and
/// what any other write would have changed (last id, message count,
/// tokens, time, MAXAGE).
#[derive(Clone, Copy)]
struct LastAppend {
    key: u64,
    session: *const crate::session::Session,
    last_id: u64,
    messages: usize,
    total_tokens: u64,
    now: i64,
    max_age: u64,
    stays_below: u64,
}

impl LastAppend {
    fn of(key: &RedisString, session: &crate::session::Session, stays_below: u64) -> LastAppend {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        key.as_slice().hash(&mut hasher);
        LastAppend {
            key: hasher.finish(),
            session,
            last_id: session.last_id,
            messages: session.messages.len(),
            total_tokens: session.total_tokens,
            now: session.updated,
            max_age: session.settings.max_age,
            stays_below,
        }
    }

    fn is_of(
        &self,
        key: &RedisString,
        session: &crate::session::Session,
        op: &crate::session::Op,
    ) -> bool {
        let crate::session::Op::Append { now, settings, .. } = op else {
            return false;
        };
        std::ptr::eq(self.session, session)
            && *self == LastAppend::of(key, session, self.stays_below)
            && *now == self.now
            && settings.max_age == self.max_age
    }
}

impl PartialEq for LastAppend {
    fn eq(&self, o: &LastAppend) -> bool {
        (
            self.key,
            self.last_id,
            self.messages,
            self.total_tokens,
            self.now,
            self.max_age,
        ) == (
            o.key,
            o.last_id,
            o.messages,
            o.total_tokens,
            o.now,
            o.max_age,
        )
    }
}

thread_local! {
    static LAST_APPEND: std::cell::Cell<Option<LastAppend>> = const { std::cell::Cell::new(None) };
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
    LAST_APPEND.take();
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
