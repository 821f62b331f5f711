//! The import this module replaced (serde_json `Value`, every message
//! parsed, then counted and trimmed), kept as it was for the tests to
//! compare the streaming import against on random documents.

use serde_json::{Map, Value};

use super::parse_iso8601;
use crate::session::{
    check_members, check_meta, next_id, Message, Session, Settings, Summary, MAX_ID,
    MAX_ROLE_BYTES, MAX_TS,
};
use crate::tokenizer::{Counting, SUMMARY_COUNTED_AS};

/// MEM.IMPORT as it was: parse everything, check sizes, settings from the
/// document's model, build, then trim. The session and messages trimmed.
pub fn import(
    text: &str,
    now: i64,
    max_message_bytes: u64,
    settings: impl FnOnce(Option<&str>) -> Settings,
    count: impl Fn(Counting, &str, &str, Option<&str>) -> u64,
) -> Result<(Session, u64), String> {
    let doc = parse_import(text)?;
    if doc
        .messages
        .iter()
        .any(|m| m.content.len() as u64 > max_message_bytes)
    {
        return Err("too large".to_owned());
    }
    let settings = settings(doc.model.as_deref());
    let mut session = doc.into_session(settings, now, count)?;
    let trimmed = session.trim_imported();
    Ok((session, trimmed))
}

/// A document parsed for MEM.IMPORT, before tokens are counted.
#[derive(Debug, PartialEq)]
pub struct ImportedDoc {
    pub messages: Vec<ImportedMessage>,
    pub summary: Option<ImportedSummary>,
    pub model: Option<String>,
    pub extra: Option<String>,
}

#[derive(Debug, PartialEq)]
pub struct ImportedMessage {
    pub id: Option<u64>,
    pub role: String,
    pub content: String,
    pub ts: Option<i64>,
    pub meta: Option<String>,
}

#[derive(Debug, PartialEq)]
pub struct ImportedSummary {
    pub text: String,
    pub upto: u64,
    pub ts: Option<i64>,
}

/// Members the module reads; everything else is kept as `extra`.
const KNOWN: [&str; 4] = ["conversation_history", "summary", "total_tokens", "model"];

pub fn parse_import(text: &str) -> Result<ImportedDoc, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(mut root) = root else {
        return Err("the document must be a JSON object".to_owned());
    };
    let history = match root.remove("conversation_history") {
        Some(Value::Array(items)) => items,
        Some(_) => return Err("conversation_history must be an array".to_owned()),
        None => return Err("the document has no conversation_history".to_owned()),
    };
    let messages = history
        .into_iter()
        .enumerate()
        .map(|(i, item)| parse_message(item).map_err(|e| format!("conversation_history[{i}]: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let summary = match root.remove("summary") {
        None | Some(Value::Null) => None,
        Some(Value::Object(s)) => Some(parse_summary(s)?),
        Some(_) => return Err("summary must be an object or null".to_owned()),
    };
    let model = match root.remove("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) if !m.is_empty() => Some(m),
        Some(_) => return Err("model must be a non-empty string".to_owned()),
    };
    root.retain(|k, _| !KNOWN.contains(&k.as_str()));
    let extra = match root.is_empty() {
        true => None,
        false => {
            let members = Value::Object(root).to_string();
            check_members(&members)?;
            Some(members)
        }
    };
    Ok(ImportedDoc {
        messages,
        summary,
        model,
        extra,
    })
}

fn parse_message(item: Value) -> Result<ImportedMessage, String> {
    let Value::Object(mut m) = item else {
        return Err("a message must be an object".to_owned());
    };
    let role = match m.remove("role") {
        Some(Value::String(r)) if !r.is_empty() && r.len() <= MAX_ROLE_BYTES => r,
        _ => {
            return Err(format!(
                "role must be a string of 1 to {MAX_ROLE_BYTES} bytes"
            ))
        }
    };
    let content = match m.remove("content") {
        Some(Value::String(c)) => c,
        _ => return Err("content must be a string".to_owned()),
    };
    let meta = match m.remove("meta") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Object(_)) => {
            let meta = v.to_string();
            check_meta(&meta)?;
            Some(meta)
        }
        Some(_) => return Err("meta must be an object".to_owned()),
    };
    Ok(ImportedMessage {
        id: optional_id("id", m.get("id"))?,
        role,
        content,
        ts: time_of(&m)?,
        meta,
    })
}

