//! Format 2: a layout written by hand, field by field, so that the bytes
//! change only when this file does (docs/FORMAT.md has the table).
//!
//! Integers are LEB128 varints in their shortest form (signed ones zigzag
//! first), strings a varint length and UTF-8 bytes, options a 0/1 tag then
//! the value, enums an explicit stored code (never a Rust discriminant).
//!
//! Adding a field later: bump the format (3), make the encoder write it,
//! and read it here only `if r.format() >= 3` (older payloads get a
//! default), so every format stays readable. Never reorder, retype or drop a
//! field of a published format.

use std::collections::BTreeMap;

use super::wire::{Reader, Result, Writer};
use crate::session::{
    Attrs, Departed, ExternalId, Lease, Leases, Message, MessageLog, Msgids, Op, Session, Settings,
    Summary, MAX_DEPARTED,
};
use crate::tokenizer::Encoding;

pub const FORMAT: u8 = 2;

/// Fewest bytes a message takes (six fields of at least one byte), to bound
/// a count by the input before allocating.
const MIN_MESSAGE_BYTES: usize = 6;
/// Fewest bytes of an external id entry (system, id, expires_at).
const MIN_EXTERNAL_BYTES: usize = 3;
/// Fewest bytes of a held msgid (id, msgid) and of a departed one (msgid,
/// id, tokens).
const MIN_HELD_MSGID_BYTES: usize = 2;
const MIN_DEPARTED_BYTES: usize = 3;

/// Stored codes of the op kinds.
const OP_APPEND: u8 = 1;
const OP_SUMMARIZE: u8 = 2;
const OP_EXTSET: u8 = 3;
const OP_RECOUNT: u8 = 4;
const OP_LEASE: u8 = 5;
const OP_ATTRSET: u8 = 6;
const OP_ATTRDEL: u8 = 7;
/// An AttrSet with its own expiry (MEM.ATTRSET ... EX): kind 6's fields,
/// then expires_at. Kind 6 stays for the rest, so a replica of an earlier
/// release applies what it can.
const OP_ATTRSET_EX: u8 = 8;
/// Fewest bytes of a re-count entry (id, tokens).
const MIN_COUNT_BYTES: usize = 2;

/// Stored code of an encoding; the match is exhaustive so a new encoding
/// cannot be stored without being given a code.
fn encoding_code(e: Encoding) -> u8 {
    match e {
        Encoding::O200kBase => 1,
        Encoding::Cl100kBase => 2,
        Encoding::Llama3 => 3,
        Encoding::DeepseekV3 => 4,
        Encoding::Qwen2 => 5,
        Encoding::Glm4 => 6,
        Encoding::Glm5 => 7,
        Encoding::KimiK2 => 8,
        Encoding::MinimaxM2 => 9,
        Encoding::Tekken => 10,
    }
}

fn encoding_from_code(code: u8) -> Result<Encoding> {
    match code {
        1 => Ok(Encoding::O200kBase),
        2 => Ok(Encoding::Cl100kBase),
        3 => Ok(Encoding::Llama3),
        4 => Ok(Encoding::DeepseekV3),
        5 => Ok(Encoding::Qwen2),
        6 => Ok(Encoding::Glm4),
        7 => Ok(Encoding::Glm5),
        8 => Ok(Encoding::KimiK2),
        9 => Ok(Encoding::MinimaxM2),
        10 => Ok(Encoding::Tekken),
        c => Err(format!("corrupt payload: unknown encoding code {c}")),
    }
}

// ---- encoding ----------------------------------------------------------

/// A session in format 2 (what release 0.2 wrote; kept for the tests that
/// pin its bytes, and to write fixtures).
#[cfg(test)]
pub fn encode_session(s: &Session) -> Vec<u8> {
    let mut w = Writer::with_capacity(FORMAT, 256);
    put_session_head(&mut w, s);
    w.length(s.messages.len());
    for m in s.messages.iter() {
        put_message_parts(&mut w, m.id, m.role, m.content, m.ts, m.tokens, m.meta);
    }
    put_session_tail(&mut w, s);
    w.into_bytes()
}

/// The fields before the messages (formats 2 and 3).
pub(super) fn put_session_head(w: &mut Writer, s: &Session) {
    put_settings(w, &s.settings);
    w.u64(s.last_id);
    w.u64(s.total_tokens);
    w.i64(s.created);
    w.i64(s.updated);
    w.option(s.summary.as_deref(), put_summary);
}

