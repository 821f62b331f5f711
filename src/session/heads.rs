//! The heads of a log's messages (id, time, tokens, where its bytes end) in
//! a ring of 12 bytes each while the ids are consecutive (every append takes
//! the next id; messages leave from the front): the id is the ring's base
//! plus the index, the time an offset from a second base. A 30-message
//! ring is then 360 B in jemalloc's 384 B class (16-byte heads took 512 B:
//! 7% of a 30 x 200 B session). A head whose time does not fit moves the
//! time base to the middle of the held messages; a gap in the ids (a
//! message aged out of the middle, an imported document's own ids) or times
//! more than ±24 days apart keep whole heads, until the gap leaves.

use std::collections::VecDeque;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub id: u64,
    pub ts: i64,
    /// Logical position just past the message's bytes (wrapping).
    pub(super) end: u32,
    pub tokens: u32,
}

/// A head as a narrow ring keeps it: the id is the ring's `id_base` plus
/// the slot's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    ts: i32,
    end: u32,
    tokens: u32,
}

#[derive(Clone, Debug)]
pub enum Heads {
    Narrow {
        /// The id of the oldest head (slot 0).
        id_base: u64,
        ts_base: i64,
        slots: VecDeque<Slot>,
    },
    Wide(VecDeque<Head>),
}

impl Default for Heads {
    fn default() -> Heads {
        Heads::with_capacity(0)
    }
}

