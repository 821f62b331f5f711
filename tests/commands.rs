//! Integration tests of every MEM.* command of SPEC §3 and the configs of §4,
//! against a real redis-server with the module loaded. Expected token counts
//! are computed here with tiktoken-rs, never hard-coded.

mod common;
use common::*;

use redis::Value;
use serde_json::{json, Value as Json};
use std::collections::VecDeque;
use std::time::Duration;

// ---------------------------------------------------------------- helpers

fn o200(s: &str) -> i64 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as i64
}

fn cl100(s: &str) -> i64 {
    tiktoken_rs::cl100k_base_singleton().encode_ordinary(s).len() as i64
}

/// Tokens of a chat message under o200k_base: 3 + role + content.
fn mt_o(role: &str, content: &str) -> i64 {
    3 + o200(role) + o200(content)
}

/// Tokens of a chat message under cl100k_base.
fn mt_c(role: &str, content: &str) -> i64 {
    3 + cl100(role) + cl100(content)
}

/// "CODE detail" of a server error.
fn err_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(c), Some(d)) => format!("{c} {d}"),
        (Some(c), None) => c.to_owned(),
        _ => e.to_string(),
    }
}

/// Runs a command that must fail; returns the error text.
fn err(con: &mut redis::Connection, args: &[&str]) -> String {
    match cmd(con, args) {
        Ok(v) => panic!("{args:?} should fail, got {v:?}"),
        Err(e) => err_text(&e),
    }
}

/// Runs a command (raw byte arguments) that must fail; returns the error text.
fn err_raw(con: &mut redis::Connection, args: &[&[u8]]) -> String {
    let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        c.arg(*a);
    }
    match c.query::<Value>(con) {
        Ok(v) => panic!("raw command should fail, got {v:?}"),
        Err(e) => err_text(&e),
    }
}

fn assert_err(con: &mut redis::Connection, args: &[&str], needle: &str) {
    let e = err(con, args);
    assert!(e.contains(needle), "{args:?}: error {e:?} does not contain {needle:?}");
}

fn ok(con: &mut redis::Connection, args: &[&str]) -> Value {
    cmd(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn int(con: &mut redis::Connection, args: &[&str]) -> i64 {
    redis::from_redis_value(&ok(con, args)).unwrap()
}

fn string(con: &mut redis::Connection, args: &[&str]) -> String {
    redis::from_redis_value(&ok(con, args)).unwrap()
}

/// MEM.APPEND key role content [options...] -> reply fields.
fn append(con: &mut redis::Connection, key: &str, role: &str, content: &str, opts: &[&str]) -> Vec<(String, Value)> {
    let mut args = vec!["MEM.APPEND", key, role, content];
    args.extend_from_slice(opts);
    map_reply(con, &args)
}

fn names(fields: &[(String, Value)]) -> Vec<&str> {
    fields.iter().map(|(k, _)| k.as_str()).collect()
}

const OUTCOME_FIELDS: [&str; 6] = ["id", "tokens", "total_tokens", "messages", "trimmed", "summarize"];
const CHECK_FIELDS: [&str; 8] = [
    "summarize",
    "total_tokens",
    "messages",
    "threshold_tokens",
    "threshold_messages",
    "keep",
    "upto",
    "upto_tokens",
];
const INFO_FIELDS: [&str; 14] = [
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
];

/// One entry of a MEM.GET reply.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    keys: Vec<String>,
    id: i64,
    role: String,
    content: String,
    ts: i64,
    tokens: i64,
    meta: Option<String>,
}

fn entries(v: Value) -> Vec<Entry> {
    let Value::Array(items) = v else { panic!("MEM.GET reply is not an array: {v:?}") };
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
                meta: f.iter().any(|(k, _)| k == "meta").then(|| str_field(&f, "meta")),
            }
        })
        .collect()
}

fn get(con: &mut redis::Connection, args: &[&str]) -> Vec<Entry> {
    entries(ok(con, args))
}

fn ids(e: &[Entry]) -> Vec<i64> {
    e.iter().map(|x| x.id).collect()
}

fn json_text(con: &mut redis::Connection, key: &str) -> String {
    string(con, &["MEM.GET", key, "FORMAT", "JSON"])
}

fn json_doc(con: &mut redis::Connection, key: &str) -> Json {
    serde_json::from_str(&json_text(con, key)).expect("FORMAT JSON is valid JSON")
}

fn digest(con: &mut redis::Connection, key: &str) -> String {
    match ok(con, &["DEBUG", "DIGEST-VALUE", key]) {
        Value::Array(v) => redis::from_redis_value(&v[0]).unwrap(),
        other => redis::from_redis_value(&other).unwrap(),
    }
}

fn info(con: &mut redis::Connection, key: &str) -> Vec<(String, Value)> {
    map_reply(con, &["MEM.INFO", key])
}

fn check(con: &mut redis::Connection, key: &str, opts: &[&str]) -> Vec<(String, Value)> {
    let mut args = vec!["MEM.SUMMARIZE_CHECK", key];
    args.extend_from_slice(opts);
    map_reply(con, &args)
}

/// What must not change when a command fails.
#[derive(Debug)]
struct Snap {
    exists: i64,
    json: String,
    digest: String,
    pttl: i64,
}

fn snap(con: &mut redis::Connection, key: &str) -> Snap {
    Snap {
        exists: int(con, &["EXISTS", key]),
        json: json_text(con, key),
        digest: digest(con, key),
        pttl: int(con, &["PTTL", key]),
    }
}

fn assert_unchanged(con: &mut redis::Connection, key: &str, before: &Snap, what: &str) {
    let after = snap(con, key);
    assert_eq!(after.exists, before.exists, "{what}: EXISTS changed");
    assert_eq!(after.json, before.json, "{what}: FORMAT JSON changed");
    assert_eq!(after.digest, before.digest, "{what}: DIGEST-VALUE changed");
    if before.pttl < 0 {
        assert_eq!(after.pttl, before.pttl, "{what}: PTTL changed");
    } else {
        // A refresh would move it back up; time only moves it down.
        assert!(after.pttl <= before.pttl && after.pttl > before.pttl - 5_000, "{what}: PTTL {} -> {}", before.pttl, after.pttl);
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn config_get(con: &mut redis::Connection, name: &str) -> String {
    let v = ok(con, &["CONFIG", "GET", name]);
    let f = as_fields(v);
    assert_eq!(f.len(), 1, "CONFIG GET {name}: {f:?}");
    redis::from_redis_value(&f[0].1).unwrap()
}

/// A session with a few messages, a summary, meta and an external id.
fn populated(con: &mut redis::Connection, key: &str) {
    append(con, key, "system", "You are a helpful assistant.", &[]);
    append(con, key, "user", "What's the weather in Paris?", &[]);
    append(con, key, "assistant", "", &["META", r#"{"tool_calls":[{"id":"c1","name":"weather"}]}"#]);
    append(con, key, "tool", r#"{"temp_c": 21}"#, &["META", r#"{"tool_call_id":"c1"}"#]);
    append(con, key, "assistant", "It is 21 °C in Paris. 晴れ。", &[]);
    ok(con, &["MEM.SUMMARIZE", key, "2", "The user asked about the weather in Paris."]);
    ok(con, &["MEM.EXTSET", key, "dify", "conv-42"]);
}

// ---------------------------------------------------------------- MEM.APPEND

#[test]
fn append_reply_fields_and_defaults() {
    let server = Server::start();
    let mut con = server.client();
    let before = now_ms();
    let r = append(&mut con, "mem:{a}", "user", "Hello there, how are you today?", &[]);
    let after = now_ms();
    assert_eq!(names(&r), OUTCOME_FIELDS);
    let t1 = mt_o("user", "Hello there, how are you today?");
    assert_eq!(int_field(&r, "id"), 1);
    assert_eq!(int_field(&r, "tokens"), t1);
    assert_eq!(int_field(&r, "total_tokens"), t1);
    assert_eq!(int_field(&r, "messages"), 1);
    assert_eq!(int_field(&r, "trimmed"), 0);
    assert_eq!(int_field(&r, "summarize"), 0);

    let r = append(&mut con, "mem:{a}", "assistant", "I'm fine, thanks! 🎉", &[]);
    let t2 = mt_o("assistant", "I'm fine, thanks! 🎉");
    assert_eq!(int_field(&r, "id"), 2);
    assert_eq!(int_field(&r, "tokens"), t2);
    assert_eq!(int_field(&r, "total_tokens"), t1 + t2);
    assert_eq!(int_field(&r, "messages"), 2);

    let e = get(&mut con, &["MEM.GET", "mem:{a}"]);
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].keys, ["id", "role", "content", "ts", "tokens"]);
    assert_eq!((e[0].id, e[0].role.as_str(), e[0].content.as_str(), e[0].tokens), (1, "user", "Hello there, how are you today?", t1));
    assert!(e[0].ts >= before - 1000 && e[0].ts <= after + 1000, "default ts is the server clock");
    assert_eq!((e[1].id, e[1].role.as_str(), e[1].tokens), (2, "assistant", t2));
    assert!(e[1].ts >= e[0].ts);

    // Defaults of a new session.
    let i = info(&mut con, "mem:{a}");
    assert_eq!(str_field(&i, "model"), "gpt-4o");
    assert_eq!(str_field(&i, "encoding"), "o200k_base");
    assert_eq!(int_field(&i, "context_window"), 128_000);
    assert_eq!(int_field(&i, "maxtokens"), 80_000);
    assert_eq!(int_field(&i, "maxmsgs"), 30);
    assert_eq!(int_field(&i, "ttl"), 86_400);
    let pttl = int(&mut con, &["PTTL", "mem:{a}"]);
    assert!(pttl > 86_390_000 && pttl <= 86_400_000, "default TTL: {pttl}");
}

#[test]
fn append_ts_meta_and_case_insensitive_options() {
    let server = Server::start();
    let mut con = server.client();
    let meta = r#"{"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#;
    let r = append(&mut con, "k", "assistant", "calling f", &["meta", meta, "Ts", "1700000000123"]);
    assert_eq!(int_field(&r, "id"), 1);
    let e = get(&mut con, &["MEM.GET", "k"]);
    assert_eq!(e[0].ts, 1_700_000_000_123);
    assert_eq!(e[0].meta.as_deref(), Some(meta), "meta comes back as its JSON text");
    assert_eq!(e[0].keys, ["id", "role", "content", "ts", "tokens", "meta"]);
    let doc = json_doc(&mut con, "k");
    let m = &doc["conversation_history"][0];
    assert_eq!(m["timestamp"], "2023-11-14T22:13:20.123Z");
    assert_eq!(m["ts"], 1_700_000_000_123i64);
    assert_eq!(m["meta"], serde_json::from_str::<Json>(meta).unwrap(), "meta is an object in FORMAT JSON");
    assert_eq!(m["id"], 1);
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["content"], "calling f");
    assert_eq!(m["tokens"], mt_o("assistant", "calling f"));

    // TS 0 is a valid time; options in any order, any case.
    append(&mut con, "k", "user", "x", &["ttl", "100", "TS", "0", "MaxMsgs", "10", "maxtokens", "5000", "model", "gpt-4o"]);
    let e = get(&mut con, &["MEM.GET", "k"]);
    assert_eq!(e[1].ts, 0);
    assert_eq!(e[1].meta, None);
    let i = info(&mut con, "k");
    assert_eq!((int_field(&i, "ttl"), int_field(&i, "maxmsgs"), int_field(&i, "maxtokens")), (100, 10, 5000));
}

#[test]
fn append_roles_and_empty_content() {
    let server = Server::start();
    let mut con = server.client();
    let r = append(&mut con, "k", "narrator", "", &[]);
    assert_eq!(int_field(&r, "tokens"), 3 + o200("narrator"), "empty content counts 3 + role");
    let role64 = "r".repeat(64);
    let r = append(&mut con, "k", &role64, "ok", &[]);
    assert_eq!(int_field(&r, "tokens"), mt_o(&role64, "ok"));
    let before = snap(&mut con, "k");
    assert_err(&mut con, &["MEM.APPEND", "k", &"r".repeat(65), "too long role"], "ERR");
    assert_unchanged(&mut con, "k", &before, "65-byte role");
    assert_err(&mut con, &["MEM.APPEND", "k", "", "empty role"], "ERR");
    assert_unchanged(&mut con, "k", &before, "empty role");
    let e = get(&mut con, &["MEM.GET", "k"]);
    assert_eq!(e[0].content, "");
    assert_eq!(e[1].role, role64);
}

#[test]
fn append_errors_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{errs}";
    populated(&mut con, k);
    let before = snap(&mut con, k);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["MEM.APPEND"], "wrong number of arguments"),
        (vec!["MEM.APPEND", k], "wrong number of arguments"),
        (vec!["MEM.APPEND", k, "user"], "wrong number of arguments"),
        (vec!["MEM.APPEND", k, "user", "hi", "FOO", "1"], "ERR syntax error, unknown option 'FOO'"),
        (vec!["MEM.APPEND", k, "user", "hi", "extra"], "unknown option 'EXTRA'"),
        (vec!["MEM.APPEND", k, "user", "hi", "TS", "1", "ts", "2"], "given more than once"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "{}", "META", "{}"], "given more than once"),
        (vec!["MEM.APPEND", k, "user", "hi", "MODEL", "gpt-4", "MODEL", "gpt-4"], "given more than once"),
        (vec!["MEM.APPEND", k, "user", "hi", "TTL", "1", "TTL", "1"], "given more than once"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "5", "MAXMSGS", "5"], "given more than once"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXTOKENS", "5", "maxtokens", "5"], "given more than once"),
        (vec!["MEM.APPEND", k, "user", "hi", "TS"], "needs a value"),
        (vec!["MEM.APPEND", k, "user", "hi", "TTL", "5", "META"], "needs a value"),
        (vec!["MEM.APPEND", k, "user", "hi", "MODEL"], "needs a value"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS"], "needs a value"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXTOKENS"], "needs a value"),
        (vec!["MEM.APPEND", k, "user", "hi", "TS", "abc"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TS", "-1"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TS", "1.5"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TTL", "-1"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TTL", "ten"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TTL", ""], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "-3"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "0"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "1e3"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXTOKENS", "-1"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXTOKENS", "0"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXTOKENS", "99999999999999999999999"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "{"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "not json"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "[1,2]"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "\"s\""], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "null"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "42"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "{} {}"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", ""], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MODEL", ""], "ERR"),
        // Several settings and a bad option: the settings must not apply.
        (vec!["MEM.APPEND", k, "user", "hi", "MODEL", "gpt-4", "MAXMSGS", "1", "TTL", "0", "META", "[1]"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MODEL", "gpt-4", "MAXTOKENS", "1", "TS", "x"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "1", "BOGUS"], "unknown option 'BOGUS'"),
    ];
    for (args, needle) in &cases {
        assert_err(&mut con, args, needle);
        assert_unchanged(&mut con, k, &before, &format!("{args:?}"));
    }
    let long_model = "m".repeat(300);
    assert_err(&mut con, &["MEM.APPEND", k, "user", "hi", "MODEL", &long_model], "ERR");
    assert_unchanged(&mut con, k, &before, "300-byte model");

    // Invalid UTF-8 content, role, META.
    let kb = k.as_bytes();
    for args in [
        vec![&b"MEM.APPEND"[..], kb, b"user", &[0xff, 0xfe][..]],
        vec![&b"MEM.APPEND"[..], kb, b"user", b"ok \xc3\x28 broken"],
        vec![&b"MEM.APPEND"[..], kb, b"\xffuser", b"hi"],
        vec![&b"MEM.APPEND"[..], kb, b"user", b"hi", b"META", b"{\"a\":\"\xff\"}"],
    ] {
        let e = err_raw(&mut con, &args);
        assert!(e.starts_with("ERR"), "{e}");
        assert_unchanged(&mut con, k, &before, "invalid UTF-8");
    }

    // Oversize content and META.
    ok(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "100"]);
    let big = "x".repeat(101);
    assert_err(&mut con, &["MEM.APPEND", k, "user", &big], "ERR");
    assert_unchanged(&mut con, k, &before, "oversize content");
    let big_meta = format!(r#"{{"a":"{}"}}"#, "y".repeat(100));
    assert_err(&mut con, &["MEM.APPEND", k, "user", "hi", "META", &big_meta], "ERR");
    assert_unchanged(&mut con, k, &before, "oversize META");

    // A missing key is not created by a failing append.
    assert_err(&mut con, &["MEM.APPEND", "mem:{new}", "user", &big], "ERR");
    assert_err(&mut con, &["MEM.APPEND", "mem:{new}", "user", "hi", "META", "[]"], "ERR");
    assert_eq!(int(&mut con, &["EXISTS", "mem:{new}"]), 0);

    // Exactly at the limit is accepted.
    let at_limit = "x".repeat(100);
    let r = append(&mut con, k, "user", &at_limit, &[]);
    assert_eq!(int_field(&r, "tokens"), mt_o("user", &at_limit));
}

