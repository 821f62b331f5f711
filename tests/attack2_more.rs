//! attack2: retries against a replica (no replication, no TTL change),
//! concurrent lease grabs, and imported members ATTRDEL cannot name.

mod cmdkit;
mod common;
mod relkit;

use cmdkit::*;
use common::*;

fn offset(con: &mut redis::Connection) -> i64 {
    relkit::info_field(con, "replication", "master_repl_offset")
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn attack2_retries_replicate_nothing() {
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
    let pttl = relkit::pttl(&mut con, k);
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
    assert!((relkit::pttl(&mut con, k) - pttl).abs() < 1000);
    assert_eq!(relkit::digest(&mut con, k), relkit::digest(&mut rcon, k));
}

#[test]
fn attack2_concurrent_summarize_begin_grants_one_lease() {
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
                    int_field(
                        &as_fields(ok(
                            &mut c,
                            &["MEM.SUMMARIZE_BEGIN", "mem:{lease-race}", "50"],
                        )),
                        "lease",
                    )
                })
            })
            .collect();
        let leases: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let n = leases.iter().filter(|l| **l > 0).count();
        assert!(
            n <= 1,
            "round {round}: two workers hold a lease: {leases:?}"
        );
        granted += n;
        std::thread::sleep(std::time::Duration::from_millis(60)); // let it expire
    }
    assert!(
        granted >= 15,
        "expired leases blocked: {granted} of 20 rounds granted"
    );
}

/// MEM.IMPORT keeps every other member verbatim, including names ATTRSET
/// would refuse ("" and names over 64 bytes); MEM.ATTRGET lists them, but
/// MEM.ATTRDEL (and ATTRSET) refuse the name ("ERR attribute name must be 1
/// to 64 bytes", src/commands/attrs.rs attr_name -> check_attr_name), so an
/// attribute the session holds can never be removed member by member.
#[test]
fn attack2_imported_member_attrdel_cannot_remove() {
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
