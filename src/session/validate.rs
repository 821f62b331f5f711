//! Invariants of sessions and ops, checked on everything that comes from
//! outside the commands' own parsing: RDB/DUMP payloads, `MEM._PUT` and
//! `MEM._APPLY`. A corrupt payload is refused, never half-loaded.
//!
//! Two levels. What clients send is held to the policy limits (ids up to
//! 2^53-1, TTLs up to 100 years, META that round-trips: `check_meta`).
//! What is loaded or replicated is held only to the structure every release
//! has written: an earlier release (or an older master during a rolling
//! upgrade) accepted ids up to 2^63-1, any TTL and any JSON object as META,
//! and its sessions must still load (refusing one aborts Redis's start).
//! The code that uses these values bounds them (`key_expiry`, `next_id`).

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{
    check_model, check_msgid, ExternalId, Lease, Message, MessageRef, Op, Session, Settings,
    Summary, MAX_DEPARTED, MAX_ROLE_BYTES, MAX_TS,
};
use crate::tokenizer::SUMMARY_COUNTED_AS;

use super::JSON_MAX_NESTING;
/// Deepest META (an object alone is depth 1): `FORMAT JSON` holds it inside
/// three containers (the document, `conversation_history`, the message),
/// and the whole document must stay within [`JSON_MAX_NESTING`].
pub const MAX_META_DEPTH: usize = JSON_MAX_NESTING - 3;
/// Deepest object of imported members: they are the document's top level.
pub const MAX_MEMBERS_DEPTH: usize = JSON_MAX_NESTING;
/// Largest stored cap, id or TTL: every integer a reply carries fits a RESP
/// integer (earlier releases accepted up to this).
const MAX_STORED: u64 = i64::MAX as u64;

/// META: a JSON object that `FORMAT JSON` gives back to MEM.IMPORT intact.
pub fn check_meta(text: &str) -> Result<(), String> {
    check_json_object("META", text, MAX_META_DEPTH)
}

/// Whether META (a checked object) holds tool calls: `tool_calls`, a
/// non-empty array of objects. A message with them may have `"content":
/// null` (OpenAI's shape of a turn that only calls tools), read as "" by
/// MEM.IMPORT and MEM.APPENDBATCH.
pub fn meta_calls_tools(meta: Option<&str>) -> bool {
    #[derive(serde::Deserialize)]
    struct Calls {
        tool_calls: Option<Vec<AnObject>>,
    }
    meta.and_then(|m| serde_json::from_str::<Calls>(m).ok())
        .and_then(|c| c.tool_calls)
        .is_some_and(|calls| !calls.is_empty())
}

/// A JSON object, its members skipped (zero-sized: a vector of them
/// allocates nothing); any other value is an error.
struct AnObject;

impl<'de> serde::Deserialize<'de> for AnObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AnObject, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = AnObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AnObject, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(AnObject)
            }
        }
        d.deserialize_map(Members)
    }
}

/// Imported top-level members, as one JSON object (see [`check_meta`]).
pub fn check_members(text: &str) -> Result<(), String> {
    check_json_object("imported members", text, MAX_MEMBERS_DEPTH)
}

/// An attribute's value (MEM.ATTRSET): any JSON value that `FORMAT JSON`
/// gives back to MEM.IMPORT intact, as META must be. It is a member of the
/// document, so one container less deep than the document may go.
pub fn check_attr_value(text: &str) -> Result<(), String> {
    check_json("attribute value", text, super::attrs::MAX_ATTR_DEPTH, false)
}

/// A JSON object that parses fully (no lone surrogate, no number out of
/// range: serde_json refuses both), nested at most `max_depth` deep. What
/// passes here comes back through `FORMAT JSON` and MEM.IMPORT. Walked as it
/// is parsed, building no tree: the check holds no more than the text does
/// (a `Value` of a large array of small numbers was tens of times its text).
fn check_json_object(what: &str, text: &str, max_depth: usize) -> Result<(), String> {
    check_json(what, text, max_depth, true)
}

