//! Token counting, all of it: which encoding a model uses (models.rs), exact
//! counts with `bpe`'s linear-time, panic-free byte-pair encoding (load.rs
//! builds each encoding the first time it is needed; pretokenize.rs splits
//! OpenAI's texts into pieces and piece_count.rs counts and caches them;
//! split.rs pre-tokenizes the open-weight ones), and the counts the commands
//! make, recorded for `INFO mem` ([`count_message`], [`count_text`]).

mod counting_tables;
mod load;
pub mod models;
mod openai_tables;
pub mod piece_count;
pub mod pretokenize;
mod resident;
pub mod short_bpe;
mod split;
mod split_patterns;
pub mod tool_calls;

use std::time::Instant;

use crate::stats;

pub use load::{footprint, is_loaded, load, state, State};
pub use models::{context_window, encoding_for_model};
pub use tool_calls::ToolFormat;

/// An encoding the module can count with: OpenAI's two, and the open-weight
/// families' own vocabularies (shipped inside the module, see load.rs).
/// A small Copy value; persisted by code (persistence/v2.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    O200kBase,
    Cl100kBase,
    Llama3,
    DeepseekV3,
    Qwen2,
    Glm4,
    Glm5,
    KimiK2,
    MinimaxM2,
    Tekken,
}

impl Encoding {
    pub const ALL: [Encoding; 10] = [
        Encoding::O200kBase,
        Encoding::Cl100kBase,
        Encoding::Llama3,
        Encoding::DeepseekV3,
        Encoding::Qwen2,
        Encoding::Glm4,
        Encoding::Glm5,
        Encoding::KimiK2,
        Encoding::MinimaxM2,
        Encoding::Tekken,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::Llama3 => "llama3",
            Encoding::DeepseekV3 => "deepseek_v3",
            Encoding::Qwen2 => "qwen2",
            Encoding::Glm4 => "glm4",
            Encoding::Glm5 => "glm5",
            Encoding::KimiK2 => "kimi_k2",
            Encoding::MinimaxM2 => "minimax_m2",
            Encoding::Tekken => "tekken",
        }
    }

    pub fn from_name(name: &str) -> Option<Encoding> {
        Encoding::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(name))
    }

    /// Whether this is one of OpenAI's encodings, without touching its
    /// tables (built on first use: 8.8 MB for cl100k_base).
    pub fn is_openai(self) -> bool {
        matches!(self, Encoding::O200kBase | Encoding::Cl100kBase)
    }

    /// The hand-written split of an OpenAI encoding (these do not normalize);
    /// None for the others.
    pub(crate) fn openai_pattern(self) -> Option<pretokenize::Pattern> {
        match self {
            Encoding::O200kBase => Some(pretokenize::Pattern::O200k),
            Encoding::Cl100kBase => Some(pretokenize::Pattern::Cl100k),
            _ => None,
        }
    }

    /// The counter, built now if it is not yet (blocking: on the main
    /// thread, commands check [`is_loaded`] first and wait on the pool).
    fn bpe(self) -> &'static load::Counter {
        load::counter(self)
    }

    /// Exact token count of `text`, equal to tiktoken's `len(encode(text))`.
    ///
    /// OpenAI's encodings count in `piece_count`: split by the hand-written
    /// pre-tokenizers of `pretokenize` (proven equal to their regexes by its
    /// tests, 2-5x faster), pieces looked up in a per-thread cache of exact
    /// counts and the set of whole tokens, the rest by byte-pair encoding.
    /// The open-weight encodings split with their vendor's pattern and count
    /// each piece by byte-pair encoding behind a per-thread cache, because
    /// encoding a piece allocates and, inside Redis, every allocation goes
    /// through Redis's accounting allocator.
    pub fn count(self, text: &str) -> u64 {
        const SCRATCH_IN_REGION_BYTES: usize = 4096;
        if text.is_empty() {
            return 0;
        }
        // What counting a long text allocates for a while (a normalized
        // copy, the split's, the encoders' and the merges' scratch: ~17
        // bytes a byte of a long piece) is the module's own, outside
        // used_memory. Charged to Redis, one 4 MB piece took 25 bytes a byte
        // at once, and a keyless MEM.COUNT made Redis evict 4,185 keys under
        // allkeys-lru (hostile pass 48).
        if text.len() >= SCRATCH_IN_REGION_BYTES {
            crate::module_memory::for_module(|| self.count_here(text))
        } else {
            self.count_here(text)
        }
    }

    fn count_here(self, text: &str) -> u64 {
        let tokenizer = self.bpe();
        if let Some(pattern) = self.openai_pattern() {
            let bpe = tokenizer.bpe.encoding();
            return piece_count::count(bpe, pattern, self as usize, text) as u64;
        }
        let text = tokenizer.normalize(text);
        let uncached = |piece: &[u8]| tokenizer.bpe.count(piece);
        let total = PIECE_CACHES.with(|caches| match caches.try_borrow_mut() {
            Ok(mut caches) => match caches.get_mut(self as usize) {
                Some(slot) => {
                    // In the module's region, as every cache: 96 KB per
                    // encoding and thread, charged to used_memory, evicted
                    // keys at maxmemory when a keyless MEM.COUNT made one.
                    let cache = slot
                        .get_or_insert_with(|| crate::module_memory::for_module(PieceCache::new));
                    tokenizer
                        .split(text.as_str())
                        .map(|piece| cache.count(piece.as_bytes(), uncached))
                        .sum::<usize>()
                }
                None => tokenizer
                    .split(text.as_str())
                    .map(|p| uncached(p.as_bytes()))
                    .sum(),
            },
            Err(_) => tokenizer
                .split(text.as_str())
                .map(|p| uncached(p.as_bytes()))
                .sum(),
        });
        total as u64
    }
}