#[test]
fn wrongtype_on_a_string_key() {
    let server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["SET", "s", "v", "EX", "1000"]);
    let cases: Vec<Vec<&str>> = vec![
        vec!["MEM.APPEND", "s", "user", "hi"],
        vec!["MEM.GET", "s"],
        vec!["MEM.GET", "s", "FORMAT", "JSON"],
        vec!["MEM.SUMMARIZE_CHECK", "s"],
        vec!["MEM.SUMMARIZE", "s", "1", "sum"],
        vec!["MEM.EXTSET", "s", "dify", "x"],
        vec!["MEM.EXTGET", "s", "dify"],
        vec!["MEM.INFO", "s"],
    ];
    for args in &cases {
        let e = err(&mut con, args);
        assert!(e.starts_with("WRONGTYPE"), "{args:?}: {e}");
        assert_eq!(string(&mut con, &["GET", "s"]), "v");
        let ttl = int(&mut con, &["TTL", "s"]);
        assert!(ttl > 990 && ttl <= 1000, "TTL of the string key changed: {ttl}");
    }
    // IMPORT without REPLACE on an existing key of another type: an error
    // (WRONGTYPE or BUSYKEY), nothing changed.
    let e = err(&mut con, &["MEM.IMPORT", "s", r#"{"conversation_history":[]}"#]);
    assert!(e.starts_with("WRONGTYPE") || e.starts_with("BUSYKEY"), "{e}");
    assert_eq!(string(&mut con, &["GET", "s"]), "v");
}

// ---------------------------------------------------------------- RESP2 / RESP3 map replies

#[test]
fn map_replies_resp2_flat_arrays_and_resp3_maps() {
    let server = Server::start();
    let mut c2 = server.client();
    let mut c3 = server.client_resp3();
    for (con, key, resp3) in [(&mut c2, "mem:{r2}", false), (&mut c3, "mem:{r3}", true)] {
        let is_map = |v: &Value, n: usize| -> bool {
            match v {
                Value::Map(p) => resp3 && p.len() == n,
                Value::Array(items) => !resp3 && items.len() == 2 * n,
                _ => false,
            }
        };
        for i in 0..4 {
            let v = ok(con, &["MEM.APPEND", key, "user", &format!("message {i}")]);
            assert!(is_map(&v, 6), "APPEND resp3={resp3}: {v:?}");
            assert_eq!(names(&as_fields(v)), OUTCOME_FIELDS);
        }
        let v = ok(con, &["MEM.GET", key]);
        let Value::Array(items) = &v else { panic!("GET: {v:?}") };
        assert_eq!(items.len(), 4);
        assert!(items.iter().all(|it| is_map(it, 5)), "GET entries resp3={resp3}: {v:?}");
        let v = ok(con, &["MEM.SUMMARIZE_CHECK", key, "KEEP", "2"]);
        assert!(is_map(&v, 8), "SUMMARIZE_CHECK resp3={resp3}: {v:?}");
        assert_eq!(names(&as_fields(v)), CHECK_FIELDS);
        let v = ok(con, &["MEM.SUMMARIZE", key, "2", "a summary"]);
        assert!(is_map(&v, 6), "SUMMARIZE resp3={resp3}: {v:?}");
        assert_eq!(names(&as_fields(v)), OUTCOME_FIELDS);
        let v = ok(con, &["MEM.GET", key]);
        let Value::Array(items) = &v else { panic!("GET: {v:?}") };
        assert_eq!(items.len(), 3);
        assert!(items.iter().all(|it| is_map(it, 5)), "GET with summary resp3={resp3}: {v:?}");
        let v = ok(con, &["MEM.EXTSET", key, "n8n", "x"]);
        assert!(matches!(v, Value::Okay | Value::SimpleString(_)), "{v:?}");
        let v = ok(con, &["MEM.INFO", key]);
        assert!(is_map(&v, 14), "INFO resp3={resp3}: {v:?}");
        let f = as_fields(v);
        assert_eq!(names(&f), INFO_FIELDS);
        let ext: Vec<String> = redis::from_redis_value(&f[13].1).unwrap();
        assert_eq!(ext, ["n8n"]);
        let imported = format!("{key}:imp");
        let v = ok(con, &["MEM.IMPORT", &imported, r#"{"conversation_history":[{"role":"user","content":"hi"}]}"#]);
        assert!(is_map(&v, 6), "IMPORT resp3={resp3}: {v:?}");
        assert_eq!(names(&as_fields(v)), OUTCOME_FIELDS);
        let v = ok(con, &["MEM.GET", key, "AFTER", "2", "FORMAT", "JSON"]);
        assert!(matches!(v, Value::BulkString(_) | Value::VerbatimString { .. }), "FORMAT JSON is one string: {v:?}");
        assert_eq!(ok(con, &["MEM.INFO", "nope"]), Value::Nil);
        assert_eq!(ok(con, &["MEM.EXTGET", key, "nope"]), Value::Nil);
        assert_eq!(ok(con, &["MEM.GET", "nope"]), Value::Array(vec![]));
    }
    // Both protocols see the same data.
    let a = get(&mut c2, &["MEM.GET", "mem:{r3}"]);
    let b = get(&mut c3, &["MEM.GET", "mem:{r3}"]);
    assert_eq!(a, b);
}

// ---------------------------------------------------------------- TTL

#[test]
fn ttl_append_refreshes_reads_do_not() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{ttl}";
    append(&mut con, k, "user", "one", &["TTL", "5"]);
    let p = int(&mut con, &["PTTL", k]);
    assert!(p > 4_000 && p <= 5_000, "TTL 5 -> PTTL {p}");

    // The TTL option persists: later appends refresh to 100 s, not the default.
    append(&mut con, k, "user", "two", &["TTL", "100"]);
    ok(&mut con, &["PEXPIRE", k, "50000"]);
    append(&mut con, k, "assistant", "three", &[]);
    let p = int(&mut con, &["PTTL", k]);
    assert!(p > 99_000 && p <= 100_000, "append refreshes to the session TTL: {p}");
    assert_eq!(int_field(&info(&mut con, k), "ttl"), 100);

    // Reads never touch it.
    ok(&mut con, &["PEXPIRE", k, "50000"]);
    get(&mut con, &["MEM.GET", k]);
    get(&mut con, &["MEM.GET", k, "LAST", "1", "BUDGET", "1000"]);
    json_text(&mut con, k);
    check(&mut con, k, &[]);
    check(&mut con, k, &["MODEL", "gpt-4.1", "KEEP", "1"]);
    info(&mut con, k);
    ok(&mut con, &["MEM.EXTGET", k, "dify"]);
    let p = int(&mut con, &["PTTL", k]);
    assert!(p <= 50_000 && p > 45_000, "reads changed the TTL: {p}");

    // A failing write does not refresh it either.
    assert_err(&mut con, &["MEM.APPEND", k, "user", "x", "META", "[]"], "ERR");
    let p = int(&mut con, &["PTTL", k]);
    assert!(p <= 50_000, "a failed append refreshed the TTL: {p}");
}

#[test]
fn ttl_zero_means_no_expiry() {
    let server = Server::start();
    let mut con = server.client();
    append(&mut con, "a", "user", "hi", &["TTL", "0"]);
    assert_eq!(int(&mut con, &["TTL", "a"]), -1);
    append(&mut con, "a", "user", "again", &[]);
    assert_eq!(int(&mut con, &["TTL", "a"]), -1, "TTL 0 persists on the session");
    assert_eq!(int_field(&info(&mut con, "a"), "ttl"), 0);

    // A session with an expiry switched to TTL 0 loses it.
    append(&mut con, "b", "user", "hi", &["TTL", "30"]);
    assert!(int(&mut con, &["TTL", "b"]) > 0);
    append(&mut con, "b", "user", "hi", &["TTL", "0"]);
    assert_eq!(int(&mut con, &["TTL", "b"]), -1);
    // And back.
    append(&mut con, "b", "user", "hi", &["TTL", "30"]);
    let t = int(&mut con, &["TTL", "b"]);
    assert!(t > 25 && t <= 30, "{t}");

    // A huge TTL is either refused or keeps the key alive; never expires it.
    for (key, ttl) in [("h1", "9223372036854775"), ("h2", "9223372036854775807")] {
        match cmd(&mut con, &["MEM.APPEND", key, "user", "hi", "TTL", ttl]) {
            Err(e) => {
                assert!(err_text(&e).starts_with("ERR"), "{e}");
                assert_eq!(int(&mut con, &["EXISTS", key]), 0);
            }
            Ok(_) => {
                assert_eq!(int(&mut con, &["EXISTS", key]), 1, "TTL {ttl} deleted the key");
                assert!(int(&mut con, &["PTTL", key]) > 86_400_000, "TTL {ttl}");
            }
        }
    }
    match cmd(&mut con, &["MEM.EXTSET", "h3", "dify", "x", "EX", "9223372036854775807"]) {
        Err(e) => assert!(err_text(&e).starts_with("ERR"), "{e}"),
        Ok(_) => {
            assert_eq!(string(&mut con, &["MEM.EXTGET", "h3", "dify"]), "x");
            assert!(int(&mut con, &["PTTL", "h3"]) > 86_400_000);
        }
    }

    // mem.ttl 0: new sessions never expire.
    ok(&mut con, &["CONFIG", "SET", "mem.ttl", "0"]);
    append(&mut con, "c", "user", "hi", &[]);
    assert_eq!(int(&mut con, &["TTL", "c"]), -1);
    assert_eq!(int_field(&info(&mut con, "c"), "ttl"), 0);
}

// ---------------------------------------------------------------- trimming

#[test]
fn trim_by_max_messages() {
    let server = Server::start();
    let mut con = server.client();
    let k = "t";
    let mut total = VecDeque::new();
    for i in 1..=6 {
        let content = format!("message number {i}");
        let r = append(&mut con, k, "user", &content, &["MAXMSGS", "3"]);
        total.push_back(mt_o("user", &content));
        if total.len() > 3 {
            total.pop_front();
        }
        assert_eq!(int_field(&r, "id"), i);
        assert_eq!(int_field(&r, "messages"), i.min(3));
        assert_eq!(int_field(&r, "trimmed"), i64::from(i > 3));
        assert_eq!(int_field(&r, "total_tokens"), total.iter().sum::<i64>());
    }
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(ids(&e), [4, 5, 6]);
    let i = info(&mut con, k);
    assert_eq!((int_field(&i, "first_id"), int_field(&i, "last_id"), int_field(&i, "messages")), (4, 6, 3));
    assert_eq!(int_field(&i, "total_tokens"), e.iter().map(|x| x.tokens).sum::<i64>());
    // Ids are never reused after eviction.
    let r = append(&mut con, k, "user", "later", &[]);
    assert_eq!(int_field(&r, "id"), 7);
    assert_eq!(int_field(&r, "messages"), 3, "MAXMSGS persists on the session");
}

#[test]
fn trim_by_max_tokens() {
    let server = Server::start();
    let mut con = server.client();
    let k = "t";
    let texts = [
        "The quick brown fox jumps over the lazy dog.",
        "Pack my box with five dozen liquor jugs, please.",
        "How vexingly quick daft zebras jump!",
        "Sphinx of black quartz, judge my vow.",
        "A wizard's job is to vex chumps quickly in fog.",
    ];
    let t: Vec<i64> = texts.iter().map(|c| mt_o("user", c)).collect();
    let cap = t[2] + t[3] + t[4];
    for (i, c) in texts.iter().enumerate() {
        let r = append(&mut con, k, "user", c, &["MAXTOKENS", &cap.to_string()]);
        // Expected: evict from the front until the sum fits.
        let mut start = 0;
        while t[start..=i].iter().sum::<i64>() > cap {
            start += 1;
        }
        assert_eq!(int_field(&r, "messages"), (i + 1 - start) as i64, "append {i}");
        assert_eq!(int_field(&r, "total_tokens"), t[start..=i].iter().sum::<i64>());
        assert!(int_field(&r, "total_tokens") <= cap);
    }
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k])), [3, 4, 5]);

    // The message just appended is never evicted, even alone above the cap.
    let huge = "lorem ipsum dolor sit amet ".repeat(40);
    let r = append(&mut con, k, "user", &huge, &[]);
    let th = mt_o("user", &huge);
    assert!(th > cap);
    assert_eq!(int_field(&r, "id"), 6);
    assert_eq!(int_field(&r, "messages"), 1);
    assert_eq!(int_field(&r, "trimmed"), 3);
    assert_eq!(int_field(&r, "tokens"), th);
    assert_eq!(int_field(&r, "total_tokens"), th);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(ids(&e), [6]);
    assert_eq!(e[0].content, huge);
    // Single-message session with MAXMSGS 1: the new one replaces the old one.
    let r = append(&mut con, "one", "user", "a", &["MAXMSGS", "1"]);
    assert_eq!(int_field(&r, "trimmed"), 0);
    let r = append(&mut con, "one", "user", "b", &[]);
    assert_eq!((int_field(&r, "id"), int_field(&r, "messages"), int_field(&r, "trimmed")), (2, 1, 1));
}

