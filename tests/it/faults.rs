//! Faults while a large MEM.APPEND is being counted (SPEC section 5, v2):
//! the append (200 KB, held by `mem.debug-count-delay-ms`) is sent on its own
//! connection, the fault is injected once `CLIENT LIST` shows that client
//! blocked, and then: no crash; exactly once on the node that owns the key,
//! or refused and nowhere; replicas identical to their master.
//! Nothing asserts on timing: the order of events is observed (the client
//! blocked, the worker's count done) rather than assumed.

use crate::support::cluster::{keyslot, names_in_slots, Cluster};
use crate::support::faults::*;
use crate::support::server::*;
use crate::support::session;
use redis::Connection;

const KEY: &str = "mem:{fault}";

/// A master (and replica) with KEY seeded and a large append to it in
/// flight (blocked); `since` is the worker's count tally before it started.
struct Scene {
    master: Server,
    replica: Option<Server>,
    m: Connection,
    prior: Vec<String>,
    content: String,
    app: Appender,
    since: u64,
}

fn scene(extra: &[&str], with_replica: bool, delay_ms: u64) -> Scene {
    let (master, replica) = if with_replica {
        let (m, r) = master_and_replica(extra);
        (m, Some(r))
    } else {
        (Server::with_args(&[NO_SYNC_DELAY, extra].concat()), None)
    };
    let mut m = conn(master.port, 0);
    let prior = seed(&mut m, KEY);
    if replica.is_some() {
        wait_replicas(&mut m, 1);
    }
    set_delay(&mut m, delay_ms);
    let since = counts(&mut m).unwrap();
    let content = big(1);
    let app = Appender::start(master.port, 0, KEY, &content);
    app.wait_blocked(&mut m);
    Scene {
        master,
        replica,
        m,
        prior,
        content,
        app,
        since,
    }
}

/// The replica caught up and holds what the master holds; both alive.
fn check_replica(s: &mut Scene, what: &str) {
    let replica = s.replica.as_mut().unwrap();
    wait_replicas(&mut s.m, 1);
    assert_replica_same(&mut s.m, &mut conn(replica.port, 0), what);
    assert_no_crash(replica, what);
}

// ------------------------------------------------------------ paused writes

#[test]
fn client_pause_write_holds_the_append_until_the_pause_ends() {
    let mut s = scene(&[], true, DELAY_MS);
    qok(&mut s.m, &["CLIENT", "PAUSE", "10000", "WRITE"]);
    wait_counted(&mut s.m, s.since);
    assert_no_crash(&mut s.master, "count done during CLIENT PAUSE WRITE");
    assert!(
        s.app.is_blocked(&mut s.m),
        "the append must wait while writes are paused"
    );
    expect_session(&mut s.m, KEY, &s.prior, "nothing written during the pause");
    qok(&mut s.m, &["CLIENT", "UNPAUSE"]);
    let out = s.app.outcome();
    assert!(
        matches!(out, Outcome::Applied(_)),
        "a pause is no reason to refuse: {out:?}"
    );
    expect_outcome(
        &out,
        &mut s.m,
        KEY,
        &s.prior,
        &s.content,
        "after CLIENT PAUSE WRITE",
    );
    check_replica(&mut s, "after CLIENT PAUSE WRITE");
    assert_no_crash(&mut s.master, "after CLIENT PAUSE WRITE");
}

#[test]
fn client_pause_all_holds_the_append_until_the_pause_ends() {
    // Under PAUSE ALL no command is served, so the pause ends by itself;
    // it outlasts the 800 ms count by far. (With a replica: a server that
    // propagates nowhere never reaches the paused-propagation assertion.)
    let mut s = scene(&[], true, 800);
    qok(&mut s.m, &["CLIENT", "PAUSE", "2500", "ALL"]);
    let out = s.app.outcome();
    assert_no_crash(&mut s.master, "count done during CLIENT PAUSE ALL");
    assert!(
        matches!(out, Outcome::Applied(_)),
        "a pause is no reason to refuse: {out:?}"
    );
    expect_outcome(
        &out,
        &mut s.m,
        KEY,
        &s.prior,
        &s.content,
        "after CLIENT PAUSE ALL",
    );
    check_replica(&mut s, "after CLIENT PAUSE ALL");
}

