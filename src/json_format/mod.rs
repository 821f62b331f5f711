//! The JSON document of `MEM.GET ... FORMAT JSON` and `MEM.IMPORT`: the shape
//! client-side JSON memory already uses (`conversation_history` with ISO 8601
//! `timestamp`s), so clients moving to the module keep their parser.

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::session::{MessageRef, Session, Summary};

mod import;
mod stored;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

pub use import::{import, DocSettings, ImportError, Imported};
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
    ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(s, f).ok())
        .map(|t| t.and_utc().timestamp_millis())
}

#[derive(Serialize)]
struct MessageOut<'a> {
    id: u64,
    role: &'a str,
    content: &'a str,
    timestamp: String,
    ts: i64,
    tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msgid: Option<&'a str>,
}

#[derive(Serialize)]
struct SummaryOut<'a> {
    content: &'a str,
    upto: u64,
    tokens: u64,
    timestamp: String,
    ts: i64,
}

#[derive(Serialize)]
struct DocumentOut<'a> {
    conversation_history: Vec<MessageOut<'a>>,
    summary: Option<SummaryOut<'a>>,
    total_tokens: u64,
    model: &'a str,
    /// What else the session holds (settings, external ids, departed
    /// msgids), so that MEM.IMPORT of this document gives the same session.
    #[serde(skip_serializing_if = "Option::is_none")]
    redis_mem: Option<stored::StoredOut<'a>>,
}

fn raw_json(text: &str) -> Option<&RawValue> {
    serde_json::from_str(text).ok()
}

/// Renders the document for the chosen summary and messages of `session`
/// (`None`: a missing key, rendered with an empty history).
pub fn render<'a>(
    session: Option<&'a Session>,
    summary: Option<&'a Summary>,
    messages: impl Iterator<Item = MessageRef<'a>>,
    default_model: &'a str,
) -> String {
    let doc = DocumentOut {
        conversation_history: messages
            .map(|m| MessageOut {
                id: m.id,
                role: m.role,
                content: m.content,
                timestamp: iso8601(m.ts),
                ts: m.ts,
                tokens: m.tokens,
                meta: m.meta.and_then(raw_json),
                msgid: session.and_then(|s| s.msgids.of(m.id)),
            })
            .collect(),
        summary: summary.map(|s| SummaryOut {
            content: &s.text,
            upto: s.upto,
            tokens: s.tokens,
            timestamp: iso8601(s.ts),
            ts: s.ts,
        }),
        total_tokens: session.map_or(0, |s| s.total_tokens),
        model: session.map_or(default_model, |s| s.settings.model.as_str()),
        redis_mem: session.map(stored::StoredOut::of),
    };
    let mut out = serde_json::to_string(&doc).unwrap_or_default();
    // Members an import carried (user_profile, context, ...) go back at the
    // top level, verbatim.
    if let Some(extra) = session.map(|s| &s.extra).filter(|e| !e.is_empty()) {
        if out.ends_with('}') {
            out.pop();
            out.push(',');
            extra.write_members(&mut out);
            out.push('}');
        }
    }
    out
}

