//! MEM.ATTRSET / ATTRGET / ATTRDEL: the seed document's other members kept
//! with the session, at the top level of FORMAT JSON, editable one by one;
//! refusals change nothing; persisted, dumped and replicated.

use crate::support::server::*;
use crate::support::session::{digest, dump, json_text, ok};

fn get(con: &mut redis::Connection, key: &str, name: &str) -> Option<String> {
    redis::cmd("MEM.ATTRGET")
        .arg(key)
        .arg(name)
        .query(con)
        .unwrap()
}

fn all(con: &mut redis::Connection, key: &str) -> Vec<(String, String)> {
    as_fields(cmd(con, &["MEM.ATTRGET", key]).unwrap())
        .into_iter()
        .map(|(k, v)| (k, redis::from_redis_value(&v).unwrap()))
        .collect()
}

/// Members by name, values parsed: what an application reads of them (an
/// import keeps their meaning; whether it keeps their exact text and order
/// is the import's own business).
fn parsed(members: Vec<(String, String)>) -> std::collections::BTreeMap<String, serde_json::Value> {
    members
        .into_iter()
        .map(|(k, v)| (k, serde_json::from_str(&v).unwrap()))
        .collect()
}

fn int(con: &mut redis::Connection, args: &[&str]) -> i64 {
    redis::from_redis_value(&ok(con, args)).unwrap()
}

const PROFILE: &str = r#"{"name": "Ann", "tz": "Europe/Paris", "n": 1.50}"#;

