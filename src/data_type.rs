//! The `redis-mem` native data type: its Redis callbacks (RDB, AOF rewrite,
//! memory usage, copy, digest, free). Each one is a thin shell over
//! `persistence` and `session`, guarded so that no panic reaches Redis.

use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI64, Ordering};

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::persistence::{self, RDB_ENCODING_VERSION};
use crate::session::Session;

/// Sessions alive in memory (for `INFO mem`).
pub static LIVE_SESSIONS: AtomicI64 = AtomicI64::new(0);

pub static SESSION_TYPE: RedisType = RedisType::new(
    "redis-mem",
    RDB_ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free_session),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: Some(free_effort),
        unlink: None,
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// Boxes a session for Redis to own, counting it as alive.
pub fn into_raw(session: Session) -> *mut c_void {
    LIVE_SESSIONS.fetch_add(1, Ordering::Relaxed);
    Box::into_raw(Box::new(session)).cast()
}

/// # Safety
/// `value` must come from [`into_raw`] and not have been freed.
unsafe fn session_ref<'a>(value: *const c_void) -> Option<&'a Session> {
    // SAFETY: per the contract, value is null or a live Box<Session>.
    unsafe { value.cast::<Session>().as_ref() }
}

/// # Safety
/// `value` must come from [`into_raw`]; it is freed here.
pub unsafe extern "C" fn free_session(value: *mut c_void) {
    // SAFETY: as this function's contract.
    if let Some(session) = unsafe { take_session(value) } {
        // Redis calls this directly (also on a lazyfree thread): guarded as
        // every other callback, though dropping owned memory cannot panic.
        crate::guard::or((), move || drop(session));
    }
}

/// The session behind a value handed back to us, no longer counted live.
///
/// # Safety
/// `value` is null or comes from [`into_raw`], handed back exactly once.
unsafe fn take_session(value: *mut c_void) -> Option<Box<Session>> {
    if value.is_null() {
        return None;
    }
    LIVE_SESSIONS.fetch_sub(1, Ordering::Relaxed);
    // SAFETY: value is a Box<Session> whose ownership Redis handed back.
    Some(unsafe { Box::from_raw(value.cast::<Session>()) })
}

/// As [`free_session`], on a worker when the session holds 1 MB or more
/// of messages and attribute values (a replaced 1 GB session held the main
/// thread 88 ms; 60 attributes of 4 MB, DEL or UNLINK, 15-19 ms).
///
/// # Safety
/// As [`free_session`].
pub unsafe fn free_session_later(value: *mut c_void) {
    // SAFETY: as this function's contract.
    let Some(session) = (unsafe { take_session(value) }) else {
        return;
    };
    if bytes_held(&session) >= 1 << 20 {
        crate::offload::pool::free_later(session);
    }
}

/// The bytes of a session's messages and attribute values: what makes it
/// slow to free.
fn bytes_held(s: &Session) -> usize {
    s.messages.stored_len() + s.extra.value_bytes()
}

/// The work of freeing a session: one for each message and attribute, and
/// one for each 64 KiB they hold (a few large ones are slow to free too: 60
/// attribute values of 4 MB took UNLINK 7-18 ms inline). Above Redis's
/// lazyfree threshold (64), UNLINK, FLUSHALL ASYNC and (with
/// `lazyfree-lazy-expire yes`) expiry free it on a background thread, not
/// the main one. `free_session` is safe there: it only drops owned memory.
unsafe extern "C" fn free_effort(_key: *mut raw::RedisModuleString, value: *const c_void) -> usize {
    // SAFETY: Redis passes a value of our type.
    crate::guard::or(1, || {
        unsafe { session_ref(value) }.map_or(1, |s| {
            1 + s.messages.len() + s.attr_count() + (bytes_held(s) >> 16)
        })
    })
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    crate::guard::or(std::ptr::null_mut(), || {
        // Every encoding version so far stores one string buffer; its
        // payload's format must match the version (persistence).
        let result = match encver {
            1..=RDB_ENCODING_VERSION => {
                load_payload(rdb).and_then(|b| persistence::decode_rdb_session(encver, b.bytes()))
            }
            v => Err(format!("unknown redis-mem encoding version {v}")),
        };
        match result {
            Ok(session) => {
                // A token the payload carries (RESTORE from a node whose
                // clock ran ahead) is never granted again for the key name,
                // whatever happens to the key next.
                crate::session::note_issued(session.leases.last_token);
                into_raw(session)
            }
            Err(e) => {
                crate::guard::log_warning(&format!("redis-mem: refusing to load a session: {e}"));
                std::ptr::null_mut()
            }
        }
    })
}

