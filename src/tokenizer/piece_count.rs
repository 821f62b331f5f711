//! The counting loop behind `Encoding::count` for OpenAI's encodings: split
//! the text into pieces (the hand-written pre-tokenizer), count a one-byte
//! piece 1, look each other piece up in a per-thread cache of exact counts;
//! a piece the cache lacks is, at 2-16 bytes, looked up and merged in the
//! tables of the short tokens (short_bpe.rs), and otherwise looked up in the
//! encoding's set of whole tokens (count 1) and counted by BPE.
//!
//! Kept free of Redis types so that benches/tokenizer.rs measures this very
//! code (it includes the file).

use bpe_openai::byte_pair_encoding::BytePairEncoding;

use super::pretokenize::{self, Pattern};
use super::short_bpe::{load_le, ShortRanks};

/// Exact token count of `text` (OpenAI's encodings do not normalize): the
/// sum of the BPE counts of its pieces, as `bpe_openai::Tokenizer::count`.
/// `cache` picks the per-thread cache (one per encoding: a count depends on
/// the piece and the vocabulary).
pub fn count(bpe: &'static BytePairEncoding, pattern: Pattern, cache: usize, text: &str) -> usize {
    // Only where there is no cache (below) does a piece longer than the
    // long-piece cache's get here.
    let uncached = |piece: &[u8]| {
        if piece.len() > LONG_PIECE_BYTES {
            token_set(bpe, cache).count_longest(piece, hash(piece), |p| bpe.count(p))
        } else {
            bpe.count(piece)
        }
    };
    let counted = PIECE_CACHES.try_with(|caches| {
        let Ok(mut caches) = caches.try_borrow_mut() else {
            // Re-entered on this thread (cannot happen today): count uncached.
            return split_sum(pattern, text, uncached);
        };
        if caches.len() <= cache {
            crate::module_memory::for_module(|| caches.resize_with(cache + 1, || None));
        }
        match caches.get_mut(cache) {
            Some(slot) => {
                // 512 KB-2 MB a thread and encoding: the module's own memory.
                let cache = slot.get_or_insert_with(|| {
                    crate::module_memory::for_module(|| PieceCache::new(token_set(bpe, cache)))
                });
                cache.count_text(pattern, text, uncached)
            }
            None => split_sum(pattern, text, uncached),
        }
    });
    // The thread's caches are gone only while the thread exits.
    counted.unwrap_or_else(|_| split_sum(pattern, text, uncached))
}

/// Sum of `count_piece` over the pieces of `text`.
#[inline(always)]
fn split_sum(pattern: Pattern, text: &str, mut count_piece: impl FnMut(&[u8]) -> usize) -> usize {
    let mut total = 0;
    pretokenize::for_each_piece(pattern, text, |piece| total += count_piece(piece));
    total
}

/// Pieces up to this many bytes are cached in the sets (words, mostly);
/// longer ones up to `LONG_PIECE_BYTES` in the long-piece cache.
const CACHED_PIECE_BYTES: usize = 14;
/// Sets of four slots, one 64-byte cache line each: 512 KB at first.
const FIRST_SETS: usize = 8192;
/// 2 MB, once a thread has missed as many pieces as the first sets hold.
const MOST_SETS: usize = 32768;
const WAYS: usize = 4;

/// A four-way set-associative cache of exact piece counts: no allocation per
/// lookup, least recently used evicted first. A count depends only on the
/// piece's bytes, so a hit is exactly what encoding the piece would give. A
/// miss asks the encoding's `TokenSet` (a piece that is one token counts 1),
/// then BPE.
///
/// 512 KB a thread and encoding, 32,768 pieces, at first (the words of real
/// English prose fit; a direct-mapped 4,096 thrashed). A thread whose texts
/// have more distinct pieces than that (12,000 licence texts and changelogs
/// have 60,907) misses for ever, each miss ~1 us of BPE: it has missed
/// 32,768 pieces when the cache grows to 2 MB (131,072 pieces), once, its
/// pieces moved over. There those texts count at 85-91 MB/s warm against
/// 54-57 in 512 KB; a thread that counts little keeps 512 KB.
struct PieceCache {
    tokens: &'static TokenSet,
    /// A power of two of them.
    sets: Box<[Set]>,
    /// Pieces missed: at `FIRST_SETS * WAYS` the sets grow to `MOST_SETS`.
    misses: usize,
    /// Made on the first long piece (128 KB).
    long: Option<Box<[LongSlot]>>,
    /// A chunk's cached pieces (`count_text`): key and hash.
    keyed: Option<Box<[(PieceKey, u64); pretokenize::MAX_CHUNK_ENDS]>>,
    /// A chunk's piece ends, as the split writes them (`count_text`; taken
    /// while it runs).
    ends: Option<Box<pretokenize::ChunkEnds>>,
}

const EMPTY_SLOT: Slot = Slot { key: [0; 2] };

fn empty_sets(n: usize) -> Box<[Set]> {
    vec![
        Set {
            ways: [EMPTY_SLOT; WAYS]
        };
        n
    ]
    .into_boxed_slice()
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Set {
    /// Most recently used first.
    ways: [Slot; WAYS],
}

/// A cached piece: its [`PieceKey`] with the count in the top byte (a key
/// of length 0 is an empty slot: empty pieces are never cached).
#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    key: PieceKey,
}

