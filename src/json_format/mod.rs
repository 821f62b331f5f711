//! The JSON document of `MEM.GET ... FORMAT JSON` and `MEM.IMPORT`: the shape
//! client-side JSON memory already uses (`conversation_history` with ISO 8601
//! `timestamp`s), so clients moving to the module keep their parser.

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use serde::Serialize;

use crate::session::{MessageRef, Session, Summary};

mod import;
#[cfg(test)]
mod reference;
mod stored;
#[cfg(test)]
mod tests;

pub use import::{import, DocSettings, ImportError, Imported, Limits};
pub use stored::STORED_MEMBER;

/// ISO 8601 UTC with milliseconds, e.g. `2025-01-31T12:00:00.000Z`.
pub fn iso8601(ts_ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ts_ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// Parses an ISO 8601 time, with or without a zone (UTC when none), to ms.
pub fn parse_iso8601(s: &str) -> Option<i64> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_millis());
    }
    [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
    ]
    .iter()
    .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
    .map(|t| t.and_utc().timestamp_millis())
}

/// A message of the document, but its `meta` and `msgid` (written after
/// it by [`write_message`]).
#[derive(Serialize)]
struct MessageOut<'a> {
    id: u64,
    role: &'a str,
    content: &'a str,
    timestamp: String,
    ts: i64,
    tokens: u64,
}

#[derive(Serialize)]
struct SummaryOut<'a> {
    content: &'a str,
    upto: u64,
    tokens: u64,
    timestamp: String,
    ts: i64,
}

/// Appends `value` as JSON (a string, number or struct: serde_json cannot
/// fail on these).
fn push_json(out: &mut Vec<u8>, value: &impl Serialize) {
    let _ = serde_json::to_writer(&mut *out, value);
}

/// One message: its fields, then its META as stored (checked JSON when it
/// was stored or loaded, so it is spliced in, not parsed again: a 2 MB META
/// re-parsed on every FORMAT JSON held the main thread 14 ms), then its msgid.
fn write_message(out: &mut Vec<u8>, m: &MessageRef<'_>, msgid: Option<&str>) {
    let head = MessageOut {
        id: m.id,
        role: m.role,
        content: m.content,
        timestamp: iso8601(m.ts),
        ts: m.ts,
        tokens: m.tokens,
    };
    push_json(out, &head);
    out.pop(); // the closing brace: more members follow
    if let Some(meta) = m.meta {
        out.extend_from_slice(b",\"meta\":");
        out.extend_from_slice(meta.as_bytes());
    }
    if let Some(msgid) = msgid {
        out.extend_from_slice(b",\"msgid\":");
        push_json(out, &msgid);
    }
    out.push(b'}');
}

/// Renders the document for the chosen summary and messages of `session`
/// (`None`: a missing key, rendered with an empty history): its members in
/// the order `conversation_history`, `summary`, `total_tokens`, `model`,
/// `redis_mem`, then the members an import carried (`user_profile`,
/// `context`, ...), verbatim.
pub fn render<'a>(
    session: Option<&'a Session>,
    summary: Option<&'a Summary>,
    messages: impl Iterator<Item = MessageRef<'a>> + Clone,
    default_model: &'a str,
    now: i64,
) -> Vec<u8> {
    // Sized once: growing a 40 MB document by doubling copied it twice
    // over and faulted in every new page.
    let estimate: usize = messages
        .clone()
        .map(|m| 128 + m.role.len() + m.content.len() + m.meta.map_or(0, str::len))
        .sum();
    let mut out: Vec<u8> = Vec::with_capacity(256 + estimate);
    out.extend_from_slice(b"{\"conversation_history\":[");
    for (i, m) in messages.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_message(&mut out, &m, session.and_then(|s| s.msgids.of(m.id)));
    }
    out.extend_from_slice(b"],\"summary\":");
    let summary = summary.map(|s| SummaryOut {
        content: &s.text,
        upto: s.upto,
        tokens: s.tokens,
        timestamp: iso8601(s.ts),
        ts: s.ts,
    });
    push_json(&mut out, &summary);
    out.extend_from_slice(b",\"total_tokens\":");
    push_json(&mut out, &session.map_or(0, |s| s.total_tokens));
    out.extend_from_slice(b",\"model\":");
    push_json(
        &mut out,
        &session.map_or(default_model, |s| &*s.settings.model),
    );
    if let Some(s) = session {
        out.extend_from_slice(b",\"redis_mem\":");
        push_json(&mut out, &stored::StoredOut::of(s, now));
    }
    // Attributes live at `now` (one past its own expiry is not shown).
    if let Some(extra) = session.map(|s| &s.extra).filter(|e| e.any_live(now)) {
        out.push(b',');
        extra.write_live_members(&mut out, now);
    }
    out.push(b'}');
    out
}
