//! Unit tests of the session core: no Redis, no tokenizer (token counts are
//! given directly, so each rule is tested on its own).

use super::*;

pub fn settings() -> Settings {
    Settings {
        model: "gpt-4o".into(),
        encoding: Encoding::O200kBase,
        ttl: 100,
        max_tokens: 1_000,
        max_msgs: 5,
        max_age: 0,
    }
}

fn msg(id: u64, role: &str, tokens: u64) -> Message {
    Message {
        id,
        role: role.into(),
        // As long as its token count, as real text would be at least.
        content: "x".repeat(tokens as usize).into(),
        ts: id as i64,
        tokens,
        meta: None,
    }
}

/// Appends a message with the next id and `tokens`, under `settings`.
fn push(s: &mut Session, settings: &Settings, role: &str, tokens: u64) -> Outcome {
    let message = msg(s.last_id + 1, role, tokens);
    s.apply(Op::Append {
        now: 1,
        settings: settings.clone(),
        message,
        msgid: None,
    })
    .unwrap()
}

fn ids(s: &Session) -> Vec<u64> {
    s.messages.iter().map(|m| m.id).collect()
}

fn summarize(s: &mut Session, upto: u64, tokens: u64) -> Result<Outcome, SessionError> {
    let summary = Summary {
        text: "s".repeat(tokens as usize),
        tokens,
        upto,
        ts: 9,
    };
    s.apply(Op::Summarize { now: 9, summary })
}

#[test]
fn append_assigns_totals_and_counts() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    let o = push(&mut s, &cfg, "user", 10);
    assert_eq!(
        (o.id, o.tokens, o.total_tokens, o.messages, o.trimmed),
        (1, 10, 10, 1, 0)
    );
    push(&mut s, &cfg, "assistant", 5);
    assert_eq!(s.total_tokens, 15);
    assert_eq!(s.last_id, 2);
    assert!(s.validate().is_ok());
}

#[test]
fn ids_must_increase() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "user", 1);
    let stale = Op::Append {
        now: 1,
        settings: cfg,
        message: msg(1, "user", 1),
        msgid: None,
    };
    assert_eq!(
        s.apply(stale),
        Err(SessionError::IdNotIncreasing { id: 1, last_id: 1 })
    );
    assert_eq!(s.message_count(), 1);
}

#[test]
fn trims_by_message_count_oldest_first() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    for _ in 0..5 {
        push(&mut s, &cfg, "user", 1);
    }
    let o = push(&mut s, &cfg, "user", 1);
    assert_eq!(o.trimmed, 1);
    assert_eq!(ids(&s), vec![2, 3, 4, 5, 6]);
    assert_eq!(s.total_tokens, 5);
}

#[test]
fn trims_by_tokens_but_never_the_new_message() {
    let mut cfg = settings();
    cfg.max_tokens = 100;
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "user", 40);
    push(&mut s, &cfg, "user", 40);
    let o = push(&mut s, &cfg, "user", 30);
    assert_eq!((o.trimmed, s.total_tokens), (1, 70));
    // A message larger than the cap stays alone.
    let o = push(&mut s, &cfg, "user", 500);
    assert_eq!(o.trimmed, 2);
    assert_eq!(ids(&s), vec![4]);
    assert_eq!(s.total_tokens, 500);
}

#[test]
fn tool_results_go_with_their_evicted_call() {
    let mut cfg = settings();
    cfg.max_msgs = 4;
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "assistant", 1); // 1: the tool call
    push(&mut s, &cfg, "tool", 1); // 2
    push(&mut s, &cfg, "tool", 1); // 3
    push(&mut s, &cfg, "assistant", 1); // 4
    let o = push(&mut s, &cfg, "user", 1); // 5 evicts 1, then 2 and 3 follow
    assert_eq!(o.trimmed, 3);
    assert_eq!(ids(&s), vec![4, 5]);
    assert!(s.validate().is_ok());
}

