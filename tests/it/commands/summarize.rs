//! Integration tests of MEM.SUMMARIZE_CHECK, MEM.SUMMARIZE, MEM.EXTSET and MEM.EXTGET (SPEC §3-4), against a real redis-server
//! with the module loaded. Expected token counts are computed with
//! tiktoken-rs, never hard-coded.

use crate::support::reply::*;
use crate::support::server::*;
use redis::Value;
use std::time::Duration;

// ---------------------------------------------------------------- SUMMARIZE_CHECK

#[test]
fn thresholds_by_model_and_context() {
    let server = Server::start();
    let mut con = server.client();
    // 15% of the window, never above maxtokens less mem.summarize-headroom
    // (20%: 64,000 of 80,000).
    let cases = [
        ("gpt-4o", 19_200i64, 128_000i64),
        ("claude-3-5-sonnet", 30_000, 200_000),
        ("gpt-4.1", 64_000, 1_047_576),
        ("my-own-llm", 15_000, 0),
    ];
    for (model, threshold, window) in cases {
        // Via MODEL on MEM.APPEND: stored on the session.
        let k = format!("m:{model}");
        append(&mut con, &k, "user", "hi", &["MODEL", model]);
        let c = check(&mut con, &k, &[]);
        assert_eq!(names(&c), CHECK_FIELDS);
        assert_eq!(int_field(&c, "threshold_tokens"), threshold, "{model}");
        assert_eq!(int_field(&c, "threshold_messages"), 24, "30 less 20%");
        let i = info(&mut con, &k);
        assert_eq!(str_field(&i, "model"), model);
        assert_eq!(int_field(&i, "context_window"), window, "{model}");
        // Via MODEL on MEM.SUMMARIZE_CHECK, on a gpt-4o session, unchanged.
        append(&mut con, "base", "user", "hello", &[]);
        let before = snap(&mut con, "base");
        let c = check(&mut con, "base", &["MODEL", model]);
        assert_eq!(
            int_field(&c, "threshold_tokens"),
            threshold,
            "CHECK MODEL {model}"
        );
        assert_unchanged(&mut con, "base", &before, "SUMMARIZE_CHECK MODEL");
        assert_eq!(str_field(&info(&mut con, "base"), "model"), "gpt-4o");
    }
    // CONTEXT n: 15% of n, capped by maxtokens less the headroom.
    for (ctx, expect) in [(10_000, 1_500), (200_000, 30_000), (10_000_000, 64_000)] {
        let c = check(&mut con, "base", &["CONTEXT", &ctx.to_string()]);
        assert_eq!(int_field(&c, "threshold_tokens"), expect, "CONTEXT {ctx}");
    }
    // The session's caps less the headroom cap the thresholds (12 less 20%
    // is 9.6, rounded up).
    append(
        &mut con,
        "small",
        "user",
        "hi",
        &["MAXTOKENS", "5000", "MAXMSGS", "12"],
    );
    let c = check(&mut con, "small", &[]);
    assert_eq!(int_field(&c, "threshold_tokens"), 4_000);
    assert_eq!(int_field(&c, "threshold_messages"), 10);
    // Headroom 0: the rule before it existed, thresholds at the caps.
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-headroom", "0"]);
    let c = check(&mut con, "small", &[]);
    assert_eq!(
        (
            int_field(&c, "threshold_tokens"),
            int_field(&c, "threshold_messages")
        ),
        (5_000, 12)
    );
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-headroom", "20"]);
    let c = check(&mut con, "small", &["CONTEXT", "20000"]);
    assert_eq!(int_field(&c, "threshold_tokens"), 3_000);
    // A missing key reads as an empty session.
    let c = check(&mut con, "missing", &[]);
    assert_eq!(
        (
            int_field(&c, "messages"),
            int_field(&c, "total_tokens"),
            int_field(&c, "summarize"),
            int_field(&c, "upto")
        ),
        (0, 0, 0, 0)
    );
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
        (
            vec![
                "MEM.SUMMARIZE_CHECK",
                "k",
                "MODEL",
                "gpt-4o",
                "CONTEXT",
                "1000",
            ],
            "ERR",
        ),
        (
            vec![
                "MEM.SUMMARIZE_CHECK",
                "k",
                "CONTEXT",
                "1000",
                "MODEL",
                "gpt-4o",
            ],
            "ERR",
        ),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "CONTEXT", "0"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "CONTEXT", "-5"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "CONTEXT", "big"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "KEEP", "-1"], "ERR"),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "KEEP", "two"], "ERR"),
        (
            vec!["MEM.SUMMARIZE_CHECK", "k", "KEEP", "1", "keep", "2"],
            "given more than once",
        ),
        (
            vec!["MEM.SUMMARIZE_CHECK", "k", "MODEL", "a", "MODEL", "b"],
            "given more than once",
        ),
        (vec!["MEM.SUMMARIZE_CHECK", "k", "KEEP"], "needs a value"),
        (
            vec!["MEM.SUMMARIZE_CHECK", "k", "WINDOW", "5"],
            "unknown option 'WINDOW'",
        ),
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
        let r = append(
            &mut con,
            "m",
            "user",
            &format!("msg {i}"),
            &["MAXMSGS", "3"],
        );
        let c = check(&mut con, "m", &[]);
        assert_eq!(int_field(&r, "summarize"), i64::from(i >= 3), "append {i}");
        assert_eq!(int_field(&r, "summarize"), int_field(&c, "summarize"));
    }
    // By tokens: an unknown model uses mem.summarize-fallback-tokens.
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.summarize-fallback-tokens", "60"],
    );
    let mut total = 0;
    for i in 1..=12 {
        let content = format!("a sentence of several words, number {i}");
        let r = append(
            &mut con,
            "t",
            "user",
            &content,
            &["MODEL", "some-local-model"],
        );
        total += mt_o("user", &content);
        assert_eq!(int_field(&r, "total_tokens"), total);
        let c = check(&mut con, "t", &[]);
        assert_eq!(int_field(&c, "threshold_tokens"), 60);
        assert_eq!(
            int_field(&r, "summarize"),
            i64::from(total >= 60),
            "append {i}, total {total}"
        );
        assert_eq!(int_field(&c, "summarize"), int_field(&r, "summarize"));
    }
}

