//! attack3 (issue 13), from outside: the first use of each encoding under
//! load (many clients at once, clients killed while waiting, FLUSHALL
//! meanwhile, MULTI/EXEC and scripts), a replica promoted with unbuilt
//! encodings, SHUTDOWN during a build, model switches across families with
//! AOF rewrite + restart and replica digests, and the main thread never held
//! more than 10 ms by a MEM.* command (SLOWLOG).

use crate::support::server::*;
use crate::support::session;
use crate::support::session::digest;

fn info_line(con: &mut redis::Connection, field: &str) -> String {
    let info: String = redis::cmd("INFO").arg("mem").query(con).unwrap();
    let want = format!("mem_{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&want))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

fn state(con: &mut redis::Connection, encoding: &str) -> String {
    let line = info_line(con, &format!("encoding_{encoding}"));
    line.split(',')
        .find_map(|f| f.strip_prefix("state="))
        .unwrap_or("")
        .to_owned()
}

fn as_int(v: redis::Value) -> i64 {
    match v {
        redis::Value::Int(n) => n,
        other => panic!("{other:?}"),
    }
}

fn msg(enc: &tiktoken::CoreBpe, role: &str, text: &str) -> i64 {
    3 + (enc.count(role) + enc.count(text)) as i64
}

#[test]
fn many_clients_at_once_on_an_unbuilt_encoding() {
    let server = Server::start();
    let mut con = server.client();
    // Held before the build so every client is seen waiting at once.
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "800"],
    )
    .unwrap();
    let text = "深度求索 DeepSeek counts 1234567 tokens 🎉";
    let mut joins = Vec::new();
    for i in 0..16 {
        let url = server.url();
        let text = text.to_owned();
        joins.push(std::thread::spawn(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            if i % 2 == 0 {
                as_int(cmd(&mut c, &["MEM.COUNT", "deepseek-chat", &text]).unwrap())
            } else {
                let r = map_reply(
                    &mut c,
                    &[
                        "MEM.APPEND",
                        &format!("k{i}"),
                        "user",
                        &text,
                        "MODEL",
                        "deepseek-reasoner",
                    ],
                );
                int_field(&r, "tokens")
            }
        }));
    }
    poll_until(&mut con, "16 clients waiting", |c| {
        blocked_in(c, "mem.count") + blocked_in(c, "mem.append") == 16
    });
    assert_eq!(
        state(&mut con, "deepseek_v3"),
        "unloaded",
        "nothing built while the workers wait"
    );
    let got: Vec<i64> = joins.into_iter().map(|j| j.join().unwrap()).collect();
    let d = tiktoken::get_encoding("deepseek_v3").unwrap();
    for (i, n) in got.iter().enumerate() {
        let want = if i % 2 == 0 {
            d.count(text) as i64
        } else {
            msg(d, "user", text)
        };
        assert_eq!(*n, want, "client {i}");
    }
    assert_eq!(
        info_line(&mut con, "encodings_loaded"),
        "o200k_base,deepseek_v3",
        "built once, nothing else"
    );
    assert_eq!(cmd(&mut con, &["DBSIZE"]).unwrap(), redis::Value::Int(8));
}

