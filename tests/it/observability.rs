//! What an operator sees: keyspace notifications of every write event, the
//! `INFO mem` section, and the command docs / key specs Redis serves for the
//! MEM.* commands (COMMAND DOCS, COMMAND INFO) on Redis 7.0+.

use crate::support::server::*;

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;

/// The events `listen` publishes for `key`, in order, while `writes` runs
/// on `write` (the same server, or its master).
fn events_during(
    listen: &Server,
    write: &Server,
    key: &str,
    writes: impl FnOnce(&mut redis::Connection),
) -> Vec<String> {
    let mut sub = listen.client();
    cmd(&mut sub, &["CONFIG", "SET", "notify-keyspace-events", "Kd"]).unwrap();
    let mut con = write.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(format!("__keyspace@0__:{key}")).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    writes(&mut con);
    let mut events = Vec::new();
    while let Ok(msg) = pubsub.get_message() {
        events.push(msg.get_payload::<String>().unwrap());
    }
    events
}

#[test]
fn every_write_publishes_its_module_event() {
    let server = Server::start();
    let key = "mem:{events}";
    let events = events_during(&server, &server, key, |con| {
        // 1: append; 2: append that meets the message threshold (MAXMSGS 2);
        // 3: append that trims (and still meets it); summarize; extset; import.
        cmd(con, &["MEM.APPEND", key, "user", "one", "MAXMSGS", "2"]).unwrap();
        cmd(con, &["MEM.APPEND", key, "user", "two"]).unwrap();
        cmd(con, &["MEM.APPEND", key, "user", "three"]).unwrap();
        cmd(con, &["MEM.SUMMARIZE", key, "2", "a summary"]).unwrap();
        cmd(con, &["MEM.EXTSET", key, "dify", "conv-1"]).unwrap();
        cmd(
            con,
            &[
                "MEM.IMPORT",
                key,
                r#"{"conversation_history":[{"role":"user","content":"hi"}]}"#,
                "REPLACE",
            ],
        )
        .unwrap();
        cmd(con, &["MEM.ATTRSET", key, "user_profile", "{}"]).unwrap();
        cmd(con, &["MEM.ATTRDEL", key, "user_profile"]).unwrap();
        // Reads, failed writes and a delete of nothing publish nothing.
        cmd(con, &["MEM.ATTRDEL", key, "user_profile"]).unwrap();
        let _ = cmd(con, &["MEM.ATTRSET", key, "model", "1"]);
        cmd(con, &["MEM.ATTRGET", key]).unwrap();
        cmd(con, &["MEM.GET", key]).unwrap();
        let _ = cmd(con, &["MEM.SUMMARIZE", key, "99", "stale"]);
    });
    assert_eq!(
        events,
        [
            "mem.append",
            "mem.append",
            "mem.threshold",
            "mem.append",
            "mem.trim",
            "mem.threshold",
            "mem.summarize",
            "mem.extset",
            "mem.import",
            "mem.attrset",
            "mem.attrdel",
        ],
    );
}

/// A replica publishes the events of the ops it applies, as its master did,
/// but not mem.threshold (the master's settings decide it) nor mem.import (a
/// whole session travels, as an AOF rewrite's does).
#[test]
fn a_replica_publishes_the_events_of_the_writes_it_applies() {
    let (master, replica) = crate::support::faults::master_and_replica(&[]);
    let key = "mem:{revents}";
    let events = events_during(&replica, &master, key, |con| {
        cmd(con, &["MEM.APPEND", key, "user", "one", "MAXMSGS", "2"]).unwrap();
        cmd(con, &["MEM.APPEND", key, "user", "two"]).unwrap();
        cmd(con, &["MEM.APPEND", key, "user", "three"]).unwrap();
        cmd(con, &["MEM.SUMMARIZE", key, "2", "a summary"]).unwrap();
        cmd(con, &["MEM.EXTSET", key, "dify", "conv-1"]).unwrap();
        cmd(con, &["MEM.ATTRSET", key, "user_profile", "{}"]).unwrap();
        cmd(con, &["MEM.ATTRDEL", key, "user_profile"]).unwrap();
        let batch = r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]"#;
        cmd(con, &["MEM.APPENDBATCH", key, batch]).unwrap();
        let doc = r#"{"conversation_history":[{"role":"user","content":"hi"}]}"#;
        cmd(con, &["MEM.IMPORT", key, doc, "REPLACE"]).unwrap();
        let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(con).unwrap();
        assert_eq!(n, 1);
    });
    assert_eq!(
        events,
        [
            "mem.append",
            "mem.append",
            "mem.append",
            "mem.trim",
            "mem.summarize",
            "mem.extset",
            "mem.attrset",
            "mem.attrdel",
            // The batch: "a" fits beside message 3, "b" evicts it.
            "mem.append",
            "mem.append",
            "mem.trim",
        ],
    );
}