/// [`check_json_object`], or any JSON value unless `object`.
fn check_json(what: &str, text: &str, max_depth: usize, object: bool) -> Result<(), String> {
    let too_deep = || format!("{what} is nested deeper than {max_depth} levels");
    let mut de = serde_json::Deserializer::from_str(text);
    let shape = Walk
        .deserialize(&mut de)
        .and_then(|shape| de.end().map(|()| shape));
    let shape = shape.map_err(|e| {
        if e.to_string().contains("recursion limit") {
            too_deep()
        } else {
            format!("{what} is not valid JSON: {e}")
        }
    })?;
    if object && !shape.object {
        return Err(format!("{what} must be a JSON object"));
    }
    if shape.depth > max_depth {
        return Err(too_deep());
    }
    Ok(())
}

/// What [`Walk`] found: nesting depth (a scalar is 0, `{}` 1) and whether the
/// value is an object.
struct Shape {
    depth: usize,
    object: bool,
}

const SCALAR: Shape = Shape {
    depth: 0,
    object: false,
};

/// Parses one JSON value as serde_json's `Value` would (the same errors:
/// numbers out of range, lone surrogates in strings and member names, its
/// recursion limit, which also bounds this recursion), keeping only its
/// [`Shape`].
struct Walk;

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = Shape;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(Walk)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = Shape;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
        Ok(SCALAR)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
        Ok(SCALAR)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
        Ok(SCALAR)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
        Ok(SCALAR)
    }
    fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
        Ok(SCALAR)
    }
    fn visit_unit<E>(self) -> Result<Shape, E> {
        Ok(SCALAR)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut deepest = 0;
        while let Some(item) = seq.next_element_seed(Walk)? {
            deepest = deepest.max(item.depth);
        }
        Ok(Shape {
            depth: deepest + 1,
            object: false,
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut deepest = 0;
        // A member name is decoded (not skipped), so a lone surrogate in it
        // is refused as in a value.
        while map.next_key::<std::borrow::Cow<str>>()?.is_some() {
            deepest = deepest.max(map.next_value_seed(Walk)?.depth);
        }
        Ok(Shape {
            depth: deepest + 1,
            object: true,
        })
    }
}

/// A JSON object as stored: what every release accepted (new input is
/// held to [`check_meta`] / [`check_members`] by the commands).
fn check_stored_object(what: &str, text: &str) -> Result<(), String> {
    match serde_json::from_str::<&serde_json::value::RawValue>(text) {
        Ok(raw) if raw.get().trim_start().starts_with('{') => Ok(()),
        Ok(_) => Err(format!("{what} must be a JSON object")),
        Err(e) => Err(format!("{what} is not valid JSON: {e}")),
    }
}

fn check_id(what: &str, id: u64) -> Result<(), String> {
    if !(1..=MAX_STORED).contains(&id) {
        return Err(format!("{what} {id} is outside 1..={MAX_STORED}"));
    }
    Ok(())
}

/// An expiry an op or a stored session can hold: what a write's clock and
/// the longest EX give at most.
pub(super) fn check_expiry(at: i64) -> Result<(), String> {
    if !(0..=super::MAX_EXPIRY_MS).contains(&at) {
        return Err(format!("expiry {at} out of range"));
    }
    Ok(())
}

fn check_clock(now: i64) -> Result<(), String> {
    if !(0..=MAX_TS).contains(&now) {
        return Err(format!("op time {now} out of range"));
    }
    Ok(())
}

/// A token count can never exceed the bytes counted (every token covers at
/// least one byte), plus the 3 framing tokens: a larger one is corrupt.
fn check_tokens(tokens: u64, role_bytes: usize, text_bytes: usize) -> Result<(), String> {
    if tokens > 3 + role_bytes as u64 + text_bytes as u64 {
        return Err(format!("token count {tokens} exceeds its text"));
    }
    Ok(())
}

impl Message {
    pub fn validate(&self) -> Result<(), String> {
        MessageRef {
            id: self.id,
            ts: self.ts,
            tokens: self.tokens,
            role: &self.role,
            content: &self.content,
            meta: self.meta.as_deref(),
        }
        .validate()
    }
}

impl MessageRef<'_> {
    pub fn validate(&self) -> Result<(), String> {
        check_head(self.id, self.ts, self.tokens)?;
        if self.role.is_empty() || self.role.len() > MAX_ROLE_BYTES {
            return Err(format!("bad role at id {}", self.id));
        }
        match self.meta {
            Some(meta) => check_stored_object("meta", meta),
            None => Ok(()),
        }
    }
}