#[test]
fn clients_killed_and_keys_flushed_while_an_encoding_is_built() {
    let server = Server::start();
    let mut con = server.client();
    map_reply(
        &mut con,
        &["MEM.APPEND", "s", "user", "hello", "MODEL", "gpt-4o"],
    );
    map_reply(
        &mut con,
        &["MEM.APPEND", "d", "user", "hello", "MODEL", "gpt-4o"],
    );
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "1000"],
    )
    .unwrap();
    let spawn = |args: Vec<String>| {
        let url = server.url();
        std::thread::spawn(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cmd(&mut c, &args)
        })
    };
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // A switch of "s" to qwen2 (unbuilt): its key is flushed meanwhile.
    let switch = spawn(v(&[
        "MEM.APPEND",
        "s",
        "assistant",
        "hi",
        "MODEL",
        "qwen-plus",
    ]));
    // A count of an unbuilt encoding whose client is killed.
    let killed = spawn(v(&["MEM.COUNT", "kimi-k2", "x"]));
    // An append to "d" under glm-5, whose key is deleted and re-made under
    // another model meanwhile.
    let redone = spawn(v(&["MEM.APPEND", "d", "user", "again", "MODEL", "glm-5"]));
    poll_until(&mut con, "3 clients waiting", |c| {
        blocked_in(c, "mem.count") + blocked_in(c, "mem.append") == 3
    });
    let id = killed_id(&mut con);
    cmd(&mut con, &["CLIENT", "KILL", "ID", &id]).unwrap();
    assert!(
        killed.join().unwrap().is_err(),
        "the killed client's connection is closed"
    );
    cmd(&mut con, &["DEL", "s"]).unwrap();
    cmd(&mut con, &["DEL", "d"]).unwrap();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "0"],
    )
    .unwrap();
    map_reply(
        &mut con,
        &["MEM.APPEND", "d", "user", "x", "MODEL", "gpt-4"],
    );
    // The resumed writes see the keys as they are now.
    let q = tiktoken::get_encoding("qwen2").unwrap();
    let r = as_fields(switch.join().unwrap().unwrap());
    assert_eq!(int_field(&r, "tokens"), msg(q, "assistant", "hi"));
    let info = map_reply(&mut con, &["MEM.INFO", "s"]);
    assert_eq!(
        (
            int_field(&info, "messages"),
            str_field(&info, "encoding").as_str()
        ),
        (1, "qwen2"),
        "a new session"
    );
    assert_eq!(int_field(&info, "total_tokens"), msg(q, "assistant", "hi"));
    // The waiting append resumes before or after the re-made "d" (the
    // machine decides): either way the session holds both messages, counted
    // under the encoding of the last write's model.
    let r = redone.join().unwrap();
    assert!(r.is_ok(), "{r:?}");
    let info = map_reply(&mut con, &["MEM.INFO", "d"]);
    assert_eq!(int_field(&info, "messages"), 2);
    let want = match str_field(&info, "encoding").as_str() {
        "glm5" => {
            let g = tiktoken::get_encoding("glm5").unwrap();
            msg(g, "user", "x") + msg(g, "user", "again")
        }
        "cl100k_base" => {
            let c = tiktoken_rs::cl100k_base_singleton();
            let n = |t: &str| c.encode_ordinary(t).len() as i64;
            2 * (3 + n("user")) + n("x") + n("again")
        }
        other => panic!("{other}"),
    };
    assert_eq!(int_field(&info, "total_tokens"), want);
    // The killed client's build went on: the encoding is usable.
    poll_until(&mut con, "kimi_k2 built", |c| {
        state(c, "kimi_k2") == "loaded"
    });
    assert_eq!(
        as_int(cmd(&mut con, &["MEM.COUNT", "kimi-k2", "x"]).unwrap()),
        1
    );
}

fn killed_id(con: &mut redis::Connection) -> String {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    list.lines()
        .find(|l| l.contains("cmd=mem.count"))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .expect("the waiting MEM.COUNT client")
        .to_owned()
}

