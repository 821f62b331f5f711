//! A real Redis Cluster of module-loaded servers for the tests: commands on
//! plain or cluster connections, the `CLUSTER NODES` view, a stable-state wait,
//! and two ways to build one (`redis-cli --cluster create`, or by hand with
//! ADDSLOTSRANGE/MEET/REPLICATE for the smallest cluster a test needs).
//! Everything waits with a deadline; nothing asserts on timing.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::{ConnectionLike, RedisResult, Value};
use serde_json::Value as Json;

use crate::support::server::*;

/// Runs a command on any connection (plain or cluster).
pub fn q<C: ConnectionLike>(con: &mut C, args: &[&str]) -> RedisResult<Value> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

/// Runs a command that must succeed.
pub fn qok<C: ConnectionLike>(con: &mut C, args: &[&str]) -> Value {
    q(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

pub fn qstr<C: ConnectionLike>(con: &mut C, args: &[&str]) -> String {
    let v = qok(con, args);
    redis::from_redis_value(&v).unwrap_or_else(|e| panic!("{args:?}: not a string {v:?}: {e}"))
}

pub fn qint<C: ConnectionLike>(con: &mut C, args: &[&str]) -> i64 {
    let v = qok(con, args);
    redis::from_redis_value(&v).unwrap_or_else(|e| panic!("{args:?}: not an integer {v:?}: {e}"))
}

pub fn qmap<C: ConnectionLike>(con: &mut C, args: &[&str]) -> Vec<(String, Value)> {
    as_fields(qok(con, args))
}

pub fn field<'a>(fields: &'a [(String, Value)], name: &str) -> &'a Value {
    &fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
        .1
}

/// `MEM.GET key FORMAT JSON`, as text and parsed.
pub fn get_json<C: ConnectionLike>(con: &mut C, key: &str) -> (String, Json) {
    let text = qstr(con, &["MEM.GET", key, "FORMAT", "JSON"]);
    let doc: Json =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{key}: bad JSON {text}: {e}"));
    (text, doc)
}

pub fn digest<C: ConnectionLike>(con: &mut C, key: &str) -> Value {
    qok(con, &["DEBUG", "DIGEST-VALUE", key])
}

pub fn history(doc: &Json) -> &Vec<Json> {
    doc["conversation_history"]
        .as_array()
        .expect("conversation_history array")
}

pub fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + timeout;
    loop {
        match ok() {
            Ok(()) => return,
            Err(why) => {
                if Instant::now() >= deadline {
                    panic!("timed out after {timeout:?} waiting for {what}: {why}");
                }
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------- the cluster

#[derive(Clone, Debug)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub myself: bool,
    pub master: bool,
    pub master_id: String,
    pub failing: bool,
    /// Stable slot ranges (migration markers left out).
    pub slots: Vec<(u16, u16)>,
}

pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let addr = f[1].split('@').next().unwrap();
            let port = addr.rsplit(':').next().unwrap().parse().unwrap();
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (s.parse().unwrap(), s.parse().unwrap()),
                })
                .collect();
            NodeLine {
                id: f[0].to_owned(),
                port,
                myself: flags.contains(&"myself"),
                master: flags.contains(&"master"),
                master_id: f[3].to_owned(),
                failing: flags.iter().any(|x| *x == "fail" || *x == "fail?"),
                slots,
            }
        })
        .collect()
}

pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// A cluster-enabled node (not yet part of any cluster).
    pub fn node(node_timeout_ms: u64, extra: &[&str]) -> Server {
        let timeout = node_timeout_ms.to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
            "--appendonly",
            "no",
        ];
        args.extend_from_slice(extra);
        Server::with_args(&args)
    }

    /// `n` nodes joined by `redis-cli --cluster create --cluster-replicas 1`.
    pub fn start(n: usize) -> Cluster {
        let nodes: Vec<Server> = (0..n).map(|_| Cluster::node(2000, &[])).collect();
        let cluster = Cluster { nodes };
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(
            cluster
                .nodes
                .iter()
                .map(|s| format!("127.0.0.1:{}", s.port)),
        );
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let out = Command::new(crate::support::server::redis_cli_bin())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_stable("the new cluster", |_| Ok(()));
        cluster
    }

    /// The smallest cluster a test needs, built by hand: `masters` nodes
    /// sharing the 16384 slots in equal ranges (node 0 first), then one
    /// replica per entry of `replicas` (the index of the master it follows).
    /// Full syncs start at once (no diskless-sync delay).
    pub fn create(masters: usize, replicas: &[usize], node_timeout_ms: u64) -> Cluster {
        let nodes: Vec<Server> = (0..masters + replicas.len())
            .map(|_| Cluster::node(node_timeout_ms, &["--repl-diskless-sync-delay", "0"]))
            .collect();
        let cluster = Cluster { nodes };
        let per = 16384 / masters;
        for m in 0..masters {
            let lo = m * per;
            let hi = if m + 1 == masters {
                16383
            } else {
                lo + per - 1
            };
            let mut c = cluster.con(m);
            qok(
                &mut c,
                &["CLUSTER", "ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()],
            );
            qok(
                &mut c,
                &["CLUSTER", "SET-CONFIG-EPOCH", &(m + 1).to_string()],
            );
        }
        let first = cluster.port(0).to_string();
        for i in 1..cluster.nodes.len() {
            qok(
                &mut cluster.con(i),
                &["CLUSTER", "MEET", "127.0.0.1", &first],
            );
        }
        for (r, &m) in replicas.iter().enumerate() {
            let id = cluster.id(m);
            let i = masters + r;
            // The replica must have heard of its master's id first.
            wait_until("replica can follow", Duration::from_secs(30), || {
                q(&mut cluster.con(i), &["CLUSTER", "REPLICATE", &id])
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
        }
        cluster.wait_stable("the new cluster", |_| Ok(()));
        cluster
    }

    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|s| s.port == port)
            .expect("known port")
    }

    pub fn con(&self, i: usize) -> redis::Connection {
        self.nodes[i].client()
    }

    pub fn view(&self, i: usize) -> RedisResult<Vec<NodeLine>> {
        let mut c = self.nodes[i].try_client_pub()?;
        let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c)?;
        Ok(parse_nodes(&text))
    }

    /// Node i's own line in its own view.
    pub fn me(&self, i: usize) -> NodeLine {
        self.view(i)
            .unwrap()
            .into_iter()
            .find(|n| n.myself)
            .unwrap()
    }

    pub fn id(&self, i: usize) -> String {
        self.me(i).id
    }

    /// The slot map (start, end, owner port) as node i sees it.
    pub fn slot_map(view: &[NodeLine]) -> Vec<(u16, u16, u16)> {
        let mut m: Vec<(u16, u16, u16)> = view
            .iter()
            .filter(|n| n.master)
            .flat_map(|n| n.slots.iter().map(move |&(a, b)| (a, b, n.port)))
            .collect();
        m.sort();
        m
    }

    /// Waits until every node reports `cluster_state:ok`, knows every node,
    /// sees no failing node, and all agree on the slot map covering 16384
    /// slots; replicas have their link up. `extra` adds a condition.
    pub fn wait_stable(&self, what: &str, mut extra: impl FnMut(&Cluster) -> Result<(), String>) {
        wait_until(what, Duration::from_secs(40), || {
            let mut first: Option<Vec<(u16, u16, u16)>> = None;
            for i in 0..self.nodes.len() {
                let mut c = self.nodes[i].try_client_pub().map_err(|e| e.to_string())?;
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .map_err(|e| e.to_string())?;
                if !info.contains("cluster_state:ok") {
                    return Err(format!("node {i}: not ok"));
                }
                if !info.contains(&format!("cluster_known_nodes:{}", self.nodes.len())) {
                    return Err(format!("node {i}: does not know every node"));
                }
                let view = self.view(i).map_err(|e| e.to_string())?;
                if let Some(n) = view.iter().find(|n| n.failing) {
                    return Err(format!("node {i} sees {} failing", n.port));
                }
                let map = Self::slot_map(&view);
                let covered: u32 = map.iter().map(|&(a, b, _)| (b - a) as u32 + 1).sum();
                if covered != 16384 {
                    return Err(format!("node {i}: {covered} slots covered"));
                }
                match &first {
                    None => first = Some(map),
                    Some(f) if *f != map => {
                        return Err(format!("node {i} disagrees on the slot map"))
                    }
                    _ => {}
                }
                let me = view.iter().find(|n| n.myself).unwrap();
                if !me.master {
                    let repl: String = redis::cmd("INFO")
                        .arg("replication")
                        .query(&mut c)
                        .map_err(|e| e.to_string())?;
                    if !repl.contains("master_link_status:up") {
                        return Err(format!("replica {i}: link not up"));
                    }
                }
            }
            extra(self)
        });
    }

    /// Index of the master owning `slot` (as node 0 sees it, after wait_stable).
    pub fn owner(&self, slot: u16) -> usize {
        let view = self.view(0).unwrap();
        let port = Self::slot_map(&view)
            .into_iter()
            .find(|&(a, b, _)| a <= slot && slot <= b)
            .map(|(_, _, p)| p)
            .expect("slot covered");
        self.index_of_port(port)
    }

    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.me(i).master)
            .collect()
    }

    pub fn replica_of(&self, master: usize) -> usize {
        let mid = self.id(master);
        (0..self.nodes.len())
            .find(|&i| {
                let me = self.me(i);
                !me.master && me.master_id == mid
            })
            .expect("master has a replica")
    }

    pub fn client(&self) -> ClusterClient {
        ClusterClient::builder(self.nodes.iter().map(|s| s.url()).collect::<Vec<_>>())
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(10))
            .retries(30)
            .build()
            .expect("cluster client")
    }

    pub fn dump_logs(&self) {
        for (i, s) in self.nodes.iter().enumerate() {
            let log = s.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("---- node {i} (port {}) log tail ----", s.port);
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// `Server::client` panics; this retries-friendly variant returns the error.
pub trait TryClient {
    fn try_client_pub(&self) -> RedisResult<redis::Connection>;
}
impl TryClient for Server {
    fn try_client_pub(&self) -> RedisResult<redis::Connection> {
        let c = redis::Client::open(self.url())?;
        let con = c.get_connection_with_timeout(Duration::from_secs(5))?;
        con.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(con)
    }
}

pub fn keyslot<C: ConnectionLike>(con: &mut C, key: &str) -> u16 {
    qint(con, &["CLUSTER", "KEYSLOT", key]) as u16
}

/// Names `mem:{<prefix>-k}` whose slot is in [lo, hi], found with CLUSTER KEYSLOT.
pub fn names_in_slots(
    con: &mut redis::Connection,
    prefix: &str,
    lo: u16,
    hi: u16,
    n: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut k = 0;
    while out.len() < n {
        let key = format!("mem:{{{prefix}-{k}}}");
        let s = keyslot(con, &key);
        if lo <= s && s <= hi {
            out.push(key);
        }
        k += 1;
        assert!(k < 200_000, "no names found in slots {lo}..={hi}");
    }
    out
}
