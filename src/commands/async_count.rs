//! Counting large contents off the main thread (`mem.async-threshold-bytes`).
//!
//! The client is blocked (its later commands wait, so its own order holds),
//! a worker thread counts, and the command then runs again on the main thread
//! with the count in hand: the write itself, its replication and its reply
//! happen exactly as for a small message. Where a client cannot block (MULTI,
//! Lua, replication stream, AOF loading) the caller counts inline instead.

use std::os::raw::{c_int, c_void};

use redis_module::{raw, Context, ContextFlags, RedisResult, RedisString, RedisValue};

use crate::stats;
use crate::tokenizer::Encoding;

/// What a worker thread made of the content, for the command being resumed.
#[derive(Debug)]
pub struct Counted {
    pub encoding: Encoding,
    /// The content, checked as UTF-8 and copied on the worker (so the main
    /// thread neither scans nor copies it), with its message's tokens. None:
    /// not counted (not UTF-8, or no worker); the command checks and counts
    /// inline.
    pub content: Option<(String, u64)>,
}

/// A command that can be resumed with a count.
pub type Resume = fn(&Context, Vec<RedisString>, Option<Counted>) -> RedisResult;

struct Pending {
    counted: Option<Counted>,
    resume: Resume,
    /// The content string, held so its bytes outlive a client that
    /// disconnects while the worker reads them; released in `free_pending`.
    held: usize,
}

/// Whether this call may block its client.
pub fn can_block(ctx: &Context) -> bool {
    let no = ContextFlags::MULTI
        | ContextFlags::LUA
        | ContextFlags::REPLICATED
        | ContextFlags::LOADING
        | ContextFlags::DENY_BLOCKING;
    !ctx.get_flags().intersects(no)
}

/// Blocks the client and counts `role` + `content` on a worker thread; the
/// command is then resumed with the count (or without one when the content
/// is not UTF-8: the resumed command reports that). Returns `None` when the
/// client could not be blocked (the caller counts inline).
pub fn count_off_thread(
    ctx: &Context,
    encoding: Encoding,
    role: String,
    content: &RedisString,
    resume: Resume,
) -> Option<RedisResult> {
    // SAFETY: ctx is the context of the running command; the callbacks match
    // the signatures Redis expects; no timeout (0).
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(ctx.ctx, Some(on_counted), None, Some(free_pending), 0)
    };
    if bc.is_null() {
        return None;
    }
    // SAFETY: retaining only bumps the string's refcount (no ctx: manual
    // memory); the matching free is in free_pending, on the main thread.
    unsafe { raw::RedisModule_RetainString.unwrap()(std::ptr::null_mut(), content.inner) };
    let held = content.inner as usize;
    let bytes = content.as_slice();
    let (bytes_addr, len) = (bytes.as_ptr() as usize, bytes.len());
    let bc_addr = bc as usize;
    let spawned = std::thread::Builder::new()
        .name("mem-count".into())
        .spawn(move || {
            lower_priority();
            std::thread::sleep(crate::config::Config::debug_count_delay());
            // SAFETY: the held string keeps these bytes alive and unchanged
            // (Redis never mutates a shared argv string) until free_pending,
            // which runs only after the unblock below.
            let bytes = unsafe { std::slice::from_raw_parts(bytes_addr as *const u8, len) };
            let content = crate::guard::or(None, || {
                let content = std::str::from_utf8(bytes).ok()?.to_owned();
                let tokens = stats::count_message(encoding, &role, &content);
                Some((content, tokens))
            });
            unblock(bc_addr, Counted { encoding, content }, resume, held);
        });
    if spawned.is_err() {
        // No thread: resume at once; the command counts inline.
        unblock(bc_addr, Counted { encoding, content: None }, resume, held);
    }
    Some(Ok(RedisValue::NoReply))
}

/// Counting is background work: the worker yields the CPU to Redis's main
/// thread (nice +10), so other clients' latency holds on a busy machine.
fn lower_priority() {
    // SAFETY: gettid has no preconditions; setpriority only changes the
    // scheduling priority of this thread (a failure is harmless: ignored).
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

fn unblock(bc_addr: usize, counted: Counted, resume: Resume, held: usize) {
    let pending = Pending { counted: Some(counted), resume, held };
    let pending = Box::into_raw(Box::new(pending)).cast::<c_void>();
    // SAFETY: bc_addr is the blocked client created above, unblocked exactly
    // once; RedisModule_UnblockClient may be called from any thread, and
    // ownership of `pending` passes to Redis (freed by free_pending).
    unsafe {
        raw::RedisModule_UnblockClient.unwrap()(bc_addr as *mut raw::RedisModuleBlockedClient, pending);
    }
}

/// Runs on the main thread once the count is done.
extern "C" fn on_counted(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    // SAFETY: in a blocked client's reply callback, the private data is the
    // Pending passed to UnblockClient; it stays alive until free_pending.
    let pending = unsafe {
        raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx)
            .cast::<Pending>()
            .as_mut()
    };
    let Some(pending) = pending else {
        return context.reply(Err(redis_module::RedisError::Str("ERR lost the token count"))) as c_int;
    };
    let args = redis_module::decode_args(ctx, argv, argc);
    let (counted, resume) = (pending.counted.take(), pending.resume);
    let counted = counted.unwrap_or(Counted { encoding: Encoding::O200kBase, content: None });
    let result = crate::guard::or(
        Err(redis_module::RedisError::Str("ERR redis-mem internal error (see the server log)")),
        || resume(&context, args, Some(counted)),
    )
    .map_err(super::ascii_error);
    context.reply(result) as c_int
}

extern "C" fn free_pending(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    if !privdata.is_null() {
        // SAFETY: privdata is the Box<Pending> handed to UnblockClient, and
        // `held` the string retained in count_off_thread, released once here.
        unsafe {
            let pending = Box::from_raw(privdata.cast::<Pending>());
            raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), pending.held as *mut _);
        }
    }
}
