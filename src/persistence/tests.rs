use std::collections::BTreeMap;

use super::*;
use crate::session::{Departed, ExternalId, Lease, Leases, Message, MessageLog, Settings, Summary};
use crate::tokenizer::Encoding;

fn settings(encoding: Encoding) -> Settings {
    Settings {
        model: "gpt-4o".into(),
        encoding,
        ttl: 3600,
        max_tokens: 80_000,
        max_msgs: 30,
        // 0 (none): what a format-1 payload decodes to, so the v1 golden
        // bytes decode to these same values.
        max_age: 0,
    }
}

fn message(id: u64, role: &str, content: &str, meta: Option<&str>) -> Message {
    Message {
        id,
        role: role.into(),
        content: content.into(),
        ts: 1_700_000_000_000 + id as i64,
        tokens: 3 + role.len() as u64,
        meta: meta.map(Into::into),
    }
}

/// `sample_0_1()` with what format 2 added: a msgid, a lease, a departed
/// msgid. Every field of format 2 is used.
fn sample() -> Session {
    let mut s = sample_0_1();
    s.msgids.attach(4, "c-4".into());
    s.leases = Leases {
        current: Some(Lease {
            token: 3,
            expires_at: 1_700_000_060_000,
        }),
        last_token: 3,
    }
    .into();
    s.msgids.departed.push_back(Departed {
        msgid: "c-2".into(),
        id: 2,
        tokens: 7,
    });
    s
}

