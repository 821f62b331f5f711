//! BPE of short pieces (2 to 16 bytes) by tiktoken's own merge loop, over
//! tables of the encoding's short tokens keyed by their bytes inline.
//!
//! A piece no cache has seen was counted by bpe's backtracking encoder,
//! ~1.2-1.8 us for 8 bytes: its automaton and pair table are tens of MB, and
//! each step waits on memory (docs/PERFORMANCE.md, issue 23). tiktoken's
//! loop (rank every adjacent pair, merge the lowest, re-rank its two
//! neighbours) needs ~17 lookups for such a piece; here each is a probe of
//! an open-addressing table whose entries hold the token's bytes, instead of
//! a hash map of vectors. Exact by construction: it is the loop that defines
//! the count (tiktoken's `_byte_pair_merge`), over the encoding's ranks
//! (token ids, in rank order); the unit tests hold it to bpe's count.

use bpe_openai::byte_pair_encoding::BytePairEncoding;

/// Longest piece (and token) the tables serve.
pub const MAX_SHORT: usize = 16;

/// Up to 16 bytes, little-endian, zero-padded: two loads that overlap
/// (a copy of a variable length is a call to memcpy).
#[inline(always)]
pub fn load_le(bytes: &[u8]) -> u128 {
    let n = bytes.len().min(16);
    let u64_at = |at: usize| {
        bytes
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    };
    let byte_at = |at: usize| u64::from(bytes.get(at).copied().unwrap_or(0));
    if n >= 8 {
        // The last 8 bytes, shifted so that bytes 8.. land at the top half's start.
        let tail = u64_at(n - 8).checked_shr(8 * (16 - n as u32)).unwrap_or(0);
        u128::from(u64_at(0)) | (u128::from(tail) << 64)
    } else if n >= 4 {
        u128::from(u64::from(u32_at(0)) | (u64::from(u32_at(n - 4)) << (8 * (n - 4))))
    } else if n > 0 {
        u128::from(
            byte_at(0) | (byte_at(n / 2) << (8 * (n / 2))) | (byte_at(n - 1) << (8 * (n - 1))),
        )
    } else {
        0
    }
}

/// A piece of up to 16 bytes in one register pair, its spans' keys cut by
/// shifts (a copy a probe, with its call to memcpy, was a twentieth of
/// counting).
#[derive(Clone, Copy)]
struct Piece(u128);

impl Piece {
    #[inline(always)]
    fn new(bytes: &[u8]) -> Piece {
        Piece(load_le(bytes))
    }

    /// The keys of the span of `len` (1 to 16) bytes at `from`: its first
    /// 8 bytes and the rest, little-endian, zero-padded (the tables' keys).
    #[inline(always)]
    fn span(self, from: usize, len: usize) -> (u64, u64) {
        let bits = (self.0 >> (8 * (from as u32 & 15)))
            & (u128::MAX >> (128 - 8 * (len as u32).clamp(1, 16)));
        (bits as u64, (bits >> 64) as u64)
    }
}

/// A token of 3 to 5 bytes in one word: its bytes (little-endian, bits
/// 0-39), its length less 2 (1-3: never 0, so 0 is an empty slot; bits
/// 40-41) and its rank (bits 42-63: below 2^22, [`ShortRanks::build`]).
/// Half an `Entry8`: o200k_base's 3-8 byte tokens took 4 MB in one
/// table, now 1 + 2, and the merges' probes, most of them of 3-5 bytes,
/// miss L2 less (one cold pass over the server's 6,000 messages: the merges'
/// modelled L2 misses 48.1 -> 42.3 K; in-process cold 93.5 -> 98.4 MB/s,
/// median of 10 alternating runs).
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry5(u64);

const ENTRY5_KEY: u64 = (1 << 42) - 1;

impl Entry5 {
    fn new(lo: u64, len: usize, rank: u32) -> Entry5 {
        Entry5(lo | ((len as u64 - 2) << 40) | (u64::from(rank) << 42))
    }
}

/// A token of 6 to 8 bytes: its bytes (little-endian, zero-padded) and
/// `rank << 4 | len`; `len` 0 is an empty slot. 16 bytes.
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry8 {
    key: u64,
    rank_len: u32,
    _pad: u32,
}

