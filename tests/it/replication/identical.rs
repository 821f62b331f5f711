//! Replication: after every kind of write (with config changed on the master
//! only), a replica's sessions are identical to the master's (DEBUG
//! DIGEST-VALUE, MEM.GET FORMAT JSON, PTTL), it serves the read commands,
//! refuses writes, and ends identical after a full resync.

use redis::Value;

use crate::support::server::*;
use crate::support::session::*;
// support::server and support::session both have a wait_until; this file
// uses session's (what, secs, cond).
use crate::support::session::wait_until;

fn wait_link_up(replica: &Server) {
    let mut con = replica.client();
    wait_until("master_link_status:up", 60, || {
        info_field(&mut con, "replication", "master_link_status").as_deref() == Some("up")
    });
}

fn start_pair() -> (Server, Server) {
    let master = Server::with_args(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port.to_string();
    let replica = Server::with_args(&["--replicaof", "127.0.0.1", &port]);
    wait_link_up(&replica);
    (master, replica)
}

fn wait_replica(master: &mut redis::Connection) {
    // WAIT counts up to this connection's last write: make sure it has one.
    ok(master, &["INCR", "relkit:wait"]);
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(master).unwrap();
    assert_eq!(n, 1, "WAIT 1 5000: the replica did not acknowledge");
}

/// Compares every key on master and replica; returns the number compared.
fn compare(
    master: &mut redis::Connection,
    replica: &mut redis::Connection,
    keys: &[String],
    what: &str,
) -> usize {
    wait_replica(master);
    for key in keys {
        let m = snap(master, key);
        let r = snap(replica, key);
        assert_same(&m, &r, &format!("replica after {what}"), 1000);
        assert_ne!(m.pttl, -2, "{what}: {key} missing on the master");
    }
    keys.len()
}

fn add(keys: &mut Vec<String>, key: &str) -> String {
    if !keys.iter().any(|k| k == key) {
        keys.push(key.to_owned());
    }
    key.to_owned()
}

#[test]
fn replica_is_identical_after_every_write() {
    let (master, mut replica) = start_pair();
    let mut m = master.client();
    let mut r = replica.client();
    let mut keys: Vec<String> = Vec::new();
    let mut compared = 0;

    // Appends without TS: the master's clock must reach the replica.
    let a = add(&mut keys, "mem:{rep}:a");
    for i in 0..5 {
        ok(&mut m, &["MEM.APPEND", &a, "user", &format!("no TS {i}")]);
    }
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &a,
            "assistant",
            "with TS",
            "TS",
            "1700000000123",
        ],
    );
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &a,
            "assistant",
            "",
            "META",
            r#"{"tool_calls":[{"id":"x"}]}"#,
        ],
    );
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &a,
            "tool",
            "result",
            "META",
            r#"{"tool_call_id":"x"}"#,
        ],
    );
    compared += compare(&mut m, &mut r, &keys, "appends");

    // Config changed on the master only: the replica must not use its own.
    ok(&mut m, &["CONFIG", "SET", "mem.max-messages", "4"]);
    let b = add(&mut keys, "mem:{rep}:b");
    for i in 0..10 {
        ok(
            &mut m,
            &[
                "MEM.APPEND",
                &b,
                "user",
                &format!("trimmed by the master's config {i}"),
            ],
        );
    }
    compared += compare(&mut m, &mut r, &keys, "CONFIG SET mem.max-messages");
    ok(&mut m, &["CONFIG", "SET", "mem.default-model", "gpt-4"]);
    let c = add(&mut keys, "mem:{rep}:c");
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &c,
            "user",
            "default model gpt-4 (cl100k) on the master",
        ],
    );
    compared += compare(&mut m, &mut r, &keys, "CONFIG SET mem.default-model");
    ok(
        &mut m,
        &["CONFIG", "SET", "mem.default-encoding", "cl100k_base"],
    );
    let d = add(&mut keys, "mem:{rep}:d");
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &d,
            "user",
            "claude counted with the master's default encoding",
            "MODEL",
            "claude-3-5-sonnet",
        ],
    );
    ok(
        &mut m,
        &["MEM.APPEND", &d, "assistant", "héllo wörld ✓ 你好"],
    );
    compared += compare(&mut m, &mut r, &keys, "CONFIG SET mem.default-encoding");
    ok(&mut m, &["CONFIG", "SET", "mem.ttl", "77"]);
    let e = add(&mut keys, "mem:{rep}:e");
    ok(
        &mut m,
        &["MEM.APPEND", &e, "user", "ttl from the master's config"],
    );
    compared += compare(&mut m, &mut r, &keys, "CONFIG SET mem.ttl");
    for (name, value) in [
        ("mem.max-messages", "30"),
        ("mem.default-model", "gpt-4o"),
        ("mem.default-encoding", "o200k_base"),
        ("mem.ttl", "86400"),
    ] {
        ok(&mut m, &["CONFIG", "SET", name, value]);
    }
    // The replica's own config differs from the master's now-restored one.
    ok(&mut r, &["CONFIG", "SET", "mem.max-messages", "2"]);
    ok(
        &mut r,
        &["CONFIG", "SET", "mem.default-model", "gpt-3.5-turbo"],
    );
    ok(&mut r, &["CONFIG", "SET", "mem.ttl", "5"]);
    let f = add(&mut keys, "mem:{rep}:f");
    for i in 0..6 {
        ok(
            &mut m,
            &[
                "MEM.APPEND",
                &f,
                "user",
                &format!("replica config must not matter {i}"),
            ],
        );
    }
    compared += compare(&mut m, &mut r, &keys, "config changed on the replica only");

    // MODEL switching the tokenizer re-counts (gpt-4o -> gpt-4 -> gpt-4o).
    ok(
        &mut m,
        &["MEM.APPEND", &a, "user", "now gpt-4", "MODEL", "gpt-4"],
    );
    compared += compare(&mut m, &mut r, &keys, "MODEL gpt-4o -> gpt-4");
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &a,
            "user",
            "same tokenizer",
            "MODEL",
            "gpt-4-turbo",
        ],
    );
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &a,
            "user",
            "back to o200k",
            "MODEL",
            "gpt-4o-mini",
        ],
    );
    compared += compare(&mut m, &mut r, &keys, "MODEL gpt-4 -> gpt-4o-mini");

    // Trimming: lowering caps, tool messages going with their call.
    let t = add(&mut keys, "mem:{rep}:trim");
    for i in 0..20 {
        let role = ["user", "assistant", "tool", "tool"][i % 4];
        ok(
            &mut m,
            &[
                "MEM.APPEND",
                &t,
                role,
                &format!("turn {i} {}", "lorem ipsum ".repeat(i)),
            ],
        );
    }
    ok(
        &mut m,
        &["MEM.APPEND", &t, "user", "lower the cap", "MAXMSGS", "7"],
    );
    compared += compare(&mut m, &mut r, &keys, "MAXMSGS trimming");
    ok(
        &mut m,
        &["MEM.APPEND", &t, "user", "lower tokens", "MAXTOKENS", "60"],
    );
    compared += compare(&mut m, &mut r, &keys, "MAXTOKENS trimming");

    // SUMMARIZE, then an append that evicts around the summary.
    let s = add(&mut keys, "mem:{rep}:sum");
    for i in 0..14 {
        ok(
            &mut m,
            &["MEM.APPEND", &s, "user", &format!("to be summarized {i}")],
        );
    }
    let check = as_fields(ok(&mut m, &["MEM.SUMMARIZE_CHECK", &s]));
    let upto = int_field(&check, "upto").to_string();
    ok(
        &mut m,
        &["MEM.SUMMARIZE", &s, &upto, "Summary of the first turns."],
    );
    compared += compare(&mut m, &mut r, &keys, "SUMMARIZE");
    ok(&mut m, &["MEM.APPEND", &s, "user", "after summary"]);
    let check = as_fields(ok(&mut m, &["MEM.SUMMARIZE_CHECK", &s, "KEEP", "1"]));
    let upto = int_field(&check, "upto").to_string();
    ok(
        &mut m,
        &[
            "MEM.SUMMARIZE",
            &s,
            &upto,
            "A second, longer summary replacing the first.",
        ],
    );
    ok(
        &mut m,
        &["MEM.APPEND", &s, "user", "tight cap", "MAXTOKENS", "40"],
    );
    compared += compare(&mut m, &mut r, &keys, "second SUMMARIZE + MAXTOKENS");

    // EXTSET: new key, existing key, TTL 0 key, EX beyond the TTL.
    let x = add(&mut keys, "mem:{rep}:ext");
    ok(&mut m, &["MEM.EXTSET", &x, "dify", "conv-1"]);
    ok(&mut m, &["MEM.EXTSET", &a, "n8n", "exec-1", "EX", "500000"]);
    let z = add(&mut keys, "mem:{rep}:ttl0");
    ok(&mut m, &["MEM.APPEND", &z, "user", "no expiry", "TTL", "0"]);
    ok(&mut m, &["MEM.EXTSET", &z, "dify", "conv-z", "EX", "10"]);
    ok(&mut m, &["MEM.EXTSET", &x, "dify", "conv-1b", "EX", "30"]);
    compared += compare(&mut m, &mut r, &keys, "EXTSET");

    // IMPORT, both shapes, with REPLACE / MODEL / TTL.
    let i1 = add(&mut keys, "mem:{rep}:imp1");
    let client_doc = r#"{"conversation_history":[{"role":"user","content":"old app","timestamp":"2024-01-02T03:04:05"},{"role":"assistant","content":"reply","timestamp":"2024-01-02T03:04:06+02:00"}],"user_profile":{"name":"Bo"},"context":{"k":[1,{"x":null}]}}"#;
    ok(&mut m, &["MEM.IMPORT", &i1, client_doc]);
    let i2 = add(&mut keys, "mem:{rep}:imp2");
    let exported = json_text(&mut m, &s);
    ok(
        &mut m,
        &["MEM.IMPORT", &i2, &exported, "MODEL", "gpt-4", "TTL", "0"],
    );
    let exported_a = json_text(&mut m, &a);
    ok(
        &mut m,
        &["MEM.IMPORT", &i1, &exported_a, "REPLACE", "TTL", "1234"],
    );
    compared += compare(&mut m, &mut r, &keys, "IMPORT");

    // Large content (counted off the main thread above the async threshold),
    // the largest TTL (100 years; a larger one is refused).
    let big = add(&mut keys, "mem:{rep}:big");
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &big,
            "user",
            &"a long document, ".repeat(6000),
        ],
    );
    assert!(cmd(
        &mut m,
        &[
            "MEM.APPEND",
            &big,
            "user",
            "huge ttl",
            "TTL",
            "9000000000000"
        ]
    )
    .is_err());
    ok(
        &mut m,
        &["MEM.APPEND", &big, "user", "huge ttl", "TTL", "3153600000"],
    );
    compared += compare(&mut m, &mut r, &keys, "large content and huge TTL");

    // The replica serves the read commands with the master's answers.
    for key in &keys {
        for args in [
            vec!["MEM.GET", key.as_str()],
            vec!["MEM.GET", key, "LAST", "2"],
            vec!["MEM.GET", key, "BUDGET", "50"],
            vec!["MEM.INFO", key],
            vec!["MEM.SUMMARIZE_CHECK", key],
            vec!["MEM.SUMMARIZE_CHECK", key, "MODEL", "gpt-4.1", "KEEP", "3"],
            vec!["MEM.EXTGET", key, "dify"],
        ] {
            if args[0] == "MEM.INFO" {
                // Its times left count down between the two reads.
                assert_eq!(
                    crate::support::reply::info(&mut m, key),
                    crate::support::reply::info(&mut r, key),
                    "MEM.INFO differs on the replica"
                );
                continue;
            }
            let mv = cmd(&mut m, &args).unwrap();
            let rv = cmd(&mut r, &args).unwrap();
            assert_eq!(mv, rv, "{args:?} differs on the replica");
        }
        check_consistent(&mut r, key);
    }

    // Writes are refused on the replica.
    let payload = op_append(
        1,
        &default_psettings(),
        &PMessage {
            id: 99,
            role: b"user",
            content: b"x",
            ts: 1,
            tokens: 5,
            meta: None,
        },
    );
    let mut refused = 0;
    for args in [
        vec!["MEM.APPEND", a.as_str(), "user", "x"],
        vec!["MEM.SUMMARIZE", &a, "1", "x"],
        vec!["MEM.EXTSET", &a, "s", "x"],
        vec![
            "MEM.IMPORT",
            "mem:{rep}:new",
            r#"{"conversation_history":[]}"#,
        ],
    ] {
        let e = cmd(&mut r, &args).unwrap_err();
        assert!(
            e.kind() == redis::ErrorKind::ReadOnly || e.code() == Some("READONLY"),
            "{args:?} on the replica: {e}"
        );
        refused += 1;
    }
    for name in ["MEM._APPLY", "MEM._PUT"] {
        let e = redis::cmd(name)
            .arg(&a)
            .arg(&payload)
            .query::<Value>(&mut r)
            .unwrap_err();
        assert!(
            e.kind() == redis::ErrorKind::ReadOnly || e.code() == Some("READONLY"),
            "{name} on the replica: {e}"
        );
        refused += 1;
    }
    compared += compare(&mut m, &mut r, &keys, "refused writes");

    // Full resync: more writes, then the replica restarts empty.
    for i in 0..10 {
        ok(
            &mut m,
            &[
                "MEM.APPEND",
                &a,
                "user",
                &format!("while the replica restarts {i}"),
            ],
        );
    }
    let full_before: i64 = info_field(&mut m, "stats", "sync_full")
        .unwrap()
        .parse()
        .unwrap();
    drop(r);
    replica.kill9();
    // Without its RDB the restarted replica cannot resume: a full sync.
    let _ = std::fs::remove_file(replica.dir.join("dump.rdb"));
    let late = add(&mut keys, "mem:{rep}:late");
    ok(
        &mut m,
        &[
            "MEM.APPEND",
            &late,
            "user",
            "written while the replica is down",
        ],
    );
    let upto_a =
        int_field(&as_fields(ok(&mut m, &["MEM.SUMMARIZE_CHECK", &a])), "upto").to_string();
    ok(&mut m, &["MEM.SUMMARIZE", &a, &upto_a, "resync summary"]);
    replica.restart();
    wait_link_up(&replica);
    let mut r = replica.client();
    compared += compare(&mut m, &mut r, &keys, "replica restart (full sync)");
    let full_after: i64 = info_field(&mut m, "stats", "sync_full")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        full_after > full_before,
        "the replica restart did not do a full sync"
    );

    // REPLICAOF NO ONE, writes on the master, REPLICAOF again.
    ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
    ok(
        &mut r,
        &["MEM.APPEND", &a, "user", "written on the detached replica"],
    );
    ok(
        &mut m,
        &["MEM.APPEND", &a, "user", "written on the master meanwhile"],
    );
    ok(&mut m, &["MEM.EXTSET", &late, "dify", "late-conv"]);
    ok(
        &mut r,
        &["REPLICAOF", "127.0.0.1", &master.port.to_string()],
    );
    wait_link_up(&replica);
    compared += compare(&mut m, &mut r, &keys, "REPLICAOF NO ONE + REPLICAOF");
    let full_final: i64 = info_field(&mut m, "stats", "sync_full")
        .unwrap()
        .parse()
        .unwrap();

    println!(
        "replication: {} sessions, {compared} replica digests compared (all equal), {refused} writes refused READONLY, \
         full syncs {full_before} -> {full_final}",
        keys.len()
    );
}