#[test]
fn lowering_a_cap_trims_at_once() {
    let server = Server::start();
    let mut con = server.client();
    for i in 1..=8 {
        append(&mut con, "k", "user", &format!("hello {i}"), &[]);
    }
    let r = append(&mut con, "k", "user", "now only two", &["MAXMSGS", "2"]);
    assert_eq!(int_field(&r, "messages"), 2);
    assert_eq!(int_field(&r, "trimmed"), 7);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", "k"])), [8, 9]);
    assert_eq!(int_field(&info(&mut con, "k"), "maxmsgs"), 2);

    for i in 1..=6 {
        append(&mut con, "t", "user", &format!("some words number {i}"), &[]);
    }
    let e = get(&mut con, &["MEM.GET", "t"]);
    let last = mt_o("user", "x");
    let cap = e[5].tokens + last;
    let r = append(&mut con, "t", "user", "x", &["MAXTOKENS", &cap.to_string()]);
    assert_eq!(int_field(&r, "messages"), 2);
    assert_eq!(int_field(&r, "trimmed"), 5);
    assert_eq!(int_field(&r, "total_tokens"), cap);
    assert_eq!(int_field(&info(&mut con, "t"), "maxtokens"), cap);
}

/// The spec's trimming rules, for checking random-ish sequences.
fn simulate_append(
    msgs: &mut VecDeque<(i64, &'static str, i64)>,
    summary: &mut Option<i64>,
    new: (i64, &'static str, i64),
    maxmsgs: usize,
    maxtokens: i64,
) -> i64 {
    msgs.push_back(new);
    let total = |m: &VecDeque<(i64, &str, i64)>, s: &Option<i64>| m.iter().map(|x| x.2).sum::<i64>() + s.unwrap_or(0);
    let mut evicted = 0;
    while (msgs.len() > maxmsgs || total(msgs, summary) > maxtokens) && msgs.len() > 1 {
        msgs.pop_front();
        evicted += 1;
    }
    if evicted > 0 {
        while msgs.len() > 1 && msgs.front().unwrap().1 == "tool" {
            msgs.pop_front();
            evicted += 1;
        }
    }
    if total(msgs, summary) > maxtokens {
        *summary = None;
    }
    evicted
}

#[test]
fn trim_never_leaves_a_tool_result_without_its_call() {
    let server = Server::start();
    let mut con = server.client();
    // user, assistant(call), tool, tool, assistant: MAXMSGS 3 on the 5th
    // append evicts user and the call; the two tool results go with it.
    append(&mut con, "k", "user", "weather in Paris and Rome?", &[]);
    append(&mut con, "k", "assistant", "", &["META", r#"{"tool_calls":[{"id":"a"},{"id":"b"}]}"#]);
    append(&mut con, "k", "tool", "Paris: 21", &["META", r#"{"tool_call_id":"a"}"#]);
    append(&mut con, "k", "tool", "Rome: 25", &["META", r#"{"tool_call_id":"b"}"#]);
    let r = append(&mut con, "k", "assistant", "Paris 21, Rome 25.", &["MAXMSGS", "3"]);
    assert_eq!(int_field(&r, "trimmed"), 4);
    assert_eq!(int_field(&r, "messages"), 1);
    let e = get(&mut con, &["MEM.GET", "k"]);
    assert_eq!(ids(&e), [5]);
    assert_eq!(int_field(&r, "total_tokens"), e[0].tokens);

    // A deterministic mix of roles and caps, checked against the rules.
    let roles: [&'static str; 7] = ["user", "assistant", "tool", "tool", "assistant", "tool", "user"];
    let mut model: VecDeque<(i64, &'static str, i64)> = VecDeque::new();
    let mut summary = None;
    let mut seed = 12345u64;
    for i in 1..=120i64 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let role = roles[(seed >> 33) as usize % roles.len()];
        let words = 1 + (seed >> 40) as usize % 12;
        let content: String = (0..words).map(|w| format!("w{} ", (w * 7 + i as usize) % 13)).collect();
        let maxmsgs = 2 + (seed >> 50) as usize % 5;
        let tokens = mt_o(role, &content);
        let maxtokens = 40 + (seed >> 20) as i64 % 60;
        let r = append(&mut con, "mix", role, &content, &["MAXMSGS", &maxmsgs.to_string(), "MAXTOKENS", &maxtokens.to_string()]);
        let evicted = simulate_append(&mut model, &mut summary, (i, role, tokens), maxmsgs, maxtokens);
        assert_eq!(int_field(&r, "id"), i);
        assert_eq!(int_field(&r, "tokens"), tokens);
        assert_eq!(int_field(&r, "trimmed"), evicted, "append {i}");
        let e = get(&mut con, &["MEM.GET", "mix"]);
        assert_eq!(ids(&e), model.iter().map(|m| m.0).collect::<Vec<_>>(), "append {i}");
        assert_eq!(*ids(&e).last().unwrap(), i, "the appended message is kept");
        if evicted > 0 && e.len() > 1 {
            assert_ne!(e[0].role, "tool", "append {i}: a tool message is the oldest after trimming");
        }
        assert!(e.len() <= maxmsgs);
        assert_eq!(int_field(&r, "total_tokens"), e.iter().map(|x| x.tokens).sum::<i64>());
    }
}

#[test]
fn summary_is_kept_while_messages_can_be_evicted() {
    let server = Server::start();
    let mut con = server.client();
    let k = "s";
    for i in 1..=6 {
        append(&mut con, k, "user", &format!("message {i} about the project plan"), &[]);
    }
    let text = "The user discussed the project plan at length.";
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, "3", text]);
    let st = mt_o("system", text);
    assert_eq!(int_field(&r, "tokens"), st);
    // MAXMSGS counts messages only; the summary stays.
    for i in 7..=10 {
        let r = append(&mut con, k, "user", &format!("message {i} about the project plan"), &["MAXMSGS", "2"]);
        assert_eq!(int_field(&r, "messages"), 2);
    }
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].role, "summary");
    assert_eq!(e[0].id, 3);
    assert_eq!(ids(&e[1..]), [9, 10]);

    // MAXTOKENS: messages go first, the summary stays while one can go.
    let m = |i: i64| mt_o("user", &format!("message {i} about the project plan"));
    let cap = st + m(11);
    let r = append(&mut con, k, "user", "message 11 about the project plan", &["MAXTOKENS", &cap.to_string(), "MAXMSGS", "30"]);
    assert_eq!(int_field(&r, "trimmed"), 2);
    assert_eq!(int_field(&r, "total_tokens"), cap);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].role, "summary");
    assert_eq!(ids(&e), [3, 11]);
    assert_eq!(int_field(&info(&mut con, k), "summary_upto"), 3);

    // Nothing else can go: the summary goes, the new message stays.
    let r = append(&mut con, k, "user", "message 12 about the project plan", &["MAXTOKENS", &(m(12) + 1).to_string()]);
    assert_eq!(int_field(&r, "messages"), 1);
    assert_eq!(int_field(&r, "total_tokens"), m(12));
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(ids(&e), [12]);
    assert_eq!(e[0].role, "user");
    assert_eq!(int_field(&info(&mut con, k), "summary_upto"), 0);
}

// ---------------------------------------------------------------- SUMMARIZE_CHECK

#[test]
fn thresholds_by_model_and_context() {
    let server = Server::start();
    let mut con = server.client();
    let cases = [
        ("gpt-4o", 19_200i64, 128_000i64),
        ("claude-3-5-sonnet", 30_000, 200_000),
        ("gpt-4.1", 80_000, 1_047_576),
        ("my-own-llm", 15_000, 0),
    ];
    for (model, threshold, window) in cases {
        // Via MODEL on MEM.APPEND: stored on the session.
        let k = format!("m:{model}");
        append(&mut con, &k, "user", "hi", &["MODEL", model]);
        let c = check(&mut con, &k, &[]);
        assert_eq!(names(&c), CHECK_FIELDS);
        assert_eq!(int_field(&c, "threshold_tokens"), threshold, "{model}");
        assert_eq!(int_field(&c, "threshold_messages"), 30);
        let i = info(&mut con, &k);
        assert_eq!(str_field(&i, "model"), model);
        assert_eq!(int_field(&i, "context_window"), window, "{model}");
        // Via MODEL on MEM.SUMMARIZE_CHECK, on a gpt-4o session, unchanged.
        append(&mut con, "base", "user", "hello", &[]);
        let before = snap(&mut con, "base");
        let c = check(&mut con, "base", &["MODEL", model]);
        assert_eq!(int_field(&c, "threshold_tokens"), threshold, "CHECK MODEL {model}");
        assert_unchanged(&mut con, "base", &before, "SUMMARIZE_CHECK MODEL");
        assert_eq!(str_field(&info(&mut con, "base"), "model"), "gpt-4o");
    }
    // CONTEXT n: 15% of n, capped by maxtokens.
    for (ctx, expect) in [(10_000, 1_500), (200_000, 30_000), (10_000_000, 80_000)] {
        let c = check(&mut con, "base", &["CONTEXT", &ctx.to_string()]);
        assert_eq!(int_field(&c, "threshold_tokens"), expect, "CONTEXT {ctx}");
    }
    // The session's maxtokens caps the threshold; maxmsgs is threshold_messages.
    append(&mut con, "small", "user", "hi", &["MAXTOKENS", "5000", "MAXMSGS", "12"]);
    let c = check(&mut con, "small", &[]);
    assert_eq!(int_field(&c, "threshold_tokens"), 5_000);
    assert_eq!(int_field(&c, "threshold_messages"), 12);
    let c = check(&mut con, "small", &["CONTEXT", "20000"]);
    assert_eq!(int_field(&c, "threshold_tokens"), 3_000);
    // A missing key reads as an empty session.
    let c = check(&mut con, "missing", &[]);
    assert_eq!((int_field(&c, "messages"), int_field(&c, "total_tokens"), int_field(&c, "summarize"), int_field(&c, "upto")), (0, 0, 0, 0));
    assert_eq!(int(&mut con, &["EXISTS", "missing"]), 0);
}

#[test]
fn summarize_check_errors() {
    let server = Server::start();
    let mut con = server.client();
    populated(&mut con, "k");
    let before = snap(&mut con, "k");
    for (args, needle) in [
        (vec!["MEM.SUMMARIZE_CHECK"], "wrong number of arguments"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "MODEL", "gpt-4o", "CONTEXT", "1000"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "CONTEXT", "1000", "MODEL", "gpt-4o"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "CONTEXT", "0"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "CONTEXT", "-5"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "CONTEXT", "big"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "KEEP", "-1"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "KEEP", "two"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "KEEP", "1", "keep", "2"], "given more than once"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "MODEL", "a", "MODEL", "b"], "given more than once"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "KEEP"], "needs a value"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "WINDOW", "5"], "unknown option 'WINDOW'"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "MODEL", ""], "ERR"),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, "k", &before, &format!("{args:?}"));
    }
}

