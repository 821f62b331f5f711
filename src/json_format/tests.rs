use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::*;
use crate::session::{Message, Settings, MAX_ID};
use crate::tokenizer::{encoding_for_model, Counting, Encoding};

/// A stand-in tokenizer that tells the encodings apart.
fn count(c: Counting, role: &str, content: &str, _: Option<&str>) -> u64 {
    let per = if c.encoding == Encoding::Cl100kBase {
        2
    } else {
        1
    };
    3 + role.len() as u64 + per * content.len() as u64
}

fn settings_for(caps: (u64, u64), model: Option<&str>) -> Settings {
    let mut s = crate::session::tests::settings();
    (s.max_msgs, s.max_tokens) = caps;
    if let Some(m) = model {
        s.model = m.into();
        s.encoding = encoding_for_model(m, Encoding::O200kBase);
    }
    s
}

const ROOMY: (u64, u64) = (1_000_000, 1 << 40);

fn limits(message_bytes: u64) -> Limits {
    Limits {
        message_bytes,
        given_tokens: 10_000_000,
    }
}

fn import_with(text: &str, caps: (u64, u64)) -> Result<Imported, ImportError<()>> {
    import(
        text,
        9,
        limits(1 << 30),
        |d| Ok(settings_for(caps, d.model)),
        count,
    )
}

fn parse(text: &str) -> Result<Imported, String> {
    import_with(text, ROOMY).map_err(|e| match e {
        ImportError::Invalid(e) => e,
        other => format!("{other:?}"),
    })
}

#[test]
fn iso8601_round_trips_and_accepts_zoneless_times() {
    assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(parse_iso8601("1970-01-01T00:00:01.500Z"), Some(1500));
    assert_eq!(parse_iso8601("1970-01-01T01:00:00+01:00"), Some(0));
    assert_eq!(
        parse_iso8601("2024-05-01T10:00:00.123456"),
        Some(1714557600123)
    );
    assert_eq!(parse_iso8601("2024-05-01 10:00:00"), Some(1714557600000));
    assert_eq!(parse_iso8601("yesterday"), None);
}

#[test]
fn numeric_timestamps_are_unix_seconds_or_milliseconds() {
    let ts = |t: &str| {
        let doc = format!(
            r#"{{"conversation_history":[{{"role":"user","content":"x","timestamp":{t}}}]}}"#
        );
        parse(&doc).map(|i| i.session.messages.get(0).unwrap().ts)
    };
    // The seed's numeric timestamps: seconds, as an integer or time.time().
    assert_eq!(ts("1714557600"), Ok(1714557600000));
    assert_eq!(ts("1714557600.25"), Ok(1714557600250));
    assert_eq!(ts("1714557600123"), Ok(1714557600123));
    assert_eq!(ts("0"), Ok(0));
    assert!(ts("-1").is_err());
    assert!(ts("253402300800000").is_err(), "past 9999-12-31");
    assert!(ts("1e300").is_err());
}

#[test]
fn client_side_shape_keeps_other_members() {
    let s = parse(
        r#"{"conversation_history":[{"role":"user","content":"hi","timestamp":"2024-05-01T10:00:00"}],
            "user_profile":{"name":"Ann"},"context":{"topic":"x"}}"#,
    )
    .unwrap()
    .session;
    assert_eq!(s.messages.len(), 1);
    assert_eq!(s.messages.get(0).unwrap().ts, 1714557600000);
    let extra: Value = serde_json::from_str(s.extra.text().as_deref().unwrap()).unwrap();
    assert_eq!(extra["user_profile"]["name"], "Ann");
    assert_eq!(extra["context"]["topic"], "x");
}

