//! MEM.IMPORT's document, parsed as it streams: no `Value` tree is built,
//! so an import holds little more than its document, and what the module
//! keeps of the client's JSON (META, the other top-level members) is the
//! client's own text, byte for byte.
//!
//! The root object is read first as (member name, raw value) pairs borrowed
//! from the document. `summary` and `model` are handled before any message
//! (so ids assigned after the summary's `upto` do not depend on member
//! order), then `conversation_history` is streamed element by element: each
//! message is checked, counted, pushed as the newest, and the oldest ones
//! evicted while over the caps, so at most the caps + 1 messages are held.
//!
//! Why the streamed trim ends where parse-all-then-trim ended (the unit
//! tests compare both on random documents): being over the caps
//! (`messages > maxmsgs` or their tokens + the summary's > `maxtokens`) only
//! gets less likely as messages leave the front, so trimming the whole
//! history keeps its longest suffix within the caps (at least the newest
//! message). That suffix, less its newest message, is within the caps too,
//! so it lies inside the suffix kept after the previous message: evicting
//! from (previous suffix + the new message) reaches it. The summary is never
//! evicted while streaming; at the end `Session::trim_imported` finds the
//! messages within the caps (or down to the newest), drops the summary when
//! the two do not fit, then the leading tool results: the same steps, on the
//! same messages, as after pushing them all.

use std::borrow::Cow;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::parse_iso8601;
use super::stored::StoredIn;
use crate::session::{
    check_members, check_meta, check_msgid, check_name_chars, next_id, Attrs, Message, Session,
    Settings, Summary, MAX_ATTRS, MAX_ATTR_NAME_BYTES, MAX_ID, MAX_MESSAGE_TOKENS, MAX_ROLE_BYTES,
    MAX_TS, TOOL_ROLE,
};
use crate::tokenizer::{Counting, SUMMARY_COUNTED_AS};

/// What an import made: the session (trimmed, with the document's other
/// members), the messages it dropped, and the most it held at once.
#[derive(Debug)]
pub struct Imported {
    pub session: Session,
    pub trimmed: u64,
    pub most_held: usize,
}

/// Why a document is refused.
#[derive(Debug, PartialEq)]
pub enum ImportError<E> {
    /// Not valid JSON, or not of the document's shape.
    Invalid(String),
    /// A message's content of this many bytes, above mem.max-message-bytes.
    TooLarge(usize),
    /// The settings refused the document's model.
    Settings(E),
}

impl<E> From<String> for ImportError<E> {
    fn from(e: String) -> Self {
        ImportError::Invalid(e)
    }
}

/// What the document says of its session's settings: its `model`, and the
/// `redis_mem` member's settings when it has one (`FORMAT JSON` writes it).
#[derive(Debug, Default, Clone, Copy)]
pub struct DocSettings<'d> {
    pub model: Option<&'d str>,
    pub ttl: Option<u64>,
    pub max_tokens: Option<u64>,
    pub max_msgs: Option<u64>,
    pub max_age: Option<u64>,
}

/// Builds the session of the MEM.IMPORT document `text`. `settings` gives a
/// new session's settings from the document's model and settings;
/// tokens are counted with `count`, times default to `now`, and a content
/// above `max_message_bytes` is refused. Every error leaves nothing behind.
/// What an import may hold, as the commands would take it.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A message's content (`mem.max-message-bytes`).
    pub message_bytes: u64,
    /// A message's `tokens` given by the document, as MEM.APPEND's TOKENS
    /// (`mem.max-tokens-limit`, and what a message can store).
    pub given_tokens: u64,
}

