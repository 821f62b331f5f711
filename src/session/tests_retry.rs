//! Unit tests of what keeps a summarizer ahead of the caps and work from
//! being done twice: headroom thresholds, leases, msgids (no Redis, token
//! counts given directly).

use super::read::less_headroom;
use super::tests::settings;
use super::*;

fn msg(id: u64, role: &str, tokens: u64) -> Message {
    Message {
        id,
        role: role.into(),
        content: "x".repeat(tokens as usize).into(),
        ts: id as i64,
        tokens,
        meta: None,
    }
}

fn push(s: &mut Session, cfg: &Settings, tokens: u64, msgid: Option<&str>) -> Outcome {
    let message = msg(s.last_id + 1, "user", tokens);
    s.apply(Op::Append {
        now: 1,
        settings: cfg.clone(),
        message,
        msgid: msgid.map(Into::into),
    })
    .unwrap()
}

fn summarize(s: &mut Session, upto: u64) -> Result<Outcome, SessionError> {
    s.apply(Op::Summarize {
        now: 9,
        summary: Summary {
            text: "s".into(),
            tokens: 1,
            upto,
            ts: 9,
        },
    })
}

// ---- headroom ------------------------------------------------------------

/// The model windows of the spec's examples (tokenizer's table).
const MODELS: [(&str, Option<u64>); 4] = [
    ("gpt-4o", Some(128_000)),
    ("claude-3-5-sonnet", Some(200_000)),
    ("gpt-4.1", Some(1_047_576)),
    ("unknown", None),
];

#[test]
fn thresholds_per_model_at_the_default_headroom() {
    let caps = Settings {
        max_tokens: 80_000,
        max_msgs: 30,
        ..settings()
    };
    let want = [19_200, 30_000, 64_000, 15_000];
    for ((model, window), want) in MODELS.iter().zip(want) {
        let t = Thresholds::new(*window, 15, 15_000, &caps, 20);
        assert_eq!(t.tokens, want, "{model}");
        assert_eq!(t.messages, 24, "{model}");
    }
}

#[test]
fn thresholds_per_headroom() {
    let caps = Settings {
        max_tokens: 80_000,
        max_msgs: 30,
        ..settings()
    };
    // (headroom, gpt-4.1 tokens, messages): only the capped ones move.
    for (headroom, tokens, messages) in [
        (0, 80_000, 30),
        (10, 72_000, 27),
        (20, 64_000, 24),
        (50, 40_000, 15),
        (90, 8_000, 3),
    ] {
        let t = Thresholds::new(Some(1_047_576), 15, 15_000, &caps, headroom);
        assert_eq!(
            (t.tokens, t.messages),
            (tokens, messages),
            "headroom {headroom}"
        );
        // gpt-4o's 19,200 is below every capped value but 90%'s.
        let t = Thresholds::new(Some(128_000), 15, 15_000, &caps, headroom);
        assert_eq!(t.tokens, 19_200.min(tokens), "gpt-4o, headroom {headroom}");
    }
    // Rounded up, never 0: 6 less 20% is 5 (4.8), 1 stays 1.
    assert_eq!(less_headroom(6, 20), 5);
    assert_eq!(less_headroom(3, 20), 3);
    assert_eq!(less_headroom(1, 90), 1);
    assert_eq!(less_headroom(u64::MAX, 20), u64::MAX / 5 * 4); // exact: 5 divides 2^64-1
    assert_eq!(less_headroom(i64::MAX as u64, 0), i64::MAX as u64);
}

