//! Issue 13: every model family's own encoding (MEM.COUNT and MEM.APPEND
//! against the tiktoken crate, the vendors' tokenizers being checked in
//! tests/oracle), encodings built on first use off the main thread, the
//! model table (built-in, mem.models, MEM.MODELS), MEM.APPEND ... TOKENS n.

use crate::support::server::*;

/// (model, encoding name in MEM.INFO, the tiktoken crate's name).
const FAMILIES: &[(&str, &str, &str)] = &[
    ("llama-3.1-8b", "llama3", "llama3"),
    ("deepseek-chat", "deepseek_v3", "deepseek_v3"),
    ("qwen-plus", "qwen2", "qwen2"),
    ("glm-4.5", "glm4", "glm4"),
    ("glm-5", "glm5", "glm5"),
    ("kimi-k2", "kimi_k2", "kimi_k2"),
    ("minimax-m2", "minimax_m2", "minimax_m2"),
    ("mistral-nemo", "tekken", "mistral_v3"),
];

const TEXTS: &[&str] = &[
    "hello world",
    "我们在 Redis 里保存对话记忆，每个会话一个键。企业微信和飞书里的助手。",
    "今日はいい天気ですね。トークン数を正確に数える。안녕하세요",
    "fn main() {\n    let v: Vec<u64> = (1..=10).map(|x| x * x).collect();\n}\n",
    "emoji 🎉👍🏽👩‍👩‍👧‍👦🇯🇵 and tabs\t\tend",
    "https://example.com/a/b?c=1&d=2 3.14159 1e-9 +86 138 0013 8000",
    ". Tiếng Việt có dấu: Xin chào thế giới.",
    "   \n\n\t  x  \r\n",
];

fn count(con: &mut redis::Connection, model: &str, text: &str) -> i64 {
    match cmd(con, &["MEM.COUNT", model, text]).unwrap() {
        redis::Value::Int(n) => n,
        other => panic!("{other:?}"),
    }
}