pub fn import<E>(
    text: &str,
    now: i64,
    limits: Limits,
    settings: impl FnOnce(DocSettings<'_>) -> Result<Settings, E>,
    count: impl Fn(Counting, &str, &str, Option<&str>) -> u64,
) -> Result<Imported, ImportError<E>> {
    let mut root = read_root(text)?;
    let history = root.history::<E>()?;
    let summary = root.summary::<E>(text)?;
    let model = root.model::<E>(text)?;
    let extra = root.attrs::<E>()?;
    let written_by_us = root.stored.is_some_and(|s| s.get() != "null");
    let stored = match root.stored.filter(|s| s.get() != "null") {
        Some(raw) => super::stored::parse(raw.get())?,
        None => StoredIn::default(),
    };
    let doc_settings = DocSettings {
        model: model.as_deref(),
        ttl: stored.ttl,
        max_tokens: stored.maxtokens,
        max_msgs: stored.maxmsgs,
        max_age: stored.maxage,
    };
    let settings = settings(doc_settings).map_err(ImportError::Settings)?;

    let encoding = settings.encoding;
    // The messages' counts of a FORMAT JSON document stand when the
    // session keeps its model (they may be a provider's, given with
    // TOKENS); another model, or another tool's document, counts anew.
    let keep_tokens = written_by_us && model.as_deref() == Some(&*settings.model);
    let mut session = Session::new(settings, now);
    if let Some(s) = summary {
        // Always the module's own count (MEM.SUMMARIZE takes no TOKENS).
        let tokens = count(
            Counting::new("", encoding),
            SUMMARY_COUNTED_AS,
            &s.text,
            None,
        );
        let summary = Summary {
            tokens,
            text: s.text,
            upto: s.upto,
            ts: s.ts.unwrap_or(now),
        };
        session.set_summary(summary).map_err(|e| e.to_string())?;
    }
    let mut builder = Builder::new(text, session, count, keep_tokens, now, limits);
    builder.stream(history)?;
    builder.finish();
    let mut session = builder.session;
    // A session holds a tool result first only after a summary covered its
    // call: the module's own document keeps one only where that is so (a
    // document that merely carries the member does not keep an orphan).
    let held_as_is = session_summarized(&session, &stored);
    let trimmed = builder.trimmed
        + if written_by_us && held_as_is {
            session.trim_imported_own(builder.trimmed)
        } else {
            session.trim_imported()
        };
    session.extra = extra;
    stored.apply(&mut session, now)?;
    Ok(Imported {
        session,
        trimmed,
        most_held: builder.most_held,
    })
}

/// Whether the imported session has, or had, a summary.
fn session_summarized(session: &Session, stored: &StoredIn) -> bool {
    session.summary.is_some() || stored.dropped_a_summary()
}

/// Members the module reads; everything else is kept verbatim.
const KNOWN: [&str; 5] = [
    "conversation_history",
    "summary",
    "total_tokens",
    "model",
    super::STORED_MEMBER,
];

/// The visitor methods of a value that is not an object: the visitor's
/// `None` (the caller names the shape error), an array skipped whole.
macro_rules! not_an_object {
    () => {
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            skip_seq(seq).map(|()| None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    };
}

/// The root object: the members the module reads (each at most once), raw;
/// the others as the text of their `"name":value` pairs, in order,
/// duplicates included (attributes, kept as written).
#[derive(Default)]
struct Root<'a> {
    history: Option<&'a RawValue>,
    summary: Option<&'a RawValue>,
    model: Option<&'a RawValue>,
    stored: Option<&'a RawValue>,
    extra: String,
    /// The same members as (raw name, raw value) pairs.
    pairs: Vec<(Box<str>, std::sync::Arc<str>)>,
}

impl<'a> Root<'a> {
    fn history<E>(&self) -> Result<&'a RawValue, ImportError<E>> {
        match self.history {
            Some(h) if h.get().starts_with('[') => Ok(h),
            Some(_) => Err("conversation_history must be an array".to_owned().into()),
            None => Err("the document has no conversation_history".to_owned().into()),
        }
    }

    fn summary<E>(&self, text: &str) -> Result<Option<ImportedSummary>, ImportError<E>> {
        Ok(match self.summary {
            None => None,
            Some(s) if s.get() == "null" => None,
            Some(s) if s.get().starts_with('{') => Some(parse_summary(text, s)?),
            Some(_) => return Err("summary must be an object or null".to_owned().into()),
        })
    }

    fn model<E>(&self, text: &str) -> Result<Option<String>, ImportError<E>> {
        Ok(match self.model {
            None => None,
            Some(m) if m.get() == "null" => None,
            Some(m) => match string(text, m)? {
                Some(m) if !m.is_empty() => Some(m),
                _ => return Err("model must be a non-empty string".to_owned().into()),
            },
        })
    }

    /// The other members, as attributes: checked as JSON and against the
    /// attribute limits (SPEC: imported members obey them).
    fn attrs<E>(&mut self) -> Result<Attrs, ImportError<E>> {
        if !self.extra.is_empty() {
            check_members(&format!("{{{}}}", self.extra))?;
        }
        // The attribute limits (SPEC: imported members obey them).
        if self.pairs.len() > MAX_ATTRS {
            return Err(format!(
                "a session holds at most {MAX_ATTRS} attributes; the document has {} other members",
                self.pairs.len()
            )
            .into());
        }
        for (raw, _) in &self.pairs {
            let name = member_name(raw).unwrap_or_default();
            if name.is_empty() || name.len() > MAX_ATTR_NAME_BYTES {
                return Err(format!("member name {raw:.80} must be 1 to {MAX_ATTR_NAME_BYTES} bytes (an attribute name)").into());
            }
            check_name_chars("a member name (an attribute name)", &name)?;
        }
        Ok(Attrs::from_raw(std::mem::take(&mut self.pairs)))
    }
}

