//! attack3 (issue 13), from outside: hostile `mem.models` values (CONFIG SET,
//! loadmodule arguments, redis.conf, CONFIG REWRITE), MEM.MODELS output,
//! MEM.COUNT with hostile texts and options, ACL, TOKENS edge values with
//! MSGID retries, batches, summaries and model switches.

use std::process::{Command, Stdio};

use crate::support::server::*;
use crate::support::session::cmd_bin;

fn models_get(con: &mut redis::Connection) -> String {
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("mem.models")
        .query(con)
        .unwrap();
    got.get(1).cloned().unwrap_or_default()
}

fn resolve(con: &mut redis::Connection, model: &str) -> (String, i64, i64, String) {
    let r = map_reply(con, &["MEM.MODELS", model]);
    (
        str_field(&r, "encoding"),
        int_field(&r, "exact"),
        int_field(&r, "context_window"),
        str_field(&r, "source"),
    )
}

/// o200k_base counts as tiktoken-rs gives them.
struct Counter<'a>(&'a tiktoken_rs::CoreBPE);
impl Counter<'_> {
    fn count(&self, text: &str) -> usize {
        self.0.encode_ordinary(text).len()
    }
}

fn count(con: &mut redis::Connection, args: &[&str]) -> i64 {
    match cmd(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}")) {
        redis::Value::Int(n) => n,
        other => panic!("{other:?}"),
    }
}

#[test]
fn hostile_mem_models_values_are_refused_and_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let good = "house*=qwen2:32768 exact-one=default:0";
    cmd(&mut con, &["CONFIG", "SET", "mem.models", good]).unwrap();
    let long = format!("{}=qwen2:1", "n".repeat(257));
    let many: String = (0..1025).map(|i| format!("m{i}=qwen2:{i} ")).collect();
    let bad: Vec<(String, &str)> = vec![
        ("x=qwen2:18446744073709551616".into(), "window"), // 2^64
        ("x=qwen2:18446744073709551615".into(), "too large"), // 2^64-1
        ("x=qwen2:9007199254740992".into(), "too large"),  // 2^53
        ("x=qwen2:-1".into(), "window"),
        ("x=qwen2:".into(), "window"),
        ("x=qwen2:1:2".into(), "window"),
        ("x=qwen2:0x10".into(), "window"),
        ("x=qwen2:1e3".into(), "window"),
        ("x=:5".into(), "unknown encoding"),
        ("x=nope:5".into(), "unknown encoding"),
        ("x=QWEN 2:5".into(), "expected"),
        ("=qwen2:5".into(), "empty"),
        ("x=qwen2".into(), "expected"),
        ("x".into(), "expected"),
        ("x**=qwen2:1".into(), "'*' only at its end"),
        ("a*b=qwen2:1".into(), "'*' only at its end"),
        ("a=qwen2:1 A=glm4:2".into(), "more than once"),
        ("p*=qwen2:1,P*=glm4:2".into(), "more than once"),
        (long, "1 to 256 bytes"),
        (many, "at most 1024"),
        // \r separates entries (CRLF files), so it never sits in a name.
        ("ok=qwen2:1 a\rb=qwen2:1".into(), "expected"),
    ];
    for (value, why) in &bad {
        let e = cmd(&mut con, &["CONFIG", "SET", "mem.models", value]).unwrap_err();
        assert!(
            e.to_string().contains(why),
            "{}: {e}",
            &value[..value.len().min(60)]
        );
        assert_eq!(
            models_get(&mut con),
            good,
            "a refused value changes nothing"
        );
    }
    // Not UTF-8: refused the same way.
    let e = cmd_bin(
        &mut con,
        &[b"CONFIG", b"SET", b"mem.models", b"x\xff=qwen2:1"],
    )
    .unwrap_err();
    assert!(e.to_string().contains("UTF-8"), "{e}");
    assert_eq!(models_get(&mut con), good);
    assert_eq!(
        resolve(&mut con, "house-7b"),
        ("qwen2".into(), 1, 32_768, "config".into())
    );
    assert_eq!(
        resolve(&mut con, "exact-one"),
        ("o200k_base".into(), 0, 0, "config".into())
    );
}

