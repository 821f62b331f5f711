//! Work off the main thread: counting large contents
//! (`mem.async-threshold-bytes`), building an encoding (encoding_build.rs),
//! re-counting a session for a model switch, walking large JSON, parsing a
//! large import. One sequence for every command that uses it ([`run`]):
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
use std::sync::Mutex;

use redis_module::{
    raw, Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue, ThreadSafeContext,
};

use crate::config::Config;
use crate::session::{Session, Snapshot};
use crate::tokenizer::Counting;

pub mod admission;
pub mod cluster_route;
pub mod encoding_build;
pub mod model_switch;
pub mod pool;

use crate::stats;
use admission::Ticket;

/// How a command that may use a worker is running.
pub enum Pass<T> {
    /// Fresh from the client: it may hand its heavy part to a worker.
    Fresh,
    /// Again on the main thread, after [`run`]: with the worker's output, or
    /// `None` when there is none (the client could not be blocked, or the
    /// work panicked), and then the command does the work inline.
    Resumed(Option<T>),
}

impl<T> Pass<T> {
    pub fn is_resumed(&self) -> bool {
        matches!(self, Pass::Resumed(_))
    }

    /// The worker's output, if any.
    pub fn output(self) -> Option<T> {
        match self {
            Pass::Resumed(output) => output,
            Pass::Fresh => None,
        }
    }
}

/// A command that may run again with a worker's output of type `T`.
pub type Command<T> = fn(&Context, Vec<RedisString>, Pass<T>) -> RedisResult;

/// The resumed command with its output bound, called on the main thread.
type Resume = Box<dyn FnOnce(&Context, Vec<RedisString>) -> RedisResult + Send>;

struct Pending {
    resume: Option<Resume>,
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
    limit: u64,
) -> Result<(), RedisError> {
    // The limit that applied, named as it is: the lesser of
    // mem.async-threshold-bytes and the encoding's own inline cap (a 16 KB
    // text refused "at mem.async-threshold-bytes", 64 KB, sent operators to
    // the wrong setting).
    refuse_large_where_blocking_is_impossible(
        ctx,
        &format!(
            "{what} of {len} bytes ({limit} bytes or more: the lesser of \
             mem.async-threshold-bytes and the encoding's inline cap) is counted"
        ),
    )
}

/// As [`refuse_where_blocking_is_impossible`], `work` saying what is done
/// off the main thread and from what size ("json of N bytes (256 KB or
/// more) is checked").
pub fn refuse_large_where_blocking_is_impossible(
    ctx: &Context,
    work: &str,
) -> Result<(), RedisError> {
    let cannot = ContextFlags::MULTI | ContextFlags::LUA | ContextFlags::DENY_BLOCKING;
    if ctx.get_flags().intersects(cannot) {
        return Err(crate::error::invalid(format!(
            "{work} off the main thread, which MULTI/EXEC and scripts cannot wait for: send \
             it as a command of its own (MEM.APPENDBATCH appends several messages atomically)"
        )));
    }
    Ok(())
}

/// What of a fresh write is heavy: its text of `len` bytes when large for
/// `encoding`, and the session's snapshot to re-count when the write
/// switches its tokenizer and the re-count is large; each refused where
/// the client cannot wait ([`refuse_where_blocking_is_impossible`], `what`
/// naming the text). A resumed pass has nothing left to hand off.
pub fn heavy_parts(
    ctx: &Context,
    session: Option<&Session>,
    what: &str,
    len: usize,
    counting: Counting,
    resumed: bool,
    cfg: &Config,
) -> Result<(bool, Option<Snapshot>), RedisError> {
    let limit = cfg.inline_limit(counting.encoding);
    let large = len as u64 >= limit;
    if resumed {
        return Ok((large, None));
    }
    let snapshot = model_switch::offload(session, counting, cfg);
    if large {
        refuse_where_blocking_is_impossible(ctx, what, len, limit)?;
    }
    if let Some(s) = snapshot.as_ref() {
        refuse_where_blocking_is_impossible(
            ctx,
            "the re-count of a model switch",
            s.bytes(),
            limit,
        )?;
    }
    Ok((large, snapshot))
}

/// The offload sequence: blocks the client and runs `work` on the pool over
/// the bytes of `args[large_at]` (held until the command is done); then
/// `command` (whose key is `args[key_at]`) runs again on the main thread
/// with the output, after the checks a fresh command gets. Where the client
/// cannot be blocked (MULTI, scripts, the replication stream, loading: see
/// [`refuse_where_blocking_is_impossible`] for what a command refuses
/// first), `command` runs at once as resumed with nothing: inline.
pub fn run<T: Send + 'static>(
    ctx: &Context,
    args: Vec<RedisString>,
    key_at: usize,
    large_at: usize,
    command: Command<T>,
    work: impl FnOnce(&[u8]) -> T + Send + 'static,
) -> RedisResult {
    if !can_block(ctx) {
        return command(ctx, args, Pass::Resumed(None));
    }
    match block(ctx, &args[key_at], &args[large_at], command, work) {
        Some(reply) => reply,
        None => command(ctx, args, Pass::Resumed(None)),
    }
}

