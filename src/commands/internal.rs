//! Internal commands that carry a write's effect to replicas and the AOF:
//! `MEM._APPLY key op` (one op, as decided by the master) and
//! `MEM._PUT key session` (a whole session: AOF rewrite, import, re-count).
//! Both refuse payloads that do not decode, changing nothing.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use super::args::err;
use crate::key::SessionKey;
use crate::persistence;

/// MEM._APPLY key payload [content]
pub fn apply(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 && args.len() != 4 {
        return Err(RedisError::WrongArity);
    }
    let mut op = persistence::decode_op(args[2].as_slice()).map_err(|e| err(format!("ERR {e}")))?;
    if let Some(content) = args.get(3) {
        op = op.with_content(super::args::utf8("content", content)?.to_owned());
    }
    op.validate().map_err(|e| err(format!("ERR invalid op: {e}")))?;
    let mut key = SessionKey::open(ctx, &args[1], true)?;
    match key.session_mut() {
        Some(session) => {
            // apply fails before changing anything.
            session.apply(op).map_err(super::write::session_error)?;
        }
        None => {
            let Some(mut fresh) = op.new_session() else {
                return Err(RedisError::Str("ERR no such key"));
            };
            fresh.apply(op).map_err(super::write::session_error)?;
            key.put(fresh)?;
        }
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}

/// MEM._PUT key payload
pub fn put(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() != 3 {
        return Err(RedisError::WrongArity);
    }
    let session =
        persistence::decode_session(args[2].as_slice()).map_err(|e| err(format!("ERR {e}")))?;
    let mut key = SessionKey::open(ctx, &args[1], true)?;
    key.put(session)?;
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
