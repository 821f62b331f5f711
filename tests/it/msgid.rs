//! MEM.APPEND ... MSGID against real servers (SPEC §3, v2): a retried append
//! is recognised while its message is held and after it left (trimmed or
//! summarized, among the last 128 msgids that left), is answered as the
//! original was (`duplicate 1`) and changes nothing (no trim, no TTL refresh,
//! no event, no replication); msgids survive DEBUG RELOAD and reach replicas;
//! MEM.GET, FORMAT JSON, MEM.IMPORT and MEM.APPENDBATCH carry them.

use std::time::Duration;

use crate::support::reply::*;
use crate::support::server::*;
use crate::support::session::{info_field, wait_until};

fn msgid_of(con: &mut redis::Connection, key: &str) -> Vec<Option<String>> {
    let v = ok(con, &["MEM.GET", key]);
    let redis::Value::Array(items) = v else {
        panic!("{v:?}")
    };
    items
        .into_iter()
        .map(|it| {
            let f = as_fields(it);
            f.iter()
                .any(|(k, _)| k == "msgid")
                .then(|| str_field(&f, "msgid"))
        })
        .collect()
}

#[test]
fn a_retry_of_a_held_message_changes_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{retry}";
    ok(&mut con, &["CONFIG", "SET", "notify-keyspace-events", "Kd"]);
    let first = append(
        &mut con,
        k,
        "user",
        "Book a table for two.",
        &["MSGID", "turn-1", "TTL", "1000"],
    );
    assert_eq!(names(&first), OUTCOME_FIELDS);
    assert_eq!(int_field(&first, "duplicate"), 0);
    append(
        &mut con,
        k,
        "assistant",
        "Done.",
        &["MSGID", "turn-1/answer"],
    );
    ok(&mut con, &["PEXPIRE", k, "500000"]);
    let before = snap(&mut con, k);
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(format!("__keyspace@0__:{k}")).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // The client timed out and sent it again (with options that would change
    // the session, and even another text): recognised, nothing changes.
    for opts in [
        vec!["MSGID", "turn-1"],
        vec![
            "MSGID", "turn-1", "MAXMSGS", "1", "TTL", "5", "MODEL", "gpt-4",
        ],
    ] {
        let r = append(&mut con, k, "user", "Book a table for two!", &opts);
        assert_eq!(names(&r), OUTCOME_FIELDS);
        assert_eq!(int_field(&r, "id"), 1);
        assert_eq!(int_field(&r, "tokens"), int_field(&first, "tokens"));
        assert_eq!(
            int_field(&r, "total_tokens"),
            int_field(&info(&mut con, k), "total_tokens")
        );
        assert_eq!(
            (
                int_field(&r, "messages"),
                int_field(&r, "trimmed"),
                int_field(&r, "duplicate")
            ),
            (2, 0, 1)
        );
        assert_unchanged(&mut con, k, &before, &format!("retry {opts:?}"));
    }
    assert!(pubsub.get_message().is_err(), "a retry published an event");
    assert_eq!(info_mem(&mut con, "duplicates"), 2);
    assert_eq!(info_mem(&mut con, "appends"), 2);
    // MEM.GET shows the msgids; FORMAT JSON too.
    append(&mut con, k, "user", "no msgid", &[]);
    assert_eq!(
        msgid_of(&mut con, k),
        [
            Some("turn-1".to_owned()),
            Some("turn-1/answer".to_owned()),
            None
        ]
    );
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(
        e[0].keys,
        ["id", "role", "content", "ts", "tokens", "msgid"]
    );
    assert_eq!(e[2].keys, ["id", "role", "content", "ts", "tokens"]);
    let doc = json_doc(&mut con, k);
    assert_eq!(doc["conversation_history"][1]["msgid"], "turn-1/answer");
    assert!(doc["conversation_history"][2].get("msgid").is_none());
    // RESP3 too.
    let mut c3 = server.client_resp3();
    let v = ok(&mut c3, &["MEM.APPEND", k, "user", "x", "MSGID", "turn-1"]);
    assert!(matches!(&v, redis::Value::Map(p) if p.len() == 7), "{v:?}");
}

