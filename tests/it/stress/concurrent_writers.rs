//! Concurrent writers on one session, with a summarizer racing them: every
//! acknowledged append is present once, in each client's order, and the
//! session stays consistent.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::support::server::*;
use crate::support::session::*;

const BIG_CAPS: [&str; 4] = ["MAXMSGS", "100000", "MAXTOKENS", "10000000"];

fn setup_big(con: &mut redis::Connection, key: &str) {
    let mut args = vec!["MEM.APPEND", key, "system", "setup", "TTL", "0"];
    args.extend(BIG_CAPS);
    ok(con, &args);
}

/// Runs `writers` threads of `per` appends each on `key`; returns, per
/// writer, the (id, content) of each acknowledged append in order.
fn run_writers(server: &Server, key: &str, writers: usize, per: usize) -> Vec<Vec<(u64, String)>> {
    let handles: Vec<_> = (0..writers)
        .map(|t| {
            let mut con = server.client();
            let key = key.to_owned();
            std::thread::spawn(move || {
                (0..per)
                    .map(|i| {
                        let content = format!("client {t} message {i}");
                        let f = map_reply(&mut con, &["MEM.APPEND", &key, "user", &content]);
                        (int_field(&f, "id") as u64, content)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn concurrent_appends_all_land_in_order() {
    let server = Server::start();
    let mut con = server.client();
    let key = "mem:{conc}";
    setup_big(&mut con, key);
    let acked = run_writers(&server, key, 8, 500);
    let doc = check_consistent(&mut con, key);
    assert_eq!(
        doc.messages.len(),
        1 + 8 * 500,
        "messages after 8 x 500 appends"
    );
    let by_content: HashMap<&str, u64> = doc
        .messages
        .iter()
        .map(|m| (m.content.as_str(), m.id))
        .collect();
    let mut ids = HashSet::new();
    for (t, list) in acked.iter().enumerate() {
        let mut prev = 0;
        for (id, content) in list {
            assert_eq!(
                by_content.get(content.as_str()),
                Some(id),
                "client {t}: {content}"
            );
            assert!(*id > prev, "client {t}: its messages out of order");
            prev = *id;
            assert!(ids.insert(*id), "id {id} handed out twice");
        }
    }
    let last = doc.messages.last().unwrap().id;
    assert_eq!(last, 4001, "ids are 1..=4001 without gaps");
    println!("hostile/concurrency: 8 clients x 500 appends: {} acknowledged, {} present, ids unique and ordered", ids.len(), doc.messages.len() - 1);
}

#[test]
fn concurrent_appends_with_a_racing_summarizer_lose_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let key = "mem:{race}";
    setup_big(&mut con, key);
    let done = Arc::new(AtomicBool::new(false));
    let summarizer = {
        let mut con = server.client();
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut applied, mut refused, mut last_upto) = (0u64, 0u64, 0i64);
            for n in 0..100_000 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let check = map_reply(&mut con, &["MEM.SUMMARIZE_CHECK", key, "KEEP", "20"]);
                let upto = int_field(&check, "upto");
                if upto <= last_upto {
                    continue;
                }
                match cmd(
                    &mut con,
                    &[
                        "MEM.SUMMARIZE",
                        key,
                        &upto.to_string(),
                        &format!("summary {n} up to {upto}"),
                    ],
                ) {
                    Ok(v) => {
                        let f = as_fields(v);
                        assert_eq!(int_field(&f, "id"), upto);
                        applied += 1;
                        last_upto = upto;
                    }
                    Err(e) => {
                        assert!(e.code().is_some(), "not an error reply: {e}");
                        refused += 1;
                    }
                }
            }
            (applied, refused, last_upto)
        })
    };
    let acked = run_writers(&server, key, 8, 500);
    done.store(true, Ordering::Relaxed);
    let (applied, refused, last_upto) = summarizer.join().unwrap();
    let doc = check_consistent(&mut con, key);
    assert_eq!(
        doc.summary_upto as i64, last_upto,
        "the last applied summary is the session's"
    );
    let present: HashMap<&str, u64> = doc
        .messages
        .iter()
        .map(|m| (m.content.as_str(), m.id))
        .collect();
    let (mut kept, mut summarized) = (0, 0);
    for list in &acked {
        for (id, content) in list {
            if *id as i64 <= last_upto {
                assert!(
                    !present.contains_key(content.as_str()),
                    "{content} (id {id}) survived its summary"
                );
                summarized += 1;
            } else {
                assert_eq!(
                    present.get(content.as_str()),
                    Some(id),
                    "{content} (id {id}) lost"
                );
                kept += 1;
            }
        }
    }
    assert_eq!(
        doc.messages.len(),
        kept,
        "messages in the session beyond the acknowledged ones"
    );
    assert!(applied > 0, "the summarizer never ran");
    println!(
        "hostile/summarizer race: {} appends acknowledged, {summarized} covered by {applied} summaries ({refused} refused), \
         {kept} after the last summary (upto {last_upto}) all present",
        kept + summarized
    );
}