impl PartialEq for Heads {
    fn eq(&self, other: &Heads) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Heads {
    pub fn with_capacity(n: usize) -> Heads {
        Heads::Narrow {
            id_base: 0,
            ts_base: 0,
            slots: VecDeque::with_capacity(n),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Heads::Narrow { slots, .. } => slots.len(),
            Heads::Wide(heads) => heads.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        match self {
            Heads::Narrow { slots, .. } => slots.capacity(),
            Heads::Wide(heads) => heads.capacity(),
        }
    }

    /// Bytes the ring's allocation takes.
    pub fn allocated(&self) -> usize {
        match self {
            Heads::Narrow { slots, .. } => slots.capacity() * std::mem::size_of::<Slot>(),
            Heads::Wide(heads) => heads.capacity() * std::mem::size_of::<Head>(),
        }
    }

    pub fn shrink_to(&mut self, n: usize) {
        match self {
            Heads::Narrow { slots, .. } => slots.shrink_to(n),
            Heads::Wide(heads) => heads.shrink_to(n),
        }
    }

    pub fn get(&self, i: usize) -> Option<Head> {
        match self {
            Heads::Narrow {
                id_base,
                ts_base,
                slots,
            } => slots.get(i).map(|s| Head {
                id: id_base.wrapping_add(i as u64),
                ts: ts_base.wrapping_add(i64::from(s.ts)),
                end: s.end,
                tokens: s.tokens,
            }),
            Heads::Wide(heads) => heads.get(i).copied(),
        }
    }

    pub fn back(&self) -> Option<Head> {
        self.get(self.len().checked_sub(1)?)
    }

    /// The logical end of the newest message's bytes.
    pub fn back_end(&self) -> Option<u32> {
        match self {
            Heads::Narrow { slots, .. } => slots.back().map(|s| s.end),
            Heads::Wide(heads) => heads.back().map(|h| h.end),
        }
    }

    pub fn set_tokens(&mut self, i: usize, tokens: u32) {
        match self {
            Heads::Narrow { slots, .. } => {
                if let Some(s) = slots.get_mut(i) {
                    s.tokens = tokens;
                }
            }
            Heads::Wide(heads) => {
                if let Some(h) = heads.get_mut(i) {
                    h.tokens = tokens;
                }
            }
        }
    }

    pub fn push_back(&mut self, h: Head) {
        let Heads::Narrow {
            id_base,
            ts_base,
            slots,
        } = self
        else {
            if let Heads::Wide(heads) = self {
                heads.push_back(h);
            }
            return;
        };
        // The first head sets the bases (no rebase pass, no allocation
        // beyond the ring's own: every new session's first append).
        if slots.is_empty() {
            *id_base = h.id;
            *ts_base = h.ts;
        }
        let next = id_base.wrapping_add(slots.len() as u64);
        if h.id != next {
            return self.widen_and_push(h);
        }
        if let Some(slot) = narrow(*ts_base, &h) {
            slots.push_back(slot);
            return;
        }
        if !self.rebase(&h) {
            self.widen_and_push(h);
        }
    }

    /// Moves the time base to the middle of the held heads' and `h`'s times
    /// and pushes `h`, if every time then fits (false: nothing changed).
    /// The base then leaves half the range free on each side, so the next
    /// rebase (a pass over the heads) is at least 12 days of times away.
    fn rebase(&mut self, h: &Head) -> bool {
        let (lo, hi) = self
            .iter()
            .fold((h.ts, h.ts), |(lo, hi), x| (lo.min(x.ts), hi.max(x.ts)));
        let Some(span) = hi.checked_sub(lo).filter(|s| *s <= i64::from(i32::MAX)) else {
            return false;
        };
        let base = lo + span / 2;
        let Heads::Narrow { ts_base, slots, .. } = self else {
            return false;
        };
        // Every time is within span / 2 of the base: each fits.
        for slot in slots.iter_mut() {
            slot.ts = (*ts_base + i64::from(slot.ts) - base) as i32;
        }
        *ts_base = base;
        slots.push_back(Slot {
            ts: (h.ts - base) as i32,
            end: h.end,
            tokens: h.tokens,
        });
        true
    }

    fn widen_and_push(&mut self, h: Head) {
        let mut heads: VecDeque<Head> =
            VecDeque::with_capacity(self.capacity().max(self.len() + 1));
        heads.extend(self.iter());
        heads.push_back(h);
        *self = Heads::Wide(heads);
    }

    /// Whole heads back to narrow ones, if the ids are consecutive and the
    /// times fit (after the gap that widened them left).
    fn narrow_again(&mut self) {
        let Heads::Wide(heads) = self else {
            return;
        };
        let (Some(first), Some(_)) = (heads.front().copied(), heads.back()) else {
            return;
        };
        let mut narrowed = Heads::Narrow {
            id_base: first.id,
            ts_base: first.ts,
            slots: VecDeque::with_capacity(heads.len()),
        };
        for h in heads.iter() {
            narrowed.push_back(*h);
            if matches!(narrowed, Heads::Wide(_)) {
                return;
            }
        }
        *self = narrowed;
    }

    /// Drops the oldest `n` heads (all of them when fewer are held).
    pub fn drop_front(&mut self, n: usize) {
        match self {
            Heads::Narrow { id_base, slots, .. } => {
                let n = n.min(slots.len());
                slots.drain(..n);
                *id_base = id_base.wrapping_add(n as u64);
            }
            Heads::Wide(heads) => {
                // Ids increase: they are consecutive when the first and
                // last are len - 1 apart (checked in O(1) on every drop; the
                // pass to narrow them runs once, as the last gap leaves).
                let gapped = |h: &VecDeque<Head>| match (h.front(), h.back()) {
                    (Some(f), Some(b)) => b.id.wrapping_sub(f.id) != h.len() as u64 - 1,
                    _ => false,
                };
                let was_gapped = gapped(heads);
                heads.drain(..n.min(heads.len()));
                if was_gapped && !gapped(heads) {
                    self.narrow_again();
                }
            }
        }
    }

    pub fn pop_back(&mut self) -> Option<Head> {
        let h = self.back()?;
        match self {
            Heads::Narrow { slots, .. } => {
                slots.pop_back();
            }
            Heads::Wide(heads) => {
                heads.pop_back();
            }
        }
        Some(h)
    }

    /// The index of the first head `pred` is false for (heads ordered so
    /// that it is true, then false).
    pub fn partition_point(&self, mut pred: impl FnMut(&Head) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid) {
                Some(h) if pred(&h) => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    pub fn iter(&self) -> Iter<'_> {
        Iter {
            heads: self,
            front: 0,
            back: self.len(),
        }
    }

    /// Heads from index `from` to `to`.
    pub fn range(&self, range: std::ops::Range<usize>) -> Iter<'_> {
        Iter {
            heads: self,
            front: range.start.min(self.len()),
            back: range.end.min(self.len()),
        }
    }
}

/// Heads built in order from a whole stored log (RDB load): narrow slots
/// go into a plain vector the ring then takes as it is, without
/// [`Heads::push_back`]'s checks per head; anything else (a gap in the ids,
/// times more than ±24 days from the first) is pushed one by one as a
/// write would.
pub struct Builder {
    id_base: u64,
    ts_base: i64,
    slots: Vec<Slot>,
    /// Every head, once one did not fit a slot against the first.
    whole: Option<Vec<Head>>,
}

impl Builder {
    pub fn with_capacity(n: usize) -> Builder {
        Builder {
            id_base: 0,
            ts_base: 0,
            slots: Vec::with_capacity(n),
            whole: None,
        }
    }