#[test]
fn summarize_flag_of_append_matches_check() {
    let server = Server::start();
    let mut con = server.client();
    // By messages: MAXMSGS 3 -> the 3rd message meets the threshold.
    for i in 1..=4 {
        let r = append(&mut con, "m", "user", &format!("msg {i}"), &["MAXMSGS", "3"]);
        let c = check(&mut con, "m", &[]);
        assert_eq!(int_field(&r, "summarize"), i64::from(i >= 3), "append {i}");
        assert_eq!(int_field(&r, "summarize"), int_field(&c, "summarize"));
    }
    // By tokens: an unknown model uses mem.summarize-fallback-tokens.
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-fallback-tokens", "60"]);
    let mut total = 0;
    for i in 1..=12 {
        let content = format!("a sentence of several words, number {i}");
        let r = append(&mut con, "t", "user", &content, &["MODEL", "some-local-model"]);
        total += mt_o("user", &content);
        assert_eq!(int_field(&r, "total_tokens"), total);
        let c = check(&mut con, "t", &[]);
        assert_eq!(int_field(&c, "threshold_tokens"), 60);
        assert_eq!(int_field(&r, "summarize"), i64::from(total >= 60), "append {i}, total {total}");
        assert_eq!(int_field(&c, "summarize"), int_field(&r, "summarize"));
    }
}

#[test]
fn keep_upto_and_upto_tokens() {
    let server = Server::start();
    let mut con = server.client();
    for i in 1..=12 {
        append(&mut con, "k", if i % 2 == 1 { "user" } else { "assistant" }, &format!("turn {i} text"), &[]);
    }
    let e = get(&mut con, &["MEM.GET", "k"]);
    let tok = |id: i64| e[(id - 1) as usize].tokens;
    let sum = |a: i64, b: i64| (a..=b).map(tok).sum::<i64>();
    let c = check(&mut con, "k", &[]);
    assert_eq!(int_field(&c, "keep"), 10);
    assert_eq!(int_field(&c, "upto"), 2);
    assert_eq!(int_field(&c, "upto_tokens"), sum(1, 2));
    assert_eq!(int_field(&c, "messages"), 12);
    assert_eq!(int_field(&c, "total_tokens"), sum(1, 12));
    assert_eq!(int_field(&c, "summarize"), 0);
    let c = check(&mut con, "k", &["KEEP", "3"]);
    assert_eq!((int_field(&c, "keep"), int_field(&c, "upto"), int_field(&c, "upto_tokens")), (3, 9, sum(1, 9)));
    let c = check(&mut con, "k", &["keep", "0"]);
    assert_eq!((int_field(&c, "upto"), int_field(&c, "upto_tokens")), (12, sum(1, 12)));
    let c = check(&mut con, "k", &["KEEP", "12"]);
    assert_eq!((int_field(&c, "upto"), int_field(&c, "upto_tokens")), (0, 0));
    let c = check(&mut con, "k", &["KEEP", "50"]);
    assert_eq!((int_field(&c, "upto"), int_field(&c, "upto_tokens")), (0, 0));
    // mem.summarize-keep changes the default.
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-keep", "4"]);
    let c = check(&mut con, "k", &[]);
    assert_eq!((int_field(&c, "keep"), int_field(&c, "upto")), (4, 8));

    // upto moves back past tool messages so a result stays with its call.
    // ids: 1 user, 2 assistant(call), 3 tool, 4 tool, 5 user, 6 assistant
    for (role, content) in [("user", "q"), ("assistant", "call"), ("tool", "r1"), ("tool", "r2"), ("user", "thanks"), ("assistant", "bye")] {
        append(&mut con, "t", role, content, &[]);
    }
    let e = get(&mut con, &["MEM.GET", "t"]);
    let c = check(&mut con, "t", &["KEEP", "3"]);
    assert_eq!(int_field(&c, "upto"), 1, "the kept part would start with a tool message");
    assert_eq!(int_field(&c, "upto_tokens"), e[0].tokens);
    let c = check(&mut con, "t", &["KEEP", "2"]);
    assert_eq!(int_field(&c, "upto"), 4);
    let c = check(&mut con, "t", &["KEEP", "4"]);
    assert_eq!(int_field(&c, "upto"), 1);
    let c = check(&mut con, "t", &["KEEP", "5"]);
    assert_eq!(int_field(&c, "upto"), 1);

    // With a summary, upto_tokens counts it too.
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", "t", "1", "user asked q"]);
    let st = int_field(&r, "tokens");
    let c = check(&mut con, "t", &["KEEP", "1"]);
    assert_eq!(int_field(&c, "upto"), 5);
    assert_eq!(int_field(&c, "upto_tokens"), st + e[1..5].iter().map(|x| x.tokens).sum::<i64>());
    assert_eq!(int_field(&c, "total_tokens"), st + e[1..].iter().map(|x| x.tokens).sum::<i64>());
}

// ---------------------------------------------------------------- SUMMARIZE

#[test]
fn summarize_replaces_covered_messages() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{s}";
    for i in 1..=12 {
        append(&mut con, k, "user", &format!("Message {i}: details of the trip to Kyoto."), &["TTL", "1000"]);
    }
    let c = check(&mut con, k, &[]);
    let upto = int_field(&c, "upto");
    assert_eq!(upto, 2);
    let before = get(&mut con, &["MEM.GET", k]);
    // Appends in between: they are not covered.
    for i in 13..=15 {
        append(&mut con, k, "assistant", &format!("Reply {i}."), &[]);
    }
    let after_appends = get(&mut con, &["MEM.GET", k]);
    ok(&mut con, &["PEXPIRE", k, "50000"]);
    let text = "Summary: the user plans a trip to Kyoto; 旅行の計画。";
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, &upto.to_string(), text]);
    let st = mt_o("system", text);
    let rest: i64 = after_appends[2..].iter().map(|x| x.tokens).sum();
    assert_eq!(names(&r), OUTCOME_FIELDS);
    assert_eq!(int_field(&r, "id"), upto);
    assert_eq!(int_field(&r, "tokens"), st);
    assert_eq!(int_field(&r, "total_tokens"), st + rest);
    assert_eq!(int_field(&r, "messages"), 13);
    assert_eq!(int_field(&r, "trimmed"), 0);
    let c = check(&mut con, k, &[]);
    assert_eq!(int_field(&r, "summarize"), int_field(&c, "summarize"));
    let p = int(&mut con, &["PTTL", k]);
    assert!(p > 990_000, "SUMMARIZE refreshes the TTL: {p}");

    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].keys, ["id", "role", "content", "ts", "tokens"]);
    assert_eq!((e[0].id, e[0].role.as_str(), e[0].content.as_str(), e[0].tokens), (2, "summary", text, st));
    assert!((e[0].ts - now_ms()).abs() < 5_000);
    assert_eq!(&e[1..], &after_appends[2..], "messages after upto are untouched");
    assert_eq!(&e[1..11], &before[2..], "the checked messages are untouched too");
    let doc = json_doc(&mut con, k);
    assert_eq!(doc["summary"]["content"], text);
    assert_eq!(doc["summary"]["upto"], 2);
    assert_eq!(doc["summary"]["tokens"], st);
    assert_eq!(doc["summary"]["ts"], e[0].ts);
    assert!(doc["summary"]["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(doc["total_tokens"], st + rest);
    assert_eq!(doc["conversation_history"].as_array().unwrap().len(), 13);
    let i = info(&mut con, k);
    assert_eq!((int_field(&i, "summary_upto"), int_field(&i, "first_id"), int_field(&i, "last_id")), (2, 3, 15));

    // A later summary replaces the previous one.
    let text2 = "Summary v2.";
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, "10", text2]);
    let st2 = mt_o("system", text2);
    let rest2: i64 = after_appends[10..].iter().map(|x| x.tokens).sum();
    assert_eq!(int_field(&r, "total_tokens"), st2 + rest2);
    assert_eq!(int_field(&r, "messages"), 5);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(ids(&e), [10, 11, 12, 13, 14, 15]);
    assert_eq!(e[0].content, text2);
    // Summarizing up to the newest message leaves only the summary.
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, "15", "all of it"]);
    assert_eq!(int_field(&r, "messages"), 0);
    assert_eq!(int_field(&r, "total_tokens"), mt_o("system", "all of it"));
    let r = append(&mut con, k, "user", "next", &[]);
    assert_eq!(int_field(&r, "id"), 16);
}

#[test]
fn summarize_errors_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let k = "k";
    for i in 1..=8 {
        append(&mut con, k, "user", &format!("m{i}"), &["MAXMSGS", "6"]);
    }
    // ids 3..8 remain; summarize up to 5.
    ok(&mut con, &["MEM.SUMMARIZE", k, "5", "first"]);
    let before = snap(&mut con, k);
    for (args, needle) in [
        (vec!["MEM.SUMMARIZE", k, "4", "stale"], "below the current summary"),
        (vec!["MEM.SUMMARIZE", k, "3", "stale"], "ERR"),
        (vec!["MEM.SUMMARIZE", k, "5", "same upto"], "ERR"),
        (vec!["MEM.SUMMARIZE", k, "1", "evicted"], "ERR"),
        (vec!["MEM.SUMMARIZE", k, "99", "future"], "ERR"),
        (vec!["MEM.SUMMARIZE", k, "0", "zero"], "ERR"),
        (vec!["MEM.SUMMARIZE", k, "-1", "neg"], "ERR"),
        (vec!["MEM.SUMMARIZE", k, "seven", "nan"], "ERR"),
        (vec!["MEM.SUMMARIZE", k, "7"], "wrong number of arguments"),
        (vec!["MEM.SUMMARIZE", k], "wrong number of arguments"),
        (vec!["MEM.SUMMARIZE", k, "7", "text", "extra"], "ERR"),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, k, &before, &format!("{args:?}"));
    }
    let e = err_raw(&mut con, &[b"MEM.SUMMARIZE", b"k", b"7", &[0xff, 0xfe]]);
    assert!(e.starts_with("ERR"), "{e}");
    assert_unchanged(&mut con, k, &before, "invalid UTF-8 summary");
    ok(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "10"]);
    assert_err(&mut con, &["MEM.SUMMARIZE", k, "7", "a summary longer than ten bytes"], "ERR");
    assert_unchanged(&mut con, k, &before, "oversize summary");
    ok(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "4194304"]);
    // A missing key: an error, and the key is not created.
    assert_err(&mut con, &["MEM.SUMMARIZE", "missing", "1", "x"], "ERR");
    assert_eq!(int(&mut con, &["EXISTS", "missing"]), 0);
    // Still works with a valid upto.
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, "7", "second"]);
    assert_eq!(int_field(&r, "messages"), 1);
}

