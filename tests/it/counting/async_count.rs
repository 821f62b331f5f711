//! The large-content path: contents of `mem.async-threshold-bytes` or more are
//! checked and counted on a worker thread while the client is blocked. These
//! tests prove it gives the same session as inline counting, keeps each
//! client's order, replicates identically, falls back to inline counting where
//! a client cannot block (MULTI, Lua), and survives a client that leaves.
//! Correctness only: timing belongs to `make bench`.

use crate::support::server::*;
use crate::support::session;
use redis::Value;

fn o200(s: &str) -> i64 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(s).len() as i64
}

fn text(bytes: usize, seed: usize) -> String {
    varied_text(bytes, seed)
}

fn ids_and_tokens(con: &mut redis::Connection, key: &str) -> Vec<(i64, i64)> {
    let doc: serde_json::Value =
        serde_json::from_str(&session::json_text(con, key)).expect("FORMAT JSON");
    doc["conversation_history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|m| (m["id"].as_i64().unwrap(), m["tokens"].as_i64().unwrap()))
        .collect()
}

#[test]
fn large_contents_count_exactly_and_keep_a_clients_order() {
    let server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "1000"],
    )
    .unwrap();
    // One pipeline: large, small, large, small. Replies and ids must come
    // back in the order sent, although the large ones wait for a worker.
    let contents: Vec<String> = (0..8)
        .map(|i| {
            if i % 2 == 0 {
                text(50_000 + i * 1000, i)
            } else {
                format!("small {i}")
            }
        })
        .collect();
    let mut pipe = redis::pipe();
    for c in &contents {
        pipe.cmd("MEM.APPEND")
            .arg("mem:{p}")
            .arg("user")
            .arg(c)
            .arg("MAXMSGS")
            .arg(100);
    }
    let replies: Vec<Value> = pipe.query(&mut con).expect("pipeline");
    for (i, (reply, content)) in replies.into_iter().zip(&contents).enumerate() {
        let fields = as_fields(reply);
        assert_eq!(
            int_field(&fields, "id"),
            i as i64 + 1,
            "reply {i} out of order"
        );
        assert_eq!(
            int_field(&fields, "tokens"),
            3 + o200("user") + o200(content),
            "reply {i}"
        );
    }
    let stored = ids_and_tokens(&mut con, "mem:{p}");
    assert_eq!(
        stored.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>()
    );
    let expected: i64 = contents.iter().map(|c| 3 + o200("user") + o200(c)).sum();
    let info = map_reply(&mut con, &["MEM.INFO", "mem:{p}"]);
    assert_eq!(int_field(&info, "total_tokens"), expected);
}

#[test]
fn large_invalid_utf8_is_refused_after_the_worker_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "1000"],
    )
    .unwrap();
    cmd(&mut con, &["MEM.APPEND", "mem:{u}", "user", "first"]).unwrap();
    let before = session::snap(&mut con, "mem:{u}");
    let mut bad = text(20_000, 3).into_bytes();
    bad[10_000] = 0xff;
    let r = redis::cmd("MEM.APPEND")
        .arg("mem:{u}")
        .arg("user")
        .arg(&bad[..])
        .query::<Value>(&mut con);
    let e = r.expect_err("invalid UTF-8 must be refused");
    assert!(e.to_string().contains("not valid UTF-8"), "{e}");
    session::assert_same(
        &before,
        &session::snap(&mut con, "mem:{u}"),
        "after a refused large append",
        1000,
    );
    // The connection is still usable and in order.
    let r = map_reply(&mut con, &["MEM.APPEND", "mem:{u}", "user", "second"]);
    assert_eq!(int_field(&r, "id"), 2);
}