#[test]
fn failover_while_counting_applies_once_or_refuses() {
    let mut s = scene(&[], true, DELAY_MS);
    let rport = s.replica.as_ref().unwrap().port;
    let mut r = conn(rport, 0);
    // A stopped replica cannot catch up: FAILOVER keeps writes paused.
    let rpid = pid(&mut r);
    signal(rpid, libc::SIGSTOP);
    qok(&mut s.m, &["FAILOVER"]);
    wait_counted(&mut s.m, s.since);
    assert_no_crash(&mut s.master, "count done while FAILOVER paused writes");
    assert_eq!(
        role(&mut s.m),
        "master",
        "the failover waits for the stopped replica"
    );
    assert!(
        s.app.is_blocked(&mut s.m),
        "the append must wait while writes are paused"
    );
    expect_session(&mut s.m, KEY, &s.prior, "nothing written during the pause");
    signal(rpid, libc::SIGCONT);
    let out = s.app.outcome();
    println!("FAILOVER while counting: {out:?}");
    session::wait_until("roles swapped", 20, || {
        role(&mut r) == "master" && role(&mut s.m) == "slave"
    });
    wait_link_up(&mut s.m);
    expect_outcome(
        &out,
        &mut r,
        KEY,
        &s.prior,
        &s.content,
        "on the new master after FAILOVER",
    );
    wait_replicas(&mut r, 1);
    assert_replica_same(&mut r, &mut s.m, "old master (now replica) after FAILOVER");
    assert_no_crash(&mut s.master, "after FAILOVER");
    assert_no_crash(s.replica.as_mut().unwrap(), "after FAILOVER");
}

#[test]
fn cluster_failover_while_counting_applies_once_or_refuses() {
    // 3 masters (a manual failover needs a majority of them) and a replica
    // of master 0, which owns the key.
    let mut c = Cluster::create(3, &[0], 3000);
    let key = names_in_slots(&mut conn(c.port(0), 0), "cf", 0, 5000, 1).remove(0);
    let slot = keyslot(&mut conn(c.port(0), 0), &key);
    assert_eq!(c.owner(slot), 0);
    let mut m = conn(c.port(0), 0);
    let prior = seed(&mut m, &key);
    wait_replicas(&mut m, 1);
    set_delay(&mut m, DELAY_MS);
    let since = counts(&mut m).unwrap();
    let content = big(2);
    let app = Appender::start(c.port(0), 0, &key, &content);
    app.wait_blocked(&mut m);
    // The other masters stopped: the election cannot win yet, and master 0
    // keeps writes paused for the manual failover meanwhile.
    let others: Vec<i32> = [1, 2]
        .iter()
        .map(|&i| pid(&mut conn(c.port(i), 0)))
        .collect();
    others.iter().for_each(|&p| signal(p, libc::SIGSTOP));
    qok(&mut conn(c.port(3), 0), &["CLUSTER", "FAILOVER"]);
    wait_counted(&mut m, since);
    assert_no_crash(
        &mut c.nodes[0],
        "count done while CLUSTER FAILOVER paused writes",
    );
    assert!(
        app.is_blocked(&mut m),
        "the append must wait while writes are paused"
    );
    others.iter().for_each(|&p| signal(p, libc::SIGCONT));
    let out = app.outcome();
    c.wait_stable("the cluster after the failover", |_| Ok(()));
    let owner = c.owner(slot);
    let other = if owner == 0 { 3 } else { 0 };
    println!("CLUSTER FAILOVER: {out:?}; slot owner now node {owner}");
    let mut oc = conn(c.port(owner), 0);
    expect_outcome(
        &out,
        &mut oc,
        &key,
        &prior,
        &content,
        "on the slot's owner after CLUSTER FAILOVER",
    );
    wait_replicas(&mut oc, 1);
    let mut rc = conn(c.port(other), 0);
    qok(&mut rc, &["READONLY"]);
    assert_replica_same(&mut oc, &mut rc, "replica after CLUSTER FAILOVER");
    for (i, n) in c.nodes.iter_mut().enumerate() {
        assert_no_crash(n, &format!("node {i} after CLUSTER FAILOVER"));
    }
}