/// Documents refused, each with what the parse-all import said of it (the
/// streaming import reports the same).
const BAD: &[&str] = &[
    "",
    "not json",
    "[]",
    "{}",
    "null",
    r#"{"conversation_history":{}}"#,
    r#"{"conversation_history":"x"}"#,
    r#"{"conversation_history":[1]}"#,
    r#"{"conversation_history":[[1,[2]]]}"#,
    r#"{"conversation_history":[{"content":"no role"}]}"#,
    r#"{"conversation_history":[{"role":"","content":"x"}]}"#,
    r#"{"conversation_history":[{"role":"user"}]}"#,
    r#"{"conversation_history":[{"role":"user","content":5}]}"#,
    r#"{"conversation_history":[{"role":"user","content":"x","meta":[1]}]}"#,
    r#"{"conversation_history":[{"role":"user","content":"x","meta":"{}"}]}"#,
    r#"{"conversation_history":[{"role":"user","content":"x","timestamp":"soon"}]}"#,
    r#"{"conversation_history":[{"role":"user","content":"x","timestamp":true}]}"#,
    r#"{"conversation_history":[{"role":"user","content":"x","timestamp":-1.5}]}"#,
    r#"{"conversation_history":[{"role":"user","content":"x","ts":"1"}]}"#,
    r#"{"conversation_history":[{"role":"user","content":"x","ts":-1}]}"#,
    r#"{"conversation_history":[],"summary":{"content":"s"}}"#,
    r#"{"conversation_history":[],"summary":{"content":null,"text":"s","upto":1}}"#,
    r#"{"conversation_history":[],"summary":"text"}"#,
    r#"{"conversation_history":[],"model":""}"#,
    r#"{"conversation_history":[],"model":5}"#,
    r#"{"conversation_history":[{"id":2,"role":"user","content":"a"},{"id":1,"role":"user","content":"b"}]}"#,
    r#"{"conversation_history":[{"id":1,"role":"user","content":"a"},{"role":"user","content":"b"}]}"#,
    r#"{"conversation_history":[{"id":-1,"role":"user","content":"a"}]}"#,
    r#"{"conversation_history":[{"id":1.0,"role":"user","content":"a"}]}"#,
    r#"{"conversation_history":[{"role":"user","content":"a"}]} trailing"#,
    r#"{"conversation_history":[{"role":"user","content":"a\ud800"}]}"#,
    "{\"conversation_history\":[\n{\"role\":\"user\",\n\"content\":\"a\\udc00\"}]}",
    r#"{"conversation_history":[],"summary":{"content":"\ud800","upto":1}}"#,
    r#"{"conversation_history":[{"id":1,"role":"user","content":"x"}],"summary":{"content":"s","upto":1}}"#,
];

/// Refused before by the whole document's parse, now by the check of what
/// is kept raw (META, the other members), which names the part.
const BAD_IN_KEPT_JSON: &[(&str, &str)] = &[
    (
        r#"{"conversation_history":[],"p":{"\udfff":1}}"#,
        "imported members is not valid JSON: lone leading surrogate",
    ),
    (
        r#"{"conversation_history":[],"p":1e400}"#,
        "imported members is not valid JSON: number out of range",
    ),
    (
        r#"{"conversation_history":[{"role":"user","content":"x","meta":{"n":1e400}}]}"#,
        "conversation_history[0]: META is not valid JSON: number out of range",
    ),
];

#[test]
fn shape_errors_are_reported_as_before() {
    for (bad, says) in BAD_IN_KEPT_JSON {
        let e = parse(bad).unwrap_err();
        assert!(e.starts_with(says), "{bad}: {e}");
        assert!(reference::import(bad, 9, 1 << 30, |m| settings_for(ROOMY, m), count).is_err());
    }
    let mut changed = Vec::new();
    for bad in BAD {
        let new = parse(bad).expect_err(bad);
        let old =
            reference::import(bad, 9, 1 << 30, |m| settings_for(ROOMY, m), count).expect_err(bad);
        if new != old {
            changed.push(format!("{bad}\n  old: {old}\n  new: {new}"));
        }
    }
    assert!(changed.is_empty(), "{}", changed.join("\n"));
}