// ---------------------------------------------------------------- EXTSET / EXTGET

#[test]
fn extset_extget_basics() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "k", "dify"]), Value::Nil);
    assert_eq!(int(&mut con, &["EXISTS", "k"]), 0, "EXTGET does not create");
    assert_eq!(ok(&mut con, &["MEM.EXTSET", "k", "dify", "conv-1"]), Value::Okay);
    // Creates the session, with the default settings.
    let i = info(&mut con, "k");
    assert_eq!(int_field(&i, "messages"), 0);
    assert_eq!(int_field(&i, "ttl"), 86_400);
    let p = int(&mut con, &["PTTL", "k"]);
    assert!(p > 86_000_000, "{p}");
    assert_eq!(string(&mut con, &["MEM.EXTGET", "k", "dify"]), "conv-1");
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "k", "n8n"]), Value::Nil);
    ok(&mut con, &["MEM.EXTSET", "k", "n8n", "wf-9 with spaces ✓", "ex", "500"]);
    ok(&mut con, &["MEM.EXTSET", "k", "dify", "conv-2"]);
    assert_eq!(string(&mut con, &["MEM.EXTGET", "k", "dify"]), "conv-2");
    assert_eq!(string(&mut con, &["MEM.EXTGET", "k", "n8n"]), "wf-9 with spaces ✓");
    let ext: Vec<String> = redis::from_redis_value(&info(&mut con, "k").into_iter().find(|(n, _)| n == "external").unwrap().1).unwrap();
    let mut sorted = ext.clone();
    sorted.sort();
    assert_eq!(sorted, ["dify", "n8n"]);
    // Messages appended later keep the ids.
    let r = append(&mut con, "k", "user", "hi", &[]);
    assert_eq!(int_field(&r, "id"), 1);
    assert_eq!(string(&mut con, &["MEM.EXTGET", "k", "dify"]), "conv-2");
}

#[test]
fn extset_errors_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    populated(&mut con, "k");
    let before = snap(&mut con, "k");
    for (args, needle) in [
        (vec!["MEM.EXTSET", "k", "dify"], "wrong number of arguments"),
        (vec!["MEM.EXTSET", "k"], "wrong number of arguments"),
        (vec!["MEM.EXTSET", "k", "dify", "x", "EX", "0"], "ERR"),
        (vec!["MEM.EXTSET", "k", "dify", "x", "EX", "-1"], "ERR"),
        (vec!["MEM.EXTSET", "k", "dify", "x", "EX", "soon"], "ERR"),
        (vec!["MEM.EXTSET", "k", "dify", "x", "EX"], "needs a value"),
        (vec!["MEM.EXTSET", "k", "dify", "x", "EX", "1", "EX", "2"], "given more than once"),
        (vec!["MEM.EXTSET", "k", "dify", "x", "PX", "100"], "unknown option 'PX'"),
        (vec!["MEM.EXTSET", "k", "", "x"], "ERR"),
        (vec!["MEM.EXTGET", "k"], "wrong number of arguments"),
        (vec!["MEM.EXTGET", "k", "dify", "extra"], "wrong number of arguments"),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, "k", &before, &format!("{args:?}"));
    }
    for args in [
        vec![&b"MEM.EXTSET"[..], b"k", b"\xff", b"x"],
        vec![&b"MEM.EXTSET"[..], b"k", b"dify", b"\xfe\xff"],
    ] {
        let e = err_raw(&mut con, &args);
        assert!(e.starts_with("ERR"), "{e}");
        assert_unchanged(&mut con, "k", &before, "invalid UTF-8");
    }
    assert_err(&mut con, &["MEM.EXTSET", "new", "dify", "x", "EX", "0"], "ERR");
    assert_eq!(int(&mut con, &["EXISTS", "new"]), 0);
    assert_eq!(string(&mut con, &["MEM.EXTGET", "k", "dify"]), "conv-42");
}

#[test]
fn extset_expiry_and_key_expiry() {
    let server = Server::start();
    let mut con = server.client();
    // EX 1: gone after a second (while the session itself lives on).
    append(&mut con, "a", "user", "hi", &[]);
    ok(&mut con, &["MEM.EXTSET", "a", "dify", "short", "EX", "1"]);
    ok(&mut con, &["MEM.EXTSET", "a", "n8n", "long", "EX", "1000"]);
    // Default EX = mem.ext-ttl.
    ok(&mut con, &["CONFIG", "SET", "mem.ext-ttl", "1"]);
    append(&mut con, "b", "user", "hi", &["TTL", "0"]);
    ok(&mut con, &["MEM.EXTSET", "b", "dify", "default-ex"]);
    assert_eq!(string(&mut con, &["MEM.EXTGET", "a", "dify"]), "short");
    assert_eq!(string(&mut con, &["MEM.EXTGET", "b", "dify"]), "default-ex");
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "a", "dify"]), Value::Nil);
    assert_eq!(string(&mut con, &["MEM.EXTGET", "a", "n8n"]), "long");
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "b", "dify"]), Value::Nil);
    assert_eq!(int(&mut con, &["EXISTS", "b"]), 1);
    let ext: Vec<String> = redis::from_redis_value(&info(&mut con, "a").into_iter().find(|(n, _)| n == "external").unwrap().1).unwrap();
    assert_eq!(ext, ["n8n"], "MEM.INFO lists live ids only");
    ok(&mut con, &["CONFIG", "SET", "mem.ext-ttl", "86400"]);

    // The key never expires before an id: session TTL 5, EXTSET EX 100.
    append(&mut con, "c", "user", "hi", &["TTL", "5"]);
    ok(&mut con, &["MEM.EXTSET", "c", "dify", "x", "EX", "100"]);
    let p = int(&mut con, &["PTTL", "c"]);
    assert!(p > 95_000 && p <= 100_000, "EXTSET EX 100 on a 5 s session: PTTL {p}");
    // Nor does an append's sliding refresh shorten it.
    append(&mut con, "c", "user", "again", &[]);
    let p = int(&mut con, &["PTTL", "c"]);
    assert!(p > 95_000 && p <= 100_000, "append after EXTSET EX 100: PTTL {p}");
    // An id expiring sooner than the key does not shorten it.
    append(&mut con, "d", "user", "hi", &["TTL", "1000"]);
    ok(&mut con, &["MEM.EXTSET", "d", "dify", "x", "EX", "2"]);
    let p = int(&mut con, &["PTTL", "d"]);
    assert!(p > 990_000, "EXTSET EX 2 shortened the key: {p}");
    // Default EX (86400) on a session of TTL 5 and on a new session.
    append(&mut con, "e", "user", "hi", &["TTL", "5"]);
    ok(&mut con, &["MEM.EXTSET", "e", "dify", "x"]);
    assert!(int(&mut con, &["PTTL", "e"]) > 86_000_000);
    ok(&mut con, &["CONFIG", "SET", "mem.ttl", "5"]);
    ok(&mut con, &["MEM.EXTSET", "f", "dify", "x", "EX", "100"]);
    let p = int(&mut con, &["PTTL", "f"]);
    assert!(p > 95_000 && p <= 100_000, "EXTSET creating a 5 s session with EX 100: PTTL {p}");
}

// ---------------------------------------------------------------- IMPORT

