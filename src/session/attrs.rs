//! The session's attributes: the seed document's other top-level members
//! (`user_profile`, `context`, ...), kept as `extra`, the JSON text of an
//! object, and edited member by member (MEM.ATTRSET / ATTRGET / ATTRDEL).
//!
//! Members are kept verbatim as (name, raw JSON) pairs in their order: an
//! import keeps a document's members as written (duplicates included), and
//! an edit rewrites only the member it names.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::sparse::Sparse;
use super::{Outcome, Session, SessionError, JSON_MAX_NESTING};

/// Longest attribute name, in bytes.
pub const MAX_ATTR_NAME_BYTES: usize = 64;
/// Most attributes a session holds (MEM.ATTRSET and MEM.IMPORT alike).
pub const MAX_ATTRS: usize = 1024;
/// The members `FORMAT JSON` writes itself: an attribute of one of these
/// names would collide with them (and an import reads them as the session's).
/// `redis_mem`: what else the session holds, in `FORMAT JSON` (its settings,
/// external ids, departed msgids), so the document imports back whole.
pub const RESERVED_ATTR_NAMES: [&str; 5] = [
    "conversation_history",
    "summary",
    "total_tokens",
    "model",
    "redis_mem",
];
/// Deepest attribute value: it sits inside the document, one container.
pub const MAX_ATTR_DEPTH: usize = JSON_MAX_NESTING - 1;

/// An attribute name a client may set: 1 to 64 bytes, not a member the
/// document already has.
pub fn check_attr_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_ATTR_NAME_BYTES {
        return Err(format!(
            "attribute name must be 1 to {MAX_ATTR_NAME_BYTES} bytes"
        ));
    }
    if RESERVED_ATTR_NAMES.contains(&name) {
        return Err(format!(
            "'{name}' is a member of the session document itself, not an attribute"
        ));
    }
    Ok(())
}

/// The attributes: (name, value) pairs in their order, each as its raw
/// JSON text (the name with its quotes, as written), duplicates kept. Held
/// parsed, so an edit or a read touches only the members it names (one
/// JSON text re-parsed per edit made 40 attributes of 1 MB cost 115-167 ms
/// of main thread for a 1-byte ATTRSET); stored and rendered as the text
/// of one object, `{name:value,...}`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attrs {
    /// Shared (copy on write): a read's view of the session (MAXAGE hides a
    /// message) clones the attributes, and 100 MB of them copied held the
    /// main thread ~50 ms per read.
    pairs: Pairs,
    /// Name -> expiry (ms) of the attributes set with their own lifetime
    /// (MEM.ATTRSET ... EX): past it they are never read, and the next
    /// write drops them (at its op's `now`, so replicas drop the same).
    expiry: Sparse<BTreeMap<String, i64>>,
}

/// (raw name, raw value). The value is shared: a copy of the members (the
/// first write after a COPY, a read's view) copies pointers, not values (30
/// values of 4 MB copied held the main thread 86 ms).
type Pair = (Box<str>, Arc<str>);

/// The members, shared; nothing allocated until there is one: every
/// session has its `Attrs`, few have attributes (an empty `Arc<Vec>` took
/// 48 B of each session).
#[derive(Clone, Debug, Default)]
struct Pairs(Option<Arc<Vec<Pair>>>);

impl std::ops::Deref for Pairs {
    type Target = [Pair];
    fn deref(&self) -> &[Pair] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

impl PartialEq for Pairs {
    fn eq(&self, other: &Pairs) -> bool {
        **self == **other
    }
}

impl Eq for Pairs {}

impl Pairs {
    fn new(pairs: Vec<Pair>) -> Pairs {
        Pairs((!pairs.is_empty()).then(|| Arc::new(pairs)))
    }

    /// The members to change (copied first if shared).
    fn make_mut(&mut self) -> &mut Vec<Pair> {
        Arc::make_mut(self.0.get_or_insert_with(Arc::default))
    }