fn info_line(con: &mut redis::Connection, field: &str) -> String {
    let info: String = redis::cmd("INFO").arg("mem").query(con).unwrap();
    let want = format!("mem_{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&want))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

fn encoding_state(con: &mut redis::Connection, encoding: &str) -> String {
    let line = info_line(con, &format!("encoding_{encoding}"));
    line.split(',')
        .find_map(|f| f.strip_prefix("state="))
        .unwrap_or("")
        .to_owned()
}

fn encoding_memory(con: &mut redis::Connection, encoding: &str) -> i64 {
    let line = info_line(con, &format!("encoding_{encoding}"));
    line.split(',')
        .find_map(|f| f.strip_prefix("memory_bytes="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

#[test]
fn every_family_counts_with_its_own_encoding() {
    let server = Server::start();
    let mut con = server.client();
    for &(model, encoding, reference) in FAMILIES {
        let reference = tiktoken::get_encoding(reference).unwrap();
        for (i, text) in TEXTS.iter().enumerate() {
            assert_eq!(
                count(&mut con, model, text),
                reference.count(text) as i64,
                "{model} text {i}"
            );
        }
        // MEM.APPEND stores the same count, in chat format, and the session
        // takes the model's encoding and window.
        let key = format!("s:{model}");
        let text = TEXTS[1];
        let r = map_reply(
            &mut con,
            &["MEM.APPEND", &key, "user", text, "MODEL", model],
        );
        let want = 3 + reference.count("user") + reference.count(text);
        assert_eq!(int_field(&r, "tokens"), want as i64, "{model}");
        let with_role = match cmd(&mut con, &["MEM.COUNT", model, text, "ROLE", "user"]).unwrap() {
            redis::Value::Int(n) => n,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            with_role, want as i64,
            "{model}: MEM.COUNT ROLE counts as MEM.APPEND does"
        );
        let info = map_reply(&mut con, &["MEM.INFO", &key]);
        assert_eq!(str_field(&info, "encoding"), encoding);
        assert!(int_field(&info, "context_window") > 8000, "{model}");
    }
    // Families differ: the same text, different counts.
    let text = TEXTS[1];
    let counts: std::collections::BTreeSet<i64> = FAMILIES
        .iter()
        .map(|f| count(&mut con, f.0, text))
        .collect();
    assert!(counts.len() >= 4, "{counts:?}");
}

#[test]
fn mem_count_refuses_bad_input_and_counts_large_texts_on_the_pool() {
    let server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "1000"],
    )
    .unwrap();
    for (args, code) in [
        (vec!["MEM.COUNT", "gpt-4o"], "ERR"),
        (vec!["MEM.COUNT", "", "x"], "ERR"),
        (vec!["MEM.COUNT", "gpt-4o", "x", "ROLE"], "ERR"),
        (vec!["MEM.COUNT", "gpt-4o", "x", "ROLE", ""], "ERR"),
        (vec!["MEM.COUNT", "gpt-4o", "x", "FOO", "1"], "ERR"),
        (
            vec!["MEM.COUNT", "gpt-4o", "x", "ROLE", "a", "ROLE", "b"],
            "ERR",
        ),
    ] {
        let e = cmd(&mut con, &args).unwrap_err();
        assert_eq!(e.code(), Some(code), "{args:?}: {e}");
    }
    let bad = redis::cmd("MEM.COUNT")
        .arg("gpt-4o")
        .arg(&b"\xff\xfe"[..])
        .query::<i64>(&mut con)
        .unwrap_err();
    assert!(bad.to_string().contains("UTF-8"), "{bad}");
    let big_bad = [&b"x".repeat(5000)[..], b"\xff"].concat();
    let e = redis::cmd("MEM.COUNT")
        .arg("gpt-4o")
        .arg(big_bad)
        .query::<i64>(&mut con)
        .unwrap_err();
    assert!(
        e.to_string().contains("UTF-8"),
        "checked on the worker too: {e}"
    );
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.max-message-bytes", "100000"],
    )
    .unwrap();
    let e = cmd(&mut con, &["MEM.COUNT", "gpt-4o", &"x".repeat(100_001)]).unwrap_err();
    assert!(e.to_string().contains("mem.max-message-bytes"), "{e}");
    // Large: counted by a worker (counts_off_thread grows), same result.
    let reference = tiktoken::get_encoding("qwen2").unwrap();
    let text = TEXTS.join(" ").repeat(60);
    let before = info_mem(&mut con, "counts_off_thread");
    assert_eq!(
        count(&mut con, "qwen-plus", &text),
        reference.count(&text) as i64
    );
    assert!(info_mem(&mut con, "counts_off_thread") > before);
    // Keyless: COMMAND GETKEYS finds none, and no key was made.
    let e = cmd(
        &mut con,
        &["COMMAND", "GETKEYS", "MEM.COUNT", "gpt-4o", "x"],
    )
    .unwrap_err();
    assert!(e.to_string().to_lowercase().contains("key"), "{e}");
    assert_eq!(cmd(&mut con, &["DBSIZE"]).unwrap(), redis::Value::Int(0));
}

#[test]
fn an_encoding_is_built_on_first_use_while_the_client_waits() {
    let server = Server::start();
    let mut con = server.client();
    // Only the default model's encoding is built at start.
    assert_eq!(info_line(&mut con, "encodings_loaded"), "o200k_base");
    assert_eq!(encoding_state(&mut con, "qwen2"), "unloaded");
    assert_eq!(encoding_memory(&mut con, "qwen2"), 0);
    // The worker waits 1.5 s before building: the first client is seen
    // blocked while the server answers others.
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "1500"],
    )
    .unwrap();
    let url = server.url();
    let first = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        map_reply(
            &mut c,
            &[
                "MEM.APPEND",
                "s",
                "user",
                "你好，世界",
                "MODEL",
                "qwen-plus",
            ],
        )
    });
    poll_until(&mut con, "the append to wait for the encoding", |c| {
        blocked_appends(c) == 1
    });
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG", "the main thread serves others meanwhile");
    assert_eq!(
        cmd(&mut con, &["EXISTS", "s"]).unwrap(),
        redis::Value::Int(0),
        "nothing written yet"
    );
    let r = first.join().unwrap();
    let q = tiktoken::get_encoding("qwen2").unwrap();
    assert_eq!(
        int_field(&r, "tokens"),
        3 + (q.count("user") + q.count("你好，世界")) as i64
    );
    assert_eq!(encoding_state(&mut con, "qwen2"), "loaded");
    assert!(encoding_memory(&mut con, "qwen2") > 1_000_000);
    assert_eq!(
        info_line(&mut con, "encodings_loaded"),
        "o200k_base,qwen2",
        "nothing else was built"
    );
    // Built once: later commands count at once.
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "0"],
    )
    .unwrap();
    let r = map_reply(&mut con, &["MEM.APPEND", "s", "assistant", "ok"]);
    assert_eq!(int_field(&r, "id"), 2);
}