/// The payload Redis read for us, decoded in place (a copy of a 53 MB
/// session's payload was 16% of its RESTORE) and freed when dropped.
struct LoadedBuffer {
    ptr: *mut std::os::raw::c_char,
    len: usize,
}

impl LoadedBuffer {
    fn bytes(&self) -> &[u8] {
        // SAFETY: ptr points to len bytes owned by us until dropped.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for LoadedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by Redis for us, freed once, here.
        unsafe { raw::RedisModule_Free.unwrap()(self.ptr.cast()) };
    }
}

fn load_payload(rdb: *mut raw::RedisModuleIO) -> Result<LoadedBuffer, String> {
    let mut len = 0usize;
    // SAFETY: rdb is the IO handle Redis passed to rdb_load; with
    // HANDLE_IO_ERRORS a failed read returns NULL/garbage and sets the error
    // flag, which is checked before the buffer is used.
    let ptr = unsafe { raw::RedisModule_LoadStringBuffer.unwrap()(rdb, &mut len) };
    if ptr.is_null() {
        return Err("short read".to_owned());
    }
    let buffer = LoadedBuffer { ptr, len };
    if raw::is_io_error(rdb) {
        return Err("short read".to_owned());
    }
    Ok(buffer)
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    crate::guard::or((), || {
        // SAFETY: Redis passes a value of our type.
        if let Some(session) = unsafe { session_ref(value) } {
            persistence::with_encoded(session, |payload| raw::save_slice(rdb, payload));
        }
    })
}

unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    crate::guard::or((), || {
        // SAFETY: Redis passes a value of our type.
        let Some(session) = (unsafe { session_ref(value) }) else {
            return;
        };
        persistence::with_encoded(session, |payload| {
            // SAFETY: "sb" = a RedisModuleString then a buffer with its
            // length; both outlive the call. The key's TTL is emitted by
            // Redis itself.
            unsafe {
                raw::RedisModule_EmitAOF.unwrap()(
                    aof,
                    c"MEM._PUT".as_ptr(),
                    c"sb".as_ptr(),
                    key,
                    payload.as_ptr().cast::<c_char>(),
                    payload.len(),
                );
            }
        });
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a value of our type.
    crate::guard::or(0, || {
        unsafe { session_ref(value) }.map_or(0, Session::mem_usage)
    })
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    crate::guard::or((), || {
        // SAFETY: Redis passes a value of our type.
        let Some(session) = (unsafe { session_ref(value) }) else {
            return;
        };
        persistence::with_encoded(session, |payload| {
            // SAFETY: md is the digest handle of this call; the buffer
            // outlives it.
            unsafe {
                raw::RedisModule_DigestAddStringBuffer.unwrap()(
                    md,
                    payload.as_ptr().cast::<c_char>(),
                    payload.len(),
                );
                raw::RedisModule_DigestEndSequence.unwrap()(md);
            }
        });
    })
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    crate::guard::or(std::ptr::null_mut(), || {
        // SAFETY: Redis passes a value of our type.
        match unsafe { session_ref(value) } {
            Some(session) => into_raw(session.copy_for_key()),
            None => std::ptr::null_mut(),
        }
    })
}
