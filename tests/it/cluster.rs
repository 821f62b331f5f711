//! Redis Cluster: a real 3 masters + 3 replicas cluster of module-loaded
//! servers. Every MEM.* command through a cluster-aware client and through
//! `redis-cli -c`; a hand-driven reshard (IMPORTING/MIGRATING, MIGRATE ...
//! KEYS, SETSLOT NODE) while a thread keeps appending; a manual failover.
//!
//! Everything waits with a deadline; nothing asserts on timing.

use crate::support::cluster::*;
use crate::support::server::*;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::Value;
use serde_json::Value as Json;

// ---------------------------------------------------------------- helpers

/// `redis-cli -c -p port args...`, bounded in time; returns stdout lines
/// (without redirect notices).
fn redis_cli(port: u16, args: &[&str]) -> Vec<String> {
    let mut child = Command::new(redis_cli_bin())
        .arg("-c")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redis-cli");
    let pid = child.id();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let out = match rx.recv_timeout(Duration::from_secs(15)) {
        Ok(s) => s,
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            let _ = child.wait();
            panic!("redis-cli {args:?} did not finish in 15s");
        }
    };
    let status = child.wait().expect("wait redis-cli");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(
        status.success(),
        "redis-cli {args:?}: {status}; stderr: {err}; stdout: {out}"
    );
    out.lines()
        .filter(|l| !l.starts_with("-> Redirected"))
        .map(str::to_owned)
        .collect()
}

/// The value after `name` in redis-cli's raw output of a flat map.
fn cli_field(lines: &[String], name: &str) -> String {
    let i = lines
        .iter()
        .position(|l| l == name)
        .unwrap_or_else(|| panic!("no {name} in redis-cli output {lines:?}"));
    lines[i + 1].clone()
}

// ---------------------------------------------------------------- the test

#[test]
fn cluster_commands_reshard_failover() {
    let started = Instant::now();
    let cluster = Cluster::start(6);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&cluster)));
    if let Err(e) = result {
        cluster.dump_logs();
        std::panic::resume_unwind(e);
    }
    for (i, s) in cluster.nodes.iter().enumerate() {
        assert!(
            !s.log().contains("=== REDIS BUG REPORT"),
            "node {i} crashed:\n{}",
            s.log()
        );
    }
    println!(
        "cluster test done in {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

fn run(cluster: &Cluster) {
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "3 masters");
    let client = cluster.client();
    let mut cc = client.get_connection().expect("cluster connection");
    let mut n0 = cluster.con(0);

    // ------------------------------------------------ every command, many tags
    let sessions: Vec<String> = (0..90).map(|i| format!("mem:{{user-{i}}}")).collect();
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    for (i, key) in sessions.iter().enumerate() {
        populate(&mut cc, key, i);
        let owner = cluster.owner(keyslot(&mut n0, key));
        *per_master.entry(cluster.port(owner)).or_default() += 1;
        // The key really lives on the slot's owner.
        let mut direct = cluster.con(owner);
        assert_eq!(qint(&mut direct, &["EXISTS", key]), 1, "{key} on its owner");
    }
    println!("sessions per master port: {per_master:?}");
    assert_eq!(per_master.len(), 3, "sessions spread over all masters");

    // MEM.IMPORT through the cluster client, several tags.
    for i in 0..12 {
        let key = format!("mem:{{imp-{i}}}");
        import_and_check(&mut cc, &key, i);
    }
    // A key of another type in the same slot as a session: WRONGTYPE, routed fine.
    qok(&mut cc, &["SET", "mem:{user-1}:plain", "x"]);
    let e = q(&mut cc, &["MEM.APPEND", "mem:{user-1}:plain", "user", "x"]).unwrap_err();
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");

    // ------------------------------------------------ redis-cli -c
    cli_checks(cluster, &mut cc, &mut n0);

    // ------------------------------------------------ reshard under load
    reshard_under_load(cluster, &client, &mut cc, &sessions);

    // ------------------------------------------------ failover
    failover(cluster, &client, &mut cc, &sessions);
}

