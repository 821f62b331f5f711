//! Encodings are built the first time a command needs one (tokenizer/
//! load.rs: 1-3 s), never on the main thread by a client's command: a
//! command whose encoding is not built counts on the pool as a large text
//! does (async_count.rs), and the worker builds the encoding as it counts;
//! the command is resumed with the count. Where a client cannot wait
//! (MULTI/EXEC, scripts) it is refused with TRYAGAIN and the build starts
//! anyway. The replication stream and AOF loading apply ops that carry their
//! counts and need no encoding; a write that would still need one there
//! builds it inline, as those cannot be deferred.

use std::sync::atomic::{AtomicU32, Ordering};

use redis_module::{Context, ContextFlags, RedisError};

use crate::tokenizer::{self, Encoding, State};

/// Encodings whose build was queued by [`build_in_background`] (a bit each).
static QUEUED: AtomicU32 = AtomicU32::new(0);

/// Where `MULTI`, scripts and `CLIENT NO-EVICT`-style contexts cannot block.
pub fn cannot_wait(ctx: &Context) -> bool {
    ctx.get_flags()
        .intersects(ContextFlags::MULTI | ContextFlags::LUA | ContextFlags::DENY_BLOCKING)
}

pub fn failed(encoding: Encoding) -> RedisError {
    crate::error::invalid(format!(
        "encoding {} could not be built (see the Redis log)",
        encoding.name()
    ))
}

/// The refusal where a client cannot wait for a build.
pub fn busy(encoding: Encoding) -> RedisError {
    crate::error::try_again(format!(
        "encoding {} is being built (its first use, 1-2 s), which MULTI/EXEC and scripts \
         cannot wait for: retry shortly",
        encoding.name()
    ))
}

/// Starts building `encoding` on the pool, once.
pub fn build_in_background(encoding: Encoding) {
    let bit = 1u32 << (encoding as u32);
    if tokenizer::state(encoding) != State::Unloaded
        || QUEUED.fetch_or(bit, Ordering::AcqRel) & bit != 0
    {
        return;
    }
    let job = move || {
        let _ = tokenizer::load(encoding);
    };
    if super::pool::submit(Box::new(job)).is_err() {
        QUEUED.fetch_and(!bit, Ordering::AcqRel);
    }
}

/// An encoding `mem.encodings` leaves out is refused to clients (the
/// replication stream and AOF loading apply what the master decided).
pub fn check_allowed(ctx: &Context, encoding: Encoding) -> Result<(), RedisError> {
    if crate::config::ENCODINGS_CONFIG.allows(encoding)
        || ctx
            .get_flags()
            .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
    {
        return Ok(());
    }
    Err(not_allowed(encoding))
}

/// The refusal of an encoding `mem.encodings` leaves out.
pub fn not_allowed(encoding: Encoding) -> RedisError {
    crate::error::invalid(format!(
        "encoding {} is not in mem.encodings: this server does not count with it (CONFIG SET mem.encodings)",
        encoding.name()
    ))
}

/// Whether a command must count on the pool because `encoding` is not
/// built yet (the worker builds it as it counts, as for a large text);
/// refused where the client cannot wait.
pub fn must_wait(ctx: &Context, encoding: Encoding) -> Result<bool, RedisError> {
    check_allowed(ctx, encoding)?;
    if tokenizer::is_loaded(encoding) {
        return Ok(false);
    }
    if tokenizer::state(encoding) == State::Failed {
        return Err(failed(encoding));
    }
    if cannot_wait(ctx) {
        build_in_background(encoding);
        return Err(busy(encoding));
    }
    Ok(true)
}

/// A command resumed after a worker (or unable to wait for one) counts
/// inline: its encoding is built by then, unless the session's model moved
/// to another encoding meanwhile (TRYAGAIN, as for a text counted under the
/// old one). The replication stream and AOF loading build it here.
pub fn require(ctx: &Context, encoding: Encoding) -> Result<(), RedisError> {
    check_allowed(ctx, encoding)?;
    if tokenizer::is_loaded(encoding) {
        return Ok(());
    }
    if ctx
        .get_flags()
        .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING)
    {
        return tokenizer::load(encoding)
            .map(|_| ())
            .ok_or_else(|| failed(encoding));
    }
    build_in_background(encoding);
    Err(crate::error::try_again(format!(
        "the session's encoding {} is being built (its first use): send the command again",
        encoding.name()
    )))
}