#[test]
fn multi_exec_and_scripts_get_tryagain_while_an_encoding_is_built() {
    let server = Server::start();
    let mut con = server.client();
    let results: redis::RedisResult<redis::Value> = redis::pipe()
        .atomic()
        .cmd("MEM.APPEND")
        .arg("m")
        .arg("user")
        .arg("hi")
        .arg("MODEL")
        .arg("glm-5")
        .query(&mut con);
    let text = match results {
        Ok(v) => format!("{v:?}"),
        Err(e) => e.to_string(),
    };
    assert!(text.to_uppercase().contains("TRYAGAIN"), "{text}");
    assert_eq!(
        cmd(&mut con, &["EXISTS", "m"]).unwrap(),
        redis::Value::Int(0),
        "refused, nothing written"
    );
    // The build started anyway: once done, the same transaction succeeds.
    poll_until(&mut con, "glm5 to be built", |c| {
        encoding_state(c, "glm5") == "loaded"
    });
    let _: redis::Value = redis::pipe()
        .atomic()
        .cmd("MEM.APPEND")
        .arg("m")
        .arg("user")
        .arg("hi")
        .arg("MODEL")
        .arg("glm-5")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        str_field(&map_reply(&mut con, &["MEM.INFO", "m"]), "encoding"),
        "glm5"
    );
    // A script: MEM.COUNT of an unbuilt encoding, refused the same way.
    let e = cmd(
        &mut con,
        &[
            "EVAL",
            "return redis.call('MEM.COUNT', 'kimi-k2', 'x')",
            "0",
        ],
    )
    .unwrap_err();
    assert!(e.to_string().to_uppercase().contains("TRYAGAIN"), "{e}");
    poll_until(&mut con, "kimi_k2 to be built", |c| {
        encoding_state(c, "kimi_k2") == "loaded"
    });
    let n = cmd(
        &mut con,
        &[
            "EVAL",
            "return redis.call('MEM.COUNT', 'kimi-k2', 'x')",
            "0",
        ],
    )
    .unwrap();
    assert_eq!(n, redis::Value::Int(1));
}

#[test]
fn a_replica_applies_writes_without_building_their_encoding() {
    let master = Server::start();
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    for (i, (model, _, _)) in FAMILIES.iter().enumerate().take(4) {
        map_reply(
            &mut con,
            &[
                "MEM.APPEND",
                &format!("r{i}"),
                "user",
                TEXTS[1],
                "MODEL",
                model,
            ],
        );
    }
    cmd(&mut con, &["WAIT", "1", "5000"]).unwrap();
    for (i, (_, encoding, _)) in FAMILIES.iter().enumerate().take(4) {
        let m = map_reply(&mut con, &["MEM.INFO", &format!("r{i}")]);
        let r = map_reply(&mut rcon, &["MEM.INFO", &format!("r{i}")]);
        assert_eq!(int_field(&r, "total_tokens"), int_field(&m, "total_tokens"));
        assert_eq!(str_field(&r, "encoding"), *encoding);
        assert_eq!(
            encoding_state(&mut rcon, encoding),
            "unloaded",
            "the op carried the count"
        );
    }
}

