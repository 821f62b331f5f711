//! MEM.SUMMARIZE_BEGIN and MEM.SUMMARIZE ... LEASE against real servers
//! (SPEC §3, v2): a lease goes to one worker at a time, a summary without
//! the live lease's token is refused, an expired lease frees the session, a
//! summary ends the lease; leases survive DEBUG RELOAD, AOF and DUMP, reach
//! replicas identically; and 4 workers racing on 20 sessions never
//! summarize one session at once nor waste a summary.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::reply::*;
use crate::support::server::*;
use crate::support::session;
use crate::support::session::{info_field, wait_until};

const BEGIN_FIELDS: [&str; 10] = [
    "summarize",
    "total_tokens",
    "messages",
    "threshold_tokens",
    "threshold_messages",
    "keep",
    "upto",
    "upto_tokens",
    "lease",
    "lease_expires",
];

fn begin(
    con: &mut redis::Connection,
    key: &str,
    lease_ms: &str,
    opts: &[&str],
) -> Vec<(String, redis::Value)> {
    let mut args = vec!["MEM.SUMMARIZE_BEGIN", key, lease_ms];
    args.extend_from_slice(opts);
    map_reply(con, &args)
}

/// A session over its threshold: 10 messages, MAXMSGS 10 (threshold 8).
fn ready(con: &mut redis::Connection, key: &str) {
    for i in 1..=10 {
        append(
            con,
            key,
            "user",
            &format!("message {i} about the trip"),
            &["MAXMSGS", "10"],
        );
    }
}

#[test]
fn a_lease_is_granted_to_one_worker_at_a_time() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{lease}";
    ready(&mut con, k);
    let pttl = int(&mut con, &["PTTL", k]);
    let before = now_ms();
    let b = begin(&mut con, k, "5000", &["KEEP", "2"]);
    assert_eq!(names(&b), BEGIN_FIELDS);
    let c = check(&mut con, k, &["KEEP", "2"]);
    for (name, value) in &c {
        assert_eq!(
            int_field(&b, name),
            redis::from_redis_value::<i64>(value).unwrap(),
            "{name} as SUMMARIZE_CHECK says"
        );
    }
    let (token, expires) = (int_field(&b, "lease"), int_field(&b, "lease_expires"));
    assert_eq!((int_field(&b, "summarize"), int_field(&b, "upto")), (1, 8));
    // A token is at least 32 x the grant's ms (never repeated across the
    // key name's lifetimes: integrity.rs).
    assert!(
        token >= before * 32 && token <= now_ms() * 32 + 32,
        "lease {token}"
    );
    assert!(
        expires >= before + 5000 && expires <= now_ms() + 5000,
        "lease_expires {expires}"
    );
    // The lease does not refresh the TTL.
    assert!(int(&mut con, &["PTTL", k]) <= pttl);

    // A second worker: lease 0, told when the first one's expires.
    let b2 = begin(&mut con, k, "5000", &["KEEP", "2"]);
    assert_eq!(
        (int_field(&b2, "lease"), int_field(&b2, "lease_expires")),
        (0, expires)
    );
    assert_eq!(int_field(&b2, "summarize"), 1);
    // A summary without the token, or with another, is refused; nothing changes.
    let snap_before = snap(&mut con, k);
    for opts in [vec![], vec!["LEASE", "2"], vec!["LEASE", "99"]] {
        let mut args = vec!["MEM.SUMMARIZE", k, "8", "a summary by the wrong worker"];
        args.extend(opts);
        let e = err(&mut con, &args);
        assert!(
            e.starts_with("LEASED another summarizer holds this session's lease"),
            "{e}"
        );
        assert_unchanged(&mut con, k, &snap_before, &format!("{args:?}"));
    }
    // The holder commits; the lease ends with it.
    let r = map_reply(
        &mut con,
        &[
            "MEM.SUMMARIZE",
            k,
            "8",
            "a summary",
            "LEASE",
            &token.to_string(),
        ],
    );
    assert_eq!(names(&r), OUTCOME_FIELDS);
    assert_eq!(
        (
            int_field(&r, "id"),
            int_field(&r, "messages"),
            int_field(&r, "duplicate")
        ),
        (8, 2, 0)
    );
    // Retried (the reply was lost): the same summary is in place, answered
    // so rather than refused as stale.
    let snap_after = snap(&mut con, k);
    let again = map_reply(
        &mut con,
        &[
            "MEM.SUMMARIZE",
            k,
            "8",
            "a summary",
            "LEASE",
            &token.to_string(),
        ],
    );
    assert_eq!(
        (
            int_field(&again, "id"),
            int_field(&again, "tokens"),
            int_field(&again, "duplicate")
        ),
        (8, int_field(&r, "tokens"), 1)
    );
    assert_unchanged(&mut con, k, &snap_after, "a retried summary");
    assert_err(
        &mut con,
        &["MEM.SUMMARIZE", k, "8", "another text"],
        "not the id of a message",
    );
    // Nothing left to summarize: no lease (below the threshold now).
    let b3 = begin(&mut con, k, "5000", &["KEEP", "2"]);
    assert_eq!(
        (
            int_field(&b3, "summarize"),
            int_field(&b3, "lease"),
            int_field(&b3, "lease_expires")
        ),
        (0, 0, 0)
    );
    // Over the threshold again: the next token.
    for i in 11..=18 {
        append(&mut con, k, "user", &format!("message {i}"), &[]);
    }
    let b4 = begin(&mut con, k, "5000", &["KEEP", "2"]);
    assert!(
        int_field(&b4, "lease") > token,
        "a later lease has a greater token"
    );
    let mut i = server.client();
    assert_eq!(info_mem(&mut i, "leases_granted"), 2);
    assert_eq!(info_mem(&mut i, "leases_busy"), 1);
    assert_eq!(info_mem(&mut i, "summaries_refused_lease"), 3);
}