/// The fields after the messages (formats 2 and 3).
pub(super) fn put_session_tail(w: &mut Writer, s: &Session) {
    // BTreeMap order: systems strictly increasing, as the decoder requires.
    w.length(s.external.len());
    for (system, e) in &s.external {
        w.str(system);
        put_external(w, e);
    }
    w.option(s.extra.text().as_deref(), Writer::str);
    w.option(s.leases.current.as_ref(), put_lease);
    w.u64(s.leases.last_token);
    w.length(s.msgids.held.len());
    for (id, msgid) in &s.msgids.held {
        w.u64(*id);
        w.str(msgid);
    }
    w.length(s.msgids.departed.len());
    for d in &s.msgids.departed {
        w.str(&d.msgid);
        w.u64(d.id);
        w.u64(d.tokens);
    }
}

/// An op's payload (MEM._APPLY, the AOF): one arm an op, each the format's
/// field list for it (a table, hence its length).
pub fn encode_op(op: &Op) -> Vec<u8> {
    encode_op_with(op, true, usize::MAX).0
}

/// [`encode_op`] of the op's [`Op::header`] (its appended content or
/// summary text left empty), without cloning the op first: that clone was
/// four of an append's allocations.
#[cfg(test)]
pub fn encode_op_header(op: &Op) -> Vec<u8> {
    encode_op_with(op, false, usize::MAX).0
}

/// [`encode_op_header`] with its [`Op::header_text`] left out when it is
/// `apart_from` bytes or more: the header's bytes and where that text goes
/// (after its length, which is written). The caller puts it in as it
/// builds the replicated argument, one copy of it instead of two.
pub fn encode_op_header_apart(op: &Op, apart_from: usize) -> (Vec<u8>, Option<usize>) {
    encode_op_with(op, false, apart_from)
}

fn encode_op_with(op: &Op, with_text: bool, apart_from: usize) -> (Vec<u8>, Option<usize>) {
    let apart = op.header_text().is_some_and(|t| t.len() >= apart_from);
    let mut gap = None;
    // One allocation, not the five a growing Vec took: an append's header
    // (its content travels apart) fits in 128 bytes beside its texts (a 4 MB
    // META grew the buffer by doubling: a 4 MB copy into 8 MB of fresh
    // pages, half of such an append's main-thread time).
    let mut w = Writer::with_capacity(FORMAT, 128 + text_bytes(op, with_text, apart));
    match op {
        Op::Append {
            now,
            settings,
            message: m,
            msgid,
        } => {
            w.u8(OP_APPEND);
            w.i64(*now);
            put_settings(&mut w, settings);
            let content = if with_text { &*m.content } else { "" };
            put_message_head(&mut w, m.id, &m.role, content, m.ts, m.tokens);
            match m.meta.as_deref() {
                Some(meta) if apart => {
                    w.u8(1);
                    w.length(meta.len());
                    gap = Some(w.len());
                }
                meta => w.option(meta, Writer::str),
            }
            w.option(msgid.as_deref(), Writer::str);
        }
        Op::Summarize { now, summary } => {
            w.u8(OP_SUMMARIZE);
            w.i64(*now);
            let text = if with_text { summary.text.as_str() } else { "" };
            put_summary_parts(&mut w, summary, text);
        }
        Op::ExtSet {
            now,
            settings,
            system,
            external,
        } => {
            w.u8(OP_EXTSET);
            w.i64(*now);
            put_settings(&mut w, settings);
            w.str(system);
            put_external(&mut w, external);
        }
        Op::Recount {
            now,
            encoding,
            summary_tokens,
            counts,
        } => {
            w.u8(OP_RECOUNT);
            w.i64(*now);
            w.u8(encoding_code(*encoding));
            w.option(summary_tokens.as_ref(), |w, t| w.u64(*t));
            w.length(counts.len());
            for (id, tokens) in counts {
                w.u64(*id);
                w.u64(*tokens);
            }
        }
        Op::AttrSet {
            now,
            settings,
            name,
            value,
            expires_at,
        } => {
            w.u8(if expires_at.is_some() {
                OP_ATTRSET_EX
            } else {
                OP_ATTRSET
            });
            w.i64(*now);
            put_settings(&mut w, settings);
            w.str(name);
            if apart {
                w.length(value.len());
                gap = Some(w.len());
            } else {
                w.str(value);
            }
            if let Some(at) = expires_at {
                w.i64(*at);
            }
        }
        Op::AttrDel { now, name } => {
            w.u8(OP_ATTRDEL);
            w.i64(*now);
            w.str(name);
        }
        Op::Lease { now, lease } => {
            w.u8(OP_LEASE);
            w.i64(*now);
            put_lease(&mut w, lease);
        }
    }
    (w.into_bytes(), gap)
}