#[test]
fn a_tool_message_just_appended_is_kept_even_if_oldest() {
    let mut cfg = settings();
    cfg.max_msgs = 1;
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "assistant", 1);
    push(&mut s, &cfg, "tool", 1);
    // The newest message's tool group is held over the cap, whole...
    assert_eq!(ids(&s), vec![1, 2]);
    push(&mut s, &cfg, "tool", 1);
    assert_eq!(ids(&s), vec![1, 2, 3]);
    // ...until a later write evicts it, whole.
    push(&mut s, &cfg, "user", 1);
    assert_eq!(ids(&s), vec![4]);
}

#[test]
fn summary_is_kept_while_messages_can_go() {
    let mut cfg = settings();
    cfg.max_tokens = 100;
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "user", 10);
    push(&mut s, &cfg, "user", 10);
    summarize(&mut s, 1, 50).unwrap();
    assert_eq!(s.total_tokens, 60);
    push(&mut s, &cfg, "user", 30); // 90: fits
    push(&mut s, &cfg, "user", 20); // 110: evicts 2 (10) -> 100
    assert!(s.summary.is_some());
    assert_eq!(ids(&s), vec![3, 4]);
    assert_eq!(s.total_tokens, 100);
    push(&mut s, &cfg, "user", 60); // evicts 3, 4; still 110 > 100: summary goes
    assert!(s.summary.is_none());
    assert_eq!(ids(&s), vec![5]);
    assert_eq!(s.total_tokens, 60);
}

#[test]
fn lowering_a_cap_trims_at_once() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    for _ in 0..5 {
        push(&mut s, &cfg, "user", 1);
    }
    let mut lower = cfg.clone();
    lower.max_msgs = 2;
    let o = push(&mut s, &lower, "user", 1);
    assert_eq!(o.trimmed, 4);
    assert_eq!(ids(&s), vec![5, 6]);
    assert_eq!(s.settings.max_msgs, 2);
}

#[test]
fn thresholds_follow_the_spec_examples() {
    let cfg = settings();
    let big = Settings {
        max_tokens: 80_000,
        max_msgs: 30,
        ..cfg
    };
    let t = |w| Thresholds::new(w, 15, 15_000, &big, 0).tokens;
    assert_eq!(t(Some(128_000)), 19_200);
    assert_eq!(t(Some(200_000)), 30_000);
    assert_eq!(t(Some(1_047_576)), 80_000);
    assert_eq!(t(None), 15_000);
    assert_eq!(Thresholds::new(None, 15, 15_000, &big, 0).messages, 30);
}

#[test]
fn check_reports_upto_and_moves_back_past_tool_results() {
    let mut cfg = settings();
    cfg.max_msgs = 100;
    let mut s = Session::new(cfg.clone(), 0);
    for role in ["user", "assistant", "tool", "tool", "assistant", "user"] {
        push(&mut s, &cfg, role, 10);
    }
    let th = Thresholds {
        tokens: 60,
        messages: 100,
    };
    // keep 3: the kept part would start at id 4 (tool), then id 3 (tool):
    // it moves back to start at id 2, the call, so upto is 1.
    let c = s.summarize_check(th, 3);
    assert!(c.summarize);
    assert_eq!((c.upto, c.upto_tokens), (1, 10));
    let c = s.summarize_check(th, 2);
    assert_eq!((c.upto, c.upto_tokens), (4, 40));
    let c = s.summarize_check(th, 6);
    assert_eq!((c.upto, c.upto_tokens), (0, 0));
    let c = s.summarize_check(th, 0);
    assert_eq!(c.upto, 6);
    let c = s.summarize_check(
        Thresholds {
            tokens: 61,
            messages: 7,
        },
        0,
    );
    assert!(!c.summarize);
}