#[test]
fn no_lease_without_work_and_nothing_created() {
    let server = Server::start();
    let mut con = server.client();
    // A missing key: the empty session's answer, and no key.
    let b = begin(&mut con, "mem:{none}", "1000", &[]);
    assert_eq!((int_field(&b, "lease"), int_field(&b, "messages")), (0, 0));
    assert_eq!(int(&mut con, &["EXISTS", "mem:{none}"]), 0);
    // Below the threshold.
    append(&mut con, "mem:{few}", "user", "hi", &[]);
    let before = snap(&mut con, "mem:{few}");
    let b = begin(&mut con, "mem:{few}", "1000", &[]);
    assert_eq!((int_field(&b, "summarize"), int_field(&b, "lease")), (0, 0));
    assert_unchanged(&mut con, "mem:{few}", &before, "BEGIN below the threshold");
    // Over it, but KEEP leaves nothing to cover.
    ready(&mut con, "mem:{keep}");
    let b = begin(&mut con, "mem:{keep}", "1000", &["KEEP", "10"]);
    assert_eq!(
        (
            int_field(&b, "summarize"),
            int_field(&b, "upto"),
            int_field(&b, "lease")
        ),
        (1, 0, 0)
    );
    // MODEL / CONTEXT answer for another window, as SUMMARIZE_CHECK does.
    let b = begin(&mut con, "mem:{few}", "1000", &["CONTEXT", "10"]);
    assert_eq!(
        (
            int_field(&b, "threshold_tokens"),
            int_field(&b, "summarize"),
            int_field(&b, "upto")
        ),
        (1, 1, 0)
    );
}

