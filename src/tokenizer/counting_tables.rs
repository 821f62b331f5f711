//! Encodings as the module counts with them: bpe's tables less those counting
//! never reads. build.rs writes OpenAI's two to OUT_DIR (`openai_tables`
//! reads them); an open-weight encoding is made so right after its build
//! (`load`). build.rs includes this file.
//!
//! bpe's `BytePairEncoding` holds the tables of every encoder bpe has. Counting (`BytePairEncoding::count`, its
//! backtracking encoder) and the module's set of whole tokens read only the
//! tokens' bytes, the longest-match automaton, the next-prefix table, the
//! split table and the pair lookup. Three tables are never read: the index of
//! tokens by the hash of their bytes and the two automata that find every
//! token in a text (bpe's appendable, prependable and interval encoders).
//! They are about half of every encoding's tables (o200k_base: 36.5 ->
//! 18.8 MB with the module's token set): here they are replaced by empty
//! ones. The unit tests count every token and random text with these tables
//! against tiktoken, for every encoding.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Serialize;

/// The fields counting never reads, by their names in bpe's struct.
const UNREAD_MAP: &str = "bytes_hash_to_token";
const UNREAD_AUTOMATA: [&str; 2] = ["overlapping_searcher", "overlapping_searcher_rev"];

/// `encoding`'s tables less those counting never reads, serialized as bpe
/// serializes them (a MessagePack map of the struct's fields, which its
/// derived `Deserialize` reads as it reads the array form). `keep_index`
/// keeps the index of tokens by hash: bpe's heap encoder reads it (the
/// vocabularies whose rank order is broken count short pieces with it).
pub fn counting_only(
    encoding: &bpe_openai::byte_pair_encoding::BytePairEncoding,
    keep_index: bool,
) -> Result<Vec<u8>, String> {
    let mut named = Vec::new();
    encoding
        .serialize(&mut rmp_serde::Serializer::new(&mut named).with_struct_map())
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut de = rmp_serde::Deserializer::from_read_ref(&named);
    let replaced = de
        .deserialize_map(Fields {
            out: &mut out,
            keep_index,
        })
        .map_err(|e| e.to_string())?;
    if replaced != 3 - usize::from(keep_index) {
        return Err("bpe's BytePairEncoding no longer has the fields counting leaves out".into());
    }
    Ok(out)
}

/// Writes the map of fields to its output, the unread ones emptied; the
/// value is how many were.
struct Fields<'o> {
    out: &'o mut Vec<u8>,
    keep_index: bool,
}

impl<'de> Visitor<'de> for Fields<'_> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("bpe's BytePairEncoding as a map of its fields")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
        let mut fields: Vec<(String, Vec<u8>)> = Vec::new();
        let mut replaced = 0;
        while let Some(name) = map.next_key::<String>()? {
            let mut value = Vec::new();
            if name == UNREAD_MAP && !self.keep_index {
                map.next_value::<IgnoredAny>()?;
                rmp::encode::write_map_len(&mut value, 0).map_err(serde::de::Error::custom)?;
                replaced += 1;
            } else if UNREAD_AUTOMATA.contains(&name.as_str()) {
                map.next_value::<IgnoredAny>()?;
                let automaton = empty_automaton()
                    .ok_or_else(|| serde::de::Error::custom("daachorse built no automaton"))?;
                rmp::encode::write_bin(&mut value, &automaton).map_err(serde::de::Error::custom)?;
                replaced += 1;
            } else {
                map.next_value_seed(Copy(&mut value))?;
            }
            fields.push((name, value));
        }
        rmp::encode::write_map_len(self.out, fields.len() as u32)
            .map_err(serde::de::Error::custom)?;
        for (name, value) in fields {
            rmp::encode::write_str(self.out, &name).map_err(serde::de::Error::custom)?;
            self.out.extend_from_slice(&value);
        }
        Ok(replaced)
    }
}

/// A value copied as it is, from the deserializer to MessagePack.
struct Copy<'o>(&'o mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Copy<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        serde_transcode::transcode(d, &mut rmp_serde::Serializer::new(self.0))
            .map_err(serde::de::Error::custom)
    }
}

/// The serialized form of the smallest automaton daachorse builds (one
/// pattern): what stands in for the two counting never reads.
fn empty_automaton() -> Option<Vec<u8>> {
    aneubeck_daachorse::DoubleArrayAhoCorasick::<u32>::new([[0u8]])
        .ok()
        .map(|a| a.serialize())
}
