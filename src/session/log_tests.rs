//! Unit tests of the message log (log.rs).

use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn push(log: &mut MessageLog, id: u64, role: &str, content: &str) {
    log.push(
        id,
        id as i64 * 10,
        id,
        role,
        id.is_multiple_of(3).then_some("{\"k\":1}"),
        content,
    )
    .unwrap();
}

#[test]
fn messages_read_back_as_written() {
    let mut log = MessageLog::new();
    let roles = [
        "user",
        "assistant",
        "tool",
        "critic",
        "system",
        "x".repeat(64).leak(),
    ];
    for id in 1..=200u64 {
        push(
            &mut log,
            id,
            roles[id as usize % roles.len()],
            &format!("message {id} {}", "é".repeat(id as usize)),
        );
        if id % 7 == 0 {
            log.pop_front();
        }
        log.settle();
    }
    let held: Vec<u64> = log.iter().map(|m| m.id).collect();
    assert_eq!(held.len(), 200 - 200 / 7);
    for m in log.iter() {
        assert_eq!(m.role, roles[m.id as usize % roles.len()]);
        assert_eq!(
            m.content,
            format!("message {} {}", m.id, "é".repeat(m.id as usize))
        );
        assert_eq!(m.meta, (m.id % 3 == 0).then_some("{\"k\":1}"));
        assert_eq!((m.ts, m.tokens), (m.id as i64 * 10, m.id));
        assert_eq!(log.is_tool(log.position(m.id).unwrap()), m.role == "tool");
    }
    assert_eq!(
        log.iter().rev().map(|m| m.id).collect::<Vec<_>>(),
        held.iter().rev().copied().collect::<Vec<_>>()
    );
}

#[test]
fn a_log_at_its_cap_reuses_the_evicted_space() {
    let mut log = MessageLog::new();
    let text = "a".repeat(200);
    for id in 1..=30 {
        push(&mut log, id, "user", &text);
        log.settle();
    }
    // The first append at the cap may grow the segment by one class.
    push(&mut log, 31, "user", &text);
    log.pop_front();
    log.settle();
    let usage = log.mem_usage();
    assert_eq!(log.segments.len(), 1);
    for id in 32..=1000 {
        push(&mut log, id, "user", &text);
        log.pop_front();
        log.settle();
        assert_eq!(log.mem_usage(), usage, "append {id} grew the log");
    }
    assert_eq!(log.len(), 30);
    assert_eq!(log.front().unwrap().id, 971);
}

/// The segments' allocations, oldest first.
fn segment_addresses(log: &MessageLog) -> Vec<*const Vec<u8>> {
    log.segments.iter().map(|s| Arc::as_ptr(&s.bytes)).collect()
}

#[test]
fn a_growing_log_never_moves_what_it_holds() {
    // 20,000 appends of 600 B, the log at 10,000 messages (12 MB): each
    // write moves at most the segment it writes to and the first one; the
    // others stay where they are (one buffer grew by copying itself: a
    // 40-80 MB session's append held the main thread 36-82 ms).
    let mut log = MessageLog::new();
    let text = "b".repeat(600);
    for id in 1..=20_000 {
        let before = segment_addresses(&log);
        push(&mut log, id, "assistant", &text);
        if log.len() > 10_000 {
            log.pop_front();
        }
        log.settle();
        let after = segment_addresses(&log);
        let middle = before.get(1..before.len().saturating_sub(1)).unwrap_or(&[]);
        for address in middle {
            assert!(after.contains(address), "append {id} moved a segment");
        }
        assert!(log
            .segments
            .iter()
            .all(|s| s.bytes.capacity() <= SEGMENT_BYTES));
    }
    assert_eq!(log.len(), 10_000);
    assert_eq!(log.back().unwrap().content, text);
    // What it costs is about what it holds.
    let live = log.stored_len();
    assert!(
        log.mem_usage() < live + live / 16 + log.heads.capacity() * 24 + 2 * SEGMENT_BYTES,
        "{} B for {live} B",
        log.mem_usage()
    );
}