/// A token of 9 to 16 bytes. 24 bytes.
#[derive(Clone, Copy)]
#[repr(C)]
struct Entry16 {
    lo: u64,
    hi: u64,
    rank: u32,
    len: u32,
}

/// Every token of 2 to [`MAX_SHORT`] bytes of an encoding, by its bytes,
/// in tables by length (3-5, 6-8, 9-16): o200k_base's 1 + 2 + 3 MB,
/// cl100k_base's 1 + 1 + 0.75 MB, each with a filter (256 / 128 KB) and a
/// table of the two-byte tokens (256 KB).
pub struct ShortRanks {
    /// The rank of each two-byte token by its bytes, `u32::MAX` for none:
    /// the merges' first probes, read without a hash (256 KB).
    pairs: Box<[u32]>,
    /// Two bits a token, one 64-bit word per token picked by its hash: a
    /// span whose bits are not both set is no token, answered from a
    /// table that stays in L2 (most spans the merges ask about are none).
    filter: Box<[u64]>,
    filter_mask: usize,
    up_to_5: Box<[Entry5]>,
    mask5: usize,
    up_to_8: Box<[Entry8]>,
    mask8: usize,
    up_to_16: Box<[Entry16]>,
    mask16: usize,
}

#[inline(always)]
fn mix(x: u64) -> usize {
    let h = x.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (h ^ (h >> 32)) as usize
}

