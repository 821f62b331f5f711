//! Integration tests of MEM.APPEND, map replies under RESP2 and RESP3, TTL, and trimming (SPEC §3-4), against a real redis-server
//! with the module loaded. Expected token counts are computed with
//! tiktoken-rs, never hard-coded.

use crate::support::reply::*;
use crate::support::server::*;
use redis::Value;
use serde_json::Value as Json;
use std::collections::VecDeque;

// ---------------------------------------------------------------- MEM.APPEND

#[test]
fn append_reply_fields_and_defaults() {
    let server = Server::start();
    let mut con = server.client();
    let before = now_ms();
    let r = append(
        &mut con,
        "mem:{a}",
        "user",
        "Hello there, how are you today?",
        &[],
    );
    let after = now_ms();
    assert_eq!(names(&r), OUTCOME_FIELDS);
    let t1 = mt_o("user", "Hello there, how are you today?");
    assert_eq!(int_field(&r, "id"), 1);
    assert_eq!(int_field(&r, "tokens"), t1);
    assert_eq!(int_field(&r, "total_tokens"), t1);
    assert_eq!(int_field(&r, "messages"), 1);
    assert_eq!(int_field(&r, "trimmed"), 0);
    assert_eq!(int_field(&r, "summarize"), 0);

    let r = append(
        &mut con,
        "mem:{a}",
        "assistant",
        "I'm fine, thanks! 🎉",
        &[],
    );
    let t2 = mt_o("assistant", "I'm fine, thanks! 🎉");
    assert_eq!(int_field(&r, "id"), 2);
    assert_eq!(int_field(&r, "tokens"), t2);
    assert_eq!(int_field(&r, "total_tokens"), t1 + t2);
    assert_eq!(int_field(&r, "messages"), 2);

    let e = get(&mut con, &["MEM.GET", "mem:{a}"]);
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].keys, ["id", "role", "content", "ts", "tokens"]);
    assert_eq!(
        (
            e[0].id,
            e[0].role.as_str(),
            e[0].content.as_str(),
            e[0].tokens
        ),
        (1, "user", "Hello there, how are you today?", t1)
    );
    assert!(
        e[0].ts >= before - 1000 && e[0].ts <= after + 1000,
        "default ts is the server clock"
    );
    assert_eq!(
        (e[1].id, e[1].role.as_str(), e[1].tokens),
        (2, "assistant", t2)
    );
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
    assert!(
        pttl > 86_390_000 && pttl <= 86_400_000,
        "default TTL: {pttl}"
    );
}

#[test]
fn append_ts_meta_and_case_insensitive_options() {
    let server = Server::start();
    let mut con = server.client();
    let meta = r#"{"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#;
    let r = append(
        &mut con,
        "k",
        "assistant",
        "calling f",
        &["meta", meta, "Ts", "1700000000123"],
    );
    assert_eq!(int_field(&r, "id"), 1);
    let e = get(&mut con, &["MEM.GET", "k"]);
    assert_eq!(e[0].ts, 1_700_000_000_123);
    assert_eq!(
        e[0].meta.as_deref(),
        Some(meta),
        "meta comes back as its JSON text"
    );
    assert_eq!(e[0].keys, ["id", "role", "content", "ts", "tokens", "meta"]);
    let doc = json_doc(&mut con, "k");
    let m = &doc["conversation_history"][0];
    assert_eq!(m["timestamp"], "2023-11-14T22:13:20.123Z");
    assert_eq!(m["ts"], 1_700_000_000_123i64);
    assert_eq!(
        m["meta"],
        serde_json::from_str::<Json>(meta).unwrap(),
        "meta is an object in FORMAT JSON"
    );
    assert_eq!(m["id"], 1);
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["content"], "calling f");
    // The tool call counts too (name, arguments, 5 per call: MODELS.md).
    assert_eq!(
        m["tokens"],
        mt_o("assistant", "calling f") + o200("f") + o200("{}") + 5
    );

    // TS 0 is a valid time; options in any order, any case.
    append(
        &mut con,
        "k",
        "user",
        "x",
        &[
            "ttl",
            "100",
            "TS",
            "0",
            "MaxMsgs",
            "10",
            "maxtokens",
            "5000",
            "model",
            "gpt-4o",
        ],
    );
    let e = get(&mut con, &["MEM.GET", "k"]);
    assert_eq!(e[1].ts, 0);
    assert_eq!(e[1].meta, None);
    let i = info(&mut con, "k");
    assert_eq!(
        (
            int_field(&i, "ttl"),
            int_field(&i, "maxmsgs"),
            int_field(&i, "maxtokens")
        ),
        (100, 10, 5000)
    );
}