/// Many writes in a row without WAIT between them, from several clients:
/// the replica ends identical.
#[test]
fn replica_is_identical_after_concurrent_writes() {
    let (master, replica) = start_pair();
    let mut handles = Vec::new();
    for t in 0..4 {
        let mut con = master.client();
        handles.push(std::thread::spawn(move || {
            for i in 0..300 {
                let key = format!("mem:{{repc}}:{}", i % 3);
                let opts: Vec<String> = match i % 50 {
                    7 => vec!["MODEL".into(), "gpt-4".into()],
                    8 => vec!["MODEL".into(), "gpt-4o".into()],
                    9 => vec!["MAXMSGS".into(), "20".into()],
                    _ => vec![],
                };
                let mut args = vec![
                    "MEM.APPEND".to_owned(),
                    key.clone(),
                    "user".into(),
                    format!("c{t} m{i}"),
                ];
                args.extend(opts);
                let refs: Vec<&str> = args.iter().map(String::as_str).collect();
                ok(&mut con, &refs);
                if i % 40 == 39 {
                    let check = as_fields(ok(&mut con, &["MEM.SUMMARIZE_CHECK", &key]));
                    let upto = int_field(&check, "upto");
                    if upto > 0 {
                        // Another client may have summarized it already.
                        let _ = cmd(
                            &mut con,
                            &[
                                "MEM.SUMMARIZE",
                                &key,
                                &upto.to_string(),
                                &format!("s{t}{i}"),
                            ],
                        );
                    }
                }
                if i % 25 == 0 {
                    ok(
                        &mut con,
                        &["MEM.EXTSET", &key, &format!("sys{t}"), &format!("id{i}")],
                    );
                }
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let mut m = master.client();
    let mut r = replica.client();
    let keys: Vec<String> = (0..3).map(|i| format!("mem:{{repc}}:{i}")).collect();
    let n = compare(&mut m, &mut r, &keys, "concurrent writes");
    for k in &keys {
        check_consistent(&mut r, k);
    }
    println!("replication/concurrent: {n} replica digests compared (all equal)");
}