#[test]
fn summarize_replaces_covered_messages_and_keeps_newer_ones() {
    let mut cfg = settings();
    cfg.max_msgs = 100;
    let mut s = Session::new(cfg.clone(), 0);
    for _ in 0..4 {
        push(&mut s, &cfg, "user", 10);
    }
    let o = summarize(&mut s, 2, 7).unwrap();
    assert_eq!((o.id, o.tokens, o.total_tokens, o.messages), (2, 7, 27, 2));
    assert_eq!(ids(&s), vec![3, 4]);
    // A later summary replaces the earlier one.
    summarize(&mut s, 3, 5).unwrap();
    assert_eq!(s.total_tokens, 15);
    assert_eq!(s.summary.as_ref().map(|x| x.upto), Some(3));
    // Stale or unknown upto: refused, nothing changed.
    let before = s.clone();
    assert_eq!(
        summarize(&mut s, 2, 1),
        Err(SessionError::UptoBelowSummary {
            upto: 2,
            current: 3
        })
    );
    assert_eq!(summarize(&mut s, 3, 1), Err(SessionError::UnknownUpto(3)));
    assert_eq!(summarize(&mut s, 99, 1), Err(SessionError::UnknownUpto(99)));
    assert_eq!(s, before);
    assert!(s.validate().is_ok());
}

#[test]
fn external_ids_expire_and_purge_deterministically() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    let ext = |id: &str, at| ExternalId {
        id: id.into(),
        expires_at: at,
    };
    s.apply(Op::ExtSet {
        now: 0,
        settings: cfg.clone(),
        system: "dify".into(),
        external: ext("a", 100),
    })
    .unwrap();
    assert_eq!(s.ext_get("dify", 99), Some("a"));
    assert_eq!(s.ext_get("dify", 100), None);
    s.apply(Op::ExtSet {
        now: 150,
        settings: cfg,
        system: "n8n".into(),
        external: ext("b", 5_000),
    })
    .unwrap();
    assert_eq!(
        s.external.len(),
        1,
        "the expired dify id is purged by the op's clock"
    );
    assert_eq!(s.key_expiry(150), Some(150 + 100_000));
    s.settings.ttl = 0;
    assert_eq!(s.key_expiry(150), None);
    s.settings.ttl = 1;
    assert_eq!(
        s.key_expiry(150),
        Some(5_000),
        "never earlier than a live external id"
    );
}

#[test]
fn select_last_after_and_budget() {
    let mut cfg = settings();
    cfg.max_msgs = 100;
    let mut s = Session::new(cfg.clone(), 0);
    for t in [5, 10, 20, 30, 40] {
        push(&mut s, &cfg, "user", t);
    }
    summarize(&mut s, 1, 6).unwrap(); // messages 2..=5 (10, 20, 30, 40), summary 6
    let pick = |s: &Session, sel| {
        let (sum, messages) = s.select(sel);
        (
            sum.map(|x| x.upto),
            messages.map(|m| m.id).collect::<Vec<_>>(),
        )
    };
    assert_eq!(pick(&s, Selection::default()), (Some(1), vec![2, 3, 4, 5]));
    assert_eq!(
        pick(
            &s,
            Selection {
                last: Some(2),
                ..Default::default()
            }
        ),
        (Some(1), vec![4, 5])
    );
    assert_eq!(
        pick(
            &s,
            Selection {
                last: Some(0),
                ..Default::default()
            }
        ),
        (Some(1), vec![])
    );
    assert_eq!(
        pick(
            &s,
            Selection {
                after: Some(3),
                ..Default::default()
            }
        ),
        (None, vec![4, 5])
    );
    // 6 + 40 + 30 = 76 fits 80; + 20 would not; contiguous from the newest.
    assert_eq!(
        pick(
            &s,
            Selection {
                budget: Some(80),
                ..Default::default()
            }
        ),
        (Some(1), vec![4, 5])
    );
    assert_eq!(
        pick(
            &s,
            Selection {
                budget: Some(6),
                ..Default::default()
            }
        ),
        (Some(1), vec![])
    );
    assert_eq!(
        pick(
            &s,
            Selection {
                budget: Some(5),
                ..Default::default()
            }
        ),
        (None, vec![])
    );
    let both = Selection {
        last: Some(1),
        budget: Some(1000),
        ..Default::default()
    };
    assert_eq!(pick(&s, both), (Some(1), vec![5]));
}

