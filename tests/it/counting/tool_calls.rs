//! Tool calls in a message's META count (SPEC §2, v3): an agent whose calls
//! carry 10 KB of arguments has a history of that size, for the caps, the
//! thresholds and BUDGET, on every path into a message (APPEND inline and on
//! a worker, APPENDBATCH, IMPORT, a model switch's re-count), and its replica
//! and AOF agree. OpenAI-hosted models: name + arguments + 5 per call (the
//! arguments as sent: OpenAI's string, or LangChain's object written as
//! langchain_openai writes it), computed here with tiktoken-rs.

use crate::support::reply::*;
use crate::support::server::*;

/// Per call, beyond its name and arguments (docs/MODELS.md).
const OPENAI_CALL_OVERHEAD: i64 = 5;

/// About `bytes` of English words, nothing JSON escapes.
fn words(bytes: usize, seed: usize) -> String {
    let w = [
        "memory", "session", "agent", "tool", "result", "the", "of", "window", "Redis", "42",
    ];
    let mut out = String::new();
    let mut i = seed;
    while out.len() < bytes {
        out.push_str(w[i % w.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

/// The arguments as Python's json.dumps writes them (what langchain_openai
/// sends for LangChain's `args`): ", " and ": ".
fn args_text(path: &str, text: &str) -> String {
    format!(r#"{{"path": "{path}", "text": "{text}", "lines": [1, 2, 3]}}"#)
}

/// One call in OpenAI's shape (`arguments` a string, compact as clients
/// often send it, counted as sent) or LangChain's (`args` an object).
fn call(shape: Shape, i: usize, name: &str, path: &str, text: &str) -> String {
    match shape {
        Shape::OpenAi => {
            let args = serde_json::to_string(&args_text(path, text)).unwrap();
            format!(
                r#"{{"id":"call_{i}","type":"function","function":{{"name":"{name}","arguments":{args}}}}}"#
            )
        }
        Shape::LangChain => format!(
            r#"{{"id":"call_{i}","name":"{name}","args":{{"path":"{path}","text":"{text}","lines":[1,2,3]}},"type":"tool_call"}}"#
        ),
    }
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    OpenAi,
    LangChain,
}

fn meta(calls: &[String]) -> String {
    format!(r#"{{"lc_type":"ai","tool_calls":[{}]}}"#, calls.join(","))
}

/// Expected tokens of an assistant message with empty content carrying
/// calls `(name, path, text)` for an OpenAI model (o200k_base).
fn expected(calls: &[(&str, &str, &str)]) -> i64 {
    mt_o("assistant", "")
        + calls
            .iter()
            .map(|(name, path, text)| {
                o200(name) + o200(&args_text(path, text)) + OPENAI_CALL_OVERHEAD
            })
            .sum::<i64>()
}

#[test]
fn tool_calls_in_meta_count_in_both_shapes_and_in_parallel() {
    let server = Server::start();
    let mut con = server.client();
    let big = words(10_000, 1);
    for shape in [Shape::OpenAi, Shape::LangChain] {
        let key = format!("mem:{{tc-{shape:?}}}");
        let one = meta(&[call(shape, 0, "write_file", "/tmp/a", &big)]);
        let r = append(
            &mut con,
            &key,
            "assistant",
            "",
            &["MODEL", "gpt-4o", "META", &one],
        );
        let want = expected(&[("write_file", "/tmp/a", &big)]);
        assert!(
            want > 2_000,
            "10 KB of arguments is thousands of tokens: {want}"
        );
        assert_eq!(int_field(&r, "tokens"), want, "{shape:?}");
        let count = int(
            &mut con,
            &["MEM.COUNT", "gpt-4o", "", "ROLE", "assistant", "META", &one],
        );
        assert_eq!(
            count, want,
            "MEM.COUNT counts as MEM.APPEND does ({shape:?})"
        );
        // Three calls at once in one message.
        let calls: Vec<String> = (0..3)
            .map(|i| call(shape, i, "grep", &format!("/src/{i}"), &big))
            .collect();
        let r = append(&mut con, &key, "assistant", "", &["META", &meta(&calls)]);
        let three: Vec<(&str, String, &str)> = (0..3)
            .map(|i| ("grep", format!("/src/{i}"), big.as_str()))
            .collect();
        let three: Vec<(&str, &str, &str)> =
            three.iter().map(|(n, p, t)| (*n, p.as_str(), *t)).collect();
        assert_eq!(
            int_field(&r, "tokens"),
            expected(&three),
            "{shape:?} parallel"
        );
        let total = int_field(&r, "total_tokens");
        assert_eq!(total, want + expected(&three));
        assert_eq!(int_field(&info(&mut con, &key), "total_tokens"), total);
    }
}

#[test]
fn budget_thresholds_and_caps_see_the_size_of_the_tool_calls() {
    let server = Server::start();
    let mut con = server.client();
    let key = "mem:{budget}";
    let big = words(10_000, 2);
    let calls = meta(&[call(Shape::LangChain, 0, "write_file", "/tmp/b", &big)]);
    let heavy = expected(&[("write_file", "/tmp/b", &big)]);
    append(
        &mut con,
        key,
        "user",
        "write the file",
        &["MODEL", "gpt-4o"],
    );
    append(&mut con, key, "assistant", "", &["META", &calls]);
    append(
        &mut con,
        key,
        "tool",
        "ok",
        &["META", r#"{"tool_call_id":"call_0"}"#],
    );
    let last = append(&mut con, key, "user", "thanks", &[]);
    let total = int_field(&last, "total_tokens");
    assert_eq!(
        total,
        mt_o("user", "write the file") + heavy + mt_o("tool", "ok") + mt_o("user", "thanks")
    );

    // BUDGET 50: the tool group does not fit; only the last message comes.
    let e = get(&mut con, &["MEM.GET", key, "BUDGET", "50"]);
    assert_eq!(ids(&e), vec![4]);
    // A budget that holds the group returns it whole.
    let fits = (heavy + mt_o("tool", "ok") + mt_o("user", "thanks")) as usize;
    let e = get(&mut con, &["MEM.GET", key, "BUDGET", &fits.to_string()]);
    assert_eq!(ids(&e), vec![2, 3, 4]);

    // The summarize threshold (15% of the context) sees the calls: met at
    // a context whose 15% lies between the history without them and with.
    let without = total - (heavy - mt_o("assistant", ""));
    let between = ((without + total) / 2 * 100 / 15).to_string();
    let c = check(&mut con, key, &["CONTEXT", &between]);
    assert_eq!(int_field(&c, "total_tokens"), total);
    assert_eq!(int_field(&c, "summarize"), 1);
    let above = (total * 100 / 15 * 2).to_string();
    assert_eq!(
        int_field(&check(&mut con, key, &["CONTEXT", &above]), "summarize"),
        0
    );

    // A token cap smaller than the calls trims the group away.
    let r = append(
        &mut con,
        key,
        "user",
        "again",
        &["MAXTOKENS", &(heavy as usize).to_string()],
    );
    assert!(int_field(&r, "total_tokens") <= heavy);
    let e = get(&mut con, &["MEM.GET", key]);
    assert!(
        e.iter().all(|m| m.id != 2),
        "the tool call message was trimmed"
    );
}

#[test]
fn tool_calls_count_in_batches_imports_and_large_metas_on_a_worker() {
    let server = Server::start();
    let mut con = server.client();
    let big = words(10_000, 3);
    let calls = meta(&[call(Shape::OpenAi, 0, "search", "/q", &big)]);
    let heavy = expected(&[("search", "/q", &big)]);
    // APPENDBATCH: meta as an object member of the item.
    let items = format!(
        r#"[{{"role":"user","content":"find it"}},{{"role":"assistant","content":"","meta":{calls}}}]"#
    );
    let r = cmd(
        &mut con,
        &["MEM.APPENDBATCH", "mem:{batch}", &items, "MODEL", "gpt-4o"],
    )
    .unwrap();
    let redis::Value::Array(outcomes) = r else {
        panic!("{r:?}")
    };
    let second = as_fields(outcomes[1].clone());
    assert_eq!(int_field(&second, "tokens"), heavy);

    // IMPORT of the FORMAT JSON document keeps the counts; an import into
    // another model counts them anew (with its own rule).
    let doc = json_text(&mut con, "mem:{batch}");
    ok(&mut con, &["MEM.IMPORT", "mem:{copy}", &doc]);
    assert_eq!(
        int_field(&info(&mut con, "mem:{copy}"), "total_tokens"),
        int_field(&info(&mut con, "mem:{batch}"), "total_tokens")
    );

    // A META of about 600 KB: checked and counted on a worker.
    let huge = words(600_000, 4);
    let calls = meta(&[call(Shape::LangChain, 0, "write_file", "/big", &huge)]);
    let r = append(
        &mut con,
        "mem:{huge}",
        "assistant",
        "",
        &["MODEL", "gpt-4o", "META", &calls],
    );
    assert_eq!(
        int_field(&r, "tokens"),
        expected(&[("write_file", "/big", &huge)])
    );
    // In MULTI it cannot be: refused with the reason, nothing changed.
    redis::cmd("MULTI").query::<()>(&mut con).unwrap();
    redis::cmd("MEM.APPEND")
        .arg("mem:{huge}")
        .arg("assistant")
        .arg("")
        .arg("META")
        .arg(&calls)
        .query::<()>(&mut con)
        .unwrap();
    let r = redis::cmd("EXEC").query::<redis::Value>(&mut con);
    let text = match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => err_text(&e),
    };
    assert!(text.contains("MULTI/EXEC"), "{text}");
    assert_eq!(int_field(&info(&mut con, "mem:{huge}"), "messages"), 1);
}

#[test]
fn a_model_switch_recounts_tool_calls_and_replica_and_aof_agree() {
    // Restart is a kill -9: every write fsynced before its reply.
    let mut master = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    let key = "mem:{switch}";
    let big = words(100_000, 5);
    let calls = meta(&[call(Shape::LangChain, 0, "write_file", "/x", &big)]);
    append(&mut con, key, "user", "go", &["MODEL", "gpt-4o"]);
    for _ in 0..3 {
        append(&mut con, key, "assistant", "", &["META", &calls]);
    }
    // Another tokenizer and tool format: every message re-counted (300 KB
    // of arguments: on a worker), the calls with Qwen's template.
    let r = append(&mut con, key, "user", "done", &["MODEL", "qwen3-32b"]);
    let mut qwen = |role: &str, content: &str, m: Option<&str>| {
        let mut args = vec!["MEM.COUNT", "qwen3-32b", content, "ROLE", role];
        if let Some(m) = m {
            args.extend(["META", m]);
        }
        int(&mut rcon, &args)
    };
    let want = qwen("user", "go", None)
        + 3 * qwen("assistant", "", Some(&calls))
        + qwen("user", "done", None);
    let plain = qwen("assistant", "", None);
    assert!(qwen("assistant", "", Some(&calls)) > plain + 20_000);
    assert_eq!(int_field(&r, "total_tokens"), want);
    let digest_master = digest(&mut con, key);
    poll_until(&mut rcon, "the replica to catch up", |c| {
        digest(c, key) == digest_master
    });
    assert_eq!(int_field(&info(&mut rcon, key), "total_tokens"), want);
    master.restart();
    let mut con = master.client();
    assert_eq!(
        int_field(&info(&mut con, key), "total_tokens"),
        want,
        "AOF replay"
    );
    assert_eq!(digest(&mut con, key), digest_master);
}

/// The two public `usage` figures that isolate one call in an OpenAI
/// request's history (docs/MODELS.md#tool-calls): the module's counts of
/// the messages plus the 3 tokens every request adds for the reply's start
/// give 41 where gpt-3.5-turbo billed 40 (OpenAI forum, "Strange token cost
/// calculation for tool_calls", community.openai.com/t/538914), and 35
/// where gpt-4 billed 35 (forestwanglin/openai-java issue #5).
#[test]
fn recorded_openai_usage_figures_are_met_within_one_token() {
    let server = Server::start();
    let mut con = server.client();
    let mut prompt = |model: &str, messages: &[(&str, &str, Option<&str>)]| -> i64 {
        let counted: i64 = messages
            .iter()
            .map(|(role, content, meta)| {
                let mut args = vec!["MEM.COUNT", model, content, "ROLE", role];
                if let Some(m) = meta {
                    args.extend(["META", m]);
                }
                int(&mut con, &args)
            })
            .sum();
        counted + 3
    };
    let forum = prompt(
        "gpt-3.5-turbo",
        &[
            ("user", "How much is 2 plus 2?", None),
            (
                "assistant",
                "",
                Some(
                    r#"{"tool_calls":[{"id":"a","type":"function","function":{"name":"calculator","arguments":"{\"a\":2, \"b\":2}"}}]}"#,
                ),
            ),
            ("tool", "4", Some(r#"{"tool_call_id":"a"}"#)),
        ],
    );
    assert_eq!(forum, 40 + 1, "billed 40");
    let java = prompt(
        "gpt-4",
        &[
            (
                "assistant",
                "",
                Some(
                    r#"{"tool_calls":[{"id":"call_X8ZrV3bVeWm4uKZTyPL0u4HR","type":"function","function":{"name":"get_current_weather","arguments":"{\n  \"location\": \"Boston, MA\"\n}"}}]}"#,
                ),
            ),
            (
                "tool",
                "29 degree celcius",
                Some(
                    r#"{"tool_call_id":"call_X8ZrV3bVeWm4uKZTyPL0u4HR","name":"get_current_weather"}"#,
                ),
            ),
        ],
    );
    assert_eq!(java, 35, "billed 35");
}

/// A switch between two models of one encoding whose prompts render tool
/// calls differently (gpt-4o's estimate, gpt-oss's harmony) re-counts; a
/// META of thousands of empty calls (15 tokens each under harmony, 3 bytes)
/// re-counts on every switch and replicates.
#[test]
fn a_switch_of_tool_call_format_recounts_even_within_one_encoding() {
    let master = Server::start();
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    let key = "mem:{format}";
    let calls = r#"{"tool_calls":[{"id":"c1","name":"search","args":{"q":"weather in Paris"}}]}"#;
    append(
        &mut con,
        key,
        "assistant",
        "Sure.",
        &["MODEL", "gpt-4o", "META", calls],
    );
    let many = format!(r#"{{"tool_calls":[{}]}}"#, vec!["{}"; 5000].join(","));
    append(
        &mut con,
        key,
        "assistant",
        "",
        &["META", &many, "MAXTOKENS", "1000000"],
    );
    for model in [
        "gpt-oss-120b",
        "qwen3-32b",
        "llama-3.1-8b",
        "gpt-4o",
        "gpt-oss-120b",
    ] {
        let r = append(&mut con, key, "user", "ok", &["MODEL", model]);
        let count = |con: &mut redis::Connection, content: &str, meta: &str| {
            int(
                con,
                &[
                    "MEM.COUNT",
                    model,
                    content,
                    "ROLE",
                    "assistant",
                    "META",
                    meta,
                ],
            )
        };
        let entries = get(&mut con, &["MEM.GET", key]);
        assert_eq!(
            entries[0].tokens,
            count(&mut con, "Sure.", calls),
            "{model}"
        );
        assert_eq!(entries[1].tokens, count(&mut con, "", &many), "{model}");
        assert_eq!(
            int_field(&r, "total_tokens"),
            entries.iter().map(|e| e.tokens).sum::<i64>()
        );
    }
    let want = digest(&mut con, key);
    poll_until(&mut rcon, "the replica to catch up", |c| {
        digest(c, key) == want
    });
}

fn info_memory_field(con: &mut redis::Connection, field: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("all").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO has no {field}"))
        .trim()
        .parse()
        .unwrap()
}

/// Counting tool calls holds a small multiple of the META (calls are read
/// one at a time, arguments re-written as a stream): a keyless MEM.COUNT of
/// 1.4 million empty calls (4 MB) or of one call with 250,000 arguments
/// evicts no key under an LRU maxmemory 40 MB above what the keys hold
/// (such a META built 1.8 GB of call values through Redis's allocator).
#[test]
fn counting_a_huge_number_of_calls_evicts_no_key() {
    let server = Server::start();
    let mut con = server.client();
    let value = "v".repeat(1000);
    for chunk in 0..20 {
        let mut pipe = redis::pipe();
        for i in 0..1000 {
            pipe.cmd("SET")
                .arg(format!("k{chunk}:{i}"))
                .arg(&value)
                .ignore();
        }
        pipe.query::<()>(&mut con).unwrap();
    }
    let used = info_memory_field(&mut con, "used_memory");
    let limit = (used + (40 << 20)).to_string();
    ok(&mut con, &["CONFIG", "SET", "maxmemory", &limit]);
    ok(
        &mut con,
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
    );
    let empty_calls = format!(r#"{{"tool_calls":[{}]}}"#, vec!["{}"; 1_390_000].join(","));
    let args: Vec<String> = (0..250_000).map(|i| format!(r#""a{i}":{i}"#)).collect();
    let wide_call = format!(
        r#"{{"tool_calls":[{{"name":"f","args":{{{}}}}}]}}"#,
        args.join(",")
    );
    for (model, meta) in [
        ("gpt-4o", &empty_calls),
        ("gpt-oss-120b", &empty_calls),
        ("minimax-m2", &wide_call),
        ("glm-4.5", &wide_call),
        ("mistral-large-latest", &empty_calls),
    ] {
        assert!(meta.len() <= 4 << 20, "{}", meta.len());
        let n = int(&mut con, &["MEM.COUNT", model, "", "META", meta]);
        assert!(n as usize > meta.len() / 4, "{model}: {n}");
        assert_eq!(
            info_memory_field(&mut con, "evicted_keys"),
            0,
            "{model} evicted keys"
        );
    }
    assert_eq!(int(&mut con, &["DBSIZE"]), 20_000);
}