#[test]
fn a_shared_copy_keeps_its_bytes_while_the_log_changes() {
    let mut log = MessageLog::new();
    for id in 1..=10 {
        push(&mut log, id, "user", &format!("m{id}"));
    }
    let copy = log.shared_copy();
    for id in 11..=20 {
        push(&mut log, id, "user", &format!("m{id}"));
        log.pop_front();
        log.settle();
    }
    assert_eq!(
        copy.iter()
            .map(|m| m.content.to_owned())
            .collect::<Vec<_>>(),
        (1..=10).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
    assert_eq!(
        log.iter().map(|m| m.content.to_owned()).collect::<Vec<_>>(),
        (11..=20).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
    drop(copy);
    log.settle();
    assert_eq!(log.front().unwrap().content, "m11");
}

#[test]
fn pop_back_and_retain_keep_the_rest() {
    let mut log = MessageLog::new();
    for id in 1..=10 {
        push(
            &mut log,
            id,
            if id % 2 == 0 { "tool" } else { "user" },
            &format!("m{id}"),
        );
    }
    assert_eq!(log.pop_back(), Some((10, 10)));
    push(&mut log, 11, "user", "m11");
    log.retain(|h| h.id % 2 == 1);
    assert_eq!(
        log.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![1, 3, 5, 7, 9, 11]
    );
    // Dropping only the oldest takes the cursor path.
    log.retain(|h| h.id > 3);
    assert_eq!(
        log.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![5, 7, 9, 11]
    );
    assert_eq!(log.get(0).unwrap().content, "m5");
    assert_eq!(log.get(3).unwrap().content, "m11");
    while log.pop_front().is_some() {}
    assert!(log.is_empty());
    push(&mut log, 12, "user", "m12");
    assert_eq!(log.front().unwrap().content, "m12");
}

#[test]
fn stored_form_round_trips_and_refuses_corruption() {
    let mut log = MessageLog::new();
    for id in 1..=5 {
        push(&mut log, id, "assistant", "hello");
    }
    log.pop_front();
    let bytes: Vec<u8> = log.stored_bytes().flatten().copied().collect();
    let heads: Vec<_> = log
        .stored()
        .map(|(h, d)| (h.id, h.ts, u64::from(h.tokens), d.len() as u64))
        .collect();
    let back = MessageLog::from_stored(heads.clone().into_iter(), &bytes).unwrap();
    assert_eq!(back, log);
    let mut short = heads.clone();
    short[0].3 += 1;
    assert!(MessageLog::from_stored(short.into_iter(), &bytes).is_err());
    let mut bad = bytes.clone();
    bad[0] = 0xff;
    assert!(MessageLog::from_stored(heads.clone().into_iter(), &bad).is_err());
    let mut over = heads.clone();
    over[1].2 = MAX_MESSAGE_TOKENS + 1;
    assert!(MessageLog::from_stored(over.into_iter(), &bytes).is_err());
    let mut longer = bytes.clone();
    longer.push(b'x');
    assert!(MessageLog::from_stored(heads.into_iter(), &longer).is_err());
}

/// A log loaded from its stored form is laid out as writes lay it out: runs
/// of whole messages of at most a segment each (one larger message alone).
#[test]
fn a_stored_log_loads_into_segments_of_whole_messages() {
    let mut log = MessageLog::new();
    for id in 1..=40 {
        let len = if id == 20 {
            3 * SEGMENT_BYTES
        } else {
            700 + id as usize
        };
        push(&mut log, id, "user", &"y".repeat(len));
    }
    let bytes: Vec<u8> = log.stored_bytes().flatten().copied().collect();
    let heads: Vec<_> = log
        .stored()
        .map(|(h, d)| (h.id, h.ts, u64::from(h.tokens), d.len() as u64))
        .collect();
    let loaded = MessageLog::from_stored(heads.into_iter(), &bytes).unwrap();
    assert_eq!(loaded, log);
    assert!(loaded.segments.len() > 4);
    for s in &loaded.segments {
        assert!(s.bytes.len() <= SEGMENT_BYTES || s.bytes.len() > 3 * SEGMENT_BYTES);
        assert_eq!(s.bytes.capacity(), size_class(s.bytes.len()));
    }
    assert!(loaded.iter().eq(log.iter()));
}

/// Random pushes, evictions from both ends, filters, re-counts and
/// shared copies held across changes, against a plain deque of owned
/// messages: every read agrees, and so do copies taken on the way.
#[test]
fn random_operations_agree_with_a_plain_deque() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let roles = ["user", "assistant", "tool", "system", "critic"];
    for round in 0..40 {
        let mut log = MessageLog::new();
        let mut model: VecDeque<super::super::Message> = VecDeque::new();
        let mut copies: Vec<(MessageLog, Vec<super::super::Message>)> = Vec::new();
        let mut id = 0u64;
        for _ in 0..400 {
            match rng.gen_range(0..100) {
                0..=54 => {
                    id += rng.gen_range(1..3);
                    let len = if rng.gen_bool(0.05) {
                        rng.gen_range(10_000..40_000)
                    } else {
                        rng.gen_range(0..700)
                    };
                    let content: String = (0..len)
                        .map(|i| if i % 7 == 0 { 'é' } else { 'a' })
                        .collect();
                    let meta = rng.gen_bool(0.3).then(|| format!("{{\"n\":{id}}}"));
                    let role = roles[rng.gen_range(0..roles.len())];
                    let ts = rng.gen_range(-5_000i64..5_000_000);
                    let tokens = rng.gen_range(0..100_000u64);
                    log.push(id, ts, tokens, role, meta.as_deref(), &content)
                        .unwrap();
                    model.push_back(super::super::Message {
                        id,
                        role: role.into(),
                        content: content.into(),
                        ts,
                        tokens,
                        meta: meta.map(Arc::from),
                    });
                }
                55..=79 => {
                    assert_eq!(log.pop_front(), model.pop_front().map(|m| (m.id, m.tokens)));
                }
                80..=84 => {
                    assert_eq!(log.pop_back(), model.pop_back().map(|m| (m.id, m.tokens)));
                }
                85..=87 => {
                    let cut = rng.gen_range(0..3_000_000);
                    log.retain(|m| m.ts >= cut);
                    model.retain(|m| m.ts >= cut);
                }
                88..=90 if !model.is_empty() => {
                    let i = rng.gen_range(0..model.len());
                    let t = rng.gen_range(0..1000);
                    log.set_tokens(i, t);
                    model[i].tokens = t;
                }
                91..=94 => copies.push((log.shared_copy(), model.iter().cloned().collect())),
                95..=97 if !copies.is_empty() => {
                    copies.swap_remove(rng.gen_range(0..copies.len()));
                }
                _ => log.settle(),
            }
            if rng.gen_bool(0.5) {
                log.settle();
            }
            assert_eq!(log.len(), model.len());
        }
        let owned: Vec<_> = log.iter().map(|m| m.to_message()).collect();
        assert_eq!(
            owned,
            model.iter().cloned().collect::<Vec<_>>(),
            "round {round}"
        );
        for (i, m) in model.iter().enumerate() {
            assert_eq!(log.is_tool(i), &*m.role == "tool");
            assert_eq!(log.position(m.id), Some(i));
            assert_eq!(log.stored_len_of(i), log.data(i).len());
        }
        let gone: Vec<bool> = (0..log.len()).map(|i| i % 3 == 1).collect();
        let view = log.view_without(&gone);
        for i in 0..view.len() {
            assert_eq!(view.stored_len_of(i), view.data(i).len());
        }
        // SAVE's walk of the heads alone says what the walk of the bytes does.
        for l in [&log, &view] {
            let by_heads: Vec<_> = l.stored_heads().collect();
            let by_bytes: Vec<_> = l.stored().map(|(h, d)| (h, d.len())).collect();
            assert_eq!(by_heads, by_bytes, "round {round}");
            let total: usize = by_heads.iter().map(|(_, n)| n).sum();
            assert_eq!(total, l.stored_bytes().map(<[u8]>::len).sum::<usize>());
        }
        for (copy, then) in &copies {
            assert_eq!(
                &copy.iter().map(|m| m.to_message()).collect::<Vec<_>>(),
                then,
                "round {round}: a copy changed"
            );
        }
        let bytes: Vec<u8> = log.stored_bytes().flatten().copied().collect();
        let heads: Vec<_> = log
            .stored()
            .map(|(h, d)| (h.id, h.ts, u64::from(h.tokens), d.len() as u64))
            .collect();
        assert_eq!(
            MessageLog::from_stored(heads.into_iter(), &bytes).unwrap(),
            log
        );
    }
}

#[test]
fn size_classes_are_jemallocs() {
    assert_eq!(size_class(1), 16);
    assert_eq!(size_class(200), 224);
    assert_eq!(size_class(6030), 6144);
    assert_eq!(size_class(6145), 7168);
    assert_eq!(size_class(4096), 4096);
    assert_eq!(size_class(18_000), 20_480);
}

#[test]
fn a_log_at_its_cap_with_its_buffer_shared_stays_bounded() {
    // A copy holds the buffer for good (a worker's snapshot, held long).
    let mut log = MessageLog::new();
    let text = "b".repeat(2000);
    for id in 1..=30 {
        push(&mut log, id, "user", &text);
        log.settle();
    }
    let held = log.clone();
    let usage = log.mem_usage();
    for id in 31..=3000 {
        push(&mut log, id, "assistant", &text);
        log.pop_front();
        log.settle();
        assert!(
            log.mem_usage() < 3 * usage,
            "at {id}: {} B (was {usage})",
            log.mem_usage()
        );
    }
    assert_eq!(
        log.iter().map(|m| m.id).collect::<Vec<_>>(),
        (2971..=3000).collect::<Vec<_>>()
    );
    assert!(log
        .iter()
        .all(|m| m.content == text && m.role == "assistant"));
    // The copy still reads what it held.
    assert_eq!(
        held.iter().map(|m| m.id).collect::<Vec<_>>(),
        (1..=30).collect::<Vec<_>>()
    );
    assert!(held.iter().all(|m| m.content == text && m.role == "user"));
    let copied = log.copy_for_key();
    assert_eq!(copied, log);
    assert!(copied.mem_usage() <= log.mem_usage());
}

#[test]
fn positions_wrap_past_four_gib_of_appends() {
    // A session at its caps that has taken more than 4 GiB over its life:
    // logical positions wrap. Start just before the wrap.
    let mut log = MessageLog {
        first: u32::MAX - 50_000,
        ..MessageLog::default()
    };
    let text = |id: u64| format!("{id} {}", "w".repeat((id as usize * 37) % 9000));
    let mut held = None;
    for id in 1..=400u64 {
        let role = if id % 5 == 0 { "tool" } else { "user" };
        if id % 2 == 0 {
            push(&mut log, id, role, &text(id));
        } else {
            // Laid out ahead, as a worker does (kept when over 8 KiB).
            let prepared = Prepared::of(role, None, &text(id));
            log.push_prepared(id, id as i64 * 10, id, role, None, &text(id), prepared)
                .unwrap();
        }
        if log.len() > 12 {
            log.pop_front();
        }
        if id % 50 == 0 {
            held = Some(log.clone()); // a shared buffer across the wrap
        }
        if id % 97 == 0 {
            log.retain(|h| h.id % 2 == 0 || h.id == id);
        }
        log.settle();
        for m in log.iter() {
            assert_eq!(m.content, text(m.id), "id {} after push {id}", m.id);
            assert_eq!(m.role, if m.id % 5 == 0 { "tool" } else { "user" });
        }
    }
    assert!(log.first < u32::MAX - 50_000, "the positions did not wrap");
    let held = held.unwrap();
    assert!(held.iter().all(|m| m.content == text(m.id)));
    let bytes: Vec<u8> = log.stored_bytes().flatten().copied().collect();
    let heads: Vec<(u64, i64, u64, u64)> = log
        .stored()
        .map(|(h, d)| (h.id, h.ts, u64::from(h.tokens), d.len() as u64))
        .collect();
    let loaded = MessageLog::from_stored(heads.into_iter(), &bytes).unwrap();
    assert_eq!(loaded, log);
}

#[test]
fn heads_give_back_their_ring_after_a_large_drop() {
    let mut log = MessageLog::new();
    for id in 1..=100_000 {
        push(&mut log, id, "user", "m");
    }
    log.settle();
    let full = log.mem_usage();
    while log.len() > 100 {
        log.pop_front();
    }
    log.settle();
    assert!(
        log.mem_usage() < full / 100,
        "{} B held for 100 messages (was {full})",
        log.mem_usage()
    );
    assert_eq!(log.front().unwrap().id, 99_901);
    push(&mut log, 100_001, "user", "after");
    log.settle();
    assert_eq!(log.back().unwrap().content, "after");
}

#[test]
fn a_log_at_its_caps_costs_about_what_it_holds() {
    // Whatever the count at the caps, appends and evictions leave at most
    // half a segment evicted at the front and a class of spare at the end.
    let text = "c".repeat(2000);
    for n in [3u64, 4, 5, 30, 2_000, 2_013, 5_003] {
        let mut log = MessageLog::new();
        for id in 1..=n {
            push(&mut log, id, "user", &text);
            log.settle();
        }
        for id in n + 1..=4 * n {
            push(&mut log, id, "user", &text);
            log.pop_front();
            log.settle();
            let live = log.live_bytes();
            let held: usize = log.segments.iter().map(|s| s.bytes.capacity()).sum();
            assert!(
                held <= live + live / 16 + 2 * SEGMENT_BYTES,
                "n {n}, append {id}: {held} B held for {live}"
            );
        }
        assert!(log.iter().all(|m| m.content == text));
        assert_eq!(log.len() as u64, n);
    }
}

#[test]
fn retain_in_place_equals_a_rebuild_and_keeps_the_log_writable() {
    // Random logs (evicted prefixes, settled or not), random messages kept:
    // in place (the buffer is the log's own) and rebuilt (it is shared with
    // a copy) give the same log, and both take further pushes and evictions.
    let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15u64);
    let mut next = move |n: u64| rng.gen_range(0..n);
    for round in 0..400 {
        let mut log = MessageLog::new();
        let n = 1 + next(40);
        for id in 1..=n {
            push(
                &mut log,
                id,
                ["user", "tool", "assistant", "critic"][next(4) as usize],
                &"b".repeat(next(900) as usize),
            );
            if next(5) == 0 {
                log.pop_front();
            }
            if next(2) == 0 {
                log.settle();
            }
        }
        log.settle();
        let keep: Vec<bool> = (0..log.len()).map(|_| next(3) != 0).collect();
        let mut in_place = log.clone();
        let mut rebuilt = log.clone();
        let _holder = rebuilt.shared_copy();
        let mut k = keep.iter();
        in_place.retain(|_| *k.next().unwrap());
        let mut k = keep.iter();
        rebuilt.retain(|_| *k.next().unwrap());
        assert_eq!(in_place, rebuilt, "round {round}");
        let want: Vec<u64> = log
            .iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(m, _)| m.id)
            .collect();
        assert_eq!(in_place.iter().map(|m| m.id).collect::<Vec<_>>(), want);
        for log in [&mut in_place, &mut rebuilt] {
            push(log, 1000, "user", "after");
            log.pop_front();
            log.settle();
        }
        assert_eq!(in_place, rebuilt, "round {round}, after more writes");
    }
}

