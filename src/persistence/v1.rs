//! Format 1, what release 0.1 wrote: the postcard encoding of that release's
//! structs. Decoded here by hand so that RDB files, DUMPs and AOFs of 0.1
//! load forever, whatever today's structs look like. Nothing writes it any
//! more. docs/FORMAT.md has the layout; in short (postcard's rules): fields
//! in the declaration order of the 0.1 structs, unsigned integers as LEB128
//! varints, i64 as zigzag varints, strings as a varint length and UTF-8
//! bytes, options as a 0/1 byte then the value, sequences and maps as a
//! varint count then the elements, enums as a varint variant index (in
//! declaration order, from 0) then the variant's fields.

use std::collections::BTreeMap;

use super::wire::{Reader, Result};
use crate::session::{Attrs, ExternalId, Message, MessageLog, Op, Session, Settings, Summary};
use crate::tokenizer::Encoding;

/// Fewest bytes a message takes (id, role, content, ts, tokens, meta tag:
/// one byte each), to bound a count by the input.
const MIN_MESSAGE_BYTES: usize = 6;
/// Fewest bytes of an external id entry (system, id, expires_at).
const MIN_EXTERNAL_BYTES: usize = 3;

/// `Session { messages, summary, settings, external, last_id, total_tokens,
/// created, updated, extra }` of release 0.1.
pub fn session(r: &mut Reader) -> Result<Session> {
    let count = r.count(MIN_MESSAGE_BYTES, "messages")?;
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        messages.push(message(r)?);
    }
    let summary = r.option("summary", summary)?;
    let settings = settings(r)?;
    let count = r.count(MIN_EXTERNAL_BYTES, "external ids")?;
    let mut external = BTreeMap::new();
    for _ in 0..count {
        let system = r.string("external system")?;
        // A repeated key replaced the earlier one when postcard read it into
        // a BTreeMap; kept so, though 0.1 never wrote one.
        external.insert(system, external_id(r)?);
    }
    // The remaining fields are read in the order written below (a struct
    // expression evaluates its fields in source order).
    Ok(Session {
        messages: MessageLog::from_messages(messages)?,
        summary: summary.map(Box::new),
        settings,
        external: external.into(),
        last_id: r.u64("last_id")?,
        total_tokens: r.u64("total_tokens")?,
        created: r.i64("created")?,
        updated: r.i64("updated")?,
        extra: Attrs::from_text(r.option("extra", |r| r.str("extra"))?)
            .map_err(|e| format!("corrupt payload: {e}"))?,
        leases: Default::default(),
        msgids: Default::default(),
        history: Default::default(),
    })
}

/// `enum Op { Append { now, settings, message }, Summarize { now, summary },
/// ExtSet { now, settings, system, external } }` of release 0.1.
pub fn op(r: &mut Reader) -> Result<Op> {
    match r.postcard_variant("op kind")? {
        0 => Ok(Op::Append {
            now: r.i64("now")?,
            settings: settings(r)?,
            message: message(r)?,
            msgid: None,
        }),
        1 => Ok(Op::Summarize {
            now: r.i64("now")?,
            summary: summary(r)?,
        }),
        2 => Ok(Op::ExtSet {
            now: r.i64("now")?,
            settings: settings(r)?,
            system: r.string("external system")?,
            external: external_id(r)?,
        }),
        kind => Err(format!("corrupt payload: unknown op kind {kind}")),
    }
}

/// `Message { id, role, content, ts, tokens, meta }`.
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

/// `Summary { text, tokens, upto, ts }`.
fn summary(r: &mut Reader) -> Result<Summary> {
    Ok(Summary {
        text: r.string("summary text")?,
        tokens: r.u64("summary tokens")?,
        upto: r.u64("summary upto")?,
        ts: r.i64("summary ts")?,
    })
}

/// `Settings { model, encoding, ttl, max_tokens, max_msgs }`.
fn settings(r: &mut Reader) -> Result<Settings> {
    Ok(Settings {
        model: r.string("model")?.into_boxed_str(),
        encoding: encoding(r)?,
        ttl: r.u64("ttl")?,
        max_tokens: r.u64("max_tokens")?,
        max_msgs: r.u64("max_msgs")?,
        // Release 0.1 had no age limit.
        max_age: 0,
    })
}

/// `enum Encoding { O200kBase, Cl100kBase }`: variant indexes 0 and 1.
fn encoding(r: &mut Reader) -> Result<Encoding> {
    match r.postcard_variant("encoding")? {
        0 => Ok(Encoding::O200kBase),
        1 => Ok(Encoding::Cl100kBase),
        v => Err(format!("corrupt payload: unknown encoding {v}")),
    }
}

/// `ExternalId { id, expires_at }`.
fn external_id(r: &mut Reader) -> Result<ExternalId> {
    Ok(ExternalId {
        id: r.string("external id")?,
        expires_at: r.i64("external expiry")?,
    })
}
