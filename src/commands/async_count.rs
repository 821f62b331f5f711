//! Counting large contents off the main thread (`mem.async-threshold-bytes`).
//!
//! The client is blocked (its later commands wait, so its own order holds)
//! and a job goes to the worker pool. A finished count is handed back to
//! the main thread only while writes are not paused: the hand-back happens
//! in the event loop's before-sleep hook, and during a pause (CLIENT PAUSE,
//! FAILOVER, a SHUTDOWN waiting for replicas) it waits there, the client
//! still blocked. The command then runs again on the main thread with the
//! count in hand, after the checks a fresh command gets (admission.rs), and
//! writes, replicates and replies exactly as for a small message. Where a
//! client cannot block (MULTI, Lua, replication stream, AOF loading) the
//! caller counts inline instead.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use redis_module::{raw, Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use super::admission::{self, Ticket};
use crate::config::Config;
use crate::session::Recounted;
use crate::stats;
use crate::tokenizer::Encoding;

/// What a worker made of a message's content, for MEM.APPEND resumed.
#[derive(Debug)]
pub struct Counted {
    pub encoding: Encoding,
    /// The content, checked as UTF-8 and copied on the worker (so the main
    /// thread neither scans nor copies it), with its message's tokens. None:
    /// not counted (not UTF-8); the command checks and counts inline.
    pub content: Option<(Arc<str>, u64)>,
    /// The session's counts under `encoding`, when the write switches the
    /// session's tokenizer and the re-count was large enough for a worker.
    pub recounted: Option<Recounted>,
    /// A large META's check, made by the worker (None: checked inline).
    pub meta_checked: Option<Result<(), String>>,
}

/// What a worker produced; the resumed command downcasts it to its own type.
pub type Output = Box<dyn std::any::Any + Send>;

/// A command that can be resumed with a worker's output.
pub type Resume = fn(&Context, Vec<RedisString>, Option<Output>) -> RedisResult;

struct Pending {
    output: Option<Output>,
    resume: Resume,
    ticket: Ticket,
    /// The content string, held so its bytes outlive a client that
    /// disconnects while the worker reads them; released in `free_pending`.
    held: usize,
}

/// A finished count waiting to be handed back: the blocked client (as an
/// address: raw pointers are not `Send`) and its Pending.
struct Finished {
    client: usize,
    pending: Box<Pending>,
}

static FINISHED: Mutex<Vec<Finished>> = Mutex::new(Vec::new());
/// FINISHED's length, read without the lock on every event-loop iteration.
static FINISHED_LEN: AtomicUsize = AtomicUsize::new(0);
/// Appends blocked now (counting, queued, or held back by a pause).
pub static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Whether this call may block its client.
pub fn can_block(ctx: &Context) -> bool {
    let no = ContextFlags::MULTI
        | ContextFlags::LUA
        | ContextFlags::REPLICATED
        | ContextFlags::LOADING
        | ContextFlags::DENY_BLOCKING;
    !ctx.get_flags().intersects(no)
}

/// Large texts are counted off the main thread; MULTI/EXEC, scripts and
/// other callers that cannot block cannot wait for that, and counting inline
/// would hold every other client: they are refused, naming the way out.
pub fn refuse_where_blocking_is_impossible(
    ctx: &Context,
    what: &str,
    len: usize,
) -> Result<(), RedisError> {
    let cannot = ContextFlags::MULTI | ContextFlags::LUA | ContextFlags::DENY_BLOCKING;
    if ctx.get_flags().intersects(cannot) {
        return Err(RedisError::String(format!(
            "ERR {what} of {len} bytes (mem.async-threshold-bytes or more) is counted off the main thread, \
             which MULTI/EXEC and scripts cannot wait for: send it as a command of its own \
             (MEM.APPENDBATCH appends several messages atomically)"
        )));
    }
    Ok(())
}

/// Blocks the client and runs `work` on the pool over the bytes of `large`
/// (a command argument, held until the command is done); the command (whose
/// key is `key`) is then resumed with the output. Returns `None` when the
/// client could not be blocked (the caller does the work inline).
pub fn off_thread(
    ctx: &Context,
    key: &RedisString,
    large: &RedisString,
    resume: Resume,
    work: impl FnOnce(&[u8]) -> Output + Send + 'static,
) -> Option<RedisResult> {
    let ticket = admission::ticket(ctx, key);
    // SAFETY: ctx is the context of the running command; the callbacks match
    // the signatures Redis expects; no timeout (0).
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.ctx,
            Some(on_counted),
            None,
            Some(free_pending),
            0,
        )
    };
    if bc.is_null() {
        return None;
    }
    // SAFETY: retaining only bumps the string's refcount (no ctx: manual
    // memory); the matching free is in free_pending, on the main thread.
    unsafe { raw::RedisModule_RetainString.unwrap()(std::ptr::null_mut(), large.inner) };
    let held = large.inner as usize;
    let bytes = large.as_slice();
    let (bytes_addr, len) = (bytes.as_ptr() as usize, bytes.len());
    let client = bc as usize;
    IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
    let job = move || {
        std::thread::sleep(Config::debug_count_delay());
        // SAFETY: the held string keeps these bytes alive and unchanged
        // (Redis never mutates a shared argv string) until free_pending,
        // which runs only after the hand-back below.
        let bytes = unsafe { std::slice::from_raw_parts(bytes_addr as *const u8, len) };
        // A panic leaves no output: the resumed command then works inline.
        let output = crate::guard::or(None, || Some(work(bytes)));
        let pending = Box::new(Pending {
            output,
            resume,
            ticket,
            held,
        });
        crate::pool::job_done();
        finished(Finished { client, pending });
    };
    if let Err(job) = crate::pool::submit(Box::new(job)) {
        // No worker could be started: work here; the hand-back is the same.
        job();
    }
    Some(Ok(RedisValue::NoReply))
}

