//! Integration tests of MEM.IMPORT, MEM.GET and MEM.INFO (SPEC §3-4), against a real redis-server
//! with the module loaded. Expected token counts are computed with
//! tiktoken-rs, never hard-coded.

use crate::support::reply::*;
use crate::support::server::*;
use redis::Value;
use serde_json::{json, Value as Json};
use std::time::Duration;

// ---------------------------------------------------------------- IMPORT

#[test]
fn import_round_trips_format_json() {
    let server = Server::start();
    let mut con = server.client();
    populated(&mut con, "src");
    append(
        &mut con,
        "src",
        "user",
        "emoji 👩‍👩‍👧 and tabs\t\tand 中文",
        &["META", r#"{"name":"Ann","n":[1,2,{"x":null}]}"#],
    );
    let doc_text = json_text(&mut con, "src");
    let doc: Json = serde_json::from_str(&doc_text).unwrap();
    assert!(doc["summary"].is_object());
    let r = map_reply(&mut con, &["MEM.IMPORT", "dst", &doc_text]);
    let src_entries = get(&mut con, &["MEM.GET", "src"]);
    let last = src_entries.last().unwrap();
    assert_eq!(names(&r), OUTCOME_FIELDS);
    assert_eq!(int_field(&r, "id"), last.id);
    assert_eq!(int_field(&r, "tokens"), last.tokens);
    assert_eq!(
        int_field(&r, "total_tokens"),
        doc["total_tokens"].as_i64().unwrap()
    );
    assert_eq!(int_field(&r, "messages"), 4);
    assert_eq!(int_field(&r, "trimmed"), 0);
    assert_eq!(
        json_doc(&mut con, "dst"),
        doc,
        "FORMAT JSON -> IMPORT -> FORMAT JSON"
    );
    // Meta is compared as JSON: an import may re-serialize it.
    let norm = |e: Vec<Entry>| -> Vec<(Entry, Option<Json>)> {
        e.into_iter()
            .map(|mut x| {
                let m = x
                    .meta
                    .take()
                    .map(|m| serde_json::from_str::<Json>(&m).unwrap());
                (x, m)
            })
            .collect()
    };
    assert_eq!(
        norm(get(&mut con, &["MEM.GET", "dst"])),
        norm(src_entries.clone())
    );
    let (i1, i2) = (info(&mut con, "src"), info(&mut con, "dst"));
    for f in [
        "messages",
        "total_tokens",
        "model",
        "encoding",
        "first_id",
        "last_id",
        "summary_upto",
    ] {
        assert_eq!(
            i1.iter().find(|(n, _)| n == f).unwrap().1,
            i2.iter().find(|(n, _)| n == f).unwrap().1,
            "INFO {f}"
        );
    }
    let r = append(&mut con, "dst", "user", "continue", &[]);
    assert_eq!(
        int_field(&r, "id"),
        last.id + 1,
        "ids continue after the imported ones"
    );
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
    assert_eq!(
        e[1].ts,
        base - 2 * 3_600_000 + 5_250,
        "+02:00 is converted to UTC"
    );
    assert_eq!(e[2].ts, base + 60_000, "no zone means UTC");
    assert_eq!(e[3].ts, base + 90_500);
    let out = json_doc(&mut con, "mem:{ann}");
    assert_eq!(
        out["user_profile"], doc["user_profile"],
        "user_profile at the top level"
    );
    assert_eq!(out["context"], doc["context"], "context at the top level");
    assert_eq!(
        out["conversation_history"][0]["timestamp"],
        "2024-05-01T10:00:00.000Z"
    );
    assert_eq!(
        out["conversation_history"][1]["timestamp"],
        "2024-05-01T08:00:05.250Z"
    );
    assert_eq!(
        out["conversation_history"][2]["timestamp"],
        "2024-05-01T10:01:00.000Z"
    );
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
    ok(
        &mut con,
        &[
            "MEM.IMPORT",
            "nots",
            r#"{"conversation_history":[{"role":"user","content":"x"}]}"#,
        ],
    );
    let e = get(&mut con, &["MEM.GET", "nots"]);
    assert!((e[0].ts - now_ms()).abs() < 5_000);
    // An empty history is a valid document.
    let r = map_reply(
        &mut con,
        &[
            "MEM.IMPORT",
            "empty",
            r#"{"conversation_history":[],"user_profile":{"a":1}}"#,
        ],
    );
    assert_eq!(
        (int_field(&r, "messages"), int_field(&r, "total_tokens")),
        (0, 0)
    );
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

    let r = map_reply(
        &mut con,
        &[
            "MEM.IMPORT",
            "k",
            doc,
            "replace",
            "MODEL",
            "gpt-4",
            "TTL",
            "50",
        ],
    );
    let t = [
        mt_c("user", "Bonjour tout le monde"),
        mt_c("assistant", "你好，世界"),
    ];
    assert_ne!(
        t.to_vec(),
        vec![
            mt_o("user", "Bonjour tout le monde"),
            mt_o("assistant", "你好，世界")
        ],
        "texts that tell the encodings apart"
    );
    assert_eq!(int_field(&r, "total_tokens"), t[0] + t[1]);
    assert_eq!(int_field(&r, "id"), 2);
    let i = info(&mut con, "k");
    assert_eq!(
        (str_field(&i, "model"), str_field(&i, "encoding")),
        ("gpt-4".to_owned(), "cl100k_base".to_owned())
    );
    assert_eq!(int_field(&i, "ttl"), 50);
    assert_eq!(int_field(&i, "summary_upto"), 0);
    let p = int(&mut con, &["PTTL", "k"]);
    assert!(p > 45_000 && p <= 50_000, "{p}");
    assert_eq!(
        ok(&mut con, &["MEM.EXTGET", "k", "dify"]),
        Value::Nil,
        "REPLACE replaces the whole session"
    );
    assert_eq!(ids(&get(&mut con, &["MEM.GET", "k"])), [1, 2]);

    // TTL 0: no expiry.
    ok(&mut con, &["MEM.IMPORT", "k", doc, "TTL", "0", "REPLACE"]);
    assert_eq!(int(&mut con, &["TTL", "k"]), -1);
    assert_eq!(str_field(&info(&mut con, "k"), "model"), "gpt-4o");
    assert_eq!(
        int_field(&info(&mut con, "k"), "total_tokens"),
        mt_o("user", "Bonjour tout le monde") + mt_o("assistant", "你好，世界")
    );

    // The document's model is used; the MODEL option wins over it.
    let with_model = r#"{"conversation_history":[{"role":"user","content":"你好，世界"}],"model":"gpt-3.5-turbo"}"#;
    ok(&mut con, &["MEM.IMPORT", "m1", with_model]);
    let i = info(&mut con, "m1");
    assert_eq!(
        (str_field(&i, "model"), str_field(&i, "encoding")),
        ("gpt-3.5-turbo".to_owned(), "cl100k_base".to_owned())
    );
    assert_eq!(int_field(&i, "total_tokens"), mt_c("user", "你好，世界"));
    ok(
        &mut con,
        &["MEM.IMPORT", "m2", with_model, "MODEL", "gpt-4o-mini"],
    );
    let i = info(&mut con, "m2");
    assert_eq!(
        (str_field(&i, "model"), str_field(&i, "encoding")),
        ("gpt-4o-mini".to_owned(), "o200k_base".to_owned())
    );
    assert_eq!(int_field(&i, "total_tokens"), mt_o("user", "你好，世界"));

    // Caps apply: 40 messages into a default session keep the newest 30.
    let history: Vec<Json> = (1..=40)
        .map(|i| json!({"role": "user", "content": format!("line {i}")}))
        .collect();
    let r = map_reply(
        &mut con,
        &[
            "MEM.IMPORT",
            "big",
            &json!({"conversation_history": history}).to_string(),
        ],
    );
    assert_eq!(
        (
            int_field(&r, "id"),
            int_field(&r, "messages"),
            int_field(&r, "trimmed")
        ),
        (40, 30, 10)
    );
    assert_eq!(
        int_field(&r, "summarize"),
        1,
        "30 messages meet threshold_messages"
    );
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
    let role65 =
        json!({"conversation_history": [{"role": "r".repeat(65), "content": "x"}]}).to_string();
    assert_err(&mut con, &["MEM.IMPORT", "k", &role65, "REPLACE"], "ERR");
    assert_unchanged(&mut con, "k", &before, "65-byte role");
    let good = r#"{"conversation_history":[{"role":"user","content":"hello"}]}"#;
    for (args, needle) in [
        (vec!["MEM.IMPORT", "k"], "wrong number of arguments"),
        (
            vec!["MEM.IMPORT", "k", good, "REPLACE", "REPLACE"],
            "given more than once",
        ),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "TTL", "-1"], "ERR"),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "TTL", "x"], "ERR"),
        (
            vec!["MEM.IMPORT", "k", good, "REPLACE", "TTL"],
            "needs a value",
        ),
        (vec!["MEM.IMPORT", "k", good, "REPLACE", "MODEL", ""], "ERR"),
        (
            vec!["MEM.IMPORT", "k", good, "REPLACE", "MODEL"],
            "needs a value",
        ),
        (
            vec!["MEM.IMPORT", "k", good, "REPLACE", "FORCE"],
            "unknown option 'FORCE'",
        ),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, "k", &before, &format!("{args:?}"));
    }
    let e = err_raw(
        &mut con,
        &[
            b"MEM.IMPORT",
            b"k",
            b"{\"conversation_history\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
            b"REPLACE",
        ],
    );
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
    let long =
        "This message is deliberately much longer than the others, with many many words in it. "
            .repeat(5);
    for i in 1..=10 {
        let content = if i == 7 {
            long.clone()
        } else {
            format!("short {i}")
        };
        append(&mut con, k, "user", &content, &[]);
    }
    let all = get(&mut con, &["MEM.GET", k]);
    assert_eq!(ids(&all), (1..=10).collect::<Vec<_>>());
    assert_eq!(get(&mut con, &["MEM.GET", k, "FORMAT", "RESP"]), all);
    assert_eq!(get(&mut con, &["MEM.GET", k, "format", "resp"]), all);
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "LAST", "3"])),
        [8, 9, 10]
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "LAST", "100"])),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "LAST", "0"])),
        Vec::<i64>::new()
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "AFTER", "7"])),
        [8, 9, 10]
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "after", "0"])),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "AFTER", "10"])),
        Vec::<i64>::new()
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "AFTER", "1000"])),
        Vec::<i64>::new()
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "LAST", "2", "AFTER", "5"])),
        [9, 10]
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "AFTER", "8", "LAST", "5"])),
        [9, 10]
    );

    // BUDGET: the newest contiguous run that fits; it stops at message 7
    // even though older short messages would fit.
    let t = |id: i64| all[(id - 1) as usize].tokens;
    let run = t(8) + t(9) + t(10);
    assert!(t(7) > t(1) + t(2));
    let budget = run + t(7) - 1;
    assert_eq!(
        ids(&get(
            &mut con,
            &["MEM.GET", k, "BUDGET", &budget.to_string()]
        )),
        [8, 9, 10]
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "BUDGET", &run.to_string()])),
        [8, 9, 10]
    );
    assert_eq!(
        ids(&get(
            &mut con,
            &["MEM.GET", k, "BUDGET", &(run - 1).to_string()]
        )),
        [9, 10]
    );
    assert_eq!(
        ids(&get(
            &mut con,
            &["MEM.GET", k, "BUDGET", &(run + t(7)).to_string()]
        )),
        [7, 8, 9, 10]
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "BUDGET", "0"])),
        Vec::<i64>::new()
    );
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k, "BUDGET", "1000000"])),
        (1..=10).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&get(
            &mut con,
            &["MEM.GET", k, "LAST", "2", "BUDGET", "1000000"]
        )),
        [9, 10]
    );
    assert_eq!(
        ids(&get(
            &mut con,
            &["MEM.GET", k, "AFTER", "8", "BUDGET", &t(10).to_string()]
        )),
        [10]
    );

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
    let e = get(
        &mut con,
        &["MEM.GET", k, "BUDGET", &(st + run - 1).to_string()],
    );
    assert_eq!(ids(&e), [3, 9, 10]);
    let e = get(&mut con, &["MEM.GET", k, "BUDGET", &st.to_string()]);
    assert_eq!(ids(&e), [3]);
    let e = get(&mut con, &["MEM.GET", k, "BUDGET", &(st - 1).to_string()]);
    assert!(e.is_empty(), "the summary alone is over the budget: {e:?}");
    let e = get(
        &mut con,
        &["MEM.GET", k, "AFTER", "3", "BUDGET", &run.to_string()],
    );
    assert_eq!(
        ids(&e),
        [8, 9, 10],
        "AFTER: the budget has no summary to pay for"
    );
    let e = get(
        &mut con,
        &[
            "MEM.GET",
            k,
            "LAST",
            "2",
            "BUDGET",
            &(st + t(10)).to_string(),
        ],
    );
    assert_eq!(ids(&e), [3, 10]);

    // FORMAT JSON honours the selection; total_tokens is the session's.
    let doc: Json = serde_json::from_str(&string(
        &mut con,
        &["MEM.GET", k, "LAST", "2", "FORMAT", "json"],
    ))
    .unwrap();
    let hist = doc["conversation_history"].as_array().unwrap();
    assert_eq!(
        hist.iter()
            .map(|m| m["id"].as_i64().unwrap())
            .collect::<Vec<_>>(),
        [9, 10]
    );
    assert_eq!(doc["summary"]["upto"], 3);
    let total: i64 = st + (4..=10).map(t).sum::<i64>();
    assert_eq!(doc["total_tokens"], total);
    assert_eq!(doc["model"], "gpt-4o");
    for m in hist {
        let mut keys: Vec<&str> = m.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["content", "id", "role", "timestamp", "tokens", "ts"]);
    }
    let doc: Json = serde_json::from_str(&string(
        &mut con,
        &["MEM.GET", k, "AFTER", "9", "FORMAT", "JSON"],
    ))
    .unwrap();
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
        (
            vec!["MEM.GET", k, "LAST", "1", "LAST", "2"],
            "given more than once",
        ),
        (
            vec!["MEM.GET", k, "FORMAT", "JSON", "format", "RESP"],
            "given more than once",
        ),
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