#[test]
fn import_round_trips_format_json() {
    let server = Server::start();
    let mut con = server.client();
    populated(&mut con, "src");
    append(&mut con, "src", "user", "emoji 👩‍👩‍👧 and tabs\t\tand 中文", &["META", r#"{"name":"Ann","n":[1,2,{"x":null}]}"#]);
    let doc_text = json_text(&mut con, "src");
    let doc: Json = serde_json::from_str(&doc_text).unwrap();
    assert!(doc["summary"].is_object());
    let r = map_reply(&mut con, &["MEM.IMPORT", "dst", &doc_text]);
    let src_entries = get(&mut con, &["MEM.GET", "src"]);
    let last = src_entries.last().unwrap();
    assert_eq!(names(&r), OUTCOME_FIELDS);
    assert_eq!(int_field(&r, "id"), last.id);
    assert_eq!(int_field(&r, "tokens"), last.tokens);
    assert_eq!(int_field(&r, "total_tokens"), doc["total_tokens"].as_i64().unwrap());
    assert_eq!(int_field(&r, "messages"), 4);
    assert_eq!(int_field(&r, "trimmed"), 0);
    assert_eq!(json_doc(&mut con, "dst"), doc, "FORMAT JSON -> IMPORT -> FORMAT JSON");
    // Meta is compared as JSON: an import may re-serialize it.
    let norm = |e: Vec<Entry>| -> Vec<(Entry, Option<Json>)> {
        e.into_iter()
            .map(|mut x| {
                let m = x.meta.take().map(|m| serde_json::from_str::<Json>(&m).unwrap());
                (x, m)
            })
            .collect()
    };
    assert_eq!(norm(get(&mut con, &["MEM.GET", "dst"])), norm(src_entries.clone()));
    let (i1, i2) = (info(&mut con, "src"), info(&mut con, "dst"));
    for f in ["messages", "total_tokens", "model", "encoding", "first_id", "last_id", "summary_upto"] {
        assert_eq!(
            i1.iter().find(|(n, _)| n == f).unwrap().1,
            i2.iter().find(|(n, _)| n == f).unwrap().1,
            "INFO {f}"
        );
    }
    let r = append(&mut con, "dst", "user", "continue", &[]);
    assert_eq!(int_field(&r, "id"), last.id + 1, "ids continue after the imported ones");
    // A cl100k session round-trips too, tokens included.
    append(&mut con, "c", "user", "中文 text", &["MODEL", "gpt-4"]);
    let doc_text = json_text(&mut con, "c");
    ok(&mut con, &["MEM.IMPORT", "c2", &doc_text]);
    assert_eq!(json_text(&mut con, "c2"), doc_text);
    assert_eq!(str_field(&info(&mut con, "c2"), "encoding"), "cl100k_base");
}

#[test]
fn import_client_side_shape() {
    let server = Server::start();
    let mut con = server.client();
    let doc = json!({
        "conversation_history": [
            {"role": "user", "content": "Hi, I'm Ann.", "timestamp": "2024-05-01T10:00:00Z"},
            {"role": "assistant", "content": "Hello Ann! 👋", "timestamp": "2024-05-01T10:00:05.250+02:00"},
            {"role": "user", "content": "Plan my trip to 京都.", "timestamp": "2024-05-01T10:01:00"},
            {"role": "assistant", "content": "Sure.", "timestamp": "2024-05-01T10:01:30.5"}
        ],
        "user_profile": {"name": "Ann", "preferences": {"lang": "en", "tags": ["travel", 1, null]}},
        "context": {"topic": "travel", "turns": 4}
    });
    let before = now_ms();
    let r = map_reply(&mut con, &["MEM.IMPORT", "mem:{ann}", &doc.to_string()]);
    let t = [
        mt_o("user", "Hi, I'm Ann."),
        mt_o("assistant", "Hello Ann! 👋"),
        mt_o("user", "Plan my trip to 京都."),
        mt_o("assistant", "Sure."),
    ];
    assert_eq!(int_field(&r, "id"), 4);
    assert_eq!(int_field(&r, "tokens"), t[3]);
    assert_eq!(int_field(&r, "total_tokens"), t.iter().sum::<i64>());
    assert_eq!(int_field(&r, "messages"), 4);
    assert_eq!(int_field(&r, "trimmed"), 0);
    assert_eq!(int_field(&r, "summarize"), 0);
    let e = get(&mut con, &["MEM.GET", "mem:{ann}"]);
    assert_eq!(ids(&e), [1, 2, 3, 4]);
    assert_eq!(e.iter().map(|x| x.tokens).collect::<Vec<_>>(), t);
    let base = 1_714_557_600_000i64; // 2024-05-01T10:00:00Z
    assert_eq!(e[0].ts, base);
    assert_eq!(e[1].ts, base - 2 * 3_600_000 + 5_250, "+02:00 is converted to UTC");
    assert_eq!(e[2].ts, base + 60_000, "no zone means UTC");
    assert_eq!(e[3].ts, base + 90_500);
    let out = json_doc(&mut con, "mem:{ann}");
    assert_eq!(out["user_profile"], doc["user_profile"], "user_profile at the top level");
    assert_eq!(out["context"], doc["context"], "context at the top level");
    assert_eq!(out["conversation_history"][0]["timestamp"], "2024-05-01T10:00:00.000Z");
    assert_eq!(out["conversation_history"][1]["timestamp"], "2024-05-01T08:00:05.250Z");
    assert_eq!(out["conversation_history"][2]["timestamp"], "2024-05-01T10:01:00.000Z");
    assert_eq!(out["summary"], Json::Null);
    assert_eq!(out["model"], "gpt-4o");
    assert_eq!(out["total_tokens"], t.iter().sum::<i64>());
    let i = info(&mut con, "mem:{ann}");
    assert!(int_field(&i, "created") >= before - 1000);
    let p = int(&mut con, &["PTTL", "mem:{ann}"]);
    assert!(p > 86_000_000, "the session TTL applies to an import: {p}");
    // The extra members survive later writes and a second round trip.
    append(&mut con, "mem:{ann}", "user", "more", &[]);
    let again = json_doc(&mut con, "mem:{ann}");
    assert_eq!(again["user_profile"], doc["user_profile"]);
    let text = json_text(&mut con, "mem:{ann}");
    ok(&mut con, &["MEM.IMPORT", "copy", &text]);
    assert_eq!(json_doc(&mut con, "copy"), again);

    // Messages without a timestamp get the server's clock.
    ok(&mut con, &["MEM.IMPORT", "nots", r#"{"conversation_history":[{"role":"user","content":"x"}]}"#]);
    let e = get(&mut con, &["MEM.GET", "nots"]);
    assert!((e[0].ts - now_ms()).abs() < 5_000);
    // An empty history is a valid document.
    let r = map_reply(&mut con, &["MEM.IMPORT", "empty", r#"{"conversation_history":[],"user_profile":{"a":1}}"#]);
    assert_eq!((int_field(&r, "messages"), int_field(&r, "total_tokens")), (0, 0));
    assert_eq!(json_doc(&mut con, "empty")["user_profile"], json!({"a": 1}));
}

#[test]
fn import_busykey_replace_and_options() {
    let server = Server::start();
    let mut con = server.client();
    populated(&mut con, "k");
    let doc = r#"{"conversation_history":[{"role":"user","content":"Bonjour tout le monde"},{"role":"assistant","content":"你好，世界"}]}"#;
    let before = snap(&mut con, "k");
    let e = err(&mut con, &["MEM.IMPORT", "k", doc]);
    assert!(e.starts_with("BUSYKEY"), "{e}");
    assert_unchanged(&mut con, "k", &before, "IMPORT on an existing key");

    let r = map_reply(&mut con, &["MEM.IMPORT", "k", doc, "replace", "MODEL", "gpt-4", "TTL", "50"]);
    let t = [mt_c("user", "Bonjour tout le monde"), mt_c("assistant", "你好，世界")];
    assert_ne!(t.to_vec(), vec![mt_o("user", "Bonjour tout le monde"), mt_o("assistant", "你好，世界")], "texts that tell the encodings apart");
    assert_eq!(int_field(&r, "total_tokens"), t[0] + t[1]);
    assert_eq!(int_field(&r, "id"), 2);
    let i = info(&mut con, "k");
    assert_eq!((str_field(&i, "model"), str_field(&i, "encoding")), ("gpt-4".to_owned(), "cl100k_base".to_owned()));
    assert_eq!(int_field(&i, "ttl"), 50);
    assert_eq!(int_field(&i, "summary_upto"), 0);
    let p = int(&mut con, &["PTTL", "k"]);
    assert!(p > 45_000 && p <= 50_000, "{p}");
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "k", "dify"]), Value::Nil, "REPLACE replaces the whole session");
    assert_eq!(ids(&get(&mut con, &["MEM.GET", "k"])), [1, 2]);

    // TTL 0: no expiry.
    ok(&mut con, &["MEM.IMPORT", "k", doc, "TTL", "0", "REPLACE"]);
    assert_eq!(int(&mut con, &["TTL", "k"]), -1);
    assert_eq!(str_field(&info(&mut con, "k"), "model"), "gpt-4o");
    assert_eq!(int_field(&info(&mut con, "k"), "total_tokens"), mt_o("user", "Bonjour tout le monde") + mt_o("assistant", "你好，世界"));

    // The document's model is used; the MODEL option wins over it.
    let with_model = r#"{"conversation_history":[{"role":"user","content":"你好，世界"}],"model":"gpt-3.5-turbo"}"#;
    ok(&mut con, &["MEM.IMPORT", "m1", with_model]);
    let i = info(&mut con, "m1");
    assert_eq!((str_field(&i, "model"), str_field(&i, "encoding")), ("gpt-3.5-turbo".to_owned(), "cl100k_base".to_owned()));
    assert_eq!(int_field(&i, "total_tokens"), mt_c("user", "你好，世界"));
    ok(&mut con, &["MEM.IMPORT", "m2", with_model, "MODEL", "gpt-4o-mini"]);
    let i = info(&mut con, "m2");
    assert_eq!((str_field(&i, "model"), str_field(&i, "encoding")), ("gpt-4o-mini".to_owned(), "o200k_base".to_owned()));
    assert_eq!(int_field(&i, "total_tokens"), mt_o("user", "你好，世界"));

    // Caps apply: 40 messages into a default session keep the newest 30.
    let history: Vec<Json> = (1..=40).map(|i| json!({"role": "user", "content": format!("line {i}")})).collect();
    let r = map_reply(&mut con, &["MEM.IMPORT", "big", &json!({"conversation_history": history}).to_string()]);
    assert_eq!((int_field(&r, "id"), int_field(&r, "messages"), int_field(&r, "trimmed")), (40, 30, 10));
    assert_eq!(int_field(&r, "summarize"), 1, "30 messages meet threshold_messages");
    assert_eq!(ids(&get(&mut con, &["MEM.GET", "big"]))[0], 11);
}

#[test]
fn import_invalid_documents_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    populated(&mut con, "k");
    let before = snap(&mut con, "k");
    let bad_docs = [
        "",
        "not json",
        "[]",
        "{}",
        "null",
        r#"{"conversation_history":{}}"#,
        r#"{"conversation_history":"x"}"#,
        r#"{"conversation_history":[1]}"#,
        r#"{"conversation_history":[{"content":"no role"}]}"#,
        r#"{"conversation_history":[{"role":"","content":"x"}]}"#,
        r#"{"conversation_history":[{"role":"user"}]}"#,
        r#"{"conversation_history":[{"role":"user","content":5}]}"#,
        r#"{"conversation_history":[{"role":"user","content":"x","meta":[1]}]}"#,
        r#"{"conversation_history":[{"role":"user","content":"x","timestamp":"yesterday"}]}"#,
        r#"{"conversation_history":[{"role":"user","content":"x","timestamp":true}]}"#,
        r#"{"conversation_history":[],"summary":{"content":"s"}}"#,
        r#"{"conversation_history":[],"summary":"text"}"#,
        r#"{"conversation_history":[],"model":""}"#,
        r#"{"conversation_history":[{"id":2,"role":"user","content":"a"},{"id":1,"role":"user","content":"b"}]}"#,
        r#"{"conversation_history":[{"id":1,"role":"user","content":"a"},{"role":"user","content":"b"}]}"#,
        r#"{"conversation_history":[{"id":-1,"role":"user","content":"a"}]}"#,
        r#"{"conversation_history":[{"role":"user","content":"a"}]} trailing"#,
    ];
    for doc in bad_docs {
        for key in ["k", "fresh"] {
            let e = err(&mut con, &["MEM.IMPORT", key, doc, "REPLACE"]);
            assert!(e.starts_with("ERR"), "{doc}: {e}");
        }
        assert_unchanged(&mut con, "k", &before, doc);
        assert_eq!(int(&mut con, &["EXISTS", "fresh"]), 0, "{doc}");
    }
    let role65 = json!({"conversation_history": [{"role": "r".repeat(65), "content": "x"}]}).to_string();
    assert_err(&mut con, &["MEM.IMPORT", "k", &role65, "REPLACE"], "ERR");
    assert_unchanged(&mut con, "k", &before, "65-byte role");
    let good = r#"{"conversation_history":[{"role":"user","content":"hello"}]}"#;
    for (args, needle) in [
        (vec!["MEM.IMPORT", "k"], "wrong number of arguments"),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "REPLACE"], "given more than once"),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "TTL", "-1"], "ERR"),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "TTL", "x"], "ERR"),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "TTL"], "needs a value"),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "MODEL", ""], "ERR"),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "MODEL"], "needs a value"),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "FORCE"], "unknown option 'FORCE'"),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, "k", &before, &format!("{args:?}"));
    }
    let e = err_raw(&mut con, &[b"MEM.IMPORT", b"k", b"{\"conversation_history\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", b"REPLACE"]);
    assert!(e.starts_with("ERR"), "{e}");
    assert_unchanged(&mut con, "k", &before, "invalid UTF-8 document");
    ok(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "10"]);
    let long = r#"{"conversation_history":[{"role":"user","content":"more than ten bytes"}]}"#;
    assert_err(&mut con, &["MEM.IMPORT", "k", long, "REPLACE"], "ERR");
    assert_unchanged(&mut con, "k", &before, "oversize imported content");
}

// ---------------------------------------------------------------- MEM.GET