#[test]
fn tokens_option_stores_the_given_count() {
    let server = Server::start();
    let mut con = server.client();
    let r = map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "t",
            "assistant",
            "a Claude reply",
            "MODEL",
            "claude-sonnet-4-5",
            "TOKENS",
            "1234",
        ],
    );
    assert_eq!(int_field(&r, "tokens"), 1234);
    assert_eq!(int_field(&r, "total_tokens"), 1234);
    let r = map_reply(
        &mut con,
        &["MEM.APPEND", "t", "user", "counted", "tokens", "0"],
    );
    assert_eq!(
        int_field(&r, "tokens"),
        0,
        "option names are case-insensitive; 0 is allowed"
    );
    let r = map_reply(&mut con, &["MEM.APPEND", "t", "user", "counted"]);
    let counted = int_field(&r, "tokens");
    assert!(counted > 3);
    assert_eq!(int_field(&r, "total_tokens"), 1234 + counted);
    // Bad values: refused, nothing changed.
    for bad in ["-1", "abc", "10000001", ""] {
        let e = cmd(&mut con, &["MEM.APPEND", "t", "user", "x", "TOKENS", bad]).unwrap_err();
        assert_eq!(e.code(), Some("ERR"), "TOKENS {bad}: {e}");
    }
    let e = cmd(
        &mut con,
        &["MEM.APPEND", "t", "user", "x", "TOKENS", "1", "TOKENS", "2"],
    )
    .unwrap_err();
    assert!(e.to_string().contains("more than once"), "{e}");
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "t"]), "messages"),
        3
    );
    // MEM.GET returns the stored counts; a large content with TOKENS too.
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "1000"],
    )
    .unwrap();
    let big = "word ".repeat(1000);
    let r = map_reply(&mut con, &["MEM.APPEND", "t", "user", &big, "TOKENS", "77"]);
    assert_eq!(int_field(&r, "tokens"), 77);
    let entries = match cmd(&mut con, &["MEM.GET", "t"]).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    let tokens: Vec<i64> = entries
        .into_iter()
        .map(|e| int_field(&as_fields(e), "tokens"))
        .collect();
    assert_eq!(tokens, vec![1234, 0, counted, 77]);
    // A limit below the default bounds TOKENS too.
    cmd(&mut con, &["CONFIG", "SET", "mem.max-tokens-limit", "100"]).unwrap();
    let e = cmd(&mut con, &["MEM.APPEND", "t", "user", "x", "TOKENS", "101"]).unwrap_err();
    assert!(e.to_string().contains("mem.max-tokens-limit"), "{e}");
}

#[test]
fn appendbatch_items_take_tokens() {
    let server = Server::start();
    let mut con = server.client();
    let batch = r#"[{"role":"assistant","content":"tool call","tokens":40},{"role":"tool","content":"sunny"}]"#;
    let r = cmd(&mut con, &["MEM.APPENDBATCH", "b", batch]).unwrap();
    let items = match r {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    let o = tiktoken_rs::o200k_base_singleton();
    let tool = 3 + (o.encode_ordinary("tool").len() + o.encode_ordinary("sunny").len()) as i64;
    let tokens: Vec<i64> = items
        .into_iter()
        .map(|i| int_field(&as_fields(i), "tokens"))
        .collect();
    assert_eq!(tokens, vec![40, tool]);
    for bad in [
        r#"[{"role":"user","content":"x","tokens":-1}]"#,
        r#"[{"role":"user","content":"x","tokens":"5"}]"#,
        r#"[{"role":"user","content":"x","tokens":10000001}]"#,
    ] {
        let e = cmd(&mut con, &["MEM.APPENDBATCH", "b", bad]).unwrap_err();
        assert_eq!(e.code(), Some("ERR"), "{bad}: {e}");
    }
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "b"]), "messages"),
        2
    );
}

