//! Randomness reproducible from a seed, for the randomized tests.

/// xorshift64: randomness reproducible from a seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub(crate) fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
}
