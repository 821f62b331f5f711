//! Where Redis Cluster would send a single-key write, decided from this
//! node's `CLUSTER NODES` view: the check a command resumed after a worker
//! must pass again, because the key's slot may have moved while it waited.
//! Pure (text in, decision out), so it is unit-tested without a cluster.

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// This node serves the key.
    Local,
    /// Another node owns the slot: `-MOVED slot addr`.
    Moved(String),
    /// The slot is migrating and the key is already gone: `-ASK slot addr`.
    Ask(String),
    /// No node serves the slot.
    Down,
}

struct Node<'a> {
    id: &'a str,
    addr: &'a str,
    myself: bool,
    slots: Vec<&'a str>,
}

fn parse(line: &str) -> Option<Node<'_>> {
    let mut fields = line.split_ascii_whitespace();
    let id = fields.next()?;
    // ip:port@cport[,hostname]
    let addr = fields.next()?.split(['@', ',']).next()?;
    let flags = fields.next()?;
    // master, ping-sent, pong-recv, config-epoch, link-state
    let slots = fields.skip(5).collect();
    Some(Node {
        id,
        addr,
        myself: flags.split(',').any(|f| f == "myself"),
        slots,
    })
}

fn serves(node: &Node, slot: u16) -> bool {
    node.slots.iter().any(|s| {
        if s.starts_with('[') {
            return false;
        }
        let (lo, hi) = s.split_once('-').unwrap_or((s, s));
        matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
    })
}

/// `[slot->-id]` (migrating to id) or `[slot-<-id]` (importing from id) on
/// this node's line.
fn transfer<'a>(node: &Node<'a>, slot: u16, arrow: &str) -> Option<&'a str> {
    node.slots.iter().find_map(|s| {
        let inner = s.strip_prefix('[')?.strip_suffix(']')?;
        let (n, peer) = inner.split_once(arrow)?;
        (n.parse::<u16>().ok()? == slot).then_some(peer)
    })
}

/// The route of a write to `slot`, as Redis decides it for a fresh command
/// (`getNodeByQuery`): `key_exists` on this node; `asking`: the command was
/// admitted through ASKING when it arrived.
pub fn route(nodes: &str, slot: u16, key_exists: bool, asking: bool) -> Route {
    let nodes: Vec<Node> = nodes.lines().filter_map(parse).collect();
    let Some(me) = nodes.iter().find(|n| n.myself) else {
        return Route::Down;
    };
    let addr_of = |id: &str| nodes.iter().find(|n| n.id == id).map(|n| n.addr.to_owned());
    let Some(owner) = nodes.iter().find(|n| serves(n, slot)) else {
        return Route::Down;
    };
    if owner.id != me.id {
        if asking && transfer(me, slot, "-<-").is_some() {
            return Route::Local;
        }
        return Route::Moved(owner.addr.to_owned());
    }
    match transfer(me, slot, "->-") {
        Some(target) if !key_exists => addr_of(target).map_or(Route::Local, Route::Ask),
        _ => Route::Local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaa";
    const B: &str = "bbbb";

    fn nodes(a_extra: &str, b_extra: &str, a_myself: bool) -> String {
        let (fa, fb) = if a_myself {
            ("myself,master", "master")
        } else {
            ("master", "myself,master")
        };
        format!(
            "{A} 127.0.0.1:7000@17000 {fa} - 0 0 1 connected 0-8191 {a_extra}\n\
             {B} 127.0.0.1:7001@17001,host-b {fb} - 0 0 2 connected 8192-16383 {b_extra}\n\
             cccc 127.0.0.1:7002@17002 slave {A} 0 0 1 connected\n"
        )
    }

    #[test]
    fn own_slot_is_local_and_others_are_moved() {
        let v = nodes("", "", true);
        assert_eq!(route(&v, 100, false, false), Route::Local);
        assert_eq!(
            route(&v, 9000, true, false),
            Route::Moved("127.0.0.1:7001".into())
        );
        // A replica (myself not serving anything) redirects to the owner.
        let r = v.replace("myself,master", "master").replace(
            "cccc 127.0.0.1:7002@17002 slave",
            "cccc 127.0.0.1:7002@17002 myself,slave",
        );
        assert_eq!(
            route(&r, 100, true, false),
            Route::Moved("127.0.0.1:7000".into())
        );
    }

    #[test]
    fn migrating_slot_asks_for_missing_keys_only() {
        let v = nodes(&format!("[100->-{B}]"), "", true);
        assert_eq!(route(&v, 100, true, false), Route::Local);
        assert_eq!(
            route(&v, 100, false, false),
            Route::Ask("127.0.0.1:7001".into())
        );
        assert_eq!(route(&v, 101, false, false), Route::Local);
    }

    #[test]
    fn importing_slot_is_local_only_with_asking() {
        let v = nodes("", &format!("[100-<-{A}]"), false);
        assert_eq!(route(&v, 100, false, true), Route::Local);
        assert_eq!(
            route(&v, 100, false, false),
            Route::Moved("127.0.0.1:7000".into())
        );
        // The import finished (the slot is ours now): local either way.
        let done = nodes("", "100", false).replace("0-8191", "0-99 101-8191");
        assert_eq!(route(&done, 100, false, true), Route::Local);
        // The import was cancelled: back to the owner.
        assert_eq!(
            route(&nodes("", "", false), 100, false, true),
            Route::Moved("127.0.0.1:7000".into())
        );
    }

    #[test]
    fn unserved_slots_and_garbage_are_down() {
        let v = nodes("", "", true).replace("8192-16383", "8192-16000");
        assert_eq!(route(&v, 16001, true, false), Route::Down);
        assert_eq!(route("", 1, true, false), Route::Down);
        assert_eq!(route("x y z\n\n", 1, true, false), Route::Down);
    }
}
