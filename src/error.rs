//! Every error reply of the module is made here: Redis style (`CODE
//! message`), one printable ASCII line. The code is the variant of
//! [`Error`]; no other file writes one.

use std::borrow::Cow;

use redis_module::RedisError;

use crate::session::SessionError;

/// An error reply: its Redis error code (the variant) and its message.
#[derive(Debug)]
pub enum Error {
    /// `ERR`: the request is malformed, or a rule refuses it.
    Invalid(Cow<'static, str>),
    /// `LEASED`: another summarizer's lease is live, or the summary's lease
    /// is not the session's (a code of its own, as BUSYKEY or NOSCRIPT, so a
    /// summarizer need not parse text).
    Leased(String),
    /// `TRYAGAIN`: not now (writes paused, an encoding being built, the
    /// model changed while the worker counted); the same command may succeed.
    TryAgain(Cow<'static, str>),
    /// `NOPERM`: the ACL refuses a command resumed after a worker.
    NoPerm(&'static str),
    /// `MOVED` / `ASK`: the key's slot is served elsewhere now.
    Moved {
        slot: u16,
        addr: String,
    },
    Ask {
        slot: u16,
        addr: String,
    },
    /// Redis's own refusals, in Redis's own words.
    ClusterDown,
    ReadOnly,
    OutOfMemory,
    BusyKey,
    WrongType,
}

impl Error {
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "ERR",
            Error::Leased(_) => "LEASED",
            Error::TryAgain(_) => "TRYAGAIN",
            Error::NoPerm(_) => "NOPERM",
            Error::Moved { .. } => "MOVED",
            Error::Ask { .. } => "ASK",
            Error::ClusterDown => "CLUSTERDOWN",
            Error::ReadOnly => "READONLY",
            Error::OutOfMemory => "OOM",
            Error::BusyKey => "BUSYKEY",
            Error::WrongType => "WRONGTYPE",
        }
    }

    fn message(&self) -> Cow<'_, str> {
        match self {
            Error::Invalid(m) | Error::TryAgain(m) => Cow::Borrowed(m),
            Error::Leased(m) => Cow::Borrowed(m),
            Error::NoPerm(m) => Cow::Borrowed(m),
            Error::Moved { slot, addr } | Error::Ask { slot, addr } => {
                Cow::Owned(format!("{slot} {addr}"))
            }
            Error::ClusterDown => Cow::Borrowed("Hash slot not served"),
            Error::ReadOnly => Cow::Borrowed("You can't write against a read only replica."),
            Error::OutOfMemory => {
                Cow::Borrowed("command not allowed when used memory > 'maxmemory'.")
            }
            Error::BusyKey => Cow::Borrowed("Target key name already exists."),
            Error::WrongType => {
                Cow::Borrowed("Operation against a key holding the wrong kind of value")
            }
        }
    }
}

impl From<Error> for RedisError {
    fn from(e: Error) -> RedisError {
        RedisError::String(format!("{} {}", e.code(), e.message()))
    }
}

/// `ERR message`.
pub fn invalid(message: impl Into<Cow<'static, str>>) -> RedisError {
    Error::Invalid(message.into()).into()
}

/// `TRYAGAIN message`.
pub fn try_again(message: impl Into<Cow<'static, str>>) -> RedisError {
    Error::TryAgain(message.into()).into()
}

/// Why CONFIG SET (or a loadmodule argument) refuses a value: a message
/// without a code (Redis puts its own in front). The crate turns it into a
/// RedisString through a CString (a panic on NUL), so it is made printable
/// first: it may echo the value.
pub fn setting(message: String) -> RedisError {
    RedisError::String(
        message
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect(),
    )
}

/// A command that needs an existing session, on a missing key.
pub fn no_such_key() -> RedisError {
    invalid("no such key")
}

/// What a panic caught at an entry point answers (the panic hook logged it).
pub fn internal() -> RedisError {
    invalid("redis-mem internal error (see the server log)")
}

/// A rule of the session core refused the write. Another worker's live
/// lease has a code of its own (as BUSYKEY or NOSCRIPT), so a summarizer
/// tells "someone else is on it" from a stale summary without parsing text.
pub fn session(e: SessionError) -> RedisError {
    match e {
        SessionError::LeaseHeld { .. } | SessionError::LeaseNotCurrent { .. } => {
            Error::Leased(e.to_string()).into()
        }
        _ => invalid(e.to_string()),
    }
}

/// Error replies are one line of ASCII: an error that echoes client input
/// (an unknown option, a bad timestamp) must not carry bytes a client's
/// protocol parser refuses.
pub fn ascii(e: RedisError) -> RedisError {
    match e {
        RedisError::String(s) if !s.bytes().all(|b| b.is_ascii() && !b.is_ascii_control()) => {
            RedisError::String(
                s.chars()
                    .map(|c| {
                        if c.is_ascii() && !c.is_ascii_control() {
                            c
                        } else {
                            '?'
                        }
                    })
                    .collect(),
            )
        }
        other => other,
    }
}

/// An attribute name MEM.ATTRSET / ATTRDEL refuse.
pub fn bad_attr_name(why: String) -> RedisError {
    invalid(why)
}

/// An attribute value that is not JSON `FORMAT JSON` could give back.
pub fn bad_attr_value(why: String) -> RedisError {
    invalid(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis_module::Context;

    /// The crate's error reply (`Context::reply_error_string`) makes its
    /// CString with `c as u8` per char: U+0100, U+4E00 ... become a NUL and
    /// its unwrap panics, in the crate's own shim. An echoed option name
    /// (`unknown option 'Ā'`) would abort the server but for [`ascii`].
    #[test]
    fn error_replies_never_reach_the_crate_with_a_char_it_truncates_to_nul() {
        let echoed = ["unknown option 'Ā'", "一", "x\0y", "\u{0300}\u{1000}"];
        for s in echoed {
            let raw = std::panic::catch_unwind(|| Context::str_as_legal_resp_string(s));
            let safe = match ascii(invalid(s)) {
                RedisError::String(s) => s,
                other => panic!("{other:?}"),
            };
            let made = std::panic::catch_unwind(|| Context::str_as_legal_resp_string(&safe));
            assert!(made.is_ok(), "{s:?} -> {safe:?}");
            if s != "x\0y" {
                assert!(raw.is_err(), "the crate itself would panic on {s:?}");
            }
        }
    }
}