/// SIGTERM or SHUTDOWN of a master whose replica is behind: it pauses
/// writes while it waits for the replica, then exits; restarted from its
/// RDB/AOF it holds the append once or not at all, like its replica.
fn stop_master_while_counting(extra: &[&str], stop: impl FnOnce(&mut Scene)) {
    let mut s = scene(extra, true, DELAY_MS);
    let rport = s.replica.as_ref().unwrap().port;
    let mut r = conn(rport, 0);
    let rpid = pid(&mut r);
    signal(rpid, libc::SIGSTOP);
    qok(&mut s.m, &["SET", "fault:lag", "1"]); // the replica is now behind
    stop(&mut s);
    wait_counted(&mut s.m, s.since);
    assert_no_crash(
        &mut s.master,
        "count done while the shutdown waits for the replica",
    );
    assert!(
        s.app.is_blocked(&mut s.m),
        "the append must wait while writes are paused"
    );
    signal(rpid, libc::SIGCONT);
    let out = s.app.outcome();
    wait_exit(&mut s.master, "the master to exit");
    assert_log_clean(&s.master, "shutdown");
    assert!(
        s.master.log().contains("ready to exit"),
        "not a clean shutdown:\n{}",
        log_excerpt(&s.master.log())
    );
    s.master.restart();
    let mut m = conn(s.master.port, 0);
    println!("shutdown while counting: {out:?}");
    expect_outcome(
        &out,
        &mut m,
        KEY,
        &s.prior,
        &s.content,
        "the master restarted from disk",
    );
    wait_link_up(&mut r);
    wait_replicas(&mut m, 1);
    assert_replica_same(&mut m, &mut r, "replica after the master's restart");
    assert_no_crash(&mut s.master, "after the restart");
    assert_no_crash(s.replica.as_mut().unwrap(), "after the restart");
}

#[test]
fn sigterm_of_a_master_waiting_for_its_replica() {
    stop_master_while_counting(&["--appendonly", "yes"], |s| {
        let p = pid(&mut s.m);
        signal(p, libc::SIGTERM);
    });
}

#[test]
fn shutdown_of_a_master_waiting_for_its_replica() {
    stop_master_while_counting(&[], |s| {
        let mut con = conn(s.master.port, 0);
        // SHUTDOWN blocks its client until the server exits.
        std::thread::spawn(move || {
            let _ = q(&mut con, &["SHUTDOWN", "SAVE"]);
        });
        session::wait_until("the SHUTDOWN waiting", 15, || {
            let list: String =
                redis::from_redis_value(&qok(&mut s.m, &["CLIENT", "LIST"])).unwrap();
            list.lines().any(|l| l.contains(" cmd=shutdown "))
        });
    });
}

// ------------------------------------------------------------ the server turning replica

#[test]
fn replicaof_while_counting_refuses_and_the_chain_stays_identical() {
    let mut s = scene(&[], true, DELAY_MS);
    let mut other = Server::with_args(NO_SYNC_DELAY);
    let mut o = conn(other.port, 0);
    qok(
        &mut o,
        &[
            "MEM.APPEND",
            "mem:{elsewhere}",
            "user",
            "the new master's data",
        ],
    );
    qok(
        &mut s.m,
        &["REPLICAOF", "127.0.0.1", &other.port.to_string()],
    );
    let out = s.app.outcome();
    wait_link_up(&mut s.m);
    wait_counted(&mut s.m, s.since);
    assert_no_crash(&mut s.master, "count done after REPLICAOF");
    println!("REPLICAOF while counting: {out:?}");
    // The owner of the data is now the other master, which never saw KEY.
    expect_outcome(&out, &mut o, KEY, &[], &s.content, "the new master");
    wait_replicas(&mut o, 1);
    assert_replica_same(&mut o, &mut s.m, "the old master, now a replica");
    let mut r = conn(s.replica.as_ref().unwrap().port, 0);
    session::wait_until("the chained replica caught up", 20, || {
        qok(&mut r, &["DEBUG", "DIGEST"]) == qok(&mut o, &["DEBUG", "DIGEST"])
    });
    assert_replica_same(&mut o, &mut r, "the chained replica");
    assert_no_crash(&mut other, "the new master");
    assert_no_crash(s.replica.as_mut().unwrap(), "the chained replica");
}