/// SPEC MEM.GET: with LAST or BUDGET the messages never start with a tool
/// result (the defect: LAST 2 returned [tool, assistant]); AFTER alone is
/// a sync cursor and stays exact.
#[test]
fn get_last_and_budget_never_start_with_a_tool_result() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{t}";
    // ids: 1 user, 2 assistant (call), 3 tool, 4 tool, 5 assistant
    for (role, content) in [
        ("user", "Weather?"),
        ("assistant", "calling"),
        ("tool", "21C"),
        ("tool", "rain"),
        ("assistant", "21C and rain."),
    ] {
        append(&mut con, k, role, content, &[]);
    }
    let all = get(&mut con, &["MEM.GET", k]);
    let t = |id: i64| all[(id - 1) as usize].tokens;
    for (args, want) in [
        (vec!["LAST", "2"], vec![5]),
        (vec!["LAST", "3"], vec![5]),
        (vec!["LAST", "4"], vec![2, 3, 4, 5]),
        (vec!["LAST", "1"], vec![5]),
        (vec!["AFTER", "2"], vec![3, 4, 5]),
        (vec!["AFTER", "3"], vec![4, 5]),
        (vec!["AFTER", "2", "LAST", "10"], vec![5]),
        (vec!["BUDGET", &(t(3) + t(4) + t(5)).to_string()], vec![5]),
        (
            vec!["BUDGET", &(t(2) + t(3) + t(4) + t(5)).to_string()],
            vec![2, 3, 4, 5],
        ),
    ] {
        let mut cmd = vec!["MEM.GET", k];
        cmd.extend(&args);
        assert_eq!(ids(&get(&mut con, &cmd)), want, "{args:?}");
        cmd.extend(["FORMAT", "JSON"]);
        let doc: Json = serde_json::from_str(&string(&mut con, &cmd)).unwrap();
        let got: Vec<i64> = doc["conversation_history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_i64().unwrap())
            .collect();
        assert_eq!(got, want, "{args:?} FORMAT JSON");
    }
    // With a summary first: it stays first.
    ok(
        &mut con,
        &["MEM.SUMMARIZE", k, "1", "The user asked about the weather."],
    );
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k, "LAST", "2"])), [1, 5]);
}