/// The point of the headroom: appending one message at a time, the session
/// meets its threshold before the caps evict anything, for short messages
/// (the message cap) and for a large window (the token cap); at headroom 0
/// the token signal of a large window never comes at all.
#[test]
fn the_signal_comes_before_the_first_eviction() {
    for (cfg, tokens, window) in [
        (
            Settings {
                max_tokens: 80_000,
                max_msgs: 30,
                ..settings()
            },
            10,
            Some(128_000),
        ),
        (
            Settings {
                max_tokens: 80_000,
                max_msgs: 1_000,
                ..settings()
            },
            1_000,
            Some(1_047_576),
        ),
    ] {
        for headroom in [20, 0] {
            let th = Thresholds::new(window, 15, 15_000, &cfg, headroom);
            let mut s = Session::new(cfg.clone(), 0);
            let (mut signal, mut evicted) = (None, None);
            for i in 1..=200u64 {
                let o = push(&mut s, &cfg, tokens, None);
                if signal.is_none() && s.meets(th) {
                    signal = Some(i);
                }
                if evicted.is_none() && o.trimmed > 0 {
                    evicted = Some(i);
                }
            }
            let evicted = evicted.expect("the caps evict");
            if headroom == 20 {
                // Several appends of room: 24 of 30 messages, 64 of 80 x 1,000.
                let room = if tokens == 10 { 7 } else { 17 };
                assert_eq!(signal.map(|s| evicted - s), Some(room), "tokens {tokens}");
            } else {
                // At the caps: the signal comes one append before the first
                // eviction, no time for a summarizer.
                assert_eq!(signal, Some(evicted - 1), "tokens {tokens}");
            }
        }
    }
    // Messages of 999 tokens at headroom 0: the total never reaches 80,000.
    let cfg = Settings {
        max_tokens: 80_000,
        max_msgs: 1_000,
        ..settings()
    };
    let th = Thresholds::new(Some(1_047_576), 15, 15_000, &cfg, 0);
    let mut s = Session::new(cfg.clone(), 0);
    let mut trimmed = 0;
    for _ in 0..200 {
        trimmed += push(&mut s, &cfg, 999, None).trimmed;
        assert!(!s.meets(th));
    }
    assert!(trimmed > 100, "evicted without a signal");
}

// ---- leases ------------------------------------------------------------

fn ready(s: &mut Session, cfg: &Settings) -> Thresholds {
    for _ in 0..6 {
        push(s, cfg, 10, None);
    }
    Thresholds {
        tokens: 50,
        messages: 100,
    }
}

#[test]
fn a_lease_goes_to_one_worker_at_a_time_and_expires() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    let th = ready(&mut s, &cfg);
    let (check, lease) = s.begin(th, 2, 1_000, 500).unwrap();
    assert!(check.summarize);
    let lease = lease.expect("granted");
    assert_eq!(
        lease,
        Lease {
            token: 32_000,
            expires_at: 1_500
        }
    );
    s.apply(Op::Lease { now: 1_000, lease }).unwrap();
    // Live: nobody else gets one, and a summary without its token is refused.
    assert_eq!(s.begin(th, 2, 1_499, 500).unwrap().1, None);
    assert_eq!(
        s.check_lease(None, 1_200),
        Err(SessionError::LeaseHeld { expires_in_ms: 300 })
    );
    assert_eq!(
        s.check_lease(Some(7), 1_200),
        Err(SessionError::LeaseHeld { expires_in_ms: 300 })
    );
    assert_eq!(s.check_lease(Some(32_000), 1_200), Ok(()));
    // Expired: the session is free; the next token is new.
    assert_eq!(s.check_lease(None, 1_500), Ok(()));
    let second = s.begin(th, 2, 1_500, 500).unwrap().1.unwrap();
    assert_eq!(second.token, 48_000);
    s.apply(Op::Lease {
        now: 1_500,
        lease: second,
    })
    .unwrap();
    // The first worker, late, is refused while the second's lease is live.
    assert!(s.check_lease(Some(32_000), 1_600).is_err());
    // A summary ends the lease.
    summarize(&mut s, 4).unwrap();
    assert_eq!(s.leases.current, None);
    assert_eq!(s.leases.last_token, 48_000);
    assert_eq!(s.check_lease(None, 1_600), Ok(()));
    assert!(s.validate().is_ok());
}