#[test]
fn sessions_loaded_with_an_unbuilt_encoding_refuse_multi_and_scripts_with_tryagain() {
    let mut server = Server::start();
    let mut con = server.client();
    map_reply(
        &mut con,
        &["MEM.APPEND", "q", "user", "你好", "MODEL", "qwen-plus"],
    );
    cmd(&mut con, &["SAVE"]).unwrap();
    server.restart();
    let mut con = server.client();
    assert_eq!(
        state(&mut con, "qwen2"),
        "unloaded",
        "loading the RDB built nothing"
    );
    let before = digest(&mut con, "q");
    // No MODEL: the session's own encoding, not built yet.
    let multi = |c: &mut redis::Connection, args: &[&str]| {
        let mut p = redis::pipe();
        p.atomic().cmd(args[0]);
        for a in &args[1..] {
            p.arg(*a);
        }
        match p.query::<redis::Value>(c) {
            Ok(v) => format!("{v:?}"),
            Err(e) => e.to_string(),
        }
    };
    let tries: Vec<Vec<&str>> = vec![
        vec!["MEM.APPEND", "q", "assistant", "x"],
        vec!["MEM.APPENDBATCH", "q", r#"[{"role":"user","content":"y"}]"#],
        vec!["MEM.SUMMARIZE", "q", "1", "a summary"],
    ];
    for args in &tries {
        let got = multi(&mut con, args);
        assert!(
            got.to_uppercase().contains("TRYAGAIN"),
            "MULTI {args:?}: {got}"
        );
        let script = format!(
            "return redis.call({})",
            args.iter()
                .map(|a| format!("'{}'", a.replace('\'', "\\'")))
                .collect::<Vec<_>>()
                .join(",")
        );
        let e = cmd(&mut con, &["EVAL", &script, "0"]);
        if state(&mut con, "qwen2") != "loaded" {
            let e = e.unwrap_err();
            assert!(
                e.to_string().to_uppercase().contains("TRYAGAIN"),
                "EVAL {args:?}: {e}"
            );
        }
        if state(&mut con, "qwen2") != "loaded" {
            assert_eq!(digest(&mut con, "q"), before, "refused, nothing changed");
        }
    }
    // The build started on the first refusal: the same commands go through.
    poll_until(&mut con, "qwen2 built", |c| state(c, "qwen2") == "loaded");
    let got = multi(&mut con, &["MEM.APPEND", "q", "assistant", "x"]);
    assert!(!got.to_uppercase().contains("TRYAGAIN"), "{got}");
    let q = tiktoken::get_encoding("qwen2").unwrap();
    let info = map_reply(&mut con, &["MEM.INFO", "q"]);
    assert!(int_field(&info, "total_tokens") >= msg(q, "user", "你好") + msg(q, "assistant", "x"));
}

#[test]
fn a_replica_promoted_counts_with_encodings_it_never_built() {
    let master = Server::start();
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    map_reply(
        &mut con,
        &["MEM.APPEND", "g", "user", "智谱 GLM", "MODEL", "glm-4.5"],
    );
    for c in [&mut con, &mut rcon] {
        cmd(
            c,
            &["CONFIG", "SET", "mem.max-tokens-limit", "100000000000"],
        )
        .unwrap();
    }
    map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "g",
            "assistant",
            "given",
            "TOKENS",
            "4294967295",
            "MAXTOKENS",
            "9000000000",
        ],
    );
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "1500"],
    )
    .unwrap();
    // A write on the master waits for minimax_m2 while the replica is promoted.
    let url = master.url();
    let waiting = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        cmd(
            &mut c,
            &["MEM.APPEND", "m", "user", "hi", "MODEL", "minimax-m2"],
        )
    });
    poll_until(&mut con, "the append to wait", |c| blocked_appends(c) == 1);
    cmd(&mut con, &["WAIT", "1", "5000"]).unwrap();
    assert_eq!(digest(&mut con, "g"), digest(&mut rcon, "g"));
    assert_eq!(state(&mut rcon, "glm4"), "unloaded");
    cmd(&mut rcon, &["REPLICAOF", "NO", "ONE"]).unwrap();
    // The promoted replica builds glm4 on first use, while its client waits.
    let r = map_reply(&mut rcon, &["MEM.APPEND", "g", "user", "ok"]);
    let g = tiktoken::get_encoding("glm4").unwrap();
    assert_eq!(int_field(&r, "tokens"), msg(g, "user", "ok"));
    let info = map_reply(&mut rcon, &["MEM.INFO", "g"]);
    assert_eq!(
        int_field(&info, "total_tokens"),
        msg(g, "user", "智谱 GLM") + 4_294_967_295 + msg(g, "user", "ok")
    );
    assert_eq!(
        as_int(cmd(&mut rcon, &["MEM.COUNT", "minimax-m2", "hi"]).unwrap()),
        tiktoken::get_encoding("minimax_m2").unwrap().count("hi") as i64
    );
    // The old master's waiting write still completes there.
    assert!(waiting.join().unwrap().is_ok());
    assert_eq!(
        cmd(&mut con, &["EXISTS", "m"]).unwrap(),
        redis::Value::Int(1)
    );
}

