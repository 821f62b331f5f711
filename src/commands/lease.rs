//! MEM.SUMMARIZE_BEGIN: a summarizer worker's start. Every worker that
//! hears `mem.threshold` may call it; one gets a lease, the others `lease 0`,
//! so one LLM call is made per summary (session/lease.rs has the rules).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use super::args::{self, Options};
use super::read::{write_check, CheckOptions, CHECK_FIELDS};
use super::read::{KEEP, WINDOW};
use super::reply::Reply;
use super::{arity, default_settings, now_ms, replicate_op};
use crate::config::Config;
use crate::declare::{entry, integer, key, Access::*, CommandDecl};
use crate::error;
use crate::key::SessionKey;
use crate::session::{above_every_issued_token, note_issued, Lease, Op, Session, MAX_LEASE_MS};

use crate::stats;

/// Stores and replicates a granted lease; its expiry.
fn grant(
    ctx: &Context,
    keyname: &RedisString,
    key: &mut SessionKey,
    lease: Lease,
    now: i64,
) -> Result<i64, RedisError> {
    let op = Op::Lease { now, lease };
    let Some(session) = key.session_mut() else {
        return Err(error::no_such_key());
    };
    session.apply(op.clone()).map_err(error::session)?;
    // Only the lease changed: no TTL refresh (a worker looking at a
    // session does not keep it alive), no keyspace event.
    note_issued(lease.token);
    replicate_op(ctx, keyname, &op, None);
    super::signal_modified(ctx, keyname);
    stats::add(&stats::LEASES_GRANTED, 1);
    Ok(lease.expires_at)
}

/// MEM.SUMMARIZE_BEGIN key lease-ms [MODEL name | CONTEXT tokens] [KEEP n]
pub fn summarize_begin(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    arity(&args, 3)?;
    let lease_ms = args::parse_u64("lease-ms", &args[2], 1)?;
    if lease_ms > MAX_LEASE_MS {
        return Err(crate::error::invalid(format!(
            "lease-ms must be at most {MAX_LEASE_MS} (a day)"
        )));
    }
    let opts = Options::parse(&args[3..], &SUMMARIZE_BEGIN)?;
    let cfg = Config::current();
    let options = CheckOptions::parse(&opts, &cfg)?;

    let keyname = &args[1];
    let mut key = SessionKey::open(ctx, keyname, true)?;
    let now = now_ms();
    let (check, lease, held) = match key.session() {
        Some(session) => {
            // As every read: without the messages past maxage.
            let live = session.live(now);
            let (check, lease) = live
                .begin(options.thresholds(&live, &cfg), options.keep, now, lease_ms)
                .map_err(error::session)?;
            let lease = lease
                .map(above_every_issued_token)
                .transpose()
                .map_err(error::session)?;
            (check, lease, session.live_lease(now))
        }
        // A missing key: an empty session's answer, and nothing is created.
        None => {
            let empty = Session::new(default_settings(&cfg), now);
            (
                empty.summarize_check(options.thresholds(&empty, &cfg), options.keep),
                None,
                None,
            )
        }
    };
    let expires = match (lease, held) {
        (Some(lease), _) => grant(ctx, keyname, &mut key, lease, now)?,
        // Another worker is on it: its expiry tells when to look again.
        (None, Some(live)) => {
            if check.summarize && check.upto > 0 {
                stats::add(&stats::LEASES_BUSY, 1);
            }
            live.expires_at
        }
        (None, None) => 0,
    };
    let reply = Reply::new(ctx);
    reply.map(CHECK_FIELDS + 2);
    write_check(&reply, &check);
    reply
        .field_int("lease", lease.map_or(0, |l| l.token))
        .bulk("lease_expires")
        .signed(expires);
    Ok(RedisValue::NoReply)
}

pub static SUMMARIZE_BEGIN: CommandDecl = CommandDecl {
    name: "mem.summarize_begin",
    entry: entry!(summarize_begin),
    flags: "write",
    acl: "mem",
    summary: "A summarizer's start: the MEM.SUMMARIZE_CHECK answer plus a time-limited lease, granted to one worker at a time when the session meets its threshold.",
    complexity: "O(N) for N messages.",
    arity: -3,
    // Its reply is MEM.SUMMARIZE_CHECK's map.
    access: ReadUpdate,
    args: &[key(), integer("lease-ms"), WINDOW, KEEP],
};