/// Writes a session with every write command and checks every read command.
fn populate(cc: &mut ClusterConnection, key: &str, i: usize) {
    let r = qmap(
        cc,
        &[
            "MEM.APPEND",
            key,
            "system",
            "You are a helpful assistant.",
            "MODEL",
            "gpt-4o",
            "TTL",
            "3600",
        ],
    );
    assert_eq!(int_field(&r, "id"), 1, "{key}");
    let t1 = int_field(&r, "tokens");
    let meta = format!("{{\"n\":{i},\"tag\":\"user-{i}\"}}");
    let content = format!("Hello from user {i}, how are you?");
    let r = qmap(
        cc,
        &[
            "MEM.APPEND",
            key,
            "user",
            &content,
            "META",
            &meta,
            "TS",
            "1700000000000",
        ],
    );
    assert_eq!(int_field(&r, "id"), 2);
    let t2 = int_field(&r, "tokens");
    let r = qmap(
        cc,
        &["MEM.APPEND", key, "assistant", "I am fine, thank you."],
    );
    assert_eq!(int_field(&r, "id"), 3);
    let t3 = int_field(&r, "tokens");
    assert_eq!(int_field(&r, "total_tokens"), t1 + t2 + t3);
    assert_eq!(int_field(&r, "messages"), 3);
    assert_eq!(int_field(&r, "trimmed"), 0);
    assert_eq!(int_field(&r, "summarize"), 0);

    assert_eq!(
        qstr(
            cc,
            &["MEM.EXTSET", key, "dify", &format!("conv-{i}"), "EX", "600"]
        ),
        "OK"
    );
    assert_eq!(qstr(cc, &["MEM.EXTGET", key, "dify"]), format!("conv-{i}"));
    assert_eq!(qok(cc, &["MEM.EXTGET", key, "n8n"]), Value::Nil);

    let c = qmap(cc, &["MEM.SUMMARIZE_CHECK", key, "KEEP", "1"]);
    assert_eq!(int_field(&c, "summarize"), 0);
    assert_eq!(int_field(&c, "messages"), 3);
    assert_eq!(int_field(&c, "threshold_tokens"), 19200, "gpt-4o threshold");
    assert_eq!(int_field(&c, "upto"), 2);
    assert_eq!(int_field(&c, "upto_tokens"), t1 + t2);

    let mut expect_msgs = 3;
    if i.is_multiple_of(3) {
        let s = qmap(
            cc,
            &[
                "MEM.SUMMARIZE",
                key,
                "2",
                &format!("User {i} greeted the assistant."),
            ],
        );
        assert_eq!(int_field(&s, "id"), 2);
        assert_eq!(int_field(&s, "messages"), 1);
        expect_msgs = 1;
    }

    let all = match qok(cc, &["MEM.GET", key]) {
        Value::Array(a) => a,
        other => panic!("MEM.GET {key}: {other:?}"),
    };
    assert_eq!(all.len(), expect_msgs + usize::from(i.is_multiple_of(3)));
    let last = as_fields(all.last().unwrap().clone());
    assert_eq!(int_field(&last, "id"), 3);
    assert_eq!(str_field(&last, "role"), "assistant");

    let (_, doc) = get_json(cc, key);
    let h = history(&doc);
    assert_eq!(h.len(), expect_msgs);
    assert_eq!(doc["model"], "gpt-4o");
    if i.is_multiple_of(3) {
        assert_eq!(doc["summary"]["upto"], 2);
    } else {
        assert!(doc["summary"].is_null());
        assert_eq!(h[1]["meta"]["n"], i as u64);
        assert_eq!(h[1]["timestamp"], "2023-11-14T22:13:20.000Z");
        assert_eq!(h[1]["content"], content.as_str());
    }

    let info = qmap(cc, &["MEM.INFO", key]);
    assert_eq!(int_field(&info, "messages") as usize, expect_msgs);
    assert_eq!(int_field(&info, "last_id"), 3);
    assert_eq!(str_field(&info, "model"), "gpt-4o");
    assert_eq!(str_field(&info, "encoding"), "o200k_base");
    assert_eq!(int_field(&info, "ttl"), 3600);
    let ext: Vec<String> = redis::from_redis_value(field(&info, "external")).unwrap();
    assert_eq!(ext, vec!["dify".to_owned()]);
}