    fn capacity(&self) -> usize {
        self.0.as_ref().map_or(0, |pairs| pairs.capacity())
    }
}

/// A JSON object's members in order, name and value as their raw text.
struct Members(Vec<Pair>);

impl<'de> serde::Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Members, D::Error> {
        struct Pairs;
        impl<'de> Visitor<'de> for Pairs {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut pairs = Vec::new();
                // Names as written too (escapes kept), so the stored text
                // comes back byte for byte.
                while let Some(name) = map.next_key::<&'de RawValue>()? {
                    let value: &'de RawValue = map.next_value()?;
                    pairs.push((Box::<str>::from(name.get()), Arc::<str>::from(value.get())));
                }
                Ok(Members(pairs))
            }
        }
        d.deserialize_map(Pairs)
    }
}

impl Attrs {
    /// The members of the stored text of an object (`None`: no attributes).
    pub fn from_text(text: Option<&str>) -> Result<Attrs, String> {
        match text {
            None => Ok(Attrs::default()),
            Some(t) => serde_json::from_str::<Members>(t)
                .map(|m| Attrs {
                    pairs: Pairs::new(m.0),
                    expiry: Sparse::default(),
                })
                .map_err(|e| format!("imported members are not a JSON object: {e}")),
        }
    }

    /// From an import: (raw name, raw value) pairs as the document wrote them.
    pub fn from_raw(pairs: Vec<(Box<str>, Arc<str>)>) -> Attrs {
        Attrs {
            pairs: Pairs::new(pairs),
            expiry: Sparse::default(),
        }
    }

    /// The expiries (ms) of the attributes that have one, by name.
    pub fn expiries(&self) -> &BTreeMap<String, i64> {
        &self.expiry
    }

    /// Gives attributes their expiries (a decoded session, an import);
    /// every name must be an attribute's.
    pub fn set_expiries(&mut self, expiry: BTreeMap<String, i64>) -> Result<(), String> {
        let names: HashSet<String> = self
            .pairs
            .iter()
            .filter_map(|(raw, _)| Attrs::name(raw))
            .collect();
        if let Some(name) = expiry.keys().find(|n| !names.contains(*n)) {
            return Err(format!("an expiry for '{name}', which is not an attribute"));
        }
        self.expiry = expiry.into();
        Ok(())
    }

    /// The latest expiry of an attribute (the key lives at least as long).
    pub fn latest_expiry(&self) -> Option<i64> {
        self.expiry.values().copied().max()
    }

    fn is_live(&self, name: &str, now: i64) -> bool {
        self.expiry.get(name).is_none_or(|&at| at > now)
    }

    /// Whether an attribute's time is up at `now`.
    pub fn any_expired(&self, now: i64) -> bool {
        self.expiry.values().any(|&at| at <= now)
    }

    /// Drops the attributes whose time is up at `now`.
    pub fn purge(&mut self, now: i64) {
        if !self.any_expired(now) {
            return;
        }
        // A set: 1,024 expired names were a linear search each (2 ms).
        let gone: HashSet<String> = self
            .expiry
            .iter()
            .filter(|(_, &at)| at <= now)
            .map(|(n, _)| n.clone())
            .collect();
        self.pairs
            .make_mut()
            .retain(|(raw, _)| Attrs::name(raw).is_none_or(|n| !gone.contains(&n)));
        self.expiry.shrink(|e| e.retain(|_, at| *at > now));
    }

    /// Whether an attribute is live at `now` (what FORMAT JSON writes).
    pub fn any_live(&self, now: i64) -> bool {
        if self.expiry.is_empty() {
            return !self.pairs.is_empty();
        }
        self.pairs
            .iter()
            .any(|(raw, _)| Attrs::name(raw).is_none_or(|n| self.is_live(&n, now)))
    }

