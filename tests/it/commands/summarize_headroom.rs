//! `mem.summarize-headroom` against a real server (SPEC §3 MEM.SUMMARIZE_CHECK,
//! v2): the summarize signal (MEM.APPEND's `summarize` 1 and the
//! `mem.threshold` event) comes strictly before the caps evict anything,
//! for short messages (the message cap) and for a model whose window is
//! larger than the token cap; at headroom 0 (the old rule) it comes with
//! the eviction, or, for the large window, never.

use std::time::Duration;

use crate::support::reply::*;
use crate::support::server::*;

/// What one run of appends showed: the 1-based append that first replied
/// `summarize 1`, the first that evicted, and the module events in order.
struct Run {
    first_signal: Option<usize>,
    first_eviction: Option<usize>,
    events: Vec<String>,
}

fn run(server: &Server, key: &str, contents: &[String], opts: &[&str]) -> Run {
    let mut con = server.client();
    ok(&mut con, &["CONFIG", "SET", "notify-keyspace-events", "Kd"]);
    let mut sub = server.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe(format!("__keyspace@0__:{key}")).unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let (mut first_signal, mut first_eviction) = (None, None);
    for (i, content) in contents.iter().enumerate() {
        let r = append(&mut con, key, "user", content, opts);
        if first_signal.is_none() && int_field(&r, "summarize") == 1 {
            first_signal = Some(i + 1);
        }
        if first_eviction.is_none() && int_field(&r, "trimmed") > 0 {
            first_eviction = Some(i + 1);
        }
    }
    let mut events = Vec::new();
    while let Ok(msg) = pubsub.get_message() {
        events.push(msg.get_payload::<String>().unwrap());
    }
    Run {
        first_signal,
        first_eviction,
        events,
    }
}

fn position(events: &[String], event: &str) -> Option<usize> {
    events.iter().position(|e| e == event)
}

/// Short messages: 30-message cap, threshold 24.
#[test]
fn short_messages_signal_six_appends_before_the_first_eviction() {
    let server = Server::start();
    let contents: Vec<String> = (1..=40).map(|i| format!("turn {i}: ok")).collect();
    let r = run(&server, "mem:{short}", &contents, &[]);
    assert_eq!(r.first_signal, Some(24), "30 less 20%");
    assert_eq!(r.first_eviction, Some(31));
    let (threshold, trim) = (
        position(&r.events, "mem.threshold"),
        position(&r.events, "mem.trim"),
    );
    assert!(
        threshold.is_some() && threshold < trim,
        "mem.threshold before mem.trim: {:?}",
        r.events
    );
    // The event comes with the append that replied summarize 1: the 24th
    // mem.append is the one before it.
    let appends_before = r.events[..threshold.unwrap()]
        .iter()
        .filter(|e| *e == "mem.append")
        .count();
    assert_eq!(appends_before, 24);

    // Headroom 0: signal at the cap, the very next append evicts.
    let mut con = server.client();
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-headroom", "0"]);
    let r = run(&server, "mem:{short0}", &contents, &[]);
    assert_eq!((r.first_signal, r.first_eviction), (Some(30), Some(31)));
}

/// " a" is one token: a message of `n` of them is 3 + 1 ("user") + n.
fn messages_of(tokens: usize, count: usize) -> Vec<String> {
    assert_eq!(mt_o("user", &" a".repeat(tokens - 4)), tokens as i64);
    (0..count).map(|_| " a".repeat(tokens - 4)).collect()
}

/// gpt-4.1: 15% of 1,047,576 is above the 80,000 cap; the threshold is the
/// cap less the headroom (64,000), so the signal comes 16 appends of 1,000
/// tokens before the cap evicts.
#[test]
fn a_large_window_model_signals_before_the_token_cap_evicts() {
    let server = Server::start();
    let opts = ["MODEL", "gpt-4.1", "MAXMSGS", "1000"];
    let r = run(&server, "mem:{large}", &messages_of(1_000, 100), &opts);
    assert_eq!(r.first_signal, Some(64));
    assert_eq!(r.first_eviction, Some(81));
    let (threshold, trim) = (
        position(&r.events, "mem.threshold"),
        position(&r.events, "mem.trim"),
    );
    assert!(
        threshold.is_some() && threshold < trim,
        "{:?}",
        &r.events[..10.min(r.events.len())]
    );
    let mut con = server.client();
    let c = check(&mut con, "mem:{large}", &[]);
    assert_eq!(int_field(&c, "threshold_tokens"), 64_000);

    // Headroom 0: trimming keeps the total at or below 80,000, the
    // threshold; with 999-token messages it is never met: 100 appends, many
    // evicted, not one signal.
    ok(&mut con, &["CONFIG", "SET", "mem.summarize-headroom", "0"]);
    let r = run(&server, "mem:{large0}", &messages_of(999, 100), &opts);
    assert_eq!(r.first_signal, None);
    assert_eq!(r.first_eviction, Some(81));
    assert_eq!(position(&r.events, "mem.threshold"), None);
    assert!(position(&r.events, "mem.trim").is_some());
}

/// The headroom applies to whatever caps a session has, and MEM.SUMMARIZE_CHECK,
/// the APPEND reply and MEM.SUMMARIZE_BEGIN agree.
#[test]
fn every_command_uses_the_same_thresholds() {
    let server = Server::start();
    let mut con = server.client();
    for (headroom, maxmsgs, want) in [
        ("20", "10", 8),
        ("50", "10", 5),
        ("90", "10", 1),
        ("0", "10", 10),
        ("20", "6", 5),
    ] {
        ok(
            &mut con,
            &["CONFIG", "SET", "mem.summarize-headroom", headroom],
        );
        let key = format!("mem:{{h{headroom}-{maxmsgs}}}");
        let mut first = None;
        for i in 1..=10 {
            let r = append(
                &mut con,
                &key,
                "user",
                &format!("m{i}"),
                &["MAXMSGS", maxmsgs],
            );
            let c = check(&mut con, &key, &[]);
            assert_eq!(
                int_field(&c, "threshold_messages"),
                want,
                "headroom {headroom}, maxmsgs {maxmsgs}"
            );
            assert_eq!(int_field(&r, "summarize"), int_field(&c, "summarize"));
            let b = map_reply(&mut con, &["MEM.SUMMARIZE_BEGIN", &key, "1", "KEEP", "100"]);
            assert_eq!(int_field(&b, "threshold_messages"), want);
            if first.is_none() && int_field(&r, "summarize") == 1 {
                first = Some(i);
            }
        }
        assert_eq!(first, Some(want), "headroom {headroom}, maxmsgs {maxmsgs}");
    }
}
