//! A write whose MODEL moves the session to another tokenizer re-counts the
//! session first (session/recount.rs): off the main thread when the texts
//! are large, inline when small, and replicated as one `Op::Recount`.

use redis_module::{Context, RedisError, RedisString};

use crate::config::Config;
use crate::error;
use crate::persistence;
use crate::session::{Op, Recounted, Session, Snapshot};
use crate::tokenizer::{count_message, Counting, Encoding, ToolFormat};

/// The session's counter under `encoding`, with `tools`' format of tool calls.
fn counter(tools: ToolFormat) -> impl Fn(Encoding, &str, &str, Option<&str>) -> u64 {
    move |encoding, role, content, meta| {
        count_message(Counting { encoding, tools }, role, content, meta)
    }
}

/// Whether a write under `encoding` must re-count `session` first.
/// Another encoding, or a model whose prompt renders tool calls otherwise
/// (gpt-4o to gpt-oss: one encoding, two formats), re-counts.
pub fn needed(session: Option<&Session>, counting: Counting) -> Option<&Session> {
    session.filter(|s| {
        Counting::new(&s.settings.model, s.settings.encoding) != counting
            && (s.summary.is_some() || !s.messages.is_empty())
    })
}

/// The snapshot a worker counts, when the re-count is large enough for one.
pub fn offload(session: Option<&Session>, counting: Counting, cfg: &Config) -> Option<Snapshot> {
    needed(session, counting)
        .filter(|s| s.text_bytes() as u64 >= cfg.inline_limit(counting.encoding))
        .map(Session::snapshot)
}

/// Counts a snapshot (on a worker).
pub fn count(snapshot: Option<Snapshot>, counting: Counting) -> Option<Recounted> {
    snapshot.map(|s| s.count(counting.encoding, &counter(counting.tools)))
}

/// Re-counts `session` under `encoding` (using `done`, the worker's counts,
/// for what it covers), applies it and replicates it before the write
/// that follows. Nothing to do when the session already counts so.
pub fn apply(
    ctx: &Context,
    keyname: &RedisString,
    session: &mut Session,
    now: i64,
    counting: Counting,
    done: Option<&Recounted>,
) -> Result<(), RedisError> {
    let Some(op) = recount_op(session, now, counting, done)? else {
        return Ok(());
    };
    let payload = persistence::encode_op(&op);
    session.apply(op).map_err(error::session)?;
    let payload = RedisString::create_from_slice(ctx.ctx, &payload);
    crate::commands::replicate(ctx, c"MEM._APPLY", [keyname, &payload]);
    Ok(())
}

/// The re-count [`apply`] applies, or None when the session already
/// counts under `counting` (a batch's dry run applies it to a copy).
pub fn recount_op(
    session: &Session,
    now: i64,
    counting: Counting,
    done: Option<&Recounted>,
) -> Result<Option<Op>, RedisError> {
    let encoding = counting.encoding;
    if needed(Some(session), counting).is_none() {
        return Ok(None);
    }
    // Counts of another lifetime of the key (deleted and made again while
    // the worker counted) cover nothing: its ids name other messages.
    if done.is_some_and(|d| !d.is_of(session)) {
        return Err(changed_meanwhile());
    }
    // What changed while the worker counted is counted here, if small.
    let cfg = Config::current();
    let coverage = session.coverage(encoding, done);
    let uncovered = coverage.uncovered_bytes();
    if uncovered as u64 >= cfg.inline_limit(encoding) {
        return Err(grew_meanwhile(uncovered));
    }
    Ok(Some(session.recount_op(
        now,
        &coverage,
        &counter(counting.tools),
    )))
}

/// A large text counted off the main thread whose session changed tokenizer
/// (another client's MODEL) before it came back: counting it again here
/// would hold the server, and a client cannot be blocked twice.
pub fn changed_meanwhile() -> RedisError {
    crate::error::try_again(
        "the session's tokenizer changed while this command's texts were counted (another \
         write changed its model, or the key was deleted, replaced or expired); send it again",
    )
}

/// A model switch whose session took more new text while the worker
/// counted than the main thread may count (other clients appending large
/// messages): said as it is, not as a tokenizer change no one made.
pub fn grew_meanwhile(bytes: usize) -> RedisError {
    crate::error::try_again(format!(
        "the session took {bytes} bytes of new messages (or of others put in their place, by a \
         COPY or RESTORE over the key) while it was re-counted for the new model, more than \
         are counted on the main thread; send it again (a session appended to without pause \
         switches model between its bursts)"
    ))
}

/// Whether a text counted as `counted_as` must be counted again as
/// `counting` (another encoding, or another model's tool-call format),
/// refused when it is large (see [`changed_meanwhile`]).
pub fn recount_inline_allowed(
    counted_as: Counting,
    counting: Counting,
    bytes: usize,
    cfg: &Config,
) -> Result<(), RedisError> {
    if counted_as != counting && bytes as u64 >= cfg.inline_limit(counting.encoding) {
        return Err(changed_meanwhile());
    }
    Ok(())
}