/// Pieces up to this many bytes are cached (longer ones are rare and costly
/// to compare).
const CACHED_PIECE_BYTES: usize = 22;
const CACHE_SLOTS: usize = 4096;

/// A direct-mapped cache of exact piece counts: no allocation per lookup, a
/// fixed 96 KB per thread and encoding. A count depends only on the piece's
/// bytes, so a hit is exactly what encoding the piece would give.
struct PieceCache {
    slots: Box<[Slot]>,
}

#[derive(Clone, Copy)]
struct Slot {
    /// 0: empty (empty pieces are never cached).
    len: u8,
    count: u8,
    bytes: [u8; CACHED_PIECE_BYTES],
}

impl PieceCache {
    fn new() -> PieceCache {
        let empty = Slot {
            len: 0,
            count: 0,
            bytes: [0; CACHED_PIECE_BYTES],
        };
        PieceCache {
            slots: vec![empty; CACHE_SLOTS].into_boxed_slice(),
        }
    }

    fn count(&mut self, piece: &[u8], uncached: impl Fn(&[u8]) -> usize) -> usize {
        let len = piece.len();
        if len == 0 || len > CACHED_PIECE_BYTES {
            return uncached(piece);
        }
        let index = (hash(piece) as usize) % CACHE_SLOTS;
        let Some(slot) = self.slots.get_mut(index) else {
            return uncached(piece);
        };
        if usize::from(slot.len) == len && slot.bytes.get(..len) == Some(piece) {
            return usize::from(slot.count);
        }
        let count = uncached(piece);
        // A piece of n bytes has at most n tokens, so the count fits a u8.
        if let (Ok(count8), Some(dst)) = (u8::try_from(count), slot.bytes.get_mut(..len)) {
            dst.copy_from_slice(piece);
            slot.len = len as u8;
            slot.count = count8;
        }
        count
    }
}

fn hash(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write(bytes);
    h.finish()
}

thread_local! {
    /// One cache per encoding, indexed by `Encoding as usize`.
    static PIECE_CACHES: std::cell::RefCell<[Option<PieceCache>; Encoding::ALL.len()]> =
        const { std::cell::RefCell::new([const { None }; Encoding::ALL.len()]) };
}

/// How a message is counted: the encoding, and how the model's prompt
/// renders the tool calls a message's META carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counting {
    pub encoding: Encoding,
    pub tools: ToolFormat,
}

impl Counting {
    pub fn new(model: &str, encoding: Encoding) -> Counting {
        Counting {
            encoding,
            tools: ToolFormat::of(model, encoding),
        }
    }
}