#[test]
fn append_roles_and_empty_content() {
    let server = Server::start();
    let mut con = server.client();
    let r = append(&mut con, "k", "narrator", "", &[]);
    assert_eq!(
        int_field(&r, "tokens"),
        3 + o200("narrator"),
        "empty content counts 3 + role"
    );
    let role64 = "r".repeat(64);
    let r = append(&mut con, "k", &role64, "ok", &[]);
    assert_eq!(int_field(&r, "tokens"), mt_o(&role64, "ok"));
    let before = snap(&mut con, "k");
    assert_err(
        &mut con,
        &["MEM.APPEND", "k", &"r".repeat(65), "too long role"],
        "ERR",
    );
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
        (
            vec!["MEM.APPEND", k, "user", "hi", "FOO", "1"],
            "ERR syntax error, unknown option 'FOO'",
        ),
        (
            vec!["MEM.APPEND", k, "user", "hi", "extra"],
            "unknown option 'EXTRA'",
        ),
        (
            vec!["MEM.APPEND", k, "user", "hi", "TS", "1", "ts", "2"],
            "given more than once",
        ),
        (
            vec!["MEM.APPEND", k, "user", "hi", "META", "{}", "META", "{}"],
            "given more than once",
        ),
        (
            vec![
                "MEM.APPEND",
                k,
                "user",
                "hi",
                "MODEL",
                "gpt-4",
                "MODEL",
                "gpt-4",
            ],
            "given more than once",
        ),
        (
            vec!["MEM.APPEND", k, "user", "hi", "TTL", "1", "TTL", "1"],
            "given more than once",
        ),
        (
            vec![
                "MEM.APPEND",
                k,
                "user",
                "hi",
                "MAXMSGS",
                "5",
                "MAXMSGS",
                "5",
            ],
            "given more than once",
        ),
        (
            vec![
                "MEM.APPEND",
                k,
                "user",
                "hi",
                "MAXTOKENS",
                "5",
                "maxtokens",
                "5",
            ],
            "given more than once",
        ),
        (vec!["MEM.APPEND", k, "user", "hi", "TS"], "needs a value"),
        (
            vec!["MEM.APPEND", k, "user", "hi", "TTL", "5", "META"],
            "needs a value",
        ),
        (
            vec!["MEM.APPEND", k, "user", "hi", "MODEL"],
            "needs a value",
        ),
        (
            vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS"],
            "needs a value",
        ),
        (
            vec!["MEM.APPEND", k, "user", "hi", "MAXTOKENS"],
            "needs a value",
        ),
        (vec!["MEM.APPEND", k, "user", "hi", "TS", "abc"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TS", "-1"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TS", "1.5"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TTL", "-1"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TTL", "ten"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "TTL", ""], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "-3"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "0"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "1e3"], "ERR"),
        (
            vec!["MEM.APPEND", k, "user", "hi", "MAXTOKENS", "-1"],
            "ERR",
        ),
        (vec!["MEM.APPEND", k, "user", "hi", "MAXTOKENS", "0"], "ERR"),
        (
            vec![
                "MEM.APPEND",
                k,
                "user",
                "hi",
                "MAXTOKENS",
                "99999999999999999999999",
            ],
            "ERR",
        ),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "{"], "ERR"),
        (
            vec!["MEM.APPEND", k, "user", "hi", "META", "not json"],
            "ERR",
        ),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "[1,2]"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "\"s\""], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "null"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "42"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", "{} {}"], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "META", ""], "ERR"),
        (vec!["MEM.APPEND", k, "user", "hi", "MODEL", ""], "ERR"),
        // Several settings and a bad option: the settings must not apply.
        (
            vec![
                "MEM.APPEND",
                k,
                "user",
                "hi",
                "MODEL",
                "gpt-4",
                "MAXMSGS",
                "1",
                "TTL",
                "0",
                "META",
                "[1]",
            ],
            "ERR",
        ),
        (
            vec![
                "MEM.APPEND",
                k,
                "user",
                "hi",
                "MODEL",
                "gpt-4",
                "MAXTOKENS",
                "1",
                "TS",
                "x",
            ],
            "ERR",
        ),
        (
            vec!["MEM.APPEND", k, "user", "hi", "MAXMSGS", "1", "BOGUS"],
            "unknown option 'BOGUS'",
        ),
    ];
    for (args, needle) in &cases {
        assert_err(&mut con, args, needle);
        assert_unchanged(&mut con, k, &before, &format!("{args:?}"));
    }
    let long_model = "m".repeat(300);
    assert_err(
        &mut con,
        &["MEM.APPEND", k, "user", "hi", "MODEL", &long_model],
        "ERR",
    );
    assert_unchanged(&mut con, k, &before, "300-byte model");

    // Invalid UTF-8 content, role, META.
    let kb = k.as_bytes();
    for args in [
        vec![&b"MEM.APPEND"[..], kb, b"user", &[0xff, 0xfe][..]],
        vec![&b"MEM.APPEND"[..], kb, b"user", b"ok \xc3\x28 broken"],
        vec![&b"MEM.APPEND"[..], kb, b"\xffuser", b"hi"],
        vec![
            &b"MEM.APPEND"[..],
            kb,
            b"user",
            b"hi",
            b"META",
            b"{\"a\":\"\xff\"}",
        ],
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
    assert_err(
        &mut con,
        &["MEM.APPEND", k, "user", "hi", "META", &big_meta],
        "ERR",
    );
    assert_unchanged(&mut con, k, &before, "oversize META");

    // A missing key is not created by a failing append.
    assert_err(&mut con, &["MEM.APPEND", "mem:{new}", "user", &big], "ERR");
    assert_err(
        &mut con,
        &["MEM.APPEND", "mem:{new}", "user", "hi", "META", "[]"],
        "ERR",
    );
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
        assert!(
            ttl > 990 && ttl <= 1000,
            "TTL of the string key changed: {ttl}"
        );
    }
    // IMPORT without REPLACE on an existing key of another type: an error
    // (WRONGTYPE or BUSYKEY), nothing changed.
    let e = err(
        &mut con,
        &["MEM.IMPORT", "s", r#"{"conversation_history":[]}"#],
    );
    assert!(
        e.starts_with("WRONGTYPE") || e.starts_with("BUSYKEY"),
        "{e}"
    );
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
            assert!(is_map(&v, 7), "APPEND resp3={resp3}: {v:?}");
            assert_eq!(names(&as_fields(v)), OUTCOME_FIELDS);
        }
        let v = ok(con, &["MEM.GET", key]);
        let Value::Array(items) = &v else {
            panic!("GET: {v:?}")
        };
        assert_eq!(items.len(), 4);
        assert!(
            items.iter().all(|it| is_map(it, 5)),
            "GET entries resp3={resp3}: {v:?}"
        );
        let v = ok(con, &["MEM.SUMMARIZE_CHECK", key, "KEEP", "2"]);
        assert!(is_map(&v, 8), "SUMMARIZE_CHECK resp3={resp3}: {v:?}");
        assert_eq!(names(&as_fields(v)), CHECK_FIELDS);
        let v = ok(con, &["MEM.SUMMARIZE", key, "2", "a summary"]);
        assert!(is_map(&v, 7), "SUMMARIZE resp3={resp3}: {v:?}");
        assert_eq!(names(&as_fields(v)), OUTCOME_FIELDS);
        let v = ok(con, &["MEM.GET", key]);
        let Value::Array(items) = &v else {
            panic!("GET: {v:?}")
        };
        assert_eq!(items.len(), 3);
        // The summary entry carries `summary` 1, which no message has.
        assert!(
            is_map(&items[0], 6),
            "GET's summary entry resp3={resp3}: {v:?}"
        );
        assert_eq!(names(&as_fields(items[0].clone()))[0], "summary");
        assert!(
            items[1..].iter().all(|it| is_map(it, 5)),
            "GET with summary resp3={resp3}: {v:?}"
        );
        let v = ok(con, &["MEM.EXTSET", key, "n8n", "x"]);
        assert!(matches!(v, Value::Okay | Value::SimpleString(_)), "{v:?}");
        let v = ok(con, &["MEM.INFO", key]);
        assert!(is_map(&v, 20), "INFO resp3={resp3}: {v:?}");
        let f = as_fields(v);
        assert_eq!(names(&f), INFO_FIELDS);
        let ext: Vec<String> = redis::from_redis_value(&f[13].1).unwrap();
        assert_eq!(ext, ["n8n"]);
        let imported = format!("{key}:imp");
        let v = ok(
            con,
            &[
                "MEM.IMPORT",
                &imported,
                r#"{"conversation_history":[{"role":"user","content":"hi"}]}"#,
            ],
        );
        assert!(is_map(&v, 7), "IMPORT resp3={resp3}: {v:?}");
        assert_eq!(names(&as_fields(v)), OUTCOME_FIELDS);
        let v = ok(con, &["MEM.GET", key, "AFTER", "2", "FORMAT", "JSON"]);
        assert!(
            matches!(v, Value::BulkString(_) | Value::VerbatimString { .. }),
            "FORMAT JSON is one string: {v:?}"
        );
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
    assert!(
        p > 99_000 && p <= 100_000,
        "append refreshes to the session TTL: {p}"
    );
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
    assert_err(
        &mut con,
        &["MEM.APPEND", k, "user", "x", "META", "[]"],
        "ERR",
    );
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
    assert_eq!(
        int(&mut con, &["TTL", "a"]),
        -1,
        "TTL 0 persists on the session"
    );
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
                assert_eq!(
                    int(&mut con, &["EXISTS", key]),
                    1,
                    "TTL {ttl} deleted the key"
                );
                assert!(int(&mut con, &["PTTL", key]) > 86_400_000, "TTL {ttl}");
            }
        }
    }
    match cmd(
        &mut con,
        &["MEM.EXTSET", "h3", "dify", "x", "EX", "9223372036854775807"],
    ) {
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
    assert_eq!(
        (
            int_field(&i, "first_id"),
            int_field(&i, "last_id"),
            int_field(&i, "messages")
        ),
        (4, 6, 3)
    );
    assert_eq!(
        int_field(&i, "total_tokens"),
        e.iter().map(|x| x.tokens).sum::<i64>()
    );
    // Ids are never reused after eviction.
    let r = append(&mut con, k, "user", "later", &[]);
    assert_eq!(int_field(&r, "id"), 7);
    assert_eq!(
        int_field(&r, "messages"),
        3,
        "MAXMSGS persists on the session"
    );
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
        assert_eq!(
            int_field(&r, "messages"),
            (i + 1 - start) as i64,
            "append {i}"
        );
        assert_eq!(
            int_field(&r, "total_tokens"),
            t[start..=i].iter().sum::<i64>()
        );
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
    assert_eq!(
        (
            int_field(&r, "id"),
            int_field(&r, "messages"),
            int_field(&r, "trimmed")
        ),
        (2, 1, 1)
    );
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
        append(
            &mut con,
            "t",
            "user",
            &format!("some words number {i}"),
            &[],
        );
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
    let total = |m: &VecDeque<(i64, &str, i64)>, s: &Option<i64>| {
        m.iter().map(|x| x.2).sum::<i64>() + s.unwrap_or(0)
    };
    // Tool groups (SPEC v3): a message and the tool results right after it
    // leave together; the newest message's group is spared whole.
    let group_at = |m: &VecDeque<(i64, &str, i64)>, i: usize| {
        1 + m.iter().skip(i + 1).take_while(|x| x.1 == "tool").count()
    };
    let newest_group = |m: &VecDeque<(i64, &str, i64)>| {
        let mut start = m.len() - 1;
        while start > 0 && m[start].1 == "tool" {
            start -= 1;
        }
        m.len() - start
    };
    let spared = newest_group(msgs);
    let mut evicted = 0;
    while msgs.len() > maxmsgs || total(msgs, summary) > maxtokens {
        let group = group_at(msgs, 0);
        if msgs.len() < spared + group {
            break;
        }
        for _ in 0..group {
            msgs.pop_front();
        }
        evicted += group as i64;
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

/// The tool rule reads the session under the MAXAGE the same write sets,
/// as the write's eviction does (hostile pass 54 F2: it read the old one,
/// so `MAXAGE 60` let a result in behind a two-hour-old call, and a longer
/// MAXAGE that makes the call live again was refused). MEM.APPEND and
/// MEM.APPENDBATCH alike; a refusal changes nothing.
#[test]
fn the_tool_rule_reads_the_session_under_the_writes_own_maxage() {
    let server = Server::start();
    let mut con = server.client();
    let old = (now_ms() - 7_200_000).to_string();
    // No MAXAGE held: the two-hour-old call shows, until MAXAGE 60 comes.
    append(&mut con, "mem:{a}", "user", "q", &["TS", &old]);
    let before = snap(&mut con, "mem:{a}");
    assert_err(
        &mut con,
        &["MEM.APPEND", "mem:{a}", "tool", "r", "MAXAGE", "60"],
        "cannot be the session's first message",
    );
    assert_err(
        &mut con,
        &[
            "MEM.APPENDBATCH",
            "mem:{a}",
            r#"[{"role":"tool","content":"r"}]"#,
            "MAXAGE",
            "60",
        ],
        "messages[0]: a tool result cannot be the session's first message",
    );
    assert_unchanged(&mut con, "mem:{a}", &before, "refused under MAXAGE 60");
    // MAXAGE 3600 held hides the call; MAXAGE 86400 with the result shows it.
    for (k, batch) in [("mem:{b}", false), ("mem:{c}", true)] {
        append(&mut con, k, "user", "q", &["TS", &old, "MAXAGE", "3600"]);
        if batch {
            ok(
                &mut con,
                &[
                    "MEM.APPENDBATCH",
                    k,
                    r#"[{"role":"tool","content":"r"}]"#,
                    "MAXAGE",
                    "86400",
                ],
            );
        } else {
            append(&mut con, k, "tool", "r", &["MAXAGE", "86400"]);
        }
        let held = get(&mut con, &["MEM.GET", k]);
        let roles: Vec<&str> = held.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "tool"], "{k}");
    }
}