/// A piece of 1 to [`CACHED_PIECE_BYTES`] bytes as two words: its bytes,
/// zero-padded, and its length in byte 14. A slot compares and hashes it
/// whole, with no loop over the bytes.
type PieceKey = [u64; 2];

const COUNT_SHIFT: u32 = 56;
const LEN_SHIFT: u32 = 48;

/// The key of the piece `text[start..end]` (1 to [`CACHED_PIECE_BYTES`]
/// bytes).
#[inline(always)]
fn piece_key(text: &[u8], start: usize, end: usize) -> PieceKey {
    let len = end.wrapping_sub(start);
    // Sixteen bytes from the piece's start, those past it masked off; near
    // the text's end, its bytes alone.
    let bytes = match text.get(start..start.wrapping_add(16)) {
        Some(chunk) => <[u8; 16]>::try_from(chunk).map_or(0, u128::from_le_bytes),
        None => load_le(text.get(start..end).unwrap_or_default()),
    } & KEY_MASKS[len & 15];
    [
        bytes as u64,
        (bytes >> 64) as u64 | ((len as u64) << LEN_SHIFT),
    ]
}

/// The mask of a piece's first `len` bytes of sixteen, by `len`.
const KEY_MASKS: [u128; 16] = {
    let mut masks = [0u128; 16];
    let mut len = 1;
    while len < 16 {
        masks[len] = u128::MAX >> (128 - 8 * len);
        len += 1;
    }
    masks
};

/// The bytes of the piece whose key is `key`.
#[inline(always)]
fn key_bytes(key: &PieceKey) -> ([u8; 16], usize) {
    let len = ((key[1] >> LEN_SHIFT) & 0xff) as usize;
    let bits = u128::from(key[0]) | (u128::from(key[1] & ((1 << LEN_SHIFT) - 1)) << 64);
    (bits.to_le_bytes(), len.min(CACHED_PIECE_BYTES))
}