#[test]
fn no_module_events_without_the_d_flag() {
    let server = Server::start();
    let mut con = server.client();
    cmd(&mut con, &["CONFIG", "SET", "notify-keyspace-events", "K$"]).unwrap();
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("__keyspace@0__:mem:{quiet}").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    cmd(&mut con, &["MEM.APPEND", "mem:{quiet}", "user", "x"]).unwrap();
    assert!(
        pubsub.get_message().is_err(),
        "an event was published without flag d"
    );
}

fn info_mem(con: &mut redis::Connection) -> HashMap<String, String> {
    let text: String = redis::cmd("INFO").arg("mem").query(con).unwrap();
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

fn num(info: &HashMap<String, String>, field: &str) -> i64 {
    info.get(field)
        .unwrap_or_else(|| panic!("INFO mem has no {field}: {info:?}"))
        .parse()
        .unwrap()
}

#[test]
fn info_mem_counts_what_happened() {
    let server = Server::start();
    let mut con = server.client();
    let before = info_mem(&mut con);
    assert!(text_has(&before, "mem_encodings", "o200k_base"));
    // Only the default model's encoding is built at start (in the background).
    assert_eq!(
        before.get("mem_encodings_loaded").map(String::as_str),
        Some("o200k_base")
    );
    assert!(num(&before, "mem_encodings_load_usec") > 0);
    assert!(num(&before, "mem_encodings_memory_bytes") > 1_000_000);
    assert_eq!(num(&before, "mem_sessions"), 0);

    let mut tokens = 0;
    for i in 0..4 {
        let r = map_reply(
            &mut con,
            &[
                "MEM.APPEND",
                "mem:{i}",
                "user",
                &format!("message {i}"),
                "MAXMSGS",
                "3",
            ],
        );
        tokens += int_field(&r, "tokens");
    }
    cmd(&mut con, &["MEM.APPEND", "mem:{j}", "user", "other"]).unwrap();
    cmd(&mut con, &["MEM.SUMMARIZE", "mem:{i}", "3", "sum"]).unwrap();
    let _ = cmd(&mut con, &["MEM.SUMMARIZE", "mem:{i}", "2", "stale"]);
    cmd(
        &mut con,
        &["MEM.IMPORT", "mem:{k}", r#"{"conversation_history":[]}"#],
    )
    .unwrap();
    cmd(&mut con, &["MEM.EXTSET", "mem:{k}", "n8n", "x"]).unwrap();
    let after = info_mem(&mut con);
    let delta = |f: &str| num(&after, f) - num(&before, f);
    assert_eq!(num(&after, "mem_sessions"), 3);
    assert_eq!(delta("mem_appends"), 5);
    assert_eq!(
        delta("mem_messages_trimmed"),
        1,
        "the 4th append to mem:{{i}} evicted one"
    );
    assert_eq!(
        delta("mem_threshold_events"),
        2,
        "appends 3 and 4 met MAXMSGS 3"
    );
    assert_eq!(delta("mem_summaries_applied"), 1);
    assert_eq!(delta("mem_summaries_rejected_stale"), 1);
    assert_eq!(delta("mem_imports"), 1);
    assert_eq!(delta("mem_extsets"), 1);
    assert!(
        delta("mem_tokens_counted") >= tokens,
        "tokens counted cover the appends"
    );
    assert!(delta("mem_tokenizer_calls") >= 6);
    cmd(&mut con, &["DEL", "mem:{i}", "mem:{j}"]).unwrap();
    assert_eq!(num(&info_mem(&mut con), "mem_sessions"), 1);
}

fn text_has(info: &HashMap<String, String>, field: &str, part: &str) -> bool {
    info.get(field).is_some_and(|v| v.contains(part))
}

/// A RESP map or flat array of a COMMAND reply, as `(name, value)` pairs.
fn pairs(v: &Value) -> Vec<(String, Value)> {
    as_fields(v.clone())
}

fn find<'a>(pairs: &'a [(String, Value)], name: &str) -> &'a Value {
    &pairs
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {pairs:?}"))
        .1
}

