//! Building an encoding's counter, the first time something needs it.
//!
//! OpenAI's two encodings come from bpe-openai's tables, less those counting
//! never reads (build.rs writes them: `openai_tables`). The open-weight ones are built here from the vocabularies
//! the `tiktoken` crate (4.x) ships, compressed, inside the module: the
//! tokens in rank order go to `bpe`'s `BytePairEncoding::from_dictionary`,
//! the linear-time, panic-free counter bpe-openai is built on, and the
//! vendor's pre-tokenizer is [`super::split`]. Nothing is read or fetched at
//! run time. A build takes 1-2 s and 25-45 MB, on a worker thread: the first
//! command that needs an encoding waits for it as it would for a large count.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use bpe_openai::byte_pair_encoding::BytePairEncoding;
use bpe_openai::{Normalizable, NormalizedString};
use either::Either;

use super::openai_tables;
use super::piece_count::MERGE_MAX_BYTES;
use super::pretokenize::{self, Pattern};
use super::split::{Splitter, Stage};
use super::split_patterns as patterns;
use super::Encoding;

/// What `Encoding::count` works with: a byte-pair encoding and the
/// encoding's pre-tokenizer and normalization.
pub struct Counter {
    pub bpe: Bpe,
    pre: Pre,
    nfc: bool,
}

/// bpe's encoding, and the tokens it cannot hold: those merging never
/// produces, which tiktoken (and HuggingFace's `ignore_merges`, Llama 3's
/// setting) still yields for a piece that is exactly such a token.
pub struct Bpe {
    encoding: &'static BytePairEncoding,
    whole: rustc_hash::FxHashSet<Box<[u8]>>,
    /// Some token's last merge joins a part ranked after the token itself
    /// (Llama 3, GLM-4, GLM-5: tokens added to a vocabulary after its
    /// training). bpe's backtracking encoder cannot represent that merge
    /// order (it takes such a token as a base one) and undercounted words
    /// that hold one (Llama 3 `література`: 2 tokens, tiktoken 4; the word
    /// 20 times over, one piece of 400 bytes: 59, tiktoken 80), so these
    /// vocabularies count pieces by plain rank-order merging (bpe's heap
    /// encoder: exact, O(n log n), ~0.2 us a byte on any shape), up to
    /// `MERGE_MAX_BYTES` (the default `mem.max-message-bytes`): its heap
    /// holds ~17 bytes a byte of the piece (in the module's region:
    /// `Encoding::count`). A longer
    /// piece (only where an operator raised the limit) is counted by the
    /// backtracking encoder, and may undercount such tokens.
    rank_order_broken: bool,
}

impl Bpe {
    /// bpe's tables (OpenAI's encodings: counting's only, `openai_tables`).
    pub fn encoding(&self) -> &'static BytePairEncoding {
        self.encoding
    }

    pub fn count(&self, piece: &[u8]) -> usize {
        if !self.whole.is_empty() && self.whole.contains(piece) {
            return 1;
        }
        if self.rank_order_broken && piece.len() <= MERGE_MAX_BYTES {
            self.encoding.encode_via_bitfield(piece).len()
        } else {
            self.encoding.count(piece)
        }
    }
}

enum Pre {
    /// OpenAI's encodings: the hand-written pre-tokenizers.
    OpenAi(Pattern),
    Own(Splitter),
}

impl Counter {
    pub fn normalize<'a>(&self, text: &'a str) -> NormalizedString<'a> {
        text.normalize(self.nfc)
    }

    pub fn split<'a>(&'a self, text: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        match &self.pre {
            Pre::OpenAi(p) => Either::Left(pretokenize::pieces(*p, text).into_iter()),
            Pre::Own(s) => Either::Right(s.split(text)),
        }
    }

    /// The count without the piece cache.
    pub fn count(&self, text: &str) -> usize {
        let text = self.normalize(text);
        self.split(text.as_str())
            .map(|p| self.bpe.count(p.as_bytes()))
            .sum()
    }
}

/// Where an encoding stands, for INFO mem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Unloaded,
    Loading,
    Loaded,
    /// The build failed (never expected: every vocabulary is built by the
    /// unit tests); commands needing it are refused.
    Failed,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Unloaded => "unloaded",
            State::Loading => "loading",
            State::Loaded => "loaded",
            State::Failed => "failed",
        }
    }
}

struct Slot {
    counter: OnceLock<Option<Counter>>,
    state: AtomicU8,
    bytes: AtomicU64,
    micros: AtomicU64,
}

const N: usize = Encoding::ALL.len();