#[test]
fn get_last_after_budget_and_format() {
    let server = Server::start();
    let mut con = server.client();
    let k = "g";
    let long = "This message is deliberately much longer than the others, with many many words in it. ".repeat(5);
    for i in 1..=10 {
        let content = if i == 7 { long.clone() } else { format!("short {i}") };
        append(&mut con, k, "user", &content, &[]);
    }
    let all = get(&mut con, &["MEM.GET", k]);
    assert_eq!(ids(&all), (1..=10).collect::<Vec<_>>());
    assert_eq!(get(&mut con, &["MEM.GET", k, "FORMAT", "RESP"]), all);
    assert_eq!(get(&mut con, &["MEM.GET", k, "format", "resp"]), all);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "LAST", "3"])), [8, 9, 10]);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "LAST", "100"])), (1..=10).collect::<Vec<_>>());
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "LAST", "0"])), Vec::<i64>::new());
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "AFTER", "7"])), [8, 9, 10]);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "after", "0"])), (1..=10).collect::<Vec<_>>());
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "AFTER", "10"])), Vec::<i64>::new());
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "AFTER", "1000"])), Vec::<i64>::new());
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "LAST", "2", "AFTER", "5"])), [9, 10]);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "AFTER", "8", "LAST", "5"])), [9, 10]);

    // BUDGET: the newest contiguous run that fits; it stops at message 7
    // even though older short messages would fit.
    let t = |id: i64| all[(id - 1) as usize].tokens;
    let run = t(8) + t(9) + t(10);
    assert!(t(7) > t(1) + t(2));
    let budget = run + t(7) - 1;
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "BUDGET", &budget.to_string()])), [8, 9, 10]);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "BUDGET", &run.to_string()])), [8, 9, 10]);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "BUDGET", &(run - 1).to_string()])), [9, 10]);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "BUDGET", &(run + t(7)).to_string()])), [7, 8, 9, 10]);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "BUDGET", "0"])), Vec::<i64>::new());
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "BUDGET", "1000000"])), (1..=10).collect::<Vec<_>>());
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "LAST", "2", "BUDGET", "1000000"])), [9, 10]);
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "AFTER", "8", "BUDGET", &t(10).to_string()])), [10]);

    // With a summary: it comes first, and counts against the budget.
    let text = "Summary of messages one to three.";
    ok(&mut con, &["MEM.SUMMARIZE", k, "3", text]);
    let st = mt_o("system", text);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(ids(&e), [3, 4, 5, 6, 7, 8, 9, 10]);
    assert_eq!((e[0].role.as_str(), e[0].tokens), ("summary", st));
    let e = get(&mut con, &["MEM.GET", k, "LAST", "2"]);
    assert_eq!(ids(&e), [3, 9, 10]);
    assert_eq!(e[0].role, "summary");
    let e = get(&mut con, &["MEM.GET", k, "LAST", "0"]);
    assert_eq!((ids(&e), e[0].role.as_str()), (vec![3], "summary"));
    let e = get(&mut con, &["MEM.GET", k, "AFTER", "3"]);
    assert_eq!(ids(&e), [4, 5, 6, 7, 8, 9, 10], "AFTER: no summary");
    assert!(e.iter().all(|x| x.role != "summary"));
    let e = get(&mut con, &["MEM.GET", k, "BUDGET", &(st + run).to_string()]);
    assert_eq!(ids(&e), [3, 8, 9, 10]);
    assert_eq!(e[0].role, "summary");
    let e = get(&mut con, &["MEM.GET", k, "BUDGET", &(st + run - 1).to_string()]);
    assert_eq!(ids(&e), [3, 9, 10]);
    let e = get(&mut con, &["MEM.GET", k, "BUDGET", &st.to_string()]);
    assert_eq!(ids(&e), [3]);
    let e = get(&mut con, &["MEM.GET", k, "BUDGET", &(st - 1).to_string()]);
    assert!(e.is_empty(), "the summary alone is over the budget: {e:?}");
    let e = get(&mut con, &["MEM.GET", k, "AFTER", "3", "BUDGET", &run.to_string()]);
    assert_eq!(ids(&e), [8, 9, 10], "AFTER: the budget has no summary to pay for");
    let e = get(&mut con, &["MEM.GET", k, "LAST", "2", "BUDGET", &(st + t(10)).to_string()]);
    assert_eq!(ids(&e), [3, 10]);

    // FORMAT JSON honours the selection; total_tokens is the session's.
    let doc: Json = serde_json::from_str(&string(&mut con, &["MEM.GET", k, "LAST", "2", "FORMAT", "json"])).unwrap();
    let hist = doc["conversation_history"].as_array().unwrap();
    assert_eq!(hist.iter().map(|m| m["id"].as_i64().unwrap()).collect::<Vec<_>>(), [9, 10]);
    assert_eq!(doc["summary"]["upto"], 3);
    let total: i64 = st + (4..=10).map(t).sum::<i64>();
    assert_eq!(doc["total_tokens"], total);
    assert_eq!(doc["model"], "gpt-4o");
    for m in hist {
        let mut keys: Vec<&str> = m.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["content", "id", "role", "timestamp", "tokens", "ts"]);
    }
    let doc: Json = serde_json::from_str(&string(&mut con, &["MEM.GET", k, "AFTER", "9", "FORMAT", "JSON"])).unwrap();
    assert_eq!(doc["summary"], Json::Null);
    assert_eq!(doc["conversation_history"].as_array().unwrap().len(), 1);

    // Errors.
    let before = snap(&mut con, k);
    for (args, needle) in [
        (vec!["MEM.GET"], "wrong number of arguments"),
        (vec!["MEM.GET", k, "LAST", "-1"], "ERR"),
        (vec!["MEM.GET", k, "LAST", "x"], "ERR"),
        (vec!["MEM.GET", k, "AFTER", "-2"], "ERR"),
        (vec!["MEM.GET", k, "AFTER", "1.5"], "ERR"),
        (vec!["MEM.GET", k, "BUDGET", "-1"], "ERR"),
        (vec!["MEM.GET", k, "BUDGET", "lots"], "ERR"),
        (vec!["MEM.GET", k, "LAST", "1", "LAST", "2"], "given more than once"),
        (vec!["MEM.GET", k, "FORMAT", "JSON", "format", "RESP"], "given more than once"),
        (vec!["MEM.GET", k, "LAST"], "needs a value"),
        (vec!["MEM.GET", k, "BUDGET"], "needs a value"),
        (vec!["MEM.GET", k, "FORMAT"], "needs a value"),
        (vec!["MEM.GET", k, "FORMAT", "XML"], "ERR"),
        (vec!["MEM.GET", k, "FIRST", "1"], "unknown option 'FIRST'"),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, k, &before, &format!("{args:?}"));
    }
}

#[test]
fn missing_key_replies() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(ok(&mut con, &["MEM.GET", "nope"]), Value::Array(vec![]));
    assert_eq!(ok(&mut con, &["MEM.GET", "nope", "LAST", "5", "BUDGET", "100"]), Value::Array(vec![]));
    let doc = json_doc(&mut con, "nope");
    assert_eq!(doc["conversation_history"], json!([]));
    assert_eq!(doc["summary"], Json::Null);
    assert_eq!(doc["total_tokens"], 0);
    assert_eq!(doc["model"], "gpt-4o");
    assert_eq!(ok(&mut con, &["MEM.INFO", "nope"]), Value::Nil);
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "nope", "dify"]), Value::Nil);
    assert_eq!(int(&mut con, &["EXISTS", "nope"]), 0);
    assert_eq!(int(&mut con, &["DBSIZE"]), 0, "reads created nothing");
    assert_err(&mut con, &["MEM.INFO"], "wrong number of arguments");
    assert_err(&mut con, &["MEM.INFO", "a", "b"], "wrong number of arguments");
}

// ---------------------------------------------------------------- MEM.INFO

#[test]
fn info_fields() {
    let server = Server::start();
    let mut con = server.client();
    let t0 = now_ms();
    append(&mut con, "k", "user", "first message", &["TS", "1000", "MAXMSGS", "4", "MAXTOKENS", "7000", "TTL", "600"]);
    let i = info(&mut con, "k");
    assert_eq!(names(&i), INFO_FIELDS);
    let created = int_field(&i, "created");
    assert!(created >= t0 - 1000 && created <= now_ms() + 1000, "created is the server clock, not TS");
    std::thread::sleep(Duration::from_millis(20));
    for n in 2..=6 {
        append(&mut con, "k", "assistant", &format!("reply {n}"), &[]);
    }
    ok(&mut con, &["MEM.SUMMARIZE", "k", "4", "summary"]);
    ok(&mut con, &["MEM.EXTSET", "k", "dify", "c1"]);
    ok(&mut con, &["MEM.EXTSET", "k", "n8n", "c2"]);
    let e = get(&mut con, &["MEM.GET", "k"]);
    let i = info(&mut con, "k");
    assert_eq!(int_field(&i, "messages"), 2);
    assert_eq!(int_field(&i, "total_tokens"), e.iter().map(|x| x.tokens).sum::<i64>());
    assert_eq!(str_field(&i, "model"), "gpt-4o");
    assert_eq!(str_field(&i, "encoding"), "o200k_base");
    assert_eq!(int_field(&i, "context_window"), 128_000);
    assert_eq!(int_field(&i, "maxtokens"), 7000);
    assert_eq!(int_field(&i, "maxmsgs"), 4);
    assert_eq!(int_field(&i, "ttl"), 600);
    assert_eq!(int_field(&i, "first_id"), 5);
    assert_eq!(int_field(&i, "last_id"), 6);
    assert_eq!(int_field(&i, "created"), created, "created does not move");
    let updated = int_field(&i, "updated");
    assert!(updated > created, "updated {updated} created {created}");
    assert!(updated <= now_ms() + 1000);
    assert_eq!(int_field(&i, "summary_upto"), 4);
    let mut ext: Vec<String> = redis::from_redis_value(&i[13].1).unwrap();
    ext.sort();
    assert_eq!(ext, ["dify", "n8n"]);
    // Unknown model: context_window 0. Summarized to the end: first_id 0.
    ok(&mut con, &["MEM.SUMMARIZE", "k", "6", "everything"]);
    append(&mut con, "u", "user", "x", &["MODEL", "acme-chat-7b"]);
    let i = info(&mut con, "u");
    assert_eq!(int_field(&i, "context_window"), 0);
    assert_eq!(str_field(&i, "encoding"), "o200k_base");
    let i = info(&mut con, "k");
    assert_eq!((int_field(&i, "messages"), int_field(&i, "first_id"), int_field(&i, "last_id")), (0, 0, 6));
    // A session created by EXTSET.
    ok(&mut con, &["MEM.EXTSET", "x", "dify", "c"]);
    let i = info(&mut con, "x");
    assert_eq!((int_field(&i, "messages"), int_field(&i, "total_tokens"), int_field(&i, "first_id"), int_field(&i, "last_id"), int_field(&i, "summary_upto")), (0, 0, 0, 0, 0));
}

// ---------------------------------------------------------------- configuration

#[test]
fn config_get_set_every_mem_config() {
    let server = Server::start();
    let mut con = server.client();
    let defaults = [
        ("mem.ttl", "86400", "3600"),
        ("mem.ext-ttl", "86400", "60"),
        ("mem.max-tokens", "80000", "12345"),
        ("mem.max-messages", "30", "7"),
        ("mem.summarize-ratio", "15", "50"),
        ("mem.summarize-fallback-tokens", "15000", "999"),
        ("mem.summarize-keep", "10", "0"),
        ("mem.default-model", "gpt-4o", "claude-3-5-sonnet"),
        ("mem.default-encoding", "o200k_base", "cl100k_base"),
        ("mem.max-message-bytes", "4194304", "1048576"),
        ("mem.async-threshold-bytes", "65536", "1024"),
    ];
    for (name, default, new) in defaults {
        assert_eq!(config_get(&mut con, name), default, "default of {name}");
        ok(&mut con, &["CONFIG", "SET", name, new]);
        assert_eq!(config_get(&mut con, name), new, "{name} after CONFIG SET");
    }
    // Memory configs take units.
    ok(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "5mb"]);
    assert_eq!(config_get(&mut con, "mem.max-message-bytes"), (5 * 1024 * 1024).to_string());
    // Invalid values are refused and leave the value as it was.
    for (name, bad) in [
        ("mem.default-encoding", "p50k_base"),
        ("mem.default-encoding", "gpt2"),
        ("mem.summarize-ratio", "0"),
        ("mem.summarize-ratio", "101"),
        ("mem.summarize-ratio", "-5"),
        ("mem.max-messages", "0"),
        ("mem.max-tokens", "0"),
        ("mem.max-tokens", "abc"),
        ("mem.ttl", "-1"),
        ("mem.ext-ttl", "0"),
        ("mem.summarize-fallback-tokens", "0"),
        ("mem.summarize-keep", "-1"),
        ("mem.default-model", ""),
        ("mem.max-message-bytes", "0"),
    ] {
        let prev = config_get(&mut con, name);
        let e = err(&mut con, &["CONFIG", "SET", name, bad]);
        assert!(e.starts_with("ERR"), "CONFIG SET {name} {bad}: {e}");
        assert_eq!(config_get(&mut con, name), prev, "{name} changed by a refused value");
    }
    // CONFIG GET with a pattern lists all of them.
    let all = as_fields(ok(&mut con, &["CONFIG", "GET", "mem.*"]));
    assert_eq!(all.len(), defaults.len());
}

