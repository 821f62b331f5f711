//! Integration tests of module configuration, MODEL changes and DEBUG RELOAD (SPEC §3-4), against a real redis-server
//! with the module loaded. Expected token counts are computed with
//! tiktoken-rs, never hard-coded.

use crate::support::reply::*;
use crate::support::server::*;
use redis::Value;

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
        ("mem.summarize-headroom", "20", "0"),
        ("mem.default-model", "gpt-4o", "claude-3-5-sonnet"),
        ("mem.default-encoding", "o200k_base", "cl100k_base"),
        ("mem.max-message-bytes", "4194304", "1048576"),
        ("mem.async-threshold-bytes", "65536", "1024"),
        ("mem.count-threads", "2", "3"),
        ("mem.max-tokens-limit", "10000000", "500000"),
        ("mem.max-messages-limit", "100000", "1000"),
        ("mem.debug-count-delay-ms", "0", "5"),
        ("mem.max-age", "0", "604800"),
        ("mem.models", "", "my-llm=qwen2:32768 acme-*=default:1000"),
        ("mem.encodings", "all", "o200k_base,cl100k_base"),
    ];
    for (name, default, new) in defaults {
        assert_eq!(config_get(&mut con, name), default, "default of {name}");
        ok(&mut con, &["CONFIG", "SET", name, new]);
        assert_eq!(config_get(&mut con, name), new, "{name} after CONFIG SET");
    }
    // Memory configs take units.
    ok(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "5mb"]);
    assert_eq!(
        config_get(&mut con, "mem.max-message-bytes"),
        (5 * 1024 * 1024).to_string()
    );
    // Invalid values are refused and leave the value as it was.
    for (name, bad) in [
        ("mem.default-encoding", "p50k_base"),
        ("mem.default-encoding", "gpt2"),
        ("mem.summarize-ratio", "0"),
        ("mem.summarize-ratio", "101"),
        ("mem.summarize-ratio", "-5"),
        ("mem.count-threads", "0"),
        ("mem.count-threads", "65"),
        ("mem.debug-count-delay-ms", "60001"),
        ("mem.max-messages", "0"),
        ("mem.max-tokens", "0"),
        ("mem.max-tokens", "abc"),
        ("mem.ttl", "-1"),
        ("mem.ext-ttl", "0"),
        ("mem.summarize-fallback-tokens", "0"),
        ("mem.summarize-keep", "-1"),
        ("mem.summarize-headroom", "-1"),
        ("mem.summarize-headroom", "91"),
        ("mem.default-model", ""),
        ("mem.max-message-bytes", "0"),
        ("mem.models", "x=nope:1"),
        ("mem.models", "x=qwen2"),
    ] {
        let prev = config_get(&mut con, name);
        let e = err(&mut con, &["CONFIG", "SET", name, bad]);
        assert!(e.starts_with("ERR"), "CONFIG SET {name} {bad}: {e}");
        assert_eq!(
            config_get(&mut con, name),
            prev,
            "{name} changed by a refused value"
        );
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
    assert_eq!(
        (
            int_field(&i, "maxmsgs"),
            int_field(&i, "maxtokens"),
            int_field(&i, "ttl"),
            int_field(&i, "messages")
        ),
        (3, 5000, 120, 3)
    );
    let p = int(&mut con, &["PTTL", "new"]);
    assert!(p > 115_000 && p <= 120_000, "{p}");
    // The caps less mem.summarize-headroom (20%), rounded up: 3 stays 3.
    let c = check(&mut con, "new", &[]);
    assert_eq!(
        (
            int_field(&c, "threshold_tokens"),
            int_field(&c, "threshold_messages")
        ),
        (4000, 3)
    );
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-headroom", "50"]);
    let c = check(&mut con, "new", &[]);
    assert_eq!(
        (
            int_field(&c, "threshold_tokens"),
            int_field(&c, "threshold_messages")
        ),
        (2500, 2)
    );
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-headroom", "0"]);
    let c = check(&mut con, "new", &[]);
    assert_eq!(
        (
            int_field(&c, "threshold_tokens"),
            int_field(&c, "threshold_messages")
        ),
        (5000, 3)
    );
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-headroom", "20"]);
    // Existing sessions keep their own settings.
    let i = info(&mut con, "old");
    assert_eq!(
        (
            int_field(&i, "maxmsgs"),
            int_field(&i, "maxtokens"),
            int_field(&i, "ttl"),
            int_field(&i, "messages")
        ),
        (30, 80_000, 86_400, 6)
    );

    // mem.default-model.
    ok(&mut con, &["CONFIG", "SET", "mem.default-model", "gpt-4"]);
    let r = append(&mut con, "g4", "user", "你好，世界", &[]);
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "你好，世界"));
    let i = info(&mut con, "g4");
    assert_eq!(
        (str_field(&i, "model"), str_field(&i, "encoding")),
        ("gpt-4".to_owned(), "cl100k_base".to_owned())
    );
    assert_eq!(json_doc(&mut con, "missing")["model"], "gpt-4");

    // mem.default-encoding for a model without a public tokenizer.
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.default-model", "claude-3-5-sonnet"],
    );
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.default-encoding", "cl100k_base"],
    );
    let r = append(&mut con, "cl", "user", "你好，世界", &[]);
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "你好，世界"));
    let i = info(&mut con, "cl");
    assert_eq!(
        (
            str_field(&i, "model"),
            str_field(&i, "encoding"),
            int_field(&i, "context_window")
        ),
        (
            "claude-3-5-sonnet".to_owned(),
            "cl100k_base".to_owned(),
            200_000
        )
    );
    let r = append(
        &mut con,
        "gem",
        "user",
        "你好，世界",
        &["MODEL", "gemini-1.5-pro"],
    );
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "你好，世界"));
    assert_eq!(str_field(&info(&mut con, "gem"), "encoding"), "cl100k_base");
    // A model with a public tokenizer ignores the default encoding.
    let r = append(&mut con, "o", "user", "你好，世界", &["MODEL", "gpt-4o"]);
    assert_eq!(int_field(&r, "tokens"), mt_o("user", "你好，世界"));
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.default-encoding", "o200k_base"],
    );
    let r = append(&mut con, "cl2", "user", "你好，世界", &[]);
    assert_eq!(int_field(&r, "tokens"), mt_o("user", "你好，世界"));
    assert_eq!(str_field(&info(&mut con, "cl2"), "encoding"), "o200k_base");

    // mem.summarize-ratio, mem.summarize-fallback-tokens, mem.summarize-keep.
    ok(&mut con, &["CONFIG", "SET", "mem.max-tokens", "80000"]);
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-ratio", "10"]);
    append(&mut con, "r", "user", "x", &["MODEL", "gpt-4o"]);
    assert_eq!(
        int_field(&check(&mut con, "r", &[]), "threshold_tokens"),
        12_800
    );
    assert_eq!(
        int_field(
            &check(&mut con, "r", &["MODEL", "claude-3-5-sonnet"]),
            "threshold_tokens"
        ),
        20_000
    );
    assert_eq!(
        int_field(
            &check(&mut con, "r", &["CONTEXT", "1000"]),
            "threshold_tokens"
        ),
        100
    );
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.summarize-fallback-tokens", "4321"],
    );
    assert_eq!(
        int_field(
            &check(&mut con, "r", &["MODEL", "mystery"]),
            "threshold_tokens"
        ),
        4321
    );
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-keep", "1"]);
    let c = check(&mut con, "r", &[]);
    assert_eq!(int_field(&c, "keep"), 1);

    // mem.async-threshold-bytes: content at or above it may be counted off
    // the main thread; the counts are the same either way.
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "16"],
    );
    let big =
        "Large message of prose, counted off the main thread. 大きなメッセージ。 ".repeat(2_000);
    let mut total = 0;
    for content in [
        "tiny",
        "exactly sixteen!",
        "a bit more than sixteen bytes",
        big.as_str(),
    ] {
        let r = append(
            &mut con,
            "async",
            "user",
            content,
            &["MODEL", "gpt-4o", "MAXMSGS", "100"],
        );
        total += mt_o("user", content);
        assert_eq!(
            int_field(&r, "tokens"),
            mt_o("user", content),
            "{} bytes",
            content.len()
        );
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
    assert_eq!(
        (int_field(&i, "maxmsgs"), str_field(&i, "model")),
        (7, "gpt-4.1".to_owned())
    );
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
    assert_eq!(
        int_field(&r, "total_tokens"),
        c_total + mt_c("user", "再见")
    );
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].tokens, mt_c("system", summary), "summary re-counted");
    for (x, (role, content)) in e[1..4].iter().zip(&texts[1..]) {
        assert_eq!(x.tokens, mt_c(role, content), "message {} re-counted", x.id);
    }
    let i = info(&mut con, k);
    assert_eq!(
        (str_field(&i, "model"), str_field(&i, "encoding")),
        ("gpt-4".to_owned(), "cl100k_base".to_owned())
    );
    assert_eq!(
        int_field(&i, "total_tokens"),
        e.iter().map(|x| x.tokens).sum::<i64>()
    );
    let doc = json_doc(&mut con, k);
    assert_eq!(doc["summary"]["tokens"], mt_c("system", summary));

    // Same tokenizer (gpt-3.5-turbo): nothing changes but the model.
    let before: Vec<i64> = e.iter().map(|x| x.tokens).collect();
    let r = append(&mut con, k, "user", "再见", &["MODEL", "gpt-3.5-turbo"]);
    assert_eq!(int_field(&r, "tokens"), mt_c("user", "再见"));
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(
        e[..before.len()]
            .iter()
            .map(|x| x.tokens)
            .collect::<Vec<_>>(),
        before
    );
    assert_eq!(str_field(&info(&mut con, k), "model"), "gpt-3.5-turbo");

    // Back to o200k_base with another o200k model.
    let r = append(&mut con, k, "user", "再见", &["MODEL", "o3-mini"]);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(e[0].tokens, mt_o("system", summary));
    for (x, (role, content)) in e[1..4].iter().zip(&texts[1..]) {
        assert_eq!(x.tokens, mt_o(role, content));
    }
    assert_eq!(
        int_field(&r, "total_tokens"),
        e.iter().map(|x| x.tokens).sum::<i64>()
    );
    assert_eq!(str_field(&info(&mut con, k), "encoding"), "o200k_base");
    // Same tokenizer, other family (claude with the default o200k_base).
    let before: Vec<i64> = e.iter().map(|x| x.tokens).collect();
    append(&mut con, k, "user", "x", &["MODEL", "claude-3-5-sonnet"]);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(
        e[..before.len()]
            .iter()
            .map(|x| x.tokens)
            .collect::<Vec<_>>(),
        before
    );
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
        ("mixtral-8x7b", "o200k_base"),
    ] {
        let key = format!("k:{model}");
        let r = append(&mut con, &key, "user", text, &["MODEL", model]);
        let want = if enc == "o200k_base" {
            mt_o("user", text)
        } else {
            mt_c("user", text)
        };
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
    append(
        &mut con,
        "mem:{noexp}",
        "user",
        "no expiry",
        &["TTL", "0", "MODEL", "gpt-4"],
    );
    append(
        &mut con,
        "mem:{short}",
        "user",
        "short ttl",
        &["TTL", "300", "MAXMSGS", "2", "MAXTOKENS", "900"],
    );
    for i in 0..5 {
        append(
            &mut con,
            "mem:{short}",
            if i % 2 == 0 { "assistant" } else { "tool" },
            &format!("r{i}"),
            &[],
        );
    }
    ok(
        &mut con,
        &[
            "MEM.IMPORT",
            "mem:{imp}",
            r#"{"conversation_history":[{"role":"user","content":"hi","timestamp":"2024-01-01T00:00:00"}],"user_profile":{"name":"Ann"},"context":[1,2]}"#,
        ],
    );
    ok(
        &mut con,
        &["MEM.EXTSET", "mem:{ext}", "n8n", "only-ext", "EX", "500"],
    );
    append(
        &mut con,
        "mem:{claude}",
        "user",
        "hi",
        &["MODEL", "claude-3-haiku"],
    );
    let keys = [
        "mem:{p}",
        "mem:{noexp}",
        "mem:{short}",
        "mem:{imp}",
        "mem:{ext}",
        "mem:{claude}",
    ];
    // Each key: its type, model, TTL, entries and MEM.INFO, compared after.
    #[allow(clippy::type_complexity)]
    let before: Vec<(String, String, i64, Vec<Entry>, Vec<(String, Value)>)> = keys
        .iter()
        .map(|k| {
            (
                digest(&mut con, k),
                json_text(&mut con, k),
                int(&mut con, &["PTTL", k]),
                get(&mut con, &["MEM.GET", k]),
                info(&mut con, k),
            )
        })
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
            assert!(
                p2 <= *p && p2 > p - elapsed - 1000,
                "{k}: PTTL {p} -> {p2} ({elapsed} ms later)"
            );
        }
    }
    assert_eq!(
        string(&mut con, &["MEM.EXTGET", "mem:{ext}", "n8n"]),
        "only-ext"
    );
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
                let last = doc["conversation_history"]
                    .as_array()
                    .unwrap()
                    .last()
                    .unwrap()
                    .clone();
                assert_eq!(last["ts"].to_string(), ts);
                let stamp = last["timestamp"].as_str().unwrap_or("");
                // ISO 8601 UTC, possibly with an expanded (signed) year.
                let body = stamp.strip_prefix('+').unwrap_or(stamp);
                let year: String = body.chars().take_while(char::is_ascii_digit).collect();
                assert!(
                    year.len() >= 4
                        && body[year.len()..].starts_with('-')
                        && stamp.contains('T')
                        && stamp.ends_with('Z'),
                    "TS {ts} accepted but FORMAT JSON renders timestamp {stamp:?}, not ISO 8601"
                );
            }
        }
    }
}