/// A session that uses every field release 0.1 had: summary, messages
/// with and without META, external ids, imported members, the cl100k
/// encoding.
fn sample_0_1() -> Session {
    let messages = vec![
        message(4, "user", "Weather in 東京?", None),
        message(5, "assistant", "", Some(r#"{"tool_calls":[{"id":"c1"}]}"#)),
        message(7, "tool", "18C", Some(r#"{"tool_call_id":"c1"}"#)),
    ];
    let summary = Summary {
        text: "Earlier: greetings.".into(),
        tokens: 9,
        upto: 3,
        ts: 1_700_000_000_500,
    };
    let total_tokens = summary.tokens + messages.iter().map(|m| m.tokens).sum::<u64>();
    let external = BTreeMap::from([
        (
            "dify".to_owned(),
            ExternalId {
                id: "conv-1".into(),
                expires_at: 1_900_000_000_000,
            },
        ),
        (
            "n8n".to_owned(),
            ExternalId {
                id: "exec-9".into(),
                expires_at: -5,
            },
        ),
    ]);
    Session {
        messages: MessageLog::from_messages(messages).unwrap(),
        summary: Some(Box::new(summary)),
        settings: settings(Encoding::Cl100kBase),
        external: external.into(),
        last_id: 8,
        total_tokens,
        created: 1_699_999_999_000,
        updated: 1_700_000_000_007,
        extra: crate::session::Attrs::from_text(Some(r#"{"user_profile":{"name":"Ann"}}"#))
            .unwrap(),
        leases: Default::default(),
        msgids: Default::default(),
        history: Default::default(),
    }
}

/// A session with nothing optional.
fn bare() -> Session {
    Session::new(settings(Encoding::O200kBase), 0)
}

fn sample_ops() -> Vec<Op> {
    vec![
        Op::Append {
            now: 1_700_000_000_009,
            settings: settings(Encoding::O200kBase),
            message: message(9, "user", "hi", Some("{}")),
            msgid: None,
        },
        Op::Summarize {
            now: 1_700_000_000_010,
            summary: Summary {
                text: "sum".into(),
                tokens: 7,
                upto: 9,
                ts: 1_700_000_000_010,
            },
        },
        Op::ExtSet {
            now: 1_700_000_000_011,
            settings: settings(Encoding::Cl100kBase),
            system: "dify".into(),
            external: ExternalId {
                id: "c1".into(),
                expires_at: 1_700_000_600_011,
            },
        },
    ]
}

/// The ops format 2 added, or gave a new field: a lease, an append with a
/// msgid.
fn sample_ops_v2() -> Vec<Op> {
    vec![
        Op::Lease {
            now: 1_700_000_000_012,
            lease: Lease {
                token: 4,
                expires_at: 1_700_000_060_000,
            },
        },
        Op::Append {
            now: 1_700_000_000_012,
            settings: settings(Encoding::O200kBase),
            message: message(9, "user", "hi", None),
            msgid: Some("m-9".into()),
        },
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// ---- golden bytes: these fail whenever the format drifts ----------------

/// `sample()` in format 2 (docs/FORMAT.md, section "Session, format 2").
const V2_SAMPLE: &str = "02 066770742d346f 02 901c 80f104 1e 00  08 23 b090abfef962 8ea0abfef962
    01 13 4561726c6965723a206772656574696e67732e 09 03 e8a7abfef962
    03
      04 04 75736572 12 5765617468657220696e20e69db1e4baac3f 88a0abfef962 07 00
      05 09 617373697374616e74 00 8aa0abfef962 0c 01 1c 7b22746f6f6c5f63616c6c73223a5b7b226964223a226331227d5d7d
      07 04 746f6f6c 03 313843 8ea0abfef962 07 01 15 7b22746f6f6c5f63616c6c5f6964223a226331227d
    02 04 64696679 06 636f6e762d31 80e0998dcc6e  03 6e386e 06 657865632d39 09
    01 1f 7b22757365725f70726f66696c65223a7b226e616d65223a22416e6e227d7d
    01 03 c0c9b2fef962  03
    01 04 03 632d34
    01 03 632d32 02 07";
const V2_BARE: &str = "02 066770742d346f 01 901c 80f104 1e 00 00 00 00 00 00 00 00 00 00 00 00 00";
/// `sample_ops()` in format 2, in order (kinds 1, 2, 3).
const V2_OPS: [&str; 3] = [
    "02 01 92a0abfef962 066770742d346f 01 901c 80f104 1e 00 09 04 75736572 02 6869 92a0abfef962 07 01 02 7b7d 00",
    "02 02 94a0abfef962 03 73756d 07 09 94a0abfef962",
    "02 03 96a0abfef962 066770742d346f 02 901c 80f104 1e 00 04 64696679 02 6331 96bff4fef962",
];
/// `sample_ops_v2()`: kind 5 (Lease), and an append whose message has a
/// msgid.
const V2_OPS_ADDED: [&str; 2] = [
    "02 05 98a0abfef962 04 c0c9b2fef962",
    "02 01 98a0abfef962 066770742d346f 01 901c 80f104 1e 00 09 04 75736572 02 6869 92a0abfef962 07 00 01 03 6d2d39",
];

/// The same values as release 0.1 wrote them: postcard 1.2's encoding of
/// the 0.1 structs, taken from postcard itself before the dependency was
/// removed (the decoder was also checked against postcard then, on 200
/// sessions and 400 ops of extreme values).
const V1_SAMPLE: &str = "01 03
      04 04 75736572 12 5765617468657220696e20e69db1e4baac3f 88a0abfef962 07 00
      05 09 617373697374616e74 00 8aa0abfef962 0c 01 1c 7b22746f6f6c5f63616c6c73223a5b7b226964223a226331227d5d7d
      07 04 746f6f6c 03 313843 8ea0abfef962 07 01 15 7b22746f6f6c5f63616c6c5f6964223a226331227d
    01 13 4561726c6965723a206772656574696e67732e 09 03 e8a7abfef962
    066770742d346f 01 901c 80f104 1e
    02 04 64696679 06 636f6e762d31 80e0998dcc6e  03 6e386e 06 657865632d39 09
    08 23 b090abfef962 8ea0abfef962
    01 1f 7b22757365725f70726f66696c65223a7b226e616d65223a22416e6e227d7d";
const V1_BARE: &str = "01 00 00 066770742d346f 00 901c 80f104 1e 00 00 00 00 00 00";
const V1_OPS: [&str; 3] = [
    "01 00 92a0abfef962 066770742d346f 00 901c 80f104 1e 09 04 75736572 02 6869 92a0abfef962 07 01 02 7b7d",
    "01 01 94a0abfef962 03 73756d 07 09 94a0abfef962",
    "01 02 96a0abfef962 066770742d346f 01 901c 80f104 1e 04 64696679 02 6331 96bff4fef962",
];

/// `sample()` in format 3: format 2's fields around the messages, which are
/// a count, per message (id delta, ts delta, tokens, stored length), the
/// total length and the stored bytes (tag, role, meta, content).
const V3_SAMPLE: &str = "03
    066770742d346f 02 901c 80f104 1e 00  08 23 b090abfef962 8ea0abfef962
    01 13 4561726c6965723a206772656574696e67732e 09 03 e8a7abfef962
    03  04 88a0abfef962 07 13  01 02 0c 1e  02 04 07 1a
    4b  00 5765617468657220696e20e69db1e4baac3f
        09 1c 7b22746f6f6c5f63616c6c73223a5b7b226964223a226331227d5d7d
        0b 15 7b22746f6f6c5f63616c6c5f6964223a226331227d 313843
    02 04 64696679 06 636f6e762d31 80e0998dcc6e 03 6e386e 06 657865632d39 09
    01 1f 7b22757365725f70726f66696c65223a7b226e616d65223a22416e6e227d7d
    01 03 c0c9b2fef962 03  01 04 03 632d34  01 03 632d32 02 07";

/// `sample()` in format 4: format 3 and then the attributes' expiries
/// (none), evicted (0), summarized (0) and summaries dropped (0).
fn v4_sample() -> String {
    let mut v4 = V3_SAMPLE.replacen("03", "04", 1);
    v4.push_str(" 00 00 00 00");
    v4
}

#[test]
fn format_4_golden_bytes() {
    assert_eq!(hex(&encode_session(&sample())), hex(&unhex(&v4_sample())));
    let mut s = sample();
    s.attr_set("ctx", "1".into(), Some(1_700_000_360_000));
    s.history.evicted = 3;
    s.history.summarized = 300;
    s.history.summaries_dropped = 1;
    let bytes = encode_session(&s);
    // ... one expiry, "ctx", its time; evicted 03, summarized ac02, 01.
    assert!(hex(&bytes).ends_with("03ac0201"), "{}", hex(&bytes));
    assert!(hex(&bytes).contains("01036374"), "{}", hex(&bytes));
    assert_eq!(decode_session(&bytes).unwrap(), s);
}

#[test]
fn format_3_golden_bytes() {
    // What releases after 0.2 wrote before format 4: it loads as it was.
    assert_eq!(decode_session(&unhex(V3_SAMPLE)).unwrap(), sample());
    // The same session as format 2 wrote it.
    assert_eq!(
        decode_session(&unhex(V3_SAMPLE)).unwrap(),
        decode_session(&unhex(V2_SAMPLE)).unwrap()
    );
}

#[test]
fn format_2_golden_bytes() {
    assert_eq!(hex(&encode_session_v2(&sample())), hex(&unhex(V2_SAMPLE)));
    assert_eq!(hex(&encode_session_v2(&bare())), hex(&unhex(V2_BARE)));
    for (op, want) in sample_ops().iter().zip(V2_OPS) {
        assert_eq!(hex(&encode_op(op)), hex(&unhex(want)), "{op:?}");
    }
    for (op, want) in sample_ops_v2().iter().zip(V2_OPS_ADDED) {
        assert_eq!(hex(&encode_op(op)), hex(&unhex(want)), "{op:?}");
    }
}

#[test]
fn format_2_golden_bytes_decode() {
    assert_eq!(decode_session(&unhex(V2_SAMPLE)).unwrap(), sample());
    assert_eq!(decode_session(&unhex(V2_BARE)).unwrap(), bare());
    for (op, bytes) in sample_ops().into_iter().zip(V2_OPS) {
        assert_eq!(decode_op(&unhex(bytes)).unwrap(), op);
    }
    for (op, bytes) in sample_ops_v2().into_iter().zip(V2_OPS_ADDED) {
        assert_eq!(decode_op(&unhex(bytes)).unwrap(), op);
    }
}

/// `Op::AttrSet` (kind 6: now, settings, name, value) and `Op::AttrDel`
/// (kind 7: now, name), and a settings layout whose `max_age` (its last
/// field) is set: 604800 s, seven days.
const V2_ATTRSET: &str = "02 06 92a0abfef962 066770742d346f 01 901c 80f104 1e 80f524 07 636f6e74657874 0b 7b22746f706963223a317d";
const V2_ATTRDEL: &str = "02 07 94a0abfef962 07 636f6e74657874";

fn sample_attr_ops() -> [Op; 2] {
    [
        Op::AttrSet {
            now: 1_700_000_000_009,
            settings: Settings {
                max_age: 604_800,
                ..settings(Encoding::O200kBase)
            },
            name: "context".into(),
            value: r#"{"topic":1}"#.into(),
            expires_at: None,
        },
        Op::AttrDel {
            now: 1_700_000_000_010,
            name: "context".into(),
        },
    ]
}

#[test]
fn format_2_golden_bytes_of_attribute_ops_and_max_age() {
    for (op, want) in sample_attr_ops().into_iter().zip([V2_ATTRSET, V2_ATTRDEL]) {
        assert_eq!(hex(&encode_op(&op)), hex(&unhex(want)), "{op:?}");
        assert_eq!(decode_op(&unhex(want)).unwrap(), op);
    }
    let mut s = sample();
    s.settings.max_age = 604_800;
    assert_eq!(decode_session(&encode_session(&s)).unwrap(), s);
}

/// `Op::Recount` (kind 4): now, encoding code, summary tokens (option),
/// then the (id, tokens) pairs.
const V2_RECOUNT: &str = "02 04 92a0abfef962 02 01 09 02 04 07 05 0c";

fn sample_recount() -> Op {
    Op::Recount {
        now: 1_700_000_000_009,
        encoding: Encoding::Cl100kBase,
        summary_tokens: Some(9),
        counts: vec![(4, 7), (5, 12)],
    }
}

#[test]
fn format_2_golden_bytes_of_a_recount() {
    assert_eq!(hex(&encode_op(&sample_recount())), hex(&unhex(V2_RECOUNT)));
    assert_eq!(decode_op(&unhex(V2_RECOUNT)).unwrap(), sample_recount());
    let none = Op::Recount {
        now: 1_700_000_000_009,
        encoding: Encoding::O200kBase,
        summary_tokens: None,
        counts: vec![],
    };
    assert_eq!(decode_op(&encode_op(&none)).unwrap(), none);
    let bytes = unhex(V2_RECOUNT);
    for len in 0..bytes.len() {
        assert!(decode_op(&bytes[..len]).is_err(), "truncated at {len}");
    }
}

#[test]
fn format_1_of_release_0_1_decodes() {
    assert_eq!(decode_session(&unhex(V1_SAMPLE)).unwrap(), sample_0_1());
    assert_eq!(decode_session(&unhex(V1_BARE)).unwrap(), bare());
    for (op, bytes) in sample_ops().into_iter().zip(V1_OPS) {
        assert_eq!(decode_op(&unhex(bytes)).unwrap(), op);
    }
}

// ---- round trips ------------------------------------------------------

/// The sample after more ops were applied (trimmed, summarized, ext ids).
fn lived_in() -> Session {
    let mut s = sample();
    s.settings.max_msgs = 4;
    for id in 9..20 {
        let role = if id % 3 == 0 { "tool" } else { "user" };
        let msgid = (id % 2 == 0).then(|| format!("m{id}").into());
        let op = Op::Append {
            now: 1_700_000_001_000 + id as i64,
            settings: s.settings.clone(),
            message: message(id, role, &format!("m{id}"), None),
            msgid,
        };
        s.apply(op).unwrap();
    }
    // Cover up to a message whose successor is not a tool result.
    let upto = s
        .messages
        .iter()
        .zip(s.messages.iter().skip(1))
        .find(|(_, next)| next.role != "tool")
        .map(|(m, _)| m.id)
        .unwrap();
    s.apply(Op::Summarize {
        now: 1_700_000_002_000,
        summary: Summary {
            text: "so far".into(),
            tokens: 5,
            upto,
            ts: 1_700_000_002_000,
        },
    })
    .unwrap();
    s
}

#[test]
fn sessions_round_trip() {
    for s in [sample(), sample_0_1(), bare(), lived_in()] {
        s.validate().unwrap();
        assert_eq!(decode_session(&encode_session(&s)).unwrap(), s);
    }
}

#[test]
fn ops_round_trip_with_extreme_values() {
    let mut ops = sample_ops();
    ops.extend(sample_ops_v2());
    ops.extend(sample_attr_ops());
    ops.push(Op::Lease {
        now: i64::MIN,
        lease: Lease {
            token: u64::MAX,
            expires_at: i64::MAX,
        },
    });
    ops.push(Op::Append {
        now: i64::MIN,
        settings: Settings {
            ttl: u64::MAX,
            max_tokens: u64::MAX,
            max_msgs: 1,
            ..settings(Encoding::Cl100kBase)
        },
        message: Message {
            id: u64::MAX,
            ts: i64::MAX,
            tokens: u64::MAX,
            ..message(1, "r", "", None)
        },
        msgid: Some("m".repeat(128).into()),
    });
    ops.push(Op::ExtSet {
        now: i64::MAX,
        settings: settings(Encoding::O200kBase),
        system: "s".into(),
        external: ExternalId {
            id: String::new(),
            expires_at: i64::MIN,
        },
    });
    for op in ops {
        assert_eq!(decode_op(&encode_op(&op)).unwrap(), op);
        // What MEM._APPLY receives: the header, then the text put back.
        let content = match &op {
            Op::Append { message, .. } => message.content.to_string(),
            Op::Summarize { summary, .. } => summary.text.clone(),
            _ => String::new(),
        };
        // Encoded without the clone the header was (what writes replicate).
        assert_eq!(encode_op_header(&op), encode_op(&op.header()));
        // A header text left apart goes back where the gap is: the same
        // header, whatever its size against the bound.
        for apart_from in [0, 1, 5, usize::MAX] {
            let (mut bytes, gap) = encode_op_header_apart(&op, apart_from);
            let text = op.header_text().filter(|t| t.len() >= apart_from);
            assert_eq!(gap.is_some(), text.is_some(), "{op:?} from {apart_from}");
            if let (Some(at), Some(text)) = (gap, text) {
                bytes.splice(at..at, text.bytes());
            }
            assert_eq!(bytes, encode_op_header(&op), "{op:?} from {apart_from}");
        }
        assert_eq!(
            decode_op(&encode_op(&op.header()))
                .unwrap()
                .with_content(&content),
            op
        );
    }
}

// ---- corrupt input ----------------------------------------------------------

fn all_payloads() -> Vec<(String, Vec<u8>, bool)> {
    let mut out = vec![
        ("v2 session".into(), encode_session_v2(&sample()), true),
        (
            "v2 lived-in session".into(),
            encode_session_v2(&lived_in()),
            true,
        ),
        ("v3 session".into(), encode_session(&sample()), true),
        (
            "v3 lived-in session".into(),
            encode_session(&lived_in()),
            true,
        ),
        ("v1 session".into(), unhex(V1_SAMPLE), true),
    ];
    for (i, op) in sample_ops().iter().enumerate() {
        out.push((format!("v2 op {i}"), encode_op(op), false));
        out.push((format!("v1 op {i}"), unhex(V1_OPS[i]), false));
    }
    for (i, op) in sample_ops_v2().iter().enumerate() {
        out.push((format!("v2 added op {i}"), encode_op(op), false));
    }
    out
}

fn decodes(bytes: &[u8], is_session: bool) -> bool {
    if is_session {
        decode_session(bytes).is_ok()
    } else {
        decode_op(bytes).is_ok()
    }
}

#[test]
fn every_truncation_is_refused() {
    for (what, bytes, is_session) in all_payloads() {
        assert!(decodes(&bytes, is_session), "{what}");
        for len in 0..bytes.len() {
            assert!(
                !decodes(&bytes[..len], is_session),
                "{what} truncated at {len}"
            );
        }
    }
}

#[test]
fn trailing_bytes_are_refused() {
    for (what, mut bytes, is_session) in all_payloads() {
        bytes.push(0);
        let e = if is_session {
            decode_session(&bytes).unwrap_err()
        } else {
            decode_op(&bytes).unwrap_err()
        };
        assert!(e.contains("trailing"), "{what}: {e}");
    }
}

/// Every single-bit flip: no panic; a session that still decodes holds its
/// invariants, and in format 2 is exactly what the encoder writes for it
/// (one encoding per value).
#[test]
fn flipped_bits_never_panic_and_never_break_invariants() {
    for (what, bytes, is_session) in all_payloads() {
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                if is_session {
                    if let Ok(s) = decode_session(&b) {
                        assert!(s.validate().is_ok(), "{what}: byte {i} bit {bit}");
                        if b[0] == 2 {
                            assert_eq!(encode_session_v2(&s), b, "{what}: byte {i} bit {bit}");
                        }
                        if b[0] == 3 {
                            assert_eq!(encode_session(&s), b, "{what}: byte {i} bit {bit}");
                        }
                    }
                } else if let Ok(op) = decode_op(&b) {
                    if b[0] == 2 {
                        assert_eq!(encode_op(&op), b, "{what}: byte {i} bit {bit}");
                    }
                }
            }
        }
    }
}

#[test]
fn unknown_formats_are_refused() {
    for (what, bytes, is_session) in all_payloads() {
        for format in [0u8, 5, 9, 255] {
            let mut b = bytes.clone();
            b[0] = format;
            let e = if is_session {
                decode_session(&b).unwrap_err()
            } else {
                decode_op(&b).unwrap_err()
            };
            assert!(
                e.contains(&format!("unknown payload format {format}")),
                "{what}: {e}"
            );
        }
    }
    assert_eq!(decode_session(&[]).unwrap_err(), "empty payload");
    assert_eq!(decode_op(&[]).unwrap_err(), "empty payload");
    let mut op = encode_op(&sample_ops()[0]);
    op[0] = 3;
    assert!(decode_op(&op)
        .unwrap_err()
        .contains("format 3 carries sessions"));
}

#[test]
fn rdb_values_need_the_format_of_their_encoding_version() {
    let v1 = unhex(V1_SAMPLE);
    let v2 = encode_session_v2(&sample());
    let v3 = unhex(V3_SAMPLE);
    let v4 = encode_session(&sample());
    assert_eq!(RDB_ENCODING_VERSION, 4);
    assert_eq!(decode_rdb_session(1, &v1).unwrap(), sample_0_1());
    assert_eq!(decode_rdb_session(2, &v2).unwrap(), sample());
    assert_eq!(decode_rdb_session(3, &v3).unwrap(), sample());
    assert_eq!(decode_rdb_session(4, &v4).unwrap(), sample());
    assert!(decode_rdb_session(3, &v4).is_err());
    assert!(decode_rdb_session(1, &v2)
        .unwrap_err()
        .contains("format 2 in a value of encoding version 1"));
    assert!(decode_rdb_session(2, &v1).is_err());
    assert!(decode_rdb_session(3, &v2).is_err());
    assert!(decode_rdb_session(2, &v3).is_err());
    assert!(decode_rdb_session(4, &v3).is_err());
    assert!(decode_rdb_session(2, &[]).is_err());
}

#[test]
fn impossible_counts_are_refused_before_allocating() {
    // A bare session whose message count is 2^62 (the rest: 7 bytes).
    let mut b = unhex(V2_BARE);
    let at = b.len() - 7;
    b.splice(
        at..at + 1,
        [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40],
    );
    assert!(decode_session(&b).unwrap_err().contains("messages count"));
    // Format 1: the message count comes first.
    let mut b = unhex(V1_BARE);
    b.splice(1..2, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
    assert!(decode_session(&b).unwrap_err().contains("messages count"));
    // A string length far beyond the payload.
    let mut b = unhex(V2_OPS[1]);
    b.splice(8..9, [0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(decode_op(&b).unwrap_err().contains("truncated"));
}

#[test]
fn format_2_refuses_what_its_encoder_never_writes() {
    let good = unhex(V2_BARE);
    // An overlong varint (ttl 3600 as 90 9c 00).
    let mut b = good.clone();
    b.splice(9..11, [0x90, 0x9c, 0x00]);
    assert!(decode_session(&b).unwrap_err().contains("varint"));
    // Encoding code 0 and 11 (1-10 are the encodings); option tag 2 (summary).
    for (at, value) in [(8, 0u8), (8, 11), (20, 2)] {
        let mut b = good.clone();
        b[at] = value;
        assert!(decode_session(&b).is_err(), "byte {at} = {value}");
    }
    // External systems out of order or repeated.
    for systems in [["n8n", "dify"], ["dify", "dify"]] {
        let mut w = wire::Writer::with_capacity(2, 64);
        let s = bare();
        w.str(&s.settings.model);
        w.u8(1); // o200k_base
                 // ttl, caps, max_age, last_id, total, created, updated
        for v in [3600u64, 80_000, 30, 0, 0, 0, 0, 0] {
            w.u64(v);
        }
        w.u8(0);
        w.u64(0);
        w.u64(2);
        for system in systems {
            w.str(system);
            w.str("id");
            w.i64(1);
        }
        w.u8(0); // extra
        w.u8(0); // lease
        w.u64(0); // last lease token
        w.u64(0); // held msgids
        w.u64(0); // departed msgids
        assert!(
            decode_session(&w.into_bytes())
                .unwrap_err()
                .contains("out of order"),
            "{systems:?}"
        );
    }
    // Op kinds no format-2 encoder writes.
    for kind in [0u8, 200] {
        let mut b = unhex(V2_OPS[0]);
        b[1] = kind;
        assert!(decode_op(&b).unwrap_err().contains("unknown op kind"));
    }
}

#[test]
fn decoded_sessions_are_validated() {
    let mut s = sample();
    s.total_tokens += 1;
    assert!(decode_session(&encode_session(&s))
        .unwrap_err()
        .contains("total_tokens"));
    let mut s = sample();
    s.settings.max_msgs = 0;
    assert!(decode_session(&encode_session(&s)).is_err());
}

// ---- format 1 built by hand (postcard's rules, docs/FORMAT.md) ------------

/// Writes format 1 as postcard did, independently of the decoder.
struct V1(Vec<u8>);

impl V1 {
    fn varint(&mut self, mut v: u64) -> &mut Self {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
        self
    }
    fn zigzag(&mut self, v: i64) -> &mut Self {
        self.varint(((v << 1) ^ (v >> 63)) as u64)
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.varint(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn settings(&mut self, model: &str, encoding_variant: u64) -> &mut Self {
        self.str(model)
            .varint(encoding_variant)
            .varint(60)
            .varint(1000)
            .varint(10)
    }
}

#[test]
fn format_1_built_by_hand_decodes() {
    let mut b = V1(vec![1]);
    b.varint(2) // two messages
        .varint(6)
        .str("user")
        .str("hello")
        .zigzag(1_000)
        .varint(4)
        .raw(&[0])
        .varint(7)
        .str("assistant")
        .str("hi!")
        .zigzag(2_000)
        .varint(5)
        .raw(&[1])
        .str(r#"{"a":1}"#)
        .raw(&[1])
        .str("before")
        .varint(3)
        .varint(5)
        .zigzag(900) // summary
        .settings("gpt-4", 1)
        .varint(1)
        .str("dify")
        .str("conv")
        .zigzag(-1) // external ids
        .varint(9)
        .varint(12)
        .zigzag(-7)
        .zigzag(3_000) // last_id, total, created, updated
        .raw(&[0]); // extra
    let s = decode_session(&b.0).unwrap();
    assert_eq!(s.messages.len(), 2);
    assert_eq!(
        s.messages.get(1).unwrap().to_message(),
        Message {
            id: 7,
            role: "assistant".into(),
            content: "hi!".into(),
            ts: 2_000,
            tokens: 5,
            meta: Some(r#"{"a":1}"#.into())
        }
    );
    assert_eq!(
        s.summary,
        Some(Box::new(Summary {
            text: "before".into(),
            tokens: 3,
            upto: 5,
            ts: 900
        }))
    );
    assert_eq!(
        s.settings,
        Settings {
            model: "gpt-4".into(),
            encoding: Encoding::Cl100kBase,
            ttl: 60,
            max_tokens: 1000,
            max_msgs: 10,
            max_age: 0
        }
    );
    assert_eq!(
        s.external["dify"],
        ExternalId {
            id: "conv".into(),
            expires_at: -1
        }
    );
    assert_eq!(
        (
            s.last_id,
            s.total_tokens,
            s.created,
            s.updated,
            s.extra.text()
        ),
        (9, 12, -7, 3_000, None)
    );

    // Each op variant, with a needlessly long varint postcard accepted.
    let mut b = V1(vec![1]);
    b.varint(0)
        .zigzag(5)
        .settings("m", 0)
        .raw(&[0x87, 0x00])
        .str("user")
        .str("")
        .zigzag(1)
        .varint(3)
        .raw(&[0]);
    let Op::Append {
        now: 5, message, ..
    } = decode_op(&b.0).unwrap()
    else {
        panic!("not an append")
    };
    assert_eq!((message.id, &*message.role), (7, "user"));
    let mut b = V1(vec![1]);
    b.varint(1)
        .zigzag(5)
        .str("sum")
        .varint(2)
        .varint(4)
        .zigzag(6);
    assert_eq!(
        decode_op(&b.0).unwrap(),
        Op::Summarize {
            now: 5,
            summary: Summary {
                text: "sum".into(),
                tokens: 2,
                upto: 4,
                ts: 6
            }
        }
    );
    let mut b = V1(vec![1]);
    b.varint(2)
        .zigzag(5)
        .settings("m", 1)
        .str("n8n")
        .str("x")
        .zigzag(99);
    assert!(matches!(decode_op(&b.0).unwrap(), Op::ExtSet { system, .. } if system == "n8n"));
    // Variant indexes beyond the 0.1 enums are refused.
    let mut b = V1(vec![1]);
    b.varint(3).zigzag(5);
    assert!(decode_op(&b.0).unwrap_err().contains("unknown op kind 3"));
    let mut b = V1(vec![1]);
    b.varint(0).zigzag(5).settings("m", 2);
    assert!(decode_op(&b.0).unwrap_err().contains("unknown encoding 2"));
}

#[test]
fn every_encoding_has_a_stored_code_that_round_trips() {
    for e in Encoding::ALL {
        let s = Session::new(settings(e), 0);
        assert_eq!(
            decode_session(&encode_session(&s))
                .unwrap()
                .settings
                .encoding,
            e,
            "{}",
            e.name()
        );
    }
}

/// A payload naming a msgid twice (held and departed, or departed twice)
/// is refused: no write stores a msgid the session already knows, and a
/// retry would match either copy.
#[test]
fn msgid_named_twice_is_corrupt() {
    let mut held_and_departed = sample();
    held_and_departed.msgids.departed[0].msgid = "c-4".into();
    let mut departed_twice = sample();
    departed_twice.msgids.departed.push_front(Departed {
        msgid: "c-2".into(),
        id: 1,
        tokens: 7,
    });
    for s in [held_and_departed, departed_twice] {
        let err = decode_session(&encode_session(&s)).unwrap_err();
        assert!(err.contains("named twice"), "{err}");
    }
    // A departed msgid whose id is a held message's: it would leave again.
    let mut departed_but_held = sample();
    departed_but_held.msgids.departed[0].id = 5;
    let err = decode_session(&encode_session(&departed_but_held)).unwrap_err();
    assert!(err.contains("still held"), "{err}");
    assert!(decode_session(&encode_session(&sample())).is_ok());
}

/// The kept buffer gives each session its own payload, whatever was written
/// into it before (a longer one, a nested call), and keeps no large buffer.
#[test]
fn payloads_written_into_the_kept_buffer_are_each_session_s_own() {
    let mut large = sample();
    large.settings.max_msgs = 1000;
    for id in 9..200 {
        let op = Op::Append {
            now: 1_700_000_001_000 + id as i64,
            settings: large.settings.clone(),
            message: message(id, "user", &"z".repeat(500), None),
            msgid: None,
        };
        large.apply(op).unwrap();
    }
    for s in [lived_in(), sample(), bare(), lived_in()] {
        let nested = with_encoded(&s, |outer| {
            assert_eq!(outer, &encode_session(&s)[..]);
            with_encoded(&large, |inner| inner.to_vec())
        });
        assert_eq!(nested, encode_session(&large));
        with_encoded(&s, |again| assert_eq!(again, &encode_session(&s)[..]));
    }
    with_encoded(&large, |_| ());
    assert_eq!(
        BUFFER.with(|b| b.take()).capacity(),
        0,
        "a 95 KB buffer kept"
    );
}