#[test]
fn new_sessions_use_the_config() {
    let server = Server::start();
    let mut con = server.client();
    append(&mut con, "old", "user", "before the change", &[]);

    ok(&mut con, &["CONFIG", "SET", "mem.max-messages", "3"]);
    ok(&mut con, &["CONFIG", "SET", "mem.max-tokens", "5000"]);
    ok(&mut con, &["CONFIG", "SET", "mem.ttl", "120"]);
    for i in 1..=5 {
        append(&mut con, "new", "user", &format!("m{i}"), &[]);
        append(&mut con, "old", "user", &format!("m{i}"), &[]);
    }
    let i = info(&mut con, "new");
    assert_eq!((int_field(&i, "maxmsgs"), int_field(&i, "maxtokens"), int_field(&i, "ttl"), int_field(&i, "messages")), (3, 5000, 120, 3));
    let p = int(&mut con, &["PTTL", "new"]);
    assert!(p > 115_000 && p <= 120_000, "{p}");
    let c = check(&mut con, "new", &[]);
    assert_eq!((int_field(&c, "threshold_tokens"), int_field(&c, "threshold_messages")), (5000, 3));
    // Existing sessions keep their own settings.
    let i = info(&mut con, "old");
    assert_eq!((int_field(&i, "maxmsgs"), int_field(&i, "maxtokens"), int_field(&i, "ttl"), int_field(&i, "messages")), (30, 80_000, 86_400, 6));

    // mem.default-model.
    ok(&mut con, &["CONFIG", "SET", "mem.default-model", "gpt-4"]);
    let r = append(&mut con, "g4", "user", "你好，世界", &[]);
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "你好，世界"));
    let i = info(&mut con, "g4");
    assert_eq!((str_field(&i, "model"), str_field(&i, "encoding")), ("gpt-4".to_owned(), "cl100k_base".to_owned()));
    assert_eq!(json_doc(&mut con, "missing")["model"], "gpt-4");

    // mem.default-encoding for a model without a public tokenizer.
    ok(&mut con, &["CONFIG", "SET", "mem.default-model", "claude-3-5-sonnet"]);
    ok(&mut con, &["CONFIG", "SET", "mem.default-encoding", "cl100k_base"]);
    let r = append(&mut con, "cl", "user", "你好，世界", &[]);
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "你好，世界"));
    let i = info(&mut con, "cl");
    assert_eq!((str_field(&i, "model"), str_field(&i, "encoding"), int_field(&i, "context_window")), ("claude-3-5-sonnet".to_owned(), "cl100k_base".to_owned(), 200_000));
    let r = append(&mut con, "gem", "user", "你好，世界", &["MODEL", "gemini-1.5-pro"]);
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "你好，世界"));
    assert_eq!(str_field(&info(&mut con, "gem"), "encoding"), "cl100k_base");
    // A model with a public tokenizer ignores the default encoding.
    let r = append(&mut con, "o", "user", "你好，世界", &["MODEL", "gpt-4o"]);
    assert_eq!(int_field(&r, "tokens"), mt_o("user", "你好，世界"));
    ok(&mut con, &["CONFIG", "SET", "mem.default-encoding", "o200k_base"]);
    let r = append(&mut con, "cl2", "user", "你好，世界", &[]);
    assert_eq!(int_field(&r, "tokens"), mt_o("user", "你好，世界"));
    assert_eq!(str_field(&info(&mut con, "cl2"), "encoding"), "o200k_base");

    // mem.summarize-ratio, mem.summarize-fallback-tokens, mem.summarize-keep.
    ok(&mut con, &["CONFIG", "SET", "mem.max-tokens", "80000"]);
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-ratio", "10"]);
    append(&mut con, "r", "user", "x", &["MODEL", "gpt-4o"]);
    assert_eq!(int_field(&check(&mut con, "r", &[]), "threshold_tokens"), 12_800);
    assert_eq!(int_field(&check(&mut con, "r", &["MODEL", "claude-3-5-sonnet"]), "threshold_tokens"), 20_000);
    assert_eq!(int_field(&check(&mut con, "r", &["CONTEXT", "1000"]), "threshold_tokens"), 100);
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-fallback-tokens", "4321"]);
    assert_eq!(int_field(&check(&mut con, "r", &["MODEL", "mystery"]), "threshold_tokens"), 4321);
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-keep", "1"]);
    let c = check(&mut con, "r", &[]);
    assert_eq!(int_field(&c, "keep"), 1);

    // mem.async-threshold-bytes: content at or above it may be counted off
    // the main thread; the counts are the same either way.
    ok(&mut con, &["CONFIG", "SET", "mem.async-threshold-bytes", "16"]);
    let big = "Large message of prose, counted off the main thread. 大きなメッセージ。 ".repeat(2_000);
    let mut total = 0;
    for content in ["tiny", "exactly sixteen!", "a bit more than sixteen bytes", big.as_str()] {
        let r = append(&mut con, "async", "user", content, &["MODEL", "gpt-4o", "MAXMSGS", "100"]);
        total += mt_o("user", content);
        assert_eq!(int_field(&r, "tokens"), mt_o("user", content), "{} bytes", content.len());
        assert_eq!(int_field(&r, "total_tokens"), total);
    }
    let e = get(&mut con, &["MEM.GET", "async"]);
    assert_eq!(ids(&e), [1, 2, 3, 4]);
    assert_eq!(e[3].content, big);

    // loadmodule arguments set the configs too.
    let s2 = Server::with_module_args(&[], &["max-messages", "7", "default-model", "gpt-4.1"]);
    let mut c2 = s2.client();
    assert_eq!(config_get(&mut c2, "mem.max-messages"), "7");
    append(&mut c2, "k", "user", "hi", &[]);
    let i = info(&mut c2, "k");
    assert_eq!((int_field(&i, "maxmsgs"), str_field(&i, "model")), (7, "gpt-4.1".to_owned()));
}

// ---------------------------------------------------------------- model change

#[test]
fn model_change_recounts_with_the_new_tokenizer() {
    let server = Server::start();
    let mut con = server.client();
    let k = "m";
    let texts = [
        ("user", "我们在 Redis 里保存对话记忆。"),
        ("assistant", "日本語のテキストも数えます。"),
        ("user", "def f(x):\n    return x ** 2  # 🐍"),
        ("assistant", "Ελληνικά και русский текст."),
    ];
    for (role, content) in texts {
        append(&mut con, k, role, content, &[]);
    }
    let summary = "要約：ユーザーは記憶について質問した。";
    ok(&mut con, &["MEM.SUMMARIZE", k, "1", summary]);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].tokens, mt_o("system", summary));
    for (x, (role, content)) in e[1..].iter().zip(&texts[1..]) {
        assert_eq!(x.tokens, mt_o(role, content));
    }
    let o_total = mt_o("system", summary) + texts[1..].iter().map(|(r, c)| mt_o(r, c)).sum::<i64>();
    let c_total = mt_c("system", summary) + texts[1..].iter().map(|(r, c)| mt_c(r, c)).sum::<i64>();
    assert_ne!(o_total, c_total, "the corpus must tell the encodings apart");

    // gpt-4: cl100k_base, everything re-counted.
    let r = append(&mut con, k, "user", "再见", &["MODEL", "gpt-4"]);
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "再见"));
    assert_eq!(int_field(&r, "total_tokens"), c_total + mt_c("user", "再见"));
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].tokens, mt_c("system", summary), "summary re-counted");
    for (x, (role, content)) in e[1..4].iter().zip(&texts[1..]) {
        assert_eq!(x.tokens, mt_c(role, content), "message {} re-counted", x.id);
    }
    let i = info(&mut con, k);
    assert_eq!((str_field(&i, "model"), str_field(&i, "encoding")), ("gpt-4".to_owned(), "cl100k_base".to_owned()));
    assert_eq!(int_field(&i, "total_tokens"), e.iter().map(|x| x.tokens).sum::<i64>());
    let doc = json_doc(&mut con, k);
    assert_eq!(doc["summary"]["tokens"], mt_c("system", summary));

    // Same tokenizer (gpt-3.5-turbo): nothing changes but the model.
    let before: Vec<i64> = e.iter().map(|x| x.tokens).collect();
    let r = append(&mut con, k, "user", "再见", &["MODEL", "gpt-3.5-turbo"]);
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "再见"));
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[..before.len()].iter().map(|x| x.tokens).collect::<Vec<_>>(), before);
    assert_eq!(str_field(&info(&mut con, k), "model"), "gpt-3.5-turbo");

    // Back to o200k_base with another o200k model.
    let r = append(&mut con, k, "user", "再见", &["MODEL", "o3-mini"]);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].tokens, mt_o("system", summary));
    for (x, (role, content)) in e[1..4].iter().zip(&texts[1..]) {
        assert_eq!(x.tokens, mt_o(role, content));
    }
    assert_eq!(int_field(&r, "total_tokens"), e.iter().map(|x| x.tokens).sum::<i64>());
    assert_eq!(str_field(&info(&mut con, k), "encoding"), "o200k_base");
    // Same tokenizer, other family (claude with the default o200k_base).
    let before: Vec<i64> = e.iter().map(|x| x.tokens).collect();
    append(&mut con, k, "user", "x", &["MODEL", "claude-3-5-sonnet"]);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[..before.len()].iter().map(|x| x.tokens).collect::<Vec<_>>(), before);
    // SUMMARIZE_CHECK MODEL never re-counts.
    let d = digest(&mut con, k);
    check(&mut con, k, &["MODEL", "gpt-4"]);
    assert_eq!(digest(&mut con, k), d);
}

#[test]
fn model_to_encoding_table() {
    let server = Server::start();
    let mut con = server.client();
    let text = "Tokenizers differ: 你好，世界！ 🚀🚀";
    for (model, enc) in [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-4.1-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("claude-3-5-sonnet", "o200k_base"),
        ("gemini-1.5-pro", "o200k_base"),
        ("llama-3-70b", "o200k_base"),
    ] {
        let key = format!("k:{model}");
        let r = append(&mut con, &key, "user", text, &["MODEL", model]);
        let want = if enc == "o200k_base" { mt_o("user", text) } else { mt_c("user", text) };
        assert_eq!(int_field(&r, "tokens"), want, "{model}");
        assert_eq!(str_field(&info(&mut con, &key), "encoding"), enc, "{model}");
    }
}

// ---------------------------------------------------------------- DEBUG RELOAD

#[test]
fn debug_reload_leaves_every_session_identical() {
    let server = Server::start();
    let mut con = server.client();
    populated(&mut con, "mem:{p}");
    append(&mut con, "mem:{noexp}", "user", "no expiry", &["TTL", "0", "MODEL", "gpt-4"]);
    append(&mut con, "mem:{short}", "user", "short ttl", &["TTL", "300", "MAXMSGS", "2", "MAXTOKENS", "900"]);
    for i in 0..5 {
        append(&mut con, "mem:{short}", if i % 2 == 0 { "assistant" } else { "tool" }, &format!("r{i}"), &[]);
    }
    ok(&mut con, &["MEM.IMPORT", "mem:{imp}", r#"{"conversation_history":[{"role":"user","content":"hi","timestamp":"2024-01-01T00:00:00"}],"user_profile":{"name":"Ann"},"context":[1,2]}"#]);
    ok(&mut con, &["MEM.EXTSET", "mem:{ext}", "n8n", "only-ext", "EX", "500"]);
    append(&mut con, "mem:{claude}", "user", "hi", &["MODEL", "claude-3-haiku"]);
    let keys = ["mem:{p}", "mem:{noexp}", "mem:{short}", "mem:{imp}", "mem:{ext}", "mem:{claude}"];
    let before: Vec<(String, String, i64, Vec<Entry>, Vec<(String, Value)>)> = keys
        .iter()
        .map(|k| (digest(&mut con, k), json_text(&mut con, k), int(&mut con, &["PTTL", k]), get(&mut con, &["MEM.GET", k]), info(&mut con, k)))
        .collect();
    let taken = std::time::Instant::now();
    ok(&mut con, &["DEBUG", "RELOAD"]);
    for (k, (d, j, p, e, i)) in keys.iter().zip(&before) {
        let elapsed = taken.elapsed().as_millis() as i64;
        assert_eq!(&digest(&mut con, k), d, "{k}: digest");
        assert_eq!(&json_text(&mut con, k), j, "{k}: FORMAT JSON");
        assert_eq!(&get(&mut con, &["MEM.GET", k]), e, "{k}: MEM.GET");
        assert_eq!(&info(&mut con, k), i, "{k}: MEM.INFO");
        let p2 = int(&mut con, &["PTTL", k]);
        if *p < 0 {
            assert_eq!(p2, *p, "{k}: PTTL");
        } else {
            assert!(p2 <= *p && p2 > p - elapsed - 1000, "{k}: PTTL {p} -> {p2} ({elapsed} ms later)");
        }
    }
    assert_eq!(string(&mut con, &["MEM.EXTGET", "mem:{ext}", "n8n"]), "only-ext");
    // Writes after the reload continue where the session was.
    let r = append(&mut con, "mem:{p}", "user", "after reload", &[]);
    assert_eq!(int_field(&r, "id"), 6);
}

#[test]
fn far_future_ts_is_refused_or_rendered_as_iso8601() {
    let server = Server::start();
    let mut con = server.client();
    append(&mut con, "k", "user", "before", &[]);
    // Year 10000 (beyond four-digit years) and the largest accepted integer.
    for ts in ["253402300800000", "9223372036854775807"] {
        let before = snap(&mut con, "k");
        match cmd(&mut con, &["MEM.APPEND", "k", "user", "later", "TS", ts]) {
            Err(e) => {
                assert!(err_text(&e).starts_with("ERR"), "{e}");
                assert_unchanged(&mut con, "k", &before, &format!("TS {ts}"));
            }
            Ok(_) => {
                let doc = json_doc(&mut con, "k");
                let last = doc["conversation_history"].as_array().unwrap().last().unwrap().clone();
                assert_eq!(last["ts"].to_string(), ts);
                let stamp = last["timestamp"].as_str().unwrap_or("");
                // ISO 8601 UTC, possibly with an expanded (signed) year.
                let body = stamp.strip_prefix('+').unwrap_or(stamp);
                let year: String = body.chars().take_while(char::is_ascii_digit).collect();
                assert!(
                    year.len() >= 4 && body[year.len()..].starts_with('-') && stamp.contains('T') && stamp.ends_with('Z'),
                    "TS {ts} accepted but FORMAT JSON renders timestamp {stamp:?}, not ISO 8601"
                );
            }
        }
    }
}