/// Counts the times an append reallocated the last segment (its capacity
/// changed: jemalloc copies it to the next class) over `appends` appends of
/// 600 B, evicting the oldest past `keep` messages when `keep` is set.
fn tail_moves(appends: u64, keep: Option<usize>) -> (usize, MessageLog) {
    let mut log = MessageLog::new();
    let mut moves = 0;
    let text = "c".repeat(600);
    for id in 1..=appends {
        let before = log.segments.back().map(|s| (s.start, s.bytes.capacity()));
        push(&mut log, id, "user", &text);
        if keep.is_some_and(|k| log.len() > k) {
            log.pop_front();
        }
        log.settle();
        let after = log.segments.back().map(|s| (s.start, s.bytes.capacity()));
        if matches!((before, after), (Some(b), Some(a)) if b.0 == a.0 && b.1 != a.1) {
            moves += 1;
        }
    }
    (moves, log)
}

#[test]
fn a_log_at_its_caps_grows_its_last_segment_with_room_for_one_more_message() {
    // At the caps every append evicts: the last segment is reallocated at
    // most every other append (an exact fit: 7 appends in 10).
    let (moves, log) = tail_moves(300, Some(30));
    assert!(
        moves <= 300 / 2,
        "{moves} reallocations of the last segment in 300 appends"
    );
    let tail = log.segments.back().unwrap();
    assert!(tail.bytes.capacity() - tail.bytes.len() <= size_class(2 * 605));
    // A log that only grows keeps the exact fit: its last segment holds no
    // more than its allocator class rounds up to.
    let (_, log) = tail_moves(30, None);
    let tail = log.segments.back().unwrap();
    assert_eq!(tail.bytes.capacity(), size_class(tail.bytes.len()));
}