#[test]
fn a_retry_after_the_message_left_is_still_recognised() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{left}";
    let mut replies = Vec::new();
    for i in 1..=5 {
        replies.push(append(
            &mut con,
            k,
            "user",
            &format!("message {i}"),
            &["MAXMSGS", "3", "MSGID", &format!("m{i}")],
        ));
    }
    // m1, m2 trimmed by the cap.
    assert_eq!(ids(&get(&mut con, &["MEM.GET", k])), [3, 4, 5]);
    let before = snap(&mut con, k);
    let r = append(&mut con, k, "user", "message 1", &["MSGID", "m1"]);
    assert_eq!(
        (
            int_field(&r, "id"),
            int_field(&r, "tokens"),
            int_field(&r, "duplicate")
        ),
        (1, int_field(&replies[0], "tokens"), 1)
    );
    assert_eq!(
        (int_field(&r, "messages"), int_field(&r, "trimmed")),
        (3, 0)
    );
    assert_unchanged(&mut con, k, &before, "retry of a trimmed message");
    // m3 summarized.
    ok(&mut con, &["MEM.SUMMARIZE", k, "3", "the first three"]);
    let r = append(&mut con, k, "user", "message 3", &["MSGID", "m3"]);
    assert_eq!(
        (
            int_field(&r, "id"),
            int_field(&r, "duplicate"),
            int_field(&r, "messages")
        ),
        (3, 1, 2)
    );
    // A new msgid is a new message.
    let r = append(&mut con, k, "user", "message 6", &["MSGID", "m6"]);
    assert_eq!((int_field(&r, "id"), int_field(&r, "duplicate")), (6, 0));

    // The last 128 msgids that left are remembered, older ones are not.
    let k = "mem:{ring}";
    for i in 0..200 {
        append(
            &mut con,
            k,
            "user",
            "x",
            &["MAXMSGS", "1", "MSGID", &format!("r{i}")],
        );
    }
    // r199 held, r71..r198 departed (128), r70 forgotten.
    for (msgid, id, dup) in [("r199", 200, 1), ("r71", 72, 1), ("r70", 201, 0)] {
        let r = append(&mut con, k, "user", "x", &["MSGID", msgid]);
        assert_eq!(
            (int_field(&r, "id"), int_field(&r, "duplicate")),
            (id, dup),
            "{msgid}"
        );
    }
}

#[test]
fn msgid_limits() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{limits}";
    append(&mut con, k, "user", "hi", &[]);
    let longest = "m".repeat(128);
    let r = append(&mut con, k, "user", "ok", &["MSGID", &longest]);
    assert_eq!(int_field(&r, "duplicate"), 0);
    assert_eq!(msgid_of(&mut con, k)[1].as_deref(), Some(longest.as_str()));
    let before = snap(&mut con, k);
    let too_long = "m".repeat(129);
    for (args, needle) in [
        (
            vec!["MEM.APPEND", k, "user", "x", "MSGID", &too_long],
            "msgid must be 1 to 128 bytes",
        ),
        (
            vec!["MEM.APPEND", k, "user", "x", "MSGID", ""],
            "msgid must be 1 to 128 bytes",
        ),
        (vec!["MEM.APPEND", k, "user", "x", "MSGID"], "needs a value"),
        (
            vec!["MEM.APPEND", k, "user", "x", "MSGID", "a", "msgid", "b"],
            "given more than once",
        ),
        // A retry is still checked like a fresh command.
        (
            vec!["MEM.APPEND", k, "user", "x", "MSGID", &longest, "TTL", "-1"],
            "ERR",
        ),
        (vec!["MEM.APPEND", k, "", "x", "MSGID", &longest], "role"),
        (
            vec![
                "MEM.APPENDBATCH",
                k,
                r#"[{"role":"user","content":"x","msgid":""}]"#,
            ],
            "msgid must be 1 to 128 bytes",
        ),
        (
            vec![
                "MEM.APPENDBATCH",
                k,
                r#"[{"role":"user","content":"x","msgid":5}]"#,
            ],
            "ERR messages",
        ),
        (
            vec![
                "MEM.IMPORT",
                "mem:{new}",
                r#"{"conversation_history":[{"role":"user","content":"x","msgid":""}]}"#,
            ],
            "msgid",
        ),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, k, &before, &format!("{args:?}"));
    }
    let e = err_raw(
        &mut con,
        &[
            b"MEM.APPEND",
            k.as_bytes(),
            b"user",
            b"x",
            b"MSGID",
            b"\xff\xfe",
        ],
    );
    assert!(e.contains("MSGID is not valid UTF-8"), "{e}");
    assert_unchanged(&mut con, k, &before, "non-UTF-8 msgid");
    assert_eq!(int(&mut con, &["EXISTS", "mem:{new}"]), 0);
}

