//! Unit tests of age truncation (MAXAGE) and attributes (ATTRSET/ATTRDEL).

use super::tests::settings;
use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NOW: i64 = 1_700_000_000_000;
const DAY_MS: i64 = 86_400_000;

fn msg(id: u64, role: &str, ts: i64) -> Message {
    Message {
        id,
        role: role.into(),
        content: "x".into(),
        ts,
        tokens: 4,
        meta: None,
    }
}

/// A session of a seven-day limit holding `(role, ts)` messages, ids from 1.
fn session(messages: &[(&str, i64)]) -> Session {
    let cfg = Settings {
        max_age: 7 * 86_400,
        max_msgs: 100,
        ..settings()
    };
    let mut s = Session::new(cfg, 0);
    for (i, (role, ts)) in messages.iter().enumerate() {
        s.push_message(msg(i as u64 + 1, role, *ts)).unwrap();
    }
    s
}

fn ids(s: &Session) -> Vec<u64> {
    s.messages.iter().map(|m| m.id).collect()
}

fn append(s: &mut Session, role: &str, ts: i64, now: i64) -> Outcome {
    let message = msg(s.last_id + 1, role, ts);
    s.apply(Op::Append {
        now,
        settings: s.settings.clone(),
        message,
        msgid: None,
    })
    .unwrap()
}

#[test]
fn an_append_evicts_old_messages_wherever_they_are() {
    // Mixed timestamps (TS option): old ones in the middle go too.
    let old = NOW - 8 * DAY_MS;
    let mut s = session(&[
        ("user", old),
        ("assistant", NOW - DAY_MS),
        ("user", old),
        ("assistant", NOW),
    ]);
    let out = append(&mut s, "user", NOW, NOW);
    assert_eq!(ids(&s), vec![2, 4, 5]);
    assert_eq!((out.trimmed, out.messages, out.total_tokens), (2, 3, 12));
    assert_eq!(s.total_tokens, 12);
}

#[test]
fn the_cutoff_is_exclusive_and_zero_means_none() {
    let edge = NOW - 7 * DAY_MS;
    let mut s = session(&[("user", edge), ("user", edge - 1)]);
    assert_eq!(append(&mut s, "user", NOW, NOW).trimmed, 1);
    assert_eq!(ids(&s), vec![1, 3]);
    let mut s = session(&[("user", 0)]);
    s.settings.max_age = 0;
    assert_eq!(append(&mut s, "user", NOW, NOW).trimmed, 0);
}

#[test]
fn a_tool_group_ages_out_only_as_a_whole() {
    let old = NOW - 8 * DAY_MS;
    // A call and its results, all old: they go together.
    let mut s = session(&[
        ("user", NOW),
        ("assistant", old),
        ("tool", old),
        ("tool", old),
        ("assistant", NOW),
    ]);
    let out = append(&mut s, "user", NOW, NOW);
    assert_eq!(ids(&s), vec![1, 5, 6]);
    assert_eq!(out.trimmed, 3);
    // One result still young: the call and both results stay (a result
    // never ages out on its own while its call is held, nor the call).
    let mut s = session(&[
        ("user", NOW),
        ("assistant", NOW),
        ("tool", old),
        ("tool", NOW),
    ]);
    assert_eq!(ids(&s.live(NOW)), vec![1, 2, 3, 4]);
    assert_eq!(append(&mut s, "user", NOW, NOW).trimmed, 0);
    assert_eq!(ids(&s), vec![1, 2, 3, 4, 5]);
    let mut s = session(&[("user", NOW), ("assistant", old), ("tool", NOW)]);
    assert_eq!(append(&mut s, "user", NOW, NOW).trimmed, 0);
    assert_eq!(ids(&s), vec![1, 2, 3, 4]);
    // The call's group leaves whole once all of it is old; no tool result
    // is left first.
    let mut s = session(&[
        ("assistant", old),
        ("tool", old),
        ("tool", NOW),
        ("user", NOW),
    ]);
    assert_eq!(append(&mut s, "user", NOW, NOW).trimmed, 0);
    assert_eq!(
        append(&mut s, "user", NOW + 8 * DAY_MS, NOW + 8 * DAY_MS).trimmed,
        5
    );
    assert_eq!(ids(&s), vec![6]);
}