#[test]
fn keep_upto_and_upto_tokens() {
    let server = Server::start();
    let mut con = server.client();
    for i in 1..=12 {
        append(
            &mut con,
            "k",
            if i % 2 == 1 { "user" } else { "assistant" },
            &format!("turn {i} text"),
            &[],
        );
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
    assert_eq!(
        (
            int_field(&c, "keep"),
            int_field(&c, "upto"),
            int_field(&c, "upto_tokens")
        ),
        (3, 9, sum(1, 9))
    );
    let c = check(&mut con, "k", &["keep", "0"]);
    assert_eq!(
        (int_field(&c, "upto"), int_field(&c, "upto_tokens")),
        (12, sum(1, 12))
    );
    let c = check(&mut con, "k", &["KEEP", "12"]);
    assert_eq!(
        (int_field(&c, "upto"), int_field(&c, "upto_tokens")),
        (0, 0)
    );
    let c = check(&mut con, "k", &["KEEP", "50"]);
    assert_eq!(
        (int_field(&c, "upto"), int_field(&c, "upto_tokens")),
        (0, 0)
    );
    // mem.summarize-keep changes the default.
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-keep", "4"]);
    let c = check(&mut con, "k", &[]);
    assert_eq!((int_field(&c, "keep"), int_field(&c, "upto")), (4, 8));

    // upto moves back past tool messages so a result stays with its call.
    // ids: 1 user, 2 assistant(call), 3 tool, 4 tool, 5 user, 6 assistant
    for (role, content) in [
        ("user", "q"),
        ("assistant", "call"),
        ("tool", "r1"),
        ("tool", "r2"),
        ("user", "thanks"),
        ("assistant", "bye"),
    ] {
        append(&mut con, "t", role, content, &[]);
    }
    let e = get(&mut con, &["MEM.GET", "t"]);
    let c = check(&mut con, "t", &["KEEP", "3"]);
    assert_eq!(
        int_field(&c, "upto"),
        1,
        "the kept part would start with a tool message"
    );
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
    assert_eq!(
        int_field(&c, "upto_tokens"),
        st + e[1..5].iter().map(|x| x.tokens).sum::<i64>()
    );
    assert_eq!(
        int_field(&c, "total_tokens"),
        st + e[1..].iter().map(|x| x.tokens).sum::<i64>()
    );
}

// ---------------------------------------------------------------- SUMMARIZE

#[test]
fn summarize_replaces_covered_messages() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{s}";
    for i in 1..=12 {
        append(
            &mut con,
            k,
            "user",
            &format!("Message {i}: details of the trip to Kyoto."),
            &["TTL", "1000"],
        );
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
    assert_eq!(
        e[0].keys,
        ["summary", "id", "role", "content", "ts", "tokens"]
    );
    assert_eq!(
        (
            e[0].id,
            e[0].role.as_str(),
            e[0].content.as_str(),
            e[0].tokens
        ),
        (2, "summary", text, st)
    );
    assert!((e[0].ts - now_ms()).abs() < 5_000);
    assert_eq!(
        &e[1..],
        &after_appends[2..],
        "messages after upto are untouched"
    );
    assert_eq!(
        &e[1..11],
        &before[2..],
        "the checked messages are untouched too"
    );
    let doc = json_doc(&mut con, k);
    assert_eq!(doc["summary"]["content"], text);
    assert_eq!(doc["summary"]["upto"], 2);
    assert_eq!(doc["summary"]["tokens"], st);
    assert_eq!(doc["summary"]["ts"], e[0].ts);
    assert!(doc["summary"]["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(doc["total_tokens"], st + rest);
    assert_eq!(doc["conversation_history"].as_array().unwrap().len(), 13);
    let i = info(&mut con, k);
    assert_eq!(
        (
            int_field(&i, "summary_upto"),
            int_field(&i, "first_id"),
            int_field(&i, "last_id")
        ),
        (2, 3, 15)
    );

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
        (
            vec!["MEM.SUMMARIZE", k, "4", "stale"],
            "below the current summary",
        ),
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
        // A blank summary (an LLM's empty answer) would replace messages
        // with nothing.
        (vec!["MEM.SUMMARIZE", k, "7", ""], "summary is empty"),
        (vec!["MEM.SUMMARIZE", k, "7", " \n\t "], "summary is empty"),
        // Unicode's white space, controls, format characters, fillers.
        (
            vec!["MEM.SUMMARIZE", k, "7", "\u{b}\u{a0}\u{85}\u{2028}\u{3000}"],
            "summary is empty",
        ),
        (
            vec!["MEM.SUMMARIZE", k, "7", "\u{200b}\u{feff}\u{2060}\u{ad}"],
            "summary is empty",
        ),
        (
            vec!["MEM.SUMMARIZE", k, "7", "\0\0 \u{1}\u{3164}\u{2800}"],
            "summary is empty",
        ),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, k, &before, &format!("{args:?}"));
    }
    let e = err_raw(&mut con, &[b"MEM.SUMMARIZE", b"k", b"7", &[0xff, 0xfe]]);
    assert!(e.starts_with("ERR"), "{e}");
    assert_unchanged(&mut con, k, &before, "invalid UTF-8 summary");
    ok(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "10"]);
    assert_err(
        &mut con,
        &["MEM.SUMMARIZE", k, "7", "a summary longer than ten bytes"],
        "ERR",
    );
    assert_unchanged(&mut con, k, &before, "oversize summary");
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.max-message-bytes", "4194304"],
    );
    // A missing key: an error, and the key is not created.
    assert_err(&mut con, &["MEM.SUMMARIZE", "missing", "1", "x"], "ERR");
    assert_eq!(int(&mut con, &["EXISTS", "missing"]), 0);
    // Visible text among invisible characters is a summary.
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, "6", "\u{200b} ok \u{feff}"]);
    assert_eq!(int_field(&r, "id"), 6);
    // Still works with a valid upto.
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, "7", "second"]);
    assert_eq!(int_field(&r, "messages"), 1);
}