#[test]
fn operators_add_and_correct_models_at_runtime_and_in_the_config() {
    // loadmodule arguments (as redis.conf lines would) set mem.models.
    let server = Server::with_module_args(&[], &["models", "house-llm=qwen2:32768"]);
    let mut con = server.client();
    let r = map_reply(&mut con, &["MEM.MODELS", "house-llm"]);
    assert_eq!(str_field(&r, "encoding"), "qwen2");
    assert_eq!(int_field(&r, "context_window"), 32_768);
    assert_eq!(str_field(&r, "source"), "config");
    // Built-in answers, before any correction.
    let r = map_reply(&mut con, &["MEM.MODELS", "gpt-4-turbo"]);
    assert_eq!(
        (
            str_field(&r, "encoding").as_str(),
            int_field(&r, "exact"),
            int_field(&r, "context_window")
        ),
        ("cl100k_base", 1, 128_000)
    );
    let r = map_reply(&mut con, &["MEM.MODELS", "claude-sonnet-4-5"]);
    assert_eq!(
        (str_field(&r, "encoding").as_str(), int_field(&r, "exact")),
        ("o200k_base", 0)
    );
    let r = map_reply(&mut con, &["MEM.MODELS", "no-such-model"]);
    assert_eq!(str_field(&r, "source"), "none");
    assert_eq!(int_field(&r, "context_window"), 0);
    // A new model and a corrected window, by CONFIG SET; the table lists them first.
    cmd(
        &mut con,
        &[
            "CONFIG",
            "SET",
            "mem.models",
            "acme-7b*=glm4:65536 claude-sonnet-4-5*=default:1000000",
        ],
    )
    .unwrap();
    let r = map_reply(
        &mut con,
        &["MEM.APPEND", "a", "user", "hello", "MODEL", "acme-7b-chat"],
    );
    let g = tiktoken::get_encoding("glm4").unwrap();
    assert_eq!(
        int_field(&r, "tokens"),
        3 + (g.count("user") + g.count("hello")) as i64
    );
    let info = map_reply(&mut con, &["MEM.INFO", "a"]);
    assert_eq!(
        (
            str_field(&info, "encoding").as_str(),
            int_field(&info, "context_window")
        ),
        ("glm4", 65_536)
    );
    let check = map_reply(
        &mut con,
        &["MEM.SUMMARIZE_CHECK", "a", "MODEL", "claude-sonnet-4-5"],
    );
    assert!(!check.is_empty());
    assert_eq!(
        int_field(
            &map_reply(&mut con, &["MEM.MODELS", "claude-sonnet-4-5"]),
            "context_window"
        ),
        1_000_000
    );
    assert_eq!(
        str_field(&map_reply(&mut con, &["MEM.MODELS", "house-llm"]), "source"),
        "none",
        "replaced whole"
    );
    let all = match cmd(&mut con, &["MEM.MODELS"]).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    let first = as_fields(all[0].clone());
    assert_eq!(
        (
            str_field(&first, "name").as_str(),
            str_field(&first, "source").as_str()
        ),
        ("acme-7b*", "config")
    );
    assert!(all.len() > 100, "the built-in table follows");
    // A malformed value is refused and the table stays as it was.
    let e = cmd(
        &mut con,
        &["CONFIG", "SET", "mem.models", "acme-7b*=nope:1"],
    )
    .unwrap_err();
    assert!(e.to_string().contains("unknown encoding"), "{e}");
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("mem.models")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        got[1],
        "acme-7b*=glm4:65536 claude-sonnet-4-5*=default:1000000"
    );
    // Emptied: the built-in table alone.
    cmd(&mut con, &["CONFIG", "SET", "mem.models", ""]).unwrap();
    assert_eq!(
        int_field(
            &map_reply(&mut con, &["MEM.MODELS", "claude-sonnet-4-5"]),
            "context_window"
        ),
        200_000
    );
    let e = cmd(&mut con, &["MEM.MODELS", "a", "b"]).unwrap_err();
    assert!(e.to_string().contains("wrong number"), "{e}");
}