#[test]
fn odd_but_valid_mem_models_values_mean_what_they_say() {
    let server = Server::start();
    let mut con = server.client();
    // Every separator, mixed case (names compare case-insensitively), a
    // unicode name, the largest window, an entry for a name whose built-in
    // one it corrects.
    let value = "  House-LLM=QWEN2:100,\t模型-一=glm4:9007199254740991\n\ngpt-4o=cl100k_base:5 ,, ";
    cmd(&mut con, &["CONFIG", "SET", "mem.models", value]).unwrap();
    assert_eq!(
        models_get(&mut con),
        "house-llm=qwen2:100 模型-一=glm4:9007199254740991 gpt-4o=cl100k_base:5"
    );
    assert_eq!(
        resolve(&mut con, "HOUSE-llm"),
        ("qwen2".into(), 1, 100, "config".into())
    );
    assert_eq!(
        resolve(&mut con, "模型-一"),
        ("glm4".into(), 1, 9_007_199_254_740_991, "config".into())
    );
    assert_eq!(
        resolve(&mut con, "gpt-4o"),
        ("cl100k_base".into(), 1, 5, "config".into())
    );
    assert_eq!(
        resolve(&mut con, "gpt-4o-mini").3,
        "builtin",
        "an exact entry is no prefix"
    );
    // The session takes the operator's window: 5 tokens, so the check says summarize.
    map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "s",
            "user",
            "hello there, a few tokens",
            "MODEL",
            "gpt-4o",
        ],
    );
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "s"]), "context_window"),
        5
    );
    // A bare `*` is a catch-all for every name the operator did not list
    // before the built-in table: operators can pin everything.
    cmd(
        &mut con,
        &[
            "CONFIG",
            "SET",
            "mem.models",
            "*=tekken:4096 gpt-4o=o200k_base:128000",
        ],
    )
    .unwrap();
    assert_eq!(
        resolve(&mut con, "claude-sonnet-4-5"),
        ("tekken".into(), 1, 4096, "config".into())
    );
    assert_eq!(
        resolve(&mut con, "gpt-4o"),
        ("o200k_base".into(), 1, 128_000, "config".into())
    );
    // Window 0 = unknown; `default` = no public tokenizer.
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.models", "qwen-plus=default:0"],
    )
    .unwrap();
    assert_eq!(
        resolve(&mut con, "qwen-plus"),
        ("o200k_base".into(), 0, 0, "config".into())
    );
    // A router prefix falls back to the name after the last '/'.
    cmd(&mut con, &["CONFIG", "SET", "mem.models", ""]).unwrap();
    assert_eq!(resolve(&mut con, "openrouter/qwen/qwen3-max").0, "qwen2");
    assert_eq!(
        resolve(&mut con, "ft:gpt-4o-mini:acme::abc").0,
        "o200k_base"
    );
    // 1024 entries of 200-byte names: accepted, listed, and MEM.MODELS and
    // lookups still answer (they read every entry).
    let many: String = (0..1024)
        .map(|i| format!("{}{i:04}*=glm5:{} ", "z".repeat(200), i + 1))
        .collect();
    cmd(&mut con, &["CONFIG", "SET", "mem.models", &many]).unwrap();
    let all = match cmd(&mut con, &["MEM.MODELS"]).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    assert!(all.len() > 1024 + 100);
    let last = as_fields(all[1023].clone());
    assert_eq!(
        str_field(&last, "name"),
        format!("{}1023*", "z".repeat(200))
    );
    assert_eq!(int_field(&last, "context_window"), 1024);
    let name = format!("{}0512-chat", "z".repeat(200));
    assert_eq!(
        resolve(&mut con, &name),
        ("glm5".into(), 1, 513, "config".into())
    );
}

