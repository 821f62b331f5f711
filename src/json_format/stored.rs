//! The `redis_mem` member of `FORMAT JSON`: what a session holds beyond its
//! history, summary and model (its settings, external ids with their
//! absolute expiry, the msgids that left it), so `FORMAT JSON` ->
//! `MEM.IMPORT` gives back the same session. Other members than these are
//! ignored on import (a later release may add some).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::session::{
    check_external_input, check_msgid, check_name_chars, Departed, ExternalId, Session,
    MAX_DEPARTED, MAX_EXTERNAL_SYSTEMS, MAX_ID, MAX_MESSAGE_TOKENS, MAX_TTL_SECS,
};

/// The member's name in the document.
pub const STORED_MEMBER: &str = "redis_mem";

#[derive(Serialize)]
pub struct StoredOut<'a> {
    ttl: u64,
    maxtokens: u64,
    maxmsgs: u64,
    maxage: u64,
    /// The last id handed out: ids are never reused, even when the newest
    /// messages left (by age) and the history is shorter.
    last_id: u64,
    external: BTreeMap<&'a str, ExternalOut<'a>>,
    departed_msgids: Vec<DepartedOut<'a>>,
    /// The attributes' own expiries (Unix ms; MEM.ATTRSET ... EX), of
    /// those live.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    attribute_expires: BTreeMap<&'a str, i64>,
    /// What left the session (MEM.INFO `evicted`, `summarized`).
    #[serde(skip_serializing_if = "is_zero")]
    evicted: u64,
    #[serde(skip_serializing_if = "is_zero")]
    summarized: u64,
    #[serde(skip_serializing_if = "is_zero")]
    summaries_dropped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize)]
struct ExternalOut<'a> {
    id: &'a str,
    /// Unix ms: two reads of an unchanged session give the same document.
    expires: i64,
}

#[derive(Serialize)]
struct DepartedOut<'a> {
    msgid: &'a str,
    id: u64,
    tokens: u64,
}

impl<'a> StoredOut<'a> {
    pub fn of(s: &'a Session, now: i64) -> StoredOut<'a> {
        StoredOut {
            ttl: s.settings.ttl,
            maxtokens: s.settings.max_tokens,
            maxmsgs: s.settings.max_msgs,
            maxage: s.settings.max_age,
            last_id: s.last_id,
            // An id whose time is up stays until the next write; reads
            // never show it (as MEM.EXTGET and the attributes).
            external: s
                .external
                .iter()
                .filter(|(_, e)| e.expires_at > now)
                .map(|(system, e)| {
                    (
                        system.as_str(),
                        ExternalOut {
                            id: &e.id,
                            expires: e.expires_at,
                        },
                    )
                })
                .collect(),
            departed_msgids: s
                .msgids
                .departed
                .iter()
                .map(|d| DepartedOut {
                    msgid: &d.msgid,
                    id: d.id,
                    tokens: d.tokens,
                })
                .collect(),
            attribute_expires: s.extra.live_expiries(now),
            evicted: s.history.evicted,
            summarized: s.history.summarized,
            summaries_dropped: s.history.summaries_dropped,
        }
    }
}

/// The member as an import reads it. A member it does not know (a
/// misspelt `maxtoken`, a later release's) refuses the document rather than
/// being dropped unsaid; every member an earlier release wrote is read.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StoredIn {
    pub ttl: Option<u64>,
    pub maxtokens: Option<u64>,
    pub maxmsgs: Option<u64>,
    pub maxage: Option<u64>,
    last_id: Option<u64>,
    #[serde(default)]
    external: BTreeMap<String, ExternalIn>,
    #[serde(default)]
    departed_msgids: Vec<DepartedIn>,
    #[serde(default)]
    attribute_expires: BTreeMap<String, i64>,
    #[serde(default)]
    evicted: u64,
    #[serde(default)]
    summarized: u64,
    #[serde(default)]
    summaries_dropped: u64,
}