#[test]
fn ids_must_be_all_or_none_and_increasing() {
    let mixed = r#"{"conversation_history":[{"id":1,"role":"user","content":"a"},{"role":"user","content":"b"}]}"#;
    assert_eq!(
        parse(mixed).unwrap_err(),
        "either every message carries an id or none does"
    );
    let down = r#"{"conversation_history":[{"id":5,"role":"user","content":"a"},{"id":4,"role":"user","content":"b"}]}"#;
    assert!(parse(down).unwrap_err().contains("not above"));
    let ok = import_with(r#"{"conversation_history":[{"role":"user","content":"ab"}],"summary":{"content":"s","upto":7}}"#, (5, 1000))
        .unwrap()
        .session;
    assert_eq!(ok.messages.get(0).unwrap().id, 8);
    assert_eq!(ok.last_id, 8);
    assert_eq!(
        ok.total_tokens,
        count(Counting::new("", Encoding::O200kBase), "user", "ab", None)
            + count(Counting::new("", Encoding::O200kBase), "system", "s", None)
    );
    assert!(ok.validate().is_ok());
}

#[test]
fn render_puts_extra_members_at_the_top_level() {
    let mut s = Session::new(crate::session::tests::settings(), 0);
    s.extra = crate::session::Attrs::from_text(Some(r#"{"user_profile":{"a":1}}"#)).unwrap();
    let out: Value =
        serde_json::from_slice(&render(Some(&s), None, std::iter::empty(), "m", 0)).unwrap();
    assert_eq!(out["user_profile"]["a"], 1);
    assert_eq!(out["summary"], Value::Null);
    assert_eq!(out["conversation_history"], Value::Array(vec![]));
}

/// An object nested `depth` deep (`{}` is 1).
fn nested(depth: usize) -> String {
    format!(
        "{}{{}}{}",
        r#"{"a":"#.repeat(depth - 1),
        "}".repeat(depth - 1)
    )
}

fn session_with_meta(meta: &str) -> Session {
    let mut s = Session::new(crate::session::tests::settings(), 0);
    let message = Message {
        id: 1,
        role: "user".into(),
        content: "x".into(),
        ts: 0,
        tokens: 5,
        meta: Some(meta.into()),
    };
    s.push_message(message).unwrap();
    s
}

fn rendered(s: &Session) -> String {
    String::from_utf8(render(Some(s), None, s.messages.iter(), "m", 0)).unwrap()
}

#[test]
fn meta_at_the_deepest_allowed_level_comes_back_through_import() {
    let deepest = nested(crate::session::MAX_META_DEPTH);
    assert!(crate::session::check_meta(&deepest).is_ok());
    let doc = rendered(&session_with_meta(&deepest));
    let back = parse(&doc).expect("FORMAT JSON with META at the deepest level imports");
    assert_eq!(
        back.session.messages.get(0).unwrap().meta,
        Some(deepest.as_str())
    );
    // One level more is refused at append time, and rightly: the document
    // it would render is beyond serde_json's limit (the parse-all import
    // hit that limit; the streaming one checks META's own depth).
    let deeper = nested(crate::session::MAX_META_DEPTH + 1);
    let e = crate::session::check_meta(&deeper).unwrap_err();
    assert!(e.contains("nested deeper"), "{e}");
    let e = parse(&rendered(&session_with_meta(&deeper))).unwrap_err();
    assert!(e.contains("nested deeper"), "{e}");
    // Far deeper: refused without recursing (serde_json's own limit).
    assert!(crate::session::check_meta(&nested(100_000))
        .unwrap_err()
        .contains("nested deeper"));
    let doc = format!(
        r#"{{"conversation_history":[{{"role":"user","content":"x","meta":{}}}]}}"#,
        nested(100_000)
    );
    assert!(parse(&doc).unwrap_err().contains("nested deeper"));
}

#[test]
fn imported_members_at_the_deepest_allowed_level_come_back() {
    let depth = crate::session::MAX_MEMBERS_DEPTH;
    // The members' object is the document's top level: a member value one
    // level below it.
    let members = format!(r#"{{"ctx":{}}}"#, nested(depth - 1));
    assert!(crate::session::check_members(&members).is_ok());
    let mut s = Session::new(crate::session::tests::settings(), 0);
    s.extra = crate::session::Attrs::from_text(Some(&members.clone())).unwrap();
    let back = parse(&rendered(&s)).expect("members at the deepest level import");
    assert_eq!(back.session.extra.text().as_deref(), Some(members.as_str()));
    let deeper = format!(r#"{{"ctx":{}}}"#, nested(depth));
    assert!(crate::session::check_members(&deeper).is_err());
    let mut s = Session::new(crate::session::tests::settings(), 0);
    s.extra = crate::session::Attrs::from_text(Some(&deeper)).unwrap();
    assert!(parse(&rendered(&s)).unwrap_err().contains("nested deeper"));
}

#[test]
fn meta_that_would_not_round_trip_is_refused() {
    for bad in [
        r#"{"a":"\ud800"}"#,
        r#"{"\udfff":1}"#,
        r#"{"n":1e400}"#,
        r#"{"n":-1e400}"#,
        r#"{"a":1} x"#,
        "[]",
        "1",
    ] {
        assert!(crate::session::check_meta(bad).is_err(), "{bad}");
        let doc =
            format!(r#"{{"conversation_history":[{{"role":"user","content":"x","meta":{bad}}}]}}"#);
        assert!(parse(&doc).is_err(), "{doc}");
    }
    for good in [
        r#"{"a":"\ud83d\ude80","n":1e308,"m":-0,"big":123456789012345678901234567890}"#,
        "{}",
    ] {
        assert!(crate::session::check_meta(good).is_ok(), "{good}");
        let doc = rendered(&session_with_meta(good));
        assert!(parse(&doc).is_ok(), "{doc}");
    }
    assert!(parse(r#"{"conversation_history":[],"profile":{"n":1e400}}"#).is_err());
}

#[test]
fn ids_and_upto_are_bounded_by_max_id() {
    let doc = |id: u64| {
        format!(r#"{{"conversation_history":[{{"id":{id},"role":"user","content":"x"}}]}}"#)
    };
    assert_eq!(
        parse(&doc(MAX_ID))
            .unwrap()
            .session
            .messages
            .get(0)
            .unwrap()
            .id,
        MAX_ID
    );
    for id in [MAX_ID + 1, i64::MAX as u64, u64::MAX] {
        let e = parse(&doc(id)).unwrap_err();
        assert!(e.contains("9007199254740991"), "{e}");
    }
    let upto =
        |u: u64| format!(r#"{{"conversation_history":[],"summary":{{"content":"s","upto":{u}}}}}"#);
    assert!(parse(&upto(MAX_ID)).is_ok());
    assert!(parse(&upto(MAX_ID + 1)).is_err());
    // A summary up to MAX_ID leaves no id for a message without one.
    let full = r#"{"conversation_history":[{"role":"user","content":"x"}],"summary":{"content":"s","upto":9007199254740991}}"#;
    assert!(parse(full).unwrap_err().contains("every message id"));
}

#[test]
fn content_above_the_limit_and_a_refused_model_are_their_own_errors() {
    let doc = r#"{"conversation_history":[{"role":"user","content":"12345"},{"role":"user","content":"123456"}]}"#;
    let r = import(
        doc,
        0,
        limits(5),
        |d| Ok::<_, ()>(settings_for(ROOMY, d.model)),
        count,
    );
    assert_eq!(r.unwrap_err(), ImportError::TooLarge(6));
    let doc = r#"{"conversation_history":[],"model":"m"}"#;
    let r = import(
        doc,
        0,
        limits(5),
        |d| {
            if d.model == Some("m") {
                Err("refused")
            } else {
                Ok(settings_for(ROOMY, d.model))
            }
        },
        count,
    );
    assert_eq!(r.unwrap_err(), ImportError::Settings("refused"));
}

#[test]
fn meta_and_members_are_kept_verbatim() {
    let meta = r#"{"n":18446744073709551616,"a":{},"a":2, "s" : "\u00e9"}"#;
    let profile = r#"{"n":12345678901234567890123,"a":1,"a":2}"#;
    let doc = format!(
        r#"{{"p":1, "user_profile" : {profile},"conversation_history":[{{"role":"user","content":"x","meta":{meta}}}],"p":[ 2 ],"total_tokens":5,"n":-9223372036854775809}}"#
    );
    let s = parse(&doc).unwrap().session;
    assert_eq!(s.messages.get(0).unwrap().meta, Some(meta));
    let extra = format!(r#"{{"p":1,"user_profile":{profile},"p":[ 2 ],"n":-9223372036854775809}}"#);
    assert_eq!(
        s.extra.text().as_deref(),
        Some(extra.as_str()),
        "in order, duplicates kept, known members left out"
    );
    let out = rendered(&s);
    assert!(out.contains(&format!(r#""meta":{meta}"#)), "{out}");
    assert!(out.ends_with(r#","p":1,"user_profile":{"n":12345678901234567890123,"a":1,"a":2},"p":[ 2 ],"n":-9223372036854775809}"#), "{out}");
    // And again through FORMAT JSON -> import: unchanged.
    let again = parse(&out).unwrap().session;
    assert_eq!(again.extra, s.extra);
    assert_eq!(
        again.messages.get(0).unwrap().meta,
        s.messages.get(0).unwrap().meta
    );
}

#[test]
fn ids_and_counts_do_not_depend_on_member_order() {
    let history = r#""conversation_history":[{"role":"user","content":"hello"},{"role":"assistant","content":"hi"}]"#;
    let summary = r#""summary":{"content":"earlier","upto":41}"#;
    let model = r#""model":"gpt-4""#;
    let orders = [
        format!("{{{history},{summary},{model}}}"),
        format!("{{{summary},{model},{history}}}"),
        format!("{{{model},{history},{summary}}}"),
    ];
    let sessions: Vec<Session> = orders.iter().map(|d| parse(d).unwrap().session).collect();
    assert_eq!(
        sessions[0]
            .messages
            .iter()
            .map(|m| m.id)
            .collect::<Vec<_>>(),
        [42, 43]
    );
    assert_eq!(sessions[0].settings.encoding, Encoding::Cl100kBase);
    assert_eq!(
        sessions[0].messages.get(0).unwrap().tokens,
        count(
            Counting::new("", Encoding::Cl100kBase),
            "user",
            "hello",
            None
        )
    );
    assert!(sessions.iter().all(|s| *s == sessions[0]), "{sessions:#?}");
}

#[test]
fn a_long_history_is_trimmed_as_it_streams() {
    let n = 200_000u64;
    let mut doc = String::from(r#"{"conversation_history":["#);
    for i in 0..n {
        doc.push_str(if i == 0 { "" } else { "," });
        doc.push_str(r#"{"role":"u","content":"hi"}"#);
    }
    doc.push_str("]}");
    let caps = (30, 1 << 40);
    let r = import_with(&doc, caps).unwrap();
    assert_eq!(r.session.messages.len(), 30);
    assert_eq!(r.trimmed, n - 30);
    assert!(r.most_held <= 31, "held {} messages at once", r.most_held);
    assert_eq!(r.session.messages.front().map(|m| m.id), Some(n - 29));
    assert_eq!(r.session.last_id, n);
    // By tokens: as many as fit 100 tokens.
    let fit = (100 / count(Counting::new("", Encoding::O200kBase), "u", "hi", None)) as usize;
    let r = import_with(&doc, (1_000_000, 100)).unwrap();
    assert_eq!(r.session.messages.len(), fit);
    assert!(
        r.most_held <= fit + 1,
        "held {} messages at once",
        r.most_held
    );
    assert!(r.session.validate().is_ok());
}

/// A random document: some messages (tool results included), maybe with
/// ids, a summary, a model, other members; now and then a broken one.
fn random_doc(rng: &mut StdRng) -> String {
    let roles = ["user", "assistant", "tool", "system"];
    let mut members = Vec::new();
    let upto = rng.gen_range(1..20u64);
    if rng.gen_bool(0.4) {
        let text = "s".repeat(rng.gen_range(0..40));
        members.push(format!(r#""summary":{{"content":"{text}","upto":{upto}}}"#));
    }
    if rng.gen_bool(0.3) {
        members.push(format!(
            r#""model":"{}""#,
            ["gpt-4", "gpt-4o", "claude"][rng.gen_range(0..3)]
        ));
    }
    if rng.gen_bool(0.3) {
        members.push(format!(r#""profile":{{"k":{}}}"#, rng.gen::<u16>()));
    }
    let with_ids = rng.gen_bool(0.3);
    let mut id = upto + 1;
    let messages: Vec<String> = (0..rng.gen_range(0..25))
        .map(|_| {
            let role = roles[rng.gen_range(0..roles.len())];
            let content = "c".repeat(rng.gen_range(0..30));
            let id_member = match with_ids {
                true => {
                    id += rng.gen_range(0..3);
                    id += 1;
                    format!(r#""id":{id},"#)
                }
                false => String::new(),
            };
            let ts = match rng.gen_range(0..3) {
                0 => String::new(),
                1 => format!(r#","ts":{}"#, rng.gen_range(0..2_000_000_000_000i64)),
                _ => r#","timestamp":"2024-05-01T10:00:00Z""#.to_owned(),
            };
            let meta = if rng.gen_bool(0.2) {
                r#","meta":{"x":[1,2]}"#
            } else {
                ""
            };
            match rng.gen_range(0..60) {
                0 => r#"{"role":"","content":"x"}"#.to_owned(),
                1 => "7".to_owned(),
                _ => format!(r#"{{{id_member}"role":"{role}","content":"{content}"{ts}{meta}}}"#),
            }
        })
        .collect();
    members.push(format!(
        r#""conversation_history":[{}]"#,
        messages.join(",")
    ));
    let at = rng.gen_range(0..members.len());
    let last = members.len() - 1;
    members.swap(at, last);
    format!("{{{}}}", members.join(","))
}

/// The most messages of one tool group (a message and the tool results
/// right after it) in `doc`'s history.
fn longest_group(doc: &str) -> u64 {
    let v: Value = serde_json::from_str(doc).unwrap_or(Value::Null);
    let roles = v["conversation_history"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let (mut longest, mut run) = (0, 0);
    for m in &roles {
        run = if m["role"] == "tool" && run > 0 {
            run + 1
        } else {
            1
        };
        longest = longest.max(run);
    }
    longest
}

/// The streaming import gives exactly what parse-everything-then-trim gave
/// (session, messages trimmed), or refuses what it refused.
#[test]
fn streaming_equals_parse_all_then_trim_on_random_documents() {
    let mut rng = StdRng::seed_from_u64(0x1e5);
    let (mut compared, mut refused) = (0, 0);
    for _ in 0..5_000 {
        let doc = random_doc(&mut rng);
        let caps = (rng.gen_range(1..12), rng.gen_range(1..250));
        let old = reference::import(&doc, 9, 1 << 30, |m| settings_for(caps, m), count);
        let new = import_with(&doc, caps);
        match (old, new) {
            (Ok((session, trimmed)), Ok(new)) => {
                assert_eq!(new.session, session, "{doc} caps {caps:?}");
                assert_eq!(new.trimmed, trimmed, "{doc} caps {caps:?}");
                // The caps, plus the tool group still open (its age is known
                // once it is complete).
                assert!(
                    new.most_held as u64 <= caps.0 + longest_group(&doc),
                    "{doc}"
                );
                compared += 1;
            }
            (Err(_), Err(_)) => refused += 1,
            (old, new) => panic!("{doc} caps {caps:?}: parse-all {old:?}, streaming {new:?}"),
        }
    }
    assert!(
        compared > 3_000 && refused > 300,
        "{compared} compared, {refused} refused"
    );
}

/// FORMAT JSON writes each message's `tokens`; importing that document
/// under its own model keeps them (a count given with TOKENS survives the
/// round trip), while another model, or a document without the
/// `redis_mem` member (another tool's), counts anew.
#[test]
fn format_json_tokens_stand_under_the_documents_own_model() {
    let doc = |model: &str, member: &str| {
        format!(
            r#"{{"model":"{model}","conversation_history":[{{"role":"assistant","content":"hello","tokens":412}}]{member}}}"#
        )
    };
    let tokens = |text: &str, caps_model: Option<&str>| {
        let imported = import(
            text,
            9,
            limits(1 << 30),
            |d| Ok::<_, ()>(settings_for(ROOMY, caps_model.or(d.model))),
            count,
        )
        .unwrap();
        imported.session.messages.get(0).unwrap().tokens
    };
    let ours = r#","redis_mem":{"ttl":86400}"#;
    assert_eq!(tokens(&doc("gpt-4o", ours), None), 412);
    // counted anew: 3 + "assistant" + "hello" under the stand-in tokenizer
    assert_eq!(tokens(&doc("gpt-4o", ""), None), 3 + 9 + 5);
    assert_eq!(tokens(&doc("gpt-4o", ours), Some("gpt-4")), 3 + 9 + 2 * 5);
    let bad = doc("gpt-4o", ours).replace("412", "-1");
    assert!(parse(&bad)
        .unwrap_err()
        .contains("tokens must be an integer"));
}

#[test]
fn a_member_read_or_moved_into_meta_given_twice_is_refused() {
    // The last standing silently dropped the first: a whole history, or a
    // message's content or tool_calls (MEM.APPENDBATCH refuses these too).
    for (doc, says) in [
        (
            r#"{"conversation_history":[{"role":"user","content":"a"}],"conversation_history":[]}"#,
            "not valid JSON: duplicate field `conversation_history` at line 1 column ",
        ),
        (
            r#"{"conversation_history":[],"summary":null,"summary":{"content":"s","upto":1}}"#,
            "not valid JSON: duplicate field `summary`",
        ),
        (
            r#"{"conversation_history":[],"model":"gpt-4","model":"gpt-4o"}"#,
            "not valid JSON: duplicate field `model`",
        ),
        (
            r#"{"conversation_history":[],"redis_mem":null,"redis_mem":{}}"#,
            "not valid JSON: duplicate field `redis_mem`",
        ),
        (
            r#"{"conversation_history":[{"role":"user","content":"a","content":"b"}]}"#,
            "not valid JSON: duplicate field `content` at line 1 column ",
        ),
        (
            r#"{"conversation_history":[],"summary":{"content":"s","upto":1,"upto":2}}"#,
            "not valid JSON: duplicate field `upto`",
        ),
        (
            r#"{"conversation_history":[{"role":"user","content":"a"},{"role":"assistant","content":"","tool_calls":[1],"tool_calls":null}]}"#,
            "conversation_history[1]: member \"tool_calls\" is given twice",
        ),
    ] {
        let e = parse(doc).unwrap_err();
        assert!(e.starts_with(says), "{doc}: {e}");
    }
    // Attributes are kept as written, a repeated name included.
    let s = parse(r#"{"conversation_history":[],"a":1,"a":2}"#)
        .unwrap()
        .session;
    assert_eq!(s.attr_count(), 2);
}

/// A tool result first is kept only as a summarized session held it:
/// the module's own member alone does not keep an orphan (hostile pass 33 F1).
#[test]
fn an_orphan_tool_result_first_goes_unless_a_summary_covered_its_call() {
    let history = r#""conversation_history":[{"id":2,"role":"tool","content":"r","ts":1700000000000},{"id":3,"role":"user","content":"q","ts":1700000000000}]"#;
    for (doc, kept) in [
        (format!(r#"{{{history},"redis_mem":{{"ttl":0}}}}"#), false),
        (format!(r#"{{{history}}}"#), false),
        (
            format!(r#"{{{history},"redis_mem":{{"ttl":0,"summaries_dropped":1}}}}"#),
            true,
        ),
        (
            format!(r#"{{"summary":{{"text":"s","upto":1}},{history},"redis_mem":{{"ttl":0}}}}"#),
            true,
        ),
    ] {
        let imported = parse(&doc).unwrap();
        let first = imported.session.messages.front().unwrap();
        assert_eq!(first.role == "tool", kept, "{doc}");
        assert_eq!(imported.trimmed, u64::from(!kept), "{doc}");
    }
}

/// OpenAI's shape of a turn that only calls tools, `"content": null` with
/// `tool_calls` (a member, moved into META, or in META), imports with
/// content ""; null content on any other message is refused as before.
#[test]
fn null_content_is_empty_only_on_a_turn_that_calls_tools() {
    let call = r#"[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]"#;
    for doc in [
        format!(
            r#"{{"conversation_history":[{{"role":"user","content":"go"}},{{"role":"assistant","content":null,"tool_calls":{call}}}]}}"#
        ),
        format!(
            r#"{{"conversation_history":[{{"role":"user","content":"go"}},{{"role":"assistant","content":null,"meta":{{"tool_calls":{call}}}}}]}}"#
        ),
    ] {
        let s = parse(&doc).unwrap().session;
        let m = s.messages.get(1).unwrap();
        assert_eq!((m.role, m.content), ("assistant", ""), "{doc}");
        assert_eq!(
            m.meta,
            Some(&*format!(r#"{{"tool_calls":{call}}}"#)),
            "{doc}"
        );
    }
    for doc in [
        r#"{"conversation_history":[{"role":"user","content":null}]}"#,
        r#"{"conversation_history":[{"role":"assistant","content":null,"tool_calls":null}]}"#,
        r#"{"conversation_history":[{"role":"assistant","content":null,"tool_calls":[]}]}"#,
        r#"{"conversation_history":[{"role":"assistant","content":null,"tool_calls":{"id":1}}]}"#,
        r#"{"conversation_history":[{"role":"assistant","content":null,"meta":{"tool_calls":"x"}}]}"#,
        r#"{"conversation_history":[{"role":"assistant","content":null,"tool_calls":[null]}]}"#,
        r#"{"conversation_history":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1"},0]}]}"#,
        r#"{"conversation_history":[{"role":"assistant","content":null,"meta":{"tool_calls":[[]]}}]}"#,
        r#"{"conversation_history":[{"role":"assistant","content":null,"meta":{"x":1}}]}"#,
        r#"{"conversation_history":[{"role":"assistant"}]}"#,
    ] {
        let e = parse(doc).unwrap_err();
        assert!(e.contains("content must be a string"), "{doc}: {e}");
    }
}