#[test]
fn large_contents_are_refused_in_multi_and_lua_naming_the_way_out() {
    let server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "1000"],
    )
    .unwrap();
    let big = text(30_000, 9);
    // MULTI: a client inside a transaction cannot block; counting inline
    // would hold every other client, so the large append is refused (the
    // other commands of the transaction run, as Redis does for any error
    // inside EXEC).
    let replies: redis::RedisResult<Vec<Value>> = redis::pipe()
        .atomic()
        .cmd("MEM.APPEND")
        .arg("mem:{m}")
        .arg("user")
        .arg("small")
        .cmd("MEM.APPEND")
        .arg("mem:{m}")
        .arg("user")
        .arg(&big)
        .query(&mut con);
    let e = replies.expect_err("the large append inside MULTI must be refused");
    assert!(
        e.to_string().contains("cannot wait for") && e.to_string().contains("MEM.APPENDBATCH"),
        "{e}"
    );
    let info = map_reply(&mut con, &["MEM.INFO", "mem:{m}"]);
    assert_eq!(
        int_field(&info, "messages"),
        1,
        "only the small append landed"
    );
    // Lua: neither can a script.
    let r: redis::RedisResult<Value> = redis::cmd("EVAL")
        .arg("return redis.call('MEM.APPEND', KEYS[1], 'user', ARGV[1])")
        .arg(1)
        .arg("mem:{l}")
        .arg(&big)
        .query(&mut con);
    assert!(r
        .expect_err("refused in a script")
        .to_string()
        .contains("cannot wait for"));
    assert_eq!(
        redis::cmd("EXISTS")
            .arg("mem:{l}")
            .query::<i64>(&mut con)
            .unwrap(),
        0
    );
    // Small contents still work in both.
    let v: Value = redis::cmd("EVAL")
        .arg("return redis.call('MEM.APPEND', KEYS[1], 'user', ARGV[1])")
        .arg(1)
        .arg("mem:{l}")
        .arg("small")
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(
        int_field(&as_fields(v), "tokens"),
        3 + o200("user") + o200("small")
    );
    // And outside them the worker counts the large one.
    let r = map_reply(&mut con, &["MEM.APPEND", "mem:{w}", "user", &big]);
    assert_eq!(int_field(&r, "tokens"), 3 + o200("user") + o200(&big));
    // The refusal names the limit that applied: with the default 64 KB
    // threshold, o200k_base's own inline cap (16 KB) refuses a 16 KB text
    // (it named mem.async-threshold-bytes alone: hostile pass, issue 23).
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "65536"],
    )
    .unwrap();
    let e = redis::cmd("EVAL")
        .arg("return redis.call('MEM.APPEND', KEYS[1], 'user', ARGV[1])")
        .arg(1)
        .arg("mem:{l16}")
        .arg("a".repeat(16_384))
        .query::<Value>(&mut con)
        .expect_err("16 KB in a script is over o200k_base's inline cap");
    assert!(e.to_string().contains("16384 bytes or more"), "{e}");
}