#[test]
fn an_appended_tool_result_keeps_its_old_group_until_the_next_write() {
    let old = NOW - 8 * DAY_MS;
    let mut s = session(&[("user", NOW), ("assistant", old)]);
    assert_eq!(append(&mut s, "tool", old, NOW).trimmed, 0);
    assert_eq!(ids(&s), vec![1, 2, 3]);
    // Reads already hide the call and its result together.
    assert_eq!(ids(&s.live(NOW)), vec![1]);
    assert_eq!(s.live_count(NOW), 1);
    assert_eq!(append(&mut s, "user", NOW, NOW).trimmed, 2);
    assert_eq!(ids(&s), vec![1, 4]);
}

#[test]
fn the_newest_message_is_not_evicted_by_its_own_append() {
    let old = NOW - 8 * DAY_MS;
    let mut s = session(&[("user", NOW)]);
    let out = append(&mut s, "user", old, NOW);
    assert_eq!((ids(&s), out.trimmed), (vec![1, 2], 0));
    // The next write evicts it; a read already hides it.
    assert_eq!(ids(&s.live(NOW)), vec![1]);
    append(&mut s, "user", NOW, NOW);
    assert_eq!(ids(&s), vec![1, 3]);
}

#[test]
fn a_read_hides_old_messages_without_changing_the_session() {
    let mut s = session(&[("user", NOW - DAY_MS), ("assistant", NOW)]);
    let before = s.clone();
    // Borrowed while nothing is old.
    assert!(matches!(s.live(NOW), std::borrow::Cow::Borrowed(_)));
    let later = NOW + 6 * DAY_MS + 1;
    let view = s.live(later);
    assert_eq!(
        (ids(&view), view.total_tokens, view.first_id()),
        (vec![2], 4, 2)
    );
    assert_eq!(s, before);
    let check = view.summarize_check(
        Thresholds {
            tokens: 1,
            messages: 1,
        },
        0,
    );
    assert_eq!((check.messages, check.upto), (1, 2));
    // A write at that time evicts what the read hid.
    s.apply(Op::ExtSet {
        now: later,
        settings: s.settings.clone(),
        system: "dify".into(),
        external: ExternalId {
            id: "c".into(),
            expires_at: later + 1,
        },
    })
    .unwrap();
    assert_eq!(ids(&s), vec![2]);
}

#[test]
fn a_summary_cannot_cover_an_evicted_message_and_changes_nothing() {
    let old = NOW - 8 * DAY_MS;
    let mut s = session(&[("user", old), ("assistant", NOW), ("user", NOW)]);
    let before = s.clone();
    let summary = |upto| Summary {
        text: "s".into(),
        tokens: 5,
        upto,
        ts: NOW,
    };
    let e = s
        .apply(Op::Summarize {
            now: NOW,
            summary: summary(1),
        })
        .unwrap_err();
    assert_eq!(e, SessionError::UnknownUpto(1));
    assert_eq!(s, before);
    let out = s
        .apply(Op::Summarize {
            now: NOW,
            summary: summary(2),
        })
        .unwrap();
    assert_eq!((ids(&s), out.trimmed, s.total_tokens), (vec![3], 1, 9));
}

#[test]
fn a_summary_after_the_newest_message_aged_keeps_the_rest_whole() {
    // The newest message aged (an old TS): a summary of the oldest left a
    // read's view as the session, whose positions read the neighbours'
    // bytes ("a\0b") and whose saved form no longer loaded (hostile pass,
    // issue 23). Contents of 1 B to 9 KB, across segments.
    for size in [1usize, 200, 9_000] {
        let text = |c: char| c.to_string().repeat(size);
        let mut s = session(&[]);
        for (i, c) in ['a', 'b', 'c'].into_iter().enumerate() {
            let mut m = msg(i as u64 + 1, "user", NOW);
            m.content = text(c).into();
            s.push_message(m).unwrap();
        }
        let mut old = msg(4, "user", NOW - 8 * DAY_MS);
        old.content = text('d').into();
        s.push_message(old).unwrap();
        let out = s
            .apply(Op::Summarize {
                now: NOW,
                summary: Summary {
                    text: "sum".into(),
                    tokens: 5,
                    upto: 1,
                    ts: NOW,
                },
            })
            .unwrap();
        assert_eq!(out.trimmed, 1, "size {size}");
        let held: Vec<(u64, String)> = s
            .messages
            .iter()
            .map(|m| (m.id, m.content.to_owned()))
            .collect();
        assert_eq!(held, vec![(2, text('b')), (3, text('c'))], "size {size}");
        let back =
            crate::persistence::decode_session(&crate::persistence::encode_session(&s)).unwrap();
        assert_eq!(back, s, "size {size}");
    }
}