static SLOTS: [Slot; N] = [const {
    Slot {
        counter: OnceLock::new(),
        state: AtomicU8::new(0),
        bytes: AtomicU64::new(0),
        micros: AtomicU64::new(0),
    }
}; N];

fn slot(e: Encoding) -> &'static Slot {
    // `Encoding as usize` is below N by construction (ALL lists every variant).
    &SLOTS[e as usize % N]
}

/// The counter of `e`, built now (blocking) if it is not yet. Callers on the
/// main thread check [`is_loaded`] first and otherwise wait on the pool.
pub fn counter(e: Encoding) -> &'static Counter {
    match load(e) {
        Some(c) => c,
        // Unreachable in practice (the unit tests build every encoding);
        // commands check `state` first and refuse a failed encoding. Never a
        // panic inside Redis: one token a byte counts instead (never fewer
        // than any encoding's count).
        None => {
            static FALLBACK: OnceLock<Counter> = OnceLock::new();
            FALLBACK.get_or_init(byte_counter)
        }
    }
}

/// One token a byte, split as o200k_base: what counts if an encoding's
/// build failed.
fn byte_counter() -> Counter {
    let bytes = (0..=u8::MAX).map(|b| vec![b]);
    let encoding = BytePairEncoding::from_dictionary(bytes, None);
    openai_counter(Box::leak(Box::new(encoding)), Pattern::O200k)
}

/// The counter of one of OpenAI's encodings: its tables, its hand-written
/// split; no normalization, every token produced by merging (no `whole`
/// ones), the rank order kept (`openai_vocabularies_keep_their_rank_order`).
fn openai_counter(encoding: &'static BytePairEncoding, pattern: Pattern) -> Counter {
    Counter {
        bpe: Bpe {
            encoding,
            whole: Default::default(),
            rank_order_broken: false,
        },
        pre: Pre::OpenAi(pattern),
        nfc: false,
    }
}

/// Builds `e` if needed; None if its build failed.
pub fn load(e: Encoding) -> Option<&'static Counter> {
    let s = slot(e);
    let mut built_now = false;
    let counter = s
        .counter
        .get_or_init(|| {
            s.state.store(1, Ordering::Release);
            let start = std::time::Instant::now();
            // The tables live outside Redis's allocator (module_memory.rs).
            let (built, bytes) = crate::module_memory::for_module(|| {
                crate::alloc_meter::measure(|| crate::guard::or(None, || build(e)))
            });
            s.micros
                .store(start.elapsed().as_micros() as u64, Ordering::Relaxed);
            s.bytes.store(bytes, Ordering::Relaxed);
            s.state
                .store(if built.is_some() { 2 } else { 3 }, Ordering::Release);
            built_now = true;
            built
        })
        .as_ref();
    // Once the counter is published: the state says loaded from the store
    // above, and a command must find it so (not wait on the smaps read).
    if built_now {
        super::resident::release_file_pages();
    }
    counter
}

pub fn is_loaded(e: Encoding) -> bool {
    matches!(slot(e).counter.get(), Some(Some(_)))
}

pub fn state(e: Encoding) -> State {
    match slot(e).state.load(Ordering::Acquire) {
        0 => State::Unloaded,
        1 => State::Loading,
        2 => State::Loaded,
        _ => State::Failed,
    }
}

/// (bytes the encoding's tables hold, microseconds its build took).
pub fn footprint(e: Encoding) -> (u64, u64) {
    let s = slot(e);
    (
        s.bytes.load(Ordering::Relaxed),
        s.micros.load(Ordering::Relaxed),
    )
}

fn build(e: Encoding) -> Option<Counter> {
    let Some(def) = definition(e) else {
        let pattern = e.openai_pattern()?;
        let tables = match e {
            Encoding::O200kBase => openai_tables::O200K_BASE,
            _ => openai_tables::CL100K_BASE,
        };
        // Lives as long as the process.
        let encoding: &'static BytePairEncoding = Box::leak(Box::new(openai_tables::read(tables)?));
        // The tables `piece_count` adds (the split's character classes, the
        // set of whole tokens) are built here too, not by a first count.
        super::pretokenize::warm_up();
        super::piece_count::prepare(encoding, e as usize);
        return Some(openai_counter(encoding, pattern));
    };
    let Reachable {
        tokens,
        whole,
        rank_order_broken,
    } = reachable(tokens_in_rank_order(&(def.vocabulary)()));
    let bpe = BytePairEncoding::from_dictionary(tokens, Some(def.hash_factor));
    // Only what counting reads: half the tables (`counting_tables`; the
    // heap encoder of a vocabulary whose rank order is broken reads the
    // index by hash too); the whole ones if that cannot be had (never
    // expected: the unit tests build every encoding so).
    let bpe = super::counting_tables::counting_only(&bpe, rank_order_broken)
        .ok()
        .and_then(|tables| openai_tables::read(&tables))
        .unwrap_or(bpe);
    let mut stages = Vec::new();
    for patterns in def.stages {
        stages.push(Stage::new(patterns).ok()?);
    }
    let splitter = Splitter::new(stages).ok()?;
    // Lives as long as the process, as bpe-openai's own tables do.
    let encoding: &'static BytePairEncoding = Box::leak(Box::new(bpe));
    let whole = whole.into_iter().map(Vec::into_boxed_slice).collect();
    Some(Counter {
        bpe: Bpe {
            encoding,
            whole,
            rank_order_broken,
        },
        pre: Pre::Own(splitter),
        nfc: def.nfc,
    })
}