#[test]
fn attributes_round_trip() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(get(&mut con, "u", "user_profile"), None);
    assert_eq!(all(&mut con, "u"), vec![]);
    // ATTRSET creates the session, with the default TTL.
    assert_eq!(
        ok(&mut con, &["MEM.ATTRSET", "u", "user_profile", PROFILE]),
        redis::Value::Okay
    );
    assert!(int(&mut con, &["PTTL", "u"]) > 86_000_000);
    ok(&mut con, &["MEM.ATTRSET", "u", "context", r#" ["a", 2] "#]);
    ok(&mut con, &["MEM.APPEND", "u", "user", "hello"]);
    // Kept as written (whitespace inside, 1.50), without the outer blanks.
    assert_eq!(get(&mut con, "u", "user_profile").as_deref(), Some(PROFILE));
    assert_eq!(
        get(&mut con, "u", "context").as_deref(),
        Some(r#"["a", 2]"#)
    );
    assert_eq!(get(&mut con, "u", "nope"), None);
    assert_eq!(
        all(&mut con, "u"),
        vec![
            ("user_profile".into(), PROFILE.into()),
            ("context".into(), r#"["a", 2]"#.into())
        ]
    );
    // Replacing keeps the member's place.
    ok(&mut con, &["MEM.ATTRSET", "u", "user_profile", "\"v2\""]);
    assert_eq!(
        all(&mut con, "u")[0],
        ("user_profile".into(), "\"v2\"".into())
    );
    // FORMAT JSON: the members at the top level, as an import returns them.
    let doc: serde_json::Value = serde_json::from_str(&json_text(&mut con, "u")).unwrap();
    assert_eq!(doc["user_profile"], "v2");
    assert_eq!(doc["context"], serde_json::json!(["a", 2]));
    assert_eq!(doc["conversation_history"].as_array().unwrap().len(), 1);
    // The document imported elsewhere gives the same members back.
    let text = json_text(&mut con, "u");
    ok(&mut con, &["MEM.IMPORT", "copy", &text]);
    assert_eq!(parsed(all(&mut con, "copy")), parsed(all(&mut con, "u")));
    // ... and they are editable there too.
    ok(&mut con, &["MEM.ATTRSET", "copy", "context", "{}"]);
    assert_eq!(get(&mut con, "copy", "context").as_deref(), Some("{}"));
    // ATTRDEL: 1, then 0.
    assert_eq!(int(&mut con, &["MEM.ATTRDEL", "u", "context"]), 1);
    assert_eq!(int(&mut con, &["MEM.ATTRDEL", "u", "context"]), 0);
    assert_eq!(int(&mut con, &["MEM.ATTRDEL", "missing", "context"]), 0);
    assert_eq!(int(&mut con, &["EXISTS", "missing"]), 0);
    assert_eq!(
        all(&mut con, "u"),
        vec![("user_profile".into(), "\"v2\"".into())]
    );
    assert_eq!(info_mem(&mut con, "attrsets"), 4);
    assert_eq!(info_mem(&mut con, "attrdels"), 1);
}

#[test]
fn a_client_side_document_becomes_editable_after_import() {
    let server = Server::start();
    let mut con = server.client();
    let doc = r#"{"conversation_history":[{"role":"user","content":"hi","timestamp":"2024-05-01T10:00:00"}],
                  "user_profile":{"name":"Ann"},"context":{"topic":"x"}}"#;
    ok(&mut con, &["MEM.IMPORT", "m", doc]);
    assert_eq!(
        get(&mut con, "m", "user_profile").as_deref(),
        Some(r#"{"name":"Ann"}"#)
    );
    ok(
        &mut con,
        &[
            "MEM.ATTRSET",
            "m",
            "user_profile",
            r#"{"name":"Ann","lang":"fr"}"#,
        ],
    );
    let out: serde_json::Value = serde_json::from_str(&json_text(&mut con, "m")).unwrap();
    assert_eq!(out["user_profile"]["lang"], "fr");
    assert_eq!(out["context"]["topic"], "x");
}

#[test]
fn ttl_is_refreshed() {
    let server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["MEM.APPEND", "t", "user", "x", "TTL", "100"]);
    ok(&mut con, &["PEXPIRE", "t", "5000"]);
    ok(&mut con, &["MEM.ATTRSET", "t", "a", "1"]);
    assert!(int(&mut con, &["PTTL", "t"]) > 90_000);
    ok(&mut con, &["PEXPIRE", "t", "5000"]);
    assert_eq!(int(&mut con, &["MEM.ATTRDEL", "t", "a"]), 1);
    assert!(int(&mut con, &["PTTL", "t"]) > 90_000);
    // A session of TTL 0 stays without expiry.
    ok(&mut con, &["MEM.APPEND", "p", "user", "x", "TTL", "0"]);
    ok(&mut con, &["MEM.ATTRSET", "p", "a", "1"]);
    assert_eq!(int(&mut con, &["PTTL", "p"]), -1);
}

#[test]
fn bad_names_and_values_are_refused_changing_nothing() {
    let server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["MEM.APPEND", "k", "user", "x"]);
    ok(&mut con, &["MEM.ATTRSET", "k", "a", "1"]);
    ok(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "100"]);
    let long = "n".repeat(65);
    let big = format!("\"{}\"", "x".repeat(100));
    let deep = format!("{}{}", "[".repeat(127), "]".repeat(127));
    let refused: Vec<Vec<&str>> = vec![
        vec!["MEM.ATTRSET", "k", "", "1"],
        vec!["MEM.ATTRSET", "k", &long, "1"],
        vec!["MEM.ATTRSET", "k", "conversation_history", "[]"],
        vec!["MEM.ATTRSET", "k", "summary", "null"],
        vec!["MEM.ATTRSET", "k", "total_tokens", "1"],
        vec!["MEM.ATTRSET", "k", "model", "\"m\""],
        vec!["MEM.ATTRSET", "k", "a", "{"],
        vec!["MEM.ATTRSET", "k", "a", ""],
        vec!["MEM.ATTRSET", "k", "a", "nul"],
        vec!["MEM.ATTRSET", "k", "a", "1 2"],
        vec!["MEM.ATTRSET", "k", "a", r#""\ud800""#],
        vec!["MEM.ATTRSET", "k", "a", "1e999"],
        vec!["MEM.ATTRSET", "k", "a", &big],
        vec!["MEM.ATTRSET", "k", "a", &deep],
        vec!["MEM.ATTRSET", "k", "a"],
        vec!["MEM.ATTRSET", "k", "a", "1", "extra"],
        vec!["MEM.ATTRDEL", "k"],
        vec!["MEM.ATTRGET"],
        vec!["MEM.ATTRGET", "k", "a", "b"],
    ];
    // ATTRDEL takes any name (an import may keep one ATTRSET refuses): a
    // name that is not there deletes nothing.
    for name in ["", "model"] {
        let before = digest(&mut con, "k");
        assert_eq!(int(&mut con, &["MEM.ATTRDEL", "k", name]), 0);
        assert_eq!(digest(&mut con, "k"), before);
    }
    for args in &refused {
        let before = (digest(&mut con, "k"), int(&mut con, &["PTTL", "k"]));
        let e = cmd(&mut con, args).expect_err(&format!("{args:?} accepted"));
        assert!(!e.to_string().is_empty());
        assert_eq!(digest(&mut con, "k"), before.0, "{args:?}");
        assert!(int(&mut con, &["PTTL", "k"]) <= before.1, "{args:?}");
        // On a missing key nothing is created either.
        let mut on_missing = args.clone();
        if on_missing.len() > 1 {
            on_missing[1] = "nokey";
            let _ = cmd(&mut con, &on_missing);
            assert_eq!(int(&mut con, &["EXISTS", "nokey"]), 0, "{args:?}");
        }
    }
    // Invalid UTF-8 in the value, a key of another type.
    let e = redis::cmd("MEM.ATTRSET")
        .arg("k")
        .arg("a")
        .arg(&b"\"\xff\""[..])
        .query::<()>(&mut con)
        .unwrap_err();
    assert!(e.to_string().contains("UTF-8"), "{e}");
    ok(&mut con, &["SET", "str", "v"]);
    for args in [
        &["MEM.ATTRSET", "str", "a", "1"][..],
        &["MEM.ATTRGET", "str"],
        &["MEM.ATTRDEL", "str", "a"],
    ] {
        let e = cmd(&mut con, args).unwrap_err();
        assert!(e.to_string().contains("WRONGTYPE"), "{args:?}: {e}");
    }
    assert_eq!(get(&mut con, "k", "a").as_deref(), Some("1"));
    // At the limits: accepted.
    ok(
        &mut con,
        &[
            "MEM.ATTRSET",
            "k",
            &"n".repeat(64),
            &"[".repeat(10)
                .chars()
                .chain("]".repeat(10).chars())
                .collect::<String>(),
        ],
    );
}

#[test]
fn attributes_persist_and_replicate() {
    let master = Server::with_args(&["--repl-diskless-sync-delay", "0"]);
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    ok(&mut con, &["MEM.ATTRSET", "p", "user_profile", PROFILE]);
    ok(&mut con, &["MEM.ATTRSET", "p", "context", "[1]"]);
    ok(&mut con, &["MEM.APPEND", "p", "user", "hi"]);
    ok(&mut con, &["MEM.ATTRDEL", "p", "context"]);
    let wait = |con: &mut redis::Connection| {
        let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(con).unwrap();
        assert_eq!(n, 1);
    };
    wait(&mut con);
    assert_eq!(digest(&mut rcon, "p"), digest(&mut con, "p"));
    assert_eq!(all(&mut rcon, "p"), all(&mut con, "p"));
    assert_eq!(json_text(&mut rcon, "p"), json_text(&mut con, "p"));
    // A delete that deletes nothing is not replicated.
    let offset = |con: &mut redis::Connection| {
        let info: String = redis::cmd("INFO").arg("replication").query(con).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let before = offset(&mut con);
    assert_eq!(int(&mut con, &["MEM.ATTRDEL", "p", "context"]), 0);
    assert_eq!(offset(&mut con), before);
    // DEBUG RELOAD and DUMP/RESTORE keep them.
    let before = (digest(&mut con, "p"), all(&mut con, "p"));
    ok(&mut con, &["DEBUG", "RELOAD"]);
    assert_eq!((digest(&mut con, "p"), all(&mut con, "p")), before);
    let bytes = dump(&mut con, "p");
    // With an expiry like the source's: DIGEST-VALUE marks whether a key has one.
    let ttl = int(&mut con, &["PTTL", "p"]);
    redis::cmd("RESTORE")
        .arg("q")
        .arg(ttl)
        .arg(bytes)
        .query::<()>(&mut con)
        .unwrap();
    assert_eq!((digest(&mut con, "q"), all(&mut con, "q")), before);
    wait(&mut con);
    assert_eq!(digest(&mut rcon, "q"), before.0);
}

#[test]
fn a_session_holds_a_bounded_number_of_attributes() {
    let server = Server::start();
    let mut con = server.client();
    for i in 0..1024 {
        ok(&mut con, &["MEM.ATTRSET", "k", &format!("a{i}"), "1"]);
    }
    let before = digest(&mut con, "k");
    let e =
        cmd(&mut con, &["MEM.ATTRSET", "k", "one-more", "1"]).expect_err("the 1025th attribute");
    assert!(e.to_string().contains("at most 1024 attributes"), "{e}");
    assert_eq!(digest(&mut con, "k"), before);
    // Replacing one that exists is still fine, as is deleting and adding.
    ok(&mut con, &["MEM.ATTRSET", "k", "a5", "2"]);
    assert_eq!(int(&mut con, &["MEM.ATTRDEL", "k", "a6"]), 1);
    ok(&mut con, &["MEM.ATTRSET", "k", "one-more", "1"]);
}

/// Imported members ATTRDEL cannot name (from the v2 review).
mod imported_members {
    use crate::support::reply::*;
    use crate::support::server::*;

    /// MEM.IMPORT keeps every other member verbatim, including names ATTRSET
    /// would refuse ("" and names over 64 bytes); MEM.ATTRGET lists them, but
    /// MEM.ATTRDEL (and ATTRSET) refuse the name ("ERR attribute name must be 1
    /// to 64 bytes", src/commands/attrs.rs attr_name -> check_attr_name), so an
    /// attribute the session holds can never be removed member by member.
    #[test]
    fn imported_member_attrdel_cannot_remove() {
        let server = Server::start();
        let mut con = server.client();
        let k = "mem:{imp-names}";
        let long = "n".repeat(65);
        // SPEC v3: imported members obey the attribute limits, so a member
        // ATTRSET/ATTRDEL could not name is refused at the import, changing
        // nothing (sessions loaded from earlier releases may still hold one:
        // ATTRDEL takes any stored name).
        for doc in [
            format!(r#"{{"conversation_history":[],"{long}":1}}"#),
            r#"{"conversation_history":[],"":2}"#.to_owned(),
        ] {
            let e = cmd(&mut con, &["MEM.IMPORT", k, &doc]).unwrap_err();
            assert!(e.to_string().contains("1 to 64 bytes"), "{e}");
            assert_eq!(int(&mut con, &["EXISTS", k]), 0);
        }
    }
}

/// The seed's `session:context:{id}` layer (1 h): an attribute with its own
/// lifetime (SPEC v3 MEM.ATTRSET ... EX). Past it, no read returns it
/// (ATTRGET, the map, FORMAT JSON); the key lives at least as long; a SET
/// without EX clears the lifetime; RDB, AOF, replicas, DUMP and FORMAT JSON
/// carry it.
#[test]
fn an_attribute_with_its_own_lifetime_is_never_read_past_it() {
    let mut master = Server::with_args(&[
        "--repl-diskless-sync-delay",
        "0",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ]);
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    ok(&mut con, &["MEM.APPEND", "c", "user", "hi", "TTL", "60"]);
    ok(
        &mut con,
        &["MEM.ATTRSET", "c", "context", r#"{"step":1}"#, "EX", "5"],
    );
    ok(&mut con, &["MEM.ATTRSET", "c", "profile", r#"{"n":"Ann"}"#]);
    ok(&mut con, &["MEM.ATTRSET", "c", "long", "1", "EX", "3600"]);
    assert_eq!(
        get(&mut con, "c", "context").as_deref(),
        Some(r#"{"step":1}"#)
    );
    // The key lives at least as long as its longest attribute.
    assert!(int(&mut con, &["PTTL", "c"]) > 3_500_000);
    let doc: serde_json::Value = serde_json::from_str(&json_text(&mut con, "c")).unwrap();
    assert_eq!(doc["context"]["step"], 1);
    assert!(
        doc["redis_mem"]["attribute_expires"]["context"]
            .as_i64()
            .unwrap()
            > 0
    );
    // FORMAT JSON imports back with the lifetimes.
    let doc = json_text(&mut con, "c");
    ok(&mut con, &["MEM.IMPORT", "c2", &doc]);
    // Persisted and replicated with its expiry.
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).unwrap();
    assert_eq!(n, 1);
    assert_eq!(digest(&mut rcon, "c"), digest(&mut con, "c"));
    let bytes = dump(&mut con, "c");
    redis::cmd("RESTORE")
        .arg("c3")
        .arg(0)
        .arg(bytes)
        .query::<()>(&mut con)
        .unwrap();
    master.restart();
    let mut con = master.client();
    for key in ["c", "c2", "c3"] {
        assert_eq!(
            get(&mut con, key, "context").as_deref(),
            Some(r#"{"step":1}"#),
            "{key}"
        );
    }
    // Past its lifetime: gone from every read, the rest kept.
    poll_until(&mut con, "the context attribute to expire", |c| {
        get(c, "c", "context").is_none()
    });
    for key in ["c", "c2", "c3"] {
        assert_eq!(get(&mut con, key, "context"), None, "{key}");
        let names: Vec<String> = all(&mut con, key).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["profile", "long"], "{key}");
        let doc: serde_json::Value = serde_json::from_str(&json_text(&mut con, key)).unwrap();
        assert!(doc.get("context").is_none(), "{key}: {doc}");
        assert_eq!(int(&mut con, &["MEM.ATTRDEL", key, "context"]), 0);
    }
    // A SET without EX keeps the value for good.
    ok(&mut con, &["MEM.ATTRSET", "c", "long", "2"]);
    let doc: serde_json::Value = serde_json::from_str(&json_text(&mut con, "c")).unwrap();
    assert!(doc["redis_mem"].get("attribute_expires").is_none(), "{doc}");
    // Bad EX values are refused, changing nothing.
    for bad in ["0", "-1", "x", "3153600001"] {
        let e = cmd(&mut con, &["MEM.ATTRSET", "c", "long", "3", "EX", bad]).unwrap_err();
        assert!(e.to_string().contains("EX"), "{bad}: {e}");
    }
    assert_eq!(get(&mut con, "c", "long").as_deref(), Some("2"));
}

/// What the seed's "why did it forget" list asks (SPEC v3 MEM.INFO):
/// messages the caps or MAXAGE removed with no summary, those summaries
/// cover, when the last summary ran, each external id's time left.
#[test]
fn info_says_what_left_the_session_and_how() {
    let mut server = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = server.client();
    for i in 0..5 {
        ok(
            &mut con,
            &["MEM.APPEND", "f", "user", &format!("m{i}"), "MAXMSGS", "3"],
        );
    }
    ok(&mut con, &["MEM.SUMMARIZE", "f", "4", "the first four"]);
    ok(
        &mut con,
        &["MEM.EXTSET", "f", "dify", "conv-1", "EX", "100"],
    );
    let info = as_fields(cmd(&mut con, &["MEM.INFO", "f"]).unwrap());
    let field = |name: &str| int_field(&info, name);
    assert_eq!(field("evicted"), 2, "m0 and m1 left by MAXMSGS 3");
    assert_eq!(field("summarized"), 2, "m2 and m3 under the summary");
    assert!(field("summary_ts") > 1_700_000_000_000);
    let ext = info.iter().find(|(k, _)| k == "external_ttl").unwrap();
    let ext = as_fields(ext.1.clone());
    let left = int_field(&ext, "dify");
    assert!(left > 90_000 && left <= 100_000, "{left}");
    assert_eq!(field("lease_ttl"), 0, "no summarizer at work");
    let begin = as_fields(
        cmd(
            &mut con,
            &[
                "MEM.SUMMARIZE_BEGIN",
                "f",
                "60000",
                "CONTEXT",
                "10",
                "KEEP",
                "0",
            ],
        )
        .unwrap(),
    );
    assert!(int_field(&begin, "lease") > 0, "{begin:?}");
    let info = as_fields(cmd(&mut con, &["MEM.INFO", "f"]).unwrap());
    let lease = int_field(&info, "lease_ttl");
    assert!(lease > 50_000 && lease <= 60_000, "{lease}");
    // Kept across a restart (AOF) and a DEBUG RELOAD (RDB).
    server.restart();
    let mut con = server.client();
    ok(&mut con, &["DEBUG", "RELOAD"]);
    let info = as_fields(cmd(&mut con, &["MEM.INFO", "f"]).unwrap());
    assert_eq!(
        (int_field(&info, "evicted"), int_field(&info, "summarized")),
        (2, 2)
    );
}

/// A summary the caps evict is counted (MEM.INFO `summaries_dropped`): what
/// it covered is gone, and `summary_upto` 0 alone would not say so.
#[test]
fn info_counts_a_summary_the_caps_dropped() {
    let server = Server::start();
    let mut con = server.client();
    for i in 0..5 {
        ok(
            &mut con,
            &[
                "MEM.APPEND",
                "sd",
                "user",
                &format!("message number {i} here"),
            ],
        );
    }
    let long = "a long summary of what was said ".repeat(4);
    ok(&mut con, &["MEM.SUMMARIZE", "sd", "3", &long]);
    ok(
        &mut con,
        &["MEM.APPEND", "sd", "user", "hi", "MAXTOKENS", "30"],
    );
    let info = as_fields(cmd(&mut con, &["MEM.INFO", "sd"]).unwrap());
    assert_eq!(int_field(&info, "summary_upto"), 0, "{info:?}");
    assert_eq!(int_field(&info, "summaries_dropped"), 1, "{info:?}");
    assert_eq!(int_field(&info, "summarized"), 3);
    let doc: serde_json::Value = serde_json::from_str(&json_text(&mut con, "sd")).unwrap();
    assert_eq!(doc["redis_mem"]["summaries_dropped"], 1);
    // Counts above 2^53 - 1 in a document are refused.
    let e = cmd(
        &mut con,
        &[
            "MEM.IMPORT",
            "ie",
            r#"{"conversation_history":[],"redis_mem":{"evicted":18446744073709551615}}"#,
        ],
    )
    .unwrap_err();
    assert!(e.to_string().contains("evicted"), "{e}");
}