#[inline(always)]
fn slot8(key: u64, len: usize) -> usize {
    mix(key ^ (len as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

#[inline(always)]
fn slot16(lo: u64, hi: u64, len: usize) -> usize {
    mix(lo ^ hi.rotate_left(23) ^ (len as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The filter word and bits of a span whose slot hash is `h`.
#[inline(always)]
fn filter_bits(h: usize, mask: usize) -> (usize, u64) {
    let h = h as u64;
    (
        (h >> 24) as usize & mask,
        (1u64 << ((h >> 52) & 63)) | (1u64 << ((h >> 58) & 63)),
    )
}

/// The slot hash of a token of `len` bytes whose keys are `lo` and `hi`.
#[inline(always)]
fn slot(lo: u64, hi: u64, len: usize) -> usize {
    if len <= 8 {
        slot8(lo, len)
    } else {
        slot16(lo, hi, len)
    }
}

/// A token's keys and length, as [`Piece::span`] cuts them.
type Key = (u64, u64, usize);

/// An entry of the open-addressing tables.
trait Entry: Copy {
    fn is_empty(&self) -> bool;
    /// The rank, if this entry is the token `key`.
    fn rank_of(&self, key: Key) -> Option<u32>;
}

impl Entry for Entry5 {
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.0 == 0
    }
    #[inline(always)]
    fn rank_of(&self, (lo, _, len): Key) -> Option<u32> {
        (self.0 & ENTRY5_KEY == lo | ((len as u64).wrapping_sub(2) << 40))
            .then_some((self.0 >> 42) as u32)
    }
}

impl Entry for Entry8 {
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.rank_len == 0
    }
    #[inline(always)]
    fn rank_of(&self, (lo, _, len): Key) -> Option<u32> {
        (self.key == lo && (self.rank_len & 15) as usize == len).then_some(self.rank_len >> 4)
    }
}

impl Entry for Entry16 {
    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }
    #[inline(always)]
    fn rank_of(&self, (lo, hi, len): Key) -> Option<u32> {
        (self.len as usize == len && self.lo == lo && self.hi == hi).then_some(self.rank)
    }
}

/// The rank of the token `key` (slot hash `h`) in `table`, or `u32::MAX`.
#[inline(always)]
fn find<E: Entry>(table: &[E], mask: usize, h: usize, key: Key) -> u32 {
    let mut i = h & mask;
    loop {
        let Some(e) = table.get(i) else {
            return u32::MAX;
        };
        if e.is_empty() {
            return u32::MAX;
        }
        if let Some(rank) = e.rank_of(key) {
            return rank;
        }
        i = (i + 1) & mask;
    }
}

/// Puts `entry` (the token `key`, slot hash `h`) in `table`. At most 5/8
/// full: an empty slot is always found. A token twice (none in any
/// vocabulary) keeps its first rank.
fn insert<E: Entry>(table: &mut [E], mask: usize, h: usize, entry: E, key: Key) {
    let mut i = h & mask;
    for _ in 0..table.len() {
        match table.get_mut(i) {
            Some(e) if e.is_empty() => {
                *e = entry;
                return;
            }
            Some(e) if e.rank_of(key).is_some() => return,
            _ => i = (i + 1) & mask,
        }
    }
}

/// Slots for `n` entries: a power of two, at most 5/8 full.
fn table_size(n: usize) -> usize {
    (n * 8 / 5 + 1).next_power_of_two().max(2)
}

impl ShortRanks {
    /// The tables of `bpe`'s short tokens (their ids are their ranks).
    /// None for a vocabulary of 2^22 tokens or more (none today), whose
    /// ranks an `Entry5` cannot hold: its pieces go to bpe.
    pub fn build(bpe: &BytePairEncoding) -> Option<ShortRanks> {
        if bpe.num_tokens() >= 1 << 22 {
            return None;
        }
        let ids = 0..bpe.num_tokens() as u32;
        // The tokens of each table's lengths, in one pass.
        let (mut n5, mut n8, mut n16) = (0, 0, 0);
        for id in ids.clone() {
            match bpe.token_bytes(id).len() {
                3..=5 => n5 += 1,
                6..=8 => n8 += 1,
                9..=MAX_SHORT => n16 += 1,
                _ => {}
            }
        }
        let size5 = table_size(n5);
        let size8 = table_size(n8);
        let size16 = table_size(n16);
        let empty8 = Entry8 {
            key: 0,
            rank_len: 0,
            _pad: 0,
        };
        let empty16 = Entry16 {
            lo: 0,
            hi: 0,
            rank: 0,
            len: 0,
        };
        let mut up_to_5 = vec![Entry5(0); size5].into_boxed_slice();
        let mut up_to_8 = vec![empty8; size8].into_boxed_slice();
        let mut up_to_16 = vec![empty16; size16].into_boxed_slice();
        let (mask5, mask8, mask16) = (size5 - 1, size8 - 1, size16 - 1);
        // ~11 bits a token, two of them set in one word of ~6 tokens: a span
        // that is no token passes ~3% of the time.
        let filter_words = ((n5 + n8 + n16) / 8).next_power_of_two().max(1);
        let filter_mask = filter_words - 1;
        let mut filter = vec![0u64; filter_words].into_boxed_slice();
        // Two-byte tokens are in `pairs` (below), the others here.
        for id in ids {
            let bytes = bpe.token_bytes(id);
            let len = bytes.len();
            if !(3..=MAX_SHORT).contains(&len) {
                continue;
            }
            let (lo, hi) = Piece::new(bytes).span(0, len);
            let h = slot(lo, hi, len);
            let (at, bits) = filter_bits(h, filter_mask);
            if let Some(w) = filter.get_mut(at) {
                *w |= bits;
            }
            if len <= 5 {
                let entry = Entry5::new(lo, len, id);
                insert(&mut up_to_5, mask5, h, entry, (lo, hi, len));
            } else if len <= 8 {
                let entry = Entry8 {
                    key: lo,
                    rank_len: (id << 4) | len as u32,
                    _pad: 0,
                };
                insert(&mut up_to_8, mask8, h, entry, (lo, hi, len));
            } else {
                let entry = Entry16 {
                    lo,
                    hi,
                    rank: id,
                    len: len as u32,
                };
                insert(&mut up_to_16, mask16, h, entry, (lo, hi, len));
            }
        }
        let mut pairs = vec![u32::MAX; 1 << 16].into_boxed_slice();
        for id in (0..bpe.num_tokens() as u32).rev() {
            if let [a, b] = *bpe.token_bytes(id) {
                if let Some(r) = pairs.get_mut(usize::from(a) | (usize::from(b) << 8)) {
                    *r = id;
                }
            }
        }
        Some(ShortRanks {
            pairs,
            filter,
            filter_mask,
            up_to_5,
            mask5,
            up_to_8,
            mask8,
            up_to_16,
            mask16,
        })
    }

    /// False if no token has the slot hash `h`'s filter bits.
    #[inline(always)]
    fn may_hold(&self, h: usize) -> bool {
        let (at, bits) = filter_bits(h, self.filter_mask);
        self.filter.get(at).is_some_and(|w| w & bits == bits)
    }

    /// The rank of the token `bytes`, `u32::MAX` if it is none or not 2 to
    /// 16 bytes.
    #[cfg(test)]
    #[allow(dead_code)] // benches/tokenizer.rs includes this file without its tests
    pub fn rank_of(&self, bytes: &[u8]) -> u32 {
        if !(2..=MAX_SHORT).contains(&bytes.len()) {
            return u32::MAX;
        }
        self.span_rank(Piece::new(bytes), 0, bytes.len())
    }

    /// The rank of the token `piece[from..from + len]` (2 to 16 bytes), or
    /// `u32::MAX`.
    #[inline(always)]
    fn span_rank(&self, piece: Piece, from: usize, len: usize) -> u32 {
        let (lo, hi) = piece.span(from, len);
        if len == 2 {
            return self
                .pairs
                .get(lo as usize & 0xffff)
                .copied()
                .unwrap_or(u32::MAX);
        }
        let h = slot(lo, hi, len);
        if !self.may_hold(h) {
            return u32::MAX;
        }
        if len <= 5 {
            find(&self.up_to_5, self.mask5, h, (lo, hi, len))
        } else if len <= 8 {
            find(&self.up_to_8, self.mask8, h, (lo, hi, len))
        } else {
            find(&self.up_to_16, self.mask16, h, (lo, hi, len))
        }
    }

    /// The number of tokens `piece` encodes to, when it is 2 to 16 bytes
    /// (None otherwise: the caller counts it another way). A piece that is
    /// one token counts 1 without merging, as in tiktoken.
    pub fn count(&self, piece: &[u8]) -> Option<usize> {
        let n = piece.len();
        if !(2..=MAX_SHORT).contains(&n) {
            return None;
        }
        let bytes = Piece::new(piece);
        if self.span_rank(bytes, 0, n) != u32::MAX {
            return Some(1);
        }
        // tiktoken's loop: part i starts at `at[i]`; `rank[i]` is the rank
        // of parts i and i + 1 merged. `len` boundaries, the last the
        // piece's end.
        let mut at = [0u8; MAX_SHORT + 1];
        let mut rank = [u32::MAX; MAX_SHORT + 1];
        for (i, a) in at.iter_mut().enumerate().take(n + 1) {
            *a = i as u8;
        }
        for (i, r) in rank.iter_mut().enumerate().take(n - 1) {
            *r = self.span_rank(bytes, i, 2);
        }
        let mut len = n + 1;
        loop {
            let mut min = (u32::MAX, 0);
            for (i, &r) in rank.iter().enumerate().take(len - 1) {
                if r < min.0 {
                    min = (r, i);
                }
            }
            let (best, i) = min;
            if best == u32::MAX {
                break;
            }
            // The rank of parts j..j+3 merged, while boundary i + 1 is still
            // there (tiktoken's `get_rank`).
            let span = |j: usize| -> u32 {
                match (at.get(j), at.get(j + 3)) {
                    (Some(&from), Some(&to)) if j + 3 < len => {
                        self.span_rank(bytes, usize::from(from), usize::from(to - from))
                    }
                    _ => u32::MAX,
                }
            };
            if i > 0 {
                rank[i - 1] = span(i - 1);
            }
            rank[i] = span(i);
            // Boundary i + 1 goes.
            // (A loop, not copy_within: a call to memmove for a few bytes.)
            for k in i + 1..len - 1 {
                if let (Some(&a), Some(&r)) = (at.get(k + 1), rank.get(k + 1)) {
                    if let (Some(at_k), Some(rank_k)) = (at.get_mut(k), rank.get_mut(k)) {
                        (*at_k, *rank_k) = (a, r);
                    }
                }
            }
            len -= 1;
        }
        Some(len - 1)
    }
}