#[test]
fn an_expired_lease_frees_the_session() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{expiry}";
    ready(&mut con, k);
    // Worker 1 takes a short lease and "dies".
    let first = int_field(&begin(&mut con, k, "200", &["KEEP", "2"]), "lease");
    assert!(first > 0);
    assert_eq!(
        int_field(&begin(&mut con, k, "200", &["KEEP", "2"]), "lease"),
        0
    );
    std::thread::sleep(Duration::from_millis(300));
    // Worker 2 takes over.
    let second = int_field(&begin(&mut con, k, "200", &["KEEP", "2"]), "lease");
    assert!(second > first);
    // Worker 1 wakes up late: refused while worker 2's lease is live.
    assert_err(
        &mut con,
        &["MEM.SUMMARIZE", k, "8", "late", "LEASE", "1"],
        "LEASED",
    );
    std::thread::sleep(Duration::from_millis(300));
    // Every lease expired. The late worker's token is no longer the
    // session's: refused, whatever it summarized is not wanted. Worker 2's
    // own expired lease still commits, as nobody took over from it.
    let before = snap(&mut con, k);
    let e = err(
        &mut con,
        &["MEM.SUMMARIZE", k, "8", "late", "LEASE", &first.to_string()],
    );
    assert!(
        e.starts_with("LEASED") && e.contains("not this session's lease"),
        "{e}"
    );
    assert_unchanged(&mut con, k, &before, "a superseded lease");
    let r = map_reply(
        &mut con,
        &[
            "MEM.SUMMARIZE",
            k,
            "8",
            "late but fine",
            "LEASE",
            &second.to_string(),
        ],
    );
    assert_eq!(int_field(&r, "duplicate"), 0);
    let e = get(&mut con, &["MEM.GET", k]);
    assert_eq!(
        (e[0].role.as_str(), e[0].content.as_str()),
        ("summary", "late but fine")
    );
    // The summary ended that lease: its token is spent too.
    assert_err(
        &mut con,
        &[
            "MEM.SUMMARIZE",
            k,
            "9",
            "again",
            "LEASE",
            &second.to_string(),
        ],
        "LEASED",
    );
}

/// A worker whose key was deleted and made again (or replaced by IMPORT
/// REPLACE) while it summarized: ids start again at 1, so its `upto` names
/// the new conversation's messages. No lease of the new lifetime is live;
/// its token is refused anyway, and so is one nobody granted.
#[test]
fn a_lease_of_an_earlier_lifetime_of_the_key_is_refused() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{lifetime}";
    ready(&mut con, k);
    let old = int_field(&begin(&mut con, k, "60000", &["KEEP", "2"]), "lease");
    assert!(old > 0);
    for remake in ["DEL", "IMPORT REPLACE"] {
        if remake == "DEL" {
            ok(&mut con, &["DEL", k]);
        } else {
            let doc =
                r#"{"conversation_history":[{"role":"user","content":"a new conversation"}]}"#;
            ok(&mut con, &["MEM.IMPORT", k, doc, "REPLACE"]);
        }
        ready(&mut con, k);
        let before = snap(&mut con, k);
        for token in [
            old.to_string(),
            "7".to_owned(),
            (old + 1_000_000).to_string(),
        ] {
            let e = err(
                &mut con,
                &[
                    "MEM.SUMMARIZE",
                    k,
                    "8",
                    "the old conversation",
                    "LEASE",
                    &token,
                ],
            );
            assert!(e.starts_with("LEASED"), "{remake}, token {token}: {e}");
            assert_unchanged(&mut con, k, &before, remake);
        }
    }
    // The refusals are counted as lease refusals.
    assert!(info_mem(&mut con, "summaries_refused_lease") >= 6);
}