// ------------------------------------------------------------ slot migration

/// Two masters; KEY's slot on node 0 seeded; a large append in flight on
/// node 0; the slot then marked IMPORTING/MIGRATING and the key MIGRATEd.
fn migrating_scene() -> (Cluster, String, u16, Vec<String>, String, Appender) {
    let c = Cluster::create(2, &[], 2000);
    let key = names_in_slots(&mut conn(c.port(0), 0), "mig", 0, 8000, 1).remove(0);
    let slot = keyslot(&mut conn(c.port(0), 0), &key);
    assert_eq!(c.owner(slot), 0);
    let mut src = conn(c.port(0), 0);
    let prior = seed(&mut src, &key);
    set_delay(&mut src, DELAY_MS);
    let content = big(3);
    let app = Appender::start(c.port(0), 0, &key, &content);
    app.wait_blocked(&mut src);
    let (s, src_id, dst_id) = (slot.to_string(), c.id(0), c.id(1));
    qok(
        &mut conn(c.port(1), 0),
        &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id],
    );
    qok(&mut src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]);
    let dst_port = c.port(1).to_string();
    qok(
        &mut src,
        &[
            "MIGRATE",
            "127.0.0.1",
            &dst_port,
            "",
            "0",
            "10000",
            "KEYS",
            &key,
        ],
    );
    (c, key, slot, prior, content, app)
}

fn finish_migration(c: &Cluster, slot: u16) {
    let (s, dst_id) = (slot.to_string(), c.id(1));
    qok(
        &mut conn(c.port(1), 0),
        &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id],
    );
    // Refused while the source still holds keys of the slot.
    qok(
        &mut conn(c.port(0), 0),
        &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id],
    );
}