/// Queues a finished count and wakes the event loop to hand it back.
fn finished(f: Finished) {
    let mut queue = FINISHED.lock().unwrap_or_else(|e| e.into_inner());
    queue.push(f);
    FINISHED_LEN.store(queue.len(), Ordering::Release);
    drop(queue);
    // SAFETY: thread-safe by the API's contract; the callback takes no data.
    // If it fails, the next serverCron tick wakes the loop instead.
    unsafe {
        if let Some(add) = raw::RedisModule_EventLoopAddOneShot {
            add(Some(wake), std::ptr::null_mut());
        }
    }
}

/// Only there to wake the event loop; the work is in [`hand_back`].
extern "C" fn wake(_: *mut c_void) {}

/// Subscribes [`hand_back`] to the event loop's before-sleep event.
pub fn register(ctx: &Context) -> bool {
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_EVENTLOOP,
        dataver: 1,
    };
    // SAFETY: called once from OnLoad with the module's context; the
    // callback has the signature Redis expects.
    let status = unsafe {
        raw::RedisModule_SubscribeToServerEvent.unwrap()(ctx.ctx, event, Some(on_event_loop))
    };
    status == raw::REDISMODULE_OK as c_int
}

extern "C" fn on_event_loop(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent == raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP
        && FINISHED_LEN.load(Ordering::Acquire) > 0
    {
        crate::guard::or((), hand_back);
    }
}

/// Unblocks the clients whose count finished, unless writes are paused (then
/// they stay blocked until a later iteration finds writes allowed again; the
/// event loop runs at least every serverCron tick). On Redis 7.0 the
/// unblocked clients are served right after this hook, in the same
/// before-sleep; on later servers one event-loop iteration later, which is
/// why the resumed command checks for a pause again.
fn hand_back() {
    // SAFETY: main thread (event-loop hook); the call only reads pause state.
    let paused = unsafe { raw::RedisModule_AvoidReplicaTraffic.unwrap()() } != 0;
    if paused {
        return;
    }
    let ready = {
        let mut queue = FINISHED.lock().unwrap_or_else(|e| e.into_inner());
        FINISHED_LEN.store(0, Ordering::Release);
        std::mem::take(&mut *queue)
    };
    for f in ready {
        let pending = Box::into_raw(f.pending).cast::<c_void>();
        // SAFETY: f.client is a blocked client created in off_thread
        // and unblocked exactly once, here; ownership of `pending` passes to
        // Redis, which hands it to on_counted and then free_pending.
        unsafe {
            raw::RedisModule_UnblockClient.unwrap()(
                f.client as *mut raw::RedisModuleBlockedClient,
                pending,
            );
        }
    }
}

/// Runs on the main thread once the count is handed back (not called when
/// the client left or was unblocked by the server meanwhile: then nothing is
/// written).
extern "C" fn on_counted(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    // All of it guarded: Redis calls this directly (no crate shim), and a
    // panic here, before or after the resumed command, would abort.
    let result = crate::guard::or(Err(super::error::internal()), || {
        // SAFETY: in a blocked client's reply callback, the private data is
        // the Pending passed to UnblockClient; it stays alive until
        // free_pending.
        let pending = unsafe {
            raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx)
                .cast::<Pending>()
                .as_mut()
        };
        let Some(pending) = pending else {
            return Err(RedisError::Str("ERR lost the token count"));
        };
        let args = redis_module::decode_args(ctx, argv, argc);
        let output = pending.output.take();
        let (resume, ticket) = (pending.resume, pending.ticket);
        if let Err(e) = admission::admit(&context, &args, ticket) {
            stats::add(&stats::RESUMED_REFUSED, 1);
            return Err(e);
        }
        resume(&context, args, Some(output.unwrap_or_else(|| Box::new(()))))
    })
    .map_err(super::error::ascii);
    context.reply(result) as c_int
}

extern "C" fn free_pending(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    if !privdata.is_null() {
        // SAFETY: privdata is the Box<Pending> handed to UnblockClient, and
        // `held` the string retained in off_thread, released once here.
        // Guarded: dropping a worker's output runs its destructors.
        let pending = unsafe { Box::from_raw(privdata.cast::<Pending>()) };
        let held = pending.held;
        crate::guard::or((), move || drop(pending));
        // SAFETY: as above; `held` is freed once, here.
        unsafe { raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), held as *mut _) };
    }
}