#[test]
fn begin_and_lease_errors_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{err}";
    ready(&mut con, k);
    let before = snap(&mut con, k);
    for (args, needle) in [
        (vec!["MEM.SUMMARIZE_BEGIN", k], "wrong number of arguments"),
        (
            vec!["MEM.SUMMARIZE_BEGIN", k, "0"],
            "lease-ms must be at least 1",
        ),
        (
            vec!["MEM.SUMMARIZE_BEGIN", k, "-5"],
            "lease-ms is not an integer",
        ),
        (
            vec!["MEM.SUMMARIZE_BEGIN", k, "soon"],
            "lease-ms is not an integer",
        ),
        (
            vec!["MEM.SUMMARIZE_BEGIN", k, "86400001"],
            "at most 86400000",
        ),
        (
            vec![
                "MEM.SUMMARIZE_BEGIN",
                k,
                "100",
                "MODEL",
                "gpt-4o",
                "CONTEXT",
                "100",
            ],
            "not compatible",
        ),
        (vec!["MEM.SUMMARIZE_BEGIN", k, "100", "KEEP", "-1"], "ERR"),
        (
            vec!["MEM.SUMMARIZE_BEGIN", k, "100", "KEEP", "1", "KEEP", "2"],
            "given more than once",
        ),
        (
            vec!["MEM.SUMMARIZE_BEGIN", k, "100", "LEASE", "1"],
            "unknown option 'LEASE'",
        ),
        (vec!["MEM.SUMMARIZE_BEGIN", k, "100", "MODEL", ""], "ERR"),
        (
            vec!["MEM.SUMMARIZE", k, "8", "s", "LEASE", "0"],
            "LEASE must be at least 1",
        ),
        (
            vec!["MEM.SUMMARIZE", k, "8", "s", "LEASE", "x"],
            "not an integer",
        ),
        (vec!["MEM.SUMMARIZE", k, "8", "s", "LEASE"], "needs a value"),
        (
            vec!["MEM.SUMMARIZE", k, "8", "s", "LEASE", "1", "LEASE", "1"],
            "given more than once",
        ),
        (
            vec!["MEM.SUMMARIZE", k, "8", "s", "TOKEN", "1"],
            "unknown option 'TOKEN'",
        ),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, k, &before, &format!("{args:?}"));
    }
    ok(&mut con, &["SET", "str", "v"]);
    assert_err(
        &mut con,
        &["MEM.SUMMARIZE_BEGIN", "str", "100"],
        "WRONGTYPE",
    );
    // The largest lease is accepted.
    let b = begin(&mut con, k, "86400000", &["KEEP", "2"]);
    assert!(int_field(&b, "lease") > 0);
}

#[test]
fn leases_survive_debug_reload_aof_and_dump() {
    // appendfsync always: a restart is a kill -9, and under everysec a busy
    // disk lets Redis postpone the AOF write up to 2 s past the reply (the
    // lease was lost once with four suites running).
    let mut server = Server::with_args(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        "no",
    ]);
    let mut con = server.client();
    let k = "mem:{durable}";
    ready(&mut con, k);
    let b = begin(&mut con, k, "60000", &["KEEP", "2"]);
    let (token, expires) = (int_field(&b, "lease"), int_field(&b, "lease_expires"));
    let held = |con: &mut redis::Connection, key: &str| {
        let b = begin(con, key, "60000", &["KEEP", "2"]);
        assert_eq!(
            (int_field(&b, "lease"), int_field(&b, "lease_expires")),
            (0, expires),
            "{key}: the lease is still held"
        );
        assert_err(con, &["MEM.SUMMARIZE", key, "8", "no token"], "LEASED");
    };
    let digest_before = digest(&mut con, k);
    ok(&mut con, &["DEBUG", "RELOAD"]);
    assert_eq!(digest(&mut con, k), digest_before, "DEBUG RELOAD");
    held(&mut con, k);
    // COPY makes another key: the copy holds no lease (its own workers may
    // begin; the original's token does not commit there), the original
    // keeps its own.
    assert_eq!(int(&mut con, &["COPY", k, "mem:{durable}:copied"]), 1);
    held(&mut con, k);
    let e = err(
        &mut con,
        &[
            "MEM.SUMMARIZE",
            "mem:{durable}:copied",
            "8",
            "s",
            "LEASE",
            &token.to_string(),
        ],
    );
    assert!(e.contains("not this session's lease"), "{e}");
    let fresh = int_field(
        &begin(&mut con, "mem:{durable}:copied", "60000", &["KEEP", "2"]),
        "lease",
    );
    assert!(fresh > token, "{fresh} after {token}");
    // DUMP/RESTORE (and so MIGRATE) carry it.
    let d: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut con).unwrap();
    let _: redis::Value = redis::cmd("RESTORE")
        .arg("mem:{durable}:copy")
        .arg(0)
        .arg(d)
        .query(&mut con)
        .unwrap();
    held(&mut con, "mem:{durable}:copy");
    // The AOF (the op as written) and its rewrite.
    server.restart();
    let mut con = server.client();
    held(&mut con, k);
    ok(&mut con, &["BGREWRITEAOF"]);
    session::wait_persistence_idle(&mut con);
    server.restart();
    let mut con = server.client();
    held(&mut con, k);
    // The token still commits, and the next lease is above it.
    ok(
        &mut con,
        &[
            "MEM.SUMMARIZE",
            k,
            "8",
            "after restarts",
            "LEASE",
            &token.to_string(),
        ],
    );
    for i in 11..=18 {
        append(&mut con, k, "user", &format!("m{i}"), &[]);
    }
    assert!(int_field(&begin(&mut con, k, "1000", &["KEEP", "2"]), "lease") > token);
}

