//! Attack: META that MEM.APPEND / MEM.APPENDBATCH accept must come back
//! unchanged through `MEM.GET FORMAT JSON` -> `MEM.IMPORT` (SPEC 5 v2:
//! "Every value a reply or the storage carries round-trips"; META that
//! FORMAT JSON could not give back to MEM.IMPORT is refused). Today META is
//! stored verbatim, FORMAT JSON embeds it verbatim, but MEM.IMPORT parses
//! it into a serde_json::Value and re-serializes it: integers beyond 64 bits
//! become floats (digits lost), duplicate members collapse.

use crate::support::faults::*;
use crate::support::server::*;
use crate::support::session;

#[test]
fn accepted_meta_round_trips_through_format_json_and_import() {
    let server = Server::start();
    let mut con = conn(server.port, 0);
    let metas = [
        r#"{"n":12345678901234567890123}"#,
        r#"{"n":18446744073709551616}"#,
        r#"{"n":-9223372036854775809}"#,
        r#"{"a":{},"a":2}"#,
    ];
    let mut broken = Vec::new();
    for (i, meta) in metas.iter().enumerate() {
        let key = format!("m{i}");
        if q(&mut con, &["MEM.APPEND", &key, "user", "x", "META", meta]).is_err() {
            continue;
        }
        let stored: String = {
            let v = qok(&mut con, &["MEM.GET", &key]);
            let fields = match v {
                redis::Value::Array(items) => as_fields(items[0].clone()),
                other => panic!("{other:?}"),
            };
            str_field(&fields, "meta")
        };
        let doc = session::json_text(&mut con, &key);
        let copy = format!("{key}:copy");
        qok(&mut con, &["MEM.IMPORT", &copy, &doc]);
        let back: String = {
            let v = qok(&mut con, &["MEM.GET", &copy]);
            let fields = match v {
                redis::Value::Array(items) => as_fields(items[0].clone()),
                other => panic!("{other:?}"),
            };
            str_field(&fields, "meta")
        };
        if back != stored {
            broken.push(format!("{stored} came back from MEM.IMPORT as {back}"));
        }
    }
    assert!(
        broken.is_empty(),
        "META accepted but not round-tripped:\n{}",
        broken.join("\n")
    );
}

/// SPEC 3 MEM.IMPORT: "Other top-level members (`user_profile`, `context`,
/// ...) are kept verbatim and returned at the top level of FORMAT JSON, so
/// nothing of the old document is lost." Today they go through
/// serde_json::Value: a 23-digit integer comes back as a float, a duplicated
/// member loses a value.
#[test]
fn imported_members_are_kept_verbatim() {
    let server = Server::start();
    let mut con = conn(server.port, 0);
    let profile = r#"{"n":12345678901234567890123,"a":1,"a":2}"#;
    let doc = format!(
        r#"{{"conversation_history":[{{"role":"user","content":"x"}}],"user_profile":{profile}}}"#
    );
    if q(&mut con, &["MEM.IMPORT", "imp", &doc]).is_err() {
        return;
    }
    let json = session::json_text(&mut con, "imp");
    assert!(
        json.contains(&format!(r#""user_profile":{profile}"#)),
        "user_profile was not kept verbatim: sent {profile}, FORMAT JSON gave {json}"
    );
}
