//! Integration tests of the limits that make every value round-trip (SPEC §5
//! v2): TTLs and EX bounded to 100 years (Redis 7.0 adds its clock to a
//! relative expiry without an overflow check: an unbounded TTL wrapped and
//! deleted the key right after OK), ids bounded to 2^53-1, META and imported
//! members that `FORMAT JSON` gives back to MEM.IMPORT.

use crate::support::reply::*;
use crate::support::server::*;
use serde_json::{json, Value as Json};

const MAX_TTL: i64 = 3_153_600_000;
const MAX_ID: u64 = (1 << 53) - 1;

/// PTTL right after a write with the largest TTL.
fn assert_max_pttl(con: &mut redis::Connection, key: &str) {
    let p = int(con, &["PTTL", key]);
    assert!(
        p <= MAX_TTL * 1000 && p > MAX_TTL * 1000 - 10_000,
        "{key}: PTTL {p}, want 100 years"
    );
}

fn one_message_doc() -> String {
    json!({"conversation_history": [{"role": "user", "content": "hi"}]}).to_string()
}

#[test]
fn huge_ttls_are_refused_and_the_largest_keeps_the_key() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{ttl}";
    append(&mut con, k, "user", "first", &[]);
    let before = snap(&mut con, k);
    for (args, needle) in [
        (
            vec!["MEM.APPEND", k, "user", "x", "TTL", "9223372036854775807"],
            "ERR TTL must be at most 3153600000",
        ),
        (
            vec!["MEM.APPEND", k, "user", "x", "TTL", "3153600001"],
            "ERR TTL must be at most 3153600000",
        ),
        (
            vec!["MEM.APPEND", k, "user", "x", "TTL", "18446744073709551615"],
            "ERR TTL is not an integer",
        ),
        (
            vec!["MEM.EXTSET", k, "dify", "c", "EX", "9223372036854775807"],
            "ERR EX must be at most 3153600000",
        ),
        (
            vec!["MEM.EXTSET", k, "dify", "c", "EX", "3153600001"],
            "ERR EX must be at most 3153600000",
        ),
        (
            vec![
                "MEM.IMPORT",
                k,
                &one_message_doc(),
                "REPLACE",
                "TTL",
                "9223372036854775807",
            ],
            "ERR TTL must be at most",
        ),
    ] {
        assert_err(&mut con, &args, needle);
        assert_unchanged(&mut con, k, &before, &format!("{args:?}"));
    }
    assert_err(
        &mut con,
        &[
            "MEM.IMPORT",
            "mem:{ttl}:new",
            &one_message_doc(),
            "TTL",
            "3153600001",
        ],
        "ERR TTL must be at most",
    );
    assert_eq!(int(&mut con, &["EXISTS", "mem:{ttl}:new"]), 0);
    for (name, value) in [
        ("mem.ttl", "9223372036854775"),
        ("mem.ttl", "3153600001"),
        ("mem.ext-ttl", "9223372036854775"),
        ("mem.ext-ttl", "3153600001"),
    ] {
        let e = err(&mut con, &["CONFIG", "SET", name, value]);
        assert!(
            e.starts_with("ERR") && e.contains("3153600000"),
            "CONFIG SET {name} {value}: {e}"
        );
        assert_eq!(config_get(&mut con, name), "86400");
    }

    // The largest accepted values leave the key alive, 100 years out.
    let max = MAX_TTL.to_string();
    append(&mut con, k, "user", "for a century", &["TTL", &max]);
    assert_max_pttl(&mut con, k);
    ok(
        &mut con,
        &[
            "MEM.IMPORT",
            "mem:{ttl}:imp",
            &one_message_doc(),
            "TTL",
            &max,
        ],
    );
    assert_max_pttl(&mut con, "mem:{ttl}:imp");
    ok(
        &mut con,
        &["MEM.EXTSET", "mem:{ttl}:ext", "dify", "c", "EX", &max],
    );
    assert_max_pttl(&mut con, "mem:{ttl}:ext");
    assert_eq!(
        string(&mut con, &["MEM.EXTGET", "mem:{ttl}:ext", "dify"]),
        "c"
    );
    ok(&mut con, &["CONFIG", "SET", "mem.ttl", &max]);
    append(&mut con, "mem:{ttl}:cfg", "user", "default ttl", &[]);
    assert_max_pttl(&mut con, "mem:{ttl}:cfg");
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.ttl", "60", "mem.ext-ttl", &max],
    );
    ok(&mut con, &["MEM.EXTSET", "mem:{ttl}:extcfg", "dify", "c"]);
    assert_max_pttl(&mut con, "mem:{ttl}:extcfg");
    // A key PEXPIREd beyond 100 years comes back to 100 years on EXTSET
    // (never earlier than the id's expiry), and stays.
    append(&mut con, "mem:{ttl}:far", "user", "x", &["TTL", "0"]);
    ok(
        &mut con,
        &["PEXPIRE", "mem:{ttl}:far", "9000000000000000000"],
    );
    ok(
        &mut con,
        &["MEM.EXTSET", "mem:{ttl}:far", "dify", "c", "EX", &max],
    );
    assert_max_pttl(&mut con, "mem:{ttl}:far");

    let keys = [
        k,
        "mem:{ttl}:imp",
        "mem:{ttl}:ext",
        "mem:{ttl}:cfg",
        "mem:{ttl}:extcfg",
        "mem:{ttl}:far",
    ];
    ok(&mut con, &["DEBUG", "RELOAD"]);
    for key in keys {
        assert_eq!(
            int(&mut con, &["EXISTS", key]),
            1,
            "{key} after DEBUG RELOAD"
        );
        assert_max_pttl(&mut con, key);
    }
    assert_eq!(int_field(&info(&mut con, k), "ttl"), MAX_TTL);
}