#[test]
fn a_log_at_its_caps_moves_at_most_two_bytes_per_byte_it_evicts() {
    // The front segment's kept bytes move to a fitted allocation once a
    // third of it is evicted: each move copies into memory not in cache,
    // and at a quarter an append at the caps cost more than 2x XADD's
    // server CPU. Whole segments dropped move nothing.
    let text = "c".repeat(600);
    let (mut log, mut moved, mut evicted) = (MessageLog::new(), 0usize, 0usize);
    for id in 1..=3_000u64 {
        push(&mut log, id, "user", &text);
        let front = |log: &MessageLog| {
            log.segments
                .front()
                .map(|s| (s.end(), s.bytes.as_ptr(), s.bytes.len()))
        };
        let before = front(&log);
        if log.len() > 30 {
            let gone = log.begin(1).wrapping_sub(log.begin(0)) as usize;
            log.pop_front();
            evicted += gone;
        }
        log.settle();
        match (before, front(&log)) {
            // The same segment (same end) in a new allocation: compacted.
            (Some((end, at, _)), Some((end_after, at_after, len)))
                if end == end_after && at != at_after =>
            {
                moved += len
            }
            _ => {}
        }
    }
    assert!(evicted > 1_000_000);
    // At most two bytes a byte in the worst case; 1.36 for 600 B messages
    // in 8 KiB segments (a quarter moved 1.77, a half 0.77).
    assert!(
        2 * moved <= 3 * evicted,
        "{moved} B moved for {evicted} B evicted"
    );
    assert!(moved > 0, "the front is compacted at all");
}