/// No key of `slot` on the source; a redirect is followed (as a cluster
/// client would) and must land once on the target; the target then holds
/// the append exactly once or not at all.
fn check_migrated(
    c: &mut Cluster,
    key: &str,
    slot: u16,
    prior: &[String],
    content: &str,
    out: Outcome,
) {
    println!("slot migration while counting: {out:?}");
    let mut src = conn(c.port(0), 0);
    let stray = qint(&mut src, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
    assert_eq!(
        stray, 0,
        "the source wrote a session in slot {slot}, which it no longer serves ({out:?})"
    );
    let mut dst = conn(c.port(1), 0);
    let out = match out {
        Outcome::Refused {
            code,
            redirect: Some((addr, s)),
            ..
        } => {
            assert_eq!(
                (addr.as_str(), s),
                (format!("127.0.0.1:{}", c.port(1)).as_str(), slot),
                "redirect target"
            );
            if code == "ASK" {
                qok(&mut dst, &["ASKING"]);
            }
            let r = qok(&mut dst, &["MEM.APPEND", key, "user", content]);
            Outcome::Applied(as_fields(r))
        }
        other => other,
    };
    expect_outcome(&out, &mut dst, key, prior, content, "on the target");
    for (i, n) in c.nodes.iter_mut().enumerate() {
        assert_no_crash(n, &format!("node {i} after the migration"));
    }
}

#[test]
fn slot_moved_while_counting_redirects_or_lands_on_the_new_owner() {
    let (mut c, key, slot, prior, content, app) = migrating_scene();
    finish_migration(&c, slot);
    assert!(
        app.is_blocked(&mut conn(c.port(0), 0)),
        "the count ended before the slot moved"
    );
    let out = app.outcome();
    check_migrated(&mut c, &key, slot, &prior, &content, out);
}

#[test]
fn key_migrated_out_of_a_migrating_slot_while_counting_is_not_recreated() {
    let (mut c, key, slot, prior, content, app) = migrating_scene();
    assert!(
        app.is_blocked(&mut conn(c.port(0), 0)),
        "the count ended before the key moved"
    );
    let out = app.outcome();
    // A fresh command on a key gone from a MIGRATING slot gets -ASK.
    let stray = qint(
        &mut conn(c.port(0), 0),
        &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
    );
    assert_eq!(
        stray, 0,
        "the source created a session in a MIGRATING slot whose key had left ({out:?})"
    );
    finish_migration(&c, slot);
    c.wait_stable("the slot moved", |c| {
        if c.owner(slot) == 1 {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    check_migrated(&mut c, &key, slot, &prior, &content, out);
}

// ------------------------------------------------------------ the key changed meanwhile

/// The key replaced by `fault` during the count: applied, the append lands
/// as a fresh command would (on what the key holds now), exactly once.
fn key_changed(fault: impl FnOnce(&mut Connection), now: &[String], what: &str) {
    let mut s = scene(&[], true, DELAY_MS);
    fault(&mut s.m);
    assert!(
        s.app.is_blocked(&mut s.m),
        "{what}: the count ended before the fault"
    );
    let out = s.app.outcome();
    println!("{what} while counting: {out:?}");
    assert_no_crash(&mut s.master, what);
    expect_outcome(&out, &mut s.m, KEY, now, &s.content, what);
    check_replica(&mut s, what);
}

#[test]
fn flushall_while_counting_gives_a_fresh_session() {
    key_changed(|m| drop(qok(m, &["FLUSHALL"])), &[], "FLUSHALL");
}

#[test]
fn del_while_counting_gives_a_fresh_session() {
    key_changed(|m| assert_eq!(qint(m, &["DEL", KEY]), 1), &[], "DEL");
}

#[test]
fn expiry_while_counting_gives_a_fresh_session() {
    key_changed(
        |m| {
            assert_eq!(qint(m, &["PEXPIRE", KEY, "100"]), 1);
            session::wait_until("the key expired", 10, || qint(m, &["EXISTS", KEY]) == 0);
        },
        &[],
        "PEXPIRE 100",
    );
}

#[test]
fn swapdb_while_counting_appends_to_what_db0_holds_now() {
    let mut s = scene(&[], true, DELAY_MS);
    let mut db1 = conn(s.master.port, 1);
    let theirs: Vec<String> = (1..=3).map(|i| format!("db1 message {i}")).collect();
    for t in &theirs {
        qok(&mut db1, &["MEM.APPEND", KEY, "user", t]);
    }
    qok(&mut s.m, &["SWAPDB", "0", "1"]);
    assert!(s.app.is_blocked(&mut s.m), "the count ended before SWAPDB");
    let out = s.app.outcome();
    println!("SWAPDB while counting: {out:?}");
    assert_no_crash(&mut s.master, "SWAPDB");
    expect_outcome(
        &out,
        &mut s.m,
        KEY,
        &theirs,
        &s.content,
        "db 0 after SWAPDB",
    );
    expect_session(&mut db1, KEY, &s.prior, "db 1 after SWAPDB");
    check_replica(&mut s, "SWAPDB (db 0)");
    let rport = s.replica.as_ref().unwrap().port;
    assert_replica_same(&mut db1, &mut conn(rport, 1), "SWAPDB (db 1)");
}

// ------------------------------------------------------------ the client, memory

#[test]
fn client_killed_while_counting_changes_nothing() {
    let mut s = scene(&[], false, DELAY_MS);
    let id = s.app.wait_blocked(&mut s.m);
    assert_eq!(qint(&mut s.m, &["CLIENT", "KILL", "ID", &id]), 1);
    let out = s.app.outcome();
    assert!(matches!(out, Outcome::Closed(_)), "{out:?}");
    wait_counted(&mut s.m, s.since);
    assert_no_crash(&mut s.master, "count done for a killed client");
    expect_session(&mut s.m, KEY, &s.prior, "after the client was killed");
    let r = as_fields(qok(
        &mut s.m,
        &["MEM.APPEND", KEY, "user", "still writable"],
    ));
    assert_eq!(int_field(&r, "id"), 3);
}

#[test]
fn oom_while_counting_refuses_or_applies_whole() {
    let mut s = scene(&["--maxmemory-policy", "noeviction"], true, DELAY_MS);
    let used: u64 = session::info_field(&mut s.m, "memory", "used_memory")
        .unwrap()
        .parse()
        .unwrap();
    qok(
        &mut s.m,
        &[
            "CONFIG",
            "SET",
            "maxmemory",
            &(used + 16 * 1024).to_string(),
        ],
    );
    let out = s.app.outcome();
    println!("OOM while counting: {out:?}");
    assert!(
        matches!(out, Outcome::Applied(_)) || out.code() == Some("OOM"),
        "{out:?}"
    );
    qok(&mut s.m, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_no_crash(&mut s.master, "OOM");
    expect_outcome(&out, &mut s.m, KEY, &s.prior, &s.content, "OOM");
    check_replica(&mut s, "OOM");
}

#[test]
fn oom_when_the_count_ends_refuses_like_a_fresh_command() {
    let mut s = scene(&["--maxmemory-policy", "noeviction"], true, DELAY_MS);
    let used: u64 = session::info_field(&mut s.m, "memory", "used_memory")
        .unwrap()
        .parse()
        .unwrap();
    qok(
        &mut s.m,
        &["CONFIG", "SET", "maxmemory", &(used / 2).to_string()],
    );
    // Premise: a fresh append is refused now.
    let e = q(&mut s.m, &["MEM.APPEND", "mem:{fresh}", "user", "small"]).unwrap_err();
    assert_eq!(e.code(), Some("OOM"), "{e}");
    assert!(
        s.app.is_blocked(&mut s.m),
        "the count ended before maxmemory was lowered"
    );
    let out = s.app.outcome();
    qok(&mut s.m, &["CONFIG", "SET", "maxmemory", "0"]);
    assert_no_crash(&mut s.master, "OOM");
    assert_eq!(
        out.code(),
        Some("OOM"),
        "the resumed append must pass the OOM check: {out:?}"
    );
    expect_outcome(&out, &mut s.m, KEY, &s.prior, &s.content, "OOM");
    check_replica(&mut s, "OOM");
}

// ------------------------------------------------------------ off the main thread

#[test]
fn a_large_count_runs_off_the_main_thread() {
    let mut s = scene(&[], false, DELAY_MS);
    // While the large append waits for its worker, the main thread serves
    // others: reads, and a write to another session.
    let pong: String = redis::from_redis_value(&qok(&mut s.m, &["PING"])).unwrap();
    assert_eq!(pong, "PONG");
    let info = as_fields(qok(
        &mut s.m,
        &["MEM.APPEND", "mem:{other}", "user", "small"],
    ));
    assert_eq!(int_field(&info, "id"), 1);
    let info = as_fields(qok(&mut s.m, &["MEM.INFO", "mem:{other}"]));
    assert_eq!(int_field(&info, "messages"), 1);
    expect_session(&mut s.m, KEY, &s.prior, "the large append not yet applied");
    assert!(
        s.app.is_blocked(&mut s.m),
        "the appending client is blocked, not holding the main thread"
    );
    let out = s.app.outcome();
    expect_outcome(&out, &mut s.m, KEY, &s.prior, &s.content, "after the count");
    assert!(matches!(out, Outcome::Applied(_)), "{out:?}");
    assert_no_crash(&mut s.master, "off-thread count");
}