    pub fn push(&mut self, h: Head) {
        if let Some(whole) = &mut self.whole {
            return whole.push(h);
        }
        if self.slots.is_empty() {
            self.id_base = h.id;
            self.ts_base = h.ts;
        }
        let next = self.id_base.wrapping_add(self.slots.len() as u64);
        match narrow(self.ts_base, &h).filter(|_| h.id == next) {
            Some(slot) => self.slots.push(slot),
            None => {
                let mut whole = Vec::with_capacity(self.slots.capacity());
                whole.extend(self.slots.iter().enumerate().map(|(i, s)| Head {
                    id: self.id_base.wrapping_add(i as u64),
                    ts: self.ts_base.wrapping_add(i64::from(s.ts)),
                    end: s.end,
                    tokens: s.tokens,
                }));
                whole.push(h);
                self.whole = Some(whole);
            }
        }
    }

    pub fn finish(self) -> Heads {
        match self.whole {
            None => Heads::Narrow {
                id_base: self.id_base,
                ts_base: self.ts_base,
                slots: VecDeque::from(self.slots),
            },
            Some(whole) => {
                let mut heads = Heads::with_capacity(whole.len());
                for h in whole {
                    heads.push_back(h);
                }
                heads
            }
        }
    }
}

/// `h` as a slot against the time base, if its time fits.
fn narrow(ts_base: i64, h: &Head) -> Option<Slot> {
    Some(Slot {
        ts: i32::try_from(h.ts.checked_sub(ts_base)?).ok()?,
        end: h.end,
        tokens: h.tokens,
    })
}

#[derive(Clone)]
pub struct Iter<'a> {
    heads: &'a Heads,
    front: usize,
    back: usize,
}