#[test]
fn shutdown_while_an_encoding_is_being_built() {
    let mut server = Server::start();
    let mut con = server.client();
    let url = server.url();
    let waiting = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        cmd(&mut c, &["MEM.COUNT", "mistral-large", "x"])
    });
    poll_until(&mut con, "the build to start", |c| {
        state(c, "tekken") != "unloaded"
    });
    let _ = cmd(&mut con, &["SHUTDOWN", "NOSAVE"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while server.is_alive() {
        assert!(std::time::Instant::now() < deadline, "the server exits");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = waiting.join();
    let log = server.log();
    assert!(log.contains("ready to exit"), "a clean exit:\n{log}");
    for bad in ["crashed", "panicked", "SIGSEGV", "Assertion"] {
        assert!(!log.contains(bad), "{bad}:\n{log}");
    }
}

#[test]
fn model_switches_across_families_survive_aof_rewrite_restart_and_match_the_replica() {
    let mut master = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    let k = "mem:{x}";
    map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            k,
            "user",
            "first 第一",
            "MODEL",
            "gpt-4o",
            "MSGID",
            "a",
        ],
    );
    map_reply(
        &mut con,
        &["MEM.APPEND", k, "assistant", "given", "TOKENS", "777"],
    );
    map_reply(&mut con, &["MEM.SUMMARIZE", k, "1", "摘要 summary"]);
    let models = [
        "deepseek-chat",
        "llama-3.1-70b",
        "gpt-4",
        "kimi-k2",
        "mistral-small",
        "qwen3-max",
    ];
    for (i, model) in models.iter().enumerate() {
        map_reply(
            &mut con,
            &[
                "MEM.APPEND",
                k,
                "user",
                &format!("turn {i} 🎉"),
                "MODEL",
                model,
            ],
        );
    }
    cmd(&mut con, &["WAIT", "1", "5000"]).unwrap();
    let want = digest(&mut con, k);
    assert_eq!(
        digest(&mut rcon, k),
        want,
        "the replica applied the re-counts"
    );
    let info = map_reply(&mut con, &["MEM.INFO", k]);
    assert_eq!(str_field(&info, "encoding"), "qwen2");
    let q = tiktoken::get_encoding("qwen2").unwrap();
    let entries = match cmd(&mut con, &["MEM.GET", k]).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    // Every stored count is the qwen2 count of its text (given ones re-counted).
    for e in entries {
        let f = as_fields(e);
        let (role, content) = (str_field(&f, "role"), str_field(&f, "content"));
        if role == "summary" || role == "system" && content.contains("摘要") {
            continue;
        }
        assert_eq!(
            int_field(&f, "tokens"),
            msg(q, &role, &content),
            "{role} {content}"
        );
    }
    cmd(&mut con, &["BGREWRITEAOF"]).unwrap();
    session::wait_persistence_idle(&mut con);
    master.restart();
    let mut con = master.client();
    assert_eq!(
        digest(&mut con, k),
        want,
        "the rewritten AOF gives the same session"
    );
    assert_eq!(
        state(&mut con, "deepseek_v3"),
        "unloaded",
        "replaying built nothing"
    );
    // A retry of the first MSGID after the restart is still a duplicate.
    let r = map_reply(
        &mut con,
        &["MEM.APPEND", k, "user", "first 第一", "MSGID", "a"],
    );
    assert_eq!(int_field(&r, "id"), 1);
}