fn read_root<E>(text: &str) -> Result<Root<'_>, ImportError<E>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let root = de
        .deserialize_any(RootVisitor)
        .and_then(|root| de.end().map(|()| root));
    match root {
        Ok(Some(root)) => Ok(root),
        Ok(None) => Err("the document must be a JSON object".to_owned().into()),
        Err(e) => Err(format!("not valid JSON: {e}").into()),
    }
}

struct RootVisitor;

impl<'de> Visitor<'de> for RootVisitor {
    /// None: the document is not an object.
    type Value = Option<Root<'de>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut root = Root::default();
        while let Some(name) = map.next_key::<&'de RawValue>()? {
            let value: &'de RawValue = map.next_value()?;
            let read = match member_name(name.get()).as_deref() {
                Some("conversation_history") => Some(("conversation_history", &mut root.history)),
                Some("summary") => Some(("summary", &mut root.summary)),
                Some("model") => Some(("model", &mut root.model)),
                Some(super::STORED_MEMBER) => Some((super::STORED_MEMBER, &mut root.stored)),
                _ => None,
            };
            // A member the module reads, given twice, is refused (as
            // MEM.APPENDBATCH's parse refuses it): the last standing
            // silently dropped a whole first conversation_history.
            if let Some((name, slot)) = read {
                if slot.replace(value).is_some() {
                    return Err(de::Error::duplicate_field(name));
                }
                continue;
            }
            match member_name(name.get()).as_deref() {
                Some(known) if KNOWN.contains(&known) => {}
                // Kept as written; a name that does not decode (a lone
                // surrogate) is refused by check_members.
                _ => {
                    if !root.extra.is_empty() {
                        root.extra.push(',');
                    }
                    root.extra.push_str(name.get());
                    root.extra.push(':');
                    root.extra.push_str(value.get());
                    root.pairs.push((name.get().into(), value.get().into()));
                }
            }
        }
        Ok(Some(root))
    }

    not_an_object!();
}

/// Consumes an array the caller does not want (serde_json needs it read).
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// The decoded name of a member, from its raw text (borrowed unless it has
/// escapes); None when it does not decode.
fn member_name(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
}