#[test]
fn a_tool_result_is_refused_as_a_session_s_first_message() {
    // SPEC 3: no path leaves a `tool` message first. A tool result the
    // session holds no message before (a new session, or its call already
    // in the summary) is refused, changing nothing, on every path.
    let server = Server::start();
    let mut con = server.client();
    let k = "first:{tool}";
    let e = err(&mut con, &["MEM.APPEND", k, "tool", "21 C"]);
    assert!(
        e.contains("tool result cannot be the session's first message"),
        "{e}"
    );
    let batch = r#"[{"role":"tool","content":"21 C"},{"role":"user","content":"thanks"}]"#;
    let e = err(&mut con, &["MEM.APPENDBATCH", k, batch]);
    assert!(
        e.starts_with("ERR messages[0]: a tool result cannot"),
        "{e}"
    );
    let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
    let _: Value = redis::cmd("MEM.APPEND")
        .arg(&[k, "tool", "x"])
        .query(&mut con)
        .unwrap();
    let exec: redis::RedisResult<Vec<Value>> = redis::cmd("EXEC").query(&mut con);
    assert!(format!("{exec:?}").contains("first message"), "{exec:?}");
    let lua = "return redis.pcall('MEM.APPEND', KEYS[1], 'tool', 'x')";
    let e: redis::RedisResult<Value> = redis::cmd("EVAL").arg(&[lua, "1", k]).query(&mut con);
    assert!(format!("{e:?}").contains("first message"), "{e:?}");
    let exists: i64 = redis::cmd("EXISTS").arg(k).query(&mut con).unwrap();
    assert_eq!(exists, 0, "a refused write created the key");

    // A call and its result in one batch; the result with its msgid.
    let call =
        r#"{"tool_calls":[{"id":"a","type":"function","function":{"name":"w","arguments":"{}"}}]}"#;
    let batch = format!(
        r#"[{{"role":"assistant","content":"","meta":{call}}},{{"role":"tool","content":"21 C","meta":{{"tool_call_id":"a"}},"msgid":"r1"}}]"#
    );
    let r: Value = redis::cmd("MEM.APPENDBATCH")
        .arg(&[k, &batch])
        .query(&mut con)
        .unwrap();
    assert!(matches!(r, Value::Array(ref v) if v.len() == 2), "{r:?}");
    // The summary covers both; a result after it has no call to follow.
    let _: Value = redis::cmd("MEM.SUMMARIZE")
        .arg(&[k, "2", "a weather call"])
        .query(&mut con)
        .unwrap();
    let before = json_text(&mut con, k);
    let e = err(&mut con, &["MEM.APPEND", k, "tool", "25 C"]);
    assert!(e.contains("summarized, evicted or never appended"), "{e}");
    let e = err(
        &mut con,
        &[
            "MEM.APPENDBATCH",
            k,
            r#"[{"role":"tool","content":"25 C"}]"#,
        ],
    );
    assert!(e.starts_with("ERR messages[0]:"), "{e}");
    assert_eq!(
        json_text(&mut con, k),
        before,
        "a refused write changed the session"
    );
    // A retry of the result already stored is still answered as it was.
    let r = append(&mut con, k, "tool", "21 C", &["MSGID", "r1"]);
    assert_eq!(int_field(&r, "duplicate"), 1);
    assert_eq!(int_field(&r, "id"), 2);
    // Any other message may start the session again, and a result after it.
    append(&mut con, k, "assistant", "", &["META", call]);
    let r = append(
        &mut con,
        k,
        "tool",
        "25 C",
        &["META", r#"{"tool_call_id":"a"}"#],
    );
    assert_eq!(int_field(&r, "messages"), 2);

    // Hostile pass 27 F1: a message past maxage is not held (reads do not
    // show it); a result after it was accepted and brought it back.
    let aged = "first:{tool}aged";
    append(
        &mut con,
        aged,
        "user",
        "hi",
        &["TS", "1000", "MAXAGE", "10"],
    );
    assert!(get(&mut con, &["MEM.GET", aged]).is_empty());
    let before = json_text(&mut con, aged);
    let e = err(&mut con, &["MEM.APPEND", aged, "tool", "r"]);
    assert!(e.contains("first message"), "{e}");
    let e = err(
        &mut con,
        &[
            "MEM.APPENDBATCH",
            aged,
            r#"[{"role":"tool","content":"r"}]"#,
        ],
    );
    assert!(e.starts_with("ERR messages[0]:"), "{e}");
    assert_eq!(json_text(&mut con, aged), before);
    // A call past maxage whose result is live is held: its group is.
    let grp = "first:{tool}group";
    append(
        &mut con,
        grp,
        "assistant",
        "",
        &["TS", "1000", "META", call],
    );
    // (No MAXAGE yet: the call shows. One that hides it refuses the
    // result: the_tool_rule_reads_the_session_under_the_writes_own_maxage.)
    append(&mut con, grp, "tool", "21 C", &[]);
    let r = append(&mut con, grp, "tool", "22 C", &["MAXAGE", "10"]);
    assert_eq!(int_field(&r, "messages"), 3);
}

#[test]
fn trim_never_leaves_a_tool_result_without_its_call() {
    let server = Server::start();
    let mut con = server.client();
    // user, assistant(call), tool, tool, assistant: MAXMSGS 3 on the 5th
    // append evicts user and the call; the two tool results go with it.
    append(&mut con, "k", "user", "weather in Paris and Rome?", &[]);
    append(
        &mut con,
        "k",
        "assistant",
        "",
        &["META", r#"{"tool_calls":[{"id":"a"},{"id":"b"}]}"#],
    );
    append(
        &mut con,
        "k",
        "tool",
        "Paris: 21",
        &["META", r#"{"tool_call_id":"a"}"#],
    );
    append(
        &mut con,
        "k",
        "tool",
        "Rome: 25",
        &["META", r#"{"tool_call_id":"b"}"#],
    );
    let r = append(
        &mut con,
        "k",
        "assistant",
        "Paris 21, Rome 25.",
        &["MAXMSGS", "3"],
    );
    assert_eq!(int_field(&r, "trimmed"), 4);
    assert_eq!(int_field(&r, "messages"), 1);
    let e = get(&mut con, &["MEM.GET", "k"]);
    assert_eq!(ids(&e), [5]);
    assert_eq!(int_field(&r, "total_tokens"), e[0].tokens);

    // A deterministic mix of roles and caps, checked against the rules.
    let roles: [&'static str; 7] = [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "user",
    ];
    let mut model: VecDeque<(i64, &'static str, i64)> = VecDeque::new();
    let mut summary = None;
    let mut seed = 12345u64;
    for i in 1..=120i64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let role = roles[(seed >> 33) as usize % roles.len()];
        let words = 1 + (seed >> 40) as usize % 12;
        let content: String = (0..words)
            .map(|w| format!("w{} ", (w * 7 + i as usize) % 13))
            .collect();
        let maxmsgs = 2 + (seed >> 50) as usize % 5;
        let tokens = mt_o(role, &content);
        let maxtokens = 40 + (seed >> 20) as i64 % 60;
        let r = append(
            &mut con,
            "mix",
            role,
            &content,
            &[
                "MAXMSGS",
                &maxmsgs.to_string(),
                "MAXTOKENS",
                &maxtokens.to_string(),
            ],
        );
        let evicted = simulate_append(
            &mut model,
            &mut summary,
            (i, role, tokens),
            maxmsgs,
            maxtokens,
        );
        assert_eq!(int_field(&r, "id"), i);
        assert_eq!(int_field(&r, "tokens"), tokens);
        assert_eq!(int_field(&r, "trimmed"), evicted, "append {i}");
        let e = get(&mut con, &["MEM.GET", "mix"]);
        assert_eq!(
            ids(&e),
            model.iter().map(|m| m.0).collect::<Vec<_>>(),
            "append {i}"
        );
        assert_eq!(*ids(&e).last().unwrap(), i, "the appended message is kept");
        if evicted > 0 && e.len() > 1 {
            assert_ne!(
                e[0].role, "tool",
                "append {i}: a tool message is the oldest after trimming"
            );
        }
        // Over the cap only by the newest message's tool group (held whole).
        let newest_group = 1 + e.iter().rev().take_while(|x| x.role == "tool").count();
        assert!(
            e.len() <= maxmsgs.max(newest_group),
            "append {i}: {} messages",
            e.len()
        );
        assert_eq!(
            int_field(&r, "total_tokens"),
            e.iter().map(|x| x.tokens).sum::<i64>()
        );
    }
}

#[test]
fn summary_is_kept_while_messages_can_be_evicted() {
    let server = Server::start();
    let mut con = server.client();
    let k = "s";
    for i in 1..=6 {
        append(
            &mut con,
            k,
            "user",
            &format!("message {i} about the project plan"),
            &[],
        );
    }
    let text = "The user discussed the project plan at length.";
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, "3", text]);
    let st = mt_o("system", text);
    assert_eq!(int_field(&r, "tokens"), st);
    // MAXMSGS counts messages only; the summary stays.
    for i in 7..=10 {
        let r = append(
            &mut con,
            k,
            "user",
            &format!("message {i} about the project plan"),
            &["MAXMSGS", "2"],
        );
        assert_eq!(int_field(&r, "messages"), 2);
    }
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].role, "summary");
    assert_eq!(e[0].id, 3);
    assert_eq!(ids(&e[1..]), [9, 10]);

    // MAXTOKENS: messages go first, the summary stays while one can go.
    let m = |i: i64| mt_o("user", &format!("message {i} about the project plan"));
    let cap = st + m(11);
    let r = append(
        &mut con,
        k,
        "user",
        "message 11 about the project plan",
        &["MAXTOKENS", &cap.to_string(), "MAXMSGS", "30"],
    );
    assert_eq!(int_field(&r, "trimmed"), 2);
    assert_eq!(int_field(&r, "total_tokens"), cap);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].role, "summary");
    assert_eq!(ids(&e), [3, 11]);
    assert_eq!(int_field(&info(&mut con, k), "summary_upto"), 3);

    // Nothing else can go: the summary goes, the new message stays.
    let r = append(
        &mut con,
        k,
        "user",
        "message 12 about the project plan",
        &["MAXTOKENS", &(m(12) + 1).to_string()],
    );
    assert_eq!(int_field(&r, "messages"), 1);
    assert_eq!(int_field(&r, "total_tokens"), m(12));
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(ids(&e), [12]);
    assert_eq!(e[0].role, "user");
    assert_eq!(int_field(&info(&mut con, k), "summary_upto"), 0);
}