/// MEM.* commands that held the main thread over 10 ms, from SLOWLOG:
/// (microseconds, first args). Commands run several times with the same
/// first args count by their quickest run: work that takes over 10 ms does
/// so every time, while a main thread descheduled by a busy machine (2 cores
/// for several test servers) shows in one run only.
fn held_over_10ms(con: &mut redis::Connection) -> Vec<(i64, String)> {
    let log = match cmd(con, &["SLOWLOG", "GET", "-1"]).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    let text = |v: &redis::Value| redis::from_redis_value::<String>(v).unwrap_or_default();
    let mut quickest: std::collections::BTreeMap<String, i64> = Default::default();
    for entry in log {
        let redis::Value::Array(f) = entry else {
            continue;
        };
        let (redis::Value::Int(micros), redis::Value::Array(args)) = (&f[2], &f[3]) else {
            continue;
        };
        let name = args.first().map(text).unwrap_or_default();
        if name.to_uppercase().starts_with("MEM.") {
            let shown: Vec<String> = args
                .iter()
                .take(3)
                .map(|a| text(a).chars().take(12).collect())
                .collect();
            let q = quickest.entry(shown.join(" ")).or_insert(i64::MAX);
            *q = (*q).min(*micros);
        }
    }
    quickest
        .into_iter()
        .filter(|(_, m)| *m > 10_000)
        .map(|(k, m)| (m, k))
        .collect()
}

fn slowlog_server() -> (Server, redis::Connection) {
    let server = Server::with_args(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "100000",
    ]);
    let mut con = server.client();
    cmd(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "5mb"]).unwrap();
    (server, con)
}

const FAMILIES: [&str; 10] = [
    "gpt-4o",
    "gpt-4",
    "llama-3.1-8b",
    "deepseek-chat",
    "qwen-plus",
    "glm-4.5",
    "glm-5",
    "kimi-k2",
    "minimax-m2",
    "mistral-nemo",
];

#[test]
fn first_use_large_counts_and_the_model_table_do_not_hold_the_main_thread() {
    let (_server, mut con) = slowlog_server();
    // First use of every encoding, by a count, a write, a batch.
    for (i, model) in FAMILIES.iter().enumerate().skip(1) {
        cmd(&mut con, &["MEM.COUNT", model, "first"]).unwrap();
        map_reply(
            &mut con,
            &[
                "MEM.APPEND",
                &format!("s{i}"),
                "user",
                "first",
                "MODEL",
                model,
            ],
        );
        cmd(
            &mut con,
            &[
                "MEM.APPENDBATCH",
                &format!("b{i}"),
                r#"[{"role":"user","content":"b"}]"#,
                "MODEL",
                model,
            ],
        )
        .unwrap();
    }
    // 4 MB, off the main thread (repeated under `make holds`: see
    // held_over_10ms).
    for model in &FAMILIES {
        for _ in 0..measured_runs() {
            cmd(&mut con, &["MEM.COUNT", model, &"x".repeat(4 << 20)]).unwrap();
        }
    }
    // The whole table, with 1024 operator entries.
    let many: String = (0..1024)
        .map(|i| format!("{}{i:04}*=glm5:{} ", "z".repeat(200), i + 1))
        .collect();
    cmd(&mut con, &["CONFIG", "SET", "mem.models", &many]).unwrap();
    for _ in 0..measured_runs() {
        cmd(&mut con, &["MEM.MODELS"]).unwrap();
    }
    for model in &FAMILIES {
        cmd(&mut con, &["MEM.MODELS", model]).unwrap();
        cmd(&mut con, &["MEM.COUNT", model, "after a big table"]).unwrap();
        map_reply(
            &mut con,
            &[
                "MEM.APPEND",
                "t",
                "user",
                "after a big table",
                "MODEL",
                model,
            ],
        );
    }
    let worst = held_over_10ms(&mut con);
    // A figure, not an assertion (timed assertions flake on a shared machine;
    // `make holds` measures holds from every test server's SLOWLOG).
    println!("attack3/first uses: MEM.* holds over 10 ms (quickest of repeats): {worst:?}");
}