/// A member name, borrowed from the document when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// The members named `names` of one object, raw (the last wins when a name
/// repeats), and the others when `others` (else skipped); None when the
/// value is not an object.
#[derive(Clone, Copy)]
struct Fields<const N: usize> {
    names: &'static [&'static str; N],
    others: bool,
}

type Raw<'a, const N: usize> = [Option<&'a RawValue>; N];

/// An object's members not among the names read, in document order.
type Others<'a> = Vec<(Cow<'a, str>, &'a RawValue)>;

impl<'de, const N: usize> DeserializeSeed<'de> for Fields<N> {
    type Value = Option<(Raw<'de, N>, Others<'de>)>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for Fields<N> {
    type Value = Option<(Raw<'de, N>, Others<'de>)>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut values = [None; N];
        let mut others = Vec::new();
        while let Some(Key(name)) = map.next_key()? {
            let known = self.names.iter().position(|n| *n == name);
            match known.and_then(|i| Some((self.names[i], values.get_mut(i)?))) {
                // Refused, as MEM.APPENDBATCH's parse refuses it: the last
                // standing silently dropped the first (two `content`s).
                Some((name, Some(_))) => return Err(de::Error::duplicate_field(name)),
                Some((_, slot)) => *slot = Some(map.next_value()?),
                None if self.others => others.push((name, map.next_value()?)),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some((values, others)))
    }

    not_an_object!();
}

/// A message's members MEM.IMPORT does not read (an OpenAI-shaped
/// history's `tool_calls`, `tool_call_id`, `name`) moved into its META, so
/// an import drops nothing (they were skipped silently). Null members carry
/// nothing and are left out; a name META also has is refused (which of the
/// two to keep is the client's call), and so is a name repeated.
fn fold_into_meta(meta: Option<String>, others: Others<'_>) -> Result<Option<String>, String> {
    let mut names = std::collections::HashSet::with_capacity(others.len());
    if let Some((name, _)) = others.iter().find(|(n, _)| !names.insert(&**n)) {
        return Err(format!("member {name:?} is given twice"));
    }
    let others: Vec<_> = others.iter().filter(|(_, v)| v.get() != "null").collect();
    if others.is_empty() {
        return Ok(meta);
    }
    let (mut text, held) = match &meta {
        Some(m) => {
            let names: std::collections::HashMap<String, IgnoredAny> =
                serde_json::from_str(m).map_err(|e| format!("meta is not valid JSON: {e}"))?;
            if let Some((name, _)) = others.iter().find(|(n, _)| names.contains_key(&**n)) {
                return Err(format!(
                    "member {name:?} is both the message's and its meta's (MEM.IMPORT moves a message's other members into its meta)"
                ));
            }
            // A checked object: `{`, its members, `}`.
            let inner = m.trim();
            let inner = inner.strip_prefix('{').unwrap_or(inner);
            let inner = inner.strip_suffix('}').unwrap_or(inner);
            (format!("{{{inner}"), !names.is_empty())
        }
        None => ("{".to_owned(), false),
    };
    for (i, (name, value)) in others.iter().enumerate() {
        if held || i > 0 {
            text.push(',');
        }
        let name = serde_json::to_string(&**name).map_err(|e| e.to_string())?;
        text.push_str(&name);
        text.push(':');
        text.push_str(value.get());
    }
    text.push('}');
    check_meta(&text)?;
    Ok(Some(text))
}

const MESSAGE_FIELDS: [&str; 8] = [
    "role",
    "content",
    "meta",
    "id",
    "ts",
    "timestamp",
    "msgid",
    "tokens",
];
const SUMMARY_FIELDS: [&str; 5] = ["content", "text", "upto", "ts", "timestamp"];

/// A failure inside one message: of its shape (reported with the
/// message's index), or of its JSON (reported as a parse of the whole
/// document reports it).
enum Bad {
    Shape(String),
    Json(String),
}

impl From<String> for Bad {
    fn from(e: String) -> Bad {
        Bad::Shape(e)
    }
}

impl<E> From<Bad> for ImportError<E> {
    fn from(b: Bad) -> Self {
        match b {
            Bad::Shape(e) | Bad::Json(e) => ImportError::Invalid(e),
        }
    }
}

/// serde_json's error on `part` (a slice of `doc`), placed in `doc`, as a
/// parse of the whole document would have reported it.
fn invalid_json(doc: &str, part: &str, e: &serde_json::Error) -> String {
    let msg = e.to_string();
    let what = msg
        .rsplit_once(" at line ")
        .map_or(msg.as_str(), |(what, _)| what);
    let offset = (part.as_ptr() as usize).checked_sub(doc.as_ptr() as usize);
    match offset.and_then(|o| doc.as_bytes().get(..o)) {
        Some(before) if e.line() > 0 => {
            let lines = before.iter().filter(|b| **b == b'\n').count();
            let column = before.len()
                - before
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |p| p + 1);
            let (line, column) = match e.line() {
                1 => (lines + 1, column + e.column()),
                l => (lines + l, e.column()),
            };
            format!("not valid JSON: {what} at line {line} column {column}")
        }
        _ => format!("not valid JSON: {msg}"),
    }
}