/// A message laid out ahead (`Prepared`, a worker's) is kept as its own
/// segment, uncopied, and reads back as `push` would have stored it; a
/// small one is not prepared, the bytes stand for the texts (a replica's
/// op has no content), and a prepared message the tail has room for is
/// copied there.
#[test]
fn a_prepared_large_message_keeps_its_buffer_and_reads_as_pushed() {
    let meta = format!("{{\"blob\":\"{}\"}}", "m".repeat(20_000));
    let content = "c".repeat(30_000);
    assert!(Prepared::of("user", None, "small").is_none());
    let (mut log, mut plain) = (MessageLog::new(), MessageLog::new());
    for id in 1..=6u64 {
        let (role, meta) = match id % 3 {
            0 => ("critic", None),
            1 => ("assistant", Some(meta.as_str())),
            _ => ("user", Some("{}")),
        };
        let body = &content[..10_000 * id as usize % 30_000 + 9_000];
        let prepared = Prepared::of(role, meta, body).unwrap();
        let at = prepared.0.as_ptr();
        log.push_prepared(id, 1, id, role, meta, body, Some(prepared))
            .unwrap();
        plain.push(id, 1, id, role, meta, body).unwrap();
        assert_eq!(log.segments.back().unwrap().bytes.as_ptr(), at, "id {id}");
        // A small message after it goes into the large one's spare room.
        push(&mut log, 100 + id, "user", "after");
        push(&mut plain, 100 + id, "user", "after");
        log.settle();
        plain.settle();
    }
    assert_eq!(log, plain);
    assert_eq!(log.stored_len(), plain.stored_len());
    // The bytes stand for the texts: a replica's op carries no content.
    let laid_out = Prepared::of("tool", Some("{}"), &content).unwrap();
    log.push_prepared(200, 1, 1, "tool", Some("{}"), "", Some(laid_out))
        .unwrap();
    let back = log.back().unwrap();
    assert_eq!(
        (back.role, back.meta, back.content),
        ("tool", Some("{}"), &*content)
    );
    // Room in the tail: copied there, not kept.
    let mut roomy = MessageLog::new();
    roomy
        .push(1, 1, 1, "user", None, &"x".repeat(9_000))
        .unwrap();
    roomy.pop_front();
    roomy
        .push(2, 1, 1, "user", None, &"y".repeat(9_000))
        .unwrap();
    let segments = roomy.segments.len();
    let small_large = Prepared::of("user", None, &"z".repeat(8_200)).unwrap();
    let fits = roomy.tail_takes(small_large.0.len());
    roomy
        .push_prepared(3, 1, 1, "user", None, &"z".repeat(8_200), Some(small_large))
        .unwrap();
    assert_eq!(roomy.segments.len(), segments + usize::from(!fits));
    assert_eq!(roomy.back().unwrap().content, "z".repeat(8_200));
}