#[test]
fn a_new_lifetime_of_a_key_never_repeats_a_token() {
    // The key deleted (or IMPORT REPLACE, expiry, RESTORE of an old dump)
    // and made again: its lease state starts over, its tokens do not.
    let cfg = settings();
    let mut old = Session::new(cfg.clone(), 0);
    let th = ready(&mut old, &cfg);
    let mut stale = Vec::new();
    for now in [1_000, 1_001, 1_002] {
        let lease = old.begin(th, 2, now, 1).unwrap().1.unwrap();
        old.apply(Op::Lease { now, lease }).unwrap();
        stale.push(lease.token);
    }
    assert!(stale.windows(2).all(|w| w[0] < w[1]), "{stale:?}");
    let mut new = Session::new(cfg.clone(), 1_003);
    let th = ready(&mut new, &cfg);
    let fresh = new.begin(th, 2, 1_003, 500).unwrap().1.unwrap();
    assert!(
        stale.iter().all(|t| *t < fresh.token),
        "{stale:?} vs {}",
        fresh.token
    );
    new.apply(Op::Lease {
        now: 1_003,
        lease: fresh,
    })
    .unwrap();
    for t in stale {
        assert!(
            new.check_lease(Some(t), 1_100).is_err(),
            "stale token {t} commits"
        );
    }
}

#[test]
fn no_lease_without_work() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    let th = ready(&mut s, &cfg);
    // Below the threshold.
    assert_eq!(
        s.begin(
            Thresholds {
                tokens: 1_000,
                messages: 100
            },
            2,
            0,
            10
        )
        .unwrap()
        .1,
        None
    );
    // Nothing to cover: every message kept.
    assert_eq!(s.begin(th, 6, 0, 10).unwrap().1, None);
    assert_eq!(*s.leases, Leases::default());
}

#[test]
fn lease_ops_need_increasing_tokens() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    ready(&mut s, &cfg);
    s.apply(Op::Lease {
        now: 0,
        lease: Lease {
            token: 5,
            expires_at: 10,
        },
    })
    .unwrap();
    let before = s.clone();
    let stale = Op::Lease {
        now: 0,
        lease: Lease {
            token: 5,
            expires_at: 99,
        },
    };
    assert_eq!(
        s.apply(stale),
        Err(SessionError::LeaseNotIncreasing { token: 5, last: 5 })
    );
    assert_eq!(s, before);
    assert!(Op::Lease {
        now: 0,
        lease: Lease {
            token: 0,
            expires_at: 1
        }
    }
    .validate()
    .is_err());
    s.leases.last_token = MAX_ID;
    s.leases.current = None;
    assert_eq!(
        s.begin(
            Thresholds {
                tokens: 1,
                messages: 1
            },
            0,
            0,
            1
        ),
        Err(SessionError::LeasesExhausted)
    );
    let mut bad = s.clone();
    bad.leases.current = Some(Lease {
        token: MAX_ID + 1,
        expires_at: 0,
    });
    assert!(bad.validate().is_err(), "a lease above the last token");
}

// ---- msgids --------------------------------------------------------------