/// The string a raw value holds; None when it is not a string.
fn string(doc: &str, raw: &RawValue) -> Result<Option<String>, Bad> {
    if !raw.get().starts_with('"') {
        return Ok(None);
    }
    serde_json::from_str(raw.get())
        .map(Some)
        .map_err(|e| Bad::Json(invalid_json(doc, raw.get(), &e)))
}

fn optional_id(what: &str, raw: Option<&RawValue>) -> Result<Option<u64>, String> {
    match raw.filter(|r| r.get() != "null") {
        None => Ok(None),
        Some(r) => match serde_json::from_str::<u64>(r.get()) {
            Ok(id) if (1..=MAX_ID).contains(&id) => Ok(Some(id)),
            _ => Err(format!("{what} must be an integer from 1 to {MAX_ID}")),
        },
    }
}

/// A `tokens` the document gives (FORMAT JSON writes each entry's): an
/// integer up to what a message may count.
fn stored_tokens(what: &str, raw: Option<&RawValue>) -> Result<Option<u64>, String> {
    match raw.filter(|r| r.get() != "null") {
        None => Ok(None),
        Some(r) => match serde_json::from_str::<u64>(r.get()) {
            Ok(n) if n <= MAX_MESSAGE_TOKENS => Ok(Some(n)),
            _ => Err(format!(
                "{what} must be an integer from 0 to {MAX_MESSAGE_TOKENS}"
            )),
        },
    }
}

/// `ts` (ms) wins over `timestamp` (ISO 8601); neither: None.
fn time_of(
    doc: &str,
    ts: Option<&RawValue>,
    timestamp: Option<&RawValue>,
) -> Result<Option<i64>, Bad> {
    let ts = if let Some(ts) = ts.filter(|r| r.get() != "null") {
        serde_json::from_str::<i64>(ts.get()).map_err(|_| "ts must be an integer".to_owned())?
    } else {
        match timestamp.filter(|r| r.get() != "null") {
            None => return Ok(None),
            Some(t) => match string(doc, t)? {
                Some(s) => {
                    parse_iso8601(&s).ok_or_else(|| format!("timestamp {s:?} is not ISO 8601"))?
                }
                None if t
                    .get()
                    .starts_with(|c: char| c == '-' || c.is_ascii_digit()) =>
                {
                    unix_time(t.get())?
                }
                None => return Err("timestamp must be an ISO 8601 string".to_owned().into()),
            },
        }
    };
    if !(0..=MAX_TS).contains(&ts) {
        return Err(format!("time {ts} is outside 1970-01-01 .. 9999-12-31").into());
    }
    Ok(Some(ts))
}

