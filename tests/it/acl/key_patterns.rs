//! ACL key patterns apply to every MEM.* command (the internal ones
//! included).

use crate::support::report::*;
use crate::support::server::*;
use crate::support::session::*;

#[test]
fn acl_key_patterns_apply_to_every_command() {
    let server = Server::start();
    let mut admin = server.client();
    ok(&mut admin, &["CONFIG", "SET", "rdbcompression", "no"]);
    ok(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "alice",
            "on",
            ">pw",
            "~mem:{alice}*",
            "+@all",
        ],
    );
    let bob_key = "mem:{bob}:s1";
    ok(&mut admin, &["MEM.APPEND", bob_key, "user", "bob's"]);
    ok(&mut admin, &["MEM.EXTSET", bob_key, "dify", "b"]);
    let bob_before = snap(&mut admin, bob_key);
    // Valid internal payloads: a session (from DUMP) and an op.
    ok(
        &mut admin,
        &["MEM.APPEND", "mem:{alice}:tmpl", "user", "template"],
    );
    let session_payload = module_payload(&dump(&mut admin, "mem:{alice}:tmpl"));
    let op_payload = op_append(
        1_700_000_000_000,
        &default_psettings(),
        &PMessage {
            id: 1000,
            role: b"user",
            content: b"via _APPLY",
            ts: 1_700_000_000_000,
            tokens: 7,
            meta: None,
        },
    );

    let mut alice = server.client();
    ok(&mut alice, &["AUTH", "alice", "pw"]);
    let doc = r#"{"conversation_history":[{"role":"user","content":"imported"}]}"#;
    let mut allowed = 0;
    let mut denied = 0;
    for (session, other) in [("mem:{alice}:s1", "mem:{alice}:s2")] {
        let steps: Vec<Vec<Vec<u8>>> = vec![
            vec![
                b"MEM.APPEND".to_vec(),
                session.into(),
                b"user".to_vec(),
                b"hi".to_vec(),
            ],
            vec![
                b"MEM.APPEND".to_vec(),
                session.into(),
                b"assistant".to_vec(),
                b"hello".to_vec(),
            ],
            vec![b"MEM.GET".to_vec(), session.into()],
            vec![b"MEM.INFO".to_vec(), session.into()],
            vec![
                b"MEM.SUMMARIZE_CHECK".to_vec(),
                session.into(),
                b"KEEP".to_vec(),
                b"1".to_vec(),
            ],
            vec![
                b"MEM.SUMMARIZE".to_vec(),
                session.into(),
                b"1".to_vec(),
                b"sum".to_vec(),
            ],
            vec![
                b"MEM.EXTSET".to_vec(),
                session.into(),
                b"dify".to_vec(),
                b"c".to_vec(),
            ],
            vec![b"MEM.EXTGET".to_vec(), session.into(), b"dify".to_vec()],
            vec![b"MEM.IMPORT".to_vec(), other.into(), doc.into()],
            vec![b"MEM._APPLY".to_vec(), session.into(), op_payload.clone()],
            vec![b"MEM._PUT".to_vec(), other.into(), session_payload.clone()],
        ];
        for step in &steps {
            let refs: Vec<&[u8]> = step.iter().map(Vec::as_slice).collect();
            match cmd_bin(&mut alice, &refs) {
                // Internal commands pass the ACL, then refuse any client.
                Err(e) if step[0].starts_with(b"MEM._") => {
                    assert!(
                        e.to_string().contains("is internal"),
                        "alice: {}: {e}",
                        printable(step)
                    )
                }
                r => drop(r.unwrap_or_else(|e| panic!("alice: {}: {e}", printable(step)))),
            }
            allowed += 1;
            // The same command on bob's session is refused.
            let mut on_bob = step.clone();
            on_bob[1] = bob_key.as_bytes().to_vec();
            let refs: Vec<&[u8]> = on_bob.iter().map(Vec::as_slice).collect();
            let e = cmd_bin(&mut alice, &refs)
                .expect_err(&format!("alice ran {} on bob's key", printable(&on_bob)));
            assert!(
                e.code() == Some("NOPERM") || e.to_string().contains("NOPERM"),
                "{}: {e}",
                printable(&on_bob)
            );
            denied += 1;
        }
    }
    assert_same(
        &bob_before,
        &snap(&mut admin, bob_key),
        "bob's session after alice's refused commands",
        1000,
    );
    check_consistent(&mut admin, "mem:{alice}:s1");
    println!("hostile/acl: {allowed} commands allowed on mem:{{alice}}, {denied} refused NOPERM on mem:{{bob}}");
}