#[test]
fn msgids_are_found_held_and_after_they_left() {
    let cfg = Settings {
        max_msgs: 3,
        ..settings()
    };
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, 4, Some("a"));
    push(&mut s, &cfg, 5, None);
    push(&mut s, &cfg, 6, Some("c"));
    assert_eq!(s.find_msgid("a"), Some((1, 4)));
    assert_eq!(s.find_msgid("c"), Some((3, 6)));
    assert_eq!(s.find_msgid("b"), None);
    // Trimmed: still known, with its id and tokens.
    push(&mut s, &cfg, 7, Some("d"));
    assert_eq!(s.messages.front().map(|m| m.id), Some(2));
    assert_eq!(s.find_msgid("a"), Some((1, 4)));
    // Summarized: still known.
    summarize(&mut s, 3).unwrap();
    assert_eq!(s.find_msgid("c"), Some((3, 6)));
    let departed: Vec<&str> = s.msgids.departed.iter().map(|d| &*d.msgid).collect();
    assert_eq!(
        departed,
        ["a", "c"],
        "only messages with a msgid are remembered"
    );
    assert_eq!(
        (s.msgids.of(4), s.msgids.of(2), s.msgids.of(3)),
        (Some("d"), None, None)
    );
    assert!(s.validate().is_ok());
    // A re-count moves a held message's tokens: a retry gets the new ones.
    let coverage = s.coverage(crate::tokenizer::Encoding::Cl100kBase, None);
    let op = s.recount_op(9, &coverage, &|_, _, content, _| content.len() as u64 + 1);
    s.apply(op).unwrap();
    assert_eq!(s.find_msgid("d"), Some((4, 8)));
    let o = s.duplicate_outcome(1, 4);
    assert_eq!(
        (
            o.id,
            o.tokens,
            o.total_tokens,
            o.messages,
            o.trimmed,
            o.duplicate
        ),
        (1, 4, s.total_tokens, 1, 0, true)
    );
}

#[test]
fn the_last_128_departed_msgids_are_remembered() {
    let cfg = Settings {
        max_msgs: 1,
        ..settings()
    };
    let mut s = Session::new(cfg.clone(), 0);
    for i in 0..300 {
        push(&mut s, &cfg, 1, Some(&format!("m{i}")));
    }
    assert_eq!(s.msgids.departed.len(), MAX_DEPARTED);
    assert_eq!(s.msgids.held.len(), 1);
    assert_eq!(s.find_msgid("m299"), Some((300, 1)), "held");
    assert_eq!(s.find_msgid("m298"), Some((299, 1)), "the newest departed");
    assert_eq!(
        s.find_msgid("m171"),
        Some((172, 1)),
        "the oldest remembered"
    );
    assert_eq!(s.find_msgid("m170"), None, "forgotten");
    assert!(s.validate().is_ok());
    let mut bad = s.clone();
    bad.msgids.departed.push_back(Departed {
        msgid: "x".into(),
        id: 300,
        tokens: 1,
    });
    assert!(bad.validate().is_err(), "more than 128, and out of order");
    let mut bad = s.clone();
    bad.msgids.departed[0].msgid = "".into();
    assert!(bad.validate().is_err(), "empty msgid");
    // A held msgid must name a held message, in order.
    for held in [
        vec![(299, "x")],
        vec![(300, "x"), (300, "y")],
        vec![(301, "x")],
    ] {
        let mut bad = s.clone();
        bad.msgids.held = held.into_iter().map(|(id, m)| (id, m.into())).collect();
        assert!(bad.validate().is_err());
    }
}

#[test]
fn msgid_rules() {
    assert!(check_msgid("").is_err());
    assert!(check_msgid(&"x".repeat(MAX_MSGID_BYTES)).is_ok());
    assert!(check_msgid(&"x".repeat(MAX_MSGID_BYTES + 1)).is_err());
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    push(&mut s, &cfg, 1, Some("ok"));
    assert!(s.validate().is_ok());
    s.msgids.held[0].1 = "y".repeat(MAX_MSGID_BYTES + 1).into();
    assert!(s.validate().is_err());
    let long = Op::Append {
        now: 1,
        settings: cfg,
        message: msg(2, "user", 1),
        msgid: Some("".into()),
    };
    assert!(long.validate().is_err(), "an op's msgid is checked too");
}

#[test]
fn a_summary_retried_after_it_succeeded_is_recognised() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    ready(&mut s, &cfg);
    summarize(&mut s, 2).unwrap();
    let o = s.summary_retried(2, b"s").expect("the same summary");
    assert!(o.duplicate);
    assert_eq!((o.id, o.tokens, o.total_tokens), (2, 1, s.total_tokens));
    assert_eq!(s.summary_retried(2, b"other text"), None);
    assert_eq!(s.summary_retried(3, b"s"), None);
}