#[test]
fn ids_stop_at_2_pow_53_minus_1_and_are_never_clamped() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{id}";
    let doc = |id: u64| {
        json!({"conversation_history": [{"id": id - 1, "role": "user", "content": "a"}, {"id": id, "role": "assistant", "content": "b"}]}).to_string()
    };
    let r = map_reply(&mut con, &["MEM.IMPORT", k, &doc(MAX_ID)]);
    assert_eq!(int_field(&r, "id") as u64, MAX_ID);
    assert_eq!(
        ids(&get(&mut con, &["MEM.GET", k])),
        [MAX_ID as i64 - 1, MAX_ID as i64]
    );
    assert_eq!(int_field(&info(&mut con, k), "last_id") as u64, MAX_ID);
    let exported = json_text(&mut con, k);
    assert_eq!(
        serde_json::from_str::<Json>(&exported).unwrap()["conversation_history"][1]["id"],
        json!(MAX_ID)
    );

    // No id left: refused, nothing changed (also on the re-count path of a
    // model change, which would otherwise touch every message first).
    let before = snap(&mut con, k);
    for opts in [
        vec![],
        vec!["MODEL", "gpt-4"],
        vec!["TTL", "5", "MAXMSGS", "1"],
    ] {
        let mut args = vec!["MEM.APPEND", k, "user", "one more"];
        args.extend(&opts);
        assert_err(&mut con, &args, "ERR the session has used every message id");
        assert_unchanged(&mut con, k, &before, &format!("append {opts:?} at MAX_ID"));
    }
    // The exported document imports as is.
    ok(&mut con, &["MEM.IMPORT", "mem:{id}:copy", &exported]);
    assert_eq!(json_text(&mut con, "mem:{id}:copy"), exported);
    // A summary up to the last id still works; appends stay refused.
    let r = map_reply(
        &mut con,
        &["MEM.SUMMARIZE", k, &MAX_ID.to_string(), "all of it"],
    );
    assert_eq!(
        (int_field(&r, "id") as u64, int_field(&r, "messages")),
        (MAX_ID, 0)
    );
    assert_eq!(int_field(&info(&mut con, k), "summary_upto") as u64, MAX_ID);
    assert_err(
        &mut con,
        &["MEM.APPEND", k, "user", "x"],
        "every message id",
    );

    // Larger ids and upto are refused by MEM.IMPORT, nothing created.
    let summary_doc = |upto: u64| {
        json!({"conversation_history": [], "summary": {"content": "s", "upto": upto}}).to_string()
    };
    for (d, needle) in [
        (
            doc(MAX_ID + 1),
            "id must be an integer from 1 to 9007199254740991",
        ),
        (
            doc(i64::MAX as u64),
            "id must be an integer from 1 to 9007199254740991",
        ),
        (
            doc(u64::MAX),
            "id must be an integer from 1 to 9007199254740991",
        ),
        (
            summary_doc(MAX_ID + 1),
            "summary.upto must be an integer from 1 to 9007199254740991",
        ),
    ] {
        assert_err(&mut con, &["MEM.IMPORT", "mem:{id}:big", &d], needle);
        assert_eq!(int(&mut con, &["EXISTS", "mem:{id}:big"]), 0);
        let before = snap(&mut con, "mem:{id}:copy");
        assert_err(
            &mut con,
            &["MEM.IMPORT", "mem:{id}:copy", &d, "REPLACE"],
            needle,
        );
        assert_unchanged(
            &mut con,
            "mem:{id}:copy",
            &before,
            "import REPLACE with a too large id",
        );
    }
    // A summary up to MAX_ID leaves no id for a message without one.
    let d = json!({"conversation_history": [{"role": "user", "content": "x"}], "summary": {"content": "s", "upto": MAX_ID}});
    assert_err(
        &mut con,
        &["MEM.IMPORT", "mem:{id}:big", &d.to_string()],
        "every message id",
    );
}

/// An object nested `depth` deep (`{}` is 1).
fn nested(depth: usize) -> String {
    format!(
        "{}{{}}{}",
        r#"{"a":"#.repeat(depth - 1),
        "}".repeat(depth - 1)
    )
}

