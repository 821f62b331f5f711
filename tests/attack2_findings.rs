//! attack2: defects found attacking the v2 features (leases x MAXAGE,
//! MSGID retries x MAXAGE, attributes' cost). Each test fails today.

mod cmdkit;
mod common;
mod relkit;

use std::time::Duration;

use cmdkit::*;
use common::*;

fn fields(con: &mut redis::Connection, args: &[&str]) -> Vec<(String, redis::Value)> {
    as_fields(ok(con, args))
}

/// SPEC MAXAGE: "reads never return them, even before the next write";
/// SUMMARIZE_BEGIN is "the MEM.SUMMARIZE_CHECK map plus lease". Today
/// MEM.SUMMARIZE_BEGIN (src/commands/lease.rs:31, `session.begin` on the raw
/// session, not `session.live(now)`) counts messages past maxage, reports
/// summarize 1 / messages 30 where MEM.SUMMARIZE_CHECK says 0 / 0, and grants
/// a lease for an `upto` that MEM.SUMMARIZE then refuses (the id was aged
/// out): the worker makes an LLM call for nothing and the lease blocks.
#[test]
fn attack2_summarize_begin_counts_messages_past_maxage() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{aged-begin}";
    for i in 1..=30 {
        append(&mut con, k, "user", &format!("m{i}"), &["MAXAGE", "1"]);
    }
    std::thread::sleep(Duration::from_millis(1300));
    let check = fields(&mut con, &["MEM.SUMMARIZE_CHECK", k]);
    assert_eq!(int_field(&check, "messages"), 0);
    let begin = fields(&mut con, &["MEM.SUMMARIZE_BEGIN", k, "60000"]);
    let mismatch = [
        "summarize",
        "total_tokens",
        "messages",
        "upto",
        "upto_tokens",
    ]
    .iter()
    .filter(|f| int_field(&begin, f) != int_field(&check, f))
    .map(|f| {
        format!(
            "{f}: check {} begin {}",
            int_field(&check, f),
            int_field(&begin, f)
        )
    })
    .collect::<Vec<_>>();
    let lease = int_field(&begin, "lease");
    let upto = int_field(&begin, "upto");
    let committed = if lease > 0 {
        cmd(
            &mut con,
            &[
                "MEM.SUMMARIZE",
                k,
                &upto.to_string(),
                "sum",
                "LEASE",
                &lease.to_string(),
            ],
        )
        .map(drop)
        .map_err(|e| e.to_string())
    } else {
        Ok(())
    };
    assert!(
        mismatch.is_empty() && committed.is_ok(),
        "SUMMARIZE_BEGIN disagrees with SUMMARIZE_CHECK on a session whose messages are past maxage: {mismatch:?}; lease {lease} for upto {upto}, MEM.SUMMARIZE with it: {committed:?}"
    );
}

/// SPEC MSGID: a retry's reply carries "the session's current totals"; MAXAGE:
/// reads never return aged messages. Today the duplicate reply
/// (src/commands/write.rs:56 -> Session::duplicate_outcome, retry.rs, on the
/// raw session) reports the messages past maxage: `messages 30`,
/// `total_tokens 180`, `summarize 1`, while MEM.INFO says 0 / 0.
#[test]
fn attack2_retry_reply_counts_messages_past_maxage() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{aged-retry}";
    for i in 1..=30 {
        append(
            &mut con,
            k,
            "user",
            &format!("m{i}"),
            &["MAXAGE", "1", "MSGID", &format!("q{i}")],
        );
    }
    std::thread::sleep(Duration::from_millis(1300));
    let inf = info(&mut con, k);
    let r = append(&mut con, k, "user", "m30", &["MSGID", "q30"]);
    assert_eq!(int_field(&r, "duplicate"), 1);
    assert_eq!(
        (
            int_field(&r, "messages"),
            int_field(&r, "total_tokens"),
            int_field(&r, "summarize")
        ),
        (
            int_field(&inf, "messages"),
            int_field(&inf, "total_tokens"),
            0
        ),
        "a retry's reply shows messages past maxage that MEM.INFO/MEM.GET no longer show"
    );
}