#[test]
fn mem_models_output_and_bad_names() {
    let server = Server::start();
    let mut con = server.client_resp3();
    let r = cmd(&mut con, &["MEM.MODELS", "deepseek-chat"]).unwrap();
    let fields = match r {
        redis::Value::Map(pairs) => pairs,
        other => panic!("RESP3 gives a map: {other:?}"),
    };
    let names: Vec<String> = fields
        .iter()
        .map(|(k, _)| redis::from_redis_value(k).unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "model",
            "encoding",
            "exact",
            "context_window",
            "entry",
            "source"
        ]
    );
    // Unknown: entry is a null, not a string "null".
    let r = cmd(&mut con, &["MEM.MODELS", "no-such-model"]).unwrap();
    let entry = as_fields(r)
        .into_iter()
        .find(|(k, _)| k == "entry")
        .map(|(_, v)| v);
    assert_eq!(entry, Some(redis::Value::Nil));
    // Bad names: clear errors, like every other MODEL argument.
    let long = "m".repeat(257);
    for args in [
        vec!["MEM.MODELS", ""],
        vec!["MEM.MODELS", &long],
        vec!["MEM.COUNT", &long, "x"],
    ] {
        let e = cmd(&mut con, &args).unwrap_err();
        assert_eq!(e.code(), Some("ERR"), "{e}");
    }
    let e = cmd_bin(&mut con, &[b"MEM.MODELS", b"\xff\xfe"]).unwrap_err();
    assert!(e.to_string().contains("UTF-8"), "{e}");
    // Every listed entry resolves to itself (the table is consistent).
    let all = match cmd(&mut con, &["MEM.MODELS"]).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    for item in all {
        let f = as_fields(item);
        let name = str_field(&f, "name");
        let probe = name.trim_end_matches('*').to_owned();
        if probe.is_empty() {
            continue;
        }
        let r = map_reply(&mut con, &["MEM.MODELS", &probe]);
        if name.ends_with('*') {
            continue; // a longer prefix or exact entry may win over a prefix
        }
        assert_eq!(str_field(&r, "entry"), name, "{name}");
        assert_eq!(
            int_field(&r, "context_window"),
            int_field(&f, "context_window"),
            "{name}"
        );
    }
}

