//! Durability: nothing acknowledged is lost across kill -9 with AOF, AOF
//! rewrites (with and without the RDB preamble), RDB, DEBUG RELOAD,
//! DUMP/RESTORE, COPY and MIGRATE. Run with `-- --nocapture` for the figures.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::server::*;
use crate::support::session::*;
use redis::Value;

const THREADS: usize = 4;

/// One append a writer thread sent: the key, the content, and the reply.
struct Sent {
    key: String,
    content: String,
    id: Option<u64>,
    tokens: Option<u64>,
}

#[test]
fn aof_always_kill9_keeps_every_acknowledged_append() {
    let mut server = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let shared = "mem:{dur}:shared".to_owned();
    let mut keys = vec![shared.clone()];
    {
        let mut con = server.client();
        for key in
            std::iter::once(shared.clone()).chain((0..THREADS).map(|t| format!("mem:{{dur}}:t{t}")))
        {
            ok(
                &mut con,
                &[
                    "MEM.APPEND",
                    &key,
                    "system",
                    "start",
                    "MAXMSGS",
                    "100000",
                    "MAXTOKENS",
                    "10000000",
                    "TTL",
                    "0",
                ],
            );
            if key != shared {
                keys.push(key);
            }
        }
    }

    let acked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..THREADS {
        let mut con = server.client();
        let acked = acked.clone();
        let stop = stop.clone();
        let own = format!("mem:{{dur}}:t{t}");
        let shared = shared.clone();
        handles.push(std::thread::spawn(move || {
            let mut sent: Vec<Sent> = Vec::new();
            for i in 0..50_000u32 {
                if stop.load(Ordering::Relaxed) && i % 1000 == 999 {
                    break;
                }
                let key = if i % 2 == 0 {
                    shared.clone()
                } else {
                    own.clone()
                };
                let content = format!("writer {t} message {i} {}", "ü".repeat((i % 7) as usize));
                let reply = cmd(&mut con, &["MEM.APPEND", &key, "user", &content]);
                match reply {
                    Ok(v) => {
                        let f = as_fields(v);
                        sent.push(Sent {
                            key,
                            content,
                            id: Some(int_field(&f, "id") as u64),
                            tokens: Some(int_field(&f, "tokens") as u64),
                        });
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        // The server died with this one in flight.
                        sent.push(Sent {
                            key,
                            content,
                            id: None,
                            tokens: None,
                        });
                        break;
                    }
                }
            }
            sent
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while acked.load(Ordering::Relaxed) < 5000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    let sent: Vec<Sent> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let acknowledged = sent.iter().filter(|s| s.id.is_some()).count();
    let in_flight: HashSet<(String, String)> = sent
        .iter()
        .filter(|s| s.id.is_none())
        .map(|s| (s.key.clone(), s.content.clone()))
        .collect();

    server.restart();
    let mut con = server.client();
    let mut found_total = 0usize;
    let mut found: HashMap<(String, String), Msg> = HashMap::new();
    for key in &keys {
        let doc = check_consistent(&mut con, key);
        assert_eq!(
            doc.messages.first().map(|m| m.content.as_str()),
            Some("start"),
            "{key}: first message"
        );
        found_total += doc.messages.len() - 1;
        for m in doc.messages.into_iter().skip(1) {
            found.insert((key.clone(), m.content.clone()), m);
        }
    }
    let mut missing = 0;
    for s in sent.iter().filter(|s| s.id.is_some()) {
        match found.get(&(s.key.clone(), s.content.clone())) {
            Some(m) => {
                assert_eq!(Some(m.id), s.id, "{}: id of {:?}", s.key, s.content);
                assert_eq!(
                    Some(m.tokens),
                    s.tokens,
                    "{}: tokens of {:?}",
                    s.key,
                    s.content
                );
            }
            None => missing += 1,
        }
    }
    // Anything found beyond the acknowledged appends must be an append that
    // was in flight when the server died.
    for (k, _) in found.iter().filter(|(k, _)| {
        !sent
            .iter()
            .any(|s| s.id.is_some() && s.key == k.0 && s.content == k.1)
    }) {
        assert!(
            in_flight.contains(k),
            "unexpected message {k:?} after restart"
        );
    }
    println!(
        "durability/aof kill -9: appends acknowledged {acknowledged}, found after restart {found_total} \
         (in flight at the kill: {}), acknowledged but missing {missing}",
        in_flight.len()
    );
    assert_eq!(missing, 0, "acknowledged appends lost after kill -9");
    assert!(
        acknowledged >= 100,
        "too few appends before the kill ({acknowledged})"
    );
    assert!(server.is_alive());
}

fn rewrite_and_restart(preamble: &str) {
    let mut server = Server::with_args(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        preamble,
    ]);
    let mut con = server.client();
    let mut keys = populate_variety(&mut con, "mem:{aof}");
    ok(&mut con, &["BGREWRITEAOF"]);
    wait_persistence_idle(&mut con);
    // Writes after the rewrite land in the new incremental AOF.
    ok(
        &mut con,
        &["MEM.APPEND", &keys[0], "user", "after the rewrite"],
    );
    ok(
        &mut con,
        &["MEM.EXTSET", &keys[3], "zapier", "z-1", "EX", "7200"],
    );
    ok(
        &mut con,
        &[
            "MEM.APPEND",
            &keys[6],
            "user",
            "switch tokenizer",
            "MODEL",
            "gpt-4",
        ],
    );
    let late = "mem:{aof}:late".to_owned();
    ok(
        &mut con,
        &[
            "MEM.APPEND",
            &late,
            "user",
            "created after the rewrite",
            "TTL",
            "300",
        ],
    );
    keys.push(late);
    let before = snap_all(&mut con, &keys);
    drop(con);

    server.restart();
    let mut con = server.client();
    let after = snap_all(&mut con, &keys);
    for (b, a) in before.iter().zip(&after) {
        assert_same(
            b,
            a,
            &format!("AOF rewrite (preamble {preamble}) + restart"),
            1000,
        );
        check_consistent(&mut con, &b.key);
    }
    // A second rewrite with nothing after it, then restart again.
    ok(&mut con, &["BGREWRITEAOF"]);
    wait_persistence_idle(&mut con);
    let before2 = snap_all(&mut con, &keys);
    drop(con);
    server.restart();
    let mut con = server.client();
    for b in &before2 {
        assert_same(
            b,
            &snap(&mut con, &b.key),
            &format!("second rewrite (preamble {preamble})"),
            1000,
        );
    }
    println!(
        "durability/aof rewrite preamble={preamble}: {} sessions identical after 2 restarts",
        keys.len()
    );
    assert!(server.is_alive());
}

#[test]
fn aof_rewrite_with_rdb_preamble_keeps_sessions_identical() {
    rewrite_and_restart("yes");
}

#[test]
fn aof_rewrite_without_rdb_preamble_keeps_sessions_identical() {
    rewrite_and_restart("no");
}

#[test]
fn rdb_save_restart_and_debug_reload_keep_sessions_identical() {
    let mut server = Server::start();
    let mut con = server.client();
    let keys = populate_variety(&mut con, "mem:{rdb}");
    let before = snap_all(&mut con, &keys);
    ok(&mut con, &["SAVE"]);
    drop(con);
    server.restart();
    let mut con = server.client();
    for b in &before {
        assert_same(b, &snap(&mut con, &b.key), "SAVE + restart", 1000);
        check_consistent(&mut con, &b.key);
    }
    let before = snap_all(&mut con, &keys);
    ok(&mut con, &["DEBUG", "RELOAD"]);
    for b in &before {
        assert_same(b, &snap(&mut con, &b.key), "DEBUG RELOAD", 1000);
    }
    // BGSAVE too, then restart.
    ok(&mut con, &["BGSAVE"]);
    wait_persistence_idle(&mut con);
    drop(con);
    server.restart();
    let mut con = server.client();
    for b in &before {
        assert_same(b, &snap(&mut con, &b.key), "BGSAVE + restart", 1500);
    }
    println!(
        "durability/rdb: {} sessions identical after SAVE, DEBUG RELOAD, BGSAVE",
        keys.len()
    );
}

#[test]
fn dump_restore_copy_and_migrate_keep_sessions_identical() {
    let server = Server::start();
    let other = Server::start();
    let mut con = server.client();
    let mut con2 = other.client();
    let keys = populate_variety(&mut con, "mem:{dr}");
    let mut compared = 0;

    for key in &keys {
        let src = snap(&mut con, key);
        let payload = dump(&mut con, key);
        let ttl = if src.pttl > 0 {
            src.pttl.to_string()
        } else {
            "0".to_owned()
        };

        // RESTORE into another key of the same server, and into another server.
        let copy_key = format!("{key}:restored");
        redis::cmd("RESTORE")
            .arg(&copy_key)
            .arg(&ttl)
            .arg(&payload)
            .query::<()>(&mut con)
            .unwrap();
        let restored = Snap {
            key: key.clone(),
            ..snap(&mut con, &copy_key)
        };
        assert_same(&src, &restored, "RESTORE (same server)", 1000);
        check_consistent(&mut con, &copy_key);
        redis::cmd("RESTORE")
            .arg(key)
            .arg(&ttl)
            .arg(&payload)
            .query::<()>(&mut con2)
            .unwrap();
        assert_same(&src, &snap(&mut con2, key), "RESTORE (other server)", 1000);
        // RESTORE ... REPLACE over an existing session.
        redis::cmd("RESTORE")
            .arg(&copy_key)
            .arg(&ttl)
            .arg(&payload)
            .arg("REPLACE")
            .query::<()>(&mut con)
            .unwrap();
        assert_eq!(digest(&mut con, &copy_key), src.digest);

        // COPY: identical, then independent.
        let copied = format!("{key}:copy");
        let n: i64 = redis::from_redis_value(&ok(&mut con, &["COPY", key, &copied])).unwrap();
        assert_eq!(n, 1);
        let c = Snap {
            key: key.clone(),
            ..snap(&mut con, &copied)
        };
        assert_same(&src, &c, "COPY", 1000);
        ok(
            &mut con,
            &["MEM.APPEND", &copied, "user", "only in the copy"],
        );
        ok(&mut con, &["MEM.EXTSET", &copied, "copyonly", "x"]);
        let c2 = check_consistent(&mut con, &copied);
        let summarize_upto = c2.messages.first().map(|m| m.id).unwrap();
        ok(
            &mut con,
            &[
                "MEM.SUMMARIZE",
                &copied,
                &summarize_upto.to_string(),
                "copy summary",
            ],
        );
        assert_ne!(
            digest(&mut con, &copied),
            src.digest,
            "the copy did not change"
        );
        let after = snap(&mut con, key);
        assert_same(&src, &after, "original after writing to its COPY", 1000);
        check_consistent(&mut con, key);
        compared += 5;
    }

    // MIGRATE (moves) to a third server; MIGRATE ... COPY to the second.
    let third = Server::start();
    let mut con3 = third.client();
    let before = snap_all(&mut con, &keys);
    let mut m = redis::cmd("MIGRATE");
    m.arg("127.0.0.1")
        .arg(other.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("COPY")
        .arg("REPLACE")
        .arg("KEYS");
    for k in &keys {
        m.arg(k);
    }
    m.query::<()>(&mut con).unwrap();
    let mut m = redis::cmd("MIGRATE");
    m.arg("127.0.0.1")
        .arg(third.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS");
    for k in &keys {
        m.arg(k);
    }
    m.query::<()>(&mut con).unwrap();
    for b in &before {
        assert_same(b, &snap(&mut con2, &b.key), "MIGRATE COPY", 1000);
        assert_same(b, &snap(&mut con3, &b.key), "MIGRATE", 1000);
        check_consistent(&mut con3, &b.key);
        let exists: i64 = redis::from_redis_value(&ok(&mut con, &["EXISTS", &b.key])).unwrap();
        assert_eq!(exists, 0, "MIGRATE left {} on the source", b.key);
        compared += 2;
    }
    println!(
        "durability/dump-restore-copy-migrate: {} sessions, {compared} comparisons identical",
        keys.len()
    );
}

/// RDB encoding versions (docs/FORMAT.md): today's values are version 3 with
/// a format-3 payload. The same value claiming version 1 or 2 (whose payloads
/// are formats 1 and 2), or a version no release wrote, is refused by RESTORE with an
/// error and the reason in the log, never a crash.
#[test]
fn values_of_unknown_or_mismatched_encoding_versions_are_refused() {
    let mut server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["CONFIG", "SET", "rdbcompression", "no"]);
    // No TTL: a key's expiry is part of its digest, and RESTORE 0 sets none.
    ok(
        &mut con,
        &["MEM.APPEND", "mem:{ver}", "user", "hello", "TTL", "0"],
    );
    let full = dump(&mut con, "mem:{ver}");
    assert_eq!(module_payload(&full)[0], 4, "today's payload format");
    let (payload, ver) = split_dump(&full);
    // Type 7 (module), then the module id as a 64-bit RDB length (0x81 and 8
    // bytes, big-endian) whose low 10 bits are the encoding version.
    assert_eq!(&payload[..2], &[7, 0x81]);
    let id = u64::from_be_bytes(payload[2..10].try_into().unwrap());
    assert_eq!(id & 0x3ff, 4, "today's encoding version");
    let with_encver = |v: u64| {
        let mut p = payload.to_vec();
        p[2..10].copy_from_slice(&((id & !0x3ff) | v).to_be_bytes());
        with_footer(&p, ver)
    };
    redis::cmd("RESTORE")
        .arg("mem:{ver}:same")
        .arg(0)
        .arg(with_encver(4))
        .query::<()>(&mut con)
        .unwrap();
    assert_eq!(
        digest(&mut con, "mem:{ver}:same"),
        digest(&mut con, "mem:{ver}")
    );
    for (encver, reason) in [
        (1, "payload format 4 in a value of encoding version 1"),
        (2, "payload format 4 in a value of encoding version 2"),
        (3, "payload format 4 in a value of encoding version 3"),
        (0, "unknown redis-mem encoding version 0"),
        (5, "unknown redis-mem encoding version 5"),
        (1023, "unknown redis-mem encoding version 1023"),
    ] {
        let r = redis::cmd("RESTORE")
            .arg("mem:{ver}:bad")
            .arg(0)
            .arg(with_encver(encver))
            .query::<Value>(&mut con);
        assert!(r.is_err(), "encoding version {encver} restored: {r:?}");
        assert!(server.is_alive(), "crashed on encoding version {encver}");
        assert!(
            server.log().contains(reason),
            "encoding version {encver}: log lacks {reason:?}"
        );
        assert_eq!(ok(&mut con, &["EXISTS", "mem:{ver}:bad"]), Value::Int(0));
    }
    println!("durability/encoding versions: 4 restores, 1-3 (mismatched), 0, 5, 1023 refused");
}

#[test]
fn an_append_s_expiry_reaches_the_aof_and_a_replica_as_the_same_time() {
    // MEM.APPEND propagates one command (its op carries the expiry, which
    // MEM._APPLY sets as an absolute time): a replica holds the master's
    // expiry to the millisecond, and an AOF replayed later keeps it rather
    // than counting the TTL again from the replay.
    use crate::support::faults::{conn, master_and_replica, qint, wait_replicas};
    let (master, replica) =
        master_and_replica(&["--appendonly", "yes", "--aof-use-rdb-preamble", "no"]);
    let (mut m, mut r) = (conn(master.port, 0), conn(replica.port, 0));
    let k = "mem:{exp}";
    ok(&mut m, &["MEM.APPEND", k, "user", "one", "TTL", "100"]);
    ok(&mut m, &["MEM.APPEND", k, "user", "two", "TTL", "0"]);
    ok(&mut m, &["MEM.APPEND", k, "user", "three", "TTL", "500"]);
    let at = qint(&mut m, &["PEXPIRETIME", k]);
    assert!(at > 0, "no expiry: {at}");
    wait_replicas(&mut m, 1);
    assert_eq!(
        qint(&mut r, &["PEXPIRETIME", k]),
        at,
        "the replica's expiry"
    );
    let persisted = "mem:{exp}:none";
    ok(&mut m, &["MEM.APPEND", persisted, "user", "x", "TTL", "0"]);
    wait_replicas(&mut m, 1);
    assert_eq!(qint(&mut r, &["PEXPIRETIME", persisted]), -1);
    // A batch's ops carry it too (the last one sets the batch's): no
    // PEXPIREAT after them.
    let batched = "mem:{exp}:batch";
    let two = r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]"#;
    ok(&mut m, &["MEM.APPENDBATCH", batched, two, "TTL", "300"]);
    let batch_at = qint(&mut m, &["PEXPIRETIME", batched]);
    assert!(batch_at > 0, "no expiry: {batch_at}");
    wait_replicas(&mut m, 1);
    assert_eq!(qint(&mut r, &["PEXPIRETIME", batched]), batch_at);
    std::thread::sleep(Duration::from_millis(1500));
    drop((m, r));
    let mut master = master;
    master.restart();
    let mut m = conn(master.port, 0);
    assert_eq!(
        qint(&mut m, &["PEXPIRETIME", k]),
        at,
        "the AOF replay moved the expiry"
    );
    assert_eq!(qint(&mut m, &["PEXPIRETIME", persisted]), -1);
    assert_eq!(qint(&mut m, &["PEXPIRETIME", batched]), batch_at);
    drop(replica);
}