/// An open-weight encoding: its vocabulary, pre-tokenizer and normalization.
struct Definition {
    vocabulary: fn() -> tiktoken::CoreBpe,
    /// Patterns of each split stage, (pattern, last character is a look-ahead).
    stages: &'static [patterns::Stage],
    nfc: bool,
    /// Makes the 32-bit token hashes of `bpe` collision-free for this
    /// vocabulary (found once with `bpe::find_hash_factor_for_dictionary`;
    /// the unit tests build every encoding with it).
    hash_factor: u64,
}

/// Each open-weight encoding's vocabulary and pre-tokenizer: a data table,
/// one arm an encoding (hence its length).
fn definition(e: Encoding) -> Option<Definition> {
    use Encoding::*;
    let d = |vocabulary, stages, nfc, hash_factor| {
        Some(Definition {
            vocabulary,
            stages,
            nfc,
            hash_factor,
        })
    };
    match e {
        O200kBase | Cl100kBase => None,
        // meta-llama/Llama-3.1-8B tokenizer (tiktoken format; cl100k_base's
        // pattern).
        Llama3 => d(
            tiktoken::encoding::llama3,
            patterns::LLAMA3,
            false,
            11_885_191_908_064_990_738,
        ),
        // deepseek-ai/DeepSeek-V3 tokenizer.json: a Sequence of three
        // Isolated splits, no normalizer.
        DeepseekV3 => d(
            tiktoken::encoding::deepseek_v3,
            patterns::DEEPSEEK_V3,
            false,
            3_138_526_707_862_123_462,
        ),
        // Qwen/Qwen2.5 tokenizer.json: NFC, then single digits.
        Qwen2 => d(
            tiktoken::encoding::qwen2,
            patterns::QWEN2,
            true,
            10_111_572_184_271_607_110,
        ),
        // zai-org/GLM-4.5 and GLM-5 tokenizer.json: cl100k_base's pattern.
        Glm4 => d(
            tiktoken::encoding::glm4,
            patterns::GLM4,
            false,
            17_216_760_580_640_435_706,
        ),
        Glm5 => d(
            tiktoken::encoding::glm5,
            patterns::GLM5,
            false,
            2_321_797_000_280_525_654,
        ),
        // moonshotai/Kimi-K2 tokenization_kimi.py: Han runs first, then
        // o200k-style words that exclude Han.
        KimiK2 => d(
            tiktoken::encoding::kimi_k2,
            patterns::KIMI_K2,
            false,
            18_171_118_807_956_516_409,
        ),
        // MiniMaxAI/MiniMax-M2 tokenizer.json: o200k_base's pattern.
        MinimaxM2 => d(
            tiktoken::encoding::minimax_m2,
            patterns::MINIMAX_M2,
            false,
            3_521_294_511_505_614_368,
        ),
        // mistral-common tekken.json (v3, 240911): no contractions, single
        // digits.
        Tekken => d(
            tiktoken::encoding::mistral_v3,
            patterns::TEKKEN,
            false,
            11_467_484_487_342_338_773,
        ),
    }
}

/// The vocabulary's ordinary tokens, lowest rank (first merged) first.
/// Special tokens (`<|im_start|>`...) are text like any other to the module:
/// they are left out, as tiktoken's `encode_ordinary` leaves them out.
fn tokens_in_rank_order(enc: &tiktoken::CoreBpe) -> Vec<Vec<u8>> {
    // Ranks may have gaps where special tokens sit between them.
    let bound = (enc.vocab_size() + enc.num_special_tokens()) as u32 + 8192;
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(enc.vocab_size());
    for id in 0..bound {
        let bytes = enc.decode(&[id]);
        if bytes.is_empty() {
            continue;
        }
        // A special token decodes too; it is one that only the special
        // matcher yields. Not only `<|...|>` and `[...]`: GLM's `/nothink`
        // is one (it was counted as one ordinary token when a piece was
        // exactly it; tiktoken's encode_ordinary gives 2).
        if let Ok(s) = std::str::from_utf8(&bytes) {
            if enc.encode(s) != [id] && enc.encode_with_special_tokens(s) == [id] {
                continue;
            }
        }
        if seen.insert(bytes.clone()) {
            out.push(bytes);
        }
    }
    out
}