fn put_settings(w: &mut Writer, s: &Settings) {
    w.str(&s.model);
    w.u8(encoding_code(s.encoding));
    w.u64(s.ttl);
    w.u64(s.max_tokens);
    w.u64(s.max_msgs);
    // Appended to the layout (format 2 had not shipped when it was added).
    w.u64(s.max_age);
}

fn put_summary(w: &mut Writer, s: &Summary) {
    put_summary_parts(w, s, &s.text);
}

fn put_summary_parts(w: &mut Writer, s: &Summary, text: &str) {
    w.str(text);
    w.u64(s.tokens);
    w.u64(s.upto);
    w.i64(s.ts);
}

/// Bytes of the texts [`encode_op_with`] writes of `op` (the rest is
/// a few varints and short names); without its header text when that is
/// left `apart`.
fn text_bytes(op: &Op, with_text: bool, apart: bool) -> usize {
    let len = |s: Option<&str>| s.map_or(0, str::len);
    let header_text = if apart {
        0
    } else {
        len(op.header_text().map(|t| &**t))
    };
    header_text
        + match op {
            Op::Append {
                message: m, msgid, ..
            } => m.role.len() + len(msgid.as_deref()) + if with_text { m.content.len() } else { 0 },
            Op::Summarize { summary, .. } if with_text => summary.text.len(),
            Op::AttrSet { name, .. } => name.len(),
            _ => 0,
        }
}

#[cfg(test)]
fn put_message_parts(
    w: &mut Writer,
    id: u64,
    role: &str,
    content: &str,
    ts: i64,
    tokens: u64,
    meta: Option<&str>,
) {
    put_message_head(w, id, role, content, ts, tokens);
    w.option(meta, Writer::str);
}

/// A message's fields before its META.
fn put_message_head(w: &mut Writer, id: u64, role: &str, content: &str, ts: i64, tokens: u64) {
    w.u64(id);
    w.str(role);
    w.str(content);
    w.i64(ts);
    w.u64(tokens);
}

fn put_lease(w: &mut Writer, l: &Lease) {
    w.u64(l.token);
    w.i64(l.expires_at);
}

fn put_external(w: &mut Writer, e: &ExternalId) {
    w.str(&e.id);
    w.i64(e.expires_at);
}

// ---- decoding (formats 2 and later) -------------------------------------
// Struct fields are read in the order they are written in each literal
// below (Rust evaluates a struct expression's fields in source order); the
// order is the format's.

pub fn session(r: &mut Reader) -> Result<Session> {
    let mut session = session_head(r)?;
    let count = r.count(MIN_MESSAGE_BYTES, "messages")?;
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        messages.push(message(r)?);
    }
    session.messages = MessageLog::from_messages(messages)?;
    session_tail(r, &mut session)?;
    Ok(session)
}

/// The fields before the messages (formats 2 and 3), as a session without
/// messages.
pub(super) fn session_head(r: &mut Reader) -> Result<Session> {
    let settings = settings(r)?;
    let last_id = r.u64("last_id")?;
    let total_tokens = r.u64("total_tokens")?;
    let created = r.i64("created")?;
    let updated = r.i64("updated")?;
    let summary = r.option("summary", summary)?;
    let mut session = Session::new(settings, created);
    session.last_id = last_id;
    session.total_tokens = total_tokens;
    session.updated = updated;
    session.summary = summary.map(Box::new);
    Ok(session)
}

/// The fields after the messages (formats 2 and 3).
pub(super) fn session_tail(r: &mut Reader, session: &mut Session) -> Result<()> {
    let count = r.count(MIN_EXTERNAL_BYTES, "external ids")?;
    let mut external = BTreeMap::new();
    for _ in 0..count {
        let system = r.string("external system")?;
        // Strictly increasing, as written: one encoding per session.
        if external
            .last_key_value()
            .is_some_and(|(last, _)| *last >= system)
        {
            return Err("corrupt payload: external systems out of order".to_owned());
        }
        external.insert(system, external_id(r)?);
    }
    session.external = external.into();
    let extra = r.option("extra", |r| r.str("extra"))?;
    session.extra = Attrs::from_text(extra).map_err(|e| format!("corrupt payload: {e}"))?;
    session.leases = Leases {
        current: r.option("lease", lease)?,
        last_token: r.u64("last lease token")?,
    }
    .into();
    session.msgids = msgids(r)?;
    Ok(())
}