#[test]
fn msgids_survive_debug_reload_and_the_aof() {
    // appendfsync always: the restart is a kill -9 (see leases.rs).
    let mut server = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = server.client();
    let k = "mem:{reload}";
    for i in 1..=6 {
        append(
            &mut con,
            k,
            "user",
            &format!("message {i}"),
            &["MAXMSGS", "3", "MSGID", &format!("m{i}")],
        );
    }
    ok(&mut con, &["MEM.SUMMARIZE", k, "4", "summary"]);
    let probe = |con: &mut redis::Connection, what: &str| {
        // m1-m3 trimmed, m4 summarized, m5-m6 held.
        for (msgid, id) in [("m1", 1), ("m4", 4), ("m6", 6)] {
            let r = append(con, k, "user", "again", &["MSGID", msgid]);
            assert_eq!(
                (int_field(&r, "id"), int_field(&r, "duplicate")),
                (id, 1),
                "{what}: {msgid}"
            );
        }
    };
    probe(&mut con, "before");
    let digest_before = digest(&mut con, k);
    ok(&mut con, &["DEBUG", "RELOAD"]);
    assert_eq!(digest(&mut con, k), digest_before);
    probe(&mut con, "after DEBUG RELOAD");
    server.restart();
    let mut con = server.client();
    assert_eq!(digest(&mut con, k), digest_before);
    probe(&mut con, "after an AOF load");
}

