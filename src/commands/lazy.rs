//! Encodings are built the first time a command needs one (tokenizer/
//! load.rs: 1-2 s), never on the main thread by a client's command: the
//! client waits, blocked, as for a large count, while a worker builds it,
//! and the command then runs again from the start (after the checks a fresh
//! command gets, admission.rs). Where a client cannot wait (MULTI/EXEC,
//! scripts) the command is refused with TRYAGAIN and the build starts
//! anyway. The replication stream and AOF loading apply ops that carry their
//! counts and need no encoding; a write that would still need one there is
//! built inline, as those cannot be deferred.

use std::sync::atomic::{AtomicU32, Ordering};

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString};

use super::async_count::{can_block, off_thread, Resume};
use crate::tokenizer::{self, Encoding, State};

/// Encodings whose build was queued by [`build_in_background`] (a bit each).
static QUEUED: AtomicU32 = AtomicU32::new(0);

/// Where `MULTI`, scripts and `CLIENT NO-EVICT`-style contexts cannot block.
pub fn cannot_wait(ctx: &Context) -> bool {
    ctx.get_flags().intersects(ContextFlags::MULTI | ContextFlags::LUA | ContextFlags::DENY_BLOCKING)
}

pub fn failed(encoding: Encoding) -> RedisError {
    RedisError::String(format!(
        "ERR encoding {} could not be built (see the Redis log)",
        encoding.name()
    ))
}

/// The refusal where a client cannot wait for a build.
pub fn busy(encoding: Encoding) -> RedisError {
    RedisError::String(format!(
        "TRYAGAIN encoding {} is being built (its first use, 1-2 s), which MULTI/EXEC and scripts \
         cannot wait for: retry shortly",
        encoding.name()
    ))
}

/// Starts building `encoding` on the pool, once.
pub fn build_in_background(encoding: Encoding) {
    let bit = 1u32 << (encoding as u32);
    if tokenizer::state(encoding) != State::Unloaded || QUEUED.fetch_or(bit, Ordering::AcqRel) & bit != 0 {
        return;
    }
    let job = move || {
        let _ = tokenizer::load(encoding);
    };
    if crate::pool::submit(Box::new(job)).is_err() {
        QUEUED.fetch_and(!bit, Ordering::AcqRel);
    }
}

/// The command (`args`, its key at 1) needs `encoding`, which is not built:
/// the client waits for it and `again` (the command from the start) runs
/// once it is.
pub fn wait(ctx: &Context, args: Vec<RedisString>, encoding: Encoding, again: Resume) -> RedisResult {
    if tokenizer::state(encoding) == State::Failed {
        return Err(failed(encoding));
    }
    if cannot_wait(ctx) {
        build_in_background(encoding);
        return Err(busy(encoding));
    }
    if can_block(ctx) {
        if let Some(key) = args.get(1) {
            let work = move |_: &[u8]| -> super::async_count::Output {
                let _ = tokenizer::load(encoding);
                Box::new(())
            };
            if let Some(reply) = off_thread(ctx, key, key, again, work) {
                return reply;
            }
        }
    }
    // The replication stream or AOF loading (see above), or a client that
    // could not be blocked.
    if tokenizer::load(encoding).is_none() {
        return Err(failed(encoding));
    }
    again(ctx, args, None)
}