/// What a message's head must hold.
fn check_head(id: u64, ts: i64, tokens: u64) -> Result<(), String> {
    check_id("message id", id)?;
    if !(0..=MAX_TS).contains(&ts) {
        return Err(format!("bad ts at id {id}"));
    }
    // A message's tokens may be the client's (TOKENS n: a provider's
    // count, for any text); they are stored in 32 bits.
    if tokens > super::MAX_MESSAGE_TOKENS {
        return Err(format!(
            "token count {tokens} above {} at id {id}",
            super::MAX_MESSAGE_TOKENS
        ));
    }
    Ok(())
}

impl Summary {
    pub fn validate(&self) -> Result<(), String> {
        check_id("summary upto", self.upto)?;
        if !(0..=MAX_TS).contains(&self.ts) {
            return Err("bad summary ts".to_owned());
        }
        check_tokens(self.tokens, SUMMARY_COUNTED_AS.len(), self.text.len())
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_STORED).contains(&self.max_msgs)
            || !(1..=MAX_STORED).contains(&self.max_tokens)
        {
            return Err(format!("caps must be 1 to {MAX_STORED}"));
        }
        if self.max_age > MAX_STORED {
            return Err(format!("max_age {} is above {MAX_STORED}", self.max_age));
        }
        if self.ttl > MAX_STORED {
            return Err(format!("ttl {} is above {MAX_STORED}", self.ttl));
        }
        check_model(&self.model)
    }
}

impl Op {
    /// Checks what an op received from outside (`MEM._APPLY`) carries, as
    /// the commands check what clients send.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Op::Append {
                now,
                settings,
                message,
                msgid,
            } => {
                check_clock(*now)?;
                settings.validate()?;
                if let Some(msgid) = msgid {
                    check_msgid(msgid)?;
                }
                message.validate()
            }
            Op::Summarize { now, summary } => {
                check_clock(*now)?;
                summary.validate()
            }
            Op::ExtSet {
                now,
                settings,
                system,
                external,
            } => {
                check_clock(*now)?;
                settings.validate()?;
                check_external(system, external)
            }
            Op::AttrSet {
                now,
                settings,
                name,
                value,
                expires_at,
            } => {
                check_clock(*now)?;
                if let Some(at) = expires_at {
                    check_expiry(*at)?;
                }
                settings.validate()?;
                check_stored_name(name)?;
                // What a client set was held to check_attr_value; a stored
                // one must at least be JSON, as every stored member is.
                serde_json::from_str::<&serde_json::value::RawValue>(value)
                    .map(drop)
                    .map_err(|e| format!("attribute value is not valid JSON: {e}"))
            }
            // Any name: an imported member may have one ATTRSET refuses.
            Op::AttrDel { now, name: _ } => check_clock(*now),
            // Matched against the session's own messages when applied.
            Op::Recount { now, counts, .. } => {
                check_clock(*now)?;
                counts
                    .iter()
                    .try_for_each(|(id, _)| check_id("re-count id", *id))
            }
            Op::Lease { now, lease } => {
                check_clock(*now)?;
                check_lease(lease)
            }
        }
    }
}

