//! The checks Redis makes before running a fresh write, made again for a
//! write resumed after a worker: while the client waited, writes may have
//! been paused, the node may have become a replica, the key's slot may have
//! moved, memory may have run out. Without them a resumed write would
//! propagate during a pause (an assertion kills the server) or land on a node
//! that no longer serves the key (the write is lost).

use redis_module::{raw, Context, ContextFlags, RedisError, RedisString, RedisValue};

use super::cluster_route::{route, Route};
use crate::error::Error;
use crate::key::SessionKey;

/// What the fresh command saw, so the resumed one is judged the same way.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ticket {
    /// The slot was another node's when the command arrived: Redis admitted
    /// it through ASKING (the slot is being imported here).
    asking: bool,
}

/// Records what the fresh command needs remembered (cluster mode only).
pub fn ticket(ctx: &Context, key: &RedisString) -> Ticket {
    if !ctx.get_flags().contains(ContextFlags::CLUSTER) {
        return Ticket::default();
    }
    Ticket {
        asking: matches!(cluster_route(ctx, key, false), Ok(Route::Moved(_))),
    }
}

/// Admits a resumed write (`args`, its key at 1) as Redis would admit it
/// fresh, or gives the error (a redirect, TRYAGAIN, NOPERM, READONLY, OOM) a
/// fresh command would get.
pub fn admit(ctx: &Context, args: &[RedisString], ticket: Ticket) -> Result<(), RedisError> {
    let key = args.get(1).ok_or(RedisError::WrongArity)?;
    // Writes are handed back only while not paused (see async_count); this
    // catches a pause that began in between. Replicating now would abort.
    if ctx.avoid_replication_traffic() {
        return Err(crate::error::try_again(
            "writes are paused (CLIENT PAUSE, FAILOVER or SHUTDOWN); the append was not applied",
        ));
    }
    let flags = ctx.get_flags();
    if flags.contains(ContextFlags::CLUSTER) {
        let slot = keyslot(ctx, key)?;
        match cluster_route(ctx, key, ticket.asking)? {
            Route::Local => {}
            Route::Moved(addr) => return Err(Error::Moved { slot, addr }.into()),
            Route::Ask(addr) => return Err(Error::Ask { slot, addr }.into()),
            Route::Down => return Err(Error::ClusterDown.into()),
        }
    }
    acl_check(ctx, args, key)?;
    if flags.contains(ContextFlags::READONLY) {
        return Err(Error::ReadOnly.into());
    }
    if flags.contains(ContextFlags::OOM) {
        return Err(Error::OutOfMemory.into());
    }
    Ok(())
}

/// The client's user may have lost the command or the key (ACL SETUSER)
/// while it waited: checked again, as for a fresh command.
fn acl_check(ctx: &Context, args: &[RedisString], key: &RedisString) -> Result<(), RedisError> {
    let name = ctx.get_current_user();
    // SAFETY: name is a valid string; the user returned (or NULL when the
    // user is gone) is freed below.
    let user = unsafe { raw::RedisModule_GetModuleUserFromUserName.unwrap()(name.inner) };
    if user.is_null() {
        return Err(Error::NoPerm("the user of this connection no longer exists").into());
    }
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    // Only the logical flags (ACCESS, INSERT, DELETE, UPDATE) are accepted here.
    let flags = raw::REDISMODULE_CMD_KEY_UPDATE as i32;
    // SAFETY: user is a live module user; argv holds the command's own
    // strings, valid for this call; the user is freed exactly once.
    let (command_ok, key_ok) = unsafe {
        let command_ok = raw::RedisModule_ACLCheckCommandPermissions.unwrap()(
            user,
            argv.as_mut_ptr(),
            argv.len() as i32,
        ) == raw::REDISMODULE_OK as i32;
        let key_ok = raw::RedisModule_ACLCheckKeyPermissions.unwrap()(user, key.inner, flags)
            == raw::REDISMODULE_OK as i32;
        raw::RedisModule_FreeModuleUser.unwrap()(user);
        (command_ok, key_ok)
    };
    if !command_ok {
        return Err(Error::NoPerm("this user has no permissions to run this command").into());
    }
    if !key_ok {
        return Err(Error::NoPerm(
            "this user has no permissions to access one of the keys used as arguments",
        )
        .into());
    }
    Ok(())
}

fn keyslot(ctx: &Context, key: &RedisString) -> Result<u16, RedisError> {
    match ctx.call("CLUSTER", &[b"KEYSLOT".as_slice(), key.as_slice()])? {
        RedisValue::Integer(n) => {
            u16::try_from(n).map_err(|_| crate::error::invalid("bad key slot"))
        }
        _ => Err(crate::error::invalid("bad key slot")),
    }
}

fn cluster_route(ctx: &Context, key: &RedisString, asking: bool) -> Result<Route, RedisError> {
    let slot = keyslot(ctx, key)?;
    let nodes = match ctx.call("CLUSTER", &["NODES"])? {
        RedisValue::BulkString(s) | RedisValue::SimpleString(s) => s,
        RedisValue::BulkRedisString(s) => s.to_string_lossy(),
        RedisValue::StringBuffer(b) => String::from_utf8_lossy(&b).into_owned(),
        _ => return Err(crate::error::invalid("cannot read CLUSTER NODES")),
    };
    Ok(route(&nodes, slot, SessionKey::exists(ctx, key), asking))
}