/// A server started from a redis.conf of our own (CONFIG REWRITE needs a
/// file): returns its child, port and directory.
fn spawn_with_conf(dir: &std::path::Path, conf: &str) -> (std::process::Child, u16) {
    let port = free_port();
    let text = format!(
        "port {port}\nbind 127.0.0.1\ndir {}\nsave \"\"\nlogfile redis.log\nloadmodule {}\n{conf}\n",
        dir.display(),
        module_path().display()
    );
    std::fs::write(dir.join("redis.conf"), text).unwrap();
    let child =
        Command::new(std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
            .arg(dir.join("redis.conf"))
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    (child, port)
}

fn connect(port: u16, child: &mut std::process::Child) -> Option<redis::Connection> {
    for _ in 0..1500 {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        if let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .and_then(|c| c.get_connection())
        {
            if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                return Some(c);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("server did not start");
}

fn conf_dir(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/test-servers")
        .join(format!("{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn redis_conf_and_config_rewrite_round_trip_mem_models() {
    let dir = conf_dir("rewrite");
    let (mut child, port) =
        spawn_with_conf(&dir, "mem.models \"acme*=glm4:65536 house=default:1000\"");
    let mut con = connect(port, &mut child).expect("starts");
    assert_eq!(
        resolve(&mut con, "acme-7b"),
        ("glm4".into(), 1, 65_536, "config".into())
    );
    // Names that need quoting in a config file: a unicode name, a '#'. (Not
    // a double quote or a backslash: Valkey 8.1.1's CONFIG REWRITE writes a
    // module's string config without escaping them — a quote makes it refuse
    // its own file ("Unbalanced quotes"), a backslash is lost — a server bug
    // make test-compat found; Redis 7.0, 8.0 and Valkey 8.0 escape both.)
    let value = r#"模型=kimi_k2:9 #hash=tekken:10"#;
    cmd(&mut con, &["CONFIG", "SET", "mem.models", value]).unwrap();
    let before = models_get(&mut con);
    cmd(&mut con, &["CONFIG", "REWRITE"]).unwrap();
    let _ = cmd(&mut con, &["SHUTDOWN", "NOSAVE"]);
    child.wait().unwrap();
    let (mut child, port2) = {
        // Same file, same port: start it again from the rewritten file.
        let c =
            Command::new(std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
                .arg(dir.join("redis.conf"))
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
        (c, port)
    };
    let mut con = connect(port2, &mut child).unwrap_or_else(|| {
        panic!(
            "the rewritten file loads; log:\n{}",
            std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default()
        )
    });
    assert_eq!(models_get(&mut con), before);
    assert_eq!(
        resolve(&mut con, "模型"),
        ("kimi_k2".into(), 1, 9, "config".into())
    );
    assert_eq!(
        resolve(&mut con, "#hash"),
        ("tekken".into(), 1, 10, "config".into())
    );
    let _ = cmd(&mut con, &["SHUTDOWN", "NOSAVE"]);
    child.wait().unwrap();
    // A bad value in redis.conf: the server refuses to start and says why.
    let dir = conf_dir("badconf");
    let (mut child, port) = spawn_with_conf(&dir, "mem.models \"x=nope:1\"");
    assert!(
        connect(port, &mut child).is_none(),
        "a bad mem.models in redis.conf stops the start"
    );
    let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    assert!(log.contains("unknown encoding"), "the log says why:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn loadmodule_arguments_set_mem_models_and_bad_ones_stop_the_load() {
    // loadmodule arguments are split on spaces: commas separate entries.
    let server = Server::with_module_args(&[], &["models", "a=qwen2:1,b*=glm4:2"]);
    let mut con = server.client();
    assert_eq!(models_get(&mut con), "a=qwen2:1 b*=glm4:2");
    assert_eq!(resolve(&mut con, "b-x").0, "glm4");
    drop(server);
    let dir = conf_dir("badarg");
    let port = free_port();
    let mut child =
        Command::new(std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--logfile",
                "redis.log",
            ])
            .arg("--loadmodule")
            .arg(module_path())
            .args(["models", "a=qwen2:99999999999999999999"])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    assert!(
        connect(port, &mut child).is_none(),
        "a bad models argument stops the load"
    );
    let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
    assert!(log.contains("window"), "the log says why:\n{log}");
}

#[test]
fn mem_count_hostile_texts_roles_and_acl() {
    let server = Server::start();
    let mut con = server.client();
    let o200k = tiktoken_rs::o200k_base_singleton();
    let o = Counter(o200k);
    assert_eq!(count(&mut con, &["MEM.COUNT", "gpt-4o", ""]), 0);
    assert_eq!(
        count(&mut con, &["MEM.COUNT", "gpt-4o", "", "ROLE", "user"]),
        3 + o.count("user") as i64
    );
    // ROLE abuse: case of the option, odd roles, a role that is a text.
    assert_eq!(
        count(&mut con, &["MEM.COUNT", "gpt-4o", "x", "role", "tool"]),
        3 + (o.count("tool") + o.count("x")) as i64
    );
    let long_role = "r".repeat(1000);
    let e = cmd(&mut con, &["MEM.COUNT", "gpt-4o", "x", "ROLE", &long_role]).unwrap_err();
    assert_eq!(e.code(), Some("ERR"), "{e}");
    let e = cmd_bin(&mut con, &[b"MEM.COUNT", b"gpt-4o", b"x", b"ROLE", b"\xff"]).unwrap_err();
    assert!(e.to_string().contains("UTF-8"), "{e}");
    let e = cmd(
        &mut con,
        &["MEM.COUNT", "gpt-4o", "x", "ROLE", "user", "extra"],
    )
    .unwrap_err();
    assert_eq!(e.code(), Some("ERR"), "{e}");
    // Invalid UTF-8 in every position of a text, small and large, every encoding family.
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "4096"],
    )
    .unwrap();
    for model in ["gpt-4o", "gpt-4", "qwen-plus", "deepseek-chat"] {
        for text in [
            &b"\xc3"[..],
            b"ok\xe4\xb8",
            b"\xed\xa0\x80",
            &[b"a".repeat(10_000), b"\xc0\xaf".to_vec()].concat(),
        ] {
            let e = cmd_bin(&mut con, &[b"MEM.COUNT", model.as_bytes(), text]).unwrap_err();
            assert!(e.to_string().contains("UTF-8"), "{model}: {e}");
        }
    }
    // NUL bytes and special-token text are ordinary text.
    let n = count(
        &mut con,
        &["MEM.COUNT", "qwen-plus", "<|im_start|>a\0b<|endoftext|>"],
    );
    assert_eq!(
        n,
        tiktoken::get_encoding("qwen2")
            .unwrap()
            .count("<|im_start|>a\0b<|endoftext|>") as i64
    );
    // ACL: a user allowed MEM.COUNT and MEM.MODELS but no key can use them
    // (keyless); one denied them is refused.
    cmd(
        &mut con,
        &[
            "ACL",
            "SETUSER",
            "counter",
            "on",
            "nopass",
            "-@all",
            "+mem.count",
            "+mem.models",
        ],
    )
    .unwrap();
    cmd(
        &mut con,
        &[
            "ACL",
            "SETUSER",
            "nocount",
            "on",
            "nopass",
            "+@all",
            "-mem.count",
            "~*",
        ],
    )
    .unwrap();
    let mut c = server.client();
    cmd(&mut c, &["AUTH", "counter", "x"]).unwrap();
    assert_eq!(count(&mut c, &["MEM.COUNT", "gpt-4o", "hello"]), 1);
    resolve(&mut c, "gpt-4o");
    assert!(cmd(&mut c, &["MEM.APPEND", "k", "user", "x"])
        .unwrap_err()
        .to_string()
        .contains("NOPERM"));
    cmd(&mut c, &["AUTH", "nocount", "x"]).unwrap();
    assert!(cmd(&mut c, &["MEM.COUNT", "gpt-4o", "hello"])
        .unwrap_err()
        .to_string()
        .contains("NOPERM"));
    assert_eq!(cmd(&mut con, &["DBSIZE"]).unwrap(), redis::Value::Int(0));
}

#[test]
fn tokens_edge_values_with_retries_batches_summaries_and_switches() {
    let server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.max-tokens-limit", "100000000000"],
    )
    .unwrap();
    let total =
        |c: &mut redis::Connection| int_field(&map_reply(c, &["MEM.INFO", "t"]), "total_tokens");
    // 0 and 2^32-1 are stored as given; 2^32 refused.
    let r = map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "t",
            "user",
            "zero",
            "TOKENS",
            "0",
            "MAXTOKENS",
            "100000000000",
        ],
    );
    assert_eq!(int_field(&r, "tokens"), 0);
    let r = map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "t",
            "assistant",
            "max",
            "TOKENS",
            "4294967295",
            "MSGID",
            "m1",
        ],
    );
    assert_eq!(int_field(&r, "tokens"), 4_294_967_295);
    assert_eq!(total(&mut con), 4_294_967_295);
    // A MSGID retry with another TOKENS is the same message: nothing added.
    let r = map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "t",
            "assistant",
            "max",
            "TOKENS",
            "7",
            "MSGID",
            "m1",
        ],
    );
    assert_eq!(
        int_field(&r, "tokens"),
        4_294_967_295,
        "the stored count answers a retry"
    );
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "t"]), "messages"),
        2
    );
    for bad in [
        "4294967296",
        "18446744073709551616",
        "+5",
        " 5",
        "5 ",
        "0x5",
        "1e3",
    ] {
        let e = cmd(&mut con, &["MEM.APPEND", "t", "user", "x", "TOKENS", bad]).unwrap_err();
        assert_eq!(e.code(), Some("ERR"), "TOKENS {bad:?}: {e}");
    }
    // A batch where one bad item refuses the whole batch.
    let batch = r#"[{"role":"user","content":"a","tokens":4294967295},{"role":"user","content":"b","tokens":4294967296}]"#;
    assert!(cmd(&mut con, &["MEM.APPENDBATCH", "t", batch]).is_err());
    for bad in [
        r#"[{"role":"user","content":"a","tokens":1.5}]"#,
        r#"[{"role":"user","content":"a","tokens":1e2}]"#,
        r#"[{"role":"user","content":"a","tokens":true}]"#,
    ] {
        assert!(
            cmd(&mut con, &["MEM.APPENDBATCH", "t", bad]).is_err(),
            "{bad}"
        );
    }
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "t"]), "messages"),
        2,
        "nothing appended"
    );
    assert_eq!(total(&mut con), 4_294_967_295);
    // A batch retry (same msgids) with given tokens adds nothing.
    let batch = r#"[{"role":"user","content":"c","tokens":11,"msgid":"b1"},{"role":"user","content":"d","msgid":"b2"}]"#;
    cmd(&mut con, &["MEM.APPENDBATCH", "t", batch]).unwrap();
    let after = total(&mut con);
    cmd(&mut con, &["MEM.APPENDBATCH", "t", batch]).unwrap();
    assert_eq!(total(&mut con), after);
    // A model switch to another family re-counts every message, the given
    // ones included (docs/commands.md, TOKENS: the given count was the old model's).
    map_reply(
        &mut con,
        &["MEM.APPEND", "t", "user", "switch", "MODEL", "qwen-plus"],
    );
    let q = tiktoken::get_encoding("qwen2").unwrap();
    let msg = |role: &str, text: &str| 3 + (q.count(role) + q.count(text)) as i64;
    let want = msg("user", "zero")
        + msg("assistant", "max")
        + msg("user", "c")
        + msg("user", "d")
        + msg("user", "switch");
    assert_eq!(total(&mut con), want);
    // Same encoding, another model: nothing re-counted, a given count stays.
    map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "t",
            "assistant",
            "given",
            "TOKENS",
            "500",
            "MODEL",
            "qwen-max",
        ],
    );
    assert_eq!(total(&mut con), want + 500);
    // A summary under a given-count session: totals stay consistent.
    map_reply(&mut con, &["MEM.SUMMARIZE", "t", "2", "short summary"]);
    let info = map_reply(&mut con, &["MEM.INFO", "t"]);
    let entries = match cmd(&mut con, &["MEM.GET", "t"]).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    let sum: i64 = entries
        .into_iter()
        .map(|e| int_field(&as_fields(e), "tokens"))
        .sum();
    assert_eq!(
        int_field(&info, "total_tokens"),
        sum,
        "totals are the sum of what MEM.GET shows"
    );
}

/// Found and fixed (tokenizer/models.rs): names were looked up with
/// OpenAI's `ft:` prefix dropped first, so an operator entry written with it
/// (a fine-tuned model's full name) was accepted and listed but never
/// matched. The full name is now looked up first, then without `ft:`.
#[test]
fn an_operator_entry_for_a_fine_tuned_name_matches_it() {
    let server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &[
            "CONFIG",
            "SET",
            "mem.models",
            "ft:gpt-4o-mini:acme*=qwen2:4096",
        ],
    )
    .unwrap();
    assert_eq!(
        resolve(&mut con, "ft:gpt-4o-mini:acme::abc"),
        ("qwen2".into(), 1, 4096, "config".into())
    );
    // Other fine-tuned names still resolve to their base model's entry.
    assert_eq!(
        resolve(&mut con, "ft:gpt-4o-mini:other::abc"),
        ("o200k_base".into(), 1, 128_000, "builtin".into())
    );
    assert_eq!(resolve(&mut con, "ft:gpt-4:other::abc").0, "cl100k_base");
}