fn parse_summary(s: Map<String, Value>) -> Result<ImportedSummary, String> {
    let text = match s.get("content").or_else(|| s.get("text")) {
        Some(Value::String(t)) => t.clone(),
        _ => return Err("summary.content must be a string".to_owned()),
    };
    let upto = optional_id("summary.upto", s.get("upto"))?
        .ok_or_else(|| format!("summary.upto must be an integer from 1 to {MAX_ID}"))?;
    Ok(ImportedSummary {
        text,
        upto,
        ts: time_of(&s)?,
    })
}

fn optional_id(what: &str, v: Option<&Value>) -> Result<Option<u64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(id) if (1..=MAX_ID).contains(&id) => Ok(Some(id)),
            _ => Err(format!("{what} must be an integer from 1 to {MAX_ID}")),
        },
    }
}

/// `ts` (ms) wins over `timestamp` (ISO 8601); neither: None.
fn time_of(m: &Map<String, Value>) -> Result<Option<i64>, String> {
    let ts = if let Some(ts) = m.get("ts").filter(|v| !v.is_null()) {
        ts.as_i64()
            .ok_or_else(|| "ts must be an integer".to_owned())?
    } else {
        match m.get("timestamp") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => {
                parse_iso8601(s).ok_or_else(|| format!("timestamp {s:?} is not ISO 8601"))?
            }
            Some(Value::Number(n)) => super::import::unix_time(&n.to_string())?,
            Some(_) => return Err("timestamp must be an ISO 8601 string".to_owned()),
        }
    };
    if !(0..=MAX_TS).contains(&ts) {
        return Err(format!("time {ts} is outside 1970-01-01 .. 9999-12-31"));
    }
    Ok(Some(ts))
}

impl ImportedDoc {
    /// Builds the session through the same core operations as writes
    /// (summary first, then each message as the newest): ids from the
    /// document or from 1, tokens counted with `encoding` (through `count`),
    /// times defaulting to `now`.
    pub fn into_session(
        self,
        settings: Settings,
        now: i64,
        count: impl Fn(Counting, &str, &str, Option<&str>) -> u64,
    ) -> Result<Session, String> {
        let encoding = settings.encoding;
        let mut session = Session::new(settings, now);
        if let Some(s) = self.summary {
            let summary = Summary {
                tokens: count(
                    Counting::new("", encoding),
                    SUMMARY_COUNTED_AS,
                    &s.text,
                    None,
                ),
                text: s.text,
                upto: s.upto,
                ts: s.ts.unwrap_or(now),
            };
            session.set_summary(summary).map_err(|e| e.to_string())?;
        }
        let with_ids = self.messages.iter().filter(|m| m.id.is_some()).count();
        if with_ids != 0 && with_ids != self.messages.len() {
            return Err("either every message carries an id or none does".to_owned());
        }
        for m in self.messages {
            let id = match m.id {
                Some(id) => id,
                None => next_id(session.last_id).map_err(|e| e.to_string())?,
            };
            let message = Message {
                id,
                tokens: count(
                    Counting::new(&session.settings.model, encoding),
                    &m.role,
                    &m.content,
                    m.meta.as_deref(),
                ),
                role: m.role.into(),
                content: m.content.into(),
                ts: m.ts.unwrap_or(now),
                meta: m.meta.map(std::sync::Arc::from),
            };
            session.push_message(message).map_err(|e| e.to_string())?;
        }
        session.extra = crate::session::Attrs::from_text(self.extra.as_deref()).unwrap_or_default();
        Ok(session)
    }
}
