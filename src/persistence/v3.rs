//! Format 3: format 2 with the messages written as the session holds them
//! (session/log.rs), so saving is a walk over fixed-size heads plus one copy
//! of the message bytes, and loading allocates two buffers per session
//! instead of several per message.
//!
//! Messages: a count; per message its id (the delta from the previous id,
//! ids strictly increase), ts (zigzag delta from the previous ts), tokens
//! and the length of its stored bytes; then the total length and every
//! message's stored bytes back to back (tag, role, meta, content: see
//! session/log.rs and docs/FORMAT.md). Everything before and after the
//! messages is format 2's.

use super::v2;
use super::wire::{Reader, Result, Writer};
use crate::session::{History, Session, StoredLog};

pub const FORMAT: u8 = 3;
/// Format 3 and, after its tail, the attributes' own expiries (a count of
/// name str, expires_at zigzag; names strictly increasing) and the
/// session's history (evicted, summarized, summaries_dropped: varints).
pub const FORMAT_4: u8 = 4;

/// Fewest bytes of a message's head (four varints).
const MIN_HEAD_BYTES: usize = 4;

pub fn encode_session(s: &Session) -> Vec<u8> {
    encode_session_into(s, Vec::new())
}

/// [`encode_session`] written into `out` (emptied first).
pub fn encode_session_into(s: &Session, out: Vec<u8>) -> Vec<u8> {
    // Heads take at most 4 varints of 10 bytes; most take 5-8 bytes. The
    // bytes' room is reserved once the heads have said how many there are
    // (the buffer is reused: it rarely grows).
    let mut w = Writer::reusing(out, FORMAT_4, 256 + s.messages.len() * 12);
    v2::put_session_head(&mut w, s);
    w.length(s.messages.len());
    let (mut prev_id, mut prev_ts, mut bytes) = (0u64, 0i64, 0usize);
    for (head, len) in s.messages.stored_heads() {
        w.u64(head.id.wrapping_sub(prev_id));
        w.i64(head.ts.wrapping_sub(prev_ts));
        w.u64(u64::from(head.tokens));
        w.length(len);
        (prev_id, prev_ts) = (head.id, head.ts);
        bytes += len;
    }
    w.reserve(bytes + 64);
    w.length(bytes);
    for piece in s.messages.stored_bytes() {
        w.raw(piece);
    }
    v2::put_session_tail(&mut w, s);
    let expiries = s.extra.expiries();
    w.length(expiries.len());
    for (name, at) in expiries {
        w.str(name);
        w.i64(*at);
    }
    w.u64(s.history.evicted);
    w.u64(s.history.summarized);
    w.u64(s.history.summaries_dropped);
    w.into_bytes()
}

/// Formats 3 and 4.
pub fn session(r: &mut Reader) -> Result<Session> {
    let mut session = v2::session_head(r)?;
    let count = r.count(MIN_HEAD_BYTES, "messages")?;
    let mut log = StoredLog::with_capacity(count);
    let (mut id, mut ts) = (0u64, 0i64);
    for _ in 0..count {
        let delta = r.u64("message id")?;
        if delta == 0 {
            return Err("corrupt payload: message ids not increasing".to_owned());
        }
        id = id
            .checked_add(delta)
            .ok_or("corrupt payload: message id overflows")?;
        ts = ts.wrapping_add(r.i64("message ts")?);
        let tokens = r.u64("message tokens")?;
        log.head(id, ts, tokens, r.u64("message length")?)?;
    }
    let total = r.u64("message bytes")?;
    session.messages = log.finish(r.take(total, "message bytes")?)?;
    v2::session_tail(r, &mut session)?;
    if r.format() >= FORMAT_4 {
        // Two bytes at least: an empty name and a one-byte time.
        let count = r.count(2, "attribute expiries")?;
        let mut expiry = std::collections::BTreeMap::new();
        for _ in 0..count {
            let name = r.string("attribute name")?;
            if expiry
                .keys()
                .next_back()
                .is_some_and(|last: &String| *last >= name)
            {
                return Err("corrupt payload: attribute expiries not in order".to_owned());
            }
            expiry.insert(name, r.i64("attribute expiry")?);
        }
        session
            .extra
            .set_expiries(expiry)
            .map_err(|e| format!("corrupt payload: {e}"))?;
        session.history = History {
            evicted: r.u64("evicted")?,
            summarized: r.u64("summarized")?,
            summaries_dropped: r.u64("summaries dropped")?,
        };
    }
    Ok(session)
}