/// Pathological shapes counted right under every open-weight encoding (1 MB,
/// against the tiktoken crate, whose own counting of such runs takes
/// seconds; long pieces at the inline cap), then 4 MB of each under one of them, stored by MEM.APPEND (a
/// worker counts) with the server up.
#[test]
fn pathological_inputs_for_every_encoding() {
    let server = Server::start();
    let mut con = server.client();
    cmd(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "5mb"]).unwrap();
    let shapes = |n: usize| -> Vec<(&str, String)> {
        vec![
            ("spaces", " ".repeat(n)),
            ("one letter", "a".repeat(n)),
            ("digits", "0123456789".repeat(n / 10)),
            ("newlines", "\n".repeat(n)),
            ("emoji", "🎉".repeat(n / 4)),
            ("han", "中".repeat(n / 3)),
        ]
    };
    for &(model, _, reference_name) in FAMILIES {
        let reference = tiktoken::get_encoding(reference_name).unwrap();
        for (name, text) in &shapes(1024 * 1024) {
            let got = count(&mut con, model, text);
            assert_eq!(got, reference.count(text) as i64, "{model} {name}");
            assert!(server_alive(&mut con), "{model} {name}");
        }
        // Long pieces at the inline cap (the crate's merge is quadratic on
        // them), and a word of tokens added after training (Llama 3
        // `література`) repeated into one piece of 400 bytes, which bpe's
        // backtracking encoder undercounted (59 for tiktoken's 80).
        let mut long = vec![
            ("dashes", "-".repeat(4000)),
            ("equals signs", "=".repeat(3999)),
            ("a word of added tokens", "література".repeat(20)),
        ];
        if matches!(reference_name, "llama3" | "glm4" | "glm5") {
            // Past 64 KB, where the vocabularies with such tokens went back
            // to the backtracking encoder for a while (hostile pass 48:
            // 9,830 for tiktoken's 13,108).
            long.push(("the word past 64 KB", "література".repeat(3_277)));
        }
        for (name, text) in long {
            let got = count(&mut con, model, &text);
            assert_eq!(got, reference.count(&text) as i64, "{model} {name}");
        }
    }
    for (name, text) in &shapes(4 * 1024 * 1024) {
        let r = map_reply(
            &mut con,
            &["MEM.APPEND", name, "user", text, "MODEL", "deepseek-chat"],
        );
        assert!(int_field(&r, "tokens") > 4, "{name}");
        assert!(server_alive(&mut con), "{name}");
    }
}

/// Long pieces counted exactly on every path into counting: runs of one
/// punctuation character (bpe's backtracking encoder's slowest shape, now
/// counted by tiktoken's merge past 126 bytes) just under each OpenAI
/// encoding's inline cap and past it (a worker), by MEM.COUNT, MEM.APPEND
/// and MEM.APPEND in MULTI/EXEC, against tiktoken-rs (the open-weight
/// encodings' long pieces: `pathological_inputs_for_every_encoding`).
#[test]
fn long_pieces_count_exactly_on_every_path() {
    let server = Server::start();
    let mut con = server.client();
    let openai = [
        ("gpt-4o", tiktoken_rs::o200k_base_singleton(), 16 * 1024 - 1),
        ("gpt-4", tiktoken_rs::cl100k_base_singleton(), 32 * 1024 - 1),
    ];
    for (model, oracle, under_cap) in openai {
        let texts = ["-", "=", "/", "*"]
            .into_iter()
            .flat_map(|c| [(c, 127), (c, 1000)])
            .chain([("-", under_cap), ("/", under_cap), ("-", under_cap + 2)]);
        for (c, n) in texts {
            let text = c.repeat(n);
            let want = oracle.encode_ordinary(&text).len() as i64;
            assert_eq!(count(&mut con, model, &text), want, "{model} {c} x {n}");
            let key = format!("{model}{c}{n}");
            let r = map_reply(
                &mut con,
                &["MEM.APPEND", &key, "user", &text, "MODEL", model],
            );
            let role = count(&mut con, model, "user");
            assert_eq!(int_field(&r, "tokens"), want + 3 + role, "{key}");
            if n < under_cap + 2 {
                let mut pipe = redis::pipe();
                pipe.atomic()
                    .cmd("MEM.APPEND")
                    .arg(format!("m{key}"))
                    .arg("user");
                pipe.arg(&text).arg("MODEL").arg(model);
                let replies: Vec<redis::Value> = pipe.query(&mut con).unwrap();
                assert_eq!(replies.len(), 1, "{key}");
                let r = map_reply(&mut con, &["MEM.INFO", &format!("m{key}")]);
                assert_eq!(int_field(&r, "total_tokens"), want + 3 + role, "{key}");
            }
        }
    }
}

