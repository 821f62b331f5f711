//! The one seeded RNG of the tests and the bench: `rand`'s StdRng (as the
//! unit tests use), so a seed gives the same corpus on every run and every
//! machine, with the few draws the corpora make.

use rand::rngs::StdRng;
use rand::{Rng as _, RngCore, SeedableRng};

pub struct Rng(StdRng);

#[allow(dead_code)]
impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0.gen_range(0..n)
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}