#[test]
fn large_appends_replicate_identically() {
    let master = Server::start();
    let replica = Server::with_args(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let mut m = master.client();
    let mut r = replica.client();
    session::wait_until("replica link up", 20, || {
        session::info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    cmd(
        &mut m,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "1000"],
    )
    .unwrap();
    for i in 0..6 {
        let content = if i % 2 == 0 {
            text(40_000, i)
        } else {
            format!("small {i}")
        };
        cmd(
            &mut m,
            &["MEM.APPEND", "mem:{r}", "user", &content, "MAXMSGS", "4"],
        )
        .unwrap();
    }
    // A MODEL change on a large append re-counts the session (whole-session propagation).
    cmd(
        &mut m,
        &[
            "MEM.APPEND",
            "mem:{r}",
            "user",
            &text(40_000, 77),
            "MODEL",
            "gpt-4",
        ],
    )
    .unwrap();
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    session::assert_same(
        &session::snap(&mut m, "mem:{r}"),
        &session::snap(&mut r, "mem:{r}"),
        "replica after large appends",
        1000,
    );
}

#[test]
fn a_client_that_leaves_while_counted_does_not_hurt_the_server() {
    let mut server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "1000"],
    )
    .unwrap();
    // Each count waits 1 s on the worker, so the clients surely leave while
    // their append is in flight (seen blocked in CLIENT LIST first).
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "1000"],
    )
    .unwrap();
    let big = "word ".repeat(20_000);
    let before = info_mem(&mut con, "counts_off_thread");
    let mut gone = Vec::new();
    for i in 0..5 {
        // Send the command and drop the connection without reading the reply.
        use std::io::Write;
        let mut raw = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        let key = format!("mem:{{gone{i}}}");
        let mut frame = Vec::new();
        for part in [
            "*4\r\n$10\r\nMEM.APPEND\r\n".to_owned(),
            format!("${}\r\n{key}\r\n", key.len()),
            "$4\r\nuser\r\n".to_owned(),
            format!("${}\r\n", big.len()),
        ] {
            frame.extend_from_slice(part.as_bytes());
        }
        frame.extend_from_slice(big.as_bytes());
        frame.extend_from_slice(b"\r\n");
        raw.write_all(&frame).unwrap();
        gone.push(raw);
    }
    poll_until(&mut con, "5 appends blocked on the workers", |c| {
        blocked_appends(c) == 5
    });
    assert_eq!(info_mem(&mut con, "counts_in_flight"), 5);
    drop(gone);
    // The counts finish after the clients left: nothing is written for them
    // (their reply callback never runs), the server stays up, and every
    // pending count is released.
    poll_until(&mut con, "the counts to be released", |c| {
        info_mem(c, "counts_in_flight") == 0
    });
    assert_eq!(
        info_mem(&mut con, "counts_off_thread"),
        before + 5,
        "the 5 counts ran on the pool"
    );
    for i in 0..5 {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(format!("mem:{{gone{i}}}"))
            .query(&mut con)
            .unwrap();
        assert_eq!(exists, 0, "an append of a client that left was written");
    }
    assert!(server.is_alive(), "server died; log:\n{}", server.log());
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn a_large_count_runs_while_the_main_thread_serves_others() {
    let server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "1500"],
    )
    .unwrap();
    let big = text(100_000, 1);
    let url = server.url();
    let appender = std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        map_reply(&mut c, &["MEM.APPEND", "mem:{big}", "user", &big])
    });
    // While the append is blocked on a worker, this connection is served:
    // replies to other commands, and INFO shows the count in flight.
    poll_until(&mut con, "the append blocked on a worker", |c| {
        blocked_appends(c) == 1
    });
    assert_eq!(info_mem(&mut con, "counts_in_flight"), 1);
    let r = map_reply(
        &mut con,
        &["MEM.APPEND", "mem:{small}", "user", "served meanwhile"],
    );
    assert_eq!(int_field(&r, "id"), 1);
    let exists: i64 = redis::cmd("EXISTS")
        .arg("mem:{big}")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        exists, 0,
        "the large append is not written before its count is done"
    );
    let reply = appender.join().unwrap();
    assert_eq!(int_field(&reply, "id"), 1);
    assert_eq!(info_mem(&mut con, "counts_in_flight"), 0);
    assert!(info_mem(&mut con, "counts_off_thread") >= 1);
}

#[test]
fn a_large_summary_is_counted_on_the_pool_and_refused_in_multi() {
    let master = Server::start();
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    for i in 0..4 {
        cmd(
            &mut con,
            &[
                "MEM.APPEND",
                "mem:{s}",
                "user",
                &format!("turn {i}"),
                "MAXTOKENS",
                "1000000",
            ],
        )
        .unwrap();
    }
    let summary = text(200_000, 5);
    // Inside MULTI it cannot wait for a worker: refused, nothing changed.
    let before = session::snap(&mut con, "mem:{s}");
    let r: redis::RedisResult<Vec<Value>> = redis::pipe()
        .atomic()
        .cmd("MEM.SUMMARIZE")
        .arg("mem:{s}")
        .arg(2)
        .arg(&summary)
        .query(&mut con);
    assert!(r
        .expect_err("refused in MULTI")
        .to_string()
        .contains("cannot wait for"));
    session::assert_same(
        &before,
        &session::snap(&mut con, "mem:{s}"),
        "after the refused summary",
        1000,
    );
    let done = info_mem(&mut con, "counts_off_thread");
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", "mem:{s}", "2", &summary]);
    assert_eq!(int_field(&r, "tokens"), 3 + o200("system") + o200(&summary));
    poll_until(&mut con, "the summary counted on the pool", |c| {
        info_mem(c, "counts_off_thread") == done + 1
    });
    let _: Value = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).unwrap();
    assert_eq!(
        session::digest(&mut con, "mem:{s}"),
        session::digest(&mut rcon, "mem:{s}")
    );
    // A stale upto is refused before anything is counted.
    let done = info_mem(&mut con, "counts_off_thread");
    let e = cmd(&mut con, &["MEM.SUMMARIZE", "mem:{s}", "1", &summary])
        .expect_err("upto below the summary's");
    assert!(e.to_string().contains("below"), "{e}");
    assert_eq!(info_mem(&mut con, "counts_off_thread"), done);
}