fn server_alive(con: &mut redis::Connection) -> bool {
    redis::cmd("PING")
        .query::<String>(con)
        .is_ok_and(|p| p == "PONG")
}

#[test]
fn keyless_commands_are_served_by_every_node_of_a_cluster() {
    let a = Server::with_args(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    let b = Server::with_args(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]);
    let (mut ca, mut cb) = (a.client(), b.client());
    cmd(&mut ca, &["CLUSTER", "ADDSLOTSRANGE", "0", "8191"]).unwrap();
    cmd(&mut cb, &["CLUSTER", "ADDSLOTSRANGE", "8192", "16383"]).unwrap();
    cmd(
        &mut ca,
        &["CLUSTER", "MEET", "127.0.0.1", &b.port.to_string()],
    )
    .unwrap();
    for con in [&mut ca, &mut cb] {
        poll_until(con, "the cluster to form", |c| {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(c).unwrap();
            info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:2")
        });
    }
    let q = tiktoken::get_encoding("qwen2").unwrap();
    for con in [&mut ca, &mut cb] {
        // No key: answered here, never redirected.
        assert_eq!(count(con, "qwen-plus", TEXTS[1]), q.count(TEXTS[1]) as i64);
        assert_eq!(
            str_field(&map_reply(con, &["MEM.MODELS", "glm-5"]), "encoding"),
            "glm5"
        );
    }
    // A key is routed: one of the two nodes redirects this append.
    let mut moved = 0;
    for con in [&mut ca, &mut cb] {
        if cmd(con, &["MEM.APPEND", "mem:{alice}", "user", "hi"])
            .is_err_and(|e| e.to_string().to_uppercase().contains("MOVED"))
        {
            moved += 1;
        }
    }
    assert_eq!(moved, 1);
}

/// A given count may exceed what its text could count to (a provider's
/// usage for a short reply, an image): it survives every path a session
/// takes — a replica (MEM._APPLY validates the op), DEBUG RELOAD (the RDB
/// load validates the session), DUMP/RESTORE — instead of being refused as
/// corrupt there.
#[test]
fn given_counts_above_the_text_survive_replication_reload_and_restore() {
    let master = Server::start();
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    let r = map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "g",
            "assistant",
            "ok",
            "TOKENS",
            "5000000",
            "MAXTOKENS",
            "10000000",
        ],
    );
    assert_eq!(int_field(&r, "tokens"), 5_000_000);
    let batch = r#"[{"role":"user","content":"","tokens":9000}]"#;
    cmd(&mut con, &["MEM.APPENDBATCH", "g", batch]).unwrap();
    cmd(&mut con, &["WAIT", "1", "5000"]).unwrap();
    let total =
        |c: &mut redis::Connection| int_field(&map_reply(c, &["MEM.INFO", "g"]), "total_tokens");
    assert_eq!(total(&mut con), 5_009_000);
    assert_eq!(total(&mut rcon), 5_009_000, "the replica applied both");
    cmd(&mut con, &["DEBUG", "RELOAD"]).unwrap();
    assert_eq!(total(&mut con), 5_009_000, "the RDB loaded the session");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("g").query(&mut con).unwrap();
    redis::cmd("RESTORE")
        .arg("g2")
        .arg(0)
        .arg(dump)
        .query::<()>(&mut con)
        .unwrap();
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "g2"]), "total_tokens"),
        5_009_000
    );
    // Stored in 32 bits: a limit raised past that still stops TOKENS there.
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.max-tokens-limit", "100000000000"],
    )
    .unwrap();
    let e = cmd(
        &mut con,
        &["MEM.APPEND", "g", "user", "x", "TOKENS", "4294967296"],
    )
    .unwrap_err();
    assert!(e.to_string().contains("at most 4294967295"), "{e}");
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "g"]), "messages"),
        2
    );
}