impl StoredIn {
    /// Whether the session had a summary the caps dropped: the only way a
    /// session without a summary held a tool result first (its call was
    /// summarized, then the summary went).
    pub fn dropped_a_summary(&self) -> bool {
        self.summaries_dropped > 0
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExternalIn {
    id: String,
    expires: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DepartedIn {
    msgid: String,
    id: u64,
    tokens: u64,
}

pub fn parse(raw: &str) -> Result<StoredIn, String> {
    serde_json::from_str(raw).map_err(|e| format!("{STORED_MEMBER}: {e}"))
}

impl StoredIn {
    /// Gives the built `session` the external ids still live at `now` and
    /// the departed msgids (checked as a loaded session's are).
    pub fn apply(self, session: &mut Session, now: i64) -> Result<(), String> {
        match self.last_id {
            Some(id) if id > MAX_ID => {
                return Err(format!("{STORED_MEMBER}.last_id {id} is above {MAX_ID}"))
            }
            Some(id) => session.last_id = session.last_id.max(id),
            None => {}
        }
        // Live ones, as MEM.EXTSET counts them (expired ones are dropped).
        if self.external.values().filter(|e| e.expires > now).count() > MAX_EXTERNAL_SYSTEMS {
            return Err(format!(
                "{STORED_MEMBER}.external: more than {MAX_EXTERNAL_SYSTEMS} live systems"
            ));
        }
        for (system, e) in self.external {
            // As MEM.EXTSET takes them.
            check_external_input(&system, &e.id)
                .map_err(|e| format!("{STORED_MEMBER}.external: {e}"))?;
            if e.expires > now {
                // As MEM.EXTSET's EX allows: at most 100 years ahead.
                let expires_at = e
                    .expires
                    .min(now.saturating_add(MAX_TTL_SECS as i64 * 1000));
                let id = ExternalId {
                    id: e.id,
                    expires_at,
                };
                session.external.insert(system, id);
            }
        }
        apply_attribute_expires(session, self.attribute_expires, now)?;
        // The document's history, then what the import itself trimmed;
        // figures exact in every JSON parser (2^53 - 1 at most).
        for (what, n) in [
            ("evicted", self.evicted),
            ("summarized", self.summarized),
            ("summaries_dropped", self.summaries_dropped),
        ] {
            if n > MAX_ID {
                return Err(format!("{STORED_MEMBER}.{what} {n} is above {MAX_ID}"));
            }
        }
        let h = &mut session.history;
        h.evicted = h.evicted.saturating_add(self.evicted).min(MAX_ID);
        h.summarized = h.summarized.saturating_add(self.summarized).min(MAX_ID);
        h.summaries_dropped = h
            .summaries_dropped
            .saturating_add(self.summaries_dropped)
            .min(MAX_ID);
        if self.departed_msgids.len() > MAX_DEPARTED {
            return Err(format!(
                "{STORED_MEMBER}.departed_msgids holds more than {MAX_DEPARTED}"
            ));
        }
        let mut previous = 0;
        for d in self.departed_msgids {
            check_departed(session, &d, previous)?;
            previous = d.id;
            insert_departed(session, d)?;
        }
        Ok(())
    }
}

/// The document's attribute expiries: each of an attribute it holds, at
/// most 100 years ahead (as EX allows); one past at `now` drops its
/// attribute (a read would not have shown it).
fn apply_attribute_expires(
    session: &mut Session,
    expires: BTreeMap<String, i64>,
    now: i64,
) -> Result<(), String> {
    // No expiry is set yet: every attribute of the document is live.
    let names: std::collections::HashSet<String> =
        session.attrs(now).into_iter().map(|(n, _)| n).collect();
    let mut kept = BTreeMap::new();
    for (name, at) in expires {
        if !names.contains(&name) {
            return Err(format!(
                "{STORED_MEMBER}.attribute_expires: '{name}' is not an attribute of the document"
            ));
        }
        if at <= now {
            session.attr_del(&name);
        } else {
            kept.insert(name, at.min(now.saturating_add(MAX_TTL_SECS as i64 * 1000)));
        }
    }
    session.extra.set_expiries(kept)
}

/// A departed msgid of the document: a valid msgid and count, and an id
/// after `previous` that the history no longer holds, named once.
fn check_departed(session: &Session, d: &DepartedIn, previous: u64) -> Result<(), String> {
    check_msgid(&d.msgid)
        .and_then(|()| check_name_chars("msgid", &d.msgid))
        .map_err(|e| format!("{STORED_MEMBER}.departed_msgids: {e}"))?;
    if d.tokens > MAX_MESSAGE_TOKENS {
        return Err(format!(
            "{STORED_MEMBER}.departed_msgids: tokens {} is above {MAX_MESSAGE_TOKENS}",
            d.tokens
        ));
    }
    if d.id <= previous || d.id > session.last_id || session.messages.position(d.id).is_some() {
        return Err(format!(
            "{STORED_MEMBER}.departed_msgids: id {} is not a departed id of the history, in order",
            d.id
        ));
    }
    if session.find_msgid(&d.msgid).is_some() {
        return Err(format!(
            "{STORED_MEMBER}.departed_msgids: msgid {:?} is named twice",
            d.msgid
        ));
    }
    Ok(())
}

/// Beside those the import's own trimming made departed, in id order, the
/// oldest forgotten past MAX_DEPARTED.
fn insert_departed(session: &mut Session, d: DepartedIn) -> Result<(), String> {
    let departed = &mut session.msgids.departed;
    let at = departed.partition_point(|x| x.id < d.id);
    if departed.get(at).is_some_and(|x| x.id == d.id) {
        return Err(format!(
            "{STORED_MEMBER}.departed_msgids: id {} is named twice",
            d.id
        ));
    }
    departed.insert(
        at,
        Departed {
            msgid: d.msgid.into(),
            id: d.id,
            tokens: d.tokens,
        },
    );
    if departed.len() > MAX_DEPARTED {
        departed.pop_front();
    }
    Ok(())
}