/// Msgids m1..=m{n} held by ids 1..=n.
fn held(n: u64) -> Msgids {
    let mut m = Msgids::default();
    for id in 1..=n {
        m.attach(id, format!("m{id}").into());
    }
    m
}

#[test]
fn the_msgid_that_left_last_is_remembered_whatever_its_id() {
    // 128 later messages left first (aged out around an older one that a
    // mixed-time MAXAGE kept); then message 1 leaves: its retry must still
    // be recognised, and it was the one forgotten at once.
    let mut m = held(200);
    for id in 2..=129 {
        m.leave_id(id, 1);
    }
    m.leave_id(1, 7);
    assert_eq!(m.departed.len(), MAX_DEPARTED);
    assert_eq!(m.departed.front().map(|d| (d.id, d.tokens)), Some((1, 7)));
    assert!(
        m.departed.iter().all(|d| d.id != 2),
        "the oldest of the others makes room"
    );
    let ids: Vec<u64> = m.departed.iter().map(|d| d.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "kept in id order");
}

#[test]
fn msgids_leaving_at_once_leave_as_one_by_one_in_id_order() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(24);
    for round in 0..300 {
        let n = rng.gen_range(1..400u64);
        let mut at_once = held(n);
        // Some messages without a msgid: not every id is held.
        at_once.held.retain(|_| rng.gen_bool(0.8));
        let mut one_by_one = at_once.clone();
        let mut gone: Vec<(u64, u64)> = (1..=n + 3)
            .filter(|_| rng.gen_bool(0.5))
            .map(|id| (id, id % 9))
            .collect();
        // Earlier departures, all below this round's.
        let first = gone.len() / 3;
        let earlier: Vec<(u64, u64)> = gone.drain(..first).collect();
        at_once.leave_ids(&earlier);
        for (id, tokens) in &earlier {
            one_by_one.leave_id(*id, *tokens);
        }
        assert_eq!(at_once, one_by_one, "round {round}: earlier");
        at_once.leave_ids(&gone);
        for (id, tokens) in &gone {
            one_by_one.leave_id(*id, *tokens);
        }
        assert_eq!(at_once, one_by_one, "round {round}");
        assert!(at_once.departed.len() <= MAX_DEPARTED);
        assert!(at_once
            .held
            .iter()
            .all(|(id, _)| gone.binary_search_by_key(id, |g| g.0).is_err()));
    }
}

#[test]
fn a_summary_s_lease_must_be_the_session_s_own_when_none_is_live() {
    let cfg = settings();
    let mut s = Session::new(cfg.clone(), 0);
    let th = ready(&mut s, &cfg);
    let not_current = |token| Err(SessionError::LeaseNotCurrent { token });
    // No lease was ever granted in this lifetime of the key: a token is a
    // stale worker's (an earlier lifetime) or made up.
    assert_eq!(s.check_lease(Some(7), 1_000), not_current(7));
    assert_eq!(s.check_lease(None, 1_000), Ok(()));
    let lease = s.begin(th, 2, 1_000, 500).unwrap().1.unwrap();
    s.apply(Op::Lease { now: 1_000, lease }).unwrap();
    // Expired with nobody taking over: its worker may still commit; no other.
    assert_eq!(s.check_lease(Some(lease.token), 2_000), Ok(()));
    assert_eq!(
        s.check_lease(Some(lease.token + 1), 2_000),
        not_current(lease.token + 1)
    );
    // Taken over and that lease expired too: the first worker's token is stale.
    let second = s.begin(th, 2, 2_000, 500).unwrap().1.unwrap();
    s.apply(Op::Lease {
        now: 2_000,
        lease: second,
    })
    .unwrap();
    assert_eq!(
        s.check_lease(Some(lease.token), 3_000),
        not_current(lease.token)
    );
    // A summary ended it: its own token is no longer good either.
    summarize(&mut s, 4).unwrap();
    assert_eq!(
        s.check_lease(Some(second.token), 3_000),
        not_current(second.token)
    );
    assert_eq!(s.check_lease(None, 3_000), Ok(()));
}
