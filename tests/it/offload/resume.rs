//! attack3 (issue 12's MessageLog): large appends (>= 64 KB, counted on the
//! pool) that resume on a session other clients changed meanwhile:
//! evictions at the caps, a summary of everything, a refill. Each resumed
//! message lands whole, in order, readable, with the replica in step.

use crate::support::faults::{
    assert_replica_same, conn, master_and_replica, set_delay, wait_replicas, Appender, Outcome,
};
use crate::support::reply::*;
use crate::support::server::*;
use crate::support::session;

fn small(i: usize) -> String {
    format!("{i:05} {}", varied_text(1500, i))
}

#[test]
fn resumed_large_appends_on_a_session_changed_meanwhile() {
    let (master, replica) = master_and_replica(&[]);
    let mut m = conn(master.port, 0);
    let mut r = conn(replica.port, 0);
    let k = "mem:{res3}";
    for i in 0..40 {
        append(&mut m, k, "user", &small(i), &["MAXMSGS", "40"]);
    }
    let mut expected_large = Vec::new();
    for round in 0..4 {
        set_delay(&mut m, 400);
        let large = format!("round {round} {}", varied_text(90_000, 1000 + round));
        let a = Appender::start(master.port, 0, k, &large);
        a.wait_blocked(&mut m);
        // While it is counted: appends at the cap, then per round a
        // different change: summarize all, summarize some, import-free
        // eviction by a lower cap, nothing.
        for i in 0..50 {
            append(
                &mut m,
                k,
                "assistant",
                &small(100 * round + i),
                &["MAXMSGS", "40"],
            );
        }
        match round {
            0 => {
                let last = get(&mut m, &["MEM.GET", k, "LAST", "1"]).last().unwrap().id;
                ok(
                    &mut m,
                    &["MEM.SUMMARIZE", k, &last.to_string(), "all so far"],
                );
            }
            1 => {
                let upto = int_field(
                    &map_reply(&mut m, &["MEM.SUMMARIZE_CHECK", k, "KEEP", "5"]),
                    "upto",
                )
                .to_string();
                ok(&mut m, &["MEM.SUMMARIZE", k, &upto, "most so far"]);
            }
            2 => {
                append(&mut m, k, "user", "shrink", &["MAXMSGS", "3"]);
            }
            _ => {}
        }
        set_delay(&mut m, 0);
        match a.outcome() {
            Outcome::Applied(f) => {
                let id = int_field(&f, "id");
                expected_large.push((id, large.clone()));
                let got = get(&mut m, &["MEM.GET", k, "AFTER", &(id - 1).to_string()]);
                assert_eq!(got[0].id, id);
                assert_eq!(
                    got[0].content, large,
                    "round {round}: the resumed message reads back wrong"
                );
                assert_eq!(got[0].tokens, mt_o("user", &large));
            }
            other => panic!("round {round}: {other:?}"),
        }
        session::check_consistent(&mut m, k);
        wait_replicas(&mut m, 1);
        assert_replica_same(&mut m, &mut r, &format!("round {round}"));
    }
    // Every message still held reads back as its own (the large ones by id).
    let held = get(&mut m, &["MEM.GET", k]);
    for (id, text) in &expected_large {
        if let Some(e) = held.iter().find(|e| e.id == *id) {
            assert_eq!(&e.content, text);
        }
    }
    let before = session::snap(&mut m, k);
    ok(&mut m, &["DEBUG", "RELOAD"]);
    session::assert_same(&before, &session::snap(&mut m, k), "DEBUG RELOAD", 2000);
}