#[test]
fn a_view_written_becomes_a_log_of_its_own() {
    let old = NOW - 8 * DAY_MS;
    let s = session(&[("user", NOW), ("user", old), ("user", NOW), ("user", NOW)]);
    let mut view = s.live(NOW).into_owned();
    assert_eq!(ids(&view), vec![1, 3, 4]);
    let mut m = msg(5, "assistant", NOW);
    m.content = "five".into();
    view.push_message(m).unwrap();
    assert_eq!(ids(&view), vec![1, 3, 4, 5]);
    assert_eq!(view.messages.back().unwrap().content, "five");
    let back =
        crate::persistence::decode_session(&crate::persistence::encode_session(&view)).unwrap();
    assert_eq!(back, view);
    assert_eq!(
        ids(&s),
        vec![1, 2, 3, 4],
        "the session the view was of is unchanged"
    );
}

fn raw(text: &str) -> std::sync::Arc<str> {
    text.into()
}

#[test]
fn attributes_are_set_replaced_and_deleted_member_by_member() {
    let mut s = Session::new(settings(), 0);
    assert_eq!((s.attr("a", 0), s.attrs(0)), (None, vec![]));
    s.attr_set("user_profile", raw(r#"{"name": "Ann", "z": 1.0}"#), None);
    s.attr_set("context", raw("[1,2]"), None);
    assert_eq!(
        s.extra.text().as_deref(),
        Some(r#"{"user_profile":{"name": "Ann", "z": 1.0},"context":[1,2]}"#)
    );
    s.attr_set("user_profile", raw("null"), None);
    assert_eq!(
        s.extra.text().as_deref(),
        Some(r#"{"user_profile":null,"context":[1,2]}"#)
    );
    assert_eq!(s.attr("context", 0).as_deref(), Some("[1,2]"));
    assert!(s.attr_del("user_profile"));
    assert!(!s.attr_del("user_profile"));
    assert!(s.attr_del("context"));
    // No member left: no extra, as a session never given any.
    assert_eq!(s.extra.text(), None);
}

#[test]
fn duplicate_members_of_an_import_read_as_the_last_and_are_replaced_at_the_first() {
    let mut s = Session::new(settings(), 0);
    s.extra = crate::session::Attrs::from_text(Some(&String::from(
        r#"{"a":1,"b":2,"a":3,"c":"\u00e9"}"#,
    )))
    .unwrap();
    assert_eq!(s.attr("a", 0).as_deref(), Some("3"));
    let all = s.attrs(0);
    assert_eq!(
        all,
        vec![
            ("a".into(), "3".into()),
            ("b".into(), "2".into()),
            ("c".into(), r#""\u00e9""#.into())
        ]
    );
    s.attr_set("a", raw("4"), None);
    assert_eq!(
        s.extra.text().as_deref(),
        Some(r#"{"a":4,"b":2,"c":"\u00e9"}"#)
    );
    s.extra =
        crate::session::Attrs::from_text(Some(&String::from(r#"{"a":1,"b":2,"a":3}"#))).unwrap();
    assert!(s.attr_del("a"));
    assert_eq!(s.extra.text().as_deref(), Some(r#"{"b":2}"#));
}

#[test]
fn attribute_names_and_values_are_checked() {
    assert!(check_attr_name("user_profile").is_ok());
    for bad in [
        "",
        "conversation_history",
        "summary",
        "total_tokens",
        "model",
    ] {
        assert!(check_attr_name(bad).is_err(), "{bad}");
    }
    assert!(check_attr_name(&"n".repeat(MAX_ATTR_NAME_BYTES)).is_ok());
    assert!(check_attr_name(&"n".repeat(MAX_ATTR_NAME_BYTES + 1)).is_err());
    for ok in ["1", "\"s\"", "null", "[]", "{\"a\":[true]}"] {
        assert!(check_attr_value(ok).is_ok(), "{ok}");
    }
    for bad in ["", "{", "nul", "\"\\ud800\"", "1e999", "1 2"] {
        assert!(check_attr_value(bad).is_err(), "{bad}");
    }
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(check_attr_value(&deep(attrs::MAX_ATTR_DEPTH)).is_ok());
    assert!(check_attr_value(&deep(attrs::MAX_ATTR_DEPTH + 1)).is_err());
}

#[test]
fn attribute_ops_evict_by_age_and_create_the_session() {
    let old = NOW - 8 * DAY_MS;
    let mut s = session(&[("user", old), ("user", NOW)]);
    let set = Op::AttrSet {
        now: NOW,
        settings: s.settings.clone(),
        name: "p".into(),
        value: "1".into(),
        expires_at: None,
    };
    assert!(set.new_session().is_some());
    assert_eq!(s.apply(set).unwrap().trimmed, 1);
    assert_eq!(s.attr("p", 0).as_deref(), Some("1"));
    let out = s
        .apply(Op::AttrDel {
            now: NOW,
            name: "p".into(),
        })
        .unwrap();
    assert_eq!(out.id, 1);
    assert!(Op::AttrDel {
        now: NOW,
        name: "p".into()
    }
    .new_session()
    .is_none());
    // A value that is not JSON is refused before it reaches the session:
    // by the command (or its worker) on the master, by Op::validate for a
    // replicated op; the core stores what it is given without parsing it
    // again.
    let bad = Op::AttrSet {
        now: NOW,
        settings: s.settings.clone(),
        name: "p".into(),
        value: "{".into(),
        expires_at: None,
    };
    assert!(bad.validate().is_err());
}

#[test]
fn a_read_view_equals_the_eviction_and_copies_no_byte() {
    // Random sessions of mixed roles, contents, metas, msgids and times:
    // the view a read gets (shared bytes, messages left out anywhere) is
    // what a write at the same time would leave.
    let mut rng = StdRng::seed_from_u64(0x1234_5678_9abc_def0u64);
    let mut next = move |n: u64| rng.gen_range(0..n);
    let roles = ["user", "assistant", "tool", "tool", "system", "critic"];
    for _ in 0..300 {
        let cfg = Settings {
            max_age: 7 * 86_400,
            max_msgs: 1000,
            ..settings()
        };
        let mut s = Session::new(cfg, 0);
        let n = 1 + next(25);
        for i in 0..n {
            let ts = if next(3) == 0 {
                NOW - 8 * DAY_MS
            } else {
                NOW - DAY_MS
            };
            let content = "c".repeat(next(3000) as usize);
            let meta = (next(4) == 0).then(|| format!("{{\"k\":{}}}", next(99)));
            let m = Message {
                id: i + 1,
                role: roles[next(6) as usize].into(),
                content: content.into(),
                ts,
                tokens: 1 + next(50),
                meta: meta.map(Into::into),
            };
            s.push_message(m).unwrap();
            if next(3) == 0 {
                s.msgids.attach(i + 1, format!("m{i}").into());
            }
            s.messages.settle();
        }
        let view = s.live(NOW);
        let mut evicted = s.clone();
        evicted.evict_aged(NOW, false);
        assert_eq!(*view, evicted);
        assert_eq!(view.total_tokens, evicted.total_tokens);
        assert_eq!(view.msgids, evicted.msgids);
        if let std::borrow::Cow::Owned(v) = &view {
            assert!(
                v.messages.shares_bytes_with(&s.messages),
                "the view copied bytes"
            );
        }
    }
}

#[test]
fn the_live_count_is_what_a_read_shows() {
    let old = NOW - 8 * DAY_MS;
    for roles in [
        vec![("user", NOW), ("assistant", NOW)],
        vec![("user", old), ("assistant", NOW)],
        vec![("user", old), ("tool", NOW), ("user", NOW)],
        vec![("assistant", old), ("tool", old), ("tool", NOW)],
        vec![("user", old), ("assistant", old)],
    ] {
        let s = session(&roles);
        assert_eq!(s.live_count(NOW), s.live(NOW).message_count(), "{roles:?}");
    }
}

#[test]
fn old_messages_first_age_out_as_group_by_group_would() {
    // The prefix path reads only the roles at the cut; group by group reads
    // every old message's. They must flag the same messages.
    let mut rng = StdRng::seed_from_u64(29);
    for _ in 0..2_000 {
        let n = rng.gen_range(1..40);
        let young = rng.gen_range(0..=n);
        let messages: Vec<(&str, i64)> = (0..n)
            .map(|i| {
                let role = ["user", "assistant", "tool", "tool"][rng.gen_range(0..4)];
                let ts = if i < young { NOW - 8 * DAY_MS } else { NOW };
                (role, ts)
            })
            .collect();
        let s = session(&messages);
        let cutoff = s.age_cutoff(NOW).unwrap();
        let old: Vec<bool> = s.messages.heads().map(|h| h.ts < cutoff).collect();
        for protect in [false, true] {
            let spared_from = if protect { n - s.newest_group_len() } else { n };
            assert_eq!(
                s.aged_prefix(young, spared_from),
                s.aged_groups(&old, spared_from),
                "{messages:?}, protect {protect}"
            );
        }
    }
}

#[test]
fn has_live_is_a_live_count_above_zero() {
    let mut rng = StdRng::seed_from_u64(31);
    for _ in 0..3_000 {
        let n = rng.gen_range(0..12);
        let messages: Vec<(&str, i64)> = (0..n)
            .map(|_| {
                let role = ["user", "assistant", "tool", "tool"][rng.gen_range(0..4)];
                let ts = [NOW - 8 * DAY_MS, NOW, NOW + DAY_MS][rng.gen_range(0..3)];
                (role, ts)
            })
            .collect();
        let s = session(&messages);
        let newest = s.messages.len() - s.newest_group_len();
        for group in [None, Some(newest)] {
            assert_eq!(
                s.has_live(s.age_cutoff(NOW), group),
                s.live_count(NOW) > 0,
                "{messages:?}, {group:?}"
            );
        }
    }
}

/// A batch's appends read only what follows the last one's tool group
/// (`apply_one_of_many`'s `stays_below`): the same sessions and outcomes
/// as each applied whole, for random sessions and batches of aged, fresh
/// and future messages of 1 B to 20 KB, tool results, and caps.
#[test]
fn a_batchs_appends_age_out_what_appends_one_by_one_do() {
    let mut rng = StdRng::seed_from_u64(37);
    let role =
        |rng: &mut StdRng| ["user", "assistant", "tool", "tool", "system"][rng.gen_range(0..5)];
    let ts =
        |rng: &mut StdRng| [NOW - 8 * DAY_MS, NOW - DAY_MS, NOW, NOW + DAY_MS][rng.gen_range(0..4)];
    for round in 0..1_000 {
        let held: Vec<(&str, i64)> = (0..rng.gen_range(0..20))
            .map(|_| (role(&mut rng), ts(&mut rng)))
            .collect();
        let mut one_by_one = session(&held);
        one_by_one.settings.max_msgs = rng.gen_range(1..25);
        let mut batch = one_by_one.clone();
        let settings = one_by_one.settings.clone();
        let mut stays_below = 0;
        for i in 0..rng.gen_range(1..30) {
            let mut message = msg(one_by_one.last_id + 1, role(&mut rng), ts(&mut rng));
            // Some past the segment size: a segment of their own.
            message.content = "y"
                .repeat([1, 300, 9_000, 20_000][rng.gen_range(0..4)])
                .into();
            let op = Op::Append {
                now: NOW,
                settings: settings.clone(),
                message,
                msgid: None,
            };
            let want = one_by_one.apply(op.clone()).unwrap();
            let got = batch.apply_one_of_many(op, None, &mut stays_below).unwrap();
            assert_eq!(got, want, "round {round}, item {i}");
            assert_eq!(ids(&batch), ids(&one_by_one), "round {round}, item {i}");
            assert_eq!(batch.total_tokens, one_by_one.total_tokens);
            assert_eq!(batch.history, one_by_one.history);
        }
        batch.settle();
        assert_eq!(batch.messages, one_by_one.messages, "round {round}");
    }
}
