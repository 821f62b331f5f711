//! Every error reply of the MEM.* commands is made here: Redis style
//! (`CODE message`), one printable ASCII line.

use redis_module::RedisError;

use crate::session::SessionError;

/// An error reply from a message that starts with its code (`ERR ...`).
pub fn err(msg: String) -> RedisError {
    RedisError::String(msg)
}

/// A command that needs an existing session, on a missing key.
pub fn no_such_key() -> RedisError {
    RedisError::Str("ERR no such key")
}

/// What a panic caught at an entry point answers (the panic hook logged it).
pub fn internal() -> RedisError {
    RedisError::Str("ERR redis-mem internal error (see the server log)")
}

/// A rule of the session core refused the write. Another worker's live
/// lease has a code of its own (as BUSYKEY or NOSCRIPT), so a summarizer
/// tells "someone else is on it" from a stale summary without parsing text.
pub fn session(e: SessionError) -> RedisError {
    let code = match e {
        SessionError::LeaseHeld { .. } => "LEASED",
        _ => "ERR",
    };
    err(format!("{code} {e}"))
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
    err(format!("ERR {why}"))
}

/// An attribute value that is not JSON `FORMAT JSON` could give back.
pub fn bad_attr_value(why: String) -> RedisError {
    err(format!("ERR {why}"))
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
            let safe = match ascii(err(format!("ERR {s}"))) {
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