/// Finding (fixed): texts just under mem.async-threshold-bytes were counted
/// inline, and for Tekken (Mistral) a 64 KB run of one letter or of spaces
/// took 15-30 ms (quickest of 3 runs: Tekken spaces 15.7 ms, glm4 "'s" x
/// 32767 10.3 ms; qwen2 digits 6.5 ms, o200k < 1 ms). The open-weight
/// encodings now count inline only below an sixteenth of the threshold:
/// these texts go to the pool (asserted), the holds are printed.
#[test]
fn texts_just_under_the_async_threshold_count_inline_within_10_ms() {
    let (_server, mut con) = slowlog_server();
    let limit = 65535; // mem.async-threshold-bytes (65536 by default) - 1
    let shapes = [
        " ".repeat(limit),
        "a".repeat(limit),
        "7".repeat(limit),
        "中".repeat(limit / 3),
        "🎉".repeat(limit / 4),
        "a ".repeat(limit / 2),
        "\n\t".repeat(limit / 2),
        "'s".repeat(limit / 2),
    ];
    for model in &FAMILIES {
        cmd(&mut con, &["MEM.COUNT", model, "warm"]).unwrap();
    }
    poll_until(&mut con, "every encoding built", |c| {
        info_line(c, "encodings_loaded").split(',').count() == 10
    });
    cmd(&mut con, &["SLOWLOG", "RESET"]).unwrap();
    let off_thread =
        |c: &mut redis::Connection| info_line(c, "counts_off_thread").parse::<u64>().unwrap();
    let before = off_thread(&mut con);
    for model in &FAMILIES {
        for text in &shapes {
            for _ in 0..measured_runs() {
                cmd(&mut con, &["MEM.COUNT", model, text]).unwrap();
            }
        }
    }
    // The open-weight families (all but the first two) counted them on the pool.
    let pooled = off_thread(&mut con) - before;
    assert!(
        pooled >= ((FAMILIES.len() - 2) * shapes.len() * measured_runs()) as u64,
        "{pooled} counted on the pool"
    );
    let worst = held_over_10ms(&mut con);
    println!("attack3/64 KB shapes: MEM.COUNT holds over 10 ms (quickest of 3): {worst:?}");
}

/// Finding (fixed): a model switch of a 2.4 MB session (40 x 60 KB) held
/// the main thread 16-20 ms though its counts are made on the pool: 88% in
/// `core::str::from_utf8`, every walk over the messages re-validating text
/// checked when it was stored. Reads no longer re-check; the holds are
/// printed, the counts asserted.
#[test]
fn a_model_switch_of_a_large_session_does_not_hold_the_main_thread() {
    let (_server, mut con) = slowlog_server();
    // From OpenAI's encoding to a one-stage split, a three-stage one and
    // Tekken (the walk over the messages is the same for every family).
    let switches = ["gpt-4o", "llama-3.1-8b", "deepseek-chat", "mistral-nemo"];
    for model in &switches {
        cmd(&mut con, &["MEM.COUNT", model, "warm"]).unwrap();
    }
    poll_until(&mut con, "the encodings built", |c| {
        info_line(c, "encodings_loaded").split(',').count() == switches.len()
    });
    for i in 0..40 {
        map_reply(
            &mut con,
            &[
                "MEM.APPEND",
                "big",
                "user",
                &varied_text(60_000, i),
                "MODEL",
                "gpt-4o",
                "MAXTOKENS",
                "10000000",
            ],
        );
    }
    cmd(&mut con, &["SLOWLOG", "RESET"]).unwrap();
    for model in switches.iter().skip(1) {
        map_reply(
            &mut con,
            &["MEM.APPEND", "big", "user", "switch", "MODEL", model],
        );
    }
    let worst = held_over_10ms(&mut con);
    println!("attack3/model switches of 2.4 MB: holds over 10 ms: {worst:?}");
    let info = map_reply(&mut con, &["MEM.INFO", "big"]);
    assert_eq!(
        int_field(&info, "messages"),
        30,
        "the default cap: each switch appended one"
    );
    assert_eq!(
        str_field(&info, "encoding"),
        "tekken",
        "re-counted under the last family's encoding"
    );
}