impl Session {
    /// Checks the invariants a loaded payload must hold, so a corrupt one is
    /// refused instead of misbehaving later.
    pub fn validate(&self) -> Result<(), String> {
        self.settings.validate()?;
        // Figures MEM.INFO and FORMAT JSON show exactly (2^53 - 1 at most),
        // and expiries a write could have set.
        let h = &self.history;
        if [h.evicted, h.summarized, h.summaries_dropped]
            .iter()
            .any(|&n| n > super::MAX_ID)
        {
            return Err("history counts above 2^53 - 1".to_owned());
        }
        for at in self.extra.expiries().values() {
            check_expiry(*at)?;
        }
        let mut prev = 0;
        let mut total = 0u64;
        if let Some(s) = &self.summary {
            s.validate()?;
            prev = s.upto;
            total = s.tokens;
        }
        // Most messages are a common role and content: their heads are
        // checked without decoding them (a fifth of a load's module time).
        for (h, message) in self.messages.checkable() {
            if h.id <= prev {
                return Err(format!("message ids not increasing at id {}", h.id));
            }
            let tokens = u64::from(h.tokens);
            match message {
                Some(m) => m.validate()?,
                None => check_head(h.id, h.ts, tokens)?,
            }
            prev = h.id;
            total += tokens; // at most 2^32 a message: cannot overflow
        }
        if prev > self.last_id {
            return Err("last id below a message id".to_owned());
        }
        if self.last_id > MAX_STORED {
            return Err(format!("last id {} is above {MAX_STORED}", self.last_id));
        }
        if total != self.total_tokens {
            return Err(format!(
                "total_tokens {} does not match the sum {total}",
                self.total_tokens
            ));
        }
        // The attributes were parsed as an object's members when they came in.
        if let Some(lease) = &self.leases.current {
            check_lease(lease)?;
            if lease.token > self.leases.last_token {
                return Err("lease token above the last one handed out".to_owned());
            }
        }
        if self.leases.last_token > MAX_STORED {
            return Err(format!("last lease token above {MAX_STORED}"));
        }
        self.check_msgids()?;
        self.external
            .iter()
            .try_for_each(|(system, external)| check_external(system, external))
    }
}

/// An attribute name a replicated op may carry: what ATTRSET accepts.
fn check_stored_name(name: &str) -> Result<(), String> {
    super::attrs::check_attr_name(name)
}

impl Session {
    /// The msgids: each held one names a held message (ids strictly
    /// increasing, as the messages'); at most [`MAX_DEPARTED`] departed ones,
    /// of ids the session handed out, in the order they left; every msgid
    /// 1 to 128 bytes, none named twice.
    fn check_msgids(&self) -> Result<(), String> {
        let mut messages = self.messages.heads().map(|h| h.id);
        for (id, msgid) in &self.msgids.held {
            check_msgid(msgid).map_err(|e| format!("{e} (id {id})"))?;
            // Both in id order: one pass over the messages.
            if !messages.any(|m| m == *id) {
                return Err(format!(
                    "msgid of id {id}, not a message of the session (or out of order)"
                ));
            }
        }
        if self.msgids.departed.len() > MAX_DEPARTED {
            return Err(format!("more than {MAX_DEPARTED} departed msgids"));
        }
        let mut prev = 0;
        for d in &self.msgids.departed {
            check_msgid(&d.msgid)?;
            if d.id <= prev || d.id > self.last_id {
                return Err(format!("departed msgid of id {} out of order", d.id));
            }
            // A departed message is no longer held (one that is would leave
            // again, naming its id twice: an RDB no load could read).
            if self.messages.position(d.id).is_some() {
                return Err(format!(
                    "departed msgid of id {}, a message still held",
                    d.id
                ));
            }
            prev = d.id;
        }
        // No write stores a msgid the session knows (it answers the retry),
        // so one named twice is corrupt: a retry would match either.
        // Fx: the std hasher was 10% of a RESTORE of 99,000 msgids.
        let mut seen = rustc_hash::FxHashSet::default();
        seen.reserve(self.msgids.held.len() + self.msgids.departed.len());
        let named = self.msgids.held.iter().map(|(_, m)| &**m);
        for msgid in named.chain(self.msgids.departed.iter().map(|d| &*d.msgid)) {
            if !seen.insert(msgid) {
                return Err(format!("msgid {msgid:?} named twice"));
            }
        }
        Ok(())
    }
}

fn check_lease(lease: &Lease) -> Result<(), String> {
    if !(1..=MAX_STORED).contains(&lease.token) {
        return Err(format!(
            "lease token {} is outside 1..={MAX_STORED}",
            lease.token
        ));
    }
    Ok(())
}

/// Any expiry is structurally fine (earlier releases stored up to i64::MAX;
/// `key_expiry` bounds what it uses).
fn check_external(system: &str, _external: &ExternalId) -> Result<(), String> {
    if system.is_empty() {
        return Err("empty external system name".to_owned());
    }
    Ok(())
}