#[test]
fn command_docs_and_key_specs_are_served() {
    let server = Server::start();
    let mut con = server.client();
    let docs: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("mem.append")
        .query(&mut con)
        .unwrap();
    let top = pairs(&docs);
    assert_eq!(top[0].0, "mem.append");
    let doc = pairs(&top[0].1);
    let summary: String = redis::from_redis_value(find(&doc, "summary")).unwrap();
    assert!(summary.contains("Appends a message"), "{summary}");
    let module: String = redis::from_redis_value(find(&doc, "module")).unwrap();
    assert_eq!(module, "mem");
    let Value::Array(args) = find(&doc, "arguments") else {
        panic!("no arguments")
    };
    let tokens: Vec<String> = args
        .iter()
        .filter_map(|a| {
            let a = pairs(a);
            a.iter()
                .find(|(k, _)| k == "token")
                .map(|(_, v)| redis::from_redis_value(v).unwrap())
        })
        .collect();
    assert_eq!(
        tokens,
        [
            "TS",
            "META",
            "MODEL",
            "TTL",
            "MAXTOKENS",
            "MAXMSGS",
            "MAXAGE",
            "MSGID",
            "TOKENS"
        ]
    );

    // MEM.IMPORT's options as its parser takes them (MAXTOKENS, MAXMSGS and
    // MAXAGE were missing from its docs).
    let docs: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("mem.import")
        .query(&mut con)
        .unwrap();
    let doc = pairs(&pairs(&docs)[0].1);
    let Value::Array(args) = find(&doc, "arguments") else {
        panic!("no arguments")
    };
    let tokens: Vec<String> = args
        .iter()
        .filter_map(|a| {
            pairs(a)
                .iter()
                .find(|(k, _)| k == "token")
                .map(|(_, v)| redis::from_redis_value(v).unwrap())
        })
        .collect();
    assert_eq!(
        tokens,
        ["REPLACE", "MODEL", "TTL", "MAXTOKENS", "MAXMSGS", "MAXAGE"]
    );

    // Key specs: reads are RO, writes RW (IMPORT: OW), all at argument 1.
    let commands = [
        ("mem.get", "RO"),
        ("mem.append", "RW"),
        ("mem.import", "OW"),
        ("mem.info", "RO"),
        ("mem.summarize_begin", "RW"),
        ("mem.attrset", "update"),
        ("mem.attrset", "RW"),
        ("mem.attrdel", "delete"),
        ("mem.attrdel", "RW"),
        ("mem.attrget", "RO"),
    ];
    for (command, flag) in commands {
        let info: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(command)
            .query(&mut con)
            .unwrap();
        let Value::Array(outer) = info else {
            panic!("{info:?}")
        };
        let Value::Array(entry) = &outer[0] else {
            panic!("{outer:?}")
        };
        let text = format!("{:?}", entry[8]); // the key specifications
        assert!(text.contains(&format!("\"{flag}\"")), "{command}: {text}");
        assert!(text.contains("index"), "{command}: {text}");
    }
    // The keyless commands (MEM.COUNT, MEM.MODELS) declare no key spec.
    for command in ["mem.count", "mem.models"] {
        let info: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(command)
            .query(&mut con)
            .unwrap();
        let Value::Array(outer) = info else {
            panic!("{info:?}")
        };
        let Value::Array(entry) = &outer[0] else {
            panic!("{outer:?}")
        };
        assert_eq!(entry[8], Value::Array(vec![]), "{command}");
    }
    // Arity is declared: Redis itself refuses a wrong number of arguments.
    let e = cmd(&mut con, &["MEM.INFO"]).unwrap_err();
    assert!(e.to_string().contains("wrong number of arguments"), "{e}");
}
