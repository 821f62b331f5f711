//! The JSON document of `MEM.GET ... FORMAT JSON` and `MEM.IMPORT`: the shape
//! client-side JSON memory already uses (`conversation_history` with ISO 8601
//! `timestamp`s), so clients moving to the module keep their parser.

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::session::{check_members, check_meta, check_msgid, next_id, Message, Session, Settings, Summary, MAX_ID, MAX_ROLE_BYTES, MAX_TS};
use crate::tokenizer::{Encoding, SUMMARY_COUNTED_AS};

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
}

fn raw_json(text: &str) -> Option<&RawValue> {
    serde_json::from_str(text).ok()
}

/// Renders the document for the chosen summary and messages of `session`
/// (`None`: a missing key, rendered with an empty history).
pub fn render<'a>(
    session: Option<&'a Session>,
    summary: Option<&'a Summary>,
    messages: impl Iterator<Item = &'a Message>,
    default_model: &'a str,
) -> String {
    let doc = DocumentOut {
        conversation_history: messages
            .map(|m| MessageOut {
                id: m.id,
                role: &m.role,
                content: &m.content,
                timestamp: iso8601(m.ts),
                ts: m.ts,
                tokens: m.tokens,
                meta: m.meta.as_deref().and_then(raw_json),
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
    };
    let mut out = serde_json::to_string(&doc).unwrap_or_default();
    // Members an import carried (user_profile, context, ...) go back at the
    // top level, verbatim.
    if let Some(extra) = session.and_then(|s| s.extra.as_deref()) {
        let inner = extra
            .trim()
            .strip_prefix('{')
            .and_then(|e| e.strip_suffix('}'))
            .map_or("", str::trim);
        if !inner.is_empty() && out.ends_with('}') {
            out.pop();
            out.push(',');
            out.push_str(inner);
            out.push('}');
        }
    }
    out
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
    pub msgid: Option<String>,
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
    check_unique_msgids(&messages)?;
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
        _ => return Err(format!("role must be a string of 1 to {MAX_ROLE_BYTES} bytes")),
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
    let msgid = match m.remove("msgid") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => {
            check_msgid(&id)?;
            Some(id)
        }
        Some(_) => return Err("msgid must be a string".to_owned()),
    };
    Ok(ImportedMessage {
        id: optional_id("id", m.get("id"))?,
        role,
        content,
        ts: time_of(&m)?,
        meta,
        msgid,
    })
}

/// A msgid names one message: a document that gives two the same one
/// would make a retry of either ambiguous.
fn check_unique_msgids(messages: &[ImportedMessage]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(msgid) = m.msgid.as_deref() {
            if !seen.insert(msgid) {
                return Err(format!("conversation_history[{i}]: msgid {msgid:?} is already the msgid of an earlier message"));
            }
        }
    }
    Ok(())
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
        ts.as_i64().ok_or_else(|| "ts must be an integer".to_owned())?
    } else {
        match m.get("timestamp") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => {
                parse_iso8601(s).ok_or_else(|| format!("timestamp {s:?} is not ISO 8601"))?
            }
            Some(Value::Number(n)) => n.as_i64().ok_or_else(|| "bad timestamp".to_owned())?,
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
        count: impl Fn(Encoding, &str, &str) -> u64,
    ) -> Result<Session, String> {
        let encoding = settings.encoding;
        let mut session = Session::new(settings, now);
        if let Some(s) = self.summary {
            let summary = Summary {
                tokens: count(encoding, SUMMARY_COUNTED_AS, &s.text),
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
                tokens: count(encoding, &m.role, &m.content),
                role: m.role.into(),
                content: m.content.into(),
                ts: m.ts.unwrap_or(now),
                meta: m.meta.map(Box::from),
            };
            session.push_message(message).map_err(|e| e.to_string())?;
            if let Some(msgid) = m.msgid {
                session.msgids.attach(id, msgid.into());
            }
        }
        session.extra = self.extra;
        Ok(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_round_trips_and_accepts_zoneless_times() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse_iso8601("1970-01-01T00:00:01.500Z"), Some(1500));
        assert_eq!(parse_iso8601("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_iso8601("2024-05-01T10:00:00.123456"), Some(1714557600123));
        assert_eq!(parse_iso8601("2024-05-01 10:00:00"), Some(1714557600000));
        assert_eq!(parse_iso8601("yesterday"), None);
    }

    #[test]
    fn client_side_shape_keeps_other_members() {
        let doc = parse_import(
            r#"{"conversation_history":[{"role":"user","content":"hi","timestamp":"2024-05-01T10:00:00"}],
                "user_profile":{"name":"Ann"},"context":{"topic":"x"}}"#,
        )
        .unwrap();
        assert_eq!(doc.messages.len(), 1);
        assert_eq!(doc.messages[0].ts, Some(1714557600000));
        let extra: Value = serde_json::from_str(doc.extra.as_deref().unwrap()).unwrap();
        assert_eq!(extra["user_profile"]["name"], "Ann");
        assert_eq!(extra["context"]["topic"], "x");
    }

    #[test]
    fn shape_errors_are_reported() {
        for bad in [
            "[]",
            "{}",
            r#"{"conversation_history":{}}"#,
            r#"{"conversation_history":[{"role":"","content":"x"}]}"#,
            r#"{"conversation_history":[{"role":"user","content":1}]}"#,
            r#"{"conversation_history":[{"role":"user","content":"x","meta":[1]}]}"#,
            r#"{"conversation_history":[],"summary":{"content":"s"}}"#,
            r#"{"conversation_history":[{"role":"user","content":"x","timestamp":"soon"}]}"#,
        ] {
            assert!(parse_import(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_must_be_all_or_none_and_increasing() {
        let s = crate::session::tests::settings();
        let count = |_: Encoding, _: &str, c: &str| c.len() as u64;
        let mixed = parse_import(
            r#"{"conversation_history":[{"id":1,"role":"user","content":"a"},{"role":"user","content":"b"}]}"#,
        )
        .unwrap();
        assert!(mixed.into_session(s.clone(), 0, count).is_err());
        let down = parse_import(
            r#"{"conversation_history":[{"id":5,"role":"user","content":"a"},{"id":4,"role":"user","content":"b"}]}"#,
        )
        .unwrap();
        assert!(down.into_session(s.clone(), 0, count).is_err());
        let ok = parse_import(
            r#"{"conversation_history":[{"role":"user","content":"ab"}],"summary":{"content":"s","upto":7}}"#,
        )
        .unwrap()
        .into_session(s, 9, count)
        .unwrap();
        assert_eq!(ok.messages[0].id, 8);
        assert_eq!(ok.last_id, 8);
        assert_eq!(ok.total_tokens, 3);
        assert!(ok.validate().is_ok());
    }

    #[test]
    fn render_puts_extra_members_at_the_top_level() {
        let mut s = Session::new(crate::session::tests::settings(), 0);
        s.extra = Some(r#"{"user_profile":{"a":1}}"#.to_owned());
        let out: Value = serde_json::from_str(&render(Some(&s), None, [].iter(), "m")).unwrap();
        assert_eq!(out["user_profile"]["a"], 1);
        assert_eq!(out["summary"], Value::Null);
        assert_eq!(out["conversation_history"], Value::Array(vec![]));
    }

    /// An object nested `depth` deep (`{}` is 1).
    fn nested(depth: usize) -> String {
        format!("{}{{}}{}", r#"{"a":"#.repeat(depth - 1), "}".repeat(depth - 1))
    }

    fn session_with_meta(meta: &str) -> Session {
        let mut s = Session::new(crate::session::tests::settings(), 0);
        let message = Message {
            id: 1,
            role: "user".into(),
            content: "x".into(),
            ts: 0,
            tokens: 5,
            meta: Some(meta.into()),
        };
        s.push_message(message).unwrap();
        s
    }

    fn rendered(s: &Session) -> String {
        render(Some(s), None, s.messages.iter(), "m")
    }

    #[test]
    fn meta_at_the_deepest_allowed_level_comes_back_through_import() {
        let deepest = nested(crate::session::MAX_META_DEPTH);
        assert!(crate::session::check_meta(&deepest).is_ok());
        let doc = rendered(&session_with_meta(&deepest));
        let back = parse_import(&doc).expect("FORMAT JSON with META at the deepest level imports");
        assert_eq!(back.messages[0].meta.as_deref(), Some(deepest.as_str()));
        // One level more is refused at append time, and rightly: the
        // document it would render is beyond serde_json's limit.
        let deeper = nested(crate::session::MAX_META_DEPTH + 1);
        let e = crate::session::check_meta(&deeper).unwrap_err();
        assert!(e.contains("nested deeper"), "{e}");
        let e = parse_import(&rendered(&session_with_meta(&deeper))).unwrap_err();
        assert!(e.contains("recursion limit"), "{e}");
        // Far deeper: refused without recursing (serde_json's own limit).
        assert!(crate::session::check_meta(&nested(100_000)).unwrap_err().contains("nested deeper"));
    }

    #[test]
    fn imported_members_at_the_deepest_allowed_level_come_back() {
        let depth = crate::session::MAX_MEMBERS_DEPTH;
        // The members' object is the document's top level: a member value
        // one level below it.
        let members = format!(r#"{{"ctx":{}}}"#, nested(depth - 1));
        assert!(crate::session::check_members(&members).is_ok());
        let mut s = Session::new(crate::session::tests::settings(), 0);
        s.extra = Some(members.clone());
        let back = parse_import(&rendered(&s)).expect("members at the deepest level import");
        assert_eq!(back.extra.as_deref(), Some(members.as_str()));
        let deeper = format!(r#"{{"ctx":{}}}"#, nested(depth));
        assert!(crate::session::check_members(&deeper).is_err());
    }

    #[test]
    fn meta_that_would_not_round_trip_is_refused() {
        for bad in [
            r#"{"a":"\ud800"}"#,
            r#"{"\udfff":1}"#,
            r#"{"n":1e400}"#,
            r#"{"n":-1e400}"#,
            r#"{"a":1} x"#,
            "[]",
            "1",
        ] {
            assert!(crate::session::check_meta(bad).is_err(), "{bad}");
            let doc = format!(r#"{{"conversation_history":[{{"role":"user","content":"x","meta":{bad}}}]}}"#);
            assert!(parse_import(&doc).is_err(), "{doc}");
        }
        for good in [r#"{"a":"\ud83d\ude80","n":1e308,"m":-0,"big":123456789012345678901234567890}"#, "{}"] {
            assert!(crate::session::check_meta(good).is_ok(), "{good}");
            let doc = rendered(&session_with_meta(good));
            assert!(parse_import(&doc).is_ok(), "{doc}");
        }
        let doc = r#"{"conversation_history":[],"profile":{"n":1e400}}"#;
        assert!(parse_import(doc).is_err());
    }

    #[test]
    fn msgids_round_trip_through_format_json_and_are_checked() {
        let mut s = session_with_meta("{}");
        s.msgids.attach(1, "turn-1/user".into());
        let doc = rendered(&s);
        let out: Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(out["conversation_history"][0]["msgid"], "turn-1/user");
        let back = parse_import(&doc).unwrap();
        assert_eq!(back.messages[0].msgid.as_deref(), Some("turn-1/user"));
        // Messages without one render none.
        s.msgids = Default::default();
        assert!(!rendered(&s).contains("msgid"));
        // Imported, the session holds it again.
        let s = back.into_session(crate::session::tests::settings(), 0, |_, _, c| c.len() as u64).unwrap();
        assert_eq!(s.msgids.of(1), Some("turn-1/user"));
        assert_eq!(s.find_msgid("turn-1/user"), Some((1, 1)));
        let doc = |items: &str| format!(r#"{{"conversation_history":[{items}]}}"#);
        for (bad, needle) in [
            (r#"{"role":"user","content":"a","msgid":""}"#.to_owned(), "1 to 128 bytes"),
            (format!(r#"{{"role":"user","content":"a","msgid":"{}"}}"#, "m".repeat(129)), "1 to 128 bytes"),
            (r#"{"role":"user","content":"a","msgid":7}"#.to_owned(), "must be a string"),
            (r#"{"role":"user","content":"a","msgid":"x"},{"role":"user","content":"b","msgid":"x"}"#.to_owned(), "earlier message"),
        ] {
            let e = parse_import(&doc(&bad)).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        let ok = parse_import(&doc(r#"{"role":"user","content":"a","msgid":null},{"role":"user","content":"b","msgid":"y"}"#)).unwrap();
        assert_eq!(ok.messages[1].msgid.as_deref(), Some("y"));
    }

    #[test]
    fn ids_and_upto_are_bounded_by_max_id() {
        let doc = |id: u64| format!(r#"{{"conversation_history":[{{"id":{id},"role":"user","content":"x"}}]}}"#);
        assert_eq!(parse_import(&doc(MAX_ID)).unwrap().messages[0].id, Some(MAX_ID));
        for id in [MAX_ID + 1, i64::MAX as u64, u64::MAX] {
            let e = parse_import(&doc(id)).unwrap_err();
            assert!(e.contains("9007199254740991"), "{e}");
        }
        let upto = |u: u64| format!(r#"{{"conversation_history":[],"summary":{{"content":"s","upto":{u}}}}}"#);
        assert!(parse_import(&upto(MAX_ID)).is_ok());
        assert!(parse_import(&upto(MAX_ID + 1)).is_err());
        // A summary up to MAX_ID leaves no id for a message without one.
        let full = r#"{"conversation_history":[{"role":"user","content":"x"}],"summary":{"content":"s","upto":9007199254740991}}"#;
        let count = |_: Encoding, _: &str, c: &str| c.len() as u64;
        let e = parse_import(full).unwrap().into_session(crate::session::tests::settings(), 0, count);
        assert!(e.unwrap_err().contains("every message id"));
    }
}