    /// The distinct names live at `now` (what the attribute cap counts: an
    /// imported document may repeat a name).
    pub fn live_count(&self, now: i64) -> usize {
        self.pairs
            .iter()
            .filter_map(|(raw, _)| Attrs::name(raw))
            .filter(|n| self.is_live(n, now))
            .collect::<HashSet<String>>()
            .len()
    }

    /// The expiries of the attributes live at `now` (FORMAT JSON).
    pub fn live_expiries(&self, now: i64) -> BTreeMap<&str, i64> {
        self.expiry
            .iter()
            .filter(|(_, &at)| at > now)
            .map(|(n, &at)| (n.as_str(), at))
            .collect()
    }

    /// Every attribute live at `now`, name -> JSON text, one per name in
    /// the order names first appear. A name present more than once (an
    /// imported document's duplicate) reads as its last value, as JSON
    /// parsers read it.
    pub fn live(&self, now: i64) -> Vec<(String, Arc<str>)> {
        let mut out: Vec<(String, Arc<str>)> = Vec::new();
        // name -> its place in `out`: one pass, whatever the member count
        // (a linear search per member held 20,000 imported members 170-210 ms).
        let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for (raw, value) in self.pairs.iter() {
            let Some(name) = Attrs::name(raw) else {
                continue;
            };
            if !self.is_live(&name, now) {
                continue;
            }
            match at.get(&name) {
                // `at` holds only indices of entries pushed to `out`.
                Some(&i) => out[i].1 = Arc::clone(value),
                None => {
                    at.insert(name.clone(), out.len());
                    out.push((name, Arc::clone(value)));
                }
            }
        }
        out
    }

    /// Bytes of the values held (what a reply of them all or FORMAT JSON
    /// writes, about).
    pub fn value_bytes(&self) -> usize {
        self.pairs.iter().map(|(_, v)| v.len()).sum()
    }

    /// The `name:value` members live at `now`, as one object's inner text
    /// (FORMAT JSON).
    pub fn write_live_members(&self, out: &mut Vec<u8>, now: i64) {
        if self.expiry.is_empty() {
            return self.write_members(out);
        }
        self.write_members_where(out, |raw| {
            Attrs::name(raw).is_none_or(|n| self.is_live(&n, now))
        });
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The `name:value` members as one object's inner text, in order.
    pub fn write_members(&self, out: &mut Vec<u8>) {
        self.write_members_where(out, |_| true);
    }

    /// The members whose raw name `keep` keeps, as [`Attrs::write_members`].
    fn write_members_where(&self, out: &mut Vec<u8>, keep: impl Fn(&str) -> bool) {
        let mut first = true;
        for (name, value) in self.pairs.iter().filter(|(name, _)| keep(name)) {
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(name.as_bytes());
            out.push(b':');
            out.extend_from_slice(value.as_bytes());
        }
    }

    /// The text of the object (what is stored), `None` when empty.
    pub fn text(&self) -> Option<String> {
        if self.pairs.is_empty() {
            return None;
        }
        let mut out = vec![b'{'];
        self.write_members(&mut out);
        out.push(b'}');
        // Names and values are str: the bytes are UTF-8.
        Some(String::from_utf8(out).unwrap_or_default())
    }

    pub fn mem_usage(&self) -> usize {
        // A shared value counts in full in every session that holds it (as
        // a COPY's messages do).
        self.pairs.capacity() * std::mem::size_of::<Pair>()
            + self
                .pairs
                .iter()
                .map(|(n, v)| n.len() + v.len() + 2 * std::mem::size_of::<usize>())
                .sum::<usize>()
            + self.expiry.keys().map(|n| n.capacity() + 48).sum::<usize>()
            + self.expiry.boxed_bytes()
    }

    /// The decoded name of a member (a raw name that is not a JSON string
    /// cannot be stored: it reads as no name).
    fn name(raw: &str) -> Option<String> {
        serde_json::from_str(raw).ok()
    }
}

impl Session {
    /// Every attribute live at `now` ([`Attrs::live`]).
    pub fn attrs(&self, now: i64) -> Vec<(String, Arc<str>)> {
        self.extra.live(now)
    }