/// SPEC MEM.IMPORT: tool results left first (in the document, or after the
/// caps) are dropped as trimming drops them.
#[test]
fn import_moves_a_message_s_other_members_into_its_meta() {
    // An OpenAI-shaped history keeps tool_calls, tool_call_id and name
    // beside role and content: MEM.IMPORT skipped them silently (the tool
    // calls were lost, and not counted).
    let server = Server::start();
    let mut con = server.client();
    let call = json!([{"id": "c1", "type": "function",
                       "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}}]);
    let doc = json!({"conversation_history": [
        {"role": "user", "content": "weather in Rome?", "name": "bob", "function_call": null},
        {"role": "assistant", "content": "", "tool_calls": call},
        {"role": "tool", "content": "21 C", "tool_call_id": "c1", "meta": {"src": "api"}},
        {"role": "user", "content": "thanks", "meta": {}, "x": 1, "x": 2},
    ]});
    ok(&mut con, &["MEM.IMPORT", "oa", &doc.to_string()]);
    let e = get(&mut con, &["MEM.GET", "oa"]);
    let metas: Vec<Option<Json>> = e
        .iter()
        .map(|m| m.meta.as_deref().map(|t| serde_json::from_str(t).unwrap()))
        .collect();
    assert_eq!(
        metas,
        [
            Some(json!({"name": "bob"})),
            Some(json!({"tool_calls": call})),
            Some(json!({"src": "api", "tool_call_id": "c1"})),
            Some(json!({"x": 2})),
        ]
    );
    // The moved tool calls count as MEM.APPEND counts a META's.
    let meta = e[1].meta.clone().unwrap();
    let counted = int(
        &mut con,
        &[
            "MEM.COUNT",
            "gpt-4o-mini",
            "",
            "ROLE",
            "assistant",
            "META",
            &meta,
        ],
    );
    assert_eq!(e[1].tokens, counted);
    assert!(
        counted > mt_o("assistant", ""),
        "the tool calls were not counted"
    );
    // Its FORMAT JSON imports as it is.
    let own = json_text(&mut con, "oa");
    ok(&mut con, &["MEM.IMPORT", "oa2", &own]);
    assert_eq!(json_text(&mut con, "oa2"), own);
    // A name both beside META and in it: which to keep is the client's call.
    let doc = json!({"conversation_history": [
        {"role": "user", "content": "x", "meta": {"name": "a"}, "name": "b"},
    ]});
    let e = err(&mut con, &["MEM.IMPORT", "oa", &doc.to_string(), "REPLACE"]);
    assert!(
        e.contains("conversation_history[0]: member \"name\" is both"),
        "{e}"
    );
    assert_eq!(
        json_text(&mut con, "oa"),
        own,
        "a refused import changed the key"
    );
    // A name repeated is refused, as MEM.APPENDBATCH refuses one (the last
    // standing dropped the first silently), and so is a member the module
    // reads: two conversation_history arrays lost the first one.
    let doc =
        r#"{"conversation_history":[{"role":"user","content":"x","n":1,"meta":{"a":1},"n":[2]}]}"#;
    let e = err(&mut con, &["MEM.IMPORT", "dup", doc]);
    assert!(
        e.contains("conversation_history[0]: member \"n\" is given twice"),
        "{e}"
    );
    for doc in [
        r#"{"conversation_history":[{"role":"user","content":"first"}],"conversation_history":[]}"#,
        r#"{"conversation_history":[{"role":"user","content":"x","content":"y"}]}"#,
    ] {
        let e = err(&mut con, &["MEM.IMPORT", "oa", doc, "REPLACE"]);
        assert!(e.contains("duplicate field `"), "{e}");
    }
    assert_eq!(
        json_text(&mut con, "oa"),
        own,
        "a refused import changed the key"
    );
    let exists: i64 = redis::cmd("EXISTS").arg("dup").query(&mut con).unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn import_drops_tool_results_left_first() {
    let server = Server::start();
    let mut con = server.client();
    let msg = |role: &str, content: &str| json!({"role": role, "content": content});
    let doc = json!({"conversation_history": [
        msg("tool", "orphan result"), msg("tool", "another"), msg("user", "hi"), msg("assistant", "hello"),
    ]});
    let r = map_reply(&mut con, &["MEM.IMPORT", "a", &doc.to_string()]);
    assert_eq!(
        (
            int_field(&r, "trimmed"),
            int_field(&r, "messages"),
            int_field(&r, "id")
        ),
        (2, 2, 4)
    );
    let e = get(&mut con, &["MEM.GET", "a"]);
    assert_eq!(ids(&e), [3, 4]);
    assert_eq!(
        int_field(&r, "total_tokens"),
        e.iter().map(|m| m.tokens).sum::<i64>()
    );
    // The newest tool group is kept whole, over the caps (SPEC v3); what is
    // before it goes.
    let doc = json!({"conversation_history": [
        msg("user", "q"), msg("assistant", "call"), msg("tool", "r1"), msg("tool", "r2"),
    ]});
    ok(&mut con, &["CONFIG", "SET", "mem.max-messages", "2"]);
    let r = map_reply(&mut con, &["MEM.IMPORT", "b", &doc.to_string()]);
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (1, 3)
    );
    assert_eq!(ids(&get(&mut con, &["MEM.GET", "b"])), [2, 3, 4]);
    // The next write evicts the group whole: ids are never reused.
    let r = append(&mut con, "b", "user", "next", &[]);
    assert_eq!(
        (
            int_field(&r, "id"),
            int_field(&r, "trimmed"),
            int_field(&r, "messages")
        ),
        (5, 3, 1)
    );
    // A call kept with its results: nothing dropped.
    ok(&mut con, &["CONFIG", "SET", "mem.max-messages", "30"]);
    let r = map_reply(&mut con, &["MEM.IMPORT", "c", &doc.to_string()]);
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (0, 4)
    );
}

#[test]
fn missing_key_replies() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(ok(&mut con, &["MEM.GET", "nope"]), Value::Array(vec![]));
    assert_eq!(
        ok(&mut con, &["MEM.GET", "nope", "LAST", "5", "BUDGET", "100"]),
        Value::Array(vec![])
    );
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
    assert_err(
        &mut con,
        &["MEM.INFO", "a", "b"],
        "wrong number of arguments",
    );
}

// ---------------------------------------------------------------- MEM.INFO

#[test]
fn info_fields() {
    let server = Server::start();
    let mut con = server.client();
    let t0 = now_ms();
    append(
        &mut con,
        "k",
        "user",
        "first message",
        &[
            "TS",
            "1000",
            "MAXMSGS",
            "4",
            "MAXTOKENS",
            "7000",
            "TTL",
            "600",
        ],
    );
    let i = info(&mut con, "k");
    assert_eq!(names(&i), INFO_FIELDS);
    let created = int_field(&i, "created");
    assert!(
        created >= t0 - 1000 && created <= now_ms() + 1000,
        "created is the server clock, not TS"
    );
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
    assert_eq!(
        int_field(&i, "total_tokens"),
        e.iter().map(|x| x.tokens).sum::<i64>()
    );
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
    assert_eq!(
        (
            int_field(&i, "messages"),
            int_field(&i, "first_id"),
            int_field(&i, "last_id")
        ),
        (0, 0, 6)
    );
    // A session created by EXTSET.
    ok(&mut con, &["MEM.EXTSET", "x", "dify", "c"]);
    let i = info(&mut con, "x");
    assert_eq!(
        (
            int_field(&i, "messages"),
            int_field(&i, "total_tokens"),
            int_field(&i, "first_id"),
            int_field(&i, "last_id"),
            int_field(&i, "summary_upto")
        ),
        (0, 0, 0, 0, 0)
    );
}
