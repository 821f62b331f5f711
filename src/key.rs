//! A key opened for one command: type check, the session in it, its expiry.
//!
//! A thin wrapper over the raw key API, because the crate's `RedisKeyWritable`
//! hides the key pointer that expiry reads and in-place value replacement need
//! (replacing a value with `set_value` would delete the key and drop its TTL).

use std::os::raw::c_void;
use std::ptr::NonNull;

use redis_module::{raw, Context, RedisError, RedisString};

use crate::data_type::SESSION_TYPE;
use crate::session::Session;

pub struct SessionKey {
    /// None: a missing key opened read-only (Redis gives no handle then).
    inner: Option<NonNull<raw::RedisModuleKey>>,
}

impl SessionKey {
    /// Opens `name` for reading (`write == false`) or for writing.
    /// Fails with WRONGTYPE when the key holds something else.
    pub fn open(ctx: &Context, name: &RedisString, write: bool) -> Result<SessionKey, RedisError> {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        // SAFETY: ctx and name are valid for the duration of the command; the
        // returned key is closed in Drop.
        let ptr = unsafe {
            raw::RedisModule_OpenKey.unwrap()(ctx.ctx, name.inner, mode as i32)
                .cast::<raw::RedisModuleKey>()
        };
        let key = SessionKey {
            inner: NonNull::new(ptr),
        };
        if !key.is_empty() && !key.holds_session() {
            return Err(crate::error::Error::WrongType.into());
        }
        Ok(key)
    }

    /// Whether `name` holds a value of any type.
    pub fn exists(ctx: &Context, name: &RedisString) -> bool {
        // SAFETY: as in open(); the key is closed before returning.
        let ptr = unsafe {
            raw::RedisModule_OpenKey.unwrap()(ctx.ctx, name.inner, raw::REDISMODULE_READ as i32)
                .cast::<raw::RedisModuleKey>()
        };
        let key = SessionKey {
            inner: NonNull::new(ptr),
        };
        !key.is_empty()
    }

    fn raw(&self) -> Option<*mut raw::RedisModuleKey> {
        self.inner.map(NonNull::as_ptr)
    }

    pub fn is_empty(&self) -> bool {
        let Some(k) = self.raw() else { return true };
        // SAFETY: k is an open key.
        let t = unsafe { raw::RedisModule_KeyType.unwrap()(k) };
        t == raw::REDISMODULE_KEYTYPE_EMPTY as i32
    }

    fn holds_session(&self) -> bool {
        let Some(k) = self.raw() else { return false };
        // SAFETY: k is an open key.
        let t = unsafe { raw::RedisModule_ModuleTypeGetType.unwrap()(k) };
        t == *SESSION_TYPE.raw_type.borrow()
    }

    fn value(&self) -> Option<*mut Session> {
        if self.is_empty() {
            return None;
        }
        let k = self.raw()?;
        // SAFETY: the key holds our type (checked in open), whose values are
        // always `Box<Session>` pointers, valid while the key is open.
        let v = unsafe { raw::RedisModule_ModuleTypeGetValue.unwrap()(k) };
        (!v.is_null()).then_some(v.cast::<Session>())
    }

    /// The session in the key, if any.
    pub fn session(&self) -> Option<&Session> {
        // SAFETY: see value(); the shared borrow of the key keeps it open and
        // excludes session_mut.
        self.value().map(|v| unsafe { &*v })
    }

    /// The session in the key, to change in place.
    pub fn session_mut(&mut self) -> Option<&mut Session> {
        // SAFETY: see value(); the exclusive borrow of the key makes this the
        // only reference to the session.
        self.value().map(|v| unsafe { &mut *v })
    }

    /// The session in the key, stored first from `fresh` when the key is
    /// empty (`fresh` gives None: the command needs an existing session).
    pub fn session_or_create(
        &mut self,
        fresh: impl FnOnce() -> Option<Session>,
    ) -> Result<&mut Session, RedisError> {
        if self.is_empty() {
            self.put(fresh().ok_or_else(crate::error::no_such_key)?)?;
        }
        self.session_mut()
            .ok_or_else(|| crate::error::invalid("cannot create the session"))
    }

    /// Stores `session` in an empty key, or replaces the session in place
    /// (keeping the key's TTL).
    pub fn put(&mut self, session: Session) -> Result<(), RedisError> {
        let Some(k) = self.raw() else {
            return Err(crate::error::invalid("key not opened for writing"));
        };
        let value = crate::data_type::into_raw(session);
        let raw_type = *SESSION_TYPE.raw_type.borrow();
        // SAFETY: the key is open for writing; ownership of `value` passes to
        // Redis, which frees it through the type's free callback.
        let status = unsafe {
            if self.is_empty() {
                raw::RedisModule_ModuleTypeSetValue.unwrap()(k, raw_type, value)
            } else {
                let mut old: *mut c_void = std::ptr::null_mut();
                let status =
                    raw::RedisModule_ModuleTypeReplaceValue.unwrap()(k, raw_type, value, &mut old);
                if status == raw::REDISMODULE_OK as i32 && !old.is_null() {
                    // A large session replaced (IMPORT REPLACE) is freed on
                    // a worker.
                    crate::data_type::free_session_later(old);
                }
                status
            }
        };
        if status == raw::REDISMODULE_OK as i32 {
            Ok(())
        } else {
            // SAFETY: Redis did not take the value, so it is still ours.
            unsafe { crate::data_type::free_session(value) };
            Err(crate::error::invalid("could not store the session"))
        }
    }

    /// Sets the key's expiry to the absolute time `at_ms` (None: none), as
    /// PEXPIREAT does: an op replayed from the AOF later keeps the expiry the
    /// master gave, not one counted from the replay.
    pub fn set_abs_expiry(&self, at_ms: Option<i64>) {
        let Some(k) = self.raw() else { return };
        // SAFETY: the key is open for writing and holds a value; both calls
        // are Redis's (SetAbsExpire since 6.2.2: every supported server).
        unsafe {
            match (at_ms, raw::RedisModule_SetAbsExpire) {
                (Some(at), Some(set_abs)) => {
                    set_abs(k, at.max(1));
                }
                (Some(at), None) => {
                    raw::RedisModule_SetExpire.unwrap()(
                        k,
                        at.saturating_sub(crate::commands::now_ms()).max(1),
                    );
                }
                (None, _) => {
                    raw::RedisModule_SetExpire.unwrap()(k, raw::REDISMODULE_NO_EXPIRE as i64);
                }
            }
        }
    }

    /// The key's remaining time to live in ms, None when it has no expiry.
    pub fn ttl_ms(&self) -> Option<i64> {
        if self.is_empty() {
            return None;
        }
        let k = self.raw()?;
        // SAFETY: k is an open key.
        let t = unsafe { raw::RedisModule_GetExpire.unwrap()(k) };
        (t != raw::REDISMODULE_NO_EXPIRE as i64).then_some(t)
    }
}

impl Drop for SessionKey {
    fn drop(&mut self) {
        if let Some(k) = self.raw() {
            // SAFETY: k was opened by RedisModule_OpenKey and not closed yet.
            unsafe { raw::RedisModule_CloseKey.unwrap()(k) };
        }
    }
}