/// Tokens of one chat message in OpenAI's chat format accounting (spec §2):
/// 3 framing tokens plus the role and the content, plus the tool calls its
/// META carries as the model's prompt renders them (tool_calls.rs).
pub fn message_tokens(c: Counting, role: &str, content: &str, meta: Option<&str>) -> u64 {
    let tools = meta.map_or(0, |m| {
        tool_calls::tool_call_tokens(c.encoding, c.tools, content, m)
    });
    3 + c.encoding.count(role) + c.encoding.count(content) + tools
}

/// A summary's tokens are counted as those of a message with this role
/// (spec §2: `3 + count("system") + count(text)`).
pub const SUMMARY_COUNTED_AS: &str = "system";

/// Counts one chat message (role + content), as the commands do: the time
/// it took and the tokens are recorded for `INFO mem`.
pub fn count_message(c: Counting, role: &str, content: &str, meta: Option<&str>) -> u64 {
    let start = Instant::now();
    let tokens = message_tokens(c, role, content, meta);
    stats::add(&stats::TOKENIZER_MICROS, start.elapsed().as_micros() as u64);
    stats::add(&stats::TOKENIZER_CALLS, 1);
    stats::add(&stats::TOKENS_COUNTED, tokens);
    tokens
}

/// Counts a summary as the commands do (spec §2: a system message).
pub fn count_summary(encoding: Encoding, text: &str) -> u64 {
    count_message(Counting::new("", encoding), SUMMARY_COUNTED_AS, text, None)
}