/// A numeric `timestamp`: Unix time in seconds when below 10^11 (until
/// 5138), fractions allowed (Python's `time.time()`), else milliseconds.
pub(super) fn unix_time(raw: &str) -> Result<i64, String> {
    const SECONDS_BELOW: f64 = 1e11;
    let bad = || format!("timestamp {raw} is not a Unix time (seconds or milliseconds)");
    let t: f64 = serde_json::from_str(raw).map_err(|_| bad())?;
    if !t.is_finite() || t < 0.0 {
        return Err(bad());
    }
    let ms = if t < SECONDS_BELOW { t * 1000.0 } else { t };
    // Exact for integers: i64 from a float below 2^53 ms (year 285,000).
    if ms > MAX_TS as f64 {
        return Err(format!("time {raw} is outside 1970-01-01 .. 9999-12-31"));
    }
    Ok(ms.round() as i64)
}

struct ImportedSummary {
    text: String,
    upto: u64,
    ts: Option<i64>,
}

fn parse_summary(doc: &str, raw: &RawValue) -> Result<ImportedSummary, Bad> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let fields = Fields {
        names: &SUMMARY_FIELDS,
        others: false,
    }
    .deserialize(&mut de)
    .map_err(|e| Bad::Json(invalid_json(doc, raw.get(), &e)))?;
    let Some(([content, text, upto, ts, timestamp], _)) = fields else {
        return Err("summary must be an object or null".to_owned().into());
    };
    let text = match content.or(text) {
        Some(t) => string(doc, t)?,
        None => None,
    };
    let text = text.ok_or_else(|| "summary.content must be a string".to_owned())?;
    let upto = optional_id("summary.upto", upto)?
        .ok_or_else(|| format!("summary.upto must be an integer from 1 to {MAX_ID}"))?;
    Ok(ImportedSummary {
        text,
        upto,
        ts: time_of(doc, ts, timestamp)?,
    })
}

struct ImportedMessage {
    id: Option<u64>,
    role: String,
    content: String,
    /// `"content": null`, read as "": allowed only on a turn that calls
    /// tools (OpenAI's shape), which the caller checks once META is whole.
    content_null: bool,
    ts: Option<i64>,
    meta: Option<String>,
    msgid: Option<String>,
    tokens: Option<u64>,
}

fn parse_message(doc: &str, fields: Raw<'_, 8>) -> Result<ImportedMessage, Bad> {
    let [role, content, meta, id, ts, timestamp, msgid, tokens] = fields;
    let role = match role {
        Some(r) => string(doc, r)?,
        None => None,
    };
    let role = role
        .filter(|r| !r.is_empty() && r.len() <= MAX_ROLE_BYTES)
        .ok_or_else(|| format!("role must be a string of 1 to {MAX_ROLE_BYTES} bytes"))?;
    check_name_chars("role", &role)?;
    let content_null = content.is_some_and(|c| c.get() == "null");
    let content = match content {
        Some(_) if content_null => Some(String::new()),
        Some(c) => string(doc, c)?,
        None => None,
    };
    let content = content.ok_or_else(|| "content must be a string".to_owned())?;
    let meta = match meta.filter(|m| m.get() != "null") {
        None => None,
        Some(m) if m.get().starts_with('{') => {
            check_meta(m.get())?;
            Some(m.get().to_owned())
        }
        Some(_) => return Err("meta must be an object".to_owned().into()),
    };
    let msgid = match msgid.filter(|m| m.get() != "null") {
        None => None,
        Some(m) => {
            let msgid = string(doc, m)?.ok_or_else(|| "msgid must be a string".to_owned())?;
            check_msgid(&msgid)?;
            check_name_chars("msgid", &msgid)?;
            Some(msgid)
        }
    };
    Ok(ImportedMessage {
        id: optional_id("id", id)?,
        role,
        content,
        content_null,
        ts: time_of(doc, ts, timestamp)?,
        meta,
        msgid,
        tokens: stored_tokens("tokens", tokens)?,
    })
}