#[test]
fn select_spans_both_halves_of_the_ring_buffer() {
    let mut cfg = settings();
    cfg.max_msgs = 3;
    let mut s = Session::new(cfg.clone(), 0);
    for _ in 0..7 {
        push(&mut s, &cfg, "user", 1);
    }
    let (_, messages) = s.select(Selection {
        last: Some(2),
        ..Default::default()
    });
    let got: Vec<u64> = messages.map(|m| m.id).collect();
    assert_eq!(got, vec![6, 7]);
}

#[test]
fn recount_replaces_every_count() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "user", 1);
    push(&mut s, &cfg, "user", 1);
    summarize(&mut s, 1, 1).unwrap();
    let count = |_: Encoding, role: &str, content: &str, _: Option<&str>| {
        (role.len() + content.len()) as u64
    };
    let op = s.recount_op(5, &s.coverage(Encoding::Cl100kBase, None), &count);
    s.apply(op).unwrap();
    assert_eq!(s.settings.encoding, Encoding::Cl100kBase);
    // summary: "system" + "s"; message 2: "user" + "x".
    assert_eq!(s.total_tokens, (6 + 1) + (4 + 1));
    assert_eq!(s.summary.as_ref().map(|x| x.tokens), Some(7));
    assert!(s.validate().is_ok());
}

#[test]
fn a_recount_from_a_snapshot_counts_only_what_changed_meanwhile() {
    let cfg = Settings {
        max_msgs: 3,
        ..settings()
    };
    let mut s = Session::new(cfg.clone(), 0);
    for _ in 0..3 {
        push(&mut s, &cfg, "user", 2);
    }
    let snapshot = s.snapshot();
    let count = |_: Encoding, role: &str, content: &str, _: Option<&str>| {
        (role.len() + content.len()) as u64
    };
    let done = snapshot.count(Encoding::Cl100kBase, &count);
    // Meanwhile: one more message (evicting the first one).
    push(&mut s, &cfg, "user", 2);
    // Measured in stored bytes (tag, coded role, content: 3 here).
    assert_eq!(
        s.coverage(Encoding::Cl100kBase, Some(&done))
            .uncovered_bytes(),
        s.messages.stored_len_of(2)
    );
    assert_eq!(s.messages.stored_len_of(2), 3);
    assert_eq!(
        s.coverage(Encoding::O200kBase, Some(&done))
            .uncovered_bytes(),
        s.text_bytes(),
        "another encoding covers nothing"
    );
    let counted = std::cell::Cell::new(0);
    let counting = |e: Encoding, role: &str, content: &str, meta: Option<&str>| {
        counted.set(counted.get() + 1);
        count(e, role, content, meta)
    };
    let op = s.recount_op(9, &s.coverage(Encoding::Cl100kBase, Some(&done)), &counting);
    assert_eq!(
        counted.get(),
        1,
        "only the message appended meanwhile is counted again"
    );
    let Op::Recount { counts, .. } = &op else {
        panic!("{op:?}")
    };
    assert_eq!(
        counts.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    s.apply(op).unwrap();
    assert_eq!(s.total_tokens, 3 * 6);
    assert!(s.validate().is_ok());
}

#[test]
fn a_recount_that_does_not_match_the_session_changes_nothing() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "user", 2);
    push(&mut s, &cfg, "user", 2);
    let before = s.clone();
    let recount = |summary_tokens, counts: Vec<(u64, u64)>| Op::Recount {
        now: 1,
        encoding: Encoding::Cl100kBase,
        summary_tokens,
        counts,
    };
    for bad in [
        recount(None, vec![(1, 3)]),
        recount(None, vec![(1, 3), (3, 3)]),
        recount(None, vec![(2, 3), (1, 3)]),
        recount(Some(4), vec![(1, 3), (2, 3)]),
        recount(None, vec![(1, 3), (2, 1_000)]),
    ] {
        assert_eq!(s.apply(bad), Err(SessionError::RecountMismatch));
        assert_eq!(s, before);
    }
}