/// SPEC MEM.SUMMARIZE: a summary never evicts a newer message. The defect:
/// MAXTOKENS 5000, 20 messages, a 6,000-token summary of the first 5
/// succeeded with `trimmed 15`.
#[test]
fn summarize_over_maxtokens_is_refused_and_evicts_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{cap}";
    for i in 1..=20 {
        append(
            &mut con,
            k,
            "user",
            &format!("Message {i}: a few words about the plan."),
            &["MAXTOKENS", "5000"],
        );
    }
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e.len(), 20);
    let kept: i64 = e[5..].iter().map(|m| m.tokens).sum();
    // " a" is one token each: the summary costs 3 + 1 ("system") + n.
    let summary = |n: usize| " a".repeat(n);
    let big = summary(6_000);
    assert_eq!(mt_o("system", &big), 6_004);
    let before = snap(&mut con, k);
    for text in [big, summary((5_000 - kept - 4 + 1) as usize)] {
        let e = err(&mut con, &["MEM.SUMMARIZE", k, "5", &text]);
        assert!(
            e.starts_with("ERR") && e.contains("exceed maxtokens (5000)"),
            "{e}"
        );
        assert!(
            e.contains(&format!("({kept} tokens)")),
            "names the kept tokens: {e}"
        );
        assert_unchanged(&mut con, k, &before, "a summary over maxtokens");
    }
    // Exactly at the cap: accepted, nothing trimmed.
    let text = summary((5_000 - kept - 4) as usize);
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", k, "5", &text]);
    assert_eq!(int_field(&r, "trimmed"), 0);
    assert_eq!(int_field(&r, "messages"), 15);
    assert_eq!(int_field(&r, "total_tokens"), 5_000);
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k])),
        [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    );
    let i = info(&mut con, k);
    assert_eq!(
        (int_field(&i, "summary_upto"), int_field(&i, "first_id")),
        (5, 6)
    );
}