/// The session being built as the history streams by.
struct Builder<'a, C, E> {
    doc: &'a str,
    session: Session,
    count: C,
    /// Whether the document's `tokens` stand (it keeps its model).
    keep_tokens: bool,
    now: i64,
    max_message_bytes: u64,
    max_given_tokens: u64,
    /// Whether the messages carry ids (as the first one does).
    with_ids: Option<bool>,
    index: usize,
    trimmed: u64,
    most_held: usize,
    /// The newest tool group so far (its messages, and whether each one is
    /// past `maxage`): whether it ages out is known once it is complete, at
    /// the next message that is not a tool result (as `Session::evict_aged`
    /// decides on a whole list: a group goes when all of it is old).
    open_group: usize,
    open_group_old: bool,
    /// Why a message was refused (serde_json only sees that it was).
    failed: Option<ImportError<E>>,
    /// Every msgid the document gave so far: only a msgid seen before can
    /// be a session's already, so only that one is looked up in it (each
    /// looked up scanned the held ones: 50,000 messages with msgids took a
    /// worker 35 s).
    msgids_seen: std::collections::HashSet<Box<str>>,
}

impl<'a, C, E> Builder<'a, C, E> {
    fn new(
        doc: &'a str,
        session: Session,
        count: C,
        keep_tokens: bool,
        now: i64,
        limits: Limits,
    ) -> Builder<'a, C, E> {
        Builder {
            doc,
            session,
            count,
            keep_tokens,
            now,
            max_message_bytes: limits.message_bytes,
            max_given_tokens: limits.given_tokens.min(MAX_MESSAGE_TOKENS),
            with_ids: None,
            index: 0,
            trimmed: 0,
            most_held: 0,
            open_group: 0,
            open_group_old: false,
            failed: None,
            msgids_seen: std::collections::HashSet::new(),
        }
    }
}

