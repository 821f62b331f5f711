//! Helpers of the command tests (the commands::* modules): replies as fields,
//! MEM.GET entries, snapshots to prove a failed command changed nothing, and
//! expected token counts computed with tiktoken-rs (never hard-coded).
#![allow(dead_code)]

use redis::Value;
use serde_json::Value as Json;

use crate::support::server::*;

pub fn o200(s: &str) -> i64 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as i64
}

pub fn cl100(s: &str) -> i64 {
    tiktoken_rs::cl100k_base_singleton()
        .encode_ordinary(s)
        .len() as i64
}

/// Tokens of a chat message under o200k_base: 3 + role + content.
pub fn mt_o(role: &str, content: &str) -> i64 {
    3 + o200(role) + o200(content)
}

/// Tokens of a chat message under cl100k_base.
pub fn mt_c(role: &str, content: &str) -> i64 {
    3 + cl100(role) + cl100(content)
}

/// "CODE detail" of a server error.
pub fn err_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(c), Some(d)) => format!("{c} {d}"),
        (Some(c), None) => c.to_owned(),
        _ => e.to_string(),
    }
}

/// Runs a command that must fail; returns the error text.
pub fn err(con: &mut redis::Connection, args: &[&str]) -> String {
    match cmd(con, args) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => err_text(&e),
    }
}

/// Runs a command (raw byte arguments) that must fail; returns the error text.
pub fn err_raw(con: &mut redis::Connection, args: &[&[u8]]) -> String {
    let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        c.arg(*a);
    }
    match c.query::<Value>(con) {
        Ok(v) => panic!("raw command should fail, got {v:?}"),
        Err(e) => err_text(&e),
    }
}

pub fn assert_err(con: &mut redis::Connection, args: &[&str], needle: &str) {
    let e = err(con, args);
    assert!(
        e.contains(needle),
        "{args:?}: error {e:?} does not contain {needle:?}"
    );
}