#[test]
fn leases_reach_replicas_identically() {
    let master = Server::with_args(&["--repl-diskless-sync-delay", "0"]);
    let replica = Server::with_args(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let mut r = replica.client();
    wait_until("link up", 60, || {
        info_field(&mut r, "replication", "master_link_status").as_deref() == Some("up")
    });
    let mut m = master.client();
    let k = "mem:{repl}";
    ready(&mut m, k);
    let b = begin(&mut m, k, "60000", &["KEEP", "2"]);
    let (token, expires) = (int_field(&b, "lease"), int_field(&b, "lease_expires"));
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        digest(&mut r, k),
        digest(&mut m, k),
        "the lease is identical on the replica"
    );
    // A replica refuses the write, as any other.
    assert_err(&mut r, &["MEM.SUMMARIZE_BEGIN", k, "1000"], "READONLY");
    // Promoted, it holds the same lease: same expiry, same token.
    ok(&mut r, &["REPLICAOF", "NO", "ONE"]);
    let b = begin(&mut r, k, "60000", &["KEEP", "2"]);
    assert_eq!(
        (int_field(&b, "lease"), int_field(&b, "lease_expires")),
        (0, expires)
    );
    assert_err(&mut r, &["MEM.SUMMARIZE", k, "8", "no token"], "LEASED");
    ok(
        &mut r,
        &[
            "MEM.SUMMARIZE",
            k,
            "8",
            "by the holder",
            "LEASE",
            &token.to_string(),
        ],
    );
}

