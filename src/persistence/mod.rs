//! The session's serialized form, shared by RDB, DUMP/RESTORE, AOF rewrite
//! (`MEM._PUT`), replication (`MEM._PUT`, `MEM._APPLY`) and DEBUG
//! DIGEST-VALUE.
//!
//! A payload is one format byte, then the value in that format's layout
//! (docs/FORMAT.md). Encoding writes the newest format only; decoding reads
//! every format a release ever wrote (1: postcard of 0.1's structs, 2: the
//! hand-written layout of `v2`), so what an older release persisted loads
//! in every later one. Decoding refuses unknown formats, truncation,
//! impossible lengths and trailing bytes, and checks the session's
//! invariants, so a corrupt payload is an error, never a half-loaded
//! session or a panic.
//!
//! Adding a format: a new format byte N (and `RDB_ENCODING_VERSION` N with
//! it, which data_type.rs's rdb_load accepts up to), the encoder writes N, the decoder of the previous layout reads the
//! new fields only `if r.format() >= N`; formats already published are never
//! changed. See docs/FORMAT.md.

mod v1;
mod v2;
mod v3;
mod wire;

#[cfg(test)]
mod tests;

use crate::session::{Op, Session};
use wire::Reader;

/// The data type's RDB encoding version (what Redis stores with each value).
/// A value saved under encoding version N holds one string buffer with a
/// payload of format N; the two move together.
pub const RDB_ENCODING_VERSION: i32 = FORMAT_LATEST as i32;

/// Release 0.1's payloads: postcard of its structs.
const FORMAT_V1: u8 = 1;
/// The format sessions are written in.
const FORMAT_LATEST: u8 = v3::FORMAT_4;

pub fn encode_session(session: &Session) -> Vec<u8> {
    v3::encode_session(session)
}

/// Largest buffer a thread keeps between payloads ([`with_encoded`]).
const KEPT_BUFFER_BYTES: usize = 64 * 1024;

thread_local! {
    static BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `f` of `session`'s payload, written into a buffer the thread keeps for
/// the next one when it is at most 64 KiB: SAVE, BGSAVE, AOF rewrite and
/// DEBUG DIGEST write one payload a key, and a fresh buffer each was an
/// allocation and a copy of the messages into cold memory (SAVE of 20,000
/// sessions of 30 x 200 B: the copy was most of the module's share).
pub fn with_encoded<T>(session: &Session, f: impl FnOnce(&[u8]) -> T) -> T {
    // Taken, not borrowed: a re-entrant call finds an empty buffer.
    let buffer = BUFFER.with(|b| b.take());
    let payload = v3::encode_session_into(session, buffer);
    let result = f(&payload);
    if payload.capacity() <= KEPT_BUFFER_BYTES {
        BUFFER.with(|b| b.set(payload));
    }
    result
}

/// A session in format 2, as release 0.2 wrote it (tests and fixtures).
#[cfg(test)]
pub fn encode_session_v2(session: &Session) -> Vec<u8> {
    v2::encode_session(session)
}

/// A session of any known format, its invariants checked.
pub fn decode_session(bytes: &[u8]) -> Result<Session, String> {
    let session = decode(bytes, v1::session, |r| match r.format() {
        v3::FORMAT | v3::FORMAT_4 => v3::session(r),
        _ => v2::session(r),
    })?;
    session.validate()?;
    Ok(session)
}

/// A session saved in an RDB (or DUMP) value of encoding version `encver`:
/// its payload must be of the matching format.
pub fn decode_rdb_session(encver: i32, bytes: &[u8]) -> Result<Session, String> {
    match bytes.first() {
        Some(&format) if i32::from(format) == encver => decode_session(bytes),
        Some(&format) => Err(format!(
            "payload format {format} in a value of encoding version {encver}"
        )),
        None => Err("empty payload".to_owned()),
    }
}

/// Ops are still written in format 2: format 3 changed only how a
/// session's messages are laid out.
pub fn encode_op(op: &Op) -> Vec<u8> {
    v2::encode_op(op)
}

/// The encoded [`Op::header`] of `op` (its text travels apart).
#[cfg(test)]
pub fn encode_op_header(op: &Op) -> Vec<u8> {
    v2::encode_op_header(op)
}

/// [`encode_op_header`] with a large [`Op::header_text`] left out, and
/// where it goes (see v2::encode_op_header_apart).
pub fn encode_op_header_apart(op: &Op, apart_from: usize) -> (Vec<u8>, Option<usize>) {
    v2::encode_op_header_apart(op, apart_from)
}

/// An op of any known format. Not validated here: an append's content may
/// travel as its own argument, so `MEM._APPLY` validates the op once the
/// content is back in (`Op::with_content`, then `Op::validate`).
pub fn decode_op(bytes: &[u8]) -> Result<Op, String> {
    match bytes.first() {
        Some(&format @ (v3::FORMAT | v3::FORMAT_4)) => Err(format!(
            "corrupt payload: format {format} carries sessions, not ops"
        )),
        _ => decode(bytes, v1::op, v2::op),
    }
}

/// Dispatches on the format byte; the whole body must be consumed.
fn decode<T>(
    bytes: &[u8],
    format_1: fn(&mut Reader) -> Result<T, String>,
    format_2_on: fn(&mut Reader) -> Result<T, String>,
) -> Result<T, String> {
    let Some((&format, body)) = bytes.split_first() else {
        return Err("empty payload".to_owned());
    };
    let mut r = Reader::new(body, format);
    let value = match format {
        FORMAT_V1 => format_1(&mut r)?,
        2..=FORMAT_LATEST => format_2_on(&mut r)?,
        _ => return Err(format!("unknown payload format {format}")),
    };
    r.finish()?;
    Ok(value)
}