/// A vocabulary split for bpe.
struct Reachable {
    /// The tokens byte-pair merging can produce, in rank order.
    tokens: Vec<Vec<u8>>,
    /// The others.
    whole: Vec<Vec<u8>>,
    /// Whether some token's last merge joins a part ranked after it.
    rank_order_broken: bool,
}

/// The tokens byte-pair merging can produce, and the others. A token that
/// merging its own bytes does not yield is never produced inside a longer
/// piece either (merges inside its span would run the same way): `bpe`
/// cannot hold it (it checks every token encodes to itself), and it counts
/// only as a whole piece ([`Bpe::count`]).
fn reachable(tokens: Vec<Vec<u8>>) -> Reachable {
    let ranks: HashMap<&[u8], usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_slice(), i))
        .collect();
    let merges: Vec<Option<(usize, usize)>> =
        tokens.iter().map(|t| last_merge(t, &ranks)).collect();
    drop(ranks);
    let rank_order_broken = merges
        .iter()
        .enumerate()
        .any(|(rank, m)| m.is_some_and(|(a, b)| a > rank || b > rank));
    let (kept, dropped): (Vec<_>, Vec<_>) = tokens
        .into_iter()
        .zip(merges)
        .partition(|(_, m)| m.is_some());
    Reachable {
        tokens: kept.into_iter().map(|(t, _)| t).collect(),
        whole: dropped.into_iter().map(|(t, _)| t).collect(),
        rank_order_broken,
    }
}

/// Plain byte-pair merging of `token`'s bytes (lowest rank first, leftmost
/// on ties): if it ends as the one token, the ranks of the two parts its last
/// merge joined (a single byte: its own rank twice).
fn last_merge(token: &[u8], ranks: &HashMap<&[u8], usize>) -> Option<(usize, usize)> {
    if token.len() <= 1 {
        let rank = ranks.get(token).copied().unwrap_or(0);
        return Some((rank, rank));
    }
    // Boundaries between the current parts.
    let mut cuts: Vec<usize> = (0..=token.len()).collect();
    loop {
        if cuts.len() == 3 {
            let part = |a: usize, b: usize| {
                cuts.get(a)
                    .zip(cuts.get(b))
                    .and_then(|(&x, &y)| token.get(x..y))
                    .and_then(|p| ranks.get(p).copied())
            };
            // The last merge, if the whole is a token: its parts' ranks.
            return ranks
                .get(token)
                .map(|_| (part(0, 1).unwrap_or(0), part(1, 2).unwrap_or(0)));
        }
        let mut best: Option<(usize, usize)> = None;
        for i in 0..cuts.len().saturating_sub(2) {
            let pair = cuts
                .get(i)
                .zip(cuts.get(i + 2))
                .and_then(|(&a, &b)| token.get(a..b));
            if let Some(&rank) = pair.and_then(|p| ranks.get(p)) {
                if best.is_none_or(|(r, _)| rank < r) {
                    best = Some((rank, i));
                }
            }
        }
        match best {
            Some((_, i)) => {
                cuts.remove(i + 1);
            }
            None => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fallback_counts_one_token_a_byte() {
        let c = super::byte_counter();
        for text in ["hello world", "我们在 Redis 里", "🎉 x\n\n  "] {
            assert_eq!(c.count(text), text.len(), "{text:?}");
        }
    }

    /// OpenAI's counting tables count every piece by the backtracking
    /// encoder, exact only while no token's last merge joins a part ranked
    /// after it, and every token is reachable by merging (`Reachable`).
    #[test]
    fn openai_vocabularies_keep_their_rank_order() {
        for t in [bpe_openai::o200k_base(), bpe_openai::cl100k_base()] {
            let tokens: Vec<Vec<u8>> = (0..t.bpe.num_tokens() as u32)
                .map(|i| t.bpe.token_bytes(i).to_vec())
                .collect();
            let r = super::reachable(tokens);
            assert_eq!(r.tokens.len(), t.bpe.num_tokens());
            assert!(r.whole.is_empty());
            assert!(!r.rank_order_broken);
        }
    }
}