#[test]
fn meta_and_imported_members_that_would_not_round_trip_are_refused() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{meta}";
    append(&mut con, k, "user", "first", &[]);
    let before = snap(&mut con, k);
    let far = nested(100_000);
    for (meta, needle) in [
        (r#"{"a":"\ud800"}"#, "ERR META is not valid JSON"),
        (r#"{"a":"\udc00x"}"#, "ERR META is not valid JSON"),
        (r#"{"\ud800":1}"#, "ERR META is not valid JSON"),
        (
            r#"{"n":1e400}"#,
            "ERR META is not valid JSON: number out of range",
        ),
        (r#"{"n":[-1e400]}"#, "number out of range"),
        (&nested(125), "ERR META is nested deeper than 124 levels"),
        (&far, "ERR META is nested deeper than 124 levels"),
        ("[1]", "ERR META must be a JSON object"),
    ] {
        assert_err(
            &mut con,
            &["MEM.APPEND", k, "assistant", "x", "META", meta],
            needle,
        );
        assert_unchanged(&mut con, k, &before, &format!("META {:.40}", meta));
    }

    // What is accepted comes back through FORMAT JSON and MEM.IMPORT.
    let deepest = nested(124);
    let accepted = [
        deepest.as_str(),
        r#"{"rocket":"\ud83d\ude80","n":1e308,"z":-0,"big":123456789012345678901234567890,"s":"\u0000"}"#,
    ];
    for meta in accepted {
        append(&mut con, k, "assistant", "x", &["META", meta]);
    }
    let members = json!({"profile": serde_json::from_str::<Json>(&nested(126)).unwrap(), "context": {"n": 1.5e300}});
    let mut doc: Json = serde_json::from_str(&json_text(&mut con, k)).unwrap();
    doc.as_object_mut()
        .unwrap()
        .extend(members.as_object().unwrap().clone());
    let doc = doc.to_string();
    assert!(
        serde_json::from_str::<Json>(&doc).is_ok(),
        "the test document is within serde_json's limit"
    );
    ok(&mut con, &["MEM.IMPORT", "mem:{meta}:a", &doc]);
    let first = json_text(&mut con, "mem:{meta}:a");
    ok(&mut con, &["MEM.IMPORT", "mem:{meta}:b", &first]);
    let second = json_text(&mut con, "mem:{meta}:b");
    let parsed = |t: &str| serde_json::from_str::<Json>(t).expect("FORMAT JSON parses");
    assert_eq!(
        parsed(&second),
        parsed(&first),
        "FORMAT JSON -> MEM.IMPORT -> FORMAT JSON"
    );
    assert_eq!(
        parsed(&first)["conversation_history"][1]["meta"],
        parsed(&deepest)
    );
    assert_eq!(parsed(&first)["profile"], members["profile"]);

    // Imported documents carrying what would not come back are refused.
    let with_meta = |meta: &str| {
        format!(r#"{{"conversation_history":[{{"role":"user","content":"x","meta":{meta}}}]}}"#)
    };
    for bad in [
        with_meta(r#"{"a":"\ud800"}"#),
        with_meta(r#"{"n":1e400}"#),
        r#"{"conversation_history":[],"profile":{"n":1e400}}"#.to_owned(),
        r#"{"conversation_history":[],"profile":"\udfff"}"#.to_owned(),
        format!(r#"{{"conversation_history":[],"profile":{}}}"#, nested(127)),
    ] {
        assert_err(
            &mut con,
            &["MEM.IMPORT", "mem:{meta}:bad", &bad],
            "ERR invalid document",
        );
        assert_eq!(int(&mut con, &["EXISTS", "mem:{meta}:bad"]), 0);
    }
}

#[test]
fn per_session_caps_are_bounded_by_the_operator_limits() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(config_get(&mut con, "mem.max-tokens-limit"), "10000000");
    assert_eq!(config_get(&mut con, "mem.max-messages-limit"), "100000");
    append(
        &mut con,
        "mem:{cap}",
        "user",
        "hi",
        &["MAXTOKENS", "10000000", "MAXMSGS", "100000"],
    );
    let before = snap(&mut con, "mem:{cap}");
    for (opt, value, limit) in [
        ("MAXTOKENS", "10000001", "mem.max-tokens-limit"),
        ("MAXMSGS", "100001", "mem.max-messages-limit"),
    ] {
        let e = err(
            &mut con,
            &["MEM.APPEND", "mem:{cap}", "user", "x", opt, value],
        );
        assert!(e.contains(limit) && e.starts_with("ERR"), "{e}");
        assert_unchanged(&mut con, "mem:{cap}", &before, opt);
        let batch = r#"[{"role":"user","content":"x"}]"#;
        assert!(err(
            &mut con,
            &["MEM.APPENDBATCH", "mem:{cap}", batch, opt, value]
        )
        .contains(limit));
        assert_unchanged(&mut con, "mem:{cap}", &before, opt);
    }
    // The operator lowers a limit: larger caps are refused from then on.
    ok(&mut con, &["CONFIG", "SET", "mem.max-messages-limit", "50"]);
    assert!(err(
        &mut con,
        &["MEM.APPEND", "mem:{new}", "user", "x", "MAXMSGS", "51"]
    )
    .contains("at most 50"));
    assert_eq!(
        int_field(
            &append(&mut con, "mem:{new}", "user", "x", &["MAXMSGS", "50"]),
            "id"
        ),
        1
    );
}