impl<C: Fn(Counting, &str, &str, Option<&str>) -> u64, E> Builder<'_, C, E> {
    /// Streams the history through `push`: a message it refused is the
    /// error (serde_json only sees that one was), else serde_json's.
    fn stream(&mut self, history: &RawValue) -> Result<(), ImportError<E>> {
        let mut de = serde_json::Deserializer::from_str(history.get());
        let streamed = de.deserialize_seq(History(self)).and_then(|()| de.end());
        if let Some(failed) = self.failed.take() {
            return Err(failed);
        }
        streamed.map_err(|e| invalid_json(self.doc, history.get(), &e))?;
        Ok(())
    }

    fn push(&mut self, fields: Option<(Raw<'_, 8>, Others<'_>)>) -> Result<(), ImportError<E>> {
        let i = self.index;
        self.index += 1;
        let at = |e: Bad| match e {
            Bad::Shape(e) => ImportError::Invalid(format!("conversation_history[{i}]: {e}")),
            Bad::Json(e) => ImportError::Invalid(e),
        };
        let (fields, others) =
            fields.ok_or_else(|| at(Bad::Shape("a message must be an object".to_owned())))?;
        let mut m = parse_message(self.doc, fields).map_err(at)?;
        m.meta = fold_into_meta(m.meta, others).map_err(|e| at(Bad::Shape(e)))?;
        if m.content_null && !crate::session::meta_calls_tools(m.meta.as_deref()) {
            return Err(at(Bad::Shape(
                "content must be a string (null only on a message with tool calls)".to_owned(),
            )));
        }
        if m.content.len() as u64 > self.max_message_bytes {
            return Err(ImportError::TooLarge(m.content.len()));
        }
        if *self.with_ids.get_or_insert(m.id.is_some()) != m.id.is_some() {
            return Err("either every message carries an id or none does"
                .to_owned()
                .into());
        }
        let id = match m.id {
            Some(id) => id,
            None => next_id(self.session.last_id).map_err(|e| e.to_string())?,
        };
        let message = Message {
            id,
            tokens: self.tokens_of(m.tokens, &m.role, &m.content, m.meta.as_deref())?,
            role: m.role.into(),
            content: m.content.into(),
            ts: m.ts.unwrap_or(self.now),
            meta: m.meta.map(std::sync::Arc::from),
        };
        let is_tool = &*message.role == TOOL_ROLE;
        let old = self
            .session
            .age_cutoff(self.now)
            .is_some_and(|c| message.ts < c);
        // A msgid names one message: two with the same one would make a
        // retry of either ambiguous (checked against those still held and
        // the last departed: the parse holds no more than the caps).
        if let Some(msgid) = m.msgid.as_deref() {
            if !self.msgids_seen.insert(msgid.into()) && self.session.find_msgid(msgid).is_some() {
                return Err(format!("conversation_history[{i}]: msgid {msgid:?} is already the msgid of an earlier message").into());
            }
        }
        if !is_tool {
            self.close_group();
        }
        let id = message.id;
        self.session
            .push_message(message)
            .map_err(|e| e.to_string())?;
        if let Some(msgid) = m.msgid {
            self.session.msgids.attach(id, msgid.into());
        }
        self.join_group(old);
        self.most_held = self.most_held.max(self.session.messages.len());
        Ok(())
    }

    /// A message's tokens: the document's where they stand (bounded as
    /// TOKENS is), else counted.
    fn tokens_of(
        &self,
        given: Option<u64>,
        role: &str,
        content: &str,
        meta: Option<&str>,
    ) -> Result<u64, ImportError<E>> {
        match given.filter(|_| self.keep_tokens) {
            Some(n) if n > self.max_given_tokens => Err(format!(
                "conversation_history[{}]: tokens {n} is above {} (mem.max-tokens-limit)",
                self.index, self.max_given_tokens
            )
            .into()),
            Some(n) => Ok(n),
            None => {
                let settings = &self.session.settings;
                let counting = Counting::new(&settings.model, settings.encoding);
                Ok((self.count)(counting, role, content, meta))
            }
        }
    }

    /// The message pushed joins the newest group (a message that is not a
    /// tool result opened a new one); `old`: past maxage.
    fn join_group(&mut self, old: bool) {
        self.open_group_old = if self.open_group == 0 {
            old
        } else {
            self.open_group_old && old
        };
        self.open_group += 1;
    }

    /// The newest tool group is complete: past `maxage` as a whole, it goes
    /// (before the caps are applied, as evict_aged and then trim_imported
    /// would do on the whole list); then the caps, on complete groups only.
    fn close_group(&mut self) {
        self.finish();
        self.trimmed += self
            .session
            .evict_over_caps(self.session.settings.caps(), 0);
        self.session.messages.settle();
    }

    /// The newest group's age decided (after the last message, the caps are
    /// then applied by `trim_imported`, which spares the newest group).
    fn finish(&mut self) {
        if self.open_group > 0 && self.open_group_old {
            for _ in 0..self.open_group {
                self.session.evict_newest();
            }
            self.trimmed += self.open_group as u64;
        }
        self.open_group = 0;
        self.open_group_old = false;
    }
}

/// `conversation_history`, one element at a time into the builder.
struct History<'b, 'a, C, E>(&'b mut Builder<'a, C, E>);

impl<'de, C: Fn(Counting, &str, &str, Option<&str>) -> u64, E> Visitor<'de>
    for History<'_, '_, C, E>
{
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let fields = Fields {
            names: &MESSAGE_FIELDS,
            others: true,
        };
        while let Some(fields) = seq.next_element_seed(fields)? {
            if let Err(e) = self.0.push(fields) {
                self.0.failed = Some(e);
                return Err(de::Error::custom("message refused"));
            }
        }
        Ok(())
    }
}