    /// Members held (an imported document's repeated names count each).
    pub fn attr_count(&self) -> usize {
        self.extra.pairs.len()
    }

    /// Whether attribute `name` is set and live at `now` (nothing copied).
    pub fn has_attr(&self, name: &str, now: i64) -> bool {
        self.extra.is_live(name, now)
            && self
                .extra
                .pairs
                .iter()
                .any(|(raw, _)| Attrs::name(raw).as_deref() == Some(name))
    }

    /// The JSON text of attribute `name` (its last value), if set and live
    /// at `now`.
    pub fn attr(&self, name: &str, now: i64) -> Option<Arc<str>> {
        if !self.extra.is_live(name, now) {
            return None;
        }
        self.extra
            .pairs
            .iter()
            .rfind(|(raw, _)| Attrs::name(raw).as_deref() == Some(name))
            .map(|(_, v)| Arc::clone(v))
    }

    /// Sets attribute `name` to `value`: every member of that name is
    /// replaced by one, at the first one's place; a new name goes last.
    /// `value` is JSON text already checked (by the command, its worker, or
    /// `Op::validate` for a replicated op): not parsed again here, as a
    /// 3.2 MB value re-parsed held the main thread 10-16 ms.
    pub fn attr_set(&mut self, name: &str, value: Arc<str>, expires_at: Option<i64>) {
        match expires_at {
            Some(at) => {
                self.extra.expiry.insert(name.to_owned(), at);
            }
            None => self.extra.expiry.shrink(|e| {
                e.remove(name);
            }),
        }
        let pairs = self.extra.pairs.make_mut();
        let named = |raw: &str| Attrs::name(raw).as_deref() == Some(name);
        match pairs.iter().position(|(raw, _)| named(raw)) {
            Some(first) => {
                let mut i = 0;
                pairs.retain(|(raw, _)| {
                    i += 1;
                    i - 1 == first || !named(raw)
                });
                if let Some(slot) = pairs.get_mut(first) {
                    slot.1 = value;
                }
            }
            // A String always serializes.
            None => pairs.push((
                serde_json::to_string(name)
                    .unwrap_or_default()
                    .into_boxed_str(),
                value,
            )),
        }
    }

    /// Removes every member named `name`. Returns whether there was one.
    pub fn attr_del(&mut self, name: &str) -> bool {
        self.extra.expiry.shrink(|e| {
            e.remove(name);
        });
        let pairs = self.extra.pairs.make_mut();
        let before = pairs.len();
        pairs.retain(|(raw, _)| Attrs::name(raw).as_deref() != Some(name));
        pairs.len() != before
    }

    /// `Op::AttrSet`: age eviction at `now`, then the member set. The only
    /// failure (a value that is not JSON) comes before any change.
    pub(super) fn apply_attr_set(
        &mut self,
        now: i64,
        name: &str,
        value: Arc<str>,
        expires_at: Option<i64>,
    ) -> Result<Outcome, SessionError> {
        let aged = self.evict_aged(now, false);
        self.touch(now);
        self.attr_set(name, value, expires_at);
        Ok(self.outcome(0, 0, aged))
    }

    /// `Op::AttrDel`: age eviction at `now`, then the members removed; the
    /// outcome's `id` is 1 when there was one.
    pub(super) fn apply_attr_del(&mut self, now: i64, name: &str) -> Outcome {
        let aged = self.evict_aged(now, false);
        let deleted = self.attr_del(name);
        self.touch(now);
        self.outcome(u64::from(deleted), 0, aged)
    }

    fn touch(&mut self, now: i64) {
        self.updated = now;
        self.purge_external(now);
    }
}