#[test]
fn validate_rejects_broken_invariants() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "user", 3);
    let mut bad = s.clone();
    bad.total_tokens = 4;
    assert!(bad.validate().is_err());
    let mut bad = s.clone();
    bad.last_id = 0;
    assert!(bad.validate().is_err());
    let mut bad = s.clone();
    bad.messages.edit(0, |m| m.role = "".into());
    assert!(bad.validate().is_err());
    let mut bad = s;
    bad.settings.max_msgs = 0;
    assert!(bad.validate().is_err());
}

#[test]
fn budget_never_starts_with_a_tool_result() {
    let mut cfg = settings();
    cfg.max_msgs = 100;
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "user", 6);
    push(&mut s, &cfg, "assistant", 4); // the tool call
    push(&mut s, &cfg, "tool", 8);
    push(&mut s, &cfg, "assistant", 8);
    let (_, messages) = s.select(Selection {
        budget: Some(16),
        ..Default::default()
    });
    let got: Vec<u64> = messages.map(|m| m.id).collect();
    assert_eq!(
        got,
        vec![4],
        "the tool result (3) fits, but its call (2) does not"
    );
    let (_, messages) = s.select(Selection {
        budget: Some(20),
        ..Default::default()
    });
    let got: Vec<u64> = messages.map(|m| m.id).collect();
    assert_eq!(got, vec![2, 3, 4]);
}

#[test]
fn a_summary_over_maxtokens_is_refused_and_evicts_nothing() {
    // The defect: MAXTOKENS 5000, 20 messages, a 6000-token summary of the
    // first 5 used to succeed and evict the 15 newer ones.
    let cfg = Settings {
        max_tokens: 5_000,
        max_msgs: 100,
        ..settings()
    };
    let mut s = Session::new(cfg.clone(), 0);
    for _ in 0..20 {
        push(&mut s, &cfg, "user", 100);
    }
    let before = s.clone();
    assert_eq!(
        summarize(&mut s, 5, 6_000),
        Err(SessionError::SummaryOverCap {
            tokens: 6_000,
            kept: 1_500,
            max_tokens: 5_000
        })
    );
    assert_eq!(s, before);
    // 3500 + the 1500 kept = 5000: fits exactly, and nothing is trimmed.
    let o = summarize(&mut s, 5, 3_500).unwrap();
    assert_eq!((o.trimmed, o.messages, o.total_tokens), (0, 15, 5_000));
    assert_eq!(ids(&s), (6..=20).collect::<Vec<_>>());
    assert!(s.validate().is_ok());
}

#[test]
fn a_summary_never_separates_a_tool_result_from_its_call() {
    let cfg = Settings {
        max_msgs: 100,
        ..settings()
    };
    let mut s = Session::new(cfg.clone(), 0);
    for role in ["user", "assistant", "tool", "tool", "assistant"] {
        push(&mut s, &cfg, role, 10);
    }
    let before = s.clone();
    assert_eq!(
        summarize(&mut s, 2, 5),
        Err(SessionError::KeepsToolResult { upto: 2, id: 3 })
    );
    assert_eq!(
        summarize(&mut s, 3, 5),
        Err(SessionError::KeepsToolResult { upto: 3, id: 4 })
    );
    assert_eq!(s, before);
    // Before the call, or after the last result: fine.
    summarize(&mut s, 1, 5).unwrap();
    summarize(&mut s, 4, 5).unwrap();
    assert_eq!(ids(&s), vec![5]);
}