pub fn ok(con: &mut redis::Connection, args: &[&str]) -> Value {
    cmd(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

pub fn int(con: &mut redis::Connection, args: &[&str]) -> i64 {
    redis::from_redis_value(&ok(con, args)).unwrap()
}

pub fn string(con: &mut redis::Connection, args: &[&str]) -> String {
    redis::from_redis_value(&ok(con, args)).unwrap()
}

/// MEM.APPEND key role content [options...] -> reply fields.
pub fn append(
    con: &mut redis::Connection,
    key: &str,
    role: &str,
    content: &str,
    opts: &[&str],
) -> Vec<(String, Value)> {
    let mut args = vec!["MEM.APPEND", key, role, content];
    args.extend_from_slice(opts);
    map_reply(con, &args)
}

pub fn names(fields: &[(String, Value)]) -> Vec<&str> {
    fields.iter().map(|(k, _)| k.as_str()).collect()
}

pub const OUTCOME_FIELDS: [&str; 7] = [
    "id",
    "tokens",
    "total_tokens",
    "messages",
    "trimmed",
    "summarize",
    "duplicate",
];
pub const CHECK_FIELDS: [&str; 8] = [
    "summarize",
    "total_tokens",
    "messages",
    "threshold_tokens",
    "threshold_messages",
    "keep",
    "upto",
    "upto_tokens",
];
pub const INFO_FIELDS: [&str; 20] = [
    "messages",
    "total_tokens",
    "model",
    "encoding",
    "context_window",
    "maxtokens",
    "maxmsgs",
    "ttl",
    "first_id",
    "last_id",
    "created",
    "updated",
    "summary_upto",
    "external",
    "evicted",
    "summarized",
    "summaries_dropped",
    "summary_ts",
    "external_ttl",
    "lease_ttl",
];

/// One entry of a MEM.GET reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub keys: Vec<String>,
    pub id: i64,
    pub role: String,
    pub content: String,
    pub ts: i64,
    pub tokens: i64,
    pub meta: Option<String>,
}

pub fn entries(v: Value) -> Vec<Entry> {
    let Value::Array(items) = v else {
        panic!("MEM.GET reply is not an array: {v:?}")
    };
    items
        .into_iter()
        .map(|it| {
            let f = as_fields(it);
            Entry {
                keys: f.iter().map(|(k, _)| k.clone()).collect(),
                id: int_field(&f, "id"),
                role: str_field(&f, "role"),
                content: str_field(&f, "content"),
                ts: int_field(&f, "ts"),
                tokens: int_field(&f, "tokens"),
                meta: f
                    .iter()
                    .any(|(k, _)| k == "meta")
                    .then(|| str_field(&f, "meta")),
            }
        })
        .collect()
}

pub fn get(con: &mut redis::Connection, args: &[&str]) -> Vec<Entry> {
    entries(ok(con, args))
}

pub fn ids(e: &[Entry]) -> Vec<i64> {
    e.iter().map(|x| x.id).collect()
}

pub fn json_text(con: &mut redis::Connection, key: &str) -> String {
    string(con, &["MEM.GET", key, "FORMAT", "JSON"])
}

pub fn json_doc(con: &mut redis::Connection, key: &str) -> Json {
    serde_json::from_str(&json_text(con, key)).expect("FORMAT JSON is valid JSON")
}

pub fn digest(con: &mut redis::Connection, key: &str) -> String {
    match ok(con, &["DEBUG", "DIGEST-VALUE", key]) {
        Value::Array(v) => redis::from_redis_value(&v[0]).unwrap(),
        other => redis::from_redis_value(&other).unwrap(),
    }
}

/// MEM.INFO's fields, `external_ttl` as its system names only and
/// `lease_ttl` as 0 or 1 (whether a lease is held): their values count
/// down, so two reads of an unchanged session compare equal (tests of the
/// values read MEM.INFO themselves).
pub fn info(con: &mut redis::Connection, key: &str) -> Vec<(String, Value)> {
    let mut fields = map_reply(con, &["MEM.INFO", key]);
    for (name, value) in &mut fields {
        if name == "external_ttl" {
            let systems: Vec<Value> = as_fields(value.clone())
                .into_iter()
                .map(|(system, _)| Value::BulkString(system.into_bytes()))
                .collect();
            *value = Value::Array(systems);
        }
        if name == "lease_ttl" {
            let held = redis::from_redis_value::<i64>(value).unwrap_or(0) > 0;
            *value = Value::Int(i64::from(held));
        }
    }
    fields
}

pub fn check(con: &mut redis::Connection, key: &str, opts: &[&str]) -> Vec<(String, Value)> {
    let mut args = vec!["MEM.SUMMARIZE_CHECK", key];
    args.extend_from_slice(opts);
    map_reply(con, &args)
}

/// What must not change when a command fails.
#[derive(Debug)]
pub struct Snap {
    pub exists: i64,
    pub json: String,
    pub digest: String,
    /// PEXPIRETIME, so an unchanged expiry compares equal however slow the test.
    pub expire_at: i64,
}

pub fn snap(con: &mut redis::Connection, key: &str) -> Snap {
    Snap {
        exists: int(con, &["EXISTS", key]),
        json: json_text(con, key),
        digest: digest(con, key),
        expire_at: int(con, &["PEXPIRETIME", key]),
    }
}

pub fn assert_unchanged(con: &mut redis::Connection, key: &str, before: &Snap, what: &str) {
    let after = snap(con, key);
    assert_eq!(after.exists, before.exists, "{what}: EXISTS changed");
    assert_eq!(after.json, before.json, "{what}: FORMAT JSON changed");
    assert_eq!(after.digest, before.digest, "{what}: DIGEST-VALUE changed");
    assert_eq!(
        after.expire_at, before.expire_at,
        "{what}: PEXPIRETIME changed"
    );
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub fn config_get(con: &mut redis::Connection, name: &str) -> String {
    let v = ok(con, &["CONFIG", "GET", name]);
    let f = as_fields(v);
    assert_eq!(f.len(), 1, "CONFIG GET {name}: {f:?}");
    redis::from_redis_value(&f[0].1).unwrap()
}

/// A session with a few messages, a summary, meta and an external id.
pub fn populated(con: &mut redis::Connection, key: &str) {
    append(con, key, "system", "You are a helpful assistant.", &[]);
    append(con, key, "user", "What's the weather in Paris?", &[]);
    append(
        con,
        key,
        "assistant",
        "",
        &["META", r#"{"tool_calls":[{"id":"c1","name":"weather"}]}"#],
    );
    append(
        con,
        key,
        "tool",
        r#"{"temp_c": 21}"#,
        &["META", r#"{"tool_call_id":"c1"}"#],
    );
    append(con, key, "assistant", "It is 21 °C in Paris. 晴れ。", &[]);
    ok(
        con,
        &[
            "MEM.SUMMARIZE",
            key,
            "2",
            "The user asked about the weather in Paris.",
        ],
    );
    ok(con, &["MEM.EXTSET", key, "dify", "conv-42"]);
}