#[test]
fn summarize_never_separates_a_tool_result_from_its_call() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{tool}";
    // ids: 1 user, 2 assistant (the call), 3 tool, 4 tool, 5 assistant, 6 user
    for (role, content, meta) in [
        ("user", "Weather in Paris and Rome?", None),
        (
            "assistant",
            "",
            Some(r#"{"tool_calls":[{"id":"c1"},{"id":"c2"}]}"#),
        ),
        ("tool", "21C", Some(r#"{"tool_call_id":"c1"}"#)),
        ("tool", "25C", Some(r#"{"tool_call_id":"c2"}"#)),
        ("assistant", "Paris 21C, Rome 25C.", None),
        ("user", "thanks", None),
    ] {
        let mut opts = vec![];
        if let Some(m) = meta {
            opts = vec!["META", m];
        }
        append(&mut con, k, role, content, &opts);
    }
    let before = snap(&mut con, k);
    for (upto, first_kept) in [(2, 3), (3, 4)] {
        let e = err(
            &mut con,
            &["MEM.SUMMARIZE", k, &upto.to_string(), "summary"],
        );
        assert!(
            e.starts_with("ERR") && e.contains(&format!("(id {first_kept}) is a tool result")),
            "{e}"
        );
        assert_unchanged(&mut con, k, &before, &format!("summary up to {upto}"));
    }
    // SUMMARIZE_CHECK's upto moves back so the kept part starts at the call:
    // what it proposes is accepted.
    let c = check(&mut con, k, &["KEEP", "4"]);
    assert_eq!(int_field(&c, "upto"), 1);
    let r = map_reply(
        &mut con,
        &["MEM.SUMMARIZE", k, "1", "The user asked about the weather."],
    );
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (0, 5)
    );
    // After the last result: fine too.
    let r = map_reply(
        &mut con,
        &["MEM.SUMMARIZE", k, "4", "Weather: Paris 21C, Rome 25C."],
    );
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (0, 2)
    );
    // upto below the current summary's, or no longer in the session.
    let before = snap(&mut con, k);
    assert_err(
        &mut con,
        &["MEM.SUMMARIZE", k, "1", "stale"],
        "below the current summary's (4)",
    );
    assert_err(
        &mut con,
        &["MEM.SUMMARIZE", k, "4", "again"],
        "is not the id of a message",
    );
    assert_unchanged(&mut con, k, &before, "stale upto");
}

// ---------------------------------------------------------------- EXTSET / EXTGET

#[test]
fn extset_extget_basics() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "k", "dify"]), Value::Nil);
    assert_eq!(int(&mut con, &["EXISTS", "k"]), 0, "EXTGET does not create");
    assert_eq!(
        ok(&mut con, &["MEM.EXTSET", "k", "dify", "conv-1"]),
        Value::Okay
    );
    // Creates the session, with the default settings.
    let i = info(&mut con, "k");
    assert_eq!(int_field(&i, "messages"), 0);
    assert_eq!(int_field(&i, "ttl"), 86_400);
    let p = int(&mut con, &["PTTL", "k"]);
    assert!(p > 86_000_000, "{p}");
    assert_eq!(string(&mut con, &["MEM.EXTGET", "k", "dify"]), "conv-1");
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "k", "n8n"]), Value::Nil);
    ok(
        &mut con,
        &["MEM.EXTSET", "k", "n8n", "wf-9 with spaces ✓", "ex", "500"],
    );
    ok(&mut con, &["MEM.EXTSET", "k", "dify", "conv-2"]);
    assert_eq!(string(&mut con, &["MEM.EXTGET", "k", "dify"]), "conv-2");
    assert_eq!(
        string(&mut con, &["MEM.EXTGET", "k", "n8n"]),
        "wf-9 with spaces ✓"
    );
    let ext: Vec<String> = redis::from_redis_value(
        &info(&mut con, "k")
            .into_iter()
            .find(|(n, _)| n == "external")
            .unwrap()
            .1,
    )
    .unwrap();
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
        (
            vec!["MEM.EXTSET", "k", "dify", "x", "EX", "1", "EX", "2"],
            "given more than once",
        ),
        (
            vec!["MEM.EXTSET", "k", "dify", "x", "PX", "100"],
            "unknown option 'PX'",
        ),
        (vec!["MEM.EXTSET", "k", "", "x"], "ERR"),
        (vec!["MEM.EXTGET", "k"], "wrong number of arguments"),
        (
            vec!["MEM.EXTGET", "k", "dify", "extra"],
            "wrong number of arguments",
        ),
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
    assert_err(
        &mut con,
        &["MEM.EXTSET", "new", "dify", "x", "EX", "0"],
        "ERR",
    );
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
    let ext: Vec<String> = redis::from_redis_value(
        &info(&mut con, "a")
            .into_iter()
            .find(|(n, _)| n == "external")
            .unwrap()
            .1,
    )
    .unwrap();
    assert_eq!(ext, ["n8n"], "MEM.INFO lists live ids only");
    // So does FORMAT JSON, before any write drops the expired one (hostile
    // pass 30 F1: it showed it, so FORMAT JSON -> IMPORT differed).
    let doc: serde_json::Value =
        serde_json::from_str(&string(&mut con, &["MEM.GET", "a", "FORMAT", "JSON"])).unwrap();
    let systems: Vec<&String> = doc["redis_mem"]["external"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(systems, ["n8n"], "{doc}");
    ok(&mut con, &["CONFIG", "SET", "mem.ext-ttl", "86400"]);

    // The key never expires before an id: session TTL 5, EXTSET EX 100.
    append(&mut con, "c", "user", "hi", &["TTL", "5"]);
    ok(&mut con, &["MEM.EXTSET", "c", "dify", "x", "EX", "100"]);
    let p = int(&mut con, &["PTTL", "c"]);
    assert!(
        p > 95_000 && p <= 100_000,
        "EXTSET EX 100 on a 5 s session: PTTL {p}"
    );
    // Nor does an append's sliding refresh shorten it.
    append(&mut con, "c", "user", "again", &[]);
    let p = int(&mut con, &["PTTL", "c"]);
    assert!(
        p > 95_000 && p <= 100_000,
        "append after EXTSET EX 100: PTTL {p}"
    );
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
    assert!(
        p > 95_000 && p <= 100_000,
        "EXTSET creating a 5 s session with EX 100: PTTL {p}"
    );
}