/// [`run`]'s blocking part; `None` when the client could not be blocked.
fn block<T: Send + 'static>(
    ctx: &Context,
    key: &RedisString,
    large: &RedisString,
    command: Command<T>,
    work: impl FnOnce(&[u8]) -> T + Send + 'static,
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
        let resume: Resume = Box::new(move |ctx, args| command(ctx, args, Pass::Resumed(output)));
        let pending = Box::new(Pending {
            resume: Some(resume),
            ticket,
            held,
        });
        pool::job_done();
        finished(Finished { client, pending });
    };
    if let Err(job) = pool::submit(Box::new(job)) {
        // No worker could be started: work here; the hand-back is the same.
        job();
    }
    Some(Ok(RedisValue::NoReply))
}

/// For a keyless read (MEM.COUNT): blocks the client and runs `work` on the
/// pool, which replies itself; nothing runs again on the main thread.
pub fn reply_from_worker(
    ctx: &Context,
    work: impl FnOnce() -> RedisResult + Send + 'static,
) -> RedisResult {
    let blocked = ctx.block_client();
    let job = move || {
        std::thread::sleep(Config::debug_count_delay());
        // ascii, as commands::run does: the reply is sent from here, not
        // through it, and the crate's error reply truncates each char to a
        // byte (U+0100 becomes a NUL, its CString unwrap a panic).
        let result = crate::guard::or_else(|| Err(crate::error::internal()), work)
            .map_err(crate::error::ascii);
        pool::job_done();
        // Replying needs no lock; dropping the context unblocks the client.
        ThreadSafeContext::with_blocked_client(blocked).reply(result);
    };
    if let Err(job) = pool::submit(Box::new(job)) {
        job();
    }
    Ok(RedisValue::NoReply)
}

/// For a read whose reply is large (MEM.GET of a whole big session): blocks
/// the client and has `write` write the reply on the pool, to a context of
/// the blocked client (replying needs no lock); the main thread only joins
/// the written reply to the client's. Written inline, to `ctx`, when the
/// client cannot be blocked (MULTI, scripts). `write` reads what it owns (a
/// copy of the session sharing its bytes), so later writes by others do
/// not change what this read returns.
pub fn reply_written_by_worker(
    ctx: &Context,
    write: impl FnOnce(&Context) + Send + 'static,
) -> RedisResult {
    let bc = if can_block(ctx) {
        // SAFETY: ctx is the running command's; no callbacks: the reply is
        // written through the thread-safe context below; no timeout.
        unsafe { raw::RedisModule_BlockClient.unwrap()(ctx.ctx, None, None, None, 0) }
    } else {
        std::ptr::null_mut()
    };
    if bc.is_null() {
        write(ctx);
        return Ok(RedisValue::NoReply);
    }
    let client = bc as usize;
    let job = move || {
        std::thread::sleep(Config::debug_count_delay());
        let bc = client as *mut raw::RedisModuleBlockedClient;
        // SAFETY: bc is the client blocked above, unblocked once, below,
        // after its context is freed; the context is used on this thread
        // only, for replies (which take no lock).
        unsafe {
            let reply_ctx = raw::RedisModule_GetThreadSafeContext.unwrap()(bc);
            let context = Context::new(reply_ctx);
            // The writer only walks what it owns; a panic would leave a
            // partial reply, as the same panic inline would.
            crate::guard::or((), || write(&context));
            raw::RedisModule_FreeThreadSafeContext.unwrap()(reply_ctx);
            pool::job_done();
            raw::RedisModule_UnblockClient.unwrap()(bc, std::ptr::null_mut());
        }
    };
    if let Err(job) = pool::submit(Box::new(job)) {
        job();
    }
    Ok(RedisValue::NoReply)
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
        // SAFETY: f.client is a blocked client created in block
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
    let result = crate::guard::or_else(
        || Err(crate::error::internal()),
        || {
            // SAFETY: in a blocked client's reply callback, the private data is
            // the Pending passed to UnblockClient; it stays alive until
            // free_pending.
            let pending = unsafe {
                raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx)
                    .cast::<Pending>()
                    .as_mut()
            };
            let Some(pending) = pending else {
                return Err(crate::error::invalid("lost the token count"));
            };
            let args = redis_module::decode_args(ctx, argv, argc);
            let Some(resume) = pending.resume.take() else {
                return Err(crate::error::invalid("lost the token count"));
            };
            let ticket = pending.ticket;
            if let Err(e) = admission::admit(&context, &args, ticket) {
                stats::add(&stats::RESUMED_REFUSED, 1);
                return Err(e);
            }
            resume(&context, args)
        },
    )
    .map_err(crate::error::ascii);
    pool::free_dropped();
    context.reply(result) as c_int
}

extern "C" fn free_pending(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    if !privdata.is_null() {
        // SAFETY: privdata is the Box<Pending> handed to UnblockClient, and
        // `held` the string retained in block, released once here.
        // Guarded: dropping a worker's output runs its destructors.
        let pending = unsafe { Box::from_raw(privdata.cast::<Pending>()) };
        let held = pending.held;
        crate::guard::or((), move || drop(pending));
        // SAFETY: as above; `held` is freed once, here.
        unsafe { raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), held as *mut _) };
    }
}