fn import_and_check(cc: &mut ClusterConnection, key: &str, i: usize) {
    let doc = format!(
        "{{\"conversation_history\":[\
         {{\"role\":\"user\",\"content\":\"imported question {i}\",\"timestamp\":\"2024-05-01T10:00:00Z\"}},\
         {{\"role\":\"assistant\",\"content\":\"imported answer {i}\",\"timestamp\":\"2024-05-01T10:00:01\"}}],\
         \"user_profile\":{{\"name\":\"u{i}\"}},\"context\":{{\"k\":{i}}}}}"
    );
    let r = qmap(cc, &["MEM.IMPORT", key, &doc, "TTL", "3600"]);
    assert_eq!(int_field(&r, "id"), 2, "{key}");
    assert_eq!(int_field(&r, "messages"), 2);
    let e = q(cc, &["MEM.IMPORT", key, &doc]).unwrap_err();
    assert!(
        e.to_string().contains("BUSYKEY") || e.to_string().contains("exists"),
        "{e}"
    );
    let (_, out) = get_json(cc, key);
    let h = history(&out);
    assert_eq!(h.len(), 2);
    assert_eq!(h[0]["ts"], 1_714_557_600_000i64);
    assert_eq!(h[1]["ts"], 1_714_557_601_000i64);
    assert_eq!(h[1]["content"], format!("imported answer {i}").as_str());
    assert_eq!(out["user_profile"]["name"], format!("u{i}").as_str());
    assert_eq!(out["context"]["k"], i as u64);
    let r = qmap(cc, &["MEM.APPEND", key, "user", "after import"]);
    assert_eq!(int_field(&r, "id"), 3);
}

/// Every command through `redis-cli -c`, sent to a node that does not own
/// the key, so the redirection is exercised; cross-checked with the cluster
/// client.
fn cli_checks(cluster: &Cluster, cc: &mut ClusterConnection, n0: &mut redis::Connection) {
    let mut redirected = 0;
    for i in 0..8 {
        let key = format!("mem:{{cli-{i}}}");
        let owner = cluster.owner(keyslot(n0, &key));
        // A node that is not the owner (a master or a replica: both redirect).
        let port = cluster.port((owner + 1 + i % 5) % cluster.nodes.len());
        if port != cluster.port(owner) {
            redirected += 1;
        }
        let out = redis_cli(
            port,
            &[
                "MEM.APPEND",
                &key,
                "user",
                "hello from redis-cli",
                "META",
                "{\"via\":\"cli\"}",
            ],
        );
        assert_eq!(cli_field(&out, "id"), "1", "{out:?}");
        let out = redis_cli(port, &["MEM.APPEND", &key, "assistant", "hi, cli"]);
        assert_eq!(cli_field(&out, "id"), "2", "{out:?}");
        let total: i64 = cli_field(&out, "total_tokens").parse().unwrap();

        let out = redis_cli(port, &["MEM.GET", &key, "FORMAT", "JSON"]);
        let line = out
            .iter()
            .find(|l| l.starts_with('{'))
            .unwrap_or_else(|| panic!("{out:?}"));
        let doc: Json = serde_json::from_str(line).unwrap();
        assert_eq!(history(&doc).len(), 2);
        assert_eq!(history(&doc)[0]["meta"]["via"], "cli");
        assert_eq!(doc["total_tokens"], total);
        // Same document through the cluster client.
        let (text, _) = get_json(cc, &key);
        assert_eq!(serde_json::from_str::<Json>(&text).unwrap(), doc);

        let out = redis_cli(port, &["MEM.GET", &key, "LAST", "1"]);
        assert_eq!(cli_field(&out, "content"), "hi, cli", "{out:?}");

        assert_eq!(
            redis_cli(port, &["MEM.EXTSET", &key, "n8n", &format!("wf-{i}")]),
            vec!["OK"]
        );
        assert_eq!(
            redis_cli(port, &["MEM.EXTGET", &key, "n8n"]),
            vec![format!("wf-{i}")]
        );

        let out = redis_cli(port, &["MEM.SUMMARIZE_CHECK", &key, "KEEP", "1"]);
        assert_eq!(cli_field(&out, "upto"), "1", "{out:?}");
        assert_eq!(cli_field(&out, "summarize"), "0");
        let out = redis_cli(port, &["MEM.SUMMARIZE", &key, "1", "the user said hello"]);
        assert_eq!(cli_field(&out, "id"), "1", "{out:?}");
        assert_eq!(cli_field(&out, "messages"), "1");

        let out = redis_cli(port, &["MEM.INFO", &key]);
        assert_eq!(cli_field(&out, "summary_upto"), "1", "{out:?}");
        assert_eq!(cli_field(&out, "last_id"), "2");
        assert_eq!(cli_field(&out, "external"), "n8n");

        let ikey = format!("mem:{{cli-imp-{i}}}");
        let doc = r#"{"conversation_history":[{"role":"user","content":"q","timestamp":"2024-01-01T00:00:00Z"}],"context":{"from":"cli"}}"#;
        let out = redis_cli(port, &["MEM.IMPORT", &ikey, doc]);
        assert_eq!(cli_field(&out, "id"), "1", "{out:?}");
        let info = qmap(cc, &["MEM.INFO", &ikey]);
        assert_eq!(int_field(&info, "messages"), 1);
        let (_, d) = get_json(cc, &ikey);
        assert_eq!(d["context"]["from"], "cli");

        // The cluster client sees what redis-cli wrote.
        let info = qmap(cc, &["MEM.INFO", &key]);
        assert_eq!(int_field(&info, "summary_upto"), 1);
        assert_eq!(qstr(cc, &["MEM.EXTGET", &key, "n8n"]), format!("wf-{i}"));
    }
    assert!(
        redirected >= 4,
        "redis-cli was redirected {redirected} times"
    );
    println!("redis-cli -c: 8 sessions, {redirected} via a non-owner node");
}