/// 4 workers, 20 sessions, a writer appending all along: each grant is
/// followed by its summary (no LLM call wasted, none refused), and no
/// session is ever held by two workers at once.
#[test]
fn four_workers_racing_on_twenty_sessions() {
    let server = Server::start();
    let mut con = server.client();
    // A token threshold of 60 on the sessions' unknown model, and caps far
    // away: messages leave only by summary, so a refusal could only come
    // from another worker.
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.summarize-fallback-tokens", "60"],
    );
    let keys: Vec<String> = (0..20).map(|i| format!("mem:{{race{i}}}")).collect();
    let opts = [
        "MODEL",
        "local-model",
        "MAXMSGS",
        "100000",
        "MAXTOKENS",
        "10000000",
    ];
    for k in &keys {
        append(&mut con, k, "user", "start", &opts);
    }
    let writing = Arc::new(AtomicBool::new(true));
    let busy: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let overlaps = Arc::new(AtomicI64::new(0));
    let (granted, committed, refused) = (
        Arc::new(AtomicI64::new(0)),
        Arc::new(AtomicI64::new(0)),
        Arc::new(Mutex::new(Vec::new())),
    );
    let writer = {
        let (mut c, keys, writing) = (server.client(), keys.clone(), writing.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut n = 0;
            while start.elapsed() < Duration::from_secs(3) {
                for k in &keys {
                    append(
                        &mut c,
                        k,
                        "user",
                        &format!("a message number {n} with a few words"),
                        &[],
                    );
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            writing.store(false, Ordering::SeqCst);
        })
    };
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let mut c = server.client();
            let (keys, writing, busy, overlaps) = (
                keys.clone(),
                writing.clone(),
                busy.clone(),
                overlaps.clone(),
            );
            let (granted, committed, refused) =
                (granted.clone(), committed.clone(), refused.clone());
            std::thread::spawn(move || {
                let mut rounds = 0;
                while writing.load(Ordering::SeqCst) || rounds < 2 {
                    if !writing.load(Ordering::SeqCst) {
                        rounds += 1;
                    }
                    for (i, k) in keys.iter().enumerate().cycle().skip(w * 5).take(keys.len()) {
                        let b = begin(&mut c, k, "10000", &["KEEP", "2"]);
                        let token = int_field(&b, "lease");
                        if token == 0 {
                            continue;
                        }
                        granted.fetch_add(1, Ordering::SeqCst);
                        {
                            let mut held = busy.lock().unwrap();
                            let n = held.entry(k.clone()).or_default();
                            *n += 1;
                            if *n > 1 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        let upto = int_field(&b, "upto").to_string();
                        // The "LLM call".
                        std::thread::sleep(Duration::from_millis(
                            10 + (i as u64 * 7 + w as u64 * 3) % 30,
                        ));
                        *busy.lock().unwrap().get_mut(k).unwrap() -= 1;
                        let text = format!("summary up to {upto} by worker {w}");
                        match cmd(
                            &mut c,
                            &[
                                "MEM.SUMMARIZE",
                                k,
                                &upto,
                                &text,
                                "LEASE",
                                &token.to_string(),
                            ],
                        ) {
                            Ok(_) => committed.fetch_add(1, Ordering::SeqCst),
                            Err(e) => {
                                refused
                                    .lock()
                                    .unwrap()
                                    .push(format!("{k} upto {upto}: {}", err_text(&e)));
                                0
                            }
                        };
                    }
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for w in workers {
        w.join().unwrap();
    }
    let refused = refused.lock().unwrap().clone();
    assert!(
        refused.is_empty(),
        "{} summaries refused, e.g. {:?}",
        refused.len(),
        &refused[..refused.len().min(5)]
    );
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "a session held by two workers at once"
    );
    let (granted, committed) = (
        granted.load(Ordering::SeqCst),
        committed.load(Ordering::SeqCst),
    );
    assert_eq!(granted, committed, "every LLM call's summary was committed");
    assert!(committed >= 40, "only {committed} summaries");
    assert_eq!(info_mem(&mut con, "summaries_applied"), committed);
    assert_eq!(info_mem(&mut con, "summaries_rejected_stale"), 0);
    // Every session ends summarized (the last rounds ran after the writer).
    for k in &keys {
        let c = check(&mut con, k, &["KEEP", "2"]);
        assert!(
            int_field(&c, "summarize") == 0 || int_field(&c, "upto") == 0,
            "{k} left over its threshold"
        );
    }
}

/// Concurrent MEM.SUMMARIZE_BEGIN grabs: one lease (from the v2 review).
mod concurrent_begin {
    use crate::support::reply::*;
    use crate::support::server::*;

    #[test]
    fn concurrent_summarize_begin_grants_one_lease() {
        let server = Server::start();
        let mut con = server.client();
        let k = "mem:{lease-race}";
        for i in 0..26 {
            append(&mut con, k, "user", &format!("m{i}"), &[]);
        }
        let mut granted = 0;
        for round in 0..20 {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let mut c = server.client();
                    std::thread::spawn(move || {
                        let r = as_fields(ok(
                            &mut c,
                            &["MEM.SUMMARIZE_BEGIN", "mem:{lease-race}", "50"],
                        ));
                        (int_field(&r, "lease"), int_field(&r, "lease_expires"))
                    })
                })
                .collect();
            let replies: Vec<(i64, i64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            // Leases granted in one round never overlap: a second one is
            // granted only once the first has expired (on a loaded machine
            // the four calls can be that far apart), by the server's clock.
            let mut held: Vec<i64> = replies
                .iter()
                .filter(|(lease, _)| *lease > 0)
                .map(|(_, expires)| *expires)
                .collect();
            held.sort_unstable();
            assert!(
                held.windows(2).all(|w| w[1] - w[0] >= 50),
                "round {round}: two workers hold a lease at once: {replies:?}"
            );
            granted += held.len().min(1);
            std::thread::sleep(std::time::Duration::from_millis(60)); // let it expire
        }
        assert!(
            granted >= 15,
            "expired leases blocked: {granted} of 20 rounds granted"
        );
    }
}