impl Iterator for Iter<'_> {
    type Item = Head;

    fn next(&mut self) -> Option<Head> {
        if self.front >= self.back {
            return None;
        }
        self.front += 1;
        self.heads.get(self.front - 1)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back.saturating_sub(self.front);
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Head> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        self.heads.get(self.back)
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn head(id: u64, ts: i64) -> Head {
        Head {
            id,
            ts,
            end: id as u32,
            tokens: (id % 1000) as u32,
        }
    }

    #[test]
    fn heads_are_twelve_bytes_while_they_fit() {
        assert_eq!(std::mem::size_of::<Slot>(), 12);
        let mut heads = Heads::default();
        for id in 1..=30 {
            heads.push_back(head(id, 1_764_547_200_000 + id as i64 * 1000));
        }
        assert!(matches!(heads, Heads::Narrow { .. }));
        assert_eq!(heads.get(4), Some(head(5, 1_764_547_205_000)));
        // Twenty days later the bases move to what is held.
        for _ in 0..29 {
            heads.drop_front(1);
        }
        let later = 1_764_547_200_000 + 20 * 86_400_000;
        heads.push_back(head(31, later));
        assert!(matches!(heads, Heads::Narrow { .. }));
        assert_eq!(
            heads.iter().collect::<Vec<_>>(),
            vec![head(30, 1_764_547_230_000), head(31, later)]
        );
    }

    #[test]
    fn a_gap_in_the_ids_widens_the_heads_until_it_leaves() {
        let mut heads = Heads::default();
        for id in [1, 2, 3, 5, 6] {
            heads.push_back(head(id, 1_000 + id as i64));
        }
        assert!(matches!(heads, Heads::Wide(_)));
        heads.drop_front(2);
        assert!(matches!(heads, Heads::Wide(_)), "3, 5, 6: still a gap");
        heads.drop_front(1);
        assert!(matches!(heads, Heads::Narrow { .. }), "5, 6: narrow again");
        assert_eq!(
            heads.iter().collect::<Vec<_>>(),
            vec![head(5, 1_005), head(6, 1_006)]
        );
        heads.push_back(head(7, 1_007));
        assert_eq!(heads.get(2), Some(head(7, 1_007)));
        assert!(matches!(heads, Heads::Narrow { .. }));
    }

    #[test]
    fn heads_that_do_not_fit_are_kept_whole() {
        let mut heads = Heads::default();
        heads.push_back(head(1, 0));
        heads.push_back(head(2, i64::MAX));
        heads.push_back(head(1 << 40, i64::MIN));
        assert!(matches!(heads, Heads::Wide(_)));
        assert_eq!(
            heads.iter().collect::<Vec<_>>(),
            vec![head(1, 0), head(2, i64::MAX), head(1 << 40, i64::MIN)]
        );
    }

    /// What a load builds is what pushing each head builds: the same heads,
    /// as narrow or as whole, at the same capacity.
    #[test]
    fn a_built_ring_is_the_ring_pushes_make() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for round in 0..300 {
            let n = rng.gen_range(0..40);
            let mut id = rng.gen_range(1..1u64 << 50);
            let mut ts = rng.gen_range(0..1i64 << 45);
            let spread: i64 = [2_000, 1 << 31, 1 << 40][round % 3];
            let (mut pushed, mut built) = (Heads::with_capacity(n), Builder::with_capacity(n));
            for _ in 0..n {
                id += if rng.gen_bool(0.02) { 3 } else { 1 };
                ts += rng.gen_range(-spread..spread);
                let h = head(id, ts);
                pushed.push_back(h);
                built.push(h);
            }
            let built = built.finish();
            assert!(built.iter().eq(pushed.iter()), "round {round}");
            assert_eq!(
                matches!(built, Heads::Narrow { .. }),
                matches!(pushed, Heads::Narrow { .. }),
                "round {round}"
            );
            assert_eq!(built.allocated(), pushed.allocated(), "round {round}");
        }
    }

    #[test]
    fn random_heads_agree_with_a_plain_deque() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        for round in 0..200 {
            let mut heads = Heads::default();
            let mut model: VecDeque<Head> = VecDeque::new();
            let mut id = rng.gen_range(0..u64::MAX / 2);
            let spread: i64 = [1_000, 3_000_000_000, i64::MAX / 4][round % 3];
            for _ in 0..300 {
                match rng.gen_range(0..10) {
                    0..=5 => {
                        id += if rng.gen_bool(0.01) {
                            1 << 33
                        } else if rng.gen_bool(0.05) {
                            rng.gen_range(2..5)
                        } else {
                            1
                        };
                        let h = head(id, rng.gen_range(-spread..spread));
                        heads.push_back(h);
                        model.push_back(h);
                    }
                    6 => {
                        assert_eq!(heads.get(0), model.front().copied());
                        heads.drop_front(1);
                        model.pop_front();
                    }
                    7 => {
                        let n = rng.gen_range(0..4);
                        heads.drop_front(n);
                        model.drain(..n.min(model.len()));
                    }
                    8 => assert_eq!(heads.pop_back(), model.pop_back()),
                    _ if !model.is_empty() => {
                        let i = rng.gen_range(0..model.len());
                        heads.set_tokens(i, 7);
                        model[i].tokens = 7;
                    }
                    _ => {}
                }
                assert_eq!(heads.len(), model.len());
            }
            assert!(heads.iter().eq(model.iter().copied()), "round {round}");
            assert!(heads.iter().rev().eq(model.iter().rev().copied()));
            if let Some(mid) = model.get(model.len() / 2) {
                assert_eq!(
                    heads.partition_point(|h| h.id < mid.id),
                    model.partition_point(|h| h.id < mid.id)
                );
            }
        }
    }
}