#[test]
fn trim_takes_its_caps_as_arguments() {
    let cfg = Settings {
        max_msgs: 100,
        ..settings()
    };
    let mut s = Session::new(cfg.clone(), 0);
    for _ in 0..6 {
        push(&mut s, &cfg, "user", 10);
    }
    let trimmed = s.trim(
        Caps {
            messages: 100,
            tokens: 35,
        },
        false,
    );
    assert_eq!((trimmed, s.total_tokens), (3, 30));
    assert_eq!(s.settings, cfg, "the session's own caps are untouched");
    assert_eq!(
        s.trim(
            Caps {
                messages: 1,
                tokens: 1_000
            },
            true
        ),
        2
    );
    assert_eq!(ids(&s), vec![6]);
}

#[test]
fn ids_stop_at_max_id() {
    assert_eq!(next_id(0), Ok(1));
    assert_eq!(next_id(MAX_ID - 1), Ok(MAX_ID));
    assert_eq!(next_id(MAX_ID), Err(SessionError::IdsExhausted));
    assert_eq!(next_id(u64::MAX), Err(SessionError::IdsExhausted));
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    let before = s.clone();
    let too_big = Op::Append {
        now: 1,
        settings: cfg.clone(),
        message: msg(MAX_STORED_ID + 1, "user", 1),
        msgid: None,
    };
    assert_eq!(
        s.apply(too_big),
        Err(SessionError::IdAboveMax(MAX_STORED_ID + 1))
    );
    assert_eq!(s, before);
    let last = Message {
        ts: 1,
        ..msg(MAX_ID, "user", 1)
    };
    s.apply(Op::Append {
        now: 1,
        settings: cfg.clone(),
        message: last,
        msgid: None,
    })
    .unwrap();
    assert_eq!(s.last_id, MAX_ID);
    assert!(s.validate().is_ok());
    // An earlier release imported ids up to 2^63-1: such a session loads and
    // replicates, and it takes no new id.
    let old = Message {
        ts: 1,
        ..msg(MAX_STORED_ID, "user", 1)
    };
    s.apply(Op::Append {
        now: 1,
        settings: cfg,
        message: old,
        msgid: None,
    })
    .unwrap();
    assert!(s.validate().is_ok());
    assert_eq!(next_id(s.last_id), Err(SessionError::IdsExhausted));
}

#[test]
fn push_message_and_set_summary_keep_the_totals() {
    let mut s = Session::new(settings(), 0);
    let summary = Summary {
        text: "s".into(),
        tokens: 4,
        upto: 7,
        ts: 0,
    };
    s.set_summary(summary.clone()).unwrap();
    assert_eq!((s.last_id, s.total_tokens), (7, 4));
    assert_eq!(
        s.push_message(msg(7, "user", 2)),
        Err(SessionError::IdNotIncreasing { id: 7, last_id: 7 })
    );
    s.push_message(msg(8, "user", 2)).unwrap();
    assert_eq!((s.last_id, s.total_tokens), (8, 6));
    // A summary cannot be put over a message it covers.
    let over = Summary { upto: 8, ..summary };
    assert_eq!(
        s.set_summary(over),
        Err(SessionError::SummaryOverMessages { upto: 8 })
    );
    assert!(s.validate().is_ok());
}

#[test]
fn an_import_drops_tool_results_left_first() {
    let cfg = Settings {
        max_msgs: 3,
        ..settings()
    };
    // The document starts with tool results: no call in the session.
    let mut s = Session::new(cfg.clone(), 0);
    for (id, role) in [(1, "tool"), (2, "tool"), (3, "user")] {
        s.push_message(msg(id, role, 1)).unwrap();
    }
    assert_eq!(s.trim_imported(), 2);
    assert_eq!(ids(&s), vec![3]);
    // The newest tool group is kept whole, over the cap; what is before
    // it goes.
    let mut s = Session::new(Settings { max_msgs: 2, ..cfg }, 0);
    for (id, role) in [(1, "user"), (2, "assistant"), (3, "tool"), (4, "tool")] {
        s.push_message(msg(id, role, 1)).unwrap();
    }
    assert_eq!(s.trim_imported(), 1);
    assert_eq!(ids(&s), vec![2, 3, 4]);
    assert_eq!((s.last_id, s.total_tokens), (4, 3));
    assert!(s.validate().is_ok());
}