struct Ack {
    session: usize,
    seq: u64,
    id: i64,
}

fn reshard_under_load(
    cluster: &Cluster,
    client: &ClusterClient,
    cc: &mut ClusterConnection,
    sessions: &[String],
) {
    let mut n0 = cluster.con(0);
    let masters = cluster.masters();
    // Source: the master with the most slots; a range of 200 slots inside
    // one of its ranges; target: another master.
    let view = cluster.view(0).unwrap();
    let (src, lo) = {
        let mut best = None;
        for &m in &masters {
            let line = view.iter().find(|n| n.port == cluster.port(m)).unwrap();
            for &(a, b) in &line.slots {
                if b - a >= 400 && best.is_none() {
                    best = Some((m, a + 100));
                }
            }
        }
        best.expect("a master with a range of 400 slots")
    };
    let hi = lo + 199;
    let dst = *masters.iter().find(|&&m| m != src).unwrap();
    let others: Vec<usize> = masters
        .iter()
        .copied()
        .filter(|&m| m != src && m != dst)
        .collect();
    let (src_id, dst_id) = (cluster.id(src), cluster.id(dst));

    // Sessions in the range: appended to during the move ("hot") or left
    // alone ("cold"); plus any of the populated sessions that fall there.
    let hot = names_in_slots(&mut n0, "hot", lo, hi, 6);
    let mut cold = names_in_slots(&mut n0, "cold", lo, hi, 6);
    for (i, key) in cold.iter().enumerate() {
        populate(cc, key, 1000 + i);
    }
    for key in sessions {
        let s = keyslot(&mut n0, key);
        if lo <= s && s <= hi {
            cold.push(key.clone());
        }
    }
    for key in &hot {
        let r = qmap(
            cc,
            &[
                "MEM.APPEND",
                key,
                "system",
                "load test",
                "MAXMSGS",
                "100000",
                "MAXTOKENS",
                "10000000",
                "TTL",
                "3600",
            ],
        );
        assert_eq!(int_field(&r, "id"), 1);
    }
    let mut src_con = cluster.con(src);
    let mut before: HashMap<String, (String, Value)> = HashMap::new();
    for key in &cold {
        let (text, _) = get_json(&mut src_con, key);
        before.insert(key.clone(), (text, digest(&mut src_con, key)));
    }
    println!(
        "reshard: slots {lo}..={hi} from port {} to port {}: {} hot, {} cold sessions",
        cluster.port(src),
        cluster.port(dst),
        hot.len(),
        cold.len()
    );

    // The load: one thread appends round-robin to the hot sessions.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let client = client.clone();
        let hot = hot.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut con = client.get_connection().expect("load connection");
            let mut acks: Vec<Ack> = Vec::new();
            let mut errors: Vec<String> = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut seq = 0u64;
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                seq += 1;
                let session = (seq as usize) % hot.len();
                let content = format!("load seq {seq}");
                for _attempt in 0..50 {
                    match q(&mut con, &["MEM.APPEND", &hot[session], "user", &content]) {
                        Ok(v) => {
                            let id = int_field(&as_fields(v), "id");
                            acks.push(Ack { session, seq, id });
                            break;
                        }
                        Err(e) => {
                            errors.push(format!("seq {seq}: {e}"));
                            thread::sleep(Duration::from_millis(20));
                            // A fresh connection if this one is confused.
                            if let Ok(c) = client.get_connection() {
                                con = c;
                            }
                        }
                    }
                }
            }
            (acks, errors, seq)
        })
    };
    thread::sleep(Duration::from_millis(300));

    // The move, slot by slot, by hand.
    let mut dst_con = cluster.con(dst);
    let mut other_cons: Vec<redis::Connection> = others.iter().map(|&m| cluster.con(m)).collect();
    let dst_port = cluster.port(dst).to_string();
    let mut keys_moved = 0usize;
    let mut slots_moved = 0usize;
    for slot in lo..=hi {
        let s = slot.to_string();
        qok(
            &mut dst_con,
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id],
        );
        qok(
            &mut src_con,
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id],
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let keys: Vec<String> = redis::from_redis_value(&qok(
                &mut src_con,
                &["CLUSTER", "GETKEYSINSLOT", &s, "100"],
            ))
            .unwrap();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &dst_port, "", "0", "10000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            match q(&mut src_con, &args) {
                Ok(_) => {
                    keys_moved += keys.len();
                    // Leave the slot half-moved a moment: appends to its
                    // sessions now go to the target by ASK redirection.
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "MIGRATE of slot {slot} keeps failing: {e}"
                    );
                    eprintln!("MIGRATE slot {slot} {keys:?}: {e} (retrying)");
                    thread::sleep(Duration::from_millis(50));
                }
            }
        }
        qok(&mut dst_con, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
        qok(&mut src_con, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
        for c in other_cons.iter_mut() {
            qok(c, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
        }
        slots_moved += 1;
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let (acks, errors, attempted) = load.join().expect("load thread");
    let stats = qstr(&mut dst_con, &["INFO", "commandstats"]);
    let asking = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_asking:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|l| l.split(',').next())
        .unwrap_or("0")
        .to_owned();

    let dst_port_n = cluster.port(dst);
    cluster.wait_stable("the cluster after the reshard", |c| {
        let map = Cluster::slot_map(&c.view(0).map_err(|e| e.to_string())?);
        match map.iter().find(|&&(a, b, _)| a <= lo && hi <= b) {
            Some(&(_, _, p)) if p == dst_port_n => Ok(()),
            _ => Err("target does not own the range yet".into()),
        }
    });

    // No key left on the source for the moved slots; all on the target.
    for slot in lo..=hi {
        let s = slot.to_string();
        assert_eq!(
            qint(&mut src_con, &["CLUSTER", "COUNTKEYSINSLOT", &s]),
            0,
            "slot {slot} left on source"
        );
    }
    let on_dst: i64 = (lo..=hi)
        .map(|slot| {
            qint(
                &mut dst_con,
                &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
            )
        })
        .sum();
    assert_eq!(
        on_dst as usize,
        hot.len() + cold.len(),
        "keys in the moved slots on the target"
    );

    // Acknowledged appends: all there, with the acknowledged id and content.
    let mut lost = Vec::new();
    let mut extra = 0usize;
    let mut docs: Vec<Json> = Vec::new();
    for (si, key) in hot.iter().enumerate() {
        let (_, doc) = get_json(&mut dst_con, key);
        let h = history(&doc);
        let ids: Vec<i64> = h.iter().map(|m| m["id"].as_i64().unwrap()).collect();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "{key}: ids not strictly increasing: {ids:?}"
        );
        let by_id: HashMap<i64, &str> = h
            .iter()
            .map(|m| (m["id"].as_i64().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let mine: Vec<&Ack> = acks.iter().filter(|a| a.session == si).collect();
        assert!(
            mine.windows(2).all(|w| w[0].id < w[1].id),
            "{key}: acknowledged ids not increasing"
        );
        for a in &mine {
            let want = format!("load seq {}", a.seq);
            if by_id.get(&a.id) != Some(&want.as_str()) {
                lost.push(format!(
                    "{key} id {} seq {}: found {:?}",
                    a.id,
                    a.seq,
                    by_id.get(&a.id)
                ));
            }
        }
        // Messages beyond the system one and the acknowledged appends can only
        // come from an append whose reply was an error (then retried).
        extra += h.len() - 1 - mine.len();
        let info = qmap(&mut dst_con, &["MEM.INFO", key]);
        assert_eq!(int_field(&info, "messages") as usize, h.len());
        assert_eq!(int_field(&info, "last_id"), *ids.last().unwrap());
        docs.push(doc);
    }
    println!(
        "reshard: {slots_moved} slots moved, {keys_moved} keys migrated; appends attempted {attempted}, \
         acknowledged {}, lost {}, errors {} (retried), unacknowledged-but-applied {extra}; ASKING on the target: {asking}",
        acks.len(),
        lost.len(),
        errors.len()
    );
    for e in errors.iter().take(5) {
        println!("  append error during the move: {e}");
    }
    assert!(lost.is_empty(), "acknowledged appends lost: {lost:?}");
    assert!(
        acks.len() >= 20,
        "the load made too little progress: {} acks",
        acks.len()
    );
    assert!(extra <= errors.len(), "{extra} unexplained messages");

    // Cold sessions: byte-identical JSON and digest on the new owner, TTL kept.
    for key in &cold {
        let (text, _) = get_json(&mut dst_con, key);
        let (btext, bdigest) = &before[key];
        assert_eq!(&text, btext, "{key}: JSON changed by the move");
        assert_eq!(
            &digest(&mut dst_con, key),
            bdigest,
            "{key}: digest changed by the move"
        );
        let pttl = qint(&mut dst_con, &["PTTL", key]);
        assert!(
            pttl > 0 && pttl <= 3_600_000,
            "{key}: PTTL {pttl} after the move"
        );
    }

    // The target's replica holds the same sessions.
    let replica = cluster.replica_of(dst);
    assert!(
        qint(&mut dst_con, &["WAIT", "1", "10000"]) >= 1,
        "replica of the target caught up"
    );
    let mut rc = cluster.con(replica);
    qok(&mut rc, &["READONLY"]);
    for key in hot.iter().chain(cold.iter()) {
        assert_eq!(
            get_json(&mut rc, key).0,
            get_json(&mut dst_con, key).0,
            "{key}: replica differs"
        );
        assert_eq!(
            digest(&mut rc, key),
            digest(&mut dst_con, key),
            "{key}: replica digest differs"
        );
    }

    // Still writable through the (already used) cluster client.
    for (si, key) in hot.iter().enumerate() {
        let last = docs[si]["conversation_history"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["id"]
            .as_i64()
            .unwrap();
        let r = qmap(cc, &["MEM.APPEND", key, "assistant", "after the move"]);
        assert_eq!(int_field(&r, "id"), last + 1, "{key}");
    }
    for key in &cold {
        let r = qmap(cc, &["MEM.APPEND", key, "user", "after the move"]);
        assert_eq!(int_field(&r, "id"), 4, "{key}");
    }
}

fn failover(
    cluster: &Cluster,
    client: &ClusterClient,
    cc: &mut ClusterConnection,
    sessions: &[String],
) {
    let mut n0 = cluster.con(0);
    let masters = cluster.masters();
    // The master holding the most of our sessions.
    let mut owned: HashMap<usize, Vec<String>> = HashMap::new();
    for key in sessions {
        owned
            .entry(cluster.owner(keyslot(&mut n0, key)))
            .or_default()
            .push(key.clone());
    }
    let master = *masters
        .iter()
        .max_by_key(|m| owned.get(m).map_or(0, Vec::len))
        .unwrap();
    let keys = owned.remove(&master).unwrap_or_default();
    assert!(!keys.is_empty());
    let replica = cluster.replica_of(master);
    let (master_port, replica_port) = (cluster.port(master), cluster.port(replica));

    let mut mc = cluster.con(master);
    assert!(
        qint(&mut mc, &["WAIT", "1", "10000"]) >= 1,
        "replica caught up before the failover"
    );
    let mut before: HashMap<String, (String, Value)> = HashMap::new();
    for key in &keys {
        let (text, _) = get_json(&mut mc, key);
        before.insert(key.clone(), (text, digest(&mut mc, key)));
    }
    drop(mc);

    let mut rc = cluster.con(replica);
    qok(&mut rc, &["CLUSTER", "FAILOVER"]);
    let mut reissued = Instant::now();
    cluster.wait_stable("the failover", |c| {
        let me = c.me(replica);
        if !me.master {
            // A manual failover that did not complete in time is retried.
            if reissued.elapsed() > Duration::from_secs(10) {
                reissued = Instant::now();
                if let Ok(mut r) = c.nodes[replica].try_client_pub() {
                    let _ = q(&mut r, &["CLUSTER", "FAILOVER"]);
                }
            }
            return Err("replica not master yet".into());
        }
        if c.me(master).master {
            return Err("old master still a master".into());
        }
        let map = Cluster::slot_map(&c.view(0).map_err(|e| e.to_string())?);
        if map.iter().any(|&(_, _, p)| p == master_port) {
            return Err("old master still owns slots".into());
        }
        Ok(())
    });
    let repl = qstr(&mut rc, &["INFO", "replication"]);
    assert!(repl.contains("role:master"), "{repl}");
    println!(
        "failover: port {replica_port} replaced master {master_port}; {} sessions checked",
        keys.len()
    );

    // Same sessions, byte for byte, on the new master.
    for key in &keys {
        let (text, _) = get_json(&mut rc, key);
        let (btext, bdigest) = &before[key];
        assert_eq!(&text, btext, "{key}: JSON changed by the failover");
        assert_eq!(
            &digest(&mut rc, key),
            bdigest,
            "{key}: digest changed by the failover"
        );
    }

    // Writable through the old cluster connection (stale map: MOVED) and a new one.
    let mut fresh = client.get_connection().expect("cluster connection");
    for (i, key) in keys.iter().enumerate() {
        let last = int_field(&qmap(&mut rc, &["MEM.INFO", key]), "last_id");
        let con: &mut ClusterConnection = if i % 2 == 0 { cc } else { &mut fresh };
        let r = qmap(con, &["MEM.APPEND", key, "user", "after the failover"]);
        assert_eq!(int_field(&r, "id"), last + 1, "{key}");
        let info = qmap(con, &["MEM.INFO", key]);
        assert_eq!(int_field(&info, "last_id"), last + 1);
        assert!(qstr(con, &["MEM.EXTGET", key, "dify"]).starts_with("conv-"));
    }
    // The old master, now a replica, follows.
    assert!(
        qint(&mut rc, &["WAIT", "1", "10000"]) >= 1,
        "old master caught up as a replica"
    );
    let mut old = cluster.con(master);
    qok(&mut old, &["READONLY"]);
    for key in &keys {
        assert_eq!(
            get_json(&mut old, key).0,
            get_json(&mut rc, key).0,
            "{key}: old master differs"
        );
    }
}