#[inline(always)]
fn key_hash(key: &PieceKey) -> u64 {
    let h = (key[0] ^ key[1].rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

impl Slot {
    #[inline(always)]
    fn holds(&self, key: &PieceKey) -> bool {
        self.key[0] == key[0] && self.key[1] & !(0xff << COUNT_SHIFT) == key[1]
    }

    fn is_empty(&self) -> bool {
        (self.key[1] >> LEN_SHIFT) & 0xff == 0
    }

    fn count(&self) -> usize {
        (self.key[1] >> COUNT_SHIFT) as usize
    }

    fn bare_key(&self) -> PieceKey {
        [self.key[0], self.key[1] & !(0xff << COUNT_SHIFT)]
    }
}

impl PieceCache {
    fn new(tokens: &'static TokenSet) -> PieceCache {
        PieceCache {
            tokens,
            sets: empty_sets(FIRST_SETS),
            misses: 0,
            long: None,
            keyed: Some(Box::new([([0; 2], 0); pretokenize::MAX_CHUNK_ENDS])),
            ends: Some(Box::new([0; pretokenize::MAX_CHUNK_ENDS])),
        }
    }

    /// The sets of [`MOST_SETS`], holding every piece the first ones did.
    #[cold]
    fn grow(&mut self) {
        let mut sets = crate::module_memory::for_module(|| empty_sets(MOST_SETS));
        // Least recently used first, so that each set's ways end in order.
        for set in self.sets.iter() {
            for slot in set.ways.iter().rev() {
                if slot.is_empty() {
                    continue;
                }
                let h = key_hash(&slot.bare_key());
                if let Some(to) = sets.get_mut(h as usize & (MOST_SETS - 1)) {
                    to.ways.rotate_right(1);
                    to.ways[0] = *slot;
                }
            }
        }
        self.sets = sets;
    }

    /// The count of `text`, a chunk of pieces at a time: the sets of all the
    /// chunk's pieces are asked of memory first, then read (a set is a miss
    /// in L2 for most first-seen and rare pieces), and the two loops branch
    /// less than one piece at a time did: a piece of one byte is looked up
    /// like any other (a test of its length, true for a quarter of the pieces
    /// at random, cost more than the lookup it saved).
    #[inline]
    fn count_text(
        &mut self,
        pattern: Pattern,
        text: &str,
        uncached: impl Fn(&[u8]) -> usize,
    ) -> usize {
        if self.misses >= FIRST_SETS * WAYS && self.sets.len() < MOST_SETS {
            self.grow();
        }
        let mut total = 0;
        let b = text.as_bytes();
        // Kept by the cache: arrays on the stack were cleared on every call.
        let mut keyed = self
            .keyed
            .take()
            .unwrap_or_else(|| Box::new([([0; 2], 0); pretokenize::MAX_CHUNK_ENDS]));
        let mut chunk_ends = self
            .ends
            .take()
            .unwrap_or_else(|| Box::new([0; pretokenize::MAX_CHUNK_ENDS]));
        // (Indices masked by MAX_CHUNK_ENDS - 1, a power of two no chunk
        // reaches, need no bounds check.)
        const LAST: usize = pretokenize::MAX_CHUNK_ENDS - 1;
        pretokenize::for_each_chunk_in(pattern, text, &mut chunk_ends, |mut start, ends| {
            // (A sum of the chunk's own stays in a register; `total`,
            // captured, was added to in memory a piece at a time.)
            let mut sum = 0;
            let mut n = 0;
            for &end in ends {
                if end - start > CACHED_PIECE_BYTES {
                    let piece = b.get(start..end).unwrap_or_default();
                    sum += self.count_long(piece, hash(piece), &uncached);
                } else {
                    let key = piece_key(b, start, end);
                    let h = key_hash(&key);
                    self.prefetch(h);
                    keyed[n & LAST] = (key, h);
                    n += 1;
                }
                start = end;
            }
            for &(key, h) in keyed.get(..n).unwrap_or_default() {
                sum += self.count_keyed(&key, h, &uncached);
            }
            total += sum;
        });
        self.keyed = Some(keyed);
        self.ends = Some(chunk_ends);
        total
    }

    /// Starts loading the set of the piece whose hash is `h`.
    #[inline(always)]
    fn prefetch(&self, h: u64) {
        let at = self.sets.get(h as usize & self.sets.len().wrapping_sub(1));
        #[cfg(target_arch = "x86_64")]
        if let Some(set) = at {
            // SAFETY: a prefetch is a hint: it reads nothing the program sees
            // and cannot fault (the pointer is to a live set besides). SSE is
            // part of every x86_64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    (set as *const Set).cast::<i8>(),
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = at;
    }

    #[cfg(test)]
    fn count(&mut self, piece: &[u8], uncached: impl Fn(&[u8]) -> usize) -> usize {
        if self.misses >= FIRST_SETS * WAYS && self.sets.len() < MOST_SETS {
            self.grow();
        }
        if piece.len() > CACHED_PIECE_BYTES {
            return self.count_long(piece, hash(piece), uncached);
        }
        let key = piece_key(piece, 0, piece.len());
        self.count_keyed(&key, key_hash(&key), uncached)
    }

    /// The count of `piece` (at most [`CACHED_PIECE_BYTES`]), whose key is
    /// `key` and its hash `h`. The sets grow only between texts (a prefetched
    /// set must stay where it was asked for).
    #[inline]
    fn count_keyed(&mut self, key: &PieceKey, h: u64, uncached: impl Fn(&[u8]) -> usize) -> usize {
        let mask = self.sets.len().wrapping_sub(1);
        match self.sets.get(h as usize & mask) {
            Some(Set { ways: [first, ..] }) if first.holds(key) => first.count(),
            _ => self.count_keyed_further(key, h, uncached),
        }
    }

    /// [`PieceCache::count_keyed`] past the most recently used way (kept
    /// out of the loop of lookups, whose registers it took).
    #[inline(never)]
    fn count_keyed_further(
        &mut self,
        key: &PieceKey,
        h: u64,
        uncached: impl Fn(&[u8]) -> usize,
    ) -> usize {
        let mask = self.sets.len().wrapping_sub(1);
        let (bytes, len) = key_bytes(key);
        let piece = bytes.get(..len).unwrap_or_default();
        let Some(set) = self.sets.get_mut(h as usize & mask) else {
            return uncached(piece);
        };
        let ways = &mut set.ways;
        for k in 0..WAYS {
            let Some(slot) = ways.get(k) else { break };
            if slot.holds(key) {
                let count = slot.count();
                if let Some(used) = ways.get_mut(..=k) {
                    used.rotate_right(1); // to the front
                }
                return count;
            }
        }
        self.misses = self.misses.saturating_add(1);
        let count = self.tokens.count(piece, hash(piece), uncached);
        // A piece of n bytes has at most n tokens, so the count fits a u8.
        if let Ok(count8) = u8::try_from(count) {
            ways.rotate_right(1); // the least recently used is now first: replace it
            ways[0] = Slot {
                key: [key[0], key[1] | (u64::from(count8) << COUNT_SHIFT)],
            };
        }
        count
    }
}

impl PieceCache {
    /// Long pieces: rarer words, runs of one character (indentation, `----` rules, table
    /// borders of Markdown and ASCII art) recur in chat text and cost BPE
    /// ~10x a word; up to `LONG_PIECE_BYTES` they have a small cache of their own.
    #[cold]
    fn count_long(&mut self, piece: &[u8], h: u64, uncached: impl Fn(&[u8]) -> usize) -> usize {
        let len = piece.len();
        if len > LONG_PIECE_BYTES {
            return self.tokens.count_longest(piece, h, uncached);
        }
        let long = self.long.get_or_insert_with(|| {
            crate::module_memory::for_module(|| {
                vec![
                    LongSlot {
                        len: 0,
                        count: 0,
                        bytes: [0; LONG_PIECE_BYTES]
                    };
                    LONG_SLOTS
                ]
                .into_boxed_slice()
            })
        });
        let Some(slot) = long.get_mut((h as usize) % LONG_SLOTS) else {
            return uncached(piece);
        };
        if usize::from(slot.len) == len && slot.bytes.get(..len) == Some(piece) {
            return usize::from(slot.count);
        }
        let count = self.tokens.count(piece, h, uncached);
        if let (Ok(count8), Some(dst)) = (u8::try_from(count), slot.bytes.get_mut(..len)) {
            dst.copy_from_slice(piece);
            slot.len = len as u8;
            slot.count = count8;
        }
        count
    }
}

const LONG_PIECE_BYTES: usize = 126;
/// The longest piece [`TokenSet::merge_count`] (and, for the open-weight
/// vocabularies that need it, bpe's heap encoder) counts: the default
/// `mem.max-message-bytes`. Their heaps and links hold ~17 bytes a byte of
/// the piece (70 MB for 4 MB, in the module's region: `Encoding::count`); a
/// longer piece, only where an operator raised the limit, goes to bpe's
/// backtracking encoder (~1.5 bytes a byte, up to ~1 us a byte in time).
pub const MERGE_MAX_BYTES: usize = 4 << 20;

const LONG_SLOTS: usize = 1024;

/// A cached long piece: 128 bytes.
#[derive(Clone, Copy)]
struct LongSlot {
    len: u8,
    count: u8,
    bytes: [u8; LONG_PIECE_BYTES],
}

/// Every token of an encoding, by its bytes: an open-addressing table of
/// (hash tag, token id), the bytes compared in the encoding's own token
/// storage. A piece that is one token counts 1, exactly as tiktoken, which
/// looks a piece up whole before merging. Built once per encoding (~20 ms;
/// 2 MB for o200k_base, 1 MB for cl100k_base), shared by every thread.
pub struct TokenSet {
    bpe: Option<&'static BytePairEncoding>,
    /// `tag << 24 | id`; 0 is empty (tags are never 0).
    entries: Box<[u32]>,
    mask: usize,
    /// The short tokens by their bytes, for BPE of short pieces.
    short: Option<ShortRanks>,
}

/// Token ids the entries can hold; tokens past it are left to BPE (none in
/// any vocabulary today).
const MAX_ID: usize = 1 << 24;

impl TokenSet {
    fn build(bpe: &'static BytePairEncoding) -> TokenSet {
        let n = bpe.num_tokens().min(MAX_ID);
        let size = (n * 2).next_power_of_two().max(2);
        let mask = size - 1;
        let mut entries = vec![0u32; size].into_boxed_slice();
        for id in 0..n as u32 {
            let h = hash(bpe.token_bytes(id));
            let mut i = (h as usize) & mask;
            // The table is at most half full: an empty entry is always found.
            for _ in 0..size {
                match entries.get_mut(i) {
                    Some(e) if *e == 0 => {
                        *e = (tag(h) << 24) | id;
                        break;
                    }
                    _ => i = (i + 1) & mask,
                }
            }
        }
        TokenSet {
            bpe: Some(bpe),
            entries,
            mask,
            short: ShortRanks::build(bpe),
        }
    }

    /// The count of a piece no cache holds (`h` its hash): 1 if it is one
    /// token, else tiktoken's merge over the short tokens for a piece of 2 to
    /// 16 bytes (one table both asks whether it is a token and merges it: one
    /// wait on memory where the set and the token's bytes took two more), else
    /// `uncached`.
    #[inline]
    fn count(&self, piece: &[u8], h: u64, uncached: impl Fn(&[u8]) -> usize) -> usize {
        if let Some(n) = self.short.as_ref().and_then(|s| s.count(piece)) {
            return n;
        }
        if self.contains(piece, h) {
            1
        } else {
            uncached(piece)
        }
    }

    /// The count of a piece longer than the long-piece cache holds: 1 if it
    /// is one token, else tiktoken's merge ([`TokenSet::merge_count`]).
    /// bpe's backtracking encoder, which counts shorter pieces, costs up to
    /// ~0.8 us a byte on runs of one punctuation character (o200k_base:
    /// `-` x 16,383, 12.6 ms; hostile pass 46), the merge 0.1-0.2 us on
    /// any shape; up to 126 bytes the encoder is at most ~0.08 us a byte and
    /// 4x the merge's speed on the pieces text has (docs/PERFORMANCE.md).
    /// Past [`MERGE_MAX_BYTES`], `uncached`.
    #[cold]
    fn count_longest(&self, piece: &[u8], h: u64, uncached: impl Fn(&[u8]) -> usize) -> usize {
        if self.bpe.is_none() || piece.len() > MERGE_MAX_BYTES {
            uncached(piece)
        } else if self.contains(piece, h) {
            1
        } else {
            self.merge_count(piece)
        }
    }

    /// tiktoken's count of `piece` by its own loop (`_byte_pair_merge`:
    /// merge the adjacent parts whose bytes are the lowest-ranked token, the
    /// leftmost of equals, until no two make a token), the lowest found by
    /// a heap instead of a scan: O(n log n) on any input, where tiktoken's
    /// scan is quadratic. An entry is stale once either of its parts has
    /// merged since; it is skipped.
    fn merge_count(&self, piece: &[u8]) -> usize {
        use std::cmp::Reverse;
        // Never taken: `count_longest` asks only with tables and at most
        // MERGE_MAX_BYTES.
        let (Some(bpe), Ok(n)) = (self.bpe, u32::try_from(piece.len())) else {
            return piece.len();
        };
        let rank = |from: u32, to: u32| {
            let span = piece.get(from as usize..to as usize).unwrap_or_default();
            self.find(span, hash(span))
        };
        // `rank << 32 | start`: the lowest rank first, the leftmost of equal
        // ranks (the same token) first; the token's length says where the
        // pair ended.
        let entry = |rank: u32, start: u32| Reverse(u64::from(rank) << 32 | u64::from(start));
        // The parts by their first byte: where the next one starts (n: none),
        // where the one before does (u32::MAX: none), whether a part starts
        // here at all.
        let mut next: Vec<u32> = (1..=n).collect();
        let mut prev: Vec<u32> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut starts = vec![true; n as usize];
        let mut heap: std::collections::BinaryHeap<Reverse<u64>> = (0..n.saturating_sub(1))
            .filter_map(|i| rank(i, i + 2).map(|r| entry(r, i)))
            .collect();
        let mut parts = piece.len();
        while let Some(Reverse(e)) = heap.pop() {
            let (r, start) = ((e >> 32) as u32, e as u32);
            let end = start.saturating_add(bpe.token_len(r) as u32);
            let at = |v: &[u32], i: u32| v.get(i as usize).copied().unwrap_or(n);
            let mid = at(&next, start);
            // Stale once either part has merged since it was pushed.
            if starts.get(start as usize) != Some(&true) || mid >= n || at(&next, mid) != end {
                continue;
            }
            parts -= 1;
            if let Some(s) = starts.get_mut(mid as usize) {
                *s = false;
            }
            if let Some(nx) = next.get_mut(start as usize) {
                *nx = end;
            }
            if end < n {
                if let Some(p) = prev.get_mut(end as usize) {
                    *p = start;
                }
                if let Some(r) = rank(start, at(&next, end)) {
                    heap.push(entry(r, start));
                }
            }
            let before = at(&prev, start);
            if before < n {
                if let Some(r) = rank(before, end) {
                    heap.push(entry(r, before));
                }
            }
        }
        parts
    }

    /// A set that contains nothing (when the table cannot be had).
    fn empty() -> TokenSet {
        TokenSet {
            bpe: None,
            entries: vec![0u32; 1].into_boxed_slice(),
            mask: 0,
            short: None,
        }
    }

    /// Whether `piece` (whose `hash` is `h`) is one whole token.
    #[inline]
    fn contains(&self, piece: &[u8], h: u64) -> bool {
        self.find(piece, h).is_some()
    }

    /// The token `piece` is (its id: its rank), `h` its hash.
    #[inline]
    fn find(&self, piece: &[u8], h: u64) -> Option<u32> {
        let bpe = self.bpe?;
        let want = tag(h);
        let mut i = (h as usize) & self.mask;
        loop {
            let e = self.entries.get(i).copied().unwrap_or(0);
            if e == 0 {
                return None;
            }
            let id = e & 0xff_ffff;
            if e >> 24 == want && equal(bpe.token_bytes(id), piece) {
                return Some(id);
            }
            i = (i + 1) & self.mask;
        }
    }
}

/// `a == b` without a call to memcmp (tokens are a few bytes).
#[inline(always)]
fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 8 bits of the hash other than those picking the entry, never 0.
#[inline(always)]
fn tag(h: u64) -> u32 {
    ((h >> 56) as u32) | 1
}

/// Builds the token set of `bpe` (cache number `index`) now: an encoding's
/// first count then finds it ready.
pub fn prepare(bpe: &'static BytePairEncoding, index: usize) {
    let _ = token_set(bpe, index);
}

/// The token set of `bpe`, built on first use, kept for the process.
fn token_set(bpe: &'static BytePairEncoding, index: usize) -> &'static TokenSet {
    static SETS: std::sync::Mutex<Vec<Option<&'static TokenSet>>> =
        std::sync::Mutex::new(Vec::new());
    static EMPTY: std::sync::OnceLock<TokenSet> = std::sync::OnceLock::new();
    let mut sets = SETS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if sets.len() <= index {
        sets.resize(index + 1, None);
    }
    let Some(slot) = sets.get_mut(index) else {
        return EMPTY.get_or_init(TokenSet::empty);
    };
    match slot {
        Some(set) => set,
        None => {
            let set: &'static TokenSet = Box::leak(Box::new(TokenSet::build(bpe)));
            *slot = Some(set);
            set
        }
    }
}

fn hash(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = rustc_hash::FxHasher::default();
    h.write(bytes);
    h.finish()
}

thread_local! {
    /// One cache per encoding, indexed by the caller's `cache` number.
    static PIECE_CACHES: std::cell::RefCell<Vec<Option<PieceCache>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::super::openai_tables;
    #[allow(unused_imports)]
    // benches/tokenizer.rs includes this file without running its tests
    use super::*;

    /// The module's counting tables of o200k_base and cl100k_base (what
    /// build.rs wrote), each beside bpe-openai's whole tokenizer.
    fn tables() -> [(&'static BytePairEncoding, &'static bpe_openai::Tokenizer); 2] {
        static TABLES: std::sync::OnceLock<(BytePairEncoding, BytePairEncoding)> =
            std::sync::OnceLock::new();
        let (o, c) = TABLES.get_or_init(|| {
            (
                openai_tables::read(openai_tables::O200K_BASE).expect("o200k_base's tables read"),
                openai_tables::read(openai_tables::CL100K_BASE).expect("cl100k_base's tables read"),
            )
        });
        [
            (o, bpe_openai::o200k_base()),
            (c, bpe_openai::cl100k_base()),
        ]
    }

    #[test]
    fn every_token_is_in_its_token_set_and_counts_one() {
        for (i, (bpe, whole)) in tables().into_iter().enumerate() {
            let set = token_set(bpe, 10 + i);
            assert_eq!(bpe.num_tokens(), whole.bpe.num_tokens());
            for id in 0..bpe.num_tokens() as u32 {
                let bytes = bpe.token_bytes(id);
                assert_eq!(bytes, whole.bpe.token_bytes(id), "token {id}");
                assert!(set.contains(bytes, hash(bytes)), "token {id} {bytes:?}");
                assert_eq!(bpe.count(bytes), 1, "token {id}");
                // The short tables (their filter, the two-byte table, the
                // hashed ones) find every short token at its rank.
                if let Some(short) = set.short.as_ref() {
                    let rank = short.rank_of(bytes);
                    match bytes.len() {
                        2..=16 => {
                            assert!(rank == id || bpe.token_bytes(rank) == bytes, "token {id}")
                        }
                        _ => assert_eq!(rank, u32::MAX, "token {id}"),
                    }
                }
            }
            // Pieces that are not tokens are not found.
            for piece in [
                &b"antidisestablishmentarianism"[..],
                b"zqxjkvw",
                b"  \xe6\x88\x91\xe4\xbb\xac\xe5\x9c\xa8xyz",
            ] {
                assert!(!set.contains(piece, hash(piece)), "{piece:?}");
                if let Some(short) = set.short.as_ref() {
                    assert_eq!(short.rank_of(piece), u32::MAX, "{piece:?}");
                }
            }
        }
    }

    #[test]
    fn counts_equal_tiktoken_on_random_text() {
        // Random words, spaces, line breaks, digits, punctuation and non-ASCII
        // letters, counted through the split, the caches and the token set,
        // against tiktoken-rs (the oracle), twice (cold, then cached).
        const PARTS: &[&str] = &[
            " the",
            " memory",
            "Redis",
            " I'm",
            " they'll",
            "'S",
            "\n",
            "\n\n",
            "  ",
            "\t",
            "\r\n",
            "123",
            "4567",
            ".",
            ",",
            "!?",
            "//",
            " {",
            "}",
            "ſ",
            "é",
            "É",
            "ǅ",
            "\u{301}",
            "我们",
            "トークン",
            "한",
            "🎉",
            " ",
            "\u{a0}",
            "\u{3000}",
            "x",
            "ABC",
            "camelCase",
            "HTTPServer",
            "_",
            "-",
            "'",
            "'ll",
        ];
        let pairs = with_oracles([14, 15]);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let texts: Vec<String> = (0..6_000)
            .map(|_| {
                (0..1 + next(30))
                    .map(|_| PARTS[next(PARTS.len())])
                    .collect()
            })
            .collect();
        for (bpe, pattern, tik, slot) in pairs {
            assert_counts_as(tik, bpe, pattern, slot, &texts);
        }
    }

    /// o200k_base and cl100k_base: the module's tables, pattern, tiktoken-rs
    /// (the oracle) and the piece cache numbered `slots` for each.
    fn with_oracles(
        slots: [usize; 2],
    ) -> [(
        &'static BytePairEncoding,
        Pattern,
        &'static tiktoken_rs::CoreBPE,
        usize,
    ); 2] {
        let [(o200k, _), (cl100k, _)] = tables();
        [
            (
                o200k,
                Pattern::O200k,
                tiktoken_rs::o200k_base_singleton(),
                slots[0],
            ),
            (
                cl100k,
                Pattern::Cl100k,
                tiktoken_rs::cl100k_base_singleton(),
                slots[1],
            ),
        ]
    }

    /// Each of `texts` counts as `oracle` counts it, twice (cold, then from
    /// the cache `slot`).
    fn assert_counts_as(
        oracle: &tiktoken_rs::CoreBPE,
        bpe: &'static BytePairEncoding,
        pattern: Pattern,
        slot: usize,
        texts: &[String],
    ) {
        for pass in 0..2 {
            for t in texts.iter().filter(|t| !t.is_empty()) {
                assert_eq!(
                    count(bpe, pattern, slot, t),
                    oracle.encode_ordinary(t).len(),
                    "{pattern:?} pass {pass}: {t:?}"
                );
            }
        }
    }

    /// Pieces longer than the long-piece cache holds are counted by
    /// tiktoken's merge (`TokenSet::merge_count`): runs of one punctuation
    /// character (bpe's backtracking encoder's slowest shape), of two in
    /// turn, random punctuation, letters of three scripts, each alone and
    /// with the space before and line breaks after that o200k_base's pattern
    /// keeps in a piece; against bpe's count of the piece, and through the
    /// whole count against tiktoken-rs.
    #[test]
    fn long_pieces_count_as_tiktoken_counts_them() {
        let punct: Vec<char> = (33u8..127)
            .filter(|b| !b.is_ascii_alphanumeric())
            .map(char::from)
            .collect();
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5DEE_CE66_D1CE_4E5B);
        let mut pieces: Vec<String> = Vec::new();
        for &c in &punct {
            for n in [127, 128, 129, 130, 200, 257, 1000] {
                pieces.push(std::iter::repeat_n(c, n).collect());
            }
            let d = punct[rng.gen_range(0..punct.len())];
            pieces.push([c, d].iter().cycle().take(301).collect());
            let run: String = std::iter::repeat_n(c, 63).collect();
            pieces.push(format!(" {run}={run}={run}\n\n"));
        }
        for n in [127, 300, 2000] {
            pieces.push(
                (0..n)
                    .map(|_| punct[rng.gen_range(0..punct.len())])
                    .collect(),
            );
            pieces.push(
                (0..n)
                    .map(|_| char::from(b'a' + rng.gen_range(0..26) as u8))
                    .collect(),
            );
            pieces.push(
                (0..n / 3)
                    .map(|_| ['я', 'ї', 'щ', 'л'][rng.gen_range(0..4)])
                    .collect(),
            );
            pieces.push(
                (0..n / 3)
                    .map(|_| ['我', '们', '记', '忆'][rng.gen_range(0..4)])
                    .collect(),
            );
        }
        pieces.push("a".repeat(5000));
        for (bpe, pattern, tik, slot) in with_oracles([16, 17]) {
            let set = token_set(bpe, slot);
            for p in &pieces {
                let b = p.as_bytes();
                assert_eq!(set.merge_count(b), bpe.count(b), "{pattern:?}: {p:?}");
            }
            assert_counts_as(tik, bpe, pattern, slot, &pieces);
        }
        // At the inline caps, the slowest shape for bpe's encoder; past the
        // merge's reach, through the whole count (bpe's encoder).
        let [(o200k, _), (cl100k, _)] = tables();
        let caps = [
            (o200k, Pattern::O200k, 16, 16_383),
            (cl100k, Pattern::Cl100k, 17, 32_767),
        ];
        for (bpe, pattern, slot, n) in caps {
            for c in [b'-', b'/', b'='] {
                let run = vec![c; n];
                assert_eq!(token_set(bpe, slot).merge_count(&run), bpe.count(&run));
            }
            // (Dots: the encoder's quick shape.)
            let longest = ".".repeat(MERGE_MAX_BYTES + 1);
            assert_eq!(
                count(bpe, pattern, slot, &longest),
                bpe.count(longest.as_bytes())
            );
        }
    }

    #[test]
    fn a_full_cache_grows_once_keeping_its_pieces_and_counts() {
        let [(bpe, _), _] = tables();
        let mut cache = PieceCache::new(token_set(bpe, 13));
        let pieces: Vec<String> = (0..FIRST_SETS * WAYS + 10)
            .map(|i| format!("zq{i}x"))
            .collect();
        let bpe_calls = std::cell::Cell::new(0usize);
        let counted = |p: &[u8]| {
            bpe_calls.set(bpe_calls.get() + 1);
            bpe.count(p)
        };
        let (before, after) = pieces.split_at(FIRST_SETS * WAYS - 1);
        for p in before {
            assert_eq!(cache.count(p.as_bytes(), counted), bpe.count(p.as_bytes()));
        }
        assert_eq!(cache.sets.len(), FIRST_SETS);
        for p in after {
            assert_eq!(cache.count(p.as_bytes(), counted), bpe.count(p.as_bytes()));
        }
        assert_eq!(cache.sets.len(), MOST_SETS);
        // The most recent pieces of before the growth are still there (an
        // evicted one would call BPE again), every count exact.
        let calls = bpe_calls.get();
        for p in before.iter().rev().take(1000).chain(after) {
            assert_eq!(cache.count(p.as_bytes(), counted), bpe.count(p.as_bytes()));
        }
        assert_eq!(bpe_calls.get(), calls);
        for p in &pieces {
            assert_eq!(
                cache.count(p.as_bytes(), counted),
                bpe.count(p.as_bytes()),
                "{p}"
            );
        }
    }

    #[test]
    fn cache_hits_misses_and_evictions_count_exactly() {
        // Far more distinct pieces than the cache holds (evictions in both
        // ways), each counted several times, short and long (the long-piece
        // cache), against bpe-openai's own count (its whole tables, its
        // regex split).
        let [(bpe, t), _] = tables();
        let mut text = String::new();
        for i in 0..40_000u32 {
            text.push_str(&format!(" w{}q{}", i % 9_973, i % 7));
            if i % 500 == 0 {
                text.push_str(&format!(" {}\n", "-".repeat(20 + (i as usize / 500) % 120)));
                text.push_str(&" ".repeat(40 + (i as usize % 90)));
                text.push('x');
            }
        }
        let want = t.count(text.as_str());
        for round in 0..3 {
            assert_eq!(count(bpe, Pattern::O200k, 12, &text), want, "round {round}");
        }
        for piece in text.split_inclusive('\n').take(200) {
            assert_eq!(
                count(bpe, Pattern::O200k, 12, piece),
                t.count(piece),
                "{piece:?}"
            );
        }
    }

    /// Hostile pass 45's sharpest texts, kept: every token that is UTF-8
    /// without its first byte and without its last, and runs of two and
    /// three random tokens (the merges, the filter and the two-byte table see
    /// every short token's neighbourhood), counted twice (cold, then from
    /// the cache) against tiktoken-rs.
    #[test]
    fn tokens_cut_and_joined_count_as_tiktoken_counts_them() {
        for (bpe, pattern, oracle, cache) in with_oracles([16, 17]) {
            let token = |id: u32| std::str::from_utf8(bpe.token_bytes(id)).ok();
            let n = bpe.num_tokens() as u32;
            let mut texts: Vec<String> = Vec::new();
            for id in 0..n {
                let bytes = bpe.token_bytes(id);
                for cut in [bytes.get(1..), bytes.get(..bytes.len().saturating_sub(1))] {
                    if let Some(text) = cut.and_then(|c| std::str::from_utf8(c).ok()) {
                        texts.push(text.to_owned());
                    }
                }
            }
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % u64::from(n)) as u32
            };
            for parts in [2, 3] {
                for _ in 0..40_000 {
                    let text: Option<String> = (0..parts).map(|_| token(next())).collect();
                    texts.extend(text);
                }
            }
            assert_counts_as(oracle, bpe, pattern, cache, &texts);
        }
    }

    /// `load_le` reads what a zero-padded copy holds, at every length.
    #[test]
    fn loads_of_any_length_read_the_bytes_zero_padded() {
        let bytes: Vec<u8> = (0..24u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
        for start in 0..4 {
            for len in 0..=20 {
                let Some(part) = bytes.get(start..start + len) else {
                    continue;
                };
                let mut padded = [0u8; 16];
                let n = len.min(16);
                padded[..n].copy_from_slice(&part[..n]);
                assert_eq!(load_le(part), u128::from_le_bytes(padded), "{start} {len}");
            }
        }
    }

    /// A piece's cache key is its bytes and length alone: the same piece
    /// cut anywhere in a text (the bytes after it masked off, or the text
    /// ending with it) has one key, and pieces that differ in a byte or in
    /// length (a NUL byte more) have different keys.
    #[test]
    fn a_piece_has_one_key_wherever_it_is_cut() {
        let pieces: [&[u8]; 6] = [b"a", b"ab", b"ab\0", b" together", b"abcdefghijklmn", b"\0"];
        for piece in pieces {
            let alone = piece_key(piece, 0, piece.len());
            // A miss counts the piece its key holds.
            let (bytes, len) = key_bytes(&alone);
            assert_eq!(bytes.get(..len), Some(piece), "{piece:?}");
            for (before, after) in [
                ("", ""),
                ("xyz", ""),
                ("", "0123456789abcdef!"),
                ("q", "zz"),
            ] {
                let text = [before.as_bytes(), piece, after.as_bytes()].concat();
                let at = before.len();
                assert_eq!(
                    piece_key(&text, at, at + piece.len()),
                    alone,
                    "{piece:?} in {text:?}"
                );
            }
            for other in pieces.iter().filter(|o| **o != piece) {
                assert_ne!(
                    piece_key(other, 0, other.len()),
                    alone,
                    "{piece:?} / {other:?}"
                );
            }
        }
    }

    /// tiktoken's merge over the short tokens (short_bpe.rs) counts every
    /// piece of 2 to 16 bytes exactly as bpe does: random pieces over an
    /// alphabet of ASCII, punctuation, digits, accents, CJK and emoji
    /// (invalid UTF-8 cut at the ends too), every pair of short tokens, and
    /// every token of 2 to 16 bytes with a byte more; longer pieces are not
    /// its to count.
    #[test]
    fn short_pieces_count_as_bpe_counts_them() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        const ALPHABET: &[&str] = &[
            "a", "e", "t", "n", "s", "X", "Q", " ", "  ", "0", "7", "42", ".", ",", "'", "-", "_",
            "/", "@", "#", "é", "ü", "ß", "中", "文", "日本", "😀", "\n", "\t", "ing", "tion",
            " the", "http", "://", "0x", "ff", "==",
        ];
        for (bpe, _) in tables() {
            let short =
                ShortRanks::build(bpe).expect("o200k_base and cl100k_base have short tables");
            let check = |piece: &[u8]| {
                let want = bpe.count(piece);
                match short.count(piece) {
                    Some(got) => assert_eq!(got, want, "{piece:?}"),
                    None => assert!(!(2..=16).contains(&piece.len()), "{piece:?}"),
                }
            };
            for _ in 0..200_000 {
                let mut piece = Vec::new();
                let target = rng.gen_range(2..=18);
                while piece.len() < target {
                    piece.extend_from_slice(ALPHABET[rng.gen_range(0..ALPHABET.len())].as_bytes());
                }
                piece.truncate(rng.gen_range(2..=piece.len().min(18)));
                check(&piece);
            }
            let shorts: Vec<u32> = (0..bpe.num_tokens() as u32)
                .filter(|&id| (1..=8).contains(&bpe.token_bytes(id).len()))
                .collect();
            for _ in 0..200_000 {
                let a = bpe.token_bytes(shorts[rng.gen_range(0..shorts.len())]);
                let b = bpe.token_bytes(shorts[rng.gen_range(0..shorts.len())]);
                check(&[a, b].concat());
            }
            for id in 0..bpe.num_tokens() as u32 {
                let token = bpe.token_bytes(id);
                if (2..=15).contains(&token.len()) {
                    check(token);
                    check(&[token, b"s"].concat());
                    check(&[b" ", token].concat());
                }
            }
            check(b"a");
            check(&[b'x'; 17]);
        }
    }
}