#[test]
fn validate_accepts_what_earlier_releases_stored_and_refuses_corruption() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, "user", 3);
    s.external.insert(
        "dify".into(),
        ExternalId {
            id: "c".into(),
            expires_at: MAX_EXPIRY_MS,
        },
    );
    s.settings.ttl = MAX_TTL_SECS;
    assert!(s.validate().is_ok());
    type Change = fn(&mut Session);
    // Release 0.1 accepted these from clients; its sessions must still load
    // (the commands now refuse them as input).
    let stored_by_0_1: [(&str, Change); 6] = [
        ("ttl above 100 years", |s| s.settings.ttl = i64::MAX as u64),
        ("external expiry at i64::MAX", |s| {
            s.external.get_mut("dify").unwrap().expires_at = i64::MAX
        }),
        ("lone surrogate in meta", |s| {
            s.messages
                .edit(0, |m| m.meta = Some(r#"{"a":"\ud800"}"#.into()))
        }),
        ("meta deeper than a document allows", |s| {
            let d = MAX_META_DEPTH + 1;
            s.messages.edit(0, |m| {
                m.meta =
                    Some(format!("{}{{}}{}", r#"{"a":"#.repeat(d - 1), "}".repeat(d - 1)).into())
            })
        }),
        ("members with 1e400", |s| {
            s.extra = crate::session::Attrs::from_text(Some(r#"{"n":1e400}"#)).unwrap()
        }),
        ("last id above 2^53-1", |s| s.last_id = MAX_STORED_ID),
    ];
    for (what, change) in stored_by_0_1 {
        let mut old = s.clone();
        change(&mut old);
        assert_eq!(old.validate(), Ok(()), "{what}");
    }
    let corrupt: [(&str, Change); 5] = [
        ("cap above i64::MAX", |s| s.settings.max_tokens = 1 << 63),
        ("ttl above i64::MAX", |s| s.settings.ttl = u64::MAX),
        ("model too long", |s| {
            s.settings.model = "m".repeat(MAX_MODEL_BYTES + 1).into()
        }),
        ("meta not JSON", |s| {
            s.messages.edit(0, |m| m.meta = Some("{nope".into()))
        }),
        ("last id above i64::MAX", |s| s.last_id = MAX_STORED_ID + 1),
    ];
    for (what, breaks) in corrupt {
        let mut bad = s.clone();
        breaks(&mut bad);
        assert!(bad.validate().is_err(), "{what}");
    }
    // Ops (from an older master, or an old AOF) are held to the same rules.
    let mut huge_ttl = cfg.clone();
    huge_ttl.ttl = i64::MAX as u64;
    assert!(Op::Append {
        now: 1,
        settings: huge_ttl,
        message: msg(9, "user", 1),
        msgid: None
    }
    .validate()
    .is_ok());
    let op = Op::Append {
        now: 1,
        settings: cfg.clone(),
        message: msg(MAX_STORED_ID + 1, "user", 1),
        msgid: None,
    };
    assert!(op.validate().is_err());
    let summary = Summary {
        text: "s".into(),
        tokens: 1,
        upto: MAX_STORED_ID + 1,
        ts: 0,
    };
    assert!(Op::Summarize { now: 1, summary }.validate().is_err());
    let external = ExternalId {
        id: "c".into(),
        expires_at: i64::MAX,
    };
    assert!(Op::ExtSet {
        now: 1,
        settings: cfg,
        system: "dify".into(),
        external
    }
    .validate()
    .is_ok());
}

#[test]
fn key_expiry_at_the_largest_ttl_stays_far_from_overflow() {
    let mut s = Session::new(
        Settings {
            ttl: MAX_TTL_SECS,
            ..settings()
        },
        0,
    );
    let now = MAX_TS;
    assert_eq!(s.key_expiry(now), Some(now + MAX_TTL_SECS as i64 * 1000));
    s.settings.ttl = u64::MAX; // not valid; still no overflow
    assert_eq!(s.key_expiry(now), Some(now + MAX_TTL_SECS as i64 * 1000));
}

// Far below i64::MAX, whatever clock Redis adds to a relative expiry.
const _: () = assert!(MAX_EXPIRY_MS < i64::MAX / 1000);

#[test]
fn last_never_starts_with_a_tool_result_but_after_alone_is_exact() {
    let cfg = Settings {
        max_msgs: 100,
        ..settings()
    };
    let mut s = Session::new(cfg.clone(), 0);
    for role in ["user", "assistant", "tool", "tool", "assistant"] {
        push(&mut s, &cfg, role, 10);
    }
    let pick = |sel| {
        let (_, messages) = s.select(sel);
        messages.map(|m| m.id).collect::<Vec<_>>()
    };
    let last = |n| Selection {
        last: Some(n),
        ..Default::default()
    };
    assert_eq!(
        pick(last(2)),
        vec![5],
        "LAST 2 would start with the tool result 4"
    );
    assert_eq!(pick(last(3)), vec![5]);
    assert_eq!(pick(last(4)), vec![2, 3, 4, 5]);
    assert_eq!(
        pick(Selection {
            after: Some(2),
            ..Default::default()
        }),
        vec![3, 4, 5]
    );
    assert_eq!(
        pick(Selection {
            after: Some(2),
            last: Some(10),
            ..Default::default()
        }),
        vec![5]
    );
    assert_eq!(
        pick(Selection {
            after: Some(2),
            budget: Some(1_000),
            ..Default::default()
        }),
        vec![5]
    );
    assert_eq!(
        pick(Selection {
            budget: Some(30),
            ..Default::default()
        }),
        vec![5]
    );
}

#[test]
fn a_session_fits_the_256_byte_size_class() {
    // Every session holds one: 8 bytes more take the next class (320),
    // 64 B of a 30 x 200 B session that costs ~7 KB.
    assert!(std::mem::size_of::<Session>() <= 256);
    assert_eq!(std::mem::size_of::<MessageLog>(), 96);
}

#[test]
fn eviction_over_the_caps_equals_evicting_group_by_group() {
    // The caps cut computed from the heads (reading bytes only at the cut)
    // evicts exactly what evicting one tool group at a time did.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(2323);
    for round in 0..2000 {
        let mut s = Session::new(settings(), 0);
        let n = rng.gen_range(0..40u64);
        for id in 1..=n {
            let role = if rng.gen_bool(0.3) { "tool" } else { "user" };
            s.push_message(msg(id, role, rng.gen_range(0..50))).unwrap();
            // Some with a msgid: those leave to the departed list in order.
            if rng.gen_bool(0.2) {
                s.msgids.attach(id, format!("m{id}").into());
            }
        }
        if rng.gen_bool(0.2) {
            s.summary = Some(Box::new(Summary {
                text: "s".into(),
                tokens: rng.gen_range(0..300),
                upto: 0,
                ts: 0,
            }));
            s.total_tokens += s.summary.as_ref().map_or(0, |x| x.tokens);
        }
        let caps = Caps {
            messages: rng.gen_range(0..45),
            tokens: rng.gen_range(0..1500),
        };
        let spared = rng.gen_range(0..4);
        let mut by_groups = s.clone();
        let mut evicted = 0u64;
        let over = |s: &Session| s.message_count() > caps.messages || s.total_tokens > caps.tokens;
        while over(&by_groups) {
            let group = by_groups.group_len_at(0);
            if group == 0 || by_groups.messages.len() < spared + group {
                break;
            }
            for _ in 0..group {
                by_groups.evict_oldest();
            }
            evicted += group as u64;
        }
        assert_eq!(s.evict_over_caps(caps, spared), evicted, "round {round}");
        assert_eq!(s, by_groups, "round {round}");
    }
}