/// KiB of the server's RSS that are pages of the module's file.
fn module_file_rss_kb(con: &mut redis::Connection) -> u64 {
    let pid = crate::support::faults::pid(con);
    let name = module_path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut ours = false;
    let mut kb = 0;
    for line in smaps.lines() {
        let first = line.split_ascii_whitespace().next().unwrap_or("");
        if !first.ends_with(':') {
            ours = line.ends_with(&name);
        } else if ours && first == "Rss:" {
            kb += line
                .split_ascii_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap();
        }
    }
    kb
}

#[test]
fn built_encodings_leave_the_module_file_out_of_rss() {
    // bpe-openai's serialized o200k_base (32 MB in the module) is read once
    // to build the heap tables; it stayed resident (32.4 MB of 84 MB RSS).
    // The pages go on the building thread just after the encoding is
    // published, so a client may see it built a moment before.
    let server = Server::start();
    let mut con = server.client();
    let bound = 16 * 1024;
    count(&mut con, "gpt-4o", TEXTS[1]);
    assert_eq!(encoding_state(&mut con, "o200k_base"), "loaded");
    poll_until(&mut con, "the module's pages to go after o200k_base", |c| {
        module_file_rss_kb(c) < bound
    });
    count(&mut con, "gpt-4", TEXTS[1]);
    assert_eq!(encoding_state(&mut con, "cl100k_base"), "loaded");
    poll_until(
        &mut con,
        "the module's pages to go after cl100k_base",
        |c| module_file_rss_kb(c) < bound,
    );
    for text in TEXTS {
        assert_eq!(
            count(&mut con, "gpt-4o", text),
            tiktoken_rs::o200k_base_singleton()
                .encode_ordinary(text)
                .len() as i64,
            "{text:?}"
        );
    }
    let after = module_file_rss_kb(&mut con);
    assert!(
        after < bound,
        "{after} KiB of the module file resident after counting"
    );
}

/// KiB of the server's anonymous RSS (`RssAnon` of /proc/pid/status).
fn anonymous_rss_kb(con: &mut redis::Connection) -> i64 {
    let pid = crate::support::faults::pid(con);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_ascii_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn encodings_hold_counting_s_tables_and_their_builds_leave_no_more_resident() {
    // Each encoding kept every table of bpe's encoders, half of which
    // counting never reads (o200k_base 37.4 MB, Llama 3 24.6 MB), and a
    // build's intermediate tables stayed resident once freed (the module's
    // allocator kept them): Llama 3 and DeepSeek's builds raised RSS by 94
    // MB for 49 MB of tables.
    let server = Server::start();
    let mut con = server.client();
    count(&mut con, "gpt-4o", TEXTS[0]);
    // 18.8 MB of counting tables, and 7.8 MB of short tokens by their
    // bytes, their filter and the two-byte ones' table (tokenizer/short_bpe.rs:
    // first-seen pieces merged in ~0.3 us, not bpe's 1.2-1.8).
    let o200k = encoding_memory(&mut con, "o200k_base");
    assert!(
        (10 << 20..30 << 20).contains(&o200k),
        "o200k_base {o200k} B"
    );
    let before = anonymous_rss_kb(&mut con);
    for (model, _, reference) in &FAMILIES[..2] {
        let reference = tiktoken::get_encoding(reference).unwrap();
        for text in TEXTS {
            assert_eq!(
                count(&mut con, model, text),
                reference.count(text) as i64,
                "{model} {text:?}"
            );
        }
    }
    let tables: i64 = FAMILIES[..2]
        .iter()
        .map(|(_, encoding, _)| encoding_memory(&mut con, encoding))
        .sum();
    assert!(tables < 32 << 20, "Llama 3 and DeepSeek V3: {tables} B");
    let grown = (anonymous_rss_kb(&mut con) - before) * 1024;
    assert!(
        grown < tables + tables / 4 + (8 << 20),
        "RSS grew {grown} B for {tables} B of tables"
    );
}
