//! OpenAI's encodings' tables as the module counts with them: bpe-openai's
//! tables less the three that counting never reads, written by build.rs
//! (`counting_tables` says which and why) and read here when an
//! encoding is built. Kept free of Redis types: benches/tokenizer.rs includes
//! this file.

use bpe_openai::byte_pair_encoding::BytePairEncoding;

/// o200k_base's counting tables (14.5 MB, bpe's MessagePack).
pub static O200K_BASE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.counting"));
/// cl100k_base's counting tables (7.2 MB).
pub static CL100K_BASE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.counting"));

/// The counting tables serialized in `bytes` (OpenAI's above, or an
/// open-weight encoding's made as it is built); None if they do not read (never
/// expected: build.rs wrote them, the unit tests read and count with them).
pub fn read(bytes: &[u8]) -> Option<BytePairEncoding> {
    rmp_serde::from_slice(bytes).ok()
}
