//! The session's attributes: the seed document's other top-level members
//! (`user_profile`, `context`, ...), kept as `extra`, the JSON text of an
//! object, and edited member by member (MEM.ATTRSET / ATTRGET / ATTRDEL).
//!
//! Members are kept verbatim as (name, raw JSON) pairs in their order: an
//! import keeps a document's members as written (duplicates included), and
//! an edit rewrites only the member it names.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::validate::JSON_MAX_NESTING;
use super::{Outcome, Session, SessionError};

/// Longest attribute name, in bytes.
pub const MAX_ATTR_NAME_BYTES: usize = 64;
/// The members `FORMAT JSON` writes itself: an attribute of one of these
/// names would collide with them (and an import reads them as the session's).
pub const RESERVED_ATTR_NAMES: [&str; 4] = ["conversation_history", "summary", "total_tokens", "model"];
/// Deepest attribute value: it sits inside the document, one container.
pub const MAX_ATTR_DEPTH: usize = JSON_MAX_NESTING - 1;

/// An attribute name a client may set: 1 to 64 bytes, not a member the
/// document already has.
pub fn check_attr_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_ATTR_NAME_BYTES {
        return Err(format!("attribute name must be 1 to {MAX_ATTR_NAME_BYTES} bytes"));
    }
    if RESERVED_ATTR_NAMES.contains(&name) {
        return Err(format!("'{name}' is a member of the session document itself, not an attribute"));
    }
    Ok(())
}

/// A JSON object's members in order, each value as its raw text.
struct Members(Vec<(String, Box<RawValue>)>);

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
                while let Some(pair) = map.next_entry::<String, Box<RawValue>>()? {
                    pairs.push(pair);
                }
                Ok(Members(pairs))
            }
        }
        d.deserialize_map(Pairs)
    }
}

/// The members of stored `extra` text. Stored text was checked to be a JSON
/// object when it came in (and when it loaded), so this fails only on a
/// value that skipped validation; it then reads as no members.
fn members(extra: Option<&str>) -> Vec<(String, Box<RawValue>)> {
    extra
        .and_then(|text| serde_json::from_str::<Members>(text).ok())
        .map_or_else(Vec::new, |m| m.0)
}

/// The JSON text of an object of `pairs`, or `None` when there is none (a
/// session without attributes stores none, as an import without them does).
fn object_text(pairs: &[(String, Box<RawValue>)]) -> Option<String> {
    if pairs.is_empty() {
        return None;
    }
    let mut out = String::from("{");
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // A String always serializes.
        out.push_str(&serde_json::to_string(name).unwrap_or_default());
        out.push(':');
        out.push_str(value.get());
    }
    out.push('}');
    Some(out)
}

impl Session {
    /// Every attribute, name -> JSON text, one per name in the order names
    /// first appear. A name present more than once (an imported document's
    /// duplicate) reads as its last value, as JSON parsers read it.
    pub fn attrs(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (name, value) in members(self.extra.as_deref()) {
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value.get().to_owned(),
                None => out.push((name, value.get().to_owned())),
            }
        }
        out
    }

    /// The JSON text of attribute `name` (its last value), if set.
    pub fn attr(&self, name: &str) -> Option<String> {
        members(self.extra.as_deref())
            .into_iter()
            .filter(|(n, _)| n == name)
            .last()
            .map(|(_, v)| v.get().to_owned())
    }

    /// Sets attribute `name` to `value`: every member of that name is
    /// replaced by one, at the first one's place; a new name goes last.
    pub fn attr_set(&mut self, name: &str, value: Box<RawValue>) {
        let mut pairs = members(self.extra.as_deref());
        match pairs.iter().position(|(n, _)| n == name) {
            Some(first) => {
                let mut i = 0;
                pairs.retain(|(n, _)| {
                    i += 1;
                    i - 1 == first || n != name
                });
                if let Some(slot) = pairs.get_mut(first) {
                    slot.1 = value;
                }
            }
            None => pairs.push((name.to_owned(), value)),
        }
        self.extra = object_text(&pairs);
    }

    /// Removes every member named `name`. Returns whether there was one.
    pub fn attr_del(&mut self, name: &str) -> bool {
        let mut pairs = members(self.extra.as_deref());
        let before = pairs.len();
        pairs.retain(|(n, _)| n != name);
        if pairs.len() == before {
            return false;
        }
        self.extra = object_text(&pairs);
        true
    }

    /// `Op::AttrSet`: age eviction at `now`, then the member set. The only
    /// failure (a value that is not JSON) comes before any change.
    pub(super) fn apply_attr_set(&mut self, now: i64, name: &str, value: String) -> Result<Outcome, SessionError> {
        let value = RawValue::from_string(value).map_err(|_| SessionError::BadAttrValue)?;
        let aged = self.evict_aged(now, false);
        self.attr_set(name, value);
        self.touch(now);
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