/// Counts a text (MEM.COUNT) and records the time it took.
pub fn count_text(encoding: Encoding, text: &str) -> u64 {
    let start = Instant::now();
    let tokens = encoding.count(text);
    stats::add(&stats::TOKENIZER_MICROS, start.elapsed().as_micros() as u64);
    stats::add(&stats::TOKENIZER_CALLS, 1);
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_equal_tiktoken() {
        let texts = [
            "hello world",
            "  leading and trailing  \n\n",
            "fn main() { println!(\"{}\", 1234567); }",
            "我们在 Redis 里保存对话记忆。",
            "I'm sure they'll've DONE it's",
            "émoji 🎉🎉 and tabs\t\tend",
        ];
        let o = tiktoken_rs::o200k_base().unwrap();
        let c = tiktoken_rs::cl100k_base().unwrap();
        for t in texts {
            assert_eq!(
                Encoding::O200kBase.count(t),
                o.encode_ordinary(t).len() as u64,
                "{t:?}"
            );
            assert_eq!(
                Encoding::Cl100kBase.count(t),
                c.encode_ordinary(t).len() as u64,
                "{t:?}"
            );
        }
    }

    #[test]
    fn cached_counts_equal_uncached_ones() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(50)
            + "fn main() { let x = 42; } 我们在 Redis 里 🎉 "
            + &"abcdefghijklmnopqrstuvwxyz0123456789".repeat(3);
        for e in Encoding::ALL {
            let plain = e.bpe().count(text.as_str()) as u64;
            assert_eq!(e.count(&text), plain, "first pass (filling the cache)");
            assert_eq!(e.count(&text), plain, "second pass (from the cache)");
        }
    }

    #[test]
    fn message_accounting_adds_framing_and_role() {
        let e = Encoding::O200kBase;
        let c = Counting::new("gpt-4o", e);
        assert_eq!(message_tokens(c, "user", "", None), 3 + e.count("user"));
        assert_eq!(
            message_tokens(c, SUMMARY_COUNTED_AS, "abc", None),
            3 + e.count("system") + e.count("abc")
        );
    }

    /// Each open-weight encoding beside the tiktoken crate's own encoder of
    /// its vocabulary.
    fn open_weight_references() -> impl Iterator<Item = (Encoding, &'static tiktoken::CoreBpe)> {
        Encoding::ALL.into_iter().filter_map(|e| {
            let name = match e {
                Encoding::O200kBase | Encoding::Cl100kBase => return None,
                Encoding::Tekken => "mistral_v3",
                other => other.name(),
            };
            Some((e, tiktoken::get_encoding(name).expect(name)))
        })
    }

    /// The tiktoken crate's own (independent) BPE and pre-tokenizer, pinned
    /// by its authors to each vendor's tokenizer: a check that the
    /// vocabularies were taken over whole and in rank order.
    #[test]
    fn open_weight_counts_equal_the_tiktoken_crate() {
        let texts = [
            "hello world",
            "  leading and trailing  \n\n",
            "fn main() { println!(\"{}\", 1234567); }\n    let x = vec![1, 2, 3];",
            "我们在 Redis 里保存对话记忆。大型语言模型的上下文窗口是有限的",
            "今日はいい天気ですね。カタカナとひらがな",
            "I'm sure they'll've DONE it's",
            "émoji 🎉🎉 and tabs\t\tend 👩‍👩‍👧‍👦",
            "https://example.com/a/b?c=1&d=2 ./path/to\n/file",
            "3.14159 1e-9 v1.2.3 2024-12-01 +86 138 0013 8000",
            "   \n\n\t  x  \r\n",
            // Tokens merging never produces (Llama 3, GLM, Tekken have some)
            // are one token when a piece is exactly one.
            ". Tiếng Việt có dấu: Xin chào thế giới. Người Việt",
        ];
        for (e, reference) in open_weight_references() {
            for t in texts {
                assert_eq!(
                    e.count(t),
                    reference.count(t) as u64,
                    "{} on {t:?}",
                    e.name()
                );
            }
        }
    }

    /// Words built of tokens added to a vocabulary after its training (a
    /// token's last merge joins a part ranked after it: Llama 3, GLM-4,
    /// GLM-5), and random strings of each vocabulary's own tokens, against
    /// the tiktoken crate's rank-order merging. bpe's backtracking encoder
    /// undercounted 2-9 in 10,000 such strings (Llama 3 `література`: 2,
    /// tiktoken 4).
    #[test]
    fn open_weight_counts_equal_rank_order_merging_on_their_own_tokens() {
        let words = [
            "література",
            " качели",
            " elektrikiot",
            "ческу",
            " rappresentaacr",
            // One piece of 400 and of 1,200 bytes: counted by the same
            // merge at any length.
            &"література".repeat(20),
            &"ческу".repeat(120),
        ];
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9E37_79B9_7F4A_7C15);
        for (e, reference) in open_weight_references() {
            let bpe = e.bpe().bpe.encoding();
            let tokens: Vec<&str> = (0..bpe.num_tokens() as u32)
                .filter_map(|id| std::str::from_utf8(bpe.token_bytes(id)).ok())
                .collect();
            let random: Vec<String> = (0..10_000)
                .map(|_| {
                    (0..rng.gen_range(2..5))
                        .map(|_| tokens[rng.gen_range(0..tokens.len())])
                        .collect()
                })
                .collect();
            let mut differ = Vec::new();
            for t in words.iter().map(|w| w.to_string()).chain(random) {
                // Qwen's tokenizer normalizes to NFC first; the crate leaves it to the caller.
                let normalized = e.bpe().normalize(&t);
                let (ours, theirs) = (e.count(&t), reference.count(normalized.as_str()) as u64);
                if ours != theirs {
                    differ.push(format!("{t:?}: {ours} vs {theirs}"));
                }
            }
            assert!(differ.is_empty(), "{}: {differ:?}", e.name());
        }
    }

    /// Every encoding counts with its counting tables only
    /// (`counting_tables`): each token they hold still encodes to itself.
    #[test]
    fn every_encoding_s_counting_tables_count_each_token_as_one() {
        for e in Encoding::ALL {
            let bpe = e.bpe().bpe.encoding();
            assert!(bpe.num_tokens() > 100_000, "{}", e.name());
            for id in 0..bpe.num_tokens() as u32 {
                assert_eq!(bpe.count(bpe.token_bytes(id)), 1, "{} token {id}", e.name());
            }
            // Every byte UTF-8 text can hold is a token of its own: bpe's
            // heap encoder (`Bpe::count` where the rank order is broken)
            // looks each part it ends with up and panics on a missing one.
            let singles: std::collections::HashSet<&[u8]> = (0..bpe.num_tokens() as u32)
                .map(|id| bpe.token_bytes(id))
                .filter(|t| t.len() == 1)
                .collect();
            for b in (0..=0xF4u8).filter(|b| !matches!(b, 0xC0 | 0xC1)) {
                assert!(singles.contains(&[b][..]), "{} byte {b:#x}", e.name());
            }
        }
    }

    #[test]
    fn encoding_names_round_trip() {
        for e in Encoding::ALL {
            assert_eq!(Encoding::from_name(e.name()), Some(e));
        }
        assert_eq!(Encoding::from_name("p50k_base"), None);
    }
}