#[test]
fn msgids_reach_replicas_and_a_retry_replicates_nothing() {
    let master = Server::with_args(&["--repl-diskless-sync-delay", "0"]);
    let replica = Server::with_args(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let mut r = replica.client();
    wait_until("link up", 60, || {
        info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    let mut m = master.client();
    let k = "mem:{repl}";
    for i in 1..=5 {
        append(
            &mut m,
            k,
            "user",
            &format!("message {i}"),
            &["MAXMSGS", "3", "MSGID", &format!("m{i}")],
        );
    }
    ok(
        &mut m,
        &[
            "MEM.APPENDBATCH",
            k,
            r#"[{"role":"user","content":"b1","msgid":"b1"},{"role":"user","content":"b2"}]"#,
        ],
    );
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(n, 1);
    assert_eq!(digest(&mut r, k), digest(&mut m, k));
    assert_eq!(
        msgid_of(&mut r, k),
        [Some("m5".to_owned()), Some("b1".to_owned()), None]
    );
    // Retries replicate nothing: the replication offset does not move.
    let offset = || info_field(&mut master.client(), "replication", "master_repl_offset").unwrap();
    let before = offset();
    for msgid in ["m1", "m5", "b1"] {
        assert_eq!(
            int_field(
                &append(&mut m, k, "user", "again", &["MSGID", msgid]),
                "duplicate"
            ),
            1
        );
    }
    ok(
        &mut m,
        &[
            "MEM.APPENDBATCH",
            k,
            r#"[{"role":"user","content":"again","msgid":"m2"}]"#,
        ],
    );
    assert_eq!(offset(), before, "a retry was replicated");
    // Promoted, the replica recognises them too (held and departed).
    ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
    for (msgid, id) in [("m1", 1), ("m4", 4), ("m5", 5), ("b1", 6)] {
        let reply = append(&mut r, k, "user", "again", &["MSGID", msgid]);
        assert_eq!(
            (int_field(&reply, "id"), int_field(&reply, "duplicate")),
            (id, 1),
            "{msgid} on the promoted replica"
        );
    }
}

#[test]
fn appendbatch_items_and_imports_carry_msgids() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{batch}";
    let batch = r#"[{"role":"user","content":"q","msgid":"u1"},{"role":"assistant","content":"a","msgid":"a1"}]"#;
    let v = ok(&mut con, &["MEM.APPENDBATCH", k, batch]);
    let redis::Value::Array(first) = v else {
        panic!()
    };
    let first: Vec<_> = first.into_iter().map(as_fields).collect();
    assert_eq!(
        first
            .iter()
            .map(|f| (int_field(f, "id"), int_field(f, "duplicate")))
            .collect::<Vec<_>>(),
        [(1, 0), (2, 0)]
    );
    // The whole batch retried: nothing changes.
    let before = snap(&mut con, k);
    let v = ok(&mut con, &["MEM.APPENDBATCH", k, batch, "MAXMSGS", "1"]);
    let redis::Value::Array(again) = v else {
        panic!()
    };
    for (f, orig) in again.into_iter().map(as_fields).zip(&first) {
        assert_eq!(names(&f), OUTCOME_FIELDS);
        assert_eq!(
            (
                int_field(&f, "id"),
                int_field(&f, "tokens"),
                int_field(&f, "duplicate")
            ),
            (int_field(orig, "id"), int_field(orig, "tokens"), 1)
        );
    }
    assert_unchanged(&mut con, k, &before, "a batch retried whole");
    // Partly new: the new ones are appended; a msgid repeated within the
    // batch names its first message.
    let mixed = r#"[{"role":"user","content":"q","msgid":"u1"},{"role":"user","content":"new","msgid":"u2"},{"role":"user","content":"new again","msgid":"u2"},{"role":"user","content":"plain"}]"#;
    let v = ok(&mut con, &["MEM.APPENDBATCH", k, mixed]);
    let redis::Value::Array(items) = v else {
        panic!()
    };
    let got: Vec<_> = items
        .into_iter()
        .map(as_fields)
        .map(|f| {
            (
                int_field(&f, "id"),
                int_field(&f, "duplicate"),
                int_field(&f, "messages"),
            )
        })
        .collect();
    assert_eq!(got, [(1, 1, 2), (3, 0, 3), (3, 1, 3), (4, 0, 4)]);
    assert_eq!(
        msgid_of(&mut con, k),
        [
            Some("u1".to_owned()),
            Some("a1".to_owned()),
            Some("u2".to_owned()),
            None
        ]
    );
    // FORMAT JSON -> MEM.IMPORT keeps them: a retry on the copy is recognised.
    let doc = json_text(&mut con, k);
    ok(&mut con, &["MEM.IMPORT", "mem:{copy}", &doc]);
    let r = append(&mut con, "mem:{copy}", "user", "q", &["MSGID", "u2"]);
    assert_eq!((int_field(&r, "id"), int_field(&r, "duplicate")), (3, 1));
    let imported = map_reply(&mut con, &["MEM.IMPORT", "mem:{copy}", &doc, "REPLACE"]);
    assert_eq!(int_field(&imported, "duplicate"), 0);
    let dup_doc = r#"{"conversation_history":[{"role":"user","content":"a","msgid":"x"},{"role":"user","content":"b","msgid":"x"}]}"#;
    assert_err(
        &mut con,
        &["MEM.IMPORT", "mem:{dup}", dup_doc],
        "already the msgid of an earlier message",
    );
}

/// A batch answers each message as consecutive MEM.APPENDs would: whether
/// a message is a retry is settled when its turn comes. An earlier message
/// of the batch may evict the one a msgid names and push that msgid out of
/// the last 128 that left (hostile pass 52: the batch looked every msgid up
/// before it ran, so a message whose msgid had just been forgotten was
/// answered `duplicate 1` and dropped). Compared with the same messages
/// sent one by one to another key, on the master and on a replica.
#[test]
fn a_batch_settles_each_retry_when_its_turn_comes() {
    let master = Server::start();
    let replica = Server::start();
    let mut con = master.client();
    let mut rcon = replica.client();
    ok(
        &mut rcon,
        &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
    );
    let outcome = |f: Vec<(String, redis::Value)>| {
        (
            int_field(&f, "id"),
            int_field(&f, "duplicate"),
            int_field(&f, "messages"),
            int_field(&f, "trimmed"),
        )
    };
    // Case 1: 128 departed msgids m0..m127 and m128 held; the batch's first
    // message evicts m128, which pushes m0 out; m0 is then new. Case 2: the
    // batch's own "x" leaves, 128 more follow it out, and "x" comes again.
    let held_first: Vec<(String, String)> = (0..=128)
        .map(|i| (format!("m{i}"), format!("msg {i}")))
        .collect();
    let case1: Vec<(String, String)> = vec![
        ("new1".to_owned(), "new".to_owned()),
        ("m0".to_owned(), "retry of m0?".to_owned()),
        ("m128".to_owned(), "m128 left, remembered".to_owned()),
    ];
    let mut case2: Vec<(String, String)> = vec![("x".to_owned(), "first x".to_owned())];
    case2.extend((0..129).map(|i| (format!("y{i}"), format!("y {i}"))));
    case2.push(("x".to_owned(), "x again".to_owned()));
    case2.push(("y128".to_owned(), "y128 held".to_owned()));
    for (name, setup, batch) in [
        ("case1", &held_first[..], &case1),
        ("case2", &[][..], &case2),
    ] {
        let (by_batch, one_by_one) = (format!("mem:{{{name}}}b"), format!("mem:{{{name}}}a"));
        for k in [&by_batch, &one_by_one] {
            for (msgid, content) in setup {
                append(
                    &mut con,
                    k,
                    "user",
                    content,
                    &["TOKENS", "1", "MSGID", msgid, "MAXMSGS", "1"],
                );
            }
        }
        let items: Vec<String> = batch
            .iter()
            .map(|(msgid, content)| {
                format!(r#"{{"role":"user","content":"{content}","msgid":"{msgid}","tokens":1}}"#)
            })
            .collect();
        let v = ok(
            &mut con,
            &[
                "MEM.APPENDBATCH",
                &by_batch,
                &format!("[{}]", items.join(",")),
                "MAXMSGS",
                "1",
            ],
        );
        let redis::Value::Array(replies) = v else {
            panic!("{v:?}")
        };
        let got: Vec<_> = replies.into_iter().map(as_fields).map(outcome).collect();
        let want: Vec<_> = batch
            .iter()
            .map(|(msgid, content)| {
                outcome(append(
                    &mut con,
                    &one_by_one,
                    "user",
                    content,
                    &["TOKENS", "1", "MSGID", msgid, "MAXMSGS", "1"],
                ))
            })
            .collect();
        assert_eq!(got, want, "{name}");
        // The same messages (their times are each write's own).
        let held = |con: &mut redis::Connection, k: &str| {
            let redis::Value::Array(items) = ok(con, &["MEM.GET", k]) else {
                panic!()
            };
            items
                .into_iter()
                .map(|m| {
                    let mut f = as_fields(m);
                    f.retain(|(name, _)| name != "ts");
                    f
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            held(&mut con, &by_batch),
            held(&mut con, &one_by_one),
            "{name}"
        );
        let dups = got.iter().filter(|o| o.1 == 1).count();
        assert_eq!(dups, 1, "{name}: only the last message is a retry");
        // The replica applied the batch's ops: the same session.
        let master_view = ok(&mut con, &["MEM.GET", &by_batch]);
        wait_until("the replica's copy of the batch", 10, || {
            redis::cmd("MEM.GET")
                .arg(&by_batch)
                .query::<redis::Value>(&mut rcon)
                .is_ok_and(|v| v == master_view)
        });
    }
}

/// A case: its name, the appends before it, the batch's items (content,
/// msgid, ts) and the batch's options.
type Case<'a> = (
    &'a str,
    Vec<Vec<&'a str>>,
    Vec<(&'a str, &'a str, Option<&'a str>)>,
    Vec<&'a str>,
);

/// A retry in a batch that also appends is answered as MEM.APPEND answers
/// it (hostile pass 53): before a MODEL switch the batch makes, with the
/// session's own caps for `summarize`, and with the totals reads show
/// (messages past MAXAGE left out).
#[test]
fn a_retry_in_a_batch_is_answered_as_mem_append_answers_it() {
    let server = Server::start();
    let mut con = server.client();
    let text = "héllo wörld, ünïcode text 日本語のテキスト";
    let cases: [Case; 3] = [
        (
            "model switch",
            vec![vec!["user", text, "MSGID", "m1", "MODEL", "gpt-4o"]],
            vec![(text, "m1", None), ("y", "m2", None)],
            vec!["MODEL", "gpt-4"],
        ),
        (
            "new caps",
            vec![
                vec!["user", "one", "MSGID", "m1"],
                vec!["user", "two", "MSGID", "m2"],
                vec!["user", "three", "MSGID", "m3"],
            ],
            vec![("one", "m1", None), ("x", "m4", None)],
            vec!["MAXMSGS", "3"],
        ),
        (
            "maxage",
            vec![],
            vec![("hi", "a", Some("1000")), ("hi", "a", None)],
            vec!["MAXAGE", "100"],
        ),
    ];
    for (n, (name, setup, items, opts)) in cases.into_iter().enumerate() {
        let (by_batch, one_by_one) = (format!("mem:{{r{n}}}b"), format!("mem:{{r{n}}}a"));
        for k in [&by_batch, &one_by_one] {
            for args in &setup {
                append(&mut con, k, args[0], args[1], &args[2..]);
            }
        }
        let json: Vec<String> = items
            .iter()
            .map(|(content, msgid, ts)| {
                let ts = ts.map(|t| format!(r#","ts":{t}"#)).unwrap_or_default();
                format!(r#"{{"role":"user","content":"{content}","msgid":"{msgid}"{ts}}}"#)
            })
            .collect();
        let json = format!("[{}]", json.join(","));
        let mut args = vec!["MEM.APPENDBATCH", by_batch.as_str(), json.as_str()];
        args.extend_from_slice(&opts);
        let redis::Value::Array(replies) = ok(&mut con, &args) else {
            panic!("{name}")
        };
        let got: Vec<_> = replies.into_iter().map(as_fields).collect();
        for (i, (content, msgid, ts)) in items.iter().enumerate() {
            let mut item_opts = vec!["MSGID", msgid];
            if let Some(ts) = ts {
                item_opts.extend_from_slice(&["TS", ts]);
            }
            item_opts.extend_from_slice(&opts);
            let want = append(&mut con, &one_by_one, "user", content, &item_opts);
            let pick = |f: &[(String, redis::Value)]| {
                OUTCOME_FIELDS
                    .iter()
                    .map(|name| int_field(f, name))
                    .collect::<Vec<_>>()
            };
            assert_eq!(pick(&got[i]), pick(&want), "{name}: item {i}");
        }
    }
}

/// A large append is counted on the pool while the client waits: a retry
/// sent meanwhile (another connection, the first one timed out) is counted
/// too, and the second to come back finds the first's message: stored once.
/// A retry after it landed is answered without counting anything.
#[test]
fn a_retried_large_append_is_stored_once() {
    let server = Server::start();
    let mut con = server.client();
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "1024"],
    );
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "300"],
    );
    let k = "mem:{large}";
    let content = "a long answer. ".repeat(660);
    let counted_before = info_mem(&mut con, "counts_off_thread");
    let sends: Vec<_> = (0..2)
        .map(|i| {
            let (mut c, content) = (server.client(), content.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(i * 50));
                append(
                    &mut c,
                    k,
                    "assistant",
                    &content,
                    &["MSGID", "call-7/result"],
                )
            })
        })
        .collect();
    let replies: Vec<_> = sends.into_iter().map(|t| t.join().unwrap()).collect();
    let dups: Vec<i64> = replies.iter().map(|r| int_field(r, "duplicate")).collect();
    assert_eq!(dups, [0, 1], "one stored, one recognised");
    assert_eq!(int_field(&replies[0], "id"), int_field(&replies[1], "id"));
    assert_eq!(
        int_field(&replies[0], "tokens"),
        int_field(&replies[1], "tokens")
    );
    assert_eq!(
        int_field(&replies[1], "tokens"),
        mt_o("assistant", &content)
    );
    assert_eq!(int_field(&info(&mut con, k), "messages"), 1);
    assert_eq!(info_mem(&mut con, "counts_off_thread"), counted_before + 2);
    // Retried after it landed: recognised before anything is counted.
    let before = snap(&mut con, k);
    let r = append(
        &mut con,
        k,
        "assistant",
        &content,
        &["MSGID", "call-7/result"],
    );
    assert_eq!((int_field(&r, "id"), int_field(&r, "duplicate")), (1, 1));
    assert_eq!(
        info_mem(&mut con, "counts_off_thread"),
        counted_before + 2,
        "the retry was counted"
    );
    assert_unchanged(&mut con, k, &before, "a retried large append");
}

/// Retries against a replica: nothing replicated, no TTL change (from the
/// v2 review).
mod replica_retries {
    use crate::support::reply::*;
    use crate::support::server::*;
    use crate::support::session;

    fn offset(con: &mut redis::Connection) -> i64 {
        session::info_field(con, "replication", "master_repl_offset")
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn retries_replicate_nothing() {
        let master = Server::start();
        let mut con = master.client();
        let (_r, mut rcon) = start_replica(&master);
        let k = "mem:{rr}";
        ok(
            &mut con,
            &[
                "MEM.APPENDBATCH",
                k,
                r#"[{"role":"user","content":"a","msgid":"x"},{"role":"tool","content":"b","msgid":"y"}]"#,
                "MAXAGE",
                "100",
            ],
        );
        ok(&mut con, &["MEM.APPEND", k, "user", "c", "MSGID", "z"]);
        ok(&mut con, &["PEXPIRE", k, "500000"]);
        std::thread::sleep(std::time::Duration::from_millis(200));
        let before = offset(&mut con);
        let pttl = session::pttl(&mut con, k);
        for _ in 0..5 {
            ok(
                &mut con,
                &[
                    "MEM.APPENDBATCH",
                    k,
                    r#"[{"role":"user","content":"a","msgid":"x"},{"role":"tool","content":"b","msgid":"y"}]"#,
                    "TTL",
                    "5",
                ],
            );
            ok(
                &mut con,
                &["MEM.APPEND", k, "user", "c", "MSGID", "z", "MAXMSGS", "1"],
            );
        }
        assert_eq!(offset(&mut con), before, "a retry was replicated");
        assert!((session::pttl(&mut con, k) - pttl).abs() < 1000);
        // The replica has applied the first writes (on a loaded machine the
        // 200 ms above may not be enough); WAIT only after the offset check,
        // as its GETACK moves the offset.
        ok(&mut con, &["WAIT", "1", "5000"]);
        assert_eq!(session::digest(&mut con, k), session::digest(&mut rcon, k));
    }
}