fn msgids(r: &mut Reader) -> Result<Msgids> {
    let mut out = Msgids::default();
    let count = r.count(MIN_HELD_MSGID_BYTES, "held msgids")?;
    for _ in 0..count {
        out.held
            .push_back((r.u64("msgid's message id")?, r.boxed_str("msgid")?));
    }
    let count = r.count(MIN_DEPARTED_BYTES, "departed msgids")?;
    if count > MAX_DEPARTED {
        return Err(format!("corrupt payload: {count} departed msgids"));
    }
    for _ in 0..count {
        out.departed.push_back(Departed {
            msgid: r.boxed_str("departed msgid")?,
            id: r.u64("departed id")?,
            tokens: r.u64("departed tokens")?,
        });
    }
    Ok(out)
}

fn lease(r: &mut Reader) -> Result<Lease> {
    Ok(Lease {
        token: r.u64("lease token")?,
        expires_at: r.i64("lease expiry")?,
    })
}

pub fn op(r: &mut Reader) -> Result<Op> {
    let kind = r.u8("op kind")?;
    let now = r.i64("now")?;
    match kind {
        OP_APPEND => Ok(Op::Append {
            now,
            settings: settings(r)?,
            message: message(r)?,
            msgid: r.option("msgid", |r| r.boxed_str("msgid"))?,
        }),
        OP_SUMMARIZE => Ok(Op::Summarize {
            now,
            summary: summary(r)?,
        }),
        OP_EXTSET => Ok(Op::ExtSet {
            now,
            settings: settings(r)?,
            system: r.string("external system")?,
            external: external_id(r)?,
        }),
        OP_RECOUNT => {
            let encoding = encoding_from_code(r.u8("encoding")?)?;
            let summary_tokens = r.option("summary tokens", |r| r.u64("summary tokens"))?;
            let n = r.count(MIN_COUNT_BYTES, "counts")?;
            let mut counts = Vec::with_capacity(n);
            for _ in 0..n {
                counts.push((r.u64("count id")?, r.u64("count tokens")?));
            }
            Ok(Op::Recount {
                now,
                encoding,
                summary_tokens,
                counts,
            })
        }
        OP_ATTRSET | OP_ATTRSET_EX => Ok(Op::AttrSet {
            now,
            settings: settings(r)?,
            name: r.string("attribute name")?,
            value: r.shared_str("attribute value")?,
            expires_at: match kind {
                OP_ATTRSET_EX => Some(r.i64("attribute expiry")?),
                _ => None,
            },
        }),
        OP_ATTRDEL => Ok(Op::AttrDel {
            now,
            name: r.string("attribute name")?,
        }),
        OP_LEASE => Ok(Op::Lease {
            now,
            lease: lease(r)?,
        }),
        k => Err(format!("corrupt payload: unknown op kind {k}")),
    }
}

fn settings(r: &mut Reader) -> Result<Settings> {
    Ok(Settings {
        model: r.string("model")?.into_boxed_str(),
        encoding: encoding_from_code(r.u8("encoding")?)?,
        ttl: r.u64("ttl")?,
        max_tokens: r.u64("max_tokens")?,
        max_msgs: r.u64("max_msgs")?,
        max_age: r.u64("max_age")?,
    })
}

fn summary(r: &mut Reader) -> Result<Summary> {
    Ok(Summary {
        text: r.string("summary text")?,
        tokens: r.u64("summary tokens")?,
        upto: r.u64("summary upto")?,
        ts: r.i64("summary ts")?,
    })
}

fn message(r: &mut Reader) -> Result<Message> {
    Ok(Message {
        id: r.u64("message id")?,
        role: r.boxed_str("role")?,
        content: r.shared_str("content")?,
        ts: r.i64("message ts")?,
        tokens: r.u64("message tokens")?,
        meta: r.option("meta", |r| r.shared_str("meta"))?,
    })
}

fn external_id(r: &mut Reader) -> Result<ExternalId> {
    Ok(ExternalId {
        id: r.string("external id")?,
        expires_at: r.i64("external expiry")?,
    })
}
